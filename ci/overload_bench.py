#!/usr/bin/env python3
"""Overload goodput, side by side: N clients at once, each the official `openai` SDK with its
own timeout and default retries, streaming a chat of M tokens, against orchestratord and
(when its binary is given) llama.cpp's `llama-server -np 8 -cb` on the same GGUF and threads.
The servers run one after the other, never together, each started and stopped here.

For each server it reports: requests completed (stream ended normally within the client's
timeout), of those how many completed only after the SDK had timed out an attempt (a 15 s
wait for nothing before its retry: within the client's deadline are the others), client-side
timeouts, refusals (an error status the SDK gave up on after its
retries) and the latency of every refusal the SDK saw (retried ones included), tokens
delivered, and the server's CPU time burnt after the last client had gone. The clients run
in `--procs` processes (default 8), all sent off at one moment: one Python event loop
serving 64 SDK clients adds ~75 ms of its own to every response of a burst (measured against
a server that answers 429 at once: p50 76 ms from one process, 24 ms from eight). Then a walk-away:
8 streams read a few chunks and all leave at once; the server's CPU time after that and how
long it took to fall idle. For orchestratord, the median start-prediction error (/metrics).

Refusal latency is read twice: by the SDK clients' own HTTP hooks (request handed to httpx to
response headers parsed: the clients' event loops and first-use costs included, which on a
machine whose cores they share with the server are most of it), and, as root with `tcpdump`
installed, at the clients' sockets (wire_latency.py: a request's last packet to its answer's
first), what a client on a machine of its own would see. `--warm-sdk` pays the SDK's first-use
costs in each client process before the burst (a one-token chat each: a pool filled with
one-token tasks before a burst, the case that once made the pace 5-10x too slow).

    PYTHONPATH=.cache/pydeps python3 ci/overload_bench.py \\
        --orchd target/release/orchestratord --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        [--llama-server /path/to/llama-server] [--clients 64] [--timeout 15] [--max-tokens 128] \\
        [--procs 8] [--json out.json] [--quick]

`--quick` is the short version (16 clients, 32 tokens, timeout 8 s) that the test
`orchestratord/tests/overload_sdk.rs` runs against an already started server (`--base-url`).
"""
import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import statistics
import sys
import time
import urllib.request

import httpx2 as httpx
import openai

import bench_servers
from wire_latency import WireCapture

TOPICS = [
    "the sea", "a lighthouse", "a fox", "autumn", "a train journey", "the moon", "bread",
    "a violin", "snow", "a market", "bees", "a library", "rain", "a bridge", "tea", "clocks",
]


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def sdk_client(i, base, args, seen):
    """Client `i`'s SDK client (its own connection pool), with hooks that time each response.
    Made before the burst: 64 clients are 64 processes in life, and constructing them inside
    the burst put tens of milliseconds of this one event loop's work between every response
    and its hook."""
    attempts = {"sent": 0, "refused": 0}

    async def on_request(request):
        request.extensions["sent_at"] = time.perf_counter()
        if seen.get("burst"):
            attempts["sent"] += 1

    async def on_response(response):
        sent = response.request.extensions.get("sent_at")
        if not seen.get("burst"):
            return  # the warm-up before the burst
        if response.status_code >= 400:
            attempts["refused"] += 1
        if seen.get("trace") is not None and sent is not None:
            seen["trace"].append({
                "client": i, "sent_s": round(sent - seen["t0"], 3),
                "ms": round((time.perf_counter() - sent) * 1000, 1),
                "status": response.status_code,
                "retry": response.request.headers.get("x-stainless-retry-count"),
                "retry_after_ms": response.headers.get("retry-after-ms"),
            })
        if response.status_code >= 400 and sent is not None:
            seen["refusal_ms"].append((time.perf_counter() - sent) * 1000)
            seen["refusal_status"][response.status_code] = (
                seen["refusal_status"].get(response.status_code, 0) + 1
            )

    http = httpx.AsyncClient(event_hooks={"request": [on_request], "response": [on_response]})
    client = openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key="unused", timeout=args.timeout, http_client=http
    )
    return http, client, attempts


async def one_client(i, model, args, made):
    """One client: a streamed chat through the SDK with its timeout and default retries."""
    http, client, attempts = made
    topic = TOPICS[i % len(TOPICS)]
    messages = [{"role": "user", "content": f"Client {i}: write a long story about {topic}."}]
    tokens = 0
    started = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=args.max_tokens, stream=True,
            temperature=0.7, seed=i,
        )
        finished = None
        async for chunk in stream:
            if chunk.choices:
                if chunk.choices[0].delta.content:
                    tokens += 1
                if chunk.choices[0].finish_reason:
                    finished = chunk.choices[0].finish_reason
        outcome = "completed" if finished else "truncated"
    except (openai.APITimeoutError, httpx.TimeoutException):
        outcome = "timeout"
    except openai.APIStatusError as e:
        outcome = f"refused {e.status_code}"
    except openai.APIConnectionError as e:
        outcome = f"connection error {type(e.__cause__).__name__ if e.__cause__ else ''}"
    except openai.APIError as e:
        outcome = f"error {e}"
    finally:
        await http.aclose()
    # attempts before the last that were not refused: the SDK timed out on them (a server
    # may send a stream's headers before its first token) and tried again
    return {"outcome": outcome, "tokens": tokens, "seconds": time.perf_counter() - started,
            "timed_out_attempts": max(0, attempts["sent"] - 1 - attempts["refused"])}


async def warm_sdk(base, model):
    """One streamed chat of one token through a throwaway client of this process, before the
    burst: the first request a Python process makes through the SDK costs ~65 ms of CPU before
    it is sent and ~30 ms more in httpx before its response is read (lazy imports and schema
    building; measured against a server that answers 429 at once: 2.6 ms and 2.9 ms from the
    second request on). In a cold burst those are 8 processes' worth of the clients' own CPU on
    the cores the server answers from, and the first client of each process carries them in its
    refusal latency. The burst's clients stay fresh: their own connections, no request before."""
    http = httpx.AsyncClient()
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", timeout=120,
                                http_client=http)
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1, stream=True
        )
        async for _ in stream:
            pass
    finally:
        await http.aclose()


async def share(base, model, args, indices, start_at):
    """The clients `indices`, made first, all sent off at the wall-clock moment `start_at`."""
    seen = {"refusal_ms": [], "refusal_status": {}, "t0": time.perf_counter(),
            "trace": [] if args.trace else None}
    made = [sdk_client(i, base, args, seen) for i in indices]
    if args.warm_sdk:
        await warm_sdk(base, model)
    if args.warm:
        # each client's connection opened and its SDK's request path run once (a model list)
        # before the burst, as in a client process that has talked to the server before
        await asyncio.gather(*[client.models.list() for _, client, _ in made])
    seen["late_s"] = max(0.0, time.time() - start_at)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    seen["t0"] = time.perf_counter()
    seen["burst"] = True
    results = await asyncio.gather(
        *[one_client(i, model, args, m) for i, m in zip(indices, made)]
    )
    return results, seen


def run_share(base, model, args, indices, start_at):
    return asyncio.run(share(base, model, args, indices, start_at))


def scenario(base, model, args):
    """All the clients, spread over `args.procs` processes (one event loop serving 64 SDK
    clients adds its own ~75 ms to every response of a burst: measured against a server that
    answers 429 at once), started together."""
    procs = max(1, min(args.procs, args.clients))
    shares = [list(range(p, args.clients, procs)) for p in range(procs)]
    # time for every process to make its clients (and warm its SDK) first: a process that
    # reaches the moment late spreads the burst (`clients_late_s` says by how much)
    start_at = time.time() + 3.0 + 0.05 * args.clients / procs
    if procs == 1:
        return run_share(base, model, args, shares[0], start_at)
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        parts = [pool.submit(run_share, base, model, args, s, start_at) for s in shares]
        parts = [f.result() for f in parts]
    results = [r for part, _ in parts for r in part]
    seen = {"refusal_ms": [], "refusal_status": {}, "trace": [] if args.trace else None,
            "late_s": max(part["late_s"] for _, part in parts)}
    for _, part in parts:
        seen["refusal_ms"] += part["refusal_ms"]
        for status, n in part["refusal_status"].items():
            seen["refusal_status"][status] = seen["refusal_status"].get(status, 0) + n
        if args.trace:
            seen["trace"] += part["trace"]
    return results, seen


def idle_after(pid, since_cpu, limit=30.0, quiet=1.0):
    """CPU seconds the server burns from now until it has been idle for `quiet` seconds."""
    start = time.time()
    last = cpu_seconds(pid)
    quiet_since = time.time()
    while time.time() - start < limit:
        time.sleep(0.1)
        now = cpu_seconds(pid)
        if now - last > 0.02:  # more than 20% of a core in the last 100 ms
            quiet_since = time.time()
        last = now
        if time.time() - quiet_since >= quiet:
            break
    return last - since_cpu


async def walk_away(base, model, n=8, max_tokens=512, read_chunks=5):
    """`n` streams start, each reads a few chunks, then every client leaves at once. Returns
    the moment the last one left."""
    async with httpx.AsyncClient(timeout=60) as http:
        async def one(i):
            body = {"model": model, "stream": True, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": f"Walker {i}: tell a long tale."}]}
            async with http.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
                got = 0
                async for _ in r.aiter_raw():
                    got += 1
                    if got >= read_chunks:
                        break
        await asyncio.gather(*[one(i) for i in range(n)])
    return time.perf_counter()


def cpu_until_idle(pid, left_at, limit=10.0):
    """Server CPU seconds from `left_at` until it is idle (under a tenth of a core for 200 ms),
    and how long that took."""
    start_cpu = cpu_seconds(pid)
    idle_since, last, t_idle = None, start_cpu, None
    while time.perf_counter() - left_at < limit:
        time.sleep(0.02)
        now = cpu_seconds(pid)
        busy = now - last > 0.002  # > 10% of a core over 20 ms (ticks are 10 ms)
        last = now
        if busy:
            idle_since = None
        elif idle_since is None:
            idle_since = time.perf_counter()
        elif time.perf_counter() - idle_since >= 0.2:
            t_idle = idle_since - left_at
            break
    return round(last - start_cpu, 3), (round(t_idle * 1000) if t_idle is not None else None)


def summarize(name, results, seen, burnt_after):
    outcomes = {}
    for r in results:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    ref = sorted(seen["refusal_ms"])
    return {
        "server": name,
        "clients": len(results),
        "completed": outcomes.get("completed", 0),
        "timeouts": outcomes.get("timeout", 0),
        # completed, but only after the SDK had timed out on an attempt (15 s spent for nothing)
        "completed_after_a_timeout": sum(
            1 for r in results if r["outcome"] == "completed" and r["timed_out_attempts"] > 0
        ),
        "refused": sum(v for k, v in outcomes.items() if k.startswith("refused")),
        "other": {k: v for k, v in outcomes.items()
                  if k not in ("completed", "timeout") and not k.startswith("refused")},
        "error_responses_seen": sum(seen["refusal_status"].values()),
        "error_statuses": seen["refusal_status"],
        **latency_summary("refusal_ms", ref),
        # refusals a client waited more than a second for: sent back from the queue, or a
        # last attempt queued until its time ran out
        "refusals_after_1s": sum(1 for r in ref if r > 1000),
        "tokens_delivered": sum(r["tokens"] for r in results),
        "server_cpu_s_after_last_client": round(burnt_after, 3),
        # how late the last client process reached the burst's start (0: all on time)
        "clients_late_s": round(seen.get("late_s", 0.0), 3),
    }


def latency_summary(prefix, ms):
    """p50 / p90 / max of sorted milliseconds, as `{prefix}_p50` ... (None when there are none)."""
    return {
        f"{prefix}_p50": round(statistics.median(ms), 1) if ms else None,
        f"{prefix}_p90": round(ms[int(0.9 * (len(ms) - 1))], 1) if ms else None,
        f"{prefix}_max": round(ms[-1], 1) if ms else None,
    }


def wire_summary(wire):
    """Refusal latency at the clients' sockets (wire_latency.py), when captured."""
    if wire is None:
        return {"wire_refusal_ms_p50": None}
    ms = sorted(m for status, m in wire if status >= 400)
    return {"wire_refusals": len(ms), **latency_summary("wire_refusal_ms", ms)}


def prediction_error(base):
    """orchestratord only: the median start-prediction error, as the histogram bucket it falls
    in (both directions together), and the number of starts measured."""
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    buckets = {}
    for line in text.splitlines():
        if line.startswith("orchd_start_prediction_error_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = buckets.get(le, 0) + float(line.rsplit(" ", 1)[1])
    if not buckets:
        return None
    ordered = sorted(buckets.items(), key=lambda kv: float(kv[0]))
    total = ordered[-1][1]
    for le, cum in ordered:
        if cum >= total / 2:
            return {"median_error_le_s": float(le), "starts": int(total)}
    return None


def run_against(name, base, pid, model, args):
    # warm up: one request, so nobody pays for first-use costs
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=120)
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    capture = WireCapture.start(int(base.rsplit(":", 1)[1])) if args.wire else None
    try:
        results, seen = scenario(base, model, args)
    finally:
        wire = capture.stop() if capture else None
    if args.trace:
        with open(args.trace, "a") as f:
            for line in seen["trace"]:
                f.write(json.dumps(dict(line, server=name)) + "\n")
    cpu_at_end = cpu_seconds(pid) if pid else 0.0
    burnt = idle_after(pid, cpu_at_end) if pid else 0.0
    row = summarize(name, results, seen, burnt)
    row.update(wire_summary(wire))
    row["start_prediction"] = prediction_error(base)
    if pid and not args.quick:
        left_at = asyncio.run(walk_away(base, model))
        cpu, ms_to_idle = cpu_until_idle(pid, left_at)
        row["walkaway_cpu_s"] = cpu
        row["walkaway_ms_to_idle"] = ms_to_idle
    return row


def start_orchd(args):
    proc, base = bench_servers.start_orchd(args.orchd, args.model, args.slots, 2048, args.threads)
    return proc, base, bench_servers.MODEL


def start_llama(args):
    proc, base = bench_servers.start_llama(args.llama_server, args.model, args.slots, 2048,
                                           args.threads)
    return proc, base, bench_servers.MODEL


def table(rows):
    head = ("| server | completed | client timeouts | refused (gave up) | error responses seen "
            "(retried included) | completed after a timed-out attempt | "
            "refusal latency p50 / p90 / max | at the socket | "
            "refusals after > 1 s | tokens delivered | server CPU after last client |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        p50 = ("-" if r["refusal_ms_p50"] is None else
               f'{r["refusal_ms_p50"]} / {r["refusal_ms_p90"]} / {r["refusal_ms_max"]} ms')
        wire = ("-" if r["wire_refusal_ms_p50"] is None else
                f'{r["wire_refusal_ms_p50"]} / {r["wire_refusal_ms_p90"]} / '
                f'{r["wire_refusal_ms_max"]} ms')
        lines.append(
            f'| {r["server"]} | {r["completed"]}/{r["clients"]} | {r["timeouts"]} | {r["refused"]} | '
            f'{r["error_responses_seen"]} {r["error_statuses"]} | '
            f'{r["completed_after_a_timeout"]} | {p50} | {wire} | '
            f'{r["refusals_after_1s"]} | {r["tokens_delivered"]} | '
            f'{r["server_cpu_s_after_last_client"]} s |'
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orchd", help="orchestratord binary (started here)")
    ap.add_argument("--base-url", help="an already running server to drive instead (no CPU figures)")
    ap.add_argument("--served-model", default="bench", help="model name with --base-url")
    ap.add_argument("--pid", type=int, help="with --base-url: the server's pid, for CPU figures")
    ap.add_argument("--llama-server", help="llama-server binary (the peer; skipped if absent)")
    ap.add_argument("--model", help="the GGUF both servers load")
    ap.add_argument("--clients", type=int, help="default 64 (--quick: 16)")
    ap.add_argument("--timeout", type=float, help="the SDK timeout, s; default 15 (--quick: 8)")
    ap.add_argument("--max-tokens", type=int, help="default 128 (--quick: 32)")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm", action="store_true",
                    help="each client opens its connection with a model list before the burst "
                         "(default: 64 fresh clients, the issue's scenario)")
    ap.add_argument("--warm-sdk", action="store_true",
                    help="each client process makes one streamed one-token chat through a "
                         "throwaway client before the burst (the SDK's first-use costs paid "
                         "before it; the burst's clients stay fresh)")
    ap.add_argument("--no-wire", dest="wire", action="store_false",
                    help="no packet capture (by default, as root with tcpdump installed, the "
                         "refusal latency is also read at the clients' sockets)")
    ap.add_argument("--procs", type=int, default=8,
                    help="client processes the clients are spread over (default 8)")
    ap.add_argument("--quick", action="store_true", help="16 clients, 32 tokens, timeout 8 s")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--trace", help="write every response the clients saw here (JSON lines: "
                    "client, sent at, ms, status, retry count, advised wait)")
    args = ap.parse_args()
    defaults = (16, 32, 8.0) if args.quick else (64, 128, 15.0)
    args.clients = args.clients or defaults[0]
    args.max_tokens = args.max_tokens or defaults[1]
    args.timeout = args.timeout or defaults[2]
    rows = []
    if args.base_url:
        rows.append(run_against("given", args.base_url.rstrip("/"), args.pid, args.served_model, args))
    servers = [("orchestratord", args.orchd, start_orchd),
               ("llama-server", args.llama_server, start_llama)]
    for name, binary, starter in servers:
        if not binary:
            continue
        proc, base, model = starter(args)
        try:
            rows.append(run_against(name, base, proc.pid, model, args))
        finally:
            bench_servers.stop(proc)
    print(table(rows))
    for r in rows:
        if "walkaway_cpu_s" in r:
            print(f'{r["server"]}: 8 streams left after 5 chunks: {r["walkaway_cpu_s"]} s CPU after, '
                  f'idle {r["walkaway_ms_to_idle"]} ms after the last left')
        if r.get("start_prediction"):
            print(f'{r["server"]}: start prediction error median <= {r["start_prediction"]["median_error_le_s"]} s '
                  f'over {r["start_prediction"]["starts"]} starts')
    print(json.dumps(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
