#!/usr/bin/env bash
# Monitoring checks (deploy/prometheus, deploy/grafana, deploy/compose.yaml),
# run by scripts/test.sh after the Release build:
#   1. promtool: the scrape config, the alert rules, and their unit tests
#      (deploy/prometheus/tests: each alert fires, and does not where it must not);
#   2. the Compose file parses and every file it mounts exists;
#   3. tools/monitoring_live.py: the built daemon on the real model, scraped by a
#      real Prometheus under a short chat load; every PromQL expression of the
#      Grafana dashboard and of the alert rules must return data, and the console
#      must render (in Chromium too, when it is installed).
# Needs BUILD_DIR (default build) built and DECODED_MODEL_PATH. Installs Debian's
# prometheus (promtool included) when missing. About 40 s.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"

missing=()
for p in prometheus python3-yaml; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "test_monitoring: installing ${missing[*]}" >&2
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  # The package starts a system Prometheus where systemd runs; these checks
  # use their own on free ports, so it is left alone.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/rules/*.yml
promtool test rules deploy/prometheus/tests/*.yml

python3 - <<'EOF'
import glob, json, os, yaml
compose = yaml.safe_load(open("deploy/compose.yaml"))
for name, service in compose["services"].items():
    for volume in service.get("volumes", []):
        source = volume.split(":")[0]
        if source.startswith("."):
            path = os.path.join("deploy", source)
            assert os.path.exists(path), f"compose: service {name} mounts {source}, which does not exist"
print(f"compose: {len(compose['services'])} services, mounted files present")
# The dashboard's panels use the provisioned datasource (by uid).
uids = {d["uid"] for f in glob.glob("deploy/grafana/provisioning/datasources/*.yaml")
        for d in yaml.safe_load(open(f))["datasources"]}
for f in glob.glob("deploy/grafana/dashboards/*.json"):
    for panel in json.load(open(f))["panels"]:
        for ref in [panel.get("datasource")] + [t.get("datasource") for t in panel.get("targets", [])]:
            assert ref and ref["uid"] in uids, f"{f}: panel {panel['title']!r} uses datasource {ref}, not one of {uids}"
print(f"grafana: dashboards use the provisioned datasource {sorted(uids)}")
EOF

python3 tools/monitoring_live.py --build "$build_dir" --model "${DECODED_MODEL_PATH:?DECODED_MODEL_PATH must name the model}"
