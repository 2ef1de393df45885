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
  * and every ConfigMap entry that is a typed document (apiVersion and kind,
    e.g. the endpoint picker's EndpointPickerConfig) against its schema in
    DIR the same way;
and then against the deployment's own invariants, which no schema knows:
  * terminationGracePeriodSeconds exceeds the preStop sleep plus the
    daemon's DECODED_DRAIN_SECONDS (else the kubelet SIGKILLs a drain);
  * every probe and Service/PodMonitor/NetworkPolicy port names a port of the
    pods it selects (and every selector selects some); init container and
    daemon run one image; the init container fetches a model
    scripts/fetch_model.sh knows; DECODED_HTTP_LISTEN's port is the http port;
  * the HPA's metric is one the daemon exports (server/metrics.cc);
  * an InferencePool selects the decoded pods on their HTTP port; its
    endpointPickerRef names a Service port of an endpoint picker (EPP)
    Deployment for this pool, which scrapes decoded's metrics port and whose
    configuration maps the decoded pods' engine to gauges decoded exports;
    an HTTPRoute's InferencePool backend exists.
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


def embedded_errors(obj, schema_dir):
    """A ConfigMap entry that is a typed document (apiVersion, kind) against its schema in schema_dir."""
    errors = []
    if obj.get("kind") != "ConfigMap":
        return errors
    for key, text in obj.get("data", {}).items():
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            continue  # not YAML: not a typed document
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            continue
        name = f"ConfigMap/{obj['metadata']['name']}[{key}] ({doc['kind']})"
        schema, path = crd_schema(schema_dir, doc)
        if schema is None:
            errors.append(f"{name}: no schema {path}")
            continue
        for e in jsonschema.Draft7Validator(schema).iter_errors(doc):
            errors.append(f"{name}: {'.'.join(map(str, e.absolute_path))}: {e.message} ({path})")
    return errors


EPP_ENGINE_LABEL = "inference.networking.k8s.io/engine-type"  # the EPP's default engineLabelKey
EPP_DEFAULT_ENGINE = "vllm"  # the EPP's default defaultEngine


def env_value(container, name):
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value")
    return None


def exported_metrics():
    """{name: type} of the daemon's metrics, read from server/metrics.cc."""
    with open(os.path.join(REPO, "server", "metrics.cc")) as f:
        text = f.read()
    metrics = {name: kind.lower() for kind, name in re.findall(r'Build(\w+)\(\)\s*\.Name\("([a-z_:]+)"\)', text)}
    for name, kind in re.findall(r'OneValue\(\s*"([a-z_:]+)".*?MetricType::(\w+)', text, re.S):
        metrics[name] = kind.lower()
    return metrics


def known_models():
    """The model names scripts/fetch_model.sh accepts (its case labels)."""
    with open(os.path.join(REPO, "scripts", "fetch_model.sh")) as f:
        text = f.read()
    block = text[text.index('case "$name" in'):text.index("esac")]
    return set(re.findall(r"^\s+([a-z0-9]+)\)$", block, re.M))


def selects(match_labels, labels):
    return bool(match_labels) and all(labels.get(k) == v for k, v in match_labels.items())


def container_ports(pod_spec):
    """{name: number} and the set of numbers of every container of a pod."""
    ports = {}
    for c in pod_spec.get("containers", []):
        for p in c.get("ports", []):
            ports[p.get("name", str(p["containerPort"]))] = p["containerPort"]
    return ports


def parse_args(container):
    """--key=value and --key value arguments of a container, as {key: value}."""
    args, out, i = container.get("args", []), {}, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a[2:].split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                k, v = a[2:], args[i + 1]
                i += 1
            else:
                k, v = a[2:], "true"
            out[k] = v
        i += 1
    return out


def listen_port(address):
    return int(address.rsplit(":", 1)[1]) if address and ":" in address else None


def metric_name(spec):
    return spec.split("{", 1)[0]


def epp_config(objs, deployment, container, errors):
    """The EndpointPickerConfig an EPP container reads (--config-file from a ConfigMap volume), or None."""
    name = f"Deployment/{deployment['metadata']['name']}"
    path = parse_args(container).get("config-file")
    if path is None:
        errors.append(f"{name}: no --config-file: the EPP would run its default configuration, vLLM's metric names")
        return None
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        if os.path.dirname(path) != m["mountPath"].rstrip("/"):
            continue
        cm_name = volumes.get(m["name"], {}).get("configMap", {}).get("name")
        cm = next((o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == cm_name), None)
        if cm is None:
            errors.append(f"{name}: --config-file {path}: volume {m['name']} is not a ConfigMap of these manifests")
            return None
        text = cm.get("data", {}).get(os.path.basename(path))
        if text is None:
            errors.append(f"{name}: --config-file {path}: ConfigMap/{cm_name} has no key {os.path.basename(path)}")
            return None
        return yaml.safe_load(text)
    errors.append(f"{name}: --config-file {path} is on no volume mount")
    return None


def inference_pool_errors(objs, pool, daemon_deployment, daemon, metrics):
    errors = []
    name = f"InferencePool/{pool['metadata']['name']}"
    spec = pool["spec"]
    labels = daemon_deployment["spec"]["template"]["metadata"].get("labels", {})
    ports = container_ports(daemon_deployment["spec"]["template"]["spec"])
    selected = [d for d in objs if d["kind"] == "Deployment"
                and selects(spec["selector"]["matchLabels"], d["spec"]["template"]["metadata"].get("labels", {}))]
    if selected != [daemon_deployment]:
        errors.append(f"{name}: selector {spec['selector']['matchLabels']} selects "
                      f"{[d['metadata']['name'] for d in selected]}, not exactly the decoded Deployment")
    http = listen_port(env_value(daemon, "DECODED_HTTP_LISTEN"))
    for p in spec["targetPorts"]:
        if p["number"] != http or ports.get("http") != http:
            errors.append(f"{name}: targetPort {p['number']} is not decoded's HTTP port (DECODED_HTTP_LISTEN {http}, "
                          f"container port http {ports.get('http')})")

    ref = spec["endpointPickerRef"]
    if ref.get("group", "") != "" or ref.get("kind", "Service") != "Service":
        return errors + [f"{name}: endpointPickerRef is not a core Service; cannot check it"]
    svc = next((o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == ref["name"]), None)
    if svc is None:
        return errors + [f"{name}: endpointPickerRef: no Service {ref['name']}"]
    svc_port = next((p for p in svc["spec"]["ports"] if p["port"] == ref.get("port", {}).get("number")), None)
    if svc_port is None:
        errors.append(f"{name}: endpointPickerRef port {ref.get('port')} is not a port of Service/{ref['name']}")
    epps = [d for d in objs if d["kind"] == "Deployment"
            and selects(svc["spec"].get("selector", {}), d["spec"]["template"]["metadata"].get("labels", {}))]
    if len(epps) != 1:
        return errors + [f"{name}: Service/{ref['name']} selects {len(epps)} Deployments, expected the EPP's"]
    epp_deployment = epps[0]
    pool_containers = [c for c in epp_deployment["spec"]["template"]["spec"]["containers"]
                       if parse_args(c).get("pool-name") == pool["metadata"]["name"]]
    if len(pool_containers) != 1:
        return errors + [f"{name}: Deployment/{epp_deployment['metadata']['name']} has no container with "
                         f"--pool-name={pool['metadata']['name']}"]
    epp = pool_containers[0]
    epp_name = f"Deployment/{epp_deployment['metadata']['name']}"
    args = parse_args(epp)
    if svc_port is not None:
        target = svc_port.get("targetPort", svc_port["port"])
        epp_ports = container_ports(epp_deployment["spec"]["template"]["spec"])
        if (epp_ports.get(target) if isinstance(target, str) else target) != int(args.get("grpc-port", 9002)):
            errors.append(f"{name}: Service/{ref['name']} port {svc_port['port']} does not reach the EPP's "
                          f"--grpc-port {args.get('grpc-port', 9002)}")
    # Unset, the EPP scrapes the pool's target port: decoded serves /metrics
    # there (the HTTP door) as on its metrics port.
    scraped = (int(args["model-server-metrics-port"]) if "model-server-metrics-port" in args
               else spec["targetPorts"][0]["number"])
    if scraped not in (ports.get("http"), ports.get("metrics")):
        errors.append(f"{epp_name}: it scrapes port {scraped}, which is neither decoded's HTTP port "
                      f"{ports.get('http')} nor its metrics port {ports.get('metrics')}: no /metrics there")
    errors += epp_admitted_errors(objs, epp_deployment, daemon_deployment, ports, scraped, epp_name)

    config = epp_config(objs, epp_deployment, epp, errors)
    if config is None:
        return errors
    plugins = config.get("plugins", [])
    for source in (p for p in plugins if p.get("type") == "metrics-data-source"):
        if source.get("parameters", {}).get("path", "/metrics") != "/metrics":
            errors.append(f"{epp_name}: metrics-data-source path {source['parameters']['path']}: decoded serves /metrics")
    extractors = [p for p in plugins if p.get("type") == "core-metrics-extractor"]
    if not extractors:
        errors.append(f"{epp_name}: its configuration has no core-metrics-extractor: the EPP would read vLLM's metric names")
    for ex in extractors:
        params = ex.get("parameters", {})
        key = params.get("engineLabelKey", EPP_ENGINE_LABEL)
        engine = labels.get(key, params.get("defaultEngine", EPP_DEFAULT_ENGINE))
        configs = {c["name"]: c for c in params.get("engineConfigs", [])}
        if engine not in configs:
            errors.append(f"{epp_name}: decoded pods map to engine {engine!r} (label {key}), which has no engineConfigs "
                          f"entry: the EPP's built-in mapping names metrics decoded does not export")
            continue
        for field in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheInfoSpec"):
            spec_text = configs[engine].get(field, "")
            if not spec_text:
                if field in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"):
                    errors.append(f"{epp_name}: engine {engine!r}: {field} is empty (a gauge of the model server protocol)")
                continue
            kind = metrics.get(metric_name(spec_text))
            if kind != "gauge":
                errors.append(f"{epp_name}: engine {engine!r}: {field} {spec_text!r} is not a gauge decoded exports"
                              f"{'' if kind is None else ' (it is a ' + kind + ')'}")
    return errors


def epp_admitted_errors(objs, epp_deployment, daemon_deployment, ports, scraped, epp_name):
    """Where NetworkPolicies select the decoded pods, one must admit the EPP's
    pods (same namespace) on the port it scrapes, or every scrape times out
    and the EPP scores blind."""
    daemon_labels = daemon_deployment["spec"]["template"]["metadata"].get("labels", {})
    epp_labels = epp_deployment["spec"]["template"]["metadata"].get("labels", {})
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"
                and selects(o["spec"]["podSelector"].get("matchLabels", {}), daemon_labels)
                and "Ingress" in o["spec"].get("policyTypes", ["Ingress"])]
    if not policies:
        return []
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            admits_epp = peers is None or any(
                "namespaceSelector" not in peer and "ipBlock" not in peer
                and selects(peer.get("podSelector", {}).get("matchLabels", {}), epp_labels) for peer in peers)
            rule_ports = [p["port"] for p in rule.get("ports", [])]
            if admits_epp and (not rule_ports or any(
                    (ports.get(p) if isinstance(p, str) else p) == scraped for p in rule_ports)):
                return []
    return [f"{epp_name}: no NetworkPolicy selecting the decoded pods admits the EPP's pods on port {scraped}, "
            "where it scrapes /metrics"]


def invariant_errors(objs):
    errors = []
    metrics = exported_metrics()
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    daemons = [(d, c) for d in deployments for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "decoded"]
    if len(daemons) != 1:
        return [f"expected one Deployment with a container named decoded, found {len(daemons)}"]
    daemon_deployment, daemon = daemons[0]
    pod = daemon_deployment["spec"]["template"]["spec"]
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
    models = known_models()
    for init in pod.get("initContainers", []):
        if init["image"] != daemon["image"]:
            errors.append(f"init container {init['name']} runs {init['image']}, the daemon {daemon['image']}")
        args = init.get("args", [])
        if args[:1] == ["fetch-model"] and len(args) > 1 and args[1] not in models:
            errors.append(f"init container {init['name']}: fetch-model {args[1]}: not a model of "
                          f"scripts/fetch_model.sh {sorted(models)}")
    http = listen_port(env_value(daemon, "DECODED_HTTP_LISTEN"))
    if http != ports.get("http"):
        errors.append(f"DECODED_HTTP_LISTEN port {http} is not the container port named http ({ports.get('http')})")

    def selected_ports(where, match_labels):
        """The named and numbered ports of the Deployments a selector selects."""
        chosen = [d for d in deployments if selects(match_labels, d["spec"]["template"]["metadata"].get("labels", {}))]
        if not chosen:
            errors.append(f"{where}: selector {match_labels} selects no pod of these manifests")
        named = {}
        for d in chosen:
            named.update(container_ports(d["spec"]["template"]["spec"]))
        return named

    def check_port(where, port, named):
        if isinstance(port, str) and port not in named:
            errors.append(f"{where}: port {port!r} is not a named port of the pods it selects {sorted(named)}")
        elif isinstance(port, int) and port not in named.values():
            errors.append(f"{where}: port {port} is not a port of the pods it selects {sorted(named.values())}")

    for o in objs:
        kind, name = o["kind"], o["metadata"]["name"]
        if kind == "Service":
            named = selected_ports(f"Service/{name}", o["spec"].get("selector", {}))
            for p in o["spec"]["ports"]:
                check_port(f"Service/{name}", p.get("targetPort", p["port"]), named)
        elif kind == "PodMonitor":
            named = selected_ports(f"PodMonitor/{name}", o["spec"]["selector"].get("matchLabels", {}))
            for e in o["spec"]["podMetricsEndpoints"]:
                check_port(f"PodMonitor/{name}", e["port"], named)
        elif kind == "NetworkPolicy":
            named = selected_ports(f"NetworkPolicy/{name}", o["spec"]["podSelector"].get("matchLabels", {}))
            for rule in o["spec"].get("ingress", []):
                for p in rule.get("ports", []):
                    check_port(f"NetworkPolicy/{name}", p["port"], named)
        elif kind == "HorizontalPodAutoscaler":
            for m in o["spec"].get("metrics", []):
                if m["type"] == "Pods" and m["pods"]["metric"]["name"] not in metrics:
                    errors.append(f"HPA/{name}: metric {m['pods']['metric']['name']} is not exported by decoded")
        elif kind == "InferencePool":
            errors += inference_pool_errors(objs, o, daemon_deployment, daemon, metrics)
        elif kind == "HTTPRoute":
            pools = {p["metadata"]["name"] for p in objs if p["kind"] == "InferencePool"}
            for rule in o["spec"].get("rules", []):
                for b in rule.get("backendRefs", []):
                    if b.get("kind") == "InferencePool" and b["name"] not in pools:
                        errors.append(f"HTTPRoute/{name}: backend InferencePool {b['name']} is not in these manifests")
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
            errors += embedded_errors(o, args.crd_schemas)
        try:
            errors += invariant_errors(objs)
        except (KeyError, TypeError, AttributeError, ValueError) as e:  # a shape the schemas let through
            errors.append(f"invariants not checked: {type(e).__name__}: {e}")
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
