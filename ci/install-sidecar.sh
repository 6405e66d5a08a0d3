#!/usr/bin/env bash
# Installs the Hyperswarm sidecar's npm packages from its lockfile (npm ci). Idempotent: does
# nothing when node_modules matches the lockfile already.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../orchestratord/hyperswarm-sidecar"
stamp=node_modules/.lock-stamp
if [[ -f "$stamp" ]] && cmp -s "$stamp" package-lock.json; then
  echo "sidecar npm packages cached"
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
cp package-lock.json "$stamp"
echo "sidecar npm packages installed"
