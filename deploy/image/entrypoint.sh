#!/bin/bash
# The image's entrypoint. Without arguments, or with flags only, it runs the
# daemon with flags from the environment (unset: the daemon's own default):
#   DECODED_MODEL           --model            (/models/model.gguf)
#   DECODED_LISTEN          --listen           (0.0.0.0:50051)
#   DECODED_METRICS_LISTEN  --metrics_listen   (0.0.0.0:9464; set it empty to turn /metrics off)
#   DECODED_HTTP_LISTEN     --http_listen      (unset: no OpenAI HTTP API; e.g. 0.0.0.0:8000)
#   DECODED_SERVED_MODEL_NAME --served_model_name (the HTTP API's model id; default: the file's name)
#   DECODED_DEVICE          --device           (cpu; vulkan or vulkan:N on a GPU)
#   DECODED_WORKERS         --workers
#   DECODED_THREADS         --threads          (unset: the container's CPU quota / workers)
#   DECODED_MAX_SESSIONS    --max_sessions
#   DECODED_MAX_BATCH       --max_batch
#   DECODED_MAX_STEP_TOKENS --max_step_tokens
#   DECODED_CONTEXT_LENGTH  --context_length
#   DECODED_KV_BUDGET_MB    --kv_budget_mb
#   DECODED_KV_BLOCK_TOKENS --kv_block_tokens
#   DECODED_KV_TYPE         --kv_type
#   DECODED_DRAIN_SECONDS   --drain_seconds
#   DECODED_MAX_CONNECTIONS --max_connections
#   DECODED_MAX_SESSIONS_PER_PEER --max_sessions_per_peer
#   DECODED_IDLE_SESSION_SECONDS  --idle_session_seconds
#   DECODED_AUTH_TOKEN      --auth_token         (a secret: prefer an env file or a Kubernetes Secret)
#   DECODED_METRICS_AUTH_TOKEN --metrics_auth_token
# Arguments are appended (a flag given twice: the last one counts).
# Other commands:
#   fetch-model [NAME]      fetches a model (gemma3, smollm2, qwen2) into
#                           DECODED_MODEL's folder and points DECODED_MODEL at it
#   decoded-cli ARGS...     the client (e.g. decoded-cli --health)
#   decoded ARGS...         the daemon with exactly ARGS (no environment flags)
# The daemon is exec'ed, so it is PID 1 and gets the runtime's SIGTERM itself;
# its exit status tells a restart policy why it stopped (0 signal, 1 start
# failed, 2 bad flags, 3 listener failed, 4 mapped model file changed).
set -euo pipefail

case "${1:-}" in
  fetch-model) shift; exec /usr/local/lib/decoded/fetch-model "$@" ;;
  decoded-cli) shift; exec /usr/local/bin/decoded-cli "$@" ;;
  decoded) shift; exec /usr/local/bin/decoded "$@" ;;
  "" | -*) ;;
  *)
    echo "decoded-entrypoint: unknown command '$1' (fetch-model, decoded-cli, decoded, or daemon flags)" >&2
    exit 2
    ;;
esac

args=(
  "--model=${DECODED_MODEL:-/models/model.gguf}"
  "--listen=${DECODED_LISTEN:-0.0.0.0:50051}"
  "--metrics_listen=${DECODED_METRICS_LISTEN-0.0.0.0:9464}"
)
add() {  # add FLAG VARIABLE: --FLAG=$VARIABLE when the variable is set and not empty
  if [[ -n "${!2:-}" ]]; then args+=("--$1=${!2}"); fi
}
add device DECODED_DEVICE
add http_listen DECODED_HTTP_LISTEN
add served_model_name DECODED_SERVED_MODEL_NAME
add workers DECODED_WORKERS
add threads DECODED_THREADS
add max_sessions DECODED_MAX_SESSIONS
add max_batch DECODED_MAX_BATCH
add max_step_tokens DECODED_MAX_STEP_TOKENS
add context_length DECODED_CONTEXT_LENGTH
add kv_budget_mb DECODED_KV_BUDGET_MB
add kv_block_tokens DECODED_KV_BLOCK_TOKENS
add kv_type DECODED_KV_TYPE
add drain_seconds DECODED_DRAIN_SECONDS
add max_connections DECODED_MAX_CONNECTIONS
add max_sessions_per_peer DECODED_MAX_SESSIONS_PER_PEER
add idle_session_seconds DECODED_IDLE_SESSION_SECONDS
add auth_token DECODED_AUTH_TOKEN
add metrics_auth_token DECODED_METRICS_AUTH_TOKEN
exec /usr/local/bin/decoded "${args[@]}" "$@"
