#!/usr/bin/env python3
"""Drives a running orchestratord with the official `ollama` Python client (ADP-OLL-1..3).

Run by orchestratord/tests/ollama_client.rs against a server with the real default model, one
pool of 2 slots and a queue of 2. Every check asserts what a user of the client would notice;
the first failure exits non-zero with the reason.

    PYTHONPATH=.cache/pydeps python3 ci/ollama_client_check.py --host http://127.0.0.1:PORT \
        --model-file .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import hashlib
import json
import sys
import threading
import urllib.request

import jsonschema
import ollama

from task_records import with_prompt

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.splitlines()[0][:120]}")


def refused(call, status, words):
    """`call` raises ResponseError with `status` and an error naming each of `words`."""
    try:
        call()
    except ollama.ResponseError as e:
        return e.status_code == status and all(w in e.error for w in words), e.error
    return False, "no error"


def openai_chat(host, model, messages, max_tokens):
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"{host}/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["message"]["content"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--model-file", required=True)
    args = ap.parse_args()
    c = ollama.Client(host=args.host, timeout=300)

    # list, ps, show, version: what the pools serve, as Ollama describes its models
    models = c.list().models
    check(len(models) == 1, f"list: one model ({[m.model for m in models]})")
    m = models[0]
    name = m.model
    with open(args.model_file, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    check(m.digest == digest, f"list: digest is the file's sha256 ({m.digest})")
    check(m.size > 10_000_000 and m.details.format == "gguf"
          and m.details.family == "llama" and m.details.quantization_level == "Q4_1"
          and m.details.parameter_size.endswith("M"),
          f"list: size and details of the GGUF ({m.size}, {m.details})")
    running = c.ps().models
    check(len(running) == 1 and running[0].size > m.size and running[0].size_vram == 0
          and running[0].context_length == 2048,
          f"ps: loaded, weights and KV cache in memory, on CPU, context 2048 ({running})")
    shown = c.show(name)
    check(shown.details.family == "llama" and shown.capabilities == ["completion", "tools"]
          and shown.modelinfo["general.architecture"] == "llama"
          and shown.modelinfo["llama.context_length"] == 2048
          and shown.modelinfo["general.parameter_count"] > 100_000_000
          and "im_start" in (shown.template or ""),
          f"show: details, model_info and the chat template ({shown.modelinfo})")
    ok, why = refused(lambda: c.show("no-such-model"), 404, ["no-such-model"])
    check(ok, f"show: an unknown model is a 404 naming it ({why})")
    version = urllib.request.urlopen(f"{args.host}/api/version", timeout=10).read()
    check(json.loads(version)["version"], f"version: {version!r}")

    # chat, not streamed: the same text as the OpenAI route gives, real counts and durations
    r = c.chat(model=name, messages=QUESTION, stream=False,
               options={"temperature": 0, "num_predict": 16})
    check(r.done and r.done_reason == "length" and r.eval_count == 16,
          f"chat: 16 tokens, done_reason length ({r.done_reason}, {r.eval_count})")
    check(r.message.role == "assistant" and len(r.message.content) > 10,
          f"chat: an answer ({r.message.content!r})")
    check(r.message.content == openai_chat(args.host, name, QUESTION, 16),
          "chat: the same greedy text as /v1/chat/completions")
    check(r.prompt_eval_count > 10 and r.prompt_eval_duration > 0 and r.eval_duration > 0
          and r.total_duration >= r.load_duration + r.prompt_eval_duration + r.eval_duration
          and r.total_duration < 120e9,
          f"chat: counts and durations in ns that add up ({r.prompt_eval_count}, "
          f"{r.load_duration}+{r.prompt_eval_duration}+{r.eval_duration} <= {r.total_duration})")

    # chat, streamed: the pieces make the same text; the last line carries the stats
    parts = list(c.chat(model=name, messages=QUESTION, stream=True,
                        options={"temperature": 0, "num_predict": 16}))
    text = "".join(p.message.content for p in parts)
    check(len(parts) >= 3 and not any(p.done for p in parts[:-1]) and parts[-1].done,
          f"chat stream: {len(parts)} lines, only the last done")
    check(text == r.message.content, f"chat stream: the same text ({text!r})")
    check(parts[-1].done_reason == "length" and parts[-1].eval_count == 16,
          "chat stream: the last line's done_reason and eval_count")

    # stop sequences, seed, a multi-turn chat with a system prompt
    stopped = c.chat(model=name, messages=QUESTION, options={"stop": [","], "num_predict": 32,
                                                             "temperature": 0})
    check(stopped.done_reason == "stop" and "," not in stopped.message.content,
          f"chat: a stop sequence ends the answer ({stopped.message.content!r})")
    seeded = [c.chat(model=name, messages=QUESTION,
                     options={"temperature": 1.0, "seed": 7, "num_predict": 12}).message.content
              for _ in range(2)]
    check(seeded[0] == seeded[1], f"chat: the same seed, the same sample ({seeded[0]!r})")
    turns = [{"role": "system", "content": "Answer in one word."}] + QUESTION + [
        {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}]
    check(len(c.chat(model=name, messages=turns, options={"num_predict": 8}).message.content) > 0,
          "chat: system, user and assistant turns")

    # generate: templated, raw, streamed
    g = c.generate(model=name, prompt="What is the capital of France?",
                   options={"temperature": 0, "num_predict": 16})
    check(g.response == r.message.content and g.done_reason == "length",
          f"generate: the prompt as one user turn, same text as chat ({g.response!r})")
    raw = list(c.generate(model=name, prompt="The capital of France is", raw=True,
                          stream=True, options={"temperature": 0, "num_predict": 6}))
    check(raw[-1].done and raw[-1].prompt_eval_count < 10
          and len("".join(p.response for p in raw)) > 0,
          f"generate raw stream: the prompt as is ({raw[-1].prompt_eval_count} prompt tokens)")
    pirate = "You are a pirate."
    sys_g, g_prompt = with_prompt(args.host, lambda c: c.generate(
        model=name, prompt="Hi", system=pirate, options={"temperature": 0, "num_predict": 8}))
    sys_c, c_prompt = with_prompt(args.host, lambda c: c.chat(
        model=name, messages=[{"role": "system", "content": pirate},
                              {"role": "user", "content": "Hi"}],
        options={"temperature": 0, "num_predict": 8}))
    check(g_prompt == c_prompt and sys_g.response == sys_c.message.content,
          f"generate: system and prompt as chat's two turns ({sys_g.response!r})")
    # the same prompt again: its engine held it, so Ollama's count of what it evaluated is less
    again = c.chat(model=name, messages=[{"role": "system", "content": pirate},
                                         {"role": "user", "content": "Hi"}],
                   options={"temperature": 0, "num_predict": 8})
    check(0 < again.prompt_eval_count < c_prompt,
          f"prompt_eval_count: only what was evaluated ({again.prompt_eval_count} of {c_prompt} "
          "prompt tokens, the rest held by the cache)")
    load = c.generate(model=name, prompt="")
    check(load.done and load.done_reason == "load", "generate: no prompt loads (done_reason load)")
    # a context over the model's is the context served, as Ollama clamps (issue 49)
    wide = c.chat(model=name, messages=QUESTION, options={"num_ctx": 1_000_000, "num_predict": 4})
    check(wide.done and wide.eval_count >= 1, f"num_ctx over the served context is clamped ({wide.done_reason})")

    # errors in Ollama's shape, naming what is wrong
    for call, status, words, what in [
        (lambda: c.chat(model="no-such-model", messages=QUESTION), 404, ["no-such-model"],
         "an unknown model"),
        (lambda: c.chat(model=name, messages=QUESTION, options={"mirostat": 2}), 400,
         ["mirostat"], "a sampler this server lacks"),
        (lambda: c.chat(model=name, messages=QUESTION, options={"temperature": -1}), 400,
         ["options.temperature"], "a negative temperature"),
        (lambda: c.chat(model=name, messages=QUESTION, options={"num_predict": 100_000}), 400,
         ["options.num_predict"], "more tokens than a request may ask for"),
        (lambda: c.chat(model=name, messages=[{"role": "user", "content": "x",
                                               "images": ["aGk="]}]), 400,
         ["images"], "an image"),
        (lambda: c.generate(model=name, prompt="x", suffix="y"), 400, ["suffix"],
         "fill-in-the-middle"),
        (lambda: c.chat(model=name, messages=QUESTION, think=True), 400, ["thinking"],
         "thinking"),
    ]:
        ok, why = refused(call, status, words)
        check(ok, f"{what}: {status} naming it ({why})")

    # log-probabilities (ADP-LP-3): one entry per answer token, greedy picks the likeliest,
    # alternatives sorted, the tokens spell the answer; streamed, the same entries
    greedy = {"temperature": 0, "num_predict": 12}
    r = c.chat(model=name, messages=QUESTION, logprobs=True, top_logprobs=3, options=greedy)
    lps = r.logprobs or []
    check(len(lps) == r.eval_count and lps, f"chat logprobs: one per token ({len(lps)}, {r.eval_count})")
    check(all(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
              and e.top_logprobs[0].logprob == e.logprob
              and all(a.logprob >= b.logprob for a, b in zip(e.top_logprobs, e.top_logprobs[1:]))
              and e.logprob <= 0 for e in lps),
          "chat logprobs: greedy takes the likeliest, alternatives sorted, at most 0")
    check("".join(e.token for e in lps) == r.message.content, "chat logprobs: the tokens spell the answer")
    streamed = [e for part in c.chat(model=name, messages=QUESTION, logprobs=True, top_logprobs=3,
                                     options=greedy, stream=True) for e in (part.logprobs or [])]
    check([(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in lps],
          "chat logprobs: streamed, the same entries")
    g = c.generate(model=name, prompt="The capital of France is", logprobs=True, options=greedy)
    check(len(g.logprobs or []) == g.eval_count and all(not e.top_logprobs for e in g.logprobs),
          "generate logprobs: one per token, no alternatives without top_logprobs")
    plain = c.chat(model=name, messages=QUESTION, options=greedy)
    check(plain.logprobs is None, "no logprobs unless asked")

    # tools (ADP-TOOL-2): a call whose arguments validate, its result sent back, the next turn;
    # streamed, the call comes whole in one line before the last
    # (the client's Tool model keeps a schema's type, properties and required only)
    weather = {"type": "object", "properties": {"city": {"type": "string"}},
               "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "get_weather",
              "description": "The current weather in a city", "parameters": weather}}]
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    r = c.chat(model=name, messages=ask, tools=tools, options={"temperature": 0, "num_predict": 256})
    calls = r.message.tool_calls or []
    if calls:
        call = calls[0]
        check(call.function.name == "get_weather", f"tools: the function called ({call.function.name})")
        jsonschema.validate(dict(call.function.arguments), weather)
        check(r.message.content == "" and r.done_reason == "stop",
              f"tools: arguments {dict(call.function.arguments)} validate, content empty")
        history = ask + [{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": dict(call.function.arguments)}}]},
            {"role": "tool", "tool_name": "get_weather", "content": "18 degrees, light rain"}]
        r2 = c.chat(model=name, messages=history, tools=tools,
                    options={"temperature": 0, "num_predict": 256})
        check(r2.message.content != "" or r2.message.tool_calls,
              f"tools: the turn after the result answers ({r2.message})")
    else:
        # auto: the model may answer in text (then it is the content, not the answer's JSON)
        check(r.done_reason == "stop" and r.message.content
              and not r.message.content.startswith('{'),
              f"tools: a text answer is its content ({r.message.content!r})")
    streamed_calls, streamed_text = [], ""
    for part in c.chat(model=name, messages=ask, tools=tools, stream=True,
                       options={"temperature": 0, "num_predict": 256}):
        streamed_calls += part.message.tool_calls or []
        streamed_text += part.message.content or ""
    check([(t.function.name, dict(t.function.arguments)) for t in streamed_calls]
          == [(t.function.name, dict(t.function.arguments)) for t in calls]
          and streamed_text == r.message.content,
          "tools: streamed, the same calls and text as the whole answer")
    ok, why = refused(lambda: c.chat(model=name, messages=ask, tools=tools, format="json"), 400,
                      ["format"])
    check(ok, f"tools with format: 400 naming format ({why})")
    ok, why = refused(lambda: c.chat(model=name, messages=ask, tools=[
        {"type": "function", "function": {"name": "bad name"}}]), 400, ["tools[0].name"])
    check(ok, f"a bad tool name: 400 naming it ({why})")

    # overload: with 2 slots busy and 2 queued, the next call is a 429 the client raises
    long = {"num_predict": 400, "temperature": 0}
    story = [{"role": "user", "content": "Tell me a very long story about the sea."}]
    errors = []

    def busy():
        try:
            c.chat(model=name, messages=story, options=long)
        except ollama.ResponseError as e:
            errors.append(e.status_code)

    threads = [threading.Thread(target=busy) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(429 in errors, f"overload: a full queue is a 429 ({errors})")
    print("all ollama client checks passed")


if __name__ == "__main__":
    main()
