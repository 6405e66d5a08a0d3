#!/usr/bin/env python3
"""Fair share across tenants, on vs `fifo`, in the same run (issue 36, ORCH-FAIR-1..4).

orchestratord is started twice on the same GGUF, slots and threads — `queue.fairness =
"tenant"`, then `"fifo"` — each with three tenants' keys, and the same load is driven through
the task API (`POST /v1/tasks`, then its SSE stream):

- `flood`: `--flood` clients (default 24) in loops, each submitting a `--flood-tokens`-token
  task (default 64) as soon as its last one ended; on a 429 or a task sent back they wait as
  advised (as the SDKs do), at most `--max-backoff` (default 2 s);
- `steady`: `--steady` clients (default 4) in the same loops with 32-token tasks;
- `light`: one 8-token task a second, each on its own (it never waits for the last).

Before the load, the light tenant's tasks alone (10, one after the other) give its idle TTFT.
Reported per tenant and mode: TTFT p50/p95 (submit to first token, client-side), tasks done,
refusals (429) and tasks sent back (an `error` event), tokens served (the server's
`orchd_tenant_tokens_total`, prompt and generated); Jain's index over the tokens served to
the two backlogged tenants (flood, steady: equal weights, so 1.0 is an equal split); total
tokens/s served (prompt and generated, the unit fair share divides) and generated tokens/s
seen by the clients. `--runs N` repeats the pair (tenant, then fifo) N times and reports each
figure's median. Then the goals of the issue, checked on the medians: light p95 ≤ its idle
p95 + one flood task's service time (p50), 0 light refusals, Jain ≥ 0.95, tokens served per
second ≥ 0.95x fifo's (the tasks that run differ between the modes — under fifo the light
tenant's tasks are refused and the flood's long ones fill the slots — so generated tokens/s
compares different work and is reported beside it).

    PYTHONPATH=.cache/pydeps python3 ci/fairness_bench.py --orchd target/release/orchestratord \\
        --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf [--seconds 40] [--slots 2] \\
        [--queue 16] [--runs 3] [--json out.json] [--quick]

`--quick` (10 s a mode, 12 flood clients) is a smoke run; the figures of the closing note come
from the default.
"""
import argparse
import asyncio
import json
import os
import statistics
import sys
import time

import httpx

import bench_servers

TENANTS = ["flood", "steady", "light"]
MAX_BACKOFF_MS = 2000
LONG_ANSWER = "Count from one to one thousand: one, two,"


def key(tenant):
    return f"{tenant}-bench-key-0123456789abcdef"


class Tally:
    def __init__(self):
        self.ttft = []
        self.service = []
        self.done = 0
        self.refused = 0
        self.sent_back = 0
        self.tokens = 0


async def one_task(client, base, tenant, body, tally):
    """Runs one task to its end; returns the wait advised (ms) when refused or sent back."""
    headers = {"authorization": f"Bearer {key(tenant)}"}
    sent = time.perf_counter()
    r = await client.post(f"{base}/v1/tasks", json=body, headers=headers)
    if r.status_code == 429:
        tally.refused += 1
        return int(r.headers.get("retry-after-ms", "1000"))
    r.raise_for_status()
    task_id = r.json()["task_id"]
    first = None
    event = None
    async with client.stream("GET", f"{base}/v1/tasks/{task_id}/stream", headers=headers) as s:
        async for line in s.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                if event == "token":
                    if first is None:
                        first = time.perf_counter()
                    tally.tokens += 1
                elif event == "end":
                    end = time.perf_counter()
                    tally.done += 1
                    if first is not None:
                        tally.ttft.append((first - sent) * 1000)
                        tally.service.append((end - first) * 1000)
                    return None
                elif event == "error":
                    data = json.loads(line[5:])
                    tally.sent_back += 1
                    return int(data.get("retry_after_ms") or 1000)
    return None


async def loop_client(client, base, tenant, body, tally, stop_at):
    while time.perf_counter() < stop_at:
        wait = await one_task(client, base, tenant, body, tally)
        if wait is not None:
            await asyncio.sleep(min(wait, MAX_BACKOFF_MS) / 1000)


async def light_sender(client, base, tally, stop_at):
    body = {"prompt": "The capital of France is", "max_tokens": 8}
    pending = []
    while time.perf_counter() < stop_at:
        pending.append(asyncio.create_task(one_task(client, base, "light", body, tally)))
        await asyncio.sleep(1.0)
    await asyncio.gather(*pending)


async def tokens_served(client, base):
    r = await client.get(f"{base}/metrics", headers={"authorization": f"Bearer {key('flood')}"})
    out = {t: 0.0 for t in TENANTS}
    for line in r.text.splitlines():
        for t in TENANTS:
            if line.startswith(f'orchd_tenant_tokens_total{{tenant="{t}"}} '):
                out[t] = float(line.rsplit(" ", 1)[1])
    return out


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def jain(xs):
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else float("nan")


async def run_mode(base, args):
    limits = httpx.Limits(max_connections=args.flood + args.steady + 64)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        idle = Tally()
        for _ in range(10):
            await one_task(client, base, "light",
                           {"prompt": "The capital of France is", "max_tokens": 8}, idle)
        tallies = {t: Tally() for t in TENANTS}
        warm = 3.0
        stop_at = time.perf_counter() + warm + args.seconds
        jobs = [asyncio.create_task(loop_client(
            client, base, "flood", {"prompt": LONG_ANSWER, "max_tokens": args.flood_tokens},
            tallies["flood"], stop_at)) for _ in range(args.flood)]
        jobs += [asyncio.create_task(loop_client(
            client, base, "steady", {"prompt": LONG_ANSWER, "max_tokens": 32},
            tallies["steady"], stop_at)) for _ in range(args.steady)]
        await asyncio.sleep(warm)
        before = await tokens_served(client, base)
        out_before = sum(t.tokens for t in tallies.values())
        t0 = time.perf_counter()
        jobs.append(asyncio.create_task(light_sender(client, base, tallies["light"], stop_at)))
        await asyncio.sleep(args.seconds)
        after = await tokens_served(client, base)
        out_after = sum(t.tokens for t in tallies.values())
        elapsed = time.perf_counter() - t0
        await asyncio.gather(*jobs)
    served = {t: after[t] - before[t] for t in TENANTS}
    return {
        "idle_light_ttft_p95_ms": pct(idle.ttft, 0.95),
        "tenants": {t: {
            "ttft_p50_ms": pct(x.ttft, 0.5), "ttft_p95_ms": pct(x.ttft, 0.95),
            "done": x.done, "refused": x.refused, "sent_back": x.sent_back,
            "tokens_served": served[t],
            "service_p50_ms": pct(x.service, 0.5),
        } for t, x in tallies.items()},
        "jain_backlogged": jain([served["flood"], served["steady"]]),
        "served_per_s": sum(served.values()) / elapsed,
        "generated_per_s": (out_after - out_before) / elapsed,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orchd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--queue", type=int, default=16)
    ap.add_argument("--flood", type=int, default=24)
    ap.add_argument("--flood-tokens", type=int, default=64)
    ap.add_argument("--steady", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--max-backoff", type=float, default=2.0, help="s")
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.flood = 10, 12
    global MAX_BACKOFF_MS
    MAX_BACKOFF_MS = int(args.max_backoff * 1000)
    keys = ",".join(f"{t}:data:{key(t)}" for t in TENANTS)
    runs = {"tenant": [], "fifo": []}
    for run in range(args.runs):
        for mode in ["tenant", "fifo"]:
            os.environ["ORCHD_API_KEYS"] = keys
            os.environ["ORCHD_QUEUE_FAIRNESS"] = mode
            extra = (f"[queue]\ncapacity = {args.queue}\n[admission]\nmax_queue_wait_ms = 600000\n"
                     "[timeouts]\nidle_ms = 60000\n")
            proc, base = bench_servers.start_orchd(args.orchd, args.model, args.slots, 2048,
                                                   args.threads, extra=extra, ready_path="/readyz")
            try:
                runs[mode].append(asyncio.run(run_mode(base, args)))
            finally:
                bench_servers.stop(proc)
            print(f"run {run + 1}/{args.runs} {mode}: done", file=sys.stderr)

    def med(mode, *path):
        vals = []
        for r in runs[mode]:
            for p in path:
                r = r[p]
            vals.append(r)
        return statistics.median(vals)

    print(f"medians of {args.runs} run(s) a mode")
    print(f"{'mode':7} {'tenant':7} {'TTFT p50':>9} {'TTFT p95':>9} {'done':>5} {'429':>5} "
          f"{'sent back':>9} {'tokens':>7}")
    for mode in runs:
        for t in TENANTS:
            x = {k: med(mode, "tenants", t, k) for k in runs[mode][0]["tenants"][t]}
            print(f"{mode:7} {t:7} {x['ttft_p50_ms']:9.0f} {x['ttft_p95_ms']:9.0f} {x['done']:5.0f} "
                  f"{x['refused']:5.0f} {x['sent_back']:9.0f} {x['tokens_served']:7.0f}")
        print(f"{mode:7} Jain (flood, steady) {med(mode, 'jain_backlogged'):.3f}; "
              f"{med(mode, 'served_per_s'):.1f} tokens/s served, "
              f"{med(mode, 'generated_per_s'):.1f} generated; light alone TTFT p95 "
              f"{med(mode, 'idle_light_ttft_p95_ms'):.0f} ms")
    light_p95 = med("tenant", "tenants", "light", "ttft_p95_ms")
    bound = (med("tenant", "idle_light_ttft_p95_ms")
             + med("tenant", "tenants", "flood", "service_p50_ms"))
    light_refused = max(r["tenants"]["light"]["refused"] + r["tenants"]["light"]["sent_back"]
                        for r in runs["tenant"])
    served_ratio = med("tenant", "served_per_s") / med("fifo", "served_per_s")
    generated_ratio = med("tenant", "generated_per_s") / med("fifo", "generated_per_s")
    goals = {
        "light p95 <= idle p95 + one flood task": light_p95 <= bound,
        "0 light refusals (every run)": light_refused == 0,
        "Jain >= 0.95": med("tenant", "jain_backlogged") >= 0.95,
        "tokens served/s >= 0.95x fifo": served_ratio >= 0.95,
    }
    print(f"light p95 {light_p95:.0f} ms against {bound:.0f} ms; tokens served/s "
          f"{served_ratio:.3f}x fifo, generated {generated_ratio:.3f}x")
    for g, ok in goals.items():
        print(f"  {'met' if ok else 'MISSED'}: {g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "goals": goals}, f, indent=1)


if __name__ == "__main__":
    main()
