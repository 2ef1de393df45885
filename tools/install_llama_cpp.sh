#!/usr/bin/env bash
# Installs llama-cpp-python (llama.cpp behind ctypes) for the reference and
# benchmark tools, built from its pinned source release with the x86-64
# instruction sets named explicitly. This is the only supported way to install
# it here: tools/requirements-reference.txt leaves it out on purpose.
#
# Why: a plain `pip install llama-cpp-python` compiles llama.cpp with
# -march=native (GGML_NATIVE=ON), plus ggml's AMX kernels where the build host
# reports AMX, and pip caches the wheel under the version alone. A wheel made on
# one host then dies with SIGILL on another that lacks one of those
# instructions. Our machines are AMD Zen 5 and Intel Xeon Sapphire/Emerald
# Rapids; FLAGS below turn native detection and AMX (Intel only) off and name
# only what both have: SSE4.2, AVX, AVX2, FMA, F16C, BMI2, and AVX-512
# F/CD/BW/DQ/VL (GGML_AVX512) + VBMI + VNNI + BF16. Option names are
# llama.cpp's (vendor/llama.cpp/ggml/CMakeLists.txt in the sdist).
#
# Caching: the wheel is kept in ${DECODED_CACHE_DIR:-~/.cache/decoded}/
# llama-cpp-python/<key>/, key = sha256 of the version and FLAGS, so a wheel is
# reused only for the same flags; pip's own wheel cache is bypassed
# (--no-cache-dir), and no prebuilt wheel is ever taken (the sdist is fetched
# with --no-binary and checked against its sha256). The source and CMake build
# folders have fixed paths and compile through ccache, so rebuilding after the
# wheel is gone is much faster than the first build (docs/reference-data.md has
# the timings).
#
# Usage: tools/install_llama_cpp.sh   (PYTHON=... picks the interpreter, JOBS=N
# the build's parallel jobs, default nproc)
#        tools/install_llama_cpp.sh --server       also builds llama.cpp's own
#            server (vendor/llama.cpp/tools/server in the same sdist, the same
#            FLAGS) for bench/run_prefix_bench.py, and prints its path
#        tools/install_llama_cpp.sh --server-path  prints where that binary is
#            (exit 1 if it is not built)
# Idempotent: when the installed libraries are byte-identical to the cached
# wheel's it only says so. Exit 3 when the CPU lacks one of the instruction
# sets (the build would crash there), 1 when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly VERSION=0.3.36
readonly SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
readonly FLAGS=(
  -DGGML_NATIVE=OFF
  -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
  -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
  -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  # The multimodal library is loaded lazily and none of our tools use it.
  -DLLAVA_BUILD=OFF
)
# /proc/cpuinfo names of the instruction sets FLAGS compile in.
readonly CPU_FLAGS=(sse4_2 avx avx2 fma f16c bmi2 avx512f avx512cd avx512bw avx512dq avx512vl
                    avx512vbmi avx512_vnni avx512_bf16)

py="${PYTHON:-python3}"
root="${DECODED_CACHE_DIR:-$HOME/.cache/decoded}/llama-cpp-python"
key=$(printf '%s\n' "llama-cpp-python==$VERSION" "${FLAGS[@]}" | sha256sum | cut -c1-16)
wheel_dir="$root/$key"
src="$root/src-$VERSION"
server_bin="$root/server-$key/bin/llama-server"
log() { echo "install_llama_cpp: $*" >&2; }

if [[ "${1:-}" == --server-path ]]; then
  echo "$server_bin"
  [[ -x "$server_bin" ]]
  exit
fi

missing=()
for f in "${CPU_FLAGS[@]}"; do
  grep -qw "$f" /proc/cpuinfo || missing+=("$f")
done
if ((${#missing[@]})); then
  log "this CPU lacks ${missing[*]}; a build with these flags would die with SIGILL here"
  exit 3
fi

# The sdist, checked against its sha256, unpacked at $src.
fetch_source() {
  if [[ ! -f "$src/pyproject.toml" ]]; then
    mkdir -p "$root"
    tmp=$(mktemp -d "$root/dl.XXXXXX")
    "$py" -m pip download --quiet --no-cache-dir --no-deps --no-binary :all: -d "$tmp" \
      "llama-cpp-python==$VERSION" >&2
    sdist="$tmp/llama_cpp_python-$VERSION.tar.gz"
    echo "$SDIST_SHA256  $sdist" | sha256sum -c --quiet - >&2 || { log "sdist sha256 mismatch"; exit 1; }
    rm -rf "$src"
    tar -xzf "$sdist" -C "$tmp"
    mv "$tmp/llama_cpp_python-$VERSION" "$src"
    rm -rf "$tmp"
  fi
}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

wheel=$(ls "$wheel_dir"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [[ -z "$wheel" ]]; then
  start=$SECONDS
  fetch_source
  build_log="$root/build-$key.log"
  log "building llama-cpp-python $VERSION (key $key; several minutes on 2 cores; log $build_log): ${FLAGS[*]}"
  rm -rf "$wheel_dir.tmp"
  if ! CMAKE_ARGS="${FLAGS[*]} ${launcher[*]}" CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}" \
      "$py" -m pip wheel --verbose --no-cache-dir --no-deps -w "$wheel_dir.tmp" \
      --config-settings=build-dir="$root/build-$key" "$src" >"$build_log" 2>&1; then
    tail -n 30 "$build_log" >&2
    log "build failed (log $build_log)"
    exit 1
  fi
  rm -rf "$wheel_dir"
  mv "$wheel_dir.tmp" "$wheel_dir"
  wheel=$(ls "$wheel_dir"/llama_cpp_python-"$VERSION"-*.whl | head -n1)
  log "built $wheel in $((SECONDS - start)) s"
fi

# Installed iff every library in the wheel is byte-identical to the installed one.
same=$("$py" - "$wheel" <<'EOF' 2>/dev/null || echo no
import hashlib, importlib.util, pathlib, sys, zipfile
spec = importlib.util.find_spec("llama_cpp")
if spec is None:
    print("no"); sys.exit()
site = pathlib.Path(spec.origin).parent.parent
with zipfile.ZipFile(sys.argv[1]) as z:
    libs = [n for n in z.namelist() if n.startswith("llama_cpp/lib/") and ".so" in n]
    ok = bool(libs) and all((site / n).is_file() and
                            hashlib.sha256((site / n).read_bytes()).digest() == hashlib.sha256(z.read(n)).digest()
                            for n in libs)
print("yes" if ok else "no")
EOF
)
if [[ "$same" == yes ]]; then
  log "llama-cpp-python $VERSION (key $key) is already installed"
else
  scripts/pip_install.sh "$py" --no-cache-dir --no-deps --force-reinstall "$wheel"
  scripts/pip_install.sh "$py" --no-cache-dir "$wheel"  # its dependencies (numpy, jinja2, ...)
  log "installed $wheel"
fi
"$py" -c 'import llama_cpp; print(llama_cpp.__version__, llama_cpp.llama_print_system_info().decode().strip())' >&2

if [[ "${1:-}" == --server ]]; then
  if [[ ! -x "$server_bin" ]]; then
    fetch_source
    start=$SECONDS
    server_build="$root/server-build-$key"
    log "building llama-server from $src/vendor/llama.cpp (log $server_build.log)"
    if ! { cmake -S "$src/vendor/llama.cpp" -B "$server_build" -DCMAKE_BUILD_TYPE=Release "${FLAGS[@]}" \
             "${launcher[@]}" -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
             -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF &&
           cmake --build "$server_build" -j "${JOBS:-$(nproc)}" --target llama-server; } >"$server_build.log" 2>&1; then
      tail -n 30 "$server_build.log" >&2
      log "llama-server build failed (log $server_build.log)"
      exit 1
    fi
    mkdir -p "$(dirname "$server_bin")"
    cp "$server_build/bin/llama-server" "$server_bin"
    log "built $server_bin in $((SECONDS - start)) s"
  fi
  echo "$server_bin"
fi
