#!/usr/bin/env python3
"""Runs `ftkv-node check-config` on the configuration each pod of deploy/k8s would get.

For every ordinal of the StatefulSet: the ConfigMap's ftkv.toml written to a file, the
container's args with $(VAR) expanded as the kubelet does (POD_NAME = ftkv-N), the command
`run` replaced by `check-config`, the config path pointed at the file, and HOSTNAME set to the
pod name (what --id-from-hostname reads). Checks that pod ftkv-N comes out as node N+1.

With --tls-patch PATCH (deploy/k8s/tls/statefulset-patch.yaml) the StatefulSet is first
patched as `kubectl patch --patch-file` does (a strategic merge: maps merged, lists of named
objects merged by name, other lists replaced) and written to --merged OUT (for
kubernetes-validate); the Secret it mounts is filled as the README says, from
`ftkv-node certs --host 'ftkv-{ordinal}.ftkv-peer'`, so check-config loads each pod's
certificate, key and CA, and each pod's certificate must name its node and its pod.

usage: check-pods.py FTKV_NODE_BINARY [K8S_DIR] [--tls-patch PATCH --merged OUT]
"""
import argparse
import shutil
import os
import re
import subprocess
import sys
import tempfile

import yaml


def load(k8s_dir):
    docs = []
    for name in sorted(os.listdir(k8s_dir)):
        if name.endswith(".yaml"):
            with open(os.path.join(k8s_dir, name)) as f:
                docs.extend(d for d in yaml.safe_load_all(f) if d)
    return docs


def strategic_merge(base, patch):
    """`patch` merged into `base` the way kubectl's strategic merge does for these fields."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = strategic_merge(base[key], value) if key in base else value
        return out
    named = lambda items: isinstance(items, list) and items and all(
        isinstance(i, dict) and "name" in i for i in items)
    if named(base) and named(patch):
        out = list(base)
        for item in patch:
            at = next((i for i, b in enumerate(out) if b["name"] == item["name"]), None)
            if at is None:
                out.append(item)
            else:
                out[at] = strategic_merge(out[at], item)
        return out
    return patch


def tls_secret(binary, sts, tmp):
    """The files of the Secret ftkv-tls as the README builds it: ca.pem, ftkv-N(-key).pem."""
    certs = os.path.join(tmp, "certs")
    replicas = sts["spec"]["replicas"]
    name = sts["metadata"]["name"]
    subprocess.run([binary, "certs", "--dir", certs, "--nodes", str(replicas),
                    "--host", f"{name}-{{ordinal}}.{sts['spec']['serviceName']}"],
                   check=True, capture_output=True)
    secret = os.path.join(tmp, "secret")
    os.makedirs(secret)
    shutil.copy(os.path.join(certs, "ca.pem"), os.path.join(secret, "ca.pem"))
    for ordinal in range(replicas):
        for suffix in (".pem", "-key.pem"):
            shutil.copy(os.path.join(certs, f"node-{ordinal + 1}{suffix}"),
                        os.path.join(secret, f"{name}-{ordinal}{suffix}"))
    return secret


def check_names(cert, wanted):
    out = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-ext", "subjectAltName"],
                         check=True, capture_output=True, text=True).stdout
    missing = [n for n in wanted if f"DNS:{n}" not in out]
    if missing:
        raise SystemExit(f"{cert} does not name {missing}: {out.strip()}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("k8s_dir", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--tls-patch")
    parser.add_argument("--merged")
    opts = parser.parse_args()
    binary = opts.binary
    docs = load(opts.k8s_dir)
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    if opts.tls_patch:
        with open(opts.tls_patch) as f:
            sts = strategic_merge(sts, yaml.safe_load(f))
        if opts.merged:
            with open(opts.merged, "w") as f:
                yaml.safe_dump(sts, f)
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    config_volume = next(v for v in pod["volumes"] if "configMap" in v)
    config_data = configmaps[config_volume["configMap"]["name"]]["data"]
    mount = mounts[config_volume["name"]]
    secret_volume = next((v for v in pod["volumes"] if "secret" in v), None)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        secret_dir = tls_secret(binary, sts, tmp) if secret_volume else None
        secret_mount = mounts[secret_volume["name"]] if secret_volume else None
        for name, text in config_data.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        for ordinal in range(sts["spec"]["replicas"]):
            pod_name = f"{sts['metadata']['name']}-{ordinal}"
            env = {"POD_NAME": pod_name}
            for e in container.get("env", []):
                if "value" in e:
                    env[e["name"]] = e["value"]
                elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                    env[e["name"]] = pod_name
            args = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)
                    for a in container["args"]]
            if args[0] != "run":
                raise SystemExit(f"expected the container to run `run`, got {args[0]!r}")
            args = ["check-config"] + [a.replace(mount, tmp, 1) if a.startswith("--config=") else a
                                       for a in args[1:]]
            if secret_dir:
                args = [a.replace(f"={secret_mount}/", f"={secret_dir}/", 1) for a in args]
                pod_cert = os.path.join(secret_dir, f"{pod_name}.pem")
                if f"--cert-file={pod_cert}" not in args:
                    raise SystemExit(f"{pod_name} does not serve its own certificate: {args}")
                check_names(pod_cert, [f"ftkv-node-{ordinal + 1}",
                                       f"{pod_name}.{sts['spec']['serviceName']}"])
            proc_env = {k: v for k, v in os.environ.items() if not k.startswith("FTKV_")}
            proc_env.update(env)
            proc_env["HOSTNAME"] = pod_name
            out = subprocess.run([binary] + args, env=proc_env, capture_output=True, text=True)
            print(f"== {pod_name}: ftkv-node {' '.join(args)}")
            print(out.stdout + out.stderr, end="")
            if out.returncode != 0:
                failures += 1
            elif f"node {ordinal + 1} in" not in out.stdout:
                print(f"error: {pod_name} is not node {ordinal + 1}")
                failures += 1
    if failures:
        raise SystemExit(f"{failures} pod configuration(s) failed the check")


if __name__ == "__main__":
    main()
