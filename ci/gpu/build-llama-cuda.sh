#!/usr/bin/env bash
# Builds llama.cpp's CUDA benchmarks and server here, with no GPU, for the GPU day's side-by-
# side (ci/gpu-run.sh carries the result when LLAMA_CUDA_BUILD names it): the source is the
# vendor/llama.cpp of llama-cpp-python 0.3.36's sdist from PyPI (the version our CPU reference
# fixtures came from), CMake and ninja from PyPI, CUDA from ci/cuda-toolkit.sh. sm_90 only
# (H100/H200), FlashAttention kernels for the default KV types (llama.cpp's default build),
# shared libraries beside the executables (RUNPATH $ORIGIN). About an hour on 2 cores (the
# template instances of the quantized matmul and FlashAttention kernels); prints the build
# folder. Idempotent: ninja rebuilds nothing that is up to date.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=ci/cuda-toolkit.sh
source ci/cuda-toolkit.sh
dir="$(pwd)/.cache/llama-cuda"
sdist="llama_cpp_python-0.3.36.tar.gz"
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
mkdir -p "$dir"
if [ ! -x "$dir/tools/bin/cmake" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$dir/tools" cmake==4.4.5 ninja==1.13.2 >&2
fi
export PATH="$dir/tools/bin:$PATH" PYTHONPATH="$dir/tools${PYTHONPATH:+:$PYTHONPATH}"
if [ ! -d "$dir/src" ]; then
  url="$(curl -sf https://pypi.org/simple/llama-cpp-python/ | grep -o "https://[^\"#]*/$sdist" | head -n 1)"
  curl -sfL -o "$dir/$sdist" "$url"
  echo "$sha  $dir/$sdist" | sha256sum -c - >&2
  tar -C "$dir" -xzf "$dir/$sdist"
  mv "$dir/llama_cpp_python-0.3.36/vendor/llama.cpp" "$dir/src"
  rm -rf "$dir/llama_cpp_python-0.3.36" "$dir/$sdist"
fi
if [ ! -f "$dir/build/build.ninja" ]; then
  cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCUDAToolkit_ROOT="$cuda" \
    -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DCMAKE_CUDA_FLAGS="-I$cuda/include/cccl" \
    -DGGML_NATIVE=OFF -DGGML_CUDA_NCCL=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_RPATH='$ORIGIN' \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$cuda/lib" \
    -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$cuda/lib" >&2
fi
# the server too with LLAMA_SERVER=1 (for the server scenarios: ~20 minutes more)
ninja -C "$dir/build" llama-bench llama-batched-bench ${LLAMA_SERVER:+llama-server} >&2
echo "$dir/build"
