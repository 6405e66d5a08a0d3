#!/usr/bin/env bash
# Installs the headless browser the EventSource test drives (tests/browser_eventsource.rs):
# Debian's `chromium-headless-shell` (about 10 s with apt). Idempotent: does nothing when a
# Chromium is already on PATH or $CHROMIUM names one.
set -euo pipefail
if [[ -n "${CHROMIUM:-}" ]] || command -v chromium-headless-shell >/dev/null \
  || command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
  echo "chromium present"
  exit 0
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null || { echo "install chromium-headless-shell (needs root)" >&2; exit 1; }
  sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  chromium-headless-shell >/dev/null
echo "chromium-headless-shell installed"
