#!/usr/bin/env bash
# Installs the Debian packages the tests drive: `chromium-headless-shell` (the EventSource test,
# tests/browser_eventsource.rs) and `prometheus` for its `promtool` (tests/metrics_hygiene.rs).
# About 20 s with apt. Idempotent: does nothing when both are already there.
set -euo pipefail
need=()
if [[ -z "${CHROMIUM:-}" ]] && ! command -v chromium-headless-shell >/dev/null \
  && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  need+=(chromium-headless-shell)
fi
if [[ -z "${PROMTOOL:-}" ]] && ! command -v promtool >/dev/null; then
  need+=(prometheus)
fi
if [[ ${#need[@]} -eq 0 ]]; then
  echo "chromium and promtool present"
  exit 0
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null || { echo "install ${need[*]} (needs root)" >&2; exit 1; }
  sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "installed ${need[*]}"
