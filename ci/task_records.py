"""The task records of a running orchestratord (`GET /v1/artifacts?kind=task_record`), for the
client checks: Ollama's `prompt_eval_count` counts only the prompt tokens a request evaluated
(those its engine's cache held are not), so a check about the whole prompt a template made
reads it from the request's task record, found by the correlation id the request carried."""
import json
import time
import urllib.request
import uuid

import ollama

HEADER = "x-correlation-id"


def _get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def with_prompt(host, call):
    """Runs `call(client)` — one request through an `ollama.Client` whose requests carry a
    correlation id of their own — and returns (its result, the whole prompt of its task in
    tokens), waiting for the task's record (stored as the task ends)."""
    cid = str(uuid.uuid4())
    out = call(ollama.Client(host=host, timeout=300, headers={HEADER: cid}))
    for _ in range(200):
        page = _get(f"{host}/v1/artifacts?kind=task_record&limit=20")
        for meta in page["artifacts"]:
            record = _get(f"{host}/v1/artifacts/{meta['id']}")
            if record.get("correlation_id") == cid:
                return out, record["prompt_tokens"]
        time.sleep(0.05)
    raise SystemExit(f"FAIL: no task record with correlation id {cid}")
