#!/usr/bin/env python3
"""Drives a running orchestratord with the official `openai` Python package (ADP-OAI-3).

Run by orchestratord/tests/openai_sdk.rs against a server with the real default model (context
2048), one
pool of 2 slots and a queue of 2. Every check asserts what a user of the SDK would notice;
the first failure exits non-zero with the reason.

    PYTHONPATH=.cache/pydeps python3 ci/openai_sdk_check.py --base-url http://127.0.0.1:PORT/v1
"""
import argparse
import json
import sys
import threading
import time
import urllib.request

import openai

QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.splitlines()[0][:120]}")


def queue_depth(base_url):
    """Queued tasks, from the server's /metrics."""
    root = base_url.rsplit("/v1", 1)[0]
    with urllib.request.urlopen(f"{root}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("orchd_queue_depth{"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=120)

    models = [m.id for m in client.models.list()]
    check(len(models) == 1, f"models.list names the served model: {models}")
    model = models[0]

    # chat, not streamed
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=32, temperature=0)
    answer = r.choices[0].message.content
    check(r.object == "chat.completion" and r.choices[0].message.role == "assistant", "chat completion shape")
    check("Paris" in answer, f"the answer mentions Paris: {answer!r}")
    check(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason {r.choices[0].finish_reason}")
    u = r.usage
    check(u.completion_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage adds up: {u}")

    # chat, streamed, with usage: same greedy text, one chunk per token
    stream = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=32, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, finish, roles = [], None, None, 0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles += 1
            elif c.delta.content is not None and c.finish_reason is None:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    streamed = "".join(pieces)
    check(roles == 1, "the role comes once, in the first chunk")
    check(streamed == answer, f"streamed text equals the non-streamed answer: {streamed!r}")
    check(finish == r.choices[0].finish_reason, f"streamed finish_reason {finish}")
    check(usage is not None and usage.completion_tokens == len(pieces),
          f"usage.completion_tokens ({usage and usage.completion_tokens}) equals the tokens streamed ({len(pieces)})")
    check(usage.prompt_tokens == u.prompt_tokens, "same prompt, same prompt_tokens")

    # content as an array of parts (LangChain, Open WebUI): the same prompt, the same answer
    parts = [QUESTION[0], {"role": "user", "content": [{"type": "text", "text": QUESTION[1]["content"]}]}]
    r2 = client.chat.completions.create(model=model, messages=parts, max_tokens=32, temperature=0)
    check(r2.choices[0].message.content == answer, "text parts read as the string content")
    try:
        client.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}])
        check(False, "an image part is refused")
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(e.status_code == 400 and body.get("param") == "messages[0].content[1]"
              and "image_url" in body.get("message", ""), f"an image part is a 400 naming it: {e.body}")

    # one model by name: its context length and owner
    m = client.models.retrieve(model)
    check(m.id == model and m.owned_by == "orchestratord", f"models.retrieve: {m}")
    check(getattr(m, "max_model_len", None) == 2048, f"the model's context length: {m}")
    try:
        client.models.retrieve("no-such-model")
        check(False, "an unknown model is not found")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"an unknown model is a NotFoundError: {e.body}")

    # stop sequence: generation stops before it, and it is not emitted
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=32, temperature=0, stop=["Paris"])
    stopped = r.choices[0].message.content
    check("Paris" not in stopped and r.choices[0].finish_reason == "stop", f"stopped at the stop sequence: {stopped!r}")
    check(answer.startswith(stopped) and len(stopped) < len(answer), "the stopped text is the answer up to the stop sequence")

    # completions with an array prompt: one choice per prompt, each as if asked alone
    prompts = ["The capital of France is", "1, 2, 3, 4,"]
    r = client.completions.create(model=model, prompt=prompts, max_tokens=8, temperature=0)
    check(r.object == "text_completion" and [c.index for c in r.choices] == [0, 1], "one choice per prompt, by index")
    for i, p in enumerate(prompts):
        alone = client.completions.create(model=model, prompt=p, max_tokens=8, temperature=0)
        check(r.choices[i].text != "" and r.choices[i].text == alone.choices[0].text,
              f"choice {i} equals the prompt completed alone: {r.choices[i].text!r}")
    check(0 < r.usage.completion_tokens <= 16, f"completion usage sums the choices: {r.usage}")

    # seed reproducibility: same seed and params, same text
    def sampled(seed):
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Tell me a short story."}],
            max_tokens=24, temperature=1.0, seed=seed,
        ).choices[0].message.content
    a, b = sampled(1234), sampled(1234)
    check(a == b and a != "", f"same seed, same text: {a!r}")

    # the Responses API (ADP-OAI-7), stateless: the same greedy answer as chat; streamed events
    # in order; the SDK's stream helper; text.format; what a stateless server refuses
    resp = client.responses.create(model=model, input=QUESTION, max_output_tokens=32,
                                   temperature=0)
    check(resp.object == "response" and resp.output_text == answer
          and resp.output[0].role == "assistant" and resp.usage.output_tokens > 0
          and resp.status in ("completed", "incomplete"),
          f"responses.create: the chat answer, as a response ({resp.status})")
    events = list(client.responses.create(model=model, input="What is the capital of France?",
                                          max_output_tokens=8, temperature=0, stream=True))
    kinds = [e.type for e in events]
    check(kinds[:4] == ["response.created", "response.in_progress",
                        "response.output_item.added", "response.content_part.added"]
          and kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                             "response.output_item.done", "response.completed"]
          and set(kinds[4:-4]) == {"response.output_text.delta"}
          and [e.sequence_number for e in events] == list(range(len(events))),
          f"responses stream: the event sequence, numbered ({len(events)} events)")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check(events[-1].response.output_text == deltas and events[-1].response.status == "incomplete"
          and events[-1].response.incomplete_details.reason == "max_output_tokens",
          "responses stream: the deltas make the final text; cut by max_output_tokens")
    with client.responses.stream(model=model, input="Say hello.", max_output_tokens=16,
                                 temperature=0) as st:
        final = st.get_final_response()
    check(len(final.output_text) > 0, f"responses.stream helper: {final.output_text!r}")
    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"], "additionalProperties": False}
    shaped = client.responses.create(model=model, input="Name a city.", max_output_tokens=40,
                                     text={"format": {"type": "json_schema", "name": "c",
                                                      "schema": city}})
    check(list(json.loads(shaped.output_text)) == ["city"],
          f"responses text.format: JSON under the schema ({shaped.output_text})")
    for kw, param in [({"store": True}, "store"), ({"previous_response_id": "resp_1"},
                                                   "previous_response_id"),
                      ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]},
                       "input[0]")]:
        try:
            client.responses.create(**{"model": model, "input": "x", "max_output_tokens": 2,
                                       **kw})
            check(False, f"{param} refused")
        except openai.BadRequestError as e:
            check(e.body["param"] == param, f"responses: {param} refused by name")

    # overload: 2 slots busy + 2 queued, the next request is a RateLimitError
    hold = threading.Event()
    started = []

    def long_stream():
        s = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Count to one thousand."}],
            max_tokens=1000, temperature=0, stream=True,
        )
        started.append(1)
        for _ in s:
            if hold.is_set():
                break
        s.close()

    threads = [threading.Thread(target=long_stream, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    # a stream's response begins with its first token: two begin, two wait in the queue
    # (seen in the server's queue depth)
    deadline = time.time() + 60
    while not (len(started) == 2 and queue_depth(args.base_url) == 2) and time.time() < deadline:
        time.sleep(0.05)
    check(len(started) == 2 and queue_depth(args.base_url) == 2,
          "four long requests admitted (2 streaming, 2 queued)")
    try:
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4)
        check(False, "a fifth request is refused")
    except openai.RateLimitError as e:
        retry_after = e.response.headers.get("retry-after")
        check(e.status_code == 429 and retry_after is not None and int(retry_after) >= 1,
              f"RateLimitError with Retry-After {retry_after}")
        body = e.body if isinstance(e.body, dict) else {}
        check(body.get("type") == "rate_limit_error" or body.get("code") == "ADMISSION_REJECT",
              f"error body {e.body}")
    hold.set()
    for t in threads:
        t.join(timeout=60)
    # the disconnects freed the server: it answers again
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, temperature=0)
    check(r.choices[0].message.content != "", "serves again once the streams were closed")
    print("all SDK checks passed")


if __name__ == "__main__":
    main()
