#!/usr/bin/env bash
# Checks the deployment artifacts (CI runs it from .ci/run; a few seconds once installed):
#   systemd   systemd-analyze verify of deploy/systemd/*.service (Debian systemd), no warnings
#   k8s       kubernetes-validate --strict of deploy/k8s/*.yaml (PyPI, in a venv), and
#             `ftkv-node check-config` on the configuration each pod would get
#   config    deploy/ftkv.toml passes `ftkv-node check-config`
#   monitor   promtool check rules / check config / test rules (Debian prometheus), the Grafana
#             dashboard parses
# Then deploy/monitoring/scrape-test.py: a real Prometheus scrapes a 3-node playground.
#
# usage: deploy/check-artifacts.sh [DIR_WITH_BINARIES]   (default target/debug; needs ftkv-node
#        and ftkvctl built). Installs what it lacks with apt-get/pip when run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN_DIR="$(cd "${1:-target/debug}" && pwd)"
NODE="$BIN_DIR/ftkv-node"
[ -x "$NODE" ] || { echo "check-artifacts: $NODE is not built" >&2; exit 2; }

WORK="$(mktemp -d /tmp/ftkv-artifacts.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

need=()
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v promtool >/dev/null || need+=(prometheus)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ "${#need[@]}" -gt 0 ]; then
  echo "== artifacts: apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The venv is kept under target/ (ignored by git) so reruns skip the download.
VENV="target/ops-venv"
if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  echo "== artifacts: pip install kubernetes-validate"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check kubernetes-validate
fi

echo "== artifacts: systemd-analyze verify"
# In a scratch root holding the system's units and the binary at the path the units name, so
# that nothing is installed on this machine.
mkdir -p "$WORK/root/etc/systemd/system" "$WORK/root/usr/local/bin" "$WORK/root/usr/lib/systemd"
cp -a /usr/lib/systemd/system "$WORK/root/usr/lib/systemd/"
cp deploy/systemd/*.service "$WORK/root/etc/systemd/system/"
cp "$NODE" "$WORK/root/usr/local/bin/ftkv-node"
for unit in ftkv-node.service ftkv-node@1.service; do
  out="$(systemd-analyze verify --root="$WORK/root" "$unit" 2>&1)" || { echo "$out"; exit 1; }
  # Unknown keys and bad values are warnings with exit code 0: any output fails.
  if [ -n "$out" ]; then echo "$out"; echo "systemd-analyze verify $unit: warnings" >&2; exit 1; fi
  grep -q '^Type=notify' "deploy/systemd/${unit/@1/@}" || { echo "$unit: not Type=notify" >&2; exit 1; }
  echo "ok: $unit"
done

echo "== artifacts: kubernetes-validate"
"$VENV/bin/kubernetes-validate" --strict --quiet deploy/k8s/*.yaml
echo "ok: deploy/k8s/*.yaml"
"$VENV/bin/python" deploy/k8s/check-pods.py "$NODE" deploy/k8s
# The TLS variant: the StatefulSet patched with deploy/k8s/tls/statefulset-patch.yaml.
"$VENV/bin/python" deploy/k8s/check-pods.py "$NODE" deploy/k8s \
  --tls-patch deploy/k8s/tls/statefulset-patch.yaml --merged "$WORK/statefulset-tls.yaml"
"$VENV/bin/kubernetes-validate" --strict --quiet "$WORK/statefulset-tls.yaml"
echo "ok: deploy/k8s/tls/statefulset-patch.yaml"

echo "== artifacts: config template"
"$NODE" check-config --config deploy/ftkv.toml --initial-cluster 1=127.0.0.1:7380

echo "== artifacts: promtool"
promtool check rules deploy/monitoring/alerts.yml
promtool check config deploy/monitoring/prometheus.yml
promtool test rules deploy/monitoring/alerts-test.yml
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["panels"], "no panels"' \
  deploy/monitoring/grafana-dashboard.json
echo "ok: deploy/monitoring/grafana-dashboard.json"

python3 deploy/monitoring/scrape-test.py "$BIN_DIR"
