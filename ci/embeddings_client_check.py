#!/usr/bin/env python3
"""Drives a running orchestratord's embedding and rerank routes with the official clients
(EMB-API-1..4): `openai` (`embeddings.create`, float and base64 — the SDK asks for base64
by default and decodes it), `ollama` (`embed`, and the older `embeddings`), and a Cohere-shaped
rerank request over plain HTTP. Every check asserts what a user of the client would notice;
the first failure exits non-zero with the reason.

Run by orchestratord/tests/embeddings.rs against a server with all-MiniLM-L6-v2 (pool alias
`minilm`) and the tiny reranker (`reranker`):
    PYTHONPATH=.cache/pydeps python3 ci/embeddings_client_check.py --host http://127.0.0.1:PORT
"""
import argparse
import json
import math
import sys
import urllib.request

import ollama
import openai

DIMS = 384


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.splitlines()[0][:120]}")


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / (norm(a) * norm(b))


def post(host, path, body):
    req = urllib.request.Request(host + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    host = ap.parse_args().host
    texts = ["The sea is calm tonight.", "A quiet ocean under the moon.",
             "Interest rates rose by a quarter point."]

    # openai: floats, and base64 (the SDK's default, decoded by it)
    client = openai.OpenAI(base_url=host + "/v1", api_key="none", max_retries=0)
    floats = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    check(len(floats.data) == 3 and [d.index for d in floats.data] == [0, 1, 2],
          f"openai: one embedding per input, by index: {[d.index for d in floats.data]}")
    vecs = [d.embedding for d in floats.data]
    check(all(len(v) == DIMS for v in vecs), f"openai: {DIMS} dimensions")
    check(all(abs(norm(v) - 1.0) < 1e-4 for v in vecs), "openai: unit length")
    near, far = cosine(vecs[0], vecs[1]), cosine(vecs[0], vecs[2])
    check(near > far + 0.2, f"openai: the two sea sentences are nearer ({near:.3f}) than the rates one ({far:.3f})")
    check(floats.usage.prompt_tokens > 10 and floats.usage.total_tokens == floats.usage.prompt_tokens,
          f"openai: usage {floats.usage}")
    sdk_default = client.embeddings.create(model="minilm", input=texts)
    b64 = [d.embedding for d in sdk_default.data]
    check(all(max(abs(x - y) for x, y in zip(a, b)) < 1e-6 for a, b in zip(vecs, b64)),
          "openai: base64 (the SDK's default) decodes to the float vectors")
    short = client.embeddings.create(model="minilm", input="The sea is calm tonight.", dimensions=64,
                                     encoding_format="float")
    v = short.data[0].embedding
    check(len(v) == 64 and abs(norm(v) - 1.0) < 1e-4, "openai: dimensions 64, renormalized")
    ids = client.embeddings.create(model="minilm", input=[[101, 1996, 2712, 102]],
                                   encoding_format="float")
    check(len(ids.data[0].embedding) == DIMS and ids.usage.prompt_tokens == 4,
          "openai: token ids as input, counted as given")
    try:
        client.embeddings.create(model="minilm", input=" ".join(["word"] * 600))
        check(False, "openai: an input over 512 tokens is refused")
    except openai.BadRequestError as e:
        body = e.body or {}
        check(body.get("param") == "input[0]" and "512" in body.get("message", ""),
              f"openai: an input over the model's 512 tokens is a 400 naming it: {body}")
    try:
        client.embeddings.create(model="no-such-model", input="x")
        check(False, "openai: an unknown model is refused")
    except openai.NotFoundError:
        check(True, "openai: an unknown model is a 404")

    # ollama: embed (normalized, truncating by default) and the older embeddings (raw)
    oc = ollama.Client(host=host)
    r = oc.embed(model="minilm", input=texts)
    check(len(r.embeddings) == 3 and all(len(e) == DIMS for e in r.embeddings),
          "ollama: embed gives one vector per input")
    check(max(abs(x - y) for x, y in zip(r.embeddings[0], vecs[0])) < 1e-5,
          "ollama: the same vector as OpenAI's route")
    check(r.prompt_eval_count == floats.usage.prompt_tokens and r.total_duration > 0,
          f"ollama: prompt_eval_count {r.prompt_eval_count}, durations")
    long = oc.embed(model="minilm", input=" ".join(["word"] * 600))
    check(len(long.embeddings[0]) == DIMS and long.prompt_eval_count == 512,
          f"ollama: a long input is cut to the model's 512 tokens by default ({long.prompt_eval_count})")
    try:
        oc.embed(model="minilm", input=" ".join(["word"] * 600), truncate=False)
        check(False, "ollama: truncate false refuses a long input")
    except ollama.ResponseError as e:
        check(e.status_code == 400 and "512" in e.error, f"ollama: truncate false: 400 ({e.error})")
    shown = oc.show("minilm")
    check(list(shown.capabilities or []) == ["embedding"],
          f"ollama: show says the encoder's capability is embedding ({shown.capabilities})")
    old = oc.embeddings(model="minilm", prompt=texts[0])
    raw = old.embedding
    check(len(raw) == DIMS and abs(norm(raw) - 1.0) > 1e-3,
          f"ollama: /api/embeddings gives the raw vector (norm {norm(raw):.3f})")
    check(cosine(raw, vecs[0]) > 0.99999, "ollama: the raw vector points where the normalized one does")

    # rerank, Cohere's and Jina's shape
    docs = ["hi", "The giant panda is a bear species endemic to China.", "Paris is in France."]
    status, body = post(host, "/v1/rerank", {"model": "reranker", "query": "What is a panda?",
                                             "documents": docs, "top_n": 2, "return_documents": True})
    check(status == 200, f"rerank: 200 ({status} {body})")
    res = body["results"]
    check(len(res) == 2 and res[0]["relevance_score"] >= res[1]["relevance_score"],
          f"rerank: top_n 2, best first: {res}")
    check(all(r["document"]["text"] == docs[r["index"]] for r in res), "rerank: documents returned")
    status, all_of = post(host, "/rerank", {"model": "reranker", "query": "What is a panda?",
                                            "documents": docs})
    check(status == 200 and len(all_of["results"]) == 3 and "document" not in all_of["results"][0],
          "rerank: every document without top_n, no text unless asked")
    check(all_of["usage"]["prompt_tokens"] > 0, "rerank: usage counts the pairs' tokens")
    status, body = post(host, "/v1/rerank", {"model": "minilm", "query": "q", "documents": ["d"]})
    check(status == 400 and body["error"]["param"] == "model",
          f"rerank: a model without a classification head is a 400 naming model ({body})")
    status, body = post(host, "/v1/rerank", {"model": "reranker", "query": "q", "documents": []})
    check(status == 400 and body["error"]["param"] == "documents", f"rerank: no documents ({body})")
    print("all embedding client checks passed")


if __name__ == "__main__":
    main()
