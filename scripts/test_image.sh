#!/usr/bin/env bash
# The container image end to end (docs/deploy.md), as CI runs it from
# scripts/test.sh:
#   1. installs podman, buildah, debootstrap, runc and the CNI plugins when missing;
#   2. makes the debootstrap base image (cached: scripts/make_base_image.sh)
#      and builds localhost/decoded:latest from the Dockerfile (layer cache and
#      the ccache cache mount make a rebuild after a source change short);
#   3. runs it with the real model mounted read-only, a CPU quota of 1 CPU and
#      published ports, and checks the daemon read that quota from its cgroup;
#   4. waits for health SERVING through the image's own HEALTHCHECK probe
#      (`podman healthcheck run`), and through the published port;
#   5. checks the DECODED_* variables reached the daemon (--info), that the
#      Vulkan backend is in the image (--device vulkan without a GPU driver
#      exits 2 naming what is missing), streams one
#      turn through the published port with the image's decoded-cli and checks
#      its final event;
#   6. scrapes /metrics from the container and checks the turn's tokens there;
#   7. sends SIGTERM (`podman stop`, as a kubelet does) during a running turn
#      and checks the turn ended with a final SHUTDOWN event and the container
#      exited 0 within the grace time.
# Environment: DECODED_MODEL_PATH (the GGUF to mount; default: fetched),
# DECODED_IMAGE (localhost/decoded:latest). Prints the build time, image size
# and the time of the whole check. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
image="${DECODED_IMAGE:-localhost/decoded:latest}"
model="${DECODED_MODEL_PATH:-$(scripts/fetch_model.sh)}"
readonly drain_seconds=3 grace_seconds=15
log() { echo "test_image: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

# Rootful podman and debootstrap, as CI runs (root); elsewhere say how to skip.
[[ $(id -u) -eq 0 ]] || fail "needs root (rootful podman, debootstrap); DECODED_SKIP_IMAGE=1 scripts/test.sh skips it"

# 1. Tools (Debian's packages).
missing=()
# containernetworking-plugins: the network stack these machines were checked with (CNI).
for p in podman buildah debootstrap runc containernetworking-plugins; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# The runtime and cgroup driver that work on these machines (no systemd).
podman_run=(podman --runtime runc --cgroup-manager cgroupfs run --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)

# 2. Base and image. The builder's packages must stay among setup.sh's.
setup_packages=" $(sed -n '/APT_PACKAGES=(/,/)/p' scripts/setup.sh | tr -s ' \n()' ' ') "
for p in $(sed -n '/^FROM .* AS builder/,/^WORKDIR/p' Dockerfile | sed -n '/apt-get install/,/rm -rf/p' |
  tr ' \\' '\n\n' | grep -E '^[a-z0-9][a-z0-9+.-]+$' | grep -vE '^(apt-get|install|rm|DEBIAN_FRONTEND.*)$'); do
  [[ "$setup_packages" == *" $p "* ]] || fail "Dockerfile builder package $p is not in scripts/setup.sh"
done
base="$(scripts/make_base_image.sh)"
build_start=$SECONDS
# The builder stage is tagged too, so that pruning the images left untagged
# by earlier builds keeps the current layer cache. (--format docker: the OCI
# format has no HEALTHCHECK.)
build=(podman build --format docker --network host --isolation chroot --build-arg BASE_IMAGE="$base"
  --build-arg JOBS="$(nproc)")
"${build[@]}" --target builder -t "${image%:*}-builder:latest" . >&2
"${build[@]}" -t "$image" . >&2
podman image prune -f >/dev/null
build_seconds=$((SECONDS - build_start))
size_bytes="$(podman image inspect --format '{{.Size}}' "$image")"
log "image built in ${build_seconds} s, $((size_bytes / 1000000)) MB"

# 3. Run it.
name="decoded-test-$$"
work="$(mktemp -d)"
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
run_start=$SECONDS
"${podman_run[@]}" -d --name "$name" --cpus 1 -p 127.0.0.1::50051 -p 127.0.0.1::9464 -p 127.0.0.1::8000 \
  -v "$model":/models/model.gguf:ro -e DECODED_DRAIN_SECONDS="$drain_seconds" -e DECODED_MAX_SESSIONS=4 \
  -e DECODED_CONTEXT_LENGTH=1024 -e DECODED_HTTP_LISTEN=0.0.0.0:8000 \
  "$image" >/dev/null 2>"$work/run.err" || { cat "$work/run.err" >&2; fail "podman run"; }
# (podman complains on stderr that without systemd it cannot schedule the
# HEALTHCHECK; `podman healthcheck run` below runs it.)
grpc_port="$(podman port "$name" 50051/tcp | head -1)"
grpc_port="${grpc_port##*:}"
metrics_port="$(podman port "$name" 9464/tcp | head -1)"
metrics_port="${metrics_port##*:}"
http_port="$(podman port "$name" 8000/tcp | head -1)"
http_port="${http_port##*:}"
[[ -n "$grpc_port" && -n "$metrics_port" && -n "$http_port" ]] || fail "no published ports"
log "container $name: gRPC on 127.0.0.1:$grpc_port, metrics on 127.0.0.1:$metrics_port"
cli() {
  "${podman_run[@]}" --rm --no-healthcheck --network host "$image" decoded-cli --server "127.0.0.1:$grpc_port" "$@"
}

# 4. Health through the image's HEALTHCHECK, then through the published port.
healthy=0
for _ in $(seq 120); do
  [[ "$(podman inspect --format '{{.State.Running}}' "$name")" == true ]] ||
    { podman logs "$name" >&2; fail "the container stopped"; }
  if podman healthcheck run "$name" >/dev/null 2>&1; then healthy=1; break; fi
  sleep 1
done
((healthy)) || { podman logs "$name" >&2; fail "not healthy within 120 s"; }
[[ "$(cli --health)" == SERVING ]] || fail "decoded-cli --health through the published port is not SERVING"
podman logs "$name" 2>"$work/log.txt" >/dev/null
grep -q "decoded: 1 CPUs (CPU quota cgroup v[12] .* = 1.00 CPUs, rounded down to 1.*): --threads 1 per worker" \
  "$work/log.txt" || { cat "$work/log.txt" >&2; fail "the daemon did not take --threads from its 1-CPU quota"; }
log "healthy $((SECONDS - run_start)) s after podman run; $(grep -m1 'CPUs (' "$work/log.txt")"

# The DECODED_* variables reached the daemon's flags.
cli --info >"$work/info.txt" || fail "decoded-cli --info"
grep -q '^max_sessions: 4$' "$work/info.txt" && grep -q '^session_context_length: 1024$' "$work/info.txt" ||
  { cat "$work/info.txt" >&2; fail "DECODED_MAX_SESSIONS / DECODED_CONTEXT_LENGTH not applied"; }
grep -q '^backend: "cpu"$' "$work/info.txt" || { cat "$work/info.txt" >&2; fail "the default device is not cpu"; }

# The Vulkan backend is built in; this container has no GPU driver, so
# --device vulkan must exit 2 (flags that cannot hold) before it listens.
vk_status=0
"${podman_run[@]}" --rm --no-healthcheck -v "$model":/models/model.gguf:ro -e DECODED_DEVICE=vulkan "$image" \
  >"$work/vulkan.out" 2>"$work/vulkan.err" || vk_status=$?
[[ $vk_status -eq 2 ]] && grep -q -- "--device vulkan: " "$work/vulkan.err" ||
  { cat "$work/vulkan.err" >&2; fail "--device vulkan without a driver: exit $vk_status, not 2 with a message"; }
log "--device vulkan without a GPU driver: exit 2, $(grep -m1 -- '--device vulkan' "$work/vulkan.err")"

# 5. One streamed turn.
cli --prompt "The capital of France is" --max_new_tokens 16 >"$work/turn.out" 2>"$work/turn.err" ||
  { cat "$work/turn.err" >&2; fail "the turn failed"; }
grep -qE '^\[(LENGTH|STOP_TOKEN)\] prompt [0-9]+ tok, generated [1-9][0-9]* tok' "$work/turn.err" ||
  { cat "$work/turn.err" >&2; fail "no final event"; }
log "turn: $(tr -d '\n' <"$work/turn.out" | cut -c1-80) | $(grep -m1 '^\[' "$work/turn.err")"

# 5b. The OpenAI API (DECODED_HTTP_LISTEN): a completion, the model named as
# /v1/models lists it (the file's stem: "model").
curl -fsS "http://127.0.0.1:$http_port/v1/models" >"$work/models.json" && grep -q '"id":"model"' "$work/models.json" ||
  { cat "$work/models.json" >&2; fail "GET /v1/models"; }
curl -fsS "http://127.0.0.1:$http_port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "model", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}' \
  >"$work/completion.json" || { cat "$work/completion.json" >&2; fail "POST /v1/completions"; }
grep -q '"object":"text_completion"' "$work/completion.json" && grep -q '"completion_tokens":[1-9]' "$work/completion.json" ||
  { cat "$work/completion.json" >&2; fail "no completion"; }
log "OpenAI API: $(cut -c1-160 "$work/completion.json")"

# 6. Metrics from the container.
curl -fsS "http://127.0.0.1:$metrics_port/metrics" >"$work/metrics.txt" || fail "no /metrics"
generated="$(awk '/^decoded_generated_tokens_total/ {s += $NF} END {print s + 0}' "$work/metrics.txt")"
((generated >= 1)) || { grep '^decoded_' "$work/metrics.txt" >&2; fail "decoded_generated_tokens_total is $generated"; }
log "/metrics: decoded_generated_tokens_total $generated"

# 7. SIGTERM during a running turn: a 1000-token turn cannot finish within
# the drain; it must end with a final SHUTDOWN event, the container exit 0.
: >"$work/long.out"  # exists before the background client opens it
cli --prompt "Once upon a time" --max_new_tokens 1000 --ignore_eos >"$work/long.out" 2>"$work/long.err" &
client=$!
for _ in $(seq 300); do
  (($(wc -c <"$work/long.out") >= 40)) && break
  kill -0 "$client" 2>/dev/null || { cat "$work/long.err" >&2; fail "the long turn ended early"; }
  sleep 0.1
done
(($(wc -c <"$work/long.out") >= 40)) || fail "the long turn streamed nothing"
stop_start=$(date +%s.%N)
podman stop --time "$grace_seconds" "$name" >/dev/null
stop_seconds=$(awk -v a="$stop_start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
wait "$client" || true
exit_code="$(podman inspect --format '{{.State.ExitCode}}' "$name")"
podman logs "$name" 2>"$work/log.txt" >/dev/null
[[ "$exit_code" == 0 ]] || { cat "$work/log.txt" >&2; fail "the container exited $exit_code after SIGTERM"; }
awk -v s="$stop_seconds" -v g="$grace_seconds" 'BEGIN {exit !(s < g)}' ||
  fail "stopping took ${stop_seconds} s (grace ${grace_seconds} s)"
grep -qE '^\[SHUTDOWN\] prompt [0-9]+ tok, generated [1-9][0-9]* tok' "$work/long.err" ||
  { cat "$work/long.err" "$work/log.txt" >&2; fail "the running turn got no final SHUTDOWN event"; }
grep -q "draining" "$work/log.txt" || fail "the daemon did not drain"
log "SIGTERM: $(grep -m1 '^\[SHUTDOWN\]' "$work/long.err"); exit 0 after ${stop_seconds} s" \
  "(drain ${drain_seconds} s, grace ${grace_seconds} s)"
log "passed in $((SECONDS - start)) s (image build ${build_seconds} s)"
