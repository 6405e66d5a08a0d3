#!/usr/bin/env bash
# Compiles the `cuda` feature on a machine with no GPU and no system CUDA, so it cannot rot:
# NVIDIA's CUDA 13.0 compiler (nvcc, nvvm, crt), runtime headers and CCCL come from PyPI into
# the ignored .cache/cuda (once, pinned), then the crates build with `--features cuda`: candle's
# CUDA kernels are compiled to PTX by nvcc and every `cfg(feature = "cuda")` path of ours is
# type-checked and compiled. Nothing is linked here: the driver, cuBLAS and NVRTC libraries are
# those of the GPU machine. 13.0.x because the lent GPU machines run driver 580 (CUDA 13.0),
# which cannot load PTX from a newer toolkit. Extra args go to cargo build. About 5.5 minutes
# on 2 cores the first time (candle's quantized matmul kernels), seconds after that.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=.cache/cuda
pins="nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85"
if [ "$(cat "$dir/.installed" 2>/dev/null)" != "$pins" ]; then
  rm -rf "$dir"
  # shellcheck disable=SC2086
  python3 -m pip install --quiet --no-deps --disable-pip-version-check --target "$dir" $pins >&2
  echo "$pins" >"$dir/.installed"
fi
cu="$(pwd)/$dir/nvidia/cu13"
export PATH="$cu/bin:$PATH" CUDA_ROOT="$cu" CUDA_PATH="$cu" CUDA_HOME="$cu"
export CPATH="$cu/include:$cu/include/cccl${CPATH:+:$CPATH}"
# no GPU to ask: build PTX/SASS for Hopper (H100/H200) unless told otherwise
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
# candle-kernels' builder runs one nvcc per file on half the cores unless told; use them all
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
nvcc --version | tail -n 1 >&2
# one build: orchestratord's `cuda` turns on pool-manager's and engine-candle's
cargo build -p orchestratord --lib --features cuda "$@"
