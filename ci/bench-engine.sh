#!/usr/bin/env bash
# engine-candle beside llama.cpp on the same GGUF and thread count, in one run:
#  1. cargo bench -p engine-candle --bench engine (in-process engine)
#  2. llama-bench pp128/tg128 (llama.cpp's own numbers)          [with LLAMA_CPP_BIN]
#  3. streaming chat load (orchd-load, concurrency 1 4 8) against orchestratord (8 slots) and
#     then llama-server -np 8 -cb [with LLAMA_CPP_BIN], one server at a time, same requests
# LLAMA_CPP_BIN: a folder with llama-bench and llama-server (e.g. built from the sdist of
# llama-cpp-python 0.3.36: vendor/llama.cpp, with its CMake). THREADS (default 2). MODEL: a
# GGUF (default: the default model; `MODEL=gemma` the Gemma 3 270M Q4_K_M of ci/fetch-gemma.sh).
# Run on a quiet machine; compare medians of paired runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case "${MODEL:-}" in
  "") model="$(ci/fetch-model.sh)" ;;
  gemma) model="$(ci/fetch-gemma.sh)" ;;
  *) model="$(realpath "$MODEL")" ;;
esac
export ORCHD_TEST_MODEL="$model"
threads="${THREADS:-2}"
cargo bench -q -p engine-candle --bench engine -- --threads "$threads"
cargo build -q --release -p orchestratord --bin orchestratord -p orchd-tools --bin orchd-load
pid=""
trap '[ -n "$pid" ] && kill $pid 2>/dev/null' EXIT
load() { # name, base URL, readiness path
  for _ in $(seq 300); do curl -sf "$2$3" >/dev/null && break; sleep 0.2; done
  echo "## $1"
  target/release/orchd-load --base-url "$2" --model "$(basename "$model" .gguf)" --concurrency 1 4 8 -n 16 --max-tokens 64
}
port=18081
cfg="$(mktemp)"
printf 'bind = "127.0.0.1:%s"\n[[pools]]\nid = "default"\nmodel = "%s"\nslots = 8\nctx = 2048\nthreads = %s\n' \
  "$port" "$model" "$threads" >"$cfg"
target/release/orchestratord --config "$cfg" >/tmp/orchestratord-bench.log 2>&1 &
pid=$!
load orchestratord "http://127.0.0.1:$port" /readyz
kill $pid; wait $pid 2>/dev/null || true; pid=""
if [ -z "${LLAMA_CPP_BIN:-}" ]; then
  echo "LLAMA_CPP_BIN not set: skipping the llama.cpp side" >&2
  exit 0
fi
if [ -x "$LLAMA_CPP_BIN/llama-bench" ]; then
  "$LLAMA_CPP_BIN/llama-bench" -m "$model" -t "$threads" -p 128 -n 128 -r 5 -o md
else
  echo "no llama-bench in $LLAMA_CPP_BIN: skipping llama.cpp's own numbers" >&2
fi
port=18080
"$LLAMA_CPP_BIN/llama-server" -m "$model" -t "$threads" -np 8 -cb -c 16384 --port "$port" >/tmp/llama-server.log 2>&1 &
pid=$!
load llama-server "http://127.0.0.1:$port" /health
