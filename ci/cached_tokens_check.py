#!/usr/bin/env python3
"""What was cached, in every API's own field, read by the official clients (CACHE-API-1).

Run by orchestratord/tests/cached_tokens.rs against a server with the real default model (one
pool of 2 slots). Each API gets a two-turn conversation the way chat clients send one: the
second turn resends the first turn and its answer. The first turn's prompt is new (a nonce in
its system prompt), so little of it can come from the cache; the second turn's history does:

- openai (chat): `usage.prompt_tokens_details.cached_tokens`;
- openai (completions): the same field;
- openai (Responses): `usage.input_tokens_details.cached_tokens`;
- anthropic: `cache_read_input_tokens`, with `input_tokens` the rest (their sum the prompt);
- llama-server's `/completion` (plain HTTP: it has no official client): `timings.cache_n`,
  `timings.prompt_n` the rest, `tokens_evaluated` the whole prompt.

    PYTHONPATH=.cache/pydeps python3 ci/cached_tokens_check.py --base-url http://127.0.0.1:PORT
"""
import argparse
import json
import sys
import urllib.request
import uuid

import anthropic
import openai

GREEDY = {"temperature": 0}
# the served model's name, from /v1/models
MODEL = ""


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.splitlines()[0][:160]}")


def conversation():
    """A new system prompt (so the first turn is not cached) and two questions."""
    system = (f"You are a terse assistant for session {uuid.uuid4().hex}. "
              "Answer in one short sentence about geography, history or science.")
    return system, "What is the capital of France?", "And what river runs through it?"


def openai_chat(base):
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused")
    system, q1, q2 = conversation()
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": q1}]
    r1 = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, **GREEDY)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": q2}]
    r2 = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, **GREEDY)
    u1, u2 = r1.usage, r2.usage
    c1, c2 = u1.prompt_tokens_details.cached_tokens, u2.prompt_tokens_details.cached_tokens
    check(c1 < u1.prompt_tokens / 2,
          f"openai chat: a new prompt is mostly computed ({c1} of {u1.prompt_tokens} cached)")
    check(c2 >= 0.8 * u1.prompt_tokens and c2 < u2.prompt_tokens,
          f"openai chat: the second turn's history came from the cache ({c2} of "
          f"{u2.prompt_tokens} cached, the first turn was {u1.prompt_tokens})")
    # streamed, with usage: the same field in the last chunk
    msgs += [{"role": "assistant", "content": r2.choices[0].message.content},
             {"role": "user", "content": "Thanks. One more fact?"}]
    usage = None
    for chunk in c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8,
                                           stream=True, stream_options={"include_usage": True},
                                           **GREEDY):
        if chunk.usage is not None:
            usage = chunk.usage
    check(usage is not None and usage.prompt_tokens_details.cached_tokens >= u2.prompt_tokens * 0.8,
          f"openai chat stream: the usage chunk says what was cached ({usage})")


def openai_completions(base):
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused")
    system, q1, _ = conversation()
    p1 = f"{system}\nQ: {q1}\nA:"
    r1 = c.completions.create(model=MODEL, prompt=p1, max_tokens=8, **GREEDY)
    p2 = p1 + r1.choices[0].text + "\nQ: Name a famous museum there.\nA:"
    r2 = c.completions.create(model=MODEL, prompt=p2, max_tokens=8, **GREEDY)
    c2 = r2.usage.prompt_tokens_details.cached_tokens
    check(c2 >= 0.8 * r1.usage.prompt_tokens and c2 < r2.usage.prompt_tokens,
          f"openai completions: the resent prompt came from the cache ({c2} of "
          f"{r2.usage.prompt_tokens}, the first was {r1.usage.prompt_tokens})")


def openai_responses(base):
    c = openai.OpenAI(base_url=base + "/v1", api_key="unused")
    system, q1, q2 = conversation()
    r1 = c.responses.create(model=MODEL, instructions=system, input=q1,
                            max_output_tokens=12, **GREEDY)
    turn = [{"role": "user", "content": q1}, {"role": "assistant", "content": r1.output_text},
            {"role": "user", "content": q2}]
    r2 = c.responses.create(model=MODEL, instructions=system, input=turn,
                            max_output_tokens=12, **GREEDY)
    c2 = r2.usage.input_tokens_details.cached_tokens
    check(c2 >= 0.8 * r1.usage.input_tokens and c2 < r2.usage.input_tokens,
          f"openai responses: input_tokens_details.cached_tokens ({c2} of "
          f"{r2.usage.input_tokens}, the first was {r1.usage.input_tokens})")


def anthropic_messages(base):
    c = anthropic.Anthropic(base_url=base, api_key="unused")
    system, q1, q2 = conversation()
    msgs = [{"role": "user", "content": q1}]
    r1 = c.messages.create(model=MODEL, system=system, messages=msgs, max_tokens=12,
                           extra_body=GREEDY)
    whole1 = r1.usage.input_tokens + r1.usage.cache_read_input_tokens
    check(r1.usage.cache_read_input_tokens < whole1 / 2,
          f"anthropic: a new prompt is mostly computed ({r1.usage})")
    msgs += [{"role": "assistant", "content": r1.content[0].text},
             {"role": "user", "content": q2}]
    r2 = c.messages.create(model=MODEL, system=system, messages=msgs, max_tokens=12,
                           extra_body=GREEDY)
    read = r2.usage.cache_read_input_tokens
    check(read >= 0.8 * whole1 and r2.usage.input_tokens > 0
          and r2.usage.cache_creation_input_tokens == 0,
          f"anthropic: cache_read_input_tokens holds the history, input_tokens the rest "
          f"({r2.usage}, the first turn was {whole1})")
    # the stream: message_delta's usage says it, and the SDK's final message carries it
    msgs += [{"role": "assistant", "content": r2.content[0].text},
             {"role": "user", "content": "Thanks. One more fact?"}]
    with c.messages.stream(model=MODEL, system=system, messages=msgs, max_tokens=8,
                           extra_body=GREEDY) as s:
        final = s.get_final_message()
    whole2 = r2.usage.input_tokens + read
    check(final.usage.cache_read_input_tokens is not None
          and final.usage.cache_read_input_tokens >= 0.8 * whole2,
          f"anthropic stream: the final message's usage says what was cached ({final.usage})")


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def llama_completion(base):
    system, q1, _ = conversation()
    p1 = f"{system}\nQ: {q1}\nA:"
    r1 = post(base + "/completion", {"prompt": p1, "n_predict": 8, "temperature": 0})
    p2 = p1 + r1["content"] + "\nQ: Name a famous museum there.\nA:"
    r2 = post(base + "/completion", {"prompt": p2, "n_predict": 8, "temperature": 0})
    t = r2["timings"]
    check(t["cache_n"] >= 0.8 * r1["tokens_evaluated"]
          and t["cache_n"] + t["prompt_n"] == r2["tokens_evaluated"],
          f"llama-server /completion: timings.cache_n and prompt_n split tokens_evaluated "
          f"({t['cache_n']} + {t['prompt_n']} = {r2['tokens_evaluated']}, "
          f"the first was {r1['tokens_evaluated']})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    base = ap.parse_args().base_url.rstrip("/")
    global MODEL
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
        MODEL = json.load(r)["data"][0]["id"]
    for f in [openai_chat, openai_completions, openai_responses, anthropic_messages,
              llama_completion]:
        f(base)
    print("all cached-token checks passed")


if __name__ == "__main__":
    main()
