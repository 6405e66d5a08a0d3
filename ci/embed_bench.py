#!/usr/bin/env python3
"""Embeddings side by side (issue 51's benchmark): this server against llama.cpp's
`llama-server --embedding` on the same GGUF, threads and slots, one after the other in
alternating pairs; medians of the pairs' ratios.

    python3 ci/embed_bench.py --orchd target/release/orchestratord --llama-server BIN \\
        --model .cache/models/all-MiniLM-L6-v2.F16.gguf [--pairs 3] [--threads 2]

Per server and pair: inputs/s of 32 inputs in one `/v1/embeddings` request, and of 32
concurrent single-input requests, on 32 texts of 6 to 120 words (RAG-sized chunks); and on 32
short queries (3 to 10 words) in one request against the same 32 sent one after another (what
batching buys where a pass of one input is short), and the 32 chunks sent one after another
(where a pass is long already). CPU seconds of each server's process over each measurement
too.
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request

import bench_servers as bs

WORDS = ["the", "sea", "under", "a", "quiet", "moon", "carries", "old", "ships", "home",
         "while", "gulls", "circle", "over", "harbour", "walls", "and", "tides", "turn"]


def texts(n=32):
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(6 + (i * 37) % 115))
            for i in range(n)]


def queries(n=32):
    return [" ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(3 + (i * 3) % 8))
            for i in range(n)]


def post(base, body):
    req = urllib.request.Request(base + "/v1/embeddings", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    assert len(out["data"]) == len(body["input"]) if isinstance(body["input"], list) else 1, out
    return out


def one_request(base, inputs):
    t = time.time()
    post(base, {"model": bs.MODEL, "input": inputs})
    return len(inputs) / (time.time() - t)


def concurrent(base, inputs):
    errors = []

    def one(x):
        try:
            post(base, {"model": bs.MODEL, "input": [x]})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(x,)) for x in inputs]
    t = time.time()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise SystemExit(f"concurrent requests failed: {errors[0]}")
    return len(inputs) / (time.time() - t)


def sequential(base, inputs):
    t = time.time()
    for x in inputs:
        post(base, {"model": bs.MODEL, "input": [x]})
    return len(inputs) / (time.time() - t)


def measure(name, proc, base, inputs):
    post(base, {"model": bs.MODEL, "input": inputs[:4]})  # warm
    out = {}
    short = queries()
    for what, f, xs in [("one_request", one_request, inputs), ("concurrent", concurrent, inputs),
                        ("sequential", sequential, inputs),
                        ("short_one_request", one_request, short),
                        ("short_sequential", sequential, short)]:
        c0 = bs.cpu_of(proc.pid)
        rate = statistics.median(f(base, xs) for _ in range(3))
        out[what] = rate
        out[what + "_cpu_s"] = round(bs.cpu_of(proc.pid) - c0, 2)
    print(name, {k: round(v, 1) for k, v in out.items()}, flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orchd", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=8)
    a = ap.parse_args()
    inputs = texts()
    pairs = []
    for i in range(a.pairs):
        order = ["orchd", "llama"] if i % 2 == 0 else ["llama", "orchd"]
        got = {}
        for who in order:
            if who == "orchd":
                proc, base = bs.start_orchd(a.orchd, a.model, a.slots, 512, a.threads)
            else:
                proc, base = bs.start_llama(a.llama_server, a.model, a.slots, 512, a.threads,
                                            ["--embedding", "-ub", "4096", "-b", "4096"])
            try:
                got[who] = measure(who, proc, base, inputs)
            finally:
                bs.stop(proc)
        pairs.append(got)
    med = lambda f: statistics.median(f(p) for p in pairs)  # noqa: E731
    print(json.dumps({
        "one_request_ratio": round(med(lambda p: p["orchd"]["one_request"] / p["llama"]["one_request"]), 2),
        "concurrent_ratio": round(med(lambda p: p["orchd"]["concurrent"] / p["llama"]["concurrent"]), 2),
        # one query at a time: a search's latency
        "short_sequential_ratio": round(med(lambda p: p["orchd"]["short_sequential"] / p["llama"]["short_sequential"]), 2),
        "batched_over_sequential": {
            who: round(med(lambda p: p[who]["one_request"] / p[who]["sequential"]), 2)
            for who in ["orchd", "llama"]},
        "short_batched_over_sequential": {
            who: round(med(lambda p: p[who]["short_one_request"] / p[who]["short_sequential"]), 2)
            for who in ["orchd", "llama"]},
        "pairs": pairs,
    }, indent=1))


if __name__ == "__main__":
    main()
