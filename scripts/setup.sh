#!/usr/bin/env bash
# Installs the Debian build stack decoded needs on Debian 12 (idempotent).
# The model comes from scripts/fetch_model.sh, which run.sh and test.sh call.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev prometheus-cpp-dev nlohmann-json3-dev libboost-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev
  python3 python3-pip curl
  libvulkan-dev glslc mesa-vulkan-drivers vulkan-validationlayers
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

