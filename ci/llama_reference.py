#!/usr/bin/env python3
"""Greedy reference continuations from llama.cpp (llama-cpp-python) for engine-candle's
correctness tests. Writes engine-candle/tests/fixtures/llama_cpp_greedy.json, or OUT.

Made with llama-cpp-python 0.3.36 built from its PyPI sdist (CMAKE_ARGS="-DGGML_NATIVE=ON
-DGGML_AMX=OFF", pip install --target DIR, then PYTHONPATH=DIR):
    python3 ci/llama_reference.py .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 ci/llama_reference.py .cache/models/gemma-3-270m-q4_k_m.gguf \
        engine-candle/tests/fixtures/llama_cpp_greedy_gemma3.json --long

A model without `tokenizer.chat_template` (the Gemma 3 270M GGUF) gets Gemma's turns, as the
engine's fallback renders them. `--long` adds a prompt longer than 512 tokens, the sliding
window of Gemma 3's local layers.

For each prompt it records llama.cpp's prompt token ids (checks our tokenizer too), the first
24 greedy token ids, their text, the margin between the best and second-best logit at each
step, and the 8 best tokens with their logits' gaps below the best (a small gap explains a
divergence that comes from rounding, not a bug: another CPU's kernels may pick any token
llama.cpp itself scored within a few tenths of its best).
"""
import hashlib
import json
import os
import sys

import jinja2
import numpy as np
import llama_cpp
from llama_cpp import Llama

N_TOKENS = 24
TOP_K = 8
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


# Gemma's turns (the engine's GEMMA_FALLBACK, for a user message; BOS from the tokenizer)
GEMMA_TURNS = "<start_of_turn>user\n{{ messages[0]['content'] | trim }}<end_of_turn>\n<start_of_turn>model\n"


def long_prompt():
    """About 800 tokens of lines that vary, so each line's words are found only far back."""
    colours = ["red", "green", "blue", "yellow", "purple", "orange", "black"]
    animals = ["fox", "dog", "cat", "horse", "rabbit", "goat", "owl", "bear", "duck"]
    things = ["fence", "river", "wall", "bridge", "hill"]
    lines = [f"Line {i}: the {colours[i % 7]} {animals[i % 9]} jumps over the {things[i % 5]}."
             for i in range(1, 56)]
    return "\n".join(lines) + "\nLine 56: the"


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    model = args[0]
    out = args[1] if len(args) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "engine-candle", "tests", "fixtures", "llama_cpp_greedy.json")
    # f32 KV cache: llama.cpp defaults to f16, which rounds keys and values; f32 is the exact
    # reference our f32 cache is compared with.
    llm = Llama(model_path=model, n_ctx=1024, n_threads=2, logits_all=True, verbose=False,
                type_k=0, type_v=0)
    template = jinja2.Environment(keep_trailing_newline=True).from_string(
        llm.metadata.get("tokenizer.chat_template", GEMMA_TURNS))
    prompts = PROMPTS + ([{"kind": "raw", "text": long_prompt()}] if "--long" in sys.argv else [])
    cases = []
    for p in prompts:
        if p["kind"] == "chat":
            text = template.render(messages=[{"role": "user", "content": p["text"]}],
                                   add_generation_prompt=True)
        else:
            text = p["text"]
        # BOS where the model wants one (llama.cpp adds it only then)
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        out_ids, margins, seconds, top_ids, top_gaps = [], [], [], [], []
        for _ in range(N_TOKENS):
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            order = np.argsort(-logits)
            best, second = int(order[0]), int(order[1])
            margins.append(round(float(logits[best] - logits[second]), 4))
            seconds.append(second)
            top_ids.append([int(t) for t in order[:TOP_K]])
            top_gaps.append([round(float(logits[best] - logits[t]), 4) for t in order[:TOP_K]])
            out_ids.append(best)
            if llama_cpp.llama_vocab_is_eog(llm._model.vocab, best):
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
            "top_ids": top_ids,
            "top_gaps": top_gaps,
        })
        print(p["text"][:40], "->", repr(cases[-1]["greedy_text"][:60]), file=sys.stderr)
    meta = {
        "generator": "ci/llama_reference.py",
        "llama_cpp_python": __import__("llama_cpp").__version__,
        "model_sha256": hashlib.sha256(open(model, "rb").read()).hexdigest(),
        "n_tokens": N_TOKENS,
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
