#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests offline (scripts/test_k8s.sh runs it).

  validate_k8s.py --kubernetes-version 1.27.0 [--kubernetes-version ...] --crd-schemas DIR FILE.yaml...

Every object of every FILE (multi-document YAML, as `kubectl kustomize` prints
it) is checked
  * against the Kubernetes OpenAPI schemas bundled by the PyPI package
    kubernetes-validate, strictly (unknown fields are errors), for each
    version given;
  * or, for a custom resource, against DIR/<kind>-<group>-<version>.json
    (JSON Schema; lowercase kind), an error when there is none;
and then against the deployment's own invariants, which no schema knows:
  * terminationGracePeriodSeconds exceeds the preStop sleep plus the
    daemon's DECODED_DRAIN_SECONDS (else the kubelet SIGKILLs a drain);
  * every probe and Service/PodMonitor/NetworkPolicy port names a port the
    decoded container declares; init container and daemon run one image;
  * the HPA's metric is one the daemon exports (server/metrics.cc).
Prints one line per file and exits 1 on the first file with errors (all of
its errors listed).
"""
import argparse
import json
import os
import re
import sys

import jsonschema
import kubernetes_validate
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def crd_schema(schema_dir, obj):
    group, _, version = obj["apiVersion"].rpartition("/")
    path = os.path.join(schema_dir, f"{obj['kind'].lower()}-{group}-{version}.json")
    if not os.path.exists(path):
        return None, path
    with open(path) as f:
        return json.load(f), path


def schema_errors(obj, versions, schema_dir):
    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    errors = []
    for version in versions:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            schema, path = crd_schema(schema_dir, obj)
            if schema is None:
                errors.append(f"{name}: no Kubernetes {version} schema and no CRD schema {path}")
                return errors
            for e in jsonschema.Draft7Validator(schema).iter_errors(obj):
                errors.append(f"{name}: {'.'.join(map(str, e.absolute_path))}: {e.message} ({path})")
            return errors  # a CRD schema is the same for every Kubernetes version
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{name}: Kubernetes {version}: {'.'.join(map(str, e.path))}: {e.message}")
    return errors


def env_value(container, name):
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value")
    return None


def invariant_errors(objs):
    errors = []
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    if len(deployments) != 1:
        return [f"expected one Deployment, found {len(deployments)}"]
    pod = deployments[0]["spec"]["template"]["spec"]
    daemon = next((c for c in pod["containers"] if c["name"] == "decoded"), None)
    if daemon is None:
        return ["the Deployment has no container named decoded"]
    ports = {p["name"]: p["containerPort"] for p in daemon.get("ports", [])}

    drain = env_value(daemon, "DECODED_DRAIN_SECONDS")
    drain = int(drain) if drain is not None else 10  # the daemon's default
    pre_stop = daemon.get("lifecycle", {}).get("preStop", {})
    sleep = 0
    if "exec" in pre_stop:
        cmd = pre_stop["exec"]["command"]
        if cmd[0] != "sleep" or len(cmd) != 2:
            errors.append(f"preStop {cmd}: expected [sleep, SECONDS]")
        else:
            sleep = int(cmd[1])
    elif "sleep" in pre_stop:
        sleep = int(pre_stop["sleep"]["seconds"])
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= sleep + drain:
        errors.append(f"terminationGracePeriodSeconds {grace} <= preStop {sleep} s + drain {drain} s")

    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = daemon.get(probe_name)
        if probe is None or "grpc" not in probe:
            errors.append(f"decoded has no gRPC {probe_name}")
        elif probe["grpc"]["port"] not in ports.values():
            errors.append(f"{probe_name} port {probe['grpc']['port']} is not a container port {ports}")
    for init in pod.get("initContainers", []):
        if init["image"] != daemon["image"]:
            errors.append(f"init container {init['name']} runs {init['image']}, the daemon {daemon['image']}")

    def check_port(where, port):
        if isinstance(port, str) and port not in ports:
            errors.append(f"{where}: port {port!r} is not a named port of decoded {sorted(ports)}")
        elif isinstance(port, int) and port not in ports.values():
            errors.append(f"{where}: port {port} is not a port of decoded {sorted(ports.values())}")

    for o in objs:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind == "Service":
            for p in o["spec"]["ports"]:
                check_port(f"Service/{name}", p.get("targetPort", p["port"]))
        elif kind == "PodMonitor":
            for e in o["spec"]["podMetricsEndpoints"]:
                check_port(f"PodMonitor/{name}", e["port"])
        elif kind == "NetworkPolicy":
            for rule in o["spec"].get("ingress", []):
                for p in rule.get("ports", []):
                    check_port(f"NetworkPolicy/{name}", p["port"])
        elif kind == "HorizontalPodAutoscaler":
            with open(os.path.join(REPO, "server", "metrics.cc")) as f:
                exported = set(re.findall(r'Name\("([a-z_]+)"\)', f.read()))
            for m in o["spec"].get("metrics", []):
                if m["type"] == "Pods" and m["pods"]["metric"]["name"] not in exported:
                    errors.append(f"HPA/{name}: metric {m['pods']['metric']['name']} is not exported by decoded")
    return errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubernetes-version", action="append", required=True)
    parser.add_argument("--crd-schemas", required=True)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    for path in args.files:
        with open(path) as f:
            objs = [o for o in yaml.safe_load_all(f) if o]
        errors = []
        for o in objs:
            errors += schema_errors(o, args.kubernetes_version, args.crd_schemas)
        errors += invariant_errors(objs)
        if errors:
            print(f"{path}: {len(errors)} errors", file=sys.stderr)
            for e in errors:
                print(f"  {e}", file=sys.stderr)
            return 1
        kinds = ", ".join(sorted({o["kind"] for o in objs}))
        print(f"validate_k8s: {path}: {len(objs)} objects valid for Kubernetes "
              f"{' and '.join(args.kubernetes_version)} ({kinds})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
