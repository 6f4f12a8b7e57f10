#!/usr/bin/env bash
# Short Jepsen-style suite for CI (about 13 minutes on 2 cores): every workload once under a mixed
# nemesis (partition, kill, pause, clock) for 20 s, set and counter under kill + disk + lose-unsynced,
# register under membership changes, register and set under partition + kill with TLS and auth on,
# the local-reads canary scenario (must be caught: exit 1), then the fourteen scenarios. Needs root, iproute2, iptables and faketime, and the binaries built:
#   cargo build -p ftkv-node -p ftkv-client -p ftkv-tests --bins
# Usage: tests/scenarios/ci-suite.sh [STORE_DIR]   (exit 0 only when every verdict is as expected)
set -u
cd "$(dirname "$0")/../.."
BIN=${FTKV_BIN_DIR:-target/debug}
J="$BIN/ftkv-jepsen"
STORE=${1:-target/jepsen-store}
FAILED=0
PASSED=0
LOGS=$(mktemp -d)
FAILED_NAMES=()

expect() { # expect CODE NAME ARGS...
  local want=$1 name=$2; shift 2
  "$J" "$@" --store "$STORE" 2>&1 | tee "$LOGS/$name.log"
  local got=${PIPESTATUS[0]}
  if [ "$got" -eq "$want" ]; then
    echo "ci-suite: $name: exit $got as expected"; PASSED=$((PASSED + 1))
  else
    echo "ci-suite: $name: exit $got, expected $want"; FAILED=$((FAILED + 1))
    FAILED_NAMES+=("$name")
  fi
}

for w in register set counter bank append; do
  expect 0 "$w" test --workload "$w" --nemesis partition,kill,pause,clock --time-limit 20s --substrate netns \
    --concurrency 5 --rate 50 --seed 1
done
for w in set counter; do
  expect 0 "$w-disk-lose-unsynced" test --workload "$w" --nemesis kill,disk,lose-unsynced --time-limit 20s \
    --substrate netns --seed 2
done
# Bulk loads (2,000 rows each) under a leader kill and a partition (seed 7 kills the leader):
# every load is whole or absent in every read, an acknowledged one is whole.
expect 0 "load" test --workload load --nemesis kill,partition --time-limit 20s --substrate netns \
  --concurrency 5 --rate 20 --seed 7
expect 0 "register-membership" test --workload register --nemesis membership --time-limit 20s --substrate netns --seed 3
# Security on (issue 17): TLS on every port with client-cert auth and peer certificates, users
# and roles with auth enabled, the workers authenticating as a user with READWRITE on jepsen/
# only, tokens living 10 s (renewed, and expiring while partitions and kills hold requests back).
for w in register set; do
  expect 0 "$w-tls-auth" test --workload "$w" --nemesis partition,kill --time-limit 20s --substrate netns \
    --concurrency 5 --rate 50 --seed 4 --tls --auth
done
# Canary: reads served locally without ReadIndex must be caught by the register checker. A
# scripted schedule (scenario 06 with the unsafe mode: a read on the isolated old leader after the
# new leader took a write), because a random partition schedule does not always open a stale-read
# window within its time (it missed in a CI run on 2026-11-30, most likely in the one before too).
# The random-schedule canary is kept for manual runs:
# `cargo test -p ftkv-tests --lib jepsen::canary -- --ignored`.
# (The ack-before-fsync canary is caught by `cargo test -p ftkv-tests --test canary_ack_before_fsync`.)
expect 1 "canary-unsafe-local-reads" scenario tests/scenarios/canaries/06-unsafe-local-reads.toml
expect 0 "scenarios" scenario tests/scenarios
# The failures again at the end (CI logs are often read from the tail): each one's verdict lines.
for name in "${FAILED_NAMES[@]}"; do
  echo "== ci-suite: FAILED $name (checker lines and the end of its output):"
  grep -E "^  [a-z-]+ +(valid|INVALID|unknown)|verdict|harness failure|replay:|report:" "$LOGS/$name.log" | head -40
  tail -n 15 "$LOGS/$name.log"
done
rm -rf "$LOGS"
echo "$PASSED passed, $FAILED failed${FAILED_NAMES[*]:+: ${FAILED_NAMES[*]}}"
[ "$FAILED" -eq 0 ]
