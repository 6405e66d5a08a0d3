# Sourced (not run): NVIDIA's CUDA 13.0 toolkit from PyPI into the ignored .cache/cuda, enough
# to compile AND link CUDA programs on a machine with no GPU, no driver and no system CUDA:
#  - nvcc, nvvm, crt, the runtime and CCCL (candle's kernels, llama.cpp's ggml-cuda);
#  - cuBLAS, cuBLASLt, cuRAND and NVRTC (the libraries candle's cudarc links by name);
#  - a stub libcuda.so (soname libcuda.so.1) exporting every driver entry point that cuda.h
#    declares: the executables link against it and, on the GPU machine, load the real driver
#    library of that name instead (the stub itself never travels).
# 13.0.x because the lent GPU machines run driver 580 (CUDA 13.0), which cannot load PTX from a
# newer toolkit. Exports PATH, CUDA_ROOT/CUDA_PATH/CUDA_HOME, CPATH and CUDA_COMPUTE_CAP (90:
# Hopper, the H100/H200) and sets `cuda` to the toolkit's root. Once per pin set: ~1 GB of
# wheels (cuBLASLt alone is 540 MB), seconds after that.
cuda_cache="$(pwd)/.cache/cuda"
cuda_pins="nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88"
if [ "$(cat "$cuda_cache/.installed" 2>/dev/null)" != "$cuda_pins" ]; then
  rm -rf "$cuda_cache"
  # shellcheck disable=SC2086
  python3 -m pip install --quiet --no-deps --no-cache-dir --disable-pip-version-check --target "$cuda_cache" $cuda_pins >&2
  cuda="$cuda_cache/nvidia/cu13"
  # the layout CMake's FindCUDAToolkit and cudarc's build script search: lib64, unversioned
  # names, lib/stubs/libcuda.so
  ln -sfn lib "$cuda/lib64"
  for l in cublas cublasLt cudart nvrtc; do ln -sf "lib$l.so.13" "$cuda/lib/lib$l.so"; done
  ln -sf libcurand.so.10 "$cuda/lib/libcurand.so"
  mkdir -p "$cuda/lib/stubs"
  python3 - "$cuda/include/cuda.h" >"$cuda/lib/stubs/cuda_stub.c" <<'PY'
import re, sys
h = open(sys.argv[1]).read()
names = set(re.findall(r"CUDAAPI\s+(cu\w+)\s*\(", h))
names |= {b for _, b in re.findall(r"#define\s+(cu\w+)\s+(cu\w+_v\d+)\b", h)}
for n in sorted(names):
    print(f"int {n}(void) {{ return 999; /* CUDA_ERROR_UNKNOWN: a stub, never loaded */ }}")
PY
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$cuda/lib/stubs/libcuda.so" "$cuda/lib/stubs/cuda_stub.c"
  # cudarc's build script gives the linker only the first library folder it finds
  ln -sf stubs/libcuda.so "$cuda/lib/libcuda.so"
  echo "$cuda_pins" >"$cuda_cache/.installed"
fi
cuda="$cuda_cache/nvidia/cu13"
export PATH="$cuda/bin:$PATH" CUDA_ROOT="$cuda" CUDA_PATH="$cuda" CUDA_HOME="$cuda"
export CPATH="$cuda/include:$cuda/include/cccl${CPATH:+:$CPATH}"
# no GPU to ask: build PTX/SASS for Hopper (H100/H200) unless told otherwise
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
# candle-kernels' builder runs one nvcc per file on half the cores unless told; use them all
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
