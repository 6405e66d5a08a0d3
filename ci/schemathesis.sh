#!/usr/bin/env bash
# Property-based API testing with schemathesis (from PyPI) against a running server's
# /openapi.json: every operation, every check (server errors, schema conformance, status codes,
# content types, stateful links) (response time aside: see
# ci/schemathesis.toml). Installs schemathesis into .cache/schemathesis once.
#   ci/schemathesis.sh [BASE_URL] [MAX_EXAMPLES] [SCHEMATHESIS ARGS…]
#     (default http://127.0.0.1:8080, 25; e.g. -H "Authorization: Bearer $KEY" for a keyed server)
# Start the server first (ci/serve.sh). Exit status is schemathesis's: 0 when nothing failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base="${1:-http://127.0.0.1:8080}"
examples="${2:-25}"
shift $(( $# < 2 ? $# : 2 ))
dest=.cache/schemathesis
if [[ ! -d "$dest/schemathesis" ]]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts \
    --target "$dest" 'schemathesis>=4,<5'
fi
PYTHONPATH="$dest" python3 -m schemathesis.cli --config-file ci/schemathesis.toml run "$base/openapi.json" \
  --checks all --max-examples "$examples" --request-timeout 60 --no-color "$@"
