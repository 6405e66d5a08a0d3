#!/usr/bin/env python3
"""Greedy reference continuations from llama.cpp (llama-cpp-python) for engine-candle's
correctness test. Writes engine-candle/tests/fixtures/llama_cpp_greedy.json.

Made with (llama-cpp-python 0.3.36 built from PyPI with AMX off, see ci/llama-cpp.sh):
    python3 ci/llama_reference.py .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf

For each prompt it records llama.cpp's prompt token ids (checks our tokenizer too), the first
24 greedy token ids, their text, and the margin between the best and second-best logit at each
step (small margins explain divergences that come from rounding, not bugs).
"""
import json
import os
import sys

import jinja2
import numpy as np
from llama_cpp import Llama

N_TOKENS = 24
PROMPTS = [
    {"kind": "chat", "text": "What is the capital of France?"},
    {"kind": "chat", "text": "Write a haiku about the sea."},
    {"kind": "chat", "text": "List three colours."},
    {"kind": "raw", "text": "The quick brown fox"},
    {"kind": "raw", "text": "def fibonacci(n):\n"},
    {"kind": "raw", "text": "Once upon a time, in a land far away,"},
    {"kind": "raw", "text": "1, 2, 3, 4, 5,"},
    {"kind": "raw", "text": "Monday, Tuesday, Wednesday,"},
    {"kind": "raw", "text": "January, February, March, April,"},
    {"kind": "raw", "text": "A, B, C, D, E, F,"},
    {"kind": "raw", "text": "for i in range(10):\n"},
    {"kind": "raw", "text": "<html>\n<head>\n"},
    {"kind": "raw", "text": "The capital of France is"},
]


def main():
    model = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(__file__), "..", "engine-candle", "tests", "fixtures", "llama_cpp_greedy.json")
    # f32 KV cache: llama.cpp defaults to f16, which rounds keys and values; f32 is the exact
    # reference our f32 cache is compared with.
    llm = Llama(model_path=model, n_ctx=1024, n_threads=2, logits_all=True, verbose=False,
                type_k=0, type_v=0)
    template = jinja2.Environment().from_string(llm.metadata["tokenizer.chat_template"])
    cases = []
    for p in PROMPTS:
        if p["kind"] == "chat":
            text = template.render(messages=[{"role": "user", "content": p["text"]}],
                                   add_generation_prompt=True)
        else:
            text = p["text"]
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        out_ids, margins, seconds = [], [], []
        for _ in range(N_TOKENS):
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            order = np.argsort(-logits)
            best, second = int(order[0]), int(order[1])
            margins.append(round(float(logits[best] - logits[second]), 4))
            seconds.append(second)
            out_ids.append(best)
            if best == llm.token_eos():
                break
            llm.eval([best])
        cases.append({
            "kind": p["kind"],
            "user_text": p["text"],
            "prompt": text,
            "prompt_ids": ids,
            "greedy_ids": out_ids,
            "greedy_text": llm.detokenize(out_ids).decode("utf-8", errors="replace"),
            "top2_margins": margins,
            "second_ids": seconds,
        })
        print(p["text"][:40], "->", repr(cases[-1]["greedy_text"][:60]), file=sys.stderr)
    meta = {
        "generator": "ci/llama_reference.py",
        "llama_cpp_python": __import__("llama_cpp").__version__,
        "model_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "n_tokens": N_TOKENS,
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
