#!/usr/bin/env bash
# Installs the systems ftkv-bench compares against, from Debian: MariaDB (mariadb-server, for
# the semi-sync target), sysbench (its oltp_insert driver) and etcd (etcd-server, 3.4).
# Idempotent: installs only what is missing. Needs root and apt-get. The packages' services
# are not started (policy-rc.d answers 101 during the install): ftkv-bench starts its own
# servers in temporary folders and stops them.
#
#   tests/bench/install-peers.sh            # what .ci/run and the smoke tests use
set -euo pipefail

missing=()
command -v mariadbd >/dev/null || missing+=(mariadb-server)
command -v sysbench >/dev/null || missing+=(sysbench)
command -v etcd >/dev/null || missing+=(etcd-server)
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-peers: mariadb-server, sysbench and etcd-server are installed"
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null; then
  echo "install-peers: missing ${missing[*]}; run as root on Debian: apt-get install -y ${missing[*]}" >&2
  exit 1
fi

policy=/usr/sbin/policy-rc.d
saved=""
if [ -e "$policy" ]; then
  saved="$(mktemp)"
  cp -p "$policy" "$saved"
fi
restore() {
  if [ -n "$saved" ]; then mv -f "$saved" "$policy"; else rm -f "$policy"; fi
}
trap restore EXIT
printf '#!/bin/sh\nexit 101\n' > "$policy"
chmod 755 "$policy"

echo "install-peers: apt-get install -y ${missing[*]}"
install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    < /dev/null > /tmp/ftkv-install-peers.log 2>&1
}
if ! install; then
  # A fresh machine may not have package lists yet.
  apt-get update -qq < /dev/null > /dev/null 2>&1 || true
  install || { tail -20 /tmp/ftkv-install-peers.log >&2; exit 1; }
fi
for bin in mariadbd sysbench etcd; do
  command -v "$bin" >/dev/null || { echo "install-peers: $bin still missing" >&2; exit 1; }
done
echo "install-peers: done ($(mariadbd --version | head -1); $(sysbench --version); $(etcd --version | head -1))"
