#!/usr/bin/env bash
# Type-checks the `cuda` feature on a machine with no GPU and no system CUDA, so it cannot rot:
# NVIDIA's CUDA 13.0 toolkit from PyPI (ci/cuda-toolkit.sh), then engine-candle, where all of
# the `cuda` code is, checks with `--features cuda --all-targets`: candle's CUDA kernels are
# compiled to PTX by nvcc and every `cfg(feature = "cuda")` path of ours, tests and benches
# included, is type-checked. Linking the executables that run on a GPU is ci/gpu-run.sh's part.
# Extra args go to cargo check. About 4 minutes on 2 cores the first time, seconds after that.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=ci/cuda-toolkit.sh
source ci/cuda-toolkit.sh
nvcc --version | tail -n 1 >&2
cargo check -p engine-candle --features cuda --all-targets "$@"
