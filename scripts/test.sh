#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs every test
# twice: the Release build, then an AddressSanitizer + UndefinedBehaviorSanitizer
# build; between them, the deployment (Kubernetes manifests, container image).
# The real model is required (DECODED_REQUIRE_MODEL=1): a missing model fails
# instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's start, with the seconds since this script began: CI's log then
# shows where its time goes (it must finish well inside 90 minutes).
stage() { echo "test: $1 at ${SECONDS}s" >&2; }
stage "setup"
scripts/setup.sh
export DECODED_MODEL_PATH="${DECODED_MODEL_PATH:-$(scripts/fetch_model.sh)}"
# An all-F32 copy of the same weights (made locally, verified by sha256) for
# the tight real-architecture comparison with transformers.
export DECODED_F32_MODEL_PATH="${DECODED_F32_MODEL_PATH:-$(scripts/fetch_f32_model.sh)}"
# The instruction-tuned models of the next families (their tokenizers are
# tested against Hugging Face's and llama.cpp's ids already).
export DECODED_SMOLLM2_PATH="${DECODED_SMOLLM2_PATH:-$(scripts/fetch_model.sh smollm2)}"
export DECODED_QWEN2_PATH="${DECODED_QWEN2_PATH:-$(scripts/fetch_model.sh qwen2)}"
export DECODED_REQUIRE_MODEL=1
# The official OpenAI SDK for the HTTP API's client test (tests/server/openai_sdk_test.py).
scripts/pip_install.sh python3 "openai==3.63.0"
# locust for the short HTTP load run beside decoded-loadgen (tests/server/openai_load_test.py). Not guidellm:
# it imports torch (its data loader), and torch from PyPI brings ~3 GB of CUDA wheels.
scripts/pip_install.sh python3 "locust==2.47.0"
# The Vulkan backend's tests run on Mesa's lavapipe (mesa-vulkan-drivers) with
# the Khronos validation layer; without a device they would skip: fail instead.
export DECODED_REQUIRE_VULKAN=1
# llama.cpp (llama-cpp-python, built with portable CPU flags) for the check that
# the committed llama.cpp reference still reproduces here. The first build takes
# 10-25 minutes on 2 cores; later runs reuse the cached wheel or ccache.
if [[ "${DECODED_SKIP_LLAMACPP:-0}" != 1 ]]; then
  stage "llama.cpp install"
  rc=0
  tools/install_llama_cpp.sh || rc=$?
  if ((rc == 3)); then
    echo "test: this CPU cannot run the portable llama.cpp build; its reference check is skipped" >&2
  elif ((rc != 0)); then
    exit "$rc"
  fi
fi

stage "Release build"
BUILD_DIR=build scripts/build.sh -DDECODED_SANITIZE=OFF
stage "Release tests"
ctest --test-dir build --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900
# Prometheus rules, Grafana dashboard and console against the daemon just built.
stage "monitoring"
BUILD_DIR=build scripts/test_monitoring.sh

# The deployment (docs/deploy.md): the Kubernetes manifests rendered and
# validated offline, then the container image built (cached between runs) and
# run on the real model: health, one streamed turn, /metrics, SIGTERM drain.
stage "Kubernetes manifests"
scripts/test_k8s.sh
if [[ "${DECODED_SKIP_IMAGE:-0}" != 1 ]]; then
  stage "container image"
  scripts/test_image.sh
fi

if [[ "${DECODED_SKIP_SANITIZERS:-0}" != 1 ]]; then
  # -O1 with line tables only (-g1): half the compile time of RelWithDebInfo's
  # -O2 -g (hardening_e2e_test.cc: 89 -> 43 s), which made this build most of
  # a cold CI run; the sanitizers' stack traces still name file and line.
  stage "ASan+UBSan build"
  BUILD_DIR=build-asan BUILD_TYPE=RelWithDebInfo scripts/build.sh -DDECODED_SANITIZE=ON -DDECODED_BUILD_BENCH=OFF \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  stage "ASan+UBSan tests"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp" \
    ctest --test-dir build-asan --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 1800
fi
stage "all passed"
