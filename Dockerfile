# syntax=docker/dockerfile:1
# orchestratord and orchctl, multi-stage. CPU (default):
#   docker build -t orchestratord:latest .
# CUDA (the `cuda` feature; run with the NVIDIA container runtime, driver >= the toolkit's):
#   docker build -t orchestratord:cuda --build-arg FEATURES=cuda \
#     --build-arg BUILD_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04 \
#     --build-arg RUNTIME_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04 \
#     --build-arg CUDA_COMPUTE_CAP=90 .
# The image holds no model: mount GGUF files at /models (deploy/k8s/) or pass --config with
# your pools. The default model can be baked in with --build-arg WITH_DEFAULT_MODEL=1.
# It listens on 0.0.0.0:8080, so it starts only with API keys (env ORCHD_API_KEYS, see
# README "Security"). Probes: GET /livez, GET /readyz.
ARG BUILD_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
ARG FEATURES=""
ARG CUDA_COMPUTE_CAP=90
ARG WITH_DEFAULT_MODEL=0
ENV CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP}
# a CUDA devel image has no Rust; the rust image has no python (fetch-model.sh uses pip)
RUN set -eux; \
    if ! command -v cargo >/dev/null; then \
      apt-get update; apt-get install -y --no-install-recommends curl ca-certificates gcc libc6-dev; \
      curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal; \
    fi; \
    if [ "$WITH_DEFAULT_MODEL" = 1 ] && ! command -v pip3 >/dev/null; then \
      apt-get update; apt-get install -y --no-install-recommends python3-pip; \
    fi
ENV PATH=/root/.cargo/bin:${PATH}
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/root/.cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eux; \
    cargo build --release --locked -p orchestratord --bins ${FEATURES:+--features $FEATURES}; \
    mkdir -p /out/models; \
    cp target/release/orchestratord target/release/orchctl /out/; \
    if [ "$WITH_DEFAULT_MODEL" = 1 ]; then \
      ORCHD_MODEL_CACHE=/out/models PIP_BREAK_SYSTEM_PACKAGES=1 ci/fetch-model.sh; \
    fi

FROM ${RUNTIME_IMAGE}
RUN set -eux; \
    apt-get update; apt-get install -y --no-install-recommends ca-certificates; \
    rm -rf /var/lib/apt/lists/*; \
    useradd --uid 10001 --create-home --home-dir /home/orchd orchd; \
    install -d -o 10001 /home/orchd/data
COPY --from=build /out/orchestratord /out/orchctl /usr/local/bin/
# the default model (if baked in) where the server looks without a config
COPY --from=build --chown=10001 /out/models/ /home/orchd/.cache/models/
USER 10001
WORKDIR /home/orchd
# task records and artifacts (records.path = data/records.sqlite3): mount a volume to keep them
VOLUME ["/home/orchd/data"]
ENV ORCHD_BIND=0.0.0.0:8080 ORCHD_URL=http://127.0.0.1:8080
EXPOSE 8080
ENTRYPOINT ["orchestratord"]
CMD ["--log-format", "json"]
