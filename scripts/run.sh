#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install what is missing, build,
# start the decoded daemon on the default model (Gemma 3 270M Q4_K_M), stream a
# reply to a prompt through decoded-cli, then stop the daemon.
#
#   scripts/run.sh ["prompt text"]        (default prompt below)
# Environment: DECODED_LISTEN (127.0.0.1:50051), DECODED_THREADS (2),
# DECODED_MODEL: a name scripts/fetch_model.sh knows (gemma3, the default base
# model, continues the prompt as text; the instruction-tuned smollm2 and qwen2
# answer it as a chat message, rendered with their own chat template).
set -euo pipefail
cd "$(dirname "$0")/.."
name="${DECODED_MODEL:-gemma3}"
case "$name" in
  gemma3) chat=0; default_prompt="Once upon a time, in a small village by the sea," ;;
  smollm2 | qwen2) chat=1; default_prompt="Write a haiku about the sea." ;;
  *) echo "run: unknown DECODED_MODEL '$name' (gemma3, smollm2, qwen2)" >&2; exit 2 ;;
esac
prompt="${1:-$default_prompt}"
listen="${DECODED_LISTEN:-127.0.0.1:50051}"

scripts/setup.sh
model="$(scripts/fetch_model.sh "$name")"
# The daemon and the client only: the test command builds the rest.
BUILD_DIR=build BUILD_TARGETS="decoded decoded-cli" scripts/build.sh

build/server/decoded --model "$model" --listen "$listen" --metrics_listen "" \
  --threads "${DECODED_THREADS:-2}" 2>build/decoded.log &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true' EXIT

# The daemon listens first (or exits: e.g. the port is taken by another
# server, which must not answer in its place), then answers once the model is
# loaded and warmed up.
for _ in $(seq 120); do
  grep -q "listening on port" build/decoded.log && break
  kill -0 "$daemon" 2>/dev/null || { cat build/decoded.log >&2; exit 1; }
  sleep 0.25
done
for _ in $(seq 120); do
  kill -0 "$daemon" 2>/dev/null || { cat build/decoded.log >&2; exit 1; }
  build/client/decoded-cli --server "$listen" --info >/dev/null 2>&1 && break
  sleep 0.5
done
if ((chat)); then
  # Greedy: these small instruction-tuned models drift under sampling.
  printf '%s\n' "$prompt" | build/client/decoded-cli --server "$listen" --chat --max_new_tokens 128 --temperature 0
else
  # Seeded sampling (reproducible): the base 270M model loops under pure greedy decoding.
  build/client/decoded-cli --server "$listen" --prompt "$prompt" --max_new_tokens 64 \
    --temperature 0.7 --top_p 0.9 --repetition_penalty 1.1 --seed 7
fi
