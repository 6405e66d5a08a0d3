#!/usr/bin/env bash
# engine-candle beside llama.cpp on the same GGUF and thread count, in one run:
#  1. cargo bench -p engine-candle --bench engine (in-process engine)
#  2. llama-bench pp128/tg128 (llama.cpp's own numbers)
#  3. llama-server -np 8 -cb driven by orchd-load (orchestratord/src/bin) at concurrency 1 4 8;
#     point the same command at orchestratord for the other side of the comparison
# Needs LLAMA_CPP_BIN: a folder with llama-bench and llama-server built from the sdist of
# llama-cpp-python 0.3.36 (vendor/llama.cpp, with its CMake). Run on a quiet machine;
# figures are medians.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
model="$(ci/fetch-model.sh)"
threads="${THREADS:-2}"
cargo bench -q -p engine-candle --bench engine -- --threads "$threads"
if [ -z "${LLAMA_CPP_BIN:-}" ]; then
  echo "LLAMA_CPP_BIN not set: skipping the llama.cpp side" >&2
  exit 0
fi
"$LLAMA_CPP_BIN/llama-bench" -m "$model" -t "$threads" -p 128 -n 128 -r 5 -o md
port=18080
"$LLAMA_CPP_BIN/llama-server" -m "$model" -t "$threads" -np 8 -cb -c 16384 --port "$port" >/tmp/llama-server.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
for _ in $(seq 100); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.2; done
cargo run -q --release -p orchestratord --bin orchd-load -- --base-url "http://127.0.0.1:$port" \
  --concurrency 1 4 8 -n 16 --max-tokens 64
