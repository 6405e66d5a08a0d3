#!/usr/bin/env bash
# Prepares, on a machine with no GPU, everything a lent GPU machine needs to run the CUDA
# engine and llama.cpp beside it, so a GPU day only takes running the printed commands:
#   bins.tar.xz    engine-candle's real-model test executables and benches/device_sweep, built
#                  with `--features cuda` and linked against the toolkit of ci/cuda-toolkit.sh
#                  (cuBLAS/cuRAND/NVRTC by soname, the driver through a stub): no GPU needed.
#                  One xz stream with a 512 MiB window: the executables share ~55 MB (candle's
#                  kernels), so ten of them pack into ~18 MB.
#   model.gguf     the default model (98 MB), as it is
#   llama.tar.xz   llama.cpp's llama-bench, llama-batched-bench and llama-server with their
#                  libraries, built with -DGGML_CUDA=ON for sm_90 (ci/gpu/build-llama-cuda.sh
#                  makes it: about an hour on 2 cores), where LLAMA_CUDA_BUILD names that build
#   build-root     the path the tests were built at (they read fixtures by it)
# One tar of these, cut into parts that each fit one device call (a call carries 64 MiB with
# the working tree), in .gpu-carry/1, .gpu-carry/2, ...; the last holds the tar's sha256.
# Prints the device calls: every part but the last `ci/gpu/on-device.sh stage K`, the last
# `ci/gpu/on-device.sh run K`, one right after the other (a machine stays warm 30 s).
# `--dry-run`: then runs the same calls here with DEVICE=cpu over the same executables (CI),
# so the only untried step on a GPU day is the GPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=ci/cuda-toolkit.sh
source ci/cuda-toolkit.sh
model="$(ci/fetch-model.sh)"
carry=.gpu-carry
part=$((58 * 1024 * 1024)) # per call: 64 MiB less the working tree (~3 MB) and headroom
rm -rf "$carry" && mkdir -p "$carry/payload/bin"
# xz with a large window (the executables share most of their bytes); Python's lzma where a
# machine has no xz binary
xzc() { # window MiB: stdin to stdout
  if command -v xz >/dev/null; then
    xz -T1 --lzma2=preset=1,dict="$1"MiB
  else
    python3 -c 'import lzma, shutil, sys
f = [{"id": lzma.FILTER_LZMA2, "preset": 1, "dict_size": int(sys.argv[1]) << 20}]
with lzma.open(sys.stdout.buffer, "wb", format=lzma.FORMAT_XZ, filters=f) as out:
    shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)' "$1"
  fi
}

# the executables: one build, the dev profile (engine, candle and gemm at opt-level 3)
tests=(device_kernels device_parity batching real_model llama_parity logprobs prefix_cache chunked_prefill prompt_integrity context_default)
json="$(mktemp)"
# (only the executables that travel: each of engine-candle's test crates builds at opt-level 3;
# not `--workspace`: that builds every member's library under `cuda` too, and the feature
# changes serde's features, so nearly every crate builds again either way)
cargo test -p engine-candle --features cuda --no-run --message-format=json-render-diagnostics \
  $(printf -- '--test %s ' "${tests[@]}") --bench device_sweep >"$json"
python3 - "$json" "$carry/payload/bin" "${tests[@]}" device_sweep <<'PY'
import json, shutil, sys
src, dst, wanted = sys.argv[1], sys.argv[2], set(sys.argv[3:])
found = {}
for line in open(src):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        name = m["target"]["name"]
        if name in wanted and m["target"]["kind"] in (["test"], ["bench"]):
            found[name] = m["executable"]
missing = wanted - found.keys()
if missing:
    sys.exit(f"gpu-run: no executable for {sorted(missing)}")
for name, exe in found.items():
    shutil.copy(exe, f"{dst}/{name}")
PY
rm -f "$json"
strip "$carry"/payload/bin/*
tar -C "$carry/payload/bin" -cf - . | xzc 512 >"$carry/payload/bins.tar.xz"
rm -rf "$carry/payload/bin"
pwd >"$carry/payload/build-root"
cp "$model" "$carry/payload/model.gguf"
if [ -n "${LLAMA_CUDA_BUILD:-}" ]; then
  b="$LLAMA_CUDA_BUILD/bin"
  # shellcheck disable=SC2046
  tar -C "$b" -cf - $(cd "$b" && ls llama-bench llama-batched-bench llama-server lib*.so* 2>/dev/null) |
    xzc 256 >"$carry/payload/llama.tar.xz"
fi
tar -C "$carry/payload" -cf "$carry/payload.tar" .
rm -rf "$carry/payload"
split -b "$part" -a 1 --numeric-suffixes=1 "$carry/payload.tar" "$carry/part."
n=$(ls "$carry"/part.* | wc -l)
for k in $(seq "$n"); do
  mkdir -p "$carry/$k" && mv "$carry/part.$k" "$carry/$k/payload.part"
done
sha256sum "$carry/payload.tar" | cut -d' ' -f1 >"$carry/$n/payload.sha256"
# the driver stub, only for the dry run here (the GPU machine has the real library)
mkdir -p "$carry/stubs" && cp "$cuda/lib/stubs/libcuda.so" "$carry/stubs/libcuda.so.1"
rm -f "$carry/payload.tar"
echo "payload: $(du -sh "$carry" | cut -f1) in $n device calls"
echo "GPU day, one call right after the other:"
for k in $(seq "$n"); do
  verb=stage
  [ "$k" = "$n" ] && verb=run
  echo "  device run, carry [\"$carry/$k\"]:  ci/gpu/on-device.sh $verb $k"
done
if [ "${1:-}" = --dry-run ]; then
  # the same calls over the same executables, on the CPU (a few of the tests: the suite ran
  # them all already without the `cuda` feature)
  # the toolkit's cuBLAS/cuRAND/runtime load without a GPU; the driver is the stub
  export DEVICE=cpu STAGE="$(mktemp -d)" OUT="$(mktemp -d)" LD_LIBRARY_PATH="$cuda/lib"
  export TESTS="device_kernels device_parity batching" BENCH_ARGS="--concurrency 1,2 --prompts 64 --decode 8 --rounds 1"
  for k in $(seq "$((n - 1))"); do ci/gpu/on-device.sh stage "$k"; done
  ci/gpu/on-device.sh run "$n"
  rm -rf "$STAGE" "$OUT"
fi
