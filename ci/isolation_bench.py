#!/usr/bin/env python3
"""Isolation, as an attacker and a busy user would try it (issue 48): while one tenant's noisy
load runs, another tenant ("victim") sends short chats one at a time; what it sees is compared
with what it saw on the quiet server, in the same run.

Scenarios (each runs `--seconds` with `--noisy` loops of the noisy tenant, then the server
settles before the next):
- `tokenize`: `POST /tokenize` with ~1 MB of text in a loop;
- `oversized`: a ~960 KB chat (larger than the context: 400) in a loop;
- `regex`: chats whose `response_format` is a schema with a costly regular expression;
- `schemas`: 20 chats at once, each with a JSON schema of its own, again and again.

For each: the victim's median and p95 latency (request sent to answer read), as a ratio to
its quiet median, how many of its chats were refused, and the noisy tenant's statuses.

    python3 ci/isolation_bench.py --orchd target/release/orchestratord \\
        --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf [--seconds 20] [--noisy 4] \\
        [--scenarios tokenize,oversized,regex,schemas] [--json out.json]
"""
import argparse
import collections
import json
import os
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_servers  # noqa: E402

VICTIM = "victim-key-0123456789abcdef0123456789"
NOISY = "noisy-key-0123456789abcdef0123456789"
KEYS = f'keys = ["victim:data:{VICTIM}", "noisy:data:{NOISY}"]'


def post(base, path, body, key, timeout=120):
    data = json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="POST", headers={
        "content-type": "application/json", "authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return 0, str(e).encode()


def victim_chat(base):
    body = {"model": bench_servers.MODEL, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Name a colour."}]}
    t0 = time.perf_counter()
    status, _ = post(base, "/v1/chat/completions", body, VICTIM)
    return status, time.perf_counter() - t0


def victim_series(base, seconds, stop=None):
    """Chats one after another for `seconds` (or until `stop` is set): (latencies of 200s,
    statuses)."""
    lat, statuses = [], collections.Counter()
    end = time.time() + seconds
    while time.time() < end and not (stop and stop.is_set()):
        status, took = victim_chat(base)
        statuses[status] += 1
        if status == 200:
            lat.append(took)
        time.sleep(0.05)
    return lat, statuses


BIG_TEXT = ("The quick brown fox jumps over the lazy dog near the river bank. " * 15000)[:1_000_000]
OVERSIZED = ("lorem ipsum dolor sit amet " * 40000)[:960_000]


def noisy_tokenize(i, n):
    return "/tokenize", {"model": bench_servers.MODEL, "content": BIG_TEXT}


def noisy_oversized(i, n):
    return "/v1/chat/completions", {"model": bench_servers.MODEL, "max_tokens": 8,
                                    "messages": [{"role": "user", "content": OVERSIZED}]}


def noisy_regex(i, n):
    # a different repetition count each time: no compiled grammar to reuse
    pattern = "^((a{100}){100}){%d}$" % (2 + n % 50)
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}},
              "required": ["s"]}
    return "/v1/chat/completions", {
        "model": bench_servers.MODEL, "max_tokens": 8,
        "messages": [{"role": "user", "content": "Say a word."}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "r", "schema": schema}}}


def noisy_schema(i, n):
    # 20 distinct schemas in flight: each request's own property names
    props = {f"f{i}_{n}_{k}": {"type": "integer"} for k in range(4)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    # short answers: what is measured is the schemas' compiles, not the slots the chats share
    return "/v1/chat/completions", {
        "model": bench_servers.MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": "Give the numbers."}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": f"s{i}", "schema": schema}}}


def noisy_plain(i, n):
    # the same load without schemas: what sharing the slots alone costs
    return "/v1/chat/completions", {
        "model": bench_servers.MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": "Give the numbers."}]}


SCENARIOS = {
    "tokenize": (noisy_tokenize, 4),
    "oversized": (noisy_oversized, 4),
    "regex": (noisy_regex, 2),
    "schemas": (noisy_schema, 20),
    "plain": (noisy_plain, 20),
}


def noisy_loop(base, make, i, stop, statuses, bodies):
    n = 0
    while not stop.is_set():
        path, body = make(i, n)
        status, text = post(base, path, body, NOISY)
        statuses[status] += 1
        if status >= 500 or status == 0:
            bodies.append(text[:300].decode(errors="replace"))
        n += 1
        if status == 429:
            time.sleep(0.2)


def run_scenario(base, name, seconds, loops):
    make, default_loops = SCENARIOS[name]
    loops = loops or default_loops
    stop = threading.Event()
    statuses, bodies = collections.Counter(), []
    threads = [threading.Thread(target=noisy_loop, args=(base, make, i, stop, statuses, bodies),
                                daemon=True) for i in range(loops)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the load is under way
    lat, vstatus = victim_series(base, seconds)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    return lat, vstatus, statuses, bodies


def summary(lat):
    if not lat:
        return {"n": 0}
    s = sorted(lat)
    return {"n": len(s), "median_s": round(statistics.median(s), 4),
            "p95_s": round(s[min(len(s) - 1, int(0.95 * len(s)))], 4),
            "max_s": round(s[-1], 4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orchd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--base-url", help="a running server with the keys above (no start)")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--noisy", type=int, default=0, help="noisy loops (default: per scenario)")
    ap.add_argument("--scenarios", default="tokenize,oversized,regex,schemas")
    ap.add_argument("--extra", default="", help="more top-level TOML for the server")
    ap.add_argument("--json")
    a = ap.parse_args()
    proc = None
    if a.base_url:
        base = a.base_url
    else:
        proc, base = bench_servers.start_orchd(
            a.orchd, a.model, a.slots, a.ctx, a.threads,
            extra=f"{a.extra}\n[auth]\n{KEYS}\n", ready_path="/readyz")
    out = {"scenarios": {}}
    try:
        victim_series(base, 3)  # warm: the pace is measured, the client's first costs paid
        quiet, qstatus = victim_series(base, a.seconds / 2)
        out["quiet"] = summary(quiet) | {"statuses": dict(qstatus)}
        print(f"quiet: {out['quiet']}", flush=True)
        qmed = out["quiet"].get("median_s") or 1e-9
        for name in a.scenarios.split(","):
            lat, vstatus, nstatus, bodies = run_scenario(base, name, a.seconds, a.noisy)
            s = summary(lat)
            row = s | {
                "ratio_median": round(s.get("median_s", 0) / qmed, 2),
                "ratio_p95": round(s.get("p95_s", 0) / qmed, 2),
                "victim_statuses": dict(vstatus),
                "noisy_statuses": dict(nstatus),
                "noisy_5xx_bodies": bodies[:3],
            }
            out["scenarios"][name] = row
            print(f"{name}: {row}", flush=True)
            time.sleep(3)
    finally:
        if proc is not None:
            bench_servers.stop(proc)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
