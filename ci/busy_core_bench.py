#!/usr/bin/env python3
"""A busy neighbour (issue 48): one nice-0 process burning one core beside the server. For
orchestratord (and llama-server when its binary is given), in one run, quiet and busy in
alternating pairs:
- time from the server's start to ready (`/readyz` 200 for orchestratord, `/health` 200 for
  llama-server) and to its first answer;
- single-stream decode tokens/s (a streamed greedy chat of `--tokens` tokens: tokens after the
  first over the time they took) and the inter-token gap p95.
Each figure busy is reported beside its quiet twin, as a ratio; the other processes' CPU
during each run is recorded (a noisy run shows there).

    python3 ci/busy_core_bench.py --orchd target/release/orchestratord \\
        --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf [--llama-server PATH] \\
        [--pairs 3] [--tokens 128] [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_servers  # noqa: E402

BURN = "while True:\n    pass\n"


def cpu_ticks():
    """(all processes' busy ticks, per pid) from /proc."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(pid)] = int(fields[11]) + int(fields[12])
        except OSError:
            continue
    return out


def wait_ready(base, proc, path, limit=600):
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + path, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{base} not ready after {limit} s")


def start(kind, binary, model, threads, slots, ctx):
    port = bench_servers.free_port()
    base = f"http://127.0.0.1:{port}"
    if kind == "orchd":
        cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        cfg.write(f'bind = "127.0.0.1:{port}"\n[[pools]]\nid = "default"\nmodel = "{model}"\n'
                  f'alias = "{bench_servers.MODEL}"\nslots = {slots}\nctx = {ctx}\n'
                  f'threads = {threads}\n')
        cfg.close()
        env = dict(os.environ, ORCHD_RECORDS_PATH=cfg.name[:-5] + ".records.sqlite3")
        t0 = time.time()
        proc = subprocess.Popen([binary, "--config", cfg.name], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(base, proc, "/readyz")
    else:
        t0 = time.time()
        proc = subprocess.Popen(
            [binary, "-m", model, "-np", str(slots), "-cb", "-c", str(ctx * slots),
             "-t", str(threads), "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(base, proc, "/health")
    return proc, base, time.time() - t0


def stream_chat(base, tokens, prompt="Write a long story about a dragon and a knight."):
    body = {"model": bench_servers.MODEL, "max_tokens": tokens, "temperature": 0,
            "stream": True, "messages": [{"role": "user", "content": prompt}]}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.time()
    at = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            ch = chunk.get("choices") or []
            if ch and (ch[0].get("delta") or {}).get("content"):
                at.append(time.time())
    if len(at) < 3:
        return None
    gaps = sorted(b - a for a, b in zip(at, at[1:]))
    return {"ttft_s": at[0] - t0, "tok_s": (len(at) - 1) / (at[-1] - at[0]),
            "gap_p95_ms": 1000 * gaps[int(0.95 * (len(gaps) - 1))], "tokens": len(at)}


def one_run(kind, binary, a, busy):
    burner = None
    if busy:
        burner = subprocess.Popen([sys.executable, "-c", BURN])
        time.sleep(0.5)
    before = cpu_ticks()
    proc = None
    try:
        proc, base, ready_s = start(kind, binary, a.model, a.threads, a.slots, a.ctx)
        first = stream_chat(base, 8)
        runs = [stream_chat(base, a.tokens) for _ in range(2)]
        runs = [r for r in runs if r]
        after = cpu_ticks()
        hz = os.sysconf("SC_CLK_TCK")
        mine = {proc.pid, os.getpid()} | ({burner.pid} if burner else set())
        others = sum(after[p] - before.get(p, 0) for p in after if p not in mine) / hz
        return {
            "ready_s": round(ready_s, 2),
            "first_answer_ttft_s": round(first["ttft_s"], 3) if first else None,
            "tok_s": round(statistics.median(r["tok_s"] for r in runs), 1) if runs else None,
            "gap_p95_ms": round(statistics.median(r["gap_p95_ms"] for r in runs), 1)
            if runs else None,
            "other_cpu_s": round(others, 1),
        }
    finally:
        if proc is not None:
            bench_servers.stop(proc)
        if burner is not None:
            burner.kill()
            burner.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orchd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-server")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--json")
    a = ap.parse_args()
    servers = [("orchd", a.orchd)] + ([("llama", a.llama_server)] if a.llama_server else [])
    rows = {k: {"quiet": [], "busy": []} for k, _ in servers}
    for i in range(a.pairs):
        for kind, binary in servers:
            # alternate which of the pair goes first
            order = [False, True] if i % 2 == 0 else [True, False]
            for busy in order:
                r = one_run(kind, binary, a, busy)
                rows[kind]["busy" if busy else "quiet"].append(r)
                print(f"{kind} pair {i} {'busy' if busy else 'quiet'}: {r}", flush=True)
    out = {}
    for kind, _ in servers:
        med = {}
        for cond in ("quiet", "busy"):
            rs = rows[kind][cond]
            med[cond] = {k: statistics.median(r[k] for r in rs if r[k] is not None)
                         for k in ("ready_s", "tok_s", "gap_p95_ms")}
        ratios = [b["tok_s"] / q["tok_s"] for q, b in zip(rows[kind]["quiet"], rows[kind]["busy"])
                  if q["tok_s"] and b["tok_s"]]
        med["busy_over_quiet_tok_s"] = round(statistics.median(ratios), 3) if ratios else None
        out[kind] = med | {"runs": rows[kind]}
        print(f"{kind}: quiet {med['quiet']} busy {med['busy']} "
              f"decode busy/quiet {med['busy_over_quiet_tok_s']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
