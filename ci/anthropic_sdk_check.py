#!/usr/bin/env python3
"""Drives a running orchestratord with the official `anthropic` Python SDK (ADP-ANT-1..3).

Run by orchestratord/tests/anthropic_sdk.rs against a server with the real default model, one
pool of 2 slots and a queue of 2. Every check asserts what a user of the SDK would notice;
the first failure exits non-zero with the reason. (The SDK no longer has sampling arguments:
`temperature` goes in `extra_body`, as the API still takes it.)

    PYTHONPATH=.cache/pydeps python3 ci/anthropic_sdk_check.py --base-url http://127.0.0.1:PORT
"""
import argparse
import json
import sys
import threading
import urllib.error
import urllib.request

import anthropic

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.splitlines()[0][:120]}")


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    c = anthropic.Anthropic(base_url=args.base_url, api_key="unused", max_retries=0,
                            timeout=300)
    with urllib.request.urlopen(f"{args.base_url}/v1/models", timeout=10) as r:
        listed = json.load(r)
    model = listed["data"][0]["id"]

    # one message: the same greedy text as the OpenAI route, counts that match count_tokens
    r = c.messages.create(model=model, max_tokens=16, messages=QUESTION, extra_body=GREEDY)
    text = r.content[0].text
    check(r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
          and r.content[0].type == "text" and len(text) > 10,
          f"create: a text message ({text!r})")
    check(r.stop_reason == "max_tokens" and r.usage.output_tokens == 16,
          f"create: stop_reason max_tokens after 16 tokens ({r.stop_reason})")
    counted = c.messages.count_tokens(model=model, messages=QUESTION).input_tokens
    # computed plus read from the cache (a prefix an earlier request left)
    whole = lambda u: u.input_tokens + (u.cache_read_input_tokens or 0)  # noqa: E731
    check(whole(r.usage) == counted and counted > 10,
          f"count_tokens: the input tokens create was charged ({counted}, {r.usage})")
    _, oa = post(f"{args.base_url}/v1/chat/completions",
                 {"model": model, "messages": QUESTION, "max_tokens": 16, "temperature": 0})
    check(oa["choices"][0]["message"]["content"] == text,
          "create: the same greedy text as /v1/chat/completions")

    # streamed: Anthropic's event sequence, the same text
    events = list(c.messages.create(model=model, max_tokens=16, messages=QUESTION,
                                    stream=True, extra_body=GREEDY))
    kinds = [e.type for e in events]
    check(kinds[:2] == ["message_start", "content_block_start"]
          and kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
          and set(kinds[2:-3]) == {"content_block_delta"},
          f"stream: the event sequence ({kinds[:3]} … {kinds[-3:]})")
    # the SDK drops pings: read the wire for them
    raw = urllib.request.Request(
        f"{args.base_url}/v1/messages", headers={"content-type": "application/json"},
        data=json.dumps({"model": model, "max_tokens": 4, "messages": QUESTION,
                         "stream": True}).encode())
    with urllib.request.urlopen(raw, timeout=120) as w:
        wire = w.read().decode()
    names = [ln[len("event: "):] for ln in wire.splitlines() if ln.startswith("event: ")]
    check(names[:3] == ["message_start", "content_block_start", "ping"]
          and w.headers["content-type"].startswith("text/event-stream"),
          f"stream: a ping after the opening, as text/event-stream ({names[:3]})")
    deltas = [e.delta.text for e in events if e.type == "content_block_delta"]
    check(all(e.delta.type == "text_delta" for e in events if e.type == "content_block_delta")
          and "".join(deltas) == text, "stream: text_delta pieces make the same text")
    start, end = events[0].message, events[-2]
    check(whole(start.usage) == counted and start.stop_reason is None
          and end.delta.stop_reason == "max_tokens" and end.usage.output_tokens == 16,
          "stream: message_start's input tokens, message_delta's stop_reason and output tokens")
    with c.messages.stream(model=model, max_tokens=16, messages=QUESTION,
                           extra_body=GREEDY) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    check("".join(pieces) == text and final.content[0].text == text
          and final.stop_reason == "max_tokens",
          "stream helper: text_stream and get_final_message")

    # stop sequences, the end of a turn, system blocks, prefill, metadata
    stopped = c.messages.create(model=model, max_tokens=32, messages=QUESTION,
                                stop_sequences=[","], extra_body=GREEDY)
    check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == ","
          and "," not in stopped.content[0].text,
          f"stop_sequences: stop_reason stop_sequence naming it ({stopped.content[0].text!r})")
    short = c.messages.create(model=model, max_tokens=200, system="Answer in one short sentence.",
                              messages=[{"role": "user", "content": "Say hello."}],
                              extra_body=GREEDY)
    check(short.stop_reason == "end_turn" and short.stop_sequence is None
          and short.usage.output_tokens < 200,
          f"the model ending its turn: end_turn ({short.usage.output_tokens} tokens)")
    blocks = c.messages.create(model=model, max_tokens=16, extra_body=GREEDY,
                               system=[{"type": "text", "text": "Answer in one short sentence."}],
                               messages=[{"role": "user", "content": [
                                   {"type": "text", "text": "Say hello.",
                                    "cache_control": {"type": "ephemeral"}}]}],
                               metadata={"user_id": "alice@example.com"})
    check(blocks.content[0].text == short.content[0].text[:len(blocks.content[0].text)],
          "system and content as blocks read as the strings (cache_control, metadata accepted)")
    prefix = "The capital of France is"
    pre = c.messages.create(model=model, max_tokens=8, extra_body=GREEDY, messages=QUESTION + [
        {"role": "assistant", "content": prefix}])
    check(not pre.content[0].text.startswith(prefix) and "Paris" in pre.content[0].text,
          f"prefill: a final assistant turn is continued ({pre.content[0].text!r})")
    warm = c.messages.create(model=model, max_tokens=0, messages=QUESTION)
    check(warm.content == [] and warm.stop_reason == "max_tokens"
          and whole(warm.usage) == counted and warm.usage.output_tokens == 0,
          "max_tokens 0: nothing generated, the prompt counted")
    check(c.messages.count_tokens(model=model, system="You are terse.", messages=QUESTION)
          .input_tokens != counted, "count_tokens: the system prompt is counted")

    # errors in Anthropic's shape, as the SDK's exception classes
    def refused(call, cls, kind, words):
        try:
            call()
        except cls as e:
            body = e.body if isinstance(e.body, dict) else {}
            err = body.get("error", {})
            ok = body.get("type") == "error" and err.get("type") == kind and all(
                w in err.get("message", "") for w in words)
            return ok, err
        return False, "no error"

    for call, cls, kind, words, what in [
        (lambda: c.messages.create(model="claude-x", max_tokens=8, messages=QUESTION),
         anthropic.NotFoundError, "not_found_error", ["claude-x"], "an unknown model"),
        (lambda: c.messages.create(model=model, max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "aGk="}}]}]),
         anthropic.BadRequestError, "invalid_request_error", ["messages[0].content[0]", "image"],
         "an image block"),
        (lambda: c.messages.create(model=model, max_tokens=8, messages=QUESTION,
                                   extra_body={"temperature": 2}),
         anthropic.BadRequestError, "invalid_request_error", ["temperature"],
         "a temperature over 1"),
        (lambda: c.messages.create(model=model, max_tokens=8, messages=QUESTION + [
            {"role": "assistant", "content": "Paris "}]),
         anthropic.BadRequestError, "invalid_request_error", ["trailing whitespace"],
         "a prefill ending in whitespace"),
        (lambda: c.messages.create(model=model, max_tokens=8, messages=QUESTION,
                                   thinking={"type": "enabled", "budget_tokens": 1024}),
         anthropic.BadRequestError, "invalid_request_error", ["thinking"], "thinking"),
        (lambda: c.messages.create(model=model, max_tokens=8, messages=QUESTION,
                                   extra_body={"top_n": 3}),
         anthropic.BadRequestError, "invalid_request_error", ["top_n"], "an unknown field"),
    ]:
        ok, why = refused(call, cls, kind, words)
        check(ok, f"{what}: {kind} naming it ({why})")
    status, body = post(f"{args.base_url}/v1/messages", {"model": model, "messages": QUESTION})
    check(status == 400 and body["error"]["type"] == "invalid_request_error"
          and "max_tokens" in body["error"]["message"],
          f"max_tokens is required ({body})")

    # overload: with 2 slots busy and 2 queued, the next call is a RateLimitError with a
    # retry-after the SDK reads
    story = [{"role": "user", "content": "Tell me a very long story about the sea."}]
    limited = []

    def busy():
        try:
            c.messages.create(model=model, max_tokens=400, messages=story, extra_body=GREEDY)
        except anthropic.RateLimitError as e:
            limited.append(e.response.headers.get("retry-after"))

    threads = [threading.Thread(target=busy) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(limited and all(h and int(h) >= 1 for h in limited),
          f"overload: RateLimitError with retry-after ({limited})")
    print("all anthropic SDK checks passed")


if __name__ == "__main__":
    main()
