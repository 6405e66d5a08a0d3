#!/usr/bin/env bash
# Property-based API testing with schemathesis (from PyPI) against a running server's
# /openapi.json: every operation, every check (server errors, schema conformance, status codes,
# content types, stateful links). Installs schemathesis into .cache/schemathesis once.
#   ci/schemathesis.sh [BASE_URL] [MAX_EXAMPLES]     (default http://127.0.0.1:8080, 25)
# Start the server first (ci/serve.sh). Exit status is schemathesis's: 0 when nothing failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base="${1:-http://127.0.0.1:8080}"
examples="${2:-25}"
dest=.cache/schemathesis
if [[ ! -d "$dest/schemathesis" ]]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts \
    --target "$dest" 'schemathesis>=4,<5'
fi
PYTHONPATH="$dest" python3 -m schemathesis.cli run "$base/openapi.json" \
  --checks all --max-examples "$examples" --request-timeout 60 --no-color
