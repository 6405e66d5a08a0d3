#!/usr/bin/env bash
# Installs the Python packages the tests drive the server with (ci/requirements-sdk.txt) into
# .cache/pydeps with `pip --target`, so no virtualenv is needed. Idempotent: a second run with
# the same requirements does nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest=.cache/pydeps
stamp="$dest/.requirements"
if [[ -f "$stamp" ]] && cmp -s "$stamp" ci/requirements-sdk.txt; then
  echo "python test deps cached in $dest"
  exit 0
fi
rm -rf "$dest"
mkdir -p "$dest"
python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts \
  --target "$dest" -r ci/requirements-sdk.txt
cp ci/requirements-sdk.txt "$stamp"
echo "python test deps installed in $dest"
