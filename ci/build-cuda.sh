#!/usr/bin/env bash
# Compiles the `cuda` feature on a machine with no GPU and no system CUDA, so it cannot rot:
# NVIDIA's CUDA 13.0 toolkit from PyPI (ci/cuda-toolkit.sh), then the crates build with
# `--features cuda`: candle's CUDA kernels are compiled to PTX by nvcc and every
# `cfg(feature = "cuda")` path of ours is type-checked and compiled. Linking the executables
# that run on a GPU is ci/gpu-run.sh's part. Extra args go to cargo build. About 5.5 minutes
# on 2 cores the first time (candle's quantized matmul kernels), seconds after that.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=ci/cuda-toolkit.sh
source ci/cuda-toolkit.sh
nvcc --version | tail -n 1 >&2
# one build: orchestratord's `cuda` turns on pool-manager's and engine-candle's
cargo build -p orchestratord --lib --features cuda "$@"
