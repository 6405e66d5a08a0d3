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
# fixtures for the operations on one id (ci/schemathesis.toml): a finished task in a session
# and a posted artifact, made with the same headers (keys) the run is given
hdr=()
for ((i = 1; i <= $#; i++)); do
  if [[ "${!i}" == -H ]]; then j=$((i + 1)); hdr+=(-H "${!j}"); fi
done
export ORCHD_ST_SESSION_ID="st-session-$$"
export ORCHD_ST_TASK_ID="st-task-$$"
curl -fsS "${hdr[@]}" -H 'content-type: application/json' -X POST "$base/v1/tasks" \
  -d "{\"prompt\":\"hi\",\"max_tokens\":2,\"task_id\":\"$ORCHD_ST_TASK_ID\",\"session_id\":\"$ORCHD_ST_SESSION_ID\"}" >/dev/null
curl -fsSN "${hdr[@]}" "$base/v1/tasks/$ORCHD_ST_TASK_ID/stream" >/dev/null
ORCHD_ST_ARTIFACT_ID=$(curl -fsS "${hdr[@]}" -H 'content-type: application/json' -X POST "$base/v1/artifacts" \
  -d '{"kind":"plan","content":{"steps":["read","write"]},"tags":["schemathesis"]}' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
export ORCHD_ST_ARTIFACT_ID
PYTHONPATH="$dest" python3 -m schemathesis.cli --config-file ci/schemathesis.toml run "$base/openapi.json" \
  --checks all --max-examples "$examples" --request-timeout 60 --no-color "$@"
