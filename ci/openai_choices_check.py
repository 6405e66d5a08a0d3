#!/usr/bin/env python3
"""Log-probabilities and `n` choices through the official `openai` SDK on the real model
(ADP-LP-1..2, ADP-OAI-6): chat and completions logprobs, streamed and not, with
`top_logprobs`; greedy answers pick the likeliest token, alternatives come most likely first and
never sum over 1, the tokens spell the answer, streamed and whole answers carry the same values;
sampled answers too; `n` choices that share the prompt's prefill, reproducible with a seed,
streamed by index; and the refusals. Exits non-zero at the first failure.

    PYTHONPATH=.cache/pydeps python3 ci/openai_choices_check.py --base-url http://127.0.0.1:PORT
"""
import argparse
import json
import math
import sys
import urllib.request

import openai

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.splitlines()[0][:140]}")


def well_formed(entries, greedy, n_top):
    for e in entries:
        tops = e.top_logprobs
        if len(tops) != n_top or e.logprob > 0:
            return False, f"{e}"
        if any(a.logprob < b.logprob for a, b in zip(tops, tops[1:])):
            return False, f"not sorted: {tops}"
        if sum(math.exp(t.logprob) for t in tops) > 1 + 1e-5:
            return False, "mass over 1"
        if greedy and (tops[0].token != e.token or abs(tops[0].logprob - e.logprob) > 1e-6):
            return False, f"greedy did not pick the likeliest: {e.token!r} {tops[0].token!r}"
        if not greedy and e.logprob > tops[0].logprob + 1e-6:
            return False, "a token likelier than the likeliest"
        if bytes(e.bytes).decode("utf-8", "replace") != e.token:
            return False, "bytes and token disagree"
    return True, ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    with urllib.request.urlopen(f"{args.base_url}/v1/models", timeout=10) as r:
        model = json.load(r)["data"][0]["id"]
    c = openai.OpenAI(base_url=f"{args.base_url}/v1", api_key="unused", max_retries=0,
                      timeout=300)

    r = c.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, temperature=0,
                                  logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens == 16,
          f"chat: one entry per token ({len(content)})")
    ok, why = well_formed(content, True, 5)
    check(ok, f"chat: greedy picks the likeliest, alternatives sorted, mass <= 1 {why}")
    check("".join(e.token for e in content) == r.choices[0].message.content,
          f"chat: the tokens spell the answer ({r.choices[0].message.content!r})")
    stream = c.chat.completions.create(model=model, messages=QUESTION, max_tokens=16,
                                       temperature=0, logprobs=True, top_logprobs=5,
                                       stream=True)
    streamed = [e for ch in stream if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    check([(e.token, round(e.logprob, 5)) for e in streamed]
          == [(e.token, round(e.logprob, 5)) for e in content],
          "chat stream: the same tokens and log-probabilities as the whole answer")
    sampled = c.chat.completions.create(model=model, messages=QUESTION, max_tokens=16,
                                        temperature=1.0, seed=3, logprobs=True, top_logprobs=3)
    ok, why = well_formed(sampled.choices[0].logprobs.content, False, 3)
    check(ok, f"chat sampled: well formed, never likelier than the likeliest {why}")
    plain = c.chat.completions.create(model=model, messages=QUESTION, max_tokens=4)
    check(plain.choices[0].logprobs is None, "chat: no logprobs unless asked")
    only = c.chat.completions.create(model=model, messages=QUESTION, max_tokens=4,
                                     temperature=0, logprobs=True)
    check(all(e.top_logprobs == [] for e in only.choices[0].logprobs.content),
          "chat: logprobs without top_logprobs: no alternatives")

    t = c.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                             temperature=0, logprobs=3)
    lp = t.choices[0].logprobs
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
          == len(lp.text_offset) == 8, "completions: one entry per token")
    check("".join(lp.tokens) == t.choices[0].text
          and lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0,
          f"completions: the tokens spell the text at their offsets ({t.choices[0].text!r})")
    check(all(len(m) <= 3 and max(m.values()) == v for m, v in zip(lp.top_logprobs,
                                                                    lp.token_logprobs)),
          "completions: greedy tokens are their step's likeliest")
    echoed = c.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                  temperature=0, logprobs=1, echo=True)
    check(echoed.choices[0].logprobs.text_offset[0] == len("The capital of France is"),
          "completions echo: offsets count from the echoed prompt")
    st = c.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                              temperature=0, logprobs=3, stream=True)
    parts = [ch.choices[0] for ch in st if ch.choices and ch.choices[0].logprobs]
    check([p.logprobs.tokens[0] for p in parts] == lp.tokens
          and [p.logprobs.text_offset[0] for p in parts] == lp.text_offset,
          "completions stream: the same tokens at the same offsets")

    for call, param in [
        (lambda: c.chat.completions.create(model=model, messages=QUESTION, max_tokens=2,
                                           top_logprobs=3), "top_logprobs"),
        (lambda: c.chat.completions.create(model=model, messages=QUESTION, max_tokens=2,
                                           logprobs=True, top_logprobs=21), "top_logprobs"),
        (lambda: c.completions.create(model=model, prompt="x", max_tokens=2, logprobs=21),
         "logprobs"),
    ]:
        try:
            call()
            check(False, f"{param} refused")
        except openai.BadRequestError as e:
            check(e.body["param"] == param, f"refused naming {param} ({e.body['message']})")

    # n choices: one prompt, its prefill computed once and shared
    def reused():
        with urllib.request.urlopen(f"{args.base_url}/metrics", timeout=10) as r:
            return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                       if line.startswith("orchd_pool_prompt_tokens_reused_total{"))

    story = [{"role": "user", "content": "Tell me about the history of bicycles in Europe. " * 6}]
    before = reused()
    a = c.chat.completions.create(model=model, messages=story, max_tokens=12, n=3,
                                  temperature=1.0, seed=5)
    shared = reused() - before
    check([ch.index for ch in a.choices] == [0, 1, 2]
          and len({ch.message.content for ch in a.choices}) > 1,
          f"n=3: three choices, sampled apart ({[ch.message.content[:20] for ch in a.choices]})")
    check(a.usage.completion_tokens == 36 and a.usage.prompt_tokens > 60,
          f"n=3: the prompt counted once, every choice's tokens ({a.usage})")
    check(shared >= 2 * (a.usage.prompt_tokens - 1),
          f"n=3: the prompt's prefill shared ({shared:.0} tokens reused)")
    b = c.chat.completions.create(model=model, messages=story, max_tokens=12, n=3,
                                  temperature=1.0, seed=5)
    check([x.message.content for x in a.choices] == [x.message.content for x in b.choices],
          "n=3 with a seed: each choice reproducible")
    s = c.chat.completions.create(model=model, messages=story, max_tokens=12, n=2,
                                  temperature=0, stream=True,
                                  stream_options={"include_usage": True})
    texts, finishes, usage = {}, {}, None
    for ch in s:
        for x in ch.choices:
            texts[x.index] = texts.get(x.index, "") + (x.delta.content or "")
            if x.finish_reason:
                finishes[x.index] = x.finish_reason
        usage = ch.usage or usage
    check(sorted(texts) == [0, 1] and texts[0] == texts[1] and finishes == {0: "length",
                                                                           1: "length"}
          and usage.completion_tokens == 24,
          f"n=2 streamed: chunks by index, each finished, usage summed ({texts[0][:30]!r})")
    try:
        c.chat.completions.create(model=model, messages=story, max_tokens=2, n=0)
        check(False, "n=0 refused")
    except openai.BadRequestError as e:
        check(e.body["param"] == "n", f"n=0 refused naming n ({e.body['message']})")
    print("all logprobs and n checks passed")


if __name__ == "__main__":
    main()
