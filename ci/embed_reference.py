#!/usr/bin/env python3
"""llama.cpp's embeddings and rerank scores on the GGUFs the embedding tests use, recorded once
into engine-candle/tests/fixtures/llama_cpp_embeddings.json (issue 51's parity proof).

Made with llama-cpp-python 0.3.36 built from its PyPI sdist (CMAKE_ARGS="-DGGML_NATIVE=ON
-DGGML_AMX=OFF", pip install --target DIR, then PYTHONPATH=DIR):
    PYTHONPATH=DIR:.cache/pydeps python3 ci/embed_reference.py [OUT]
    PYTHONPATH=DIR:.cache/pydeps python3 ci/embed_reference.py --add MODEL.gguf [OUT]
        (re)records one model's case into the fixture, mean pooling, keeping the others
after `ci/minilm_gguf.py` (the encoder, the tiny reranker and the tiny nomic-bert) and `ci/fetch-model.sh` (the
default decoder).

For each model and pooling it records llama.cpp's token ids of each text (what our tokenizer
must give) and the raw vectors (not normalized) of those ids, each sequence decoded alone: a
vector per text, or per token under pooling none; for the reranker, the score of each query
and document as `[CLS] query [SEP] document [SEP]` (what llama.cpp's own rerank feeds a BERT
reranker), from the ids this script builds. The f32 key/value cache, as the engine's default.
"""
import hashlib
import json
import os
import sys

import llama_cpp
from llama_cpp import Llama

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODELS = os.path.join(ROOT, ".cache", "models")
OUT = os.path.join(ROOT, "engine-candle", "tests", "fixtures", "llama_cpp_embeddings.json")

TEXTS = [
    "This is an example sentence",
    "Each sentence is converted",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings turn text into vectors; similar texts get similar vectors!",
    "Café, naïve, résumé: the uncased tokenizer strips accents.",
    "中文字符 and 日本語 mixed with English words",
    "Numbers 3.14159 and 2026-12-01, mail foo@example.com, a URL https://example.org/a?b=c",
    " ".join(f"Sentence {i} talks about the {w} of the sea." for i, w in enumerate(
        ["colour", "depth", "salt", "tides", "waves", "fish", "storms", "light", "sound",
         "cold", "ships", "sand", "wind", "rocks", "birds", "ice", "heat", "time", "moon",
         "stars", "boats", "nets", "shells", "coral"])),
]

PAIRS = [
    ("What is a panda?", "The giant panda is a bear species endemic to China."),
    ("What is a panda?", "Paris is the capital of France."),
    ("How do tides work?", "Tides are the rise and fall of sea levels caused by the Moon."),
    ("How do tides work?", "hi"),
]

POOLINGS = {
    "none": llama_cpp.LLAMA_POOLING_TYPE_NONE,
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK,
}


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def load(path, pooling):
    return Llama(model_path=path, embedding=True, pooling_type=POOLINGS[pooling], n_ctx=2048,
                 n_batch=2048, n_ubatch=2048, n_threads=2, verbose=False, type_k=0, type_v=0)


def run(llm, ids, pooling):
    """The raw vectors of one sequence decoded alone."""
    n_embd = llm.n_embd()
    llm._batch.reset()
    llm._ctx.kv_cache_clear()
    llm._batch.add_sequence(ids, 0, True)
    llm._ctx.decode(llm._batch)
    if pooling == "none":
        ptr = llama_cpp.llama_get_embeddings(llm._ctx.ctx)
        return [[round(float(x), 5) for x in ptr[j * n_embd:(j + 1) * n_embd]]
                for j in range(len(ids))]
    ptr = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
    width = 1 if pooling == "rank" else n_embd
    return [[round(float(x), 5) for x in ptr[:width]]]


def texts_case(path, poolings):
    out = {"model": os.path.basename(path), "sha256": sha256(path), "poolings": {}}
    for p in poolings:
        llm = load(path, p)
        rows = []
        # a vector per token is long: three texts show it
        for t in TEXTS[:3] if p == "none" else TEXTS:
            ids = llm.tokenize(t.encode(), add_bos=True, special=False)
            rows.append({"text": t, "ids": ids, "vectors": run(llm, ids, p)})
        out["poolings"][p] = rows
        print(os.path.basename(path), p, "dims", len(rows[0]["vectors"][0]), file=sys.stderr)
        del llm
    return out


def rerank_case(path):
    llm = load(path, "rank")
    cls, sep = 101, 102
    rows = []
    for q, d in PAIRS:
        qi = llm.tokenize(q.encode(), add_bos=False, special=False)
        di = llm.tokenize(d.encode(), add_bos=False, special=False)
        ids = [cls] + qi + [sep] + di + [sep]
        rows.append({"query": q, "document": d, "ids": ids, "score": run(llm, ids, "rank")[0][0]})
    return {"model": os.path.basename(path), "sha256": sha256(path), "pairs": rows}


def main():
    args = sys.argv[1:]
    if args[:1] == ["--add"]:
        name, out = args[1], (args[2] if len(args) > 2 else OUT)
        doc = json.load(open(out))
        case = texts_case(os.path.join(MODELS, name), ["mean"])
        doc["texts"] = [c for c in doc["texts"] if c["model"] != name] + [case]
    else:
        out = args[0] if args else OUT
        encoders = [os.path.join(MODELS, f"all-MiniLM-L6-v2.{t}.gguf")
                    for t in ("F32", "F16", "Q8_0", "Q4_0")]
        cases = [texts_case(encoders[0], ["mean", "cls", "none"])]
        cases += [texts_case(p, ["mean"]) for p in encoders[1:]]
        cases.append(texts_case(os.path.join(MODELS, "tiny-nomic-bert.gguf"), ["mean"]))
        cases.append(texts_case(os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf"),
                                ["mean", "last"]))
        doc = {
            "generator": "ci/embed_reference.py",
            "llama_cpp_python": llama_cpp.__version__,
            "texts": cases,
            "rerank": rerank_case(os.path.join(MODELS, "tiny-bert-reranker.gguf")),
        }
    with open(out, "w") as f:
        json.dump(doc, f, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
