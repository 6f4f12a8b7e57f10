#!/usr/bin/env bash
# Builds ftkv-node and ftkvctl, then the container image (deploy/Dockerfile, FROM scratch) in one
# command, with Docker's classic builder (no buildx needed, nothing is pulled).
#
#   deploy/build-image.sh [--profile release|debug] [--tag NAME:TAG] [--no-build]
#
#   --profile   cargo profile of the binaries (default release; CI uses debug, already built)
#   --tag       image name (default ftkv:latest)
#   --no-build  use the binaries already in target/PROFILE instead of running cargo
#
# The image holds the binaries (debug info stripped), the dynamic loader and the shared libraries
# `ldd` lists for them, copied from this machine, and a minimal /etc (passwd, group,
# nsswitch.conf). Name resolution needs nothing more with glibc >= 2.34 (files and dns are built
# into libc.so.6): this script refuses an older glibc rather than build an image whose peers
# cannot resolve names.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
tag=ftkv:latest
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="${2:?--profile needs release or debug}"; shift 2 ;;
    --profile=*) profile="${1#*=}"; shift ;;
    --tag) tag="${2:?--tag needs NAME:TAG}"; shift 2 ;;
    --tag=*) tag="${1#*=}"; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$profile" in
  release) cargo_profile=(--release) ;;
  debug) cargo_profile=() ;;
  *) echo "build-image.sh: --profile must be release or debug, not $profile" >&2; exit 2 ;;
esac

fail() { echo "build-image.sh: $*" >&2; exit 1; }
command -v docker >/dev/null || fail "docker is not installed"
command -v ldd >/dev/null || fail "ldd is not installed (Debian: libc-bin)"

glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
[ -n "$glibc" ] || fail "the host C library is not glibc; cannot ship it into the image"
major="${glibc%%.*}" minor="${glibc#*.}"; minor="${minor%%.*}"
if [ "$major" -lt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -lt 34 ]; }; then
  fail "glibc $glibc is older than 2.34: its getaddrinfo would load NSS modules at run time, \
which the image does not ship (peers given as names would not resolve); build on a newer host"
fi

if [ "$build" = 1 ]; then
  echo "== build-image: cargo build ${cargo_profile[*]:-} (ftkv-node, ftkvctl)"
  cargo build "${cargo_profile[@]}" -p ftkv-node -p ftkv-client --bins
fi
bin_dir="${CARGO_TARGET_DIR:-target}/$profile"
for b in ftkv-node ftkvctl; do
  [ -x "$bin_dir/$b" ] || fail "$bin_dir/$b is missing (build it, or drop --no-build)"
done

ctx="$(mktemp -d "${TMPDIR:-/tmp}/ftkv-image.XXXXXX")"
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp" "$ctx/data"
chmod 1777 "$root/tmp"

for b in ftkv-node ftkvctl; do
  if command -v objcopy >/dev/null; then
    objcopy --strip-debug "$bin_dir/$b" "$root/usr/local/bin/$b"
  else
    cp "$bin_dir/$b" "$root/usr/local/bin/$b"
  fi
  chmod 0755 "$root/usr/local/bin/$b"
  # Every absolute path ldd prints: the libraries and the loader (the ELF interpreter).
  ldd_out="$(ldd "$bin_dir/$b")" || fail "ldd $bin_dir/$b failed (is it a dynamic ELF binary?)"
  if grep -q "not found" <<<"$ldd_out"; then
    fail "$b links libraries this machine lacks: $(grep 'not found' <<<"$ldd_out" | tr -s ' \t' ' ')"
  fi
  for lib in $(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' <<<"$ldd_out"); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done

cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/nonexistent
ftkv:x:10001:10001:ftkv:/data:/nonexistent
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
ftkv:x:10001:
EOF
cat >"$root/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF

version="$("$bin_dir/ftkv-node" --version | awk '{print $2}')"
echo "== build-image: docker build -t $tag (ftkv $version, $profile, glibc $glibc)"
cp deploy/Dockerfile "$ctx/Dockerfile"
DOCKER_BUILDKIT=0 docker build --quiet -t "$tag" \
  --label "org.opencontainers.image.title=ftkv" \
  --label "org.opencontainers.image.version=$version" \
  "$ctx" >/dev/null
size="$(docker image inspect -f '{{.Size}}' "$tag")"
echo "== build-image: $tag built ($((size / 1024 / 1024)) MiB)"
