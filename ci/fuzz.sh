#!/usr/bin/env bash
# The fuzz targets (proptest; cargo-fuzz needs a nightly toolchain this project does not use)
# run for many cases: adapter JSON bodies and Hyperswarm lines (orchestratord/tests/fuzz_bodies.rs),
# the SSE writer with arbitrary token text (orchestratord/tests/fuzz_sse.rs),
# tokenizer/detokenizer round trip and the chat template with hostile content
# (engine-candle/tests/fuzz_text.rs). CI runs the same targets with few cases.
#   ci/fuzz.sh [CASES]      (default 5000 per target)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ci/fetch-model.sh >/dev/null
cases="${1:-5000}"
export PROPTEST_CASES="$cases"
start=$(date +%s)
cargo test -p engine-candle --test fuzz_text -- --test-threads 1
cargo test -p orchestratord --test fuzz_bodies --test fuzz_sse -- --test-threads 1
echo "fuzz: $cases cases per target, $(( $(date +%s) - start )) s"
