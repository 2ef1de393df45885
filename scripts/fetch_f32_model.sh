#!/usr/bin/env bash
# Makes the all-F32 copy of the default model (Gemma 3 270M Q4_K_M, every tensor dequantized exactly) that
# tests/models/gemma3_f32_reference_test.cc compares with HF transformers, and prints its path.
#
# Runs tools/make_f32_model.py, which fetches the Q4_K_M file through scripts/fetch_model.sh when needed,
# writes ${DECODED_CACHE_DIR:-$HOME/.cache/decoded}/gemma-3-270m-f32.gguf (1078917824 bytes) and checks its
# recorded sha256. Idempotent: a verified file is left alone (~3 s to hash it).
#
# Environment:
#   DECODED_CACHE_DIR  target folder (default: $HOME/.cache/decoded)
#   PYTHON             interpreter (default: python3, the pyenv 3.11 one on dev machines)
# Output: the absolute path on stdout (one line); progress goes to stderr.
# Exit status: 0 on success, 1 when a package cannot be installed or the file does not verify.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { echo "fetch_f32_model: $*" >&2; }

if ! "$PYTHON" -c "import gguf, numpy" 2>/dev/null; then
  # The versions the recorded sha256 was made with (tools/requirements-reference.txt).
  log "installing gguf and numpy with ${PYTHON} -m pip"
  "${repo_root}/scripts/pip_install.sh" "$PYTHON" "gguf==0.19.0" "numpy==2.4.6" || { log "pip install failed"; exit 1; }
fi

"$PYTHON" "${repo_root}/tools/make_f32_model.py" "$@"
