#!/usr/bin/env python3
"""Resident memory with and without reloads: the same mixed load (4 clients, chats with prompts
of 50 to 6,000 words, seeded) against a fresh server twice, one after the other — once with a
reload of the pool every `--reload-every` seconds, once without — sampling the server's resident
memory every second. Reports the median and maximum after the first minute of each run, and
their ratio (issue 32: within 10 %). Only the standard library is used.

    python3 ci/reload_memory.py --orchd target/release/orchestratord \\
        --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf [--minutes 5] \\
        [--reload-every 60] [--json out.json]
"""
import argparse
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

WORDS = "the quick brown fox jumps over a lazy dog while rivers run to distant seas".split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port, method, path, body=None, timeout=300):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"content-type": "application/json"} if body is not None else {})
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run(args, reload_every):
    port = free_port()
    scratch = tempfile.mkdtemp(prefix="orchd-reload-memory-")
    env = dict(os.environ, ORCHD_RECORDS_PATH=os.path.join(scratch, "r.sqlite3"), RUST_LOG="warn")
    proc = subprocess.Popen([args.orchd, "--bind", f"127.0.0.1:{port}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until = time.time() + 120
        while True:
            try:
                if call(port, "GET", "/readyz", timeout=2) == 200:
                    break
            except OSError:
                pass
            if time.time() > until:
                sys.exit("the server did not become ready")
            time.sleep(0.2)
        stop = time.time() + args.minutes * 60
        samples, reloads = [], []

        def client(i):
            rnd = random.Random(1000 + i)
            while time.time() < stop:
                n = rnd.choice([50, 400, 1500, 3000, 6000])
                body = {"messages": [{"role": "user",
                                      "content": " ".join(rnd.choice(WORDS) for _ in range(n))}],
                        "max_tokens": rnd.choice([8, 32, 128])}
                try:
                    call(port, "POST", "/v1/chat/completions", body)
                except OSError:
                    pass

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        started = time.time()
        next_reload = started + reload_every if reload_every else None
        while time.time() < stop:
            samples.append((time.time() - started, rss_mb(proc.pid)))
            if next_reload and time.time() >= next_reload:
                reloads.append(call(port, "POST", "/v1/pools/default/reload",
                                    {"new_model_ref": os.path.abspath(args.model)}))
                next_reload = time.time() + reload_every
            time.sleep(1)
        for t in threads:
            t.join()
    finally:
        proc.terminate()
        proc.wait()
    settled = [mb for t, mb in samples if t >= 60] or [mb for _, mb in samples]
    return {"reload_every_s": reload_every, "reloads": reloads,
            "rss_median_mb": round(statistics.median(settled)),
            "rss_max_mb": round(max(settled)), "samples": len(samples)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orchd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--reload-every", type=float, default=60)
    ap.add_argument("--json")
    args = ap.parse_args()
    without = run(args, 0)
    print(json.dumps(without), flush=True)
    with_reloads = run(args, args.reload_every)
    print(json.dumps(with_reloads), flush=True)
    ratio = with_reloads["rss_median_mb"] / without["rss_median_mb"]
    ok = all(s == 200 for s in with_reloads["reloads"]) and ratio <= 1.10
    print(f"median resident memory after the first minute: {without['rss_median_mb']} MB without "
          f"reloads, {with_reloads['rss_median_mb']} MB with {len(with_reloads['reloads'])} "
          f"reloads (ratio {ratio:.3f}; max {without['rss_max_mb']} / "
          f"{with_reloads['rss_max_mb']} MB): {'within' if ok else 'NOT within'} 10 %")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"without": without, "with_reloads": with_reloads, "ratio": ratio}, f)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
