"""Issue 54's table, side by side with llama.cpp's `llama-server` (ENG-PERF-3): for each GGUF,
PAIRS alternating pairs of the two servers (same slots, context and threads, one after the
other), each loaded with `orchd-load --concurrency 1 8 16` streaming chats, greedy; per level
the ratio of tokens/s (ours / theirs), and at 8 streams the ratio of TTFT p50 — the median of
the pairs' ratios. Beside them what the CPU did while each server was measured: the server's
own CPU seconds, everything else on the machine (the load generator included) over the same
wall time, and the time the hypervisor stole from the machine's cores, from /proc: a pair run
while something else was busy can be told apart.

  python3 ci/speed_table.py --orchd target/release/orchestratord \
      --llama-server /path/to/llama-server --load target/release/orchd-load \
      --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf [--model ...] [--pairs 2]

Prints a Markdown table, then the pairs as JSON. Not run by CI (it needs llama-server, and its
figures are the machine's); the numbers go into the issue's notes and ENG-PERF-3."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_servers as bs  # noqa: E402

LEVELS = [1, 8, 16]


def machine_cpu():
    """CPU seconds so far: what every core ran (user, nice, system, interrupts), and what the
    hypervisor took from this machine's cores (steal: a noisy host shows there)."""
    with open("/proc/stat") as f:
        u, n, s, _idle, _io, irq, soft, steal = (int(x) for x in f.readline().split()[1:9])
    tick = os.sysconf("SC_CLK_TCK")
    return (u + n + s + irq + soft) / tick, steal / tick


def measure(load, proc, base, requests, max_tokens):
    """One server under orchd-load: the levels' reports and the CPU around them."""
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    out.close()
    c0, (m0, s0), t0 = bs.cpu_of(proc.pid), machine_cpu(), time.time()
    subprocess.run([load, "--base-url", base, "--model", bs.MODEL,
                    "--concurrency", *map(str, LEVELS), "-n", str(requests),
                    "--max-tokens", str(max_tokens), "--json", out.name],
                   check=True, stdout=subprocess.DEVNULL)
    (m1, s1), server, wall = machine_cpu(), bs.cpu_of(proc.pid) - c0, time.time() - t0
    machine, steal = m1 - m0, s1 - s0
    with open(out.name) as f:
        levels = {r["concurrency"]: r for r in json.load(f)}
    os.unlink(out.name)
    for c, r in levels.items():
        if r["completed"] != r["requests"]:
            raise SystemExit(f"{base}: {r['requests'] - r['completed']} of {r['requests']} "
                             f"requests failed at concurrency {c}: {r['errors']}")
    return {
        "tok_s": {c: levels[c]["tokens_per_s"] for c in LEVELS},
        "ttft_p50_ms_at_8": levels[8]["ttft_p50_ms"],
        "wall_s": round(wall, 1),
        "server_cpu_s": round(server, 1),
        "other_cpu_s": round(machine - server, 1),
        "steal_s": round(steal, 1),
    }


def one_model(a, model):
    pairs = []
    for i in range(a.pairs):
        order = ["orchd", "llama"] if i % 2 == 0 else ["llama", "orchd"]
        got = {}
        for who in order:
            if who == "orchd":
                proc, base = bs.start_orchd(a.orchd, model, a.slots, a.ctx, a.threads)
            else:
                proc, base = bs.start_llama(a.llama_server, model, a.slots, a.ctx, a.threads)
            try:
                got[who] = measure(a.load, proc, base, a.requests, a.max_tokens)
            finally:
                bs.stop(proc)
            print(f"{os.path.basename(model)} pair {i + 1} {who}: {got[who]}", file=sys.stderr)
        pairs.append(got)
    return pairs


def ratios(pairs, f):
    return [f(p["orchd"]) / f(p["llama"]) for p in pairs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orchd", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--load", required=True, help="the orchd-load binary")
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot")
    ap.add_argument("--requests", type=int, default=16, help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    rows, raw = [], {}
    for model in a.model:
        pairs = one_model(a, model)
        raw[os.path.basename(model)] = pairs
        cells = []
        for c in LEVELS:
            r = ratios(pairs, lambda s, c=c: s["tok_s"][c])
            cells.append(f"{statistics.median(r):.2f}x ({' / '.join(f'{x:.2f}' for x in r)})")
        ttft = ratios(pairs, lambda s: s["ttft_p50_ms_at_8"])
        cells.append(f"{statistics.median(ttft):.2f}x")
        cpu = lambda who, k: statistics.median(p[who][k] for p in pairs)  # noqa: E731
        cells.append(f"{cpu('orchd', 'server_cpu_s'):.0f} / {cpu('llama', 'server_cpu_s'):.0f} s")
        cells.append(f"{cpu('orchd', 'other_cpu_s'):.1f} / {cpu('llama', 'other_cpu_s'):.1f} s")
        cells.append(f"{cpu('orchd', 'steal_s'):.1f} / {cpu('llama', 'steal_s'):.1f} s")
        rows.append(f"| {os.path.basename(model)} | " + " | ".join(cells) + " |")
    print("| model | 1 stream | 8 streams | 16 streams | TTFT p50 at 8 | server CPU (ours / theirs) "
          "| other processes' CPU meanwhile | stolen by the host |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
