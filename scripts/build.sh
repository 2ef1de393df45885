#!/usr/bin/env bash
# Configures and builds decoded (Release) into ${BUILD_DIR:-build}.
# Extra arguments go to CMake's configure step (e.g. -DDECODED_SANITIZE=ON).
# BUILD_TARGETS (space-separated) builds only those targets, e.g. "decoded
# decoded-cli" for the main job; unset, everything (tests and benchmarks too).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@" >&2
targets=()
for t in ${BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "$jobs" "${targets[@]}" >&2
