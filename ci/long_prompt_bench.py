#!/usr/bin/env python3
"""Long prompts, side by side: prompt tokens/s of uncached prompts of several lengths, and how
long a running stream freezes while a long prompt arrives, against any OpenAI-compatible
servers (orchestratord and a peer such as llama.cpp's `llama-server`).

Servers are either given (`--target NAME=BASE_URL`, already running) or started here one
after the other, never together (`--orchd BIN` and/or `--llama-server BIN` with `--model`).

1. Prefill: for each length, a non-streamed `/v1/completions` with `max_tokens: 1`,
   `temperature: 0` and a prompt no cache holds (a fresh first line each round); tokens/s is
   the `usage.prompt_tokens` the server reports over the wall time. Median of `--rounds`.
2. Freeze: one stream (`/v1/completions`, `stream: true`, 400 tokens) runs; once it has
   streamed 20 tokens a long uncached prompt (`--freeze-tokens`, 1312 by default) is sent as in
   1. Reported: the longest gap between two tokens of the running stream while the long
   prompt was in the server, the stream's median gap before, and the long prompt's time to
   answer against the same prompt length on the idle server, measured just before in the same
   round (paired). Medians of `--rounds`; the growth is the median of the rounds' ratios.

    PYTHONPATH=.cache/pydeps python3 ci/long_prompt_bench.py \\
        --orchd target/release/orchestratord --llama-server /path/to/llama-server \\
        --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf [--lengths 132,512,1312,2048] \\
        [--rounds 3] [--json out.json]
    PYTHONPATH=.cache/pydeps python3 ci/long_prompt_bench.py --target ours=http://127.0.0.1:8080
"""
import argparse
import json
import statistics
import sys
import threading
import time
import uuid

import httpx2 as httpx

import bench_servers

SENTENCE = ("The history of the bicycle begins in the early nineteenth century, when inventors "
            "in several countries tried to build a machine that a rider could move with the feet. ")


def model_of(base, client):
    r = client.get(f"{base}/v1/models")
    r.raise_for_status()
    return r.json()["data"][0]["id"]


class Prompts:
    """Uncached prompts of about a given token count (calibrated on the server's own count)."""

    def __init__(self, base, model, client):
        self.base, self.model, self.client = base, model, client
        head = self.complete(self.fresh(0))["usage"]["prompt_tokens"]
        ten = self.complete(self.fresh(10))["usage"]["prompt_tokens"]
        self.per_sentence = max(1.0, (ten - head) / 10)
        self.head = head

    def fresh(self, sentences):
        # a unique first line: no prefix cache holds any of it
        return f"Note {uuid.uuid4().hex[:12]}.\n" + SENTENCE * sentences

    def of(self, tokens):
        return self.fresh(max(0, round((tokens - self.head) / self.per_sentence)))

    def complete(self, prompt, timeout=600):
        r = self.client.post(f"{self.base}/v1/completions", timeout=timeout, json={
            "model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
        r.raise_for_status()
        return r.json()


def prefill(prompts, length, rounds):
    rates, seconds, counted = [], [], []
    for _ in range(rounds):
        p = prompts.of(length)
        t0 = time.perf_counter()
        out = prompts.complete(p)
        dt = time.perf_counter() - t0
        n = out["usage"]["prompt_tokens"]
        rates.append(n / dt)
        seconds.append(dt)
        counted.append(n)
    return {"prompt_tokens": int(statistics.median(counted)),
            "tok_s": round(statistics.median(rates), 1),
            "seconds": round(statistics.median(seconds), 3)}


def freeze_once(prompts, base, model, tokens):
    """A stream runs; after 20 of its tokens the long prompt arrives. Returns the gaps."""
    arrivals = []
    started = threading.Event()
    stop = threading.Event()
    long_window = {}

    def stream():
        with httpx.Client(timeout=600) as c:
            with c.stream("POST", f"{base}/v1/completions", json={
                    "model": model, "prompt": prompts.fresh(2) + "Continue the story:",
                    "max_tokens": 400, "temperature": 0, "stream": True}) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    arrivals.append(time.perf_counter())
                    if len(arrivals) == 20:
                        started.set()
                    if stop.is_set():
                        break

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    if not started.wait(120):
        raise SystemExit("the stream did not start")
    long_prompt = prompts.of(tokens)
    long_window["sent"] = time.perf_counter()
    out = prompts.complete(long_prompt)
    long_window["answered"] = time.perf_counter()
    # a few more tokens after the long prompt, then leave
    time.sleep(0.3)
    stop.set()
    t.join(60)
    times = list(arrivals)
    sent, answered = long_window["sent"], long_window["answered"]
    before = [b - a for a, b in zip(times, times[1:]) if b <= sent]
    # every gap that overlaps the long prompt's time in the server
    during = [b - a for a, b in zip(times, times[1:]) if b > sent and a < answered]
    after = [x for x in times if x > answered]
    if not after:
        # the stream produced nothing after the long prompt was answered: its last gap
        # runs at least until then
        during.append(answered - (max([x for x in times if x <= answered] or [sent])))
    # the three longest gaps: when each began, from the long prompt's sending (ms)
    top = sorted(((b - a, a - sent) for a, b in zip(times, times[1:]) if b > sent and a < answered),
                 reverse=True)[:3]
    return {"max_gap_ms": round(max(during or [0]) * 1000, 1),
            "top_gaps_ms_at": [(round(g * 1000), round(at * 1000)) for g, at in top],
            "median_gap_before_ms": round(statistics.median(before) * 1000, 1) if before else None,
            "long_prompt_s": round(answered - sent, 3),
            "long_prompt_tokens": out["usage"]["prompt_tokens"]}


def run_against(name, base, args):
    client = httpx.Client(timeout=600)
    model = model_of(base, client)
    prompts = Prompts(base, model, client)
    # warm-up: one short and one long uncached prompt
    prompts.complete(prompts.of(64))
    prompts.complete(prompts.of(512))
    row = {"server": name, "prefill": {}}
    for length in args.lengths:
        row["prefill"][length] = prefill(prompts, length, args.rounds)
        print(f"{name}: {length} tokens -> {row['prefill'][length]}", file=sys.stderr)
    # paired rounds: the long prompt on the idle server, then beside a stream, so that the
    # machine's drift over the run falls on both sides of each ratio
    idles, freezes = [], []
    for _ in range(args.rounds):
        idles.append(prefill(prompts, args.freeze_tokens, 1))
        freezes.append(freeze_once(prompts, base, model, args.freeze_tokens))
    print(f"{name}: idle runs {idles}", file=sys.stderr)
    print(f"{name}: freeze runs {freezes}", file=sys.stderr)
    row["freeze"] = {
        "runs": freezes,
        "max_gap_ms_median": round(statistics.median(f["max_gap_ms"] for f in freezes), 1),
        "max_gap_ms_max": max(f["max_gap_ms"] for f in freezes),
        "median_gap_before_ms": statistics.median(
            f["median_gap_before_ms"] for f in freezes if f["median_gap_before_ms"]),
        "long_prompt_s_loaded": round(statistics.median(f["long_prompt_s"] for f in freezes), 3),
        "long_prompt_s_idle": round(statistics.median(i["seconds"] for i in idles), 3),
        "long_prompt_tokens": idles[0]["prompt_tokens"],
        # per round: beside a stream over idle, the same length, one after the other
        "ttft_growth_rounds": [round(f["long_prompt_s"] / i["seconds"] - 1, 3)
                               for i, f in zip(idles, freezes)],
    }
    f = row["freeze"]
    f["ttft_growth"] = statistics.median(f["ttft_growth_rounds"])
    client.close()
    return row


def start_orchd(args):
    step = f"step_prompt_tokens = {args.step_prompt_tokens}\n" if args.step_prompt_tokens else ""
    step += f"step_ms = {args.step_ms}\n" if args.step_ms is not None else ""
    step += (f"step_prompt_ms = {args.step_prompt_ms}\n"
             if args.step_prompt_ms is not None else "")
    # a long prompt on a slow build must not be taken for a stuck engine
    return bench_servers.start_orchd(args.orchd, args.model, args.slots, args.ctx, args.threads,
                                     pool_extra=step, extra="[timeouts]\nidle_ms = 600000\n")


def start_llama(args):
    return bench_servers.start_llama(args.llama_server, args.model, args.slots, args.ctx,
                                     args.threads)


def tables(rows, lengths):
    out = ["| prompt tokens | " + " | ".join(r["server"] for r in rows) +
           (" | ratio |" if len(rows) == 2 else " |"),
           "|---|" + "---|" * (len(rows) + (1 if len(rows) == 2 else 0))]
    for length in lengths:
        cells = [r["prefill"][length] for r in rows]
        line = f"| {cells[0]['prompt_tokens']} | " + " | ".join(f"{c['tok_s']} tok/s" for c in cells)
        if len(rows) == 2:
            line += f" | {cells[0]['tok_s'] / cells[1]['tok_s']:.2f}"
        out.append(line + " |")
    out.append("")
    out.append("| server | stream gap before | longest gap while the long prompt arrives "
               "(median / max of runs) | long prompt answered: idle → beside a stream |")
    out.append("|---|---|---|---|")
    for r in rows:
        f = r["freeze"]
        out.append(f'| {r["server"]} | {f["median_gap_before_ms"]} ms | '
                   f'{f["max_gap_ms_median"]} / {f["max_gap_ms_max"]} ms | '
                   f'{f["long_prompt_s_idle"]} s → {f["long_prompt_s_loaded"]} s '
                   f'({f["ttft_growth"] * 100:+.0f} %, median of the paired rounds '
                   f'{", ".join(f"{g * 100:+.0f}" for g in f["ttft_growth_rounds"])}; '
                   f'{f["long_prompt_tokens"]} tokens) |')
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", action="append", default=[],
                    help="NAME=BASE_URL of a running server (repeatable)")
    ap.add_argument("--orchd", help="orchestratord binary (started here)")
    ap.add_argument("--llama-server", help="llama-server binary (started here)")
    ap.add_argument("--model", help="GGUF for the servers started here")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=4096, help="context per slot")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="132,512,1312,2048")
    ap.add_argument("--freeze-tokens", type=int, default=1312)
    ap.add_argument("--step-prompt-tokens", type=int,
                    help="orchestratord's pools[].step_prompt_tokens (default: its default)")
    ap.add_argument("--step-ms", type=int,
                    help="orchestratord's pools[].step_ms (default: its default; 0: fixed chunks)")
    ap.add_argument("--step-prompt-ms", type=int,
                    help="orchestratord's pools[].step_prompt_ms (default: its default; 0: no "
                         "ceiling on what a pass's prompt tokens add beside a stream)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    args.lengths = [int(x) for x in args.lengths.split(",") if x]
    rows = []
    for spec in args.target:
        name, base = spec.split("=", 1)
        rows.append(run_against(name, base.rstrip("/"), args))
    for name, binary, start in (("orchestratord", args.orchd, start_orchd),
                                ("llama-server", args.llama_server, start_llama)):
        if not binary:
            continue
        if not args.model:
            raise SystemExit("--model is needed to start servers")
        proc, base = start(args)
        try:
            rows.append(run_against(name, base, args))
        finally:
            bench_servers.stop(proc)
    print(tables(rows, args.lengths))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
