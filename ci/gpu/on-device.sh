#!/usr/bin/env bash
# Runs on the lent GPU machine (or, with DEVICE=cpu, on any machine: CI's dry run) over what
# ci/gpu-run.sh put in .gpu-carry/: one payload cut into parts, one part per device call,
# because a call carries 64 MiB and the payload (model, executables, llama.cpp) is more.
#   ci/gpu/on-device.sh stage K   calls 1..N-1 (carry .gpu-carry/K): keep part K in $STAGE,
#                                 outside $OUT, where it stays while the machine is warm (30 s
#                                 after a call); call 1 also prints what the machine has
#   ci/gpu/on-device.sh run N     the last call (carry .gpu-carry/N): join the parts, check the
#                                 sha256, unpack, then
#     1. correctness: engine-candle's real-model tests on $DEVICE (ORCHD_TEST_DEVICE), CPU-vs-
#        device greedy parity (device_parity), 8 batched = each alone (batching), ...;
#     2. speed: benches/device_sweep (decode at 1/8/32/64 sequences, prompt 512/2048, TTFT)
#        and, where llama.cpp travelled, llama-bench and llama-batched-bench on the same GGUF;
#     3. a summary last (the call's reply carries the end of the output).
# TESTS picks the test executables (default: all that travelled; a name with "+dmmv" runs with
# candle's plain CUDA matmul kernels); NO_BENCH=1 and NO_LLAMA=1 leave out the device sweep
# and llama.cpp's benchmarks, BENCH_DMMV=1 adds a sweep with candle's plain kernels. Logs go
# to $OUT (the device tool brings them back) or ./gpu-out. Keeps going after a failure and
# says which steps failed; exit status 1 if any did.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
phase="${1:-run}"
k="${2:-1}"
carry=".gpu-carry/$k"
DEVICE="${DEVICE:-cuda:0}"
STAGE="${STAGE:-/tmp/orchd-gpu}"
OUT="${OUT:-$(pwd)/gpu-out}"
TEST_TIMEOUT="${TEST_TIMEOUT:-90}"   # seconds for one test executable
TESTS_BUDGET="${TESTS_BUDGET:-180}" # seconds for all of them: the benchmarks come after
mkdir -p "$STAGE" "$OUT"
failed=()
summary=()
step() { # name, command...: runs it with its output in $OUT/<name>.log, notes a failure
  local name="$1" t0="$EPOCHREALTIME" rc
  shift
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  summary+=("$(printf '%-28s rc=%-3s %6.1f s' "$name" "$rc" "$(awk "BEGIN { print $EPOCHREALTIME - $t0 }")")")
  [ "$rc" = 0 ] || failed+=("$name")
  return "$rc"
}
untar() { # archive, folder (python's tarfile: no xz binary needed)
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"
}
machine() {
  echo "## machine"
  uname -a
  nproc
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
}

# the libraries the executables were linked against, from wherever this machine keeps them
# (PyTorch's NVIDIA wheels; the driver's folder)
libdirs() {
  local d
  for f in $(find /opt /usr /lib /lib64 \( -name 'libcublas.so.13*' -o -name 'libcurand.so.10*' -o -name 'libnvrtc.so.13*' -o -name 'libcudart.so.13*' -o -name 'libcuda.so.1' \) -print 2>/dev/null | sort -u); do
    d="$(dirname "$f")"
    case ":$LD:" in *":$d:"*) ;; *) LD="$LD:$d" ;; esac
  done
}

cp "$carry/payload.part" "$STAGE/payload.part.$k" || exit 1
echo "part $k kept: $(du -h "$STAGE/payload.part.$k" | cut -f1)"
if [ "$phase" = stage ]; then
  if [ "$k" = 1 ]; then
    machine | tee "$OUT/machine.txt"
    LD=""
    libdirs
    echo "libraries found in: ${LD#:}"
    df -h /tmp | tail -n 1
  fi
  exit 0
fi

# ---- run ----
machine | tee "$OUT/machine.txt"
payload="$STAGE/payload"
rm -rf "$payload" && mkdir -p "$payload"
for i in $(seq "$k"); do
  [ -f "$STAGE/payload.part.$i" ] || { echo "part $i was not kept here: run the calls 1..$k one right after the other"; exit 1; }
done
want="$(cat "$carry/payload.sha256")"
for i in $(seq "$k"); do cat "$STAGE/payload.part.$i"; done >"$STAGE/payload.tar"
rm -f "$STAGE"/payload.part.*
have="$(sha256sum "$STAGE/payload.tar" | cut -d' ' -f1)"
[ "$want" = "$have" ] || { echo "payload sha256 $have, want $want"; exit 1; }
tar -C "$payload" -xf "$STAGE/payload.tar" && rm -f "$STAGE/payload.tar" || exit 1
model="$payload/model.gguf"
mkdir -p "$STAGE/bin" && untar "$payload/bins.tar.xz" "$STAGE/bin" || exit 1
if [ -f "$payload/llama.tar.xz" ]; then
  rm -rf "$STAGE/llama" && mkdir -p "$STAGE/llama" && untar "$payload/llama.tar.xz" "$STAGE/llama"
fi
# the test executables read their fixtures by the path they were built at
root="$(cat "$payload/build-root")"
if [ "$root" != "$(pwd)" ] && [ ! -e "$root" ]; then
  mkdir -p "$(dirname "$root")" && ln -s "$(pwd)" "$root"
fi
LD=""
[ "$DEVICE" = cpu ] && LD=":$(pwd)/.gpu-carry/stubs" # CI's dry run: no driver here
[ "$DEVICE" = cpu ] || libdirs
export LD_LIBRARY_PATH="${LD#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ORCHD_TEST_MODEL="$model" ORCHD_TEST_DEVICE="$DEVICE" RUST_BACKTRACE=1
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# 1. correctness, the issue's points first
tests_start=$SECONDS
# a name with "+dmmv": the same executable with candle's plain CUDA matmul kernels
for name in ${TESTS:-device_kernels device_parity batching real_model llama_parity logprobs prefix_cache chunked_prefill prompt_integrity context_default}; do
  t="${name%+dmmv}"
  [ -x "$STAGE/bin/$t" ] || { failed+=("$t(missing)"); continue; }
  left=$((TESTS_BUDGET - (SECONDS - tests_start)))
  [ "$left" -gt 10 ] || { summary+=("test-$name: skipped, the tests' time is up"); continue; }
  dmmv=()
  [ "$name" = "$t" ] || dmmv=(env ORCHD_TEST_CUDA_DMMV=1)
  step "test-$name" "${dmmv[@]}" timeout "$((left < TEST_TIMEOUT ? left : TEST_TIMEOUT))" "$STAGE/bin/$t" --nocapture
done
# 2. speed
if { [ -n "${BENCH_ARGS+x}" ] || [ "$DEVICE" != cpu ]; } && [ -z "${NO_BENCH:-}" ]; then
  # shellcheck disable=SC2086
  step bench-device-sweep timeout 150 "$STAGE/bin/device_sweep" --device "$DEVICE" ${BENCH_ARGS:-}
  # shellcheck disable=SC2086
  [ -z "${BENCH_DMMV:-}" ] || step bench-device-sweep-dmmv timeout 150 "$STAGE/bin/device_sweep" --device "$DEVICE" --dmmv ${BENCH_ARGS:-}
fi
llama="$STAGE/llama"
if [ -x "$llama/llama-bench" ] && [ "$DEVICE" != cpu ] && [ -z "${NO_LLAMA:-}" ]; then
  export LD_LIBRARY_PATH="$llama:$LD_LIBRARY_PATH"
  step llama-bench timeout 75 "$llama/llama-bench" -m "$model" -ngl 99 -p 512,2048 -n 128 -r 3 -o md
  step llama-batched-bench timeout 75 "$llama/llama-batched-bench" -m "$model" -ngl 99 -c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,32,64
fi

# 3. summary
{
  echo "## steps"
  printf '%s\n' "${summary[@]}"
  echo "## tests (result lines)"
  grep -hE "^test result|panicked|answer:|vs CPU:|exact:|positions agree|steps: \|" "$OUT"/test-*.log 2>/dev/null | head -n 60
  for f in "$OUT"/bench-device-sweep*.log; do
    [ -f "$f" ] || continue
    echo "## engine-candle on $DEVICE ($(basename "$f" .log))"
    grep -v '^{' "$f" | tail -n 20
  done
  grep -h "^FAIL" "$OUT"/test-device_kernels*.log 2>/dev/null | head -n 40
  if [ -f "$OUT/llama-bench.log" ]; then
    echo "## llama.cpp"
    grep -E "^\|" "$OUT/llama-bench.log"
    grep -E "^\|" "$OUT/llama-batched-bench.log"
  fi
  echo "## failed: ${failed[*]:-none}"
} | tee "$OUT/summary.txt"
# the device tool brings back 8 files: the logs travel as one
(cd "$OUT" && tar -czf logs.tar.gz -- *.log machine.txt && rm -f -- *.log machine.txt)
[ "${#failed[@]}" = 0 ]
