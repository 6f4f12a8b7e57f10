#!/usr/bin/env bash
# The image and the Compose cluster, end to end (CI runs it from .ci/run; needs Docker):
#  1. builds the image from the binaries already built (deploy/build-image.sh --no-build),
#     checks that it has no shell;
#  2. starts deploy/docker-compose.yml (peers given as names: ftkv-1:7380, ...), waits until
#     every container is healthy and `endpoint status --cluster` shows one leader of three;
#  3. does a round trip, writes acknowledged keys, kills the leader's container (docker kill),
#     sees writes resume under a new leader and every acknowledged key intact;
#  4. restarts the killed container and waits until it is healthy again;
#  5. recreates every container (down without -v, up) and reads every key back: the data lives
#     in the named volumes;
#  6. tears everything down and checks that no container, network or volume is left.
#
#   deploy/test-compose.sh [--profile debug|release] [--build]
#
# A trap removes the project's containers, network, volumes and the test image on any exit;
# the whole run is bounded by FTKV_COMPOSE_TEST_TIMEOUT_S (default 600 s). Compose: `docker
# compose` (v2) when present, else `docker-compose` (1.29); FTKV_COMPOSE overrides.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=debug
build_flag=--no-build
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="${2:?}"; shift 2 ;;
    --build) build_flag=""; shift ;;
    *) echo "test-compose.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

limit_s="${FTKV_COMPOSE_TEST_TIMEOUT_S:-600}"
deadline=$((SECONDS + limit_s))
project="ftkvtest$$"
image="ftkv-test:$$"
file=deploy/docker-compose.yml

if [ -n "${FTKV_COMPOSE:-}" ]; then
  read -r -a compose_cmd <<<"$FTKV_COMPOSE"
elif docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null; then
  compose_cmd=(docker-compose)
else
  echo "test-compose.sh: neither 'docker compose' nor docker-compose is installed" >&2
  exit 1
fi

log() { echo "== compose-test [$((SECONDS))s] $*"; }
fail() {
  echo "compose-test: FAILED: $*" >&2
  compose ps >&2 || true
  compose logs --no-color --tail 40 >&2 || true
  exit 1
}
# Every docker call is bounded, so that a hung daemon cannot hang CI.
compose() { timeout 120 "${compose_cmd[@]}" -p "$project" -f "$file" "$@"; }
left() { timeout 60 docker "$1" ls -q --filter "label=com.docker.compose.project=$project" "${@:2}"; }

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  log "cleanup (exit $rc)"
  FTKV_IMAGE="$image" compose down -v --remove-orphans -t 5 >/dev/null 2>&1 || true
  # Anything down missed (e.g. compose itself failed): remove by project label.
  local ids
  ids="$(timeout 60 docker ps -aq --filter "label=com.docker.compose.project=$project" || true)"
  [ -z "$ids" ] || timeout 60 docker rm -f $ids >/dev/null 2>&1 || true
  ids="$(left network || true)"
  [ -z "$ids" ] || timeout 60 docker network rm $ids >/dev/null 2>&1 || true
  ids="$(left volume || true)"
  [ -z "$ids" ] || timeout 60 docker volume rm -f $ids >/dev/null 2>&1 || true
  timeout 60 docker image rm -f "$image" >/dev/null 2>&1 || true
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

export FTKV_IMAGE="$image"
all_endpoints=ftkv-1:7379,ftkv-2:7379,ftkv-3:7379

# ftkvctl inside the container of service $1 (the image has no shell: exec runs the binary).
# `docker exec` on the container id: much faster than `compose exec` (docker-compose 1.29 is
# Python); ids are looked up again after containers are (re)created.
declare -A cid
refresh_ids() {
  local s
  for s in ftkv-1 ftkv-2 ftkv-3; do cid[$s]="$(compose ps -q "$s")"; done
}
ctl_at() {
  local svc="$1" endpoints="$2"
  shift 2
  timeout 60 docker exec -i "${cid[$svc]}" ftkvctl --endpoints "$endpoints" --timeout 10s "$@"
}
ctl() {
  local svc="$1"
  shift
  ctl_at "$svc" "$all_endpoints" "$@"
}

# Waits (polling, up to $2 s and the global deadline) until the command "$3..." succeeds.
wait_for() {
  local what="$1" within="$2"
  shift 2
  local start=$SECONDS until=$((SECONDS + within))
  [ "$until" -le "$deadline" ] || until=$deadline
  while ! "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$until" ] || fail "timed out after $((SECONDS - start))s waiting for $what \
(limit ${within}s, whole test ${limit_s}s)"
    sleep 1
  done
}

health_of() { timeout 60 docker inspect -f '{{.State.Health.Status}}' "${cid[$1]}"; }
healthy() {
  local s
  for s in "$@"; do [ "$(health_of "$s")" = healthy ] || return 1; done
}
# Leader id as `endpoint status --cluster` from service $1 shows it: exactly one leader
# among the nodes that answered, or failure.
leader_from() {
  local out
  out="$(ctl "$1" endpoint status --cluster)" || return 1
  awk -F', ' '$5 == "true" { print $2 }' <<<"$out" | { read -r id && ! read -r _ && echo "$id"; }
}

log "image: deploy/build-image.sh --profile $profile $build_flag --tag $image"
deploy/build-image.sh --profile "$profile" $build_flag --tag "$image"
if timeout 60 docker run --rm --entrypoint /bin/sh "$image" -c true >/dev/null 2>&1; then
  fail "the image has a shell"
fi
timeout 60 docker run --rm "$image" --version || fail "ftkv-node does not run in the image"

log "up: ${compose_cmd[*]} -p $project -f $file up -d"
compose up -d
refresh_ids
wait_for "three healthy containers" 180 healthy ftkv-1 ftkv-2 ftkv-3
wait_for "endpoint health --cluster" 60 ctl ftkv-1 endpoint health --cluster
ctl ftkv-1 -w table endpoint status --cluster
status="$(ctl ftkv-1 endpoint status --cluster)"
[ "$(wc -l <<<"$status")" = 3 ] || fail "endpoint status --cluster does not list three members: $status"
leader="$(leader_from ftkv-1)" || fail "not exactly one leader: $status"
ctl ftkv-1 endpoint health --cluster
log "leader is node $leader"

log "round trip"
ctl ftkv-2 put greeting hello >/dev/null
[ "$(ctl ftkv-3 get greeting --print-value-only)" = hello ] || fail "round trip: get greeting"

acked=()
for i in $(seq 1 20); do
  ctl ftkv-1 put "before/$i" "v$i" >/dev/null || fail "put before/$i on a healthy cluster"
  acked+=("before/$i=v$i")
done

survivor=ftkv-1
[ "$leader" != 1 ] || survivor=ftkv-2
log "docker kill the leader's container (ftkv-$leader); writes go through $survivor"
timeout 60 docker kill "${cid[ftkv-$leader]}" >/dev/null
resumed=0
i=0
until [ "$resumed" -ge 10 ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "writes did not resume after the kill (acknowledged $resumed)"
  i=$((i + 1))
  if ctl "$survivor" put "after/$i" "w$i" >/dev/null 2>&1; then
    acked+=("after/$i=w$i")
    resumed=$((resumed + 1))
  fi
done
new_leader="$(leader_from "$survivor")" || fail "no single leader after the kill"
[ "$new_leader" != "$leader" ] || fail "the killed node $leader is still reported leader"
log "writes resumed under node $new_leader after $i attempts"

# Every acknowledged key has its value: one linearizable prefix read per key group (simple
# output: a key line, then a value line).
check_keys() {
  local via="$1" pair key want prefix out
  declare -A got=()
  for prefix in before/ after/; do
    out="$(ctl "$via" get "$prefix" --prefix)" || fail "get $prefix --prefix through $via"
    while IFS= read -r key && IFS= read -r want; do got[$key]="$want"; done <<<"$out"
  done
  for pair in "${acked[@]}"; do
    key="${pair%%=*}" want="${pair#*=}"
    [ "${got[$key]-}" = "$want" ] || fail "acknowledged key $key: want $want, got '${got[$key]-<missing>}' (through $via)"
  done
}
check_keys "$survivor"
log "all ${#acked[@]} acknowledged keys intact"

log "restart ftkv-$leader"
timeout 60 docker start "${cid[ftkv-$leader]}" >/dev/null
wait_for "ftkv-$leader healthy again" 120 healthy "ftkv-$leader"
# Its own (serializable) read serves its local copy once it has caught up.
last="${acked[${#acked[@]}-1]}"
caught_up() {
  local got
  got="$(ctl_at "ftkv-$leader" "ftkv-$leader:7379" get --serializable --print-value-only "${last%%=*}")" \
    && [ "$got" = "${last#*=}" ]
}
wait_for "ftkv-$leader caught up" 60 caught_up

log "recreate every container (down without -v, up): the data is in the volumes"
compose down -t 10
compose up -d
refresh_ids
wait_for "three healthy containers after recreation" 180 healthy ftkv-1 ftkv-2 ftkv-3
leader_from ftkv-1 >/dev/null || fail "not exactly one leader after recreation"
check_keys ftkv-3
log "all ${#acked[@]} keys read back after recreation"

log "teardown"
compose down -v --remove-orphans -t 10
for kind in container network volume; do
  if [ "$kind" = container ]; then
    rest="$(timeout 60 docker ps -aq --filter "label=com.docker.compose.project=$project")"
  else
    rest="$(left "$kind")"
  fi
  [ -z "$rest" ] || fail "a $kind is left behind: $rest"
done
log "PASS (${SECONDS}s; Compose: ${compose_cmd[*]})"
