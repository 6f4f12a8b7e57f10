#!/usr/bin/env python3
"""Runs `ftkv-node check-config` on the configuration each pod of deploy/k8s would get.

For every ordinal of the StatefulSet: the ConfigMap's ftkv.toml written to a file, the
container's args with $(VAR) expanded as the kubelet does (POD_NAME = ftkv-N), the command
`run` replaced by `check-config`, the config path pointed at the file, and HOSTNAME set to the
pod name (what --id-from-hostname reads). Checks that pod ftkv-N comes out as node N+1.

usage: check-pods.py FTKV_NODE_BINARY [K8S_DIR]
"""
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


def main():
    binary = sys.argv[1]
    k8s_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(__file__))
    docs = load(k8s_dir)
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    config_volume = next(v for v in pod["volumes"] if "configMap" in v)
    config_data = configmaps[config_volume["configMap"]["name"]]["data"]
    mount = mounts[config_volume["name"]]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
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
