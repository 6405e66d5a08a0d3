#!/usr/bin/env python3
"""Tiny random-weight GGUFs of the architectures the engine serves beside its real test models,
written with the `gguf` package (the metadata keys llama.cpp reads), and llama.cpp's greedy
reference on them (ENG-ARCH-2).

    PYTHONPATH=.cache/pydeps python3 ci/tiny_models.py write DIR
        writes DIR/tiny-<arch>.gguf for each architecture below (deterministic: the same bytes
        on every machine; the fixture records their sha256)
    PYTHONPATH=<llama-cpp-python> python3 ci/tiny_models.py reference DIR
        writes engine-candle/tests/fixtures/llama_cpp_tiny.json

Each has two layers, small widths and a real tokenizer (SmolLM2's byte-level BPE, copied from
the default model, `.cache/models`). What each one exercises:
- tiny-llama: grouped-query attention, Llama 3.1 RoPE frequency factors (`rope_freqs.weight`);
- tiny-qwen3: per-head q/k RMS norms, heads wider than the embedding's share
  (`attention.key_length` 32 with 64-wide embeddings over 4 heads), NeoX RoPE;
- tiny-phi3: fused query/key/value (`attn_qkv`) and gate/up (`ffn_up` of twice the rows)
  weights, NeoX RoPE;
- tiny-gemma2: attention-score and final-logit soft-capping (2 and 20, so that they bite),
  local layers every other one with an 8-position window (the prompts reach past it),
  post-attention and post-feed-forward norms, GeGLU, √n_embd input scaling, the output tied
  to the embeddings.
"""
ARCHS = ("llama", "qwen3", "phi3", "gemma2")
import hashlib
import json
import os
import sys

import numpy as np
import gguf

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOKENIZER_FROM = os.path.join(ROOT, ".cache", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
FIXTURE = os.path.join(ROOT, "engine-candle", "tests", "fixtures", "llama_cpp_tiny.json")
PROMPTS = ["The capital of France is", "def add(a, b):", "1, 2, 3, 4,", "Once upon a time"]
N_TOKENS = 16
N_EMBD, N_FF, N_HEAD, N_KV, N_LAYER = 64, 128, 4, 2, 2


def field(r, key):
    f = r.fields[key]
    if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    if key == "tokenizer.ggml.token_type":
        return [int(f.parts[i][0]) for i in f.data]
    return f.contents()


def q8(w, name, writer):
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)


def write(arch, path):
    src = gguf.GGUFReader(TOKENIZER_FROM)
    tokens = field(src, "tokenizer.ggml.tokens")
    rng = np.random.default_rng({"llama": 1234, "qwen3": 5678, "phi3": 9012, "gemma2": 3456}[arch])
    head_dim = 32 if arch in ("qwen3", "gemma2") else 16
    w = gguf.GGUFWriter(path, arch)
    # (not "phi3": llama.cpp gives Phi-3 tokens attributes by the model name)
    w.add_name(f"tiny {ARCHS.index(arch)}")
    w.add_block_count(N_LAYER)
    w.add_context_length(512)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    if arch != "phi3":  # Phi-3's converter writes no key length: the embedding's share
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0 if arch == "llama" else 1000000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(field(src, "tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types(field(src, "tokenizer.ggml.token_type"))
    w.add_token_merges(field(src, "tokenizer.ggml.merges"))
    w.add_bos_token_id(int(field(src, "tokenizer.ggml.bos_token_id")))
    w.add_eos_token_id(int(field(src, "tokenizer.ggml.eos_token_id")))
    w.add_add_bos_token(False)
    w.add_chat_template(field(src, "tokenizer.chat_template"))
    if arch == "gemma2":
        w.add_sliding_window(8)
        w.add_attn_logit_softcapping(2.0)
        w.add_final_logit_softcapping(20.0)

    def normal(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    # embeddings large enough that the logits have clear margins (random weights otherwise
    # give near ties everywhere)
    q8(normal(len(tokens), N_EMBD, scale=1.0), "token_embd.weight", w)
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    if arch != "gemma2":  # Gemma 2's output is its embeddings
        q8(normal(len(tokens), N_EMBD, scale=0.5), "output.weight", w)
    if arch == "llama":
        # Llama 3.1's long-context factors: high frequencies kept, low ones slowed
        w.add_tensor("rope_freqs.weight", np.linspace(1.0, 8.0, head_dim // 2, dtype=np.float32))
    for i in range(N_LAYER):
        p = f"blk.{i}"
        w.add_tensor(f"{p}.attn_norm.weight", norm(N_EMBD))
        if arch == "phi3":
            q8(normal((N_HEAD + 2 * N_KV) * head_dim, N_EMBD, scale=0.25), f"{p}.attn_qkv.weight", w)
        else:
            q8(normal(N_HEAD * head_dim, N_EMBD, scale=0.25), f"{p}.attn_q.weight", w)
            q8(normal(N_KV * head_dim, N_EMBD, scale=0.25), f"{p}.attn_k.weight", w)
            q8(normal(N_KV * head_dim, N_EMBD, scale=0.25), f"{p}.attn_v.weight", w)
        q8(normal(N_EMBD, N_HEAD * head_dim, scale=0.15), f"{p}.attn_output.weight", w)
        if arch == "qwen3":
            w.add_tensor(f"{p}.attn_q_norm.weight", norm(head_dim))
            w.add_tensor(f"{p}.attn_k_norm.weight", norm(head_dim))
        if arch == "gemma2":
            # as large as the √n_embd-scaled embeddings, so the layers count for something
            w.add_tensor(f"{p}.post_attention_norm.weight", 8.0 * norm(N_EMBD))
            w.add_tensor(f"{p}.post_ffw_norm.weight", 8.0 * norm(N_EMBD))
        w.add_tensor(f"{p}.ffn_norm.weight", norm(N_EMBD))
        if arch == "phi3":
            q8(normal(2 * N_FF, N_EMBD, scale=0.2), f"{p}.ffn_up.weight", w)
        else:
            q8(normal(N_FF, N_EMBD, scale=0.2), f"{p}.ffn_gate.weight", w)
            q8(normal(N_FF, N_EMBD, scale=0.2), f"{p}.ffn_up.weight", w)
        q8(normal(N_EMBD, N_FF, scale=0.15), f"{p}.ffn_down.weight", w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def reference(d):
    from llama_cpp import Llama
    models = []
    for arch in ARCHS:
        path = os.path.join(d, f"tiny-{arch}.gguf")
        llm = Llama(model_path=path, n_ctx=256, n_threads=2, logits_all=True, verbose=False,
                    type_k=0, type_v=0)
        cases = []
        for text in PROMPTS:
            ids = llm.tokenize(text.encode(), add_bos=True, special=True)
            llm.reset()
            llm.eval(ids)
            out, margins, seconds = [], [], []
            for _ in range(N_TOKENS):
                logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
                order = np.argsort(-logits)
                out.append(int(order[0]))
                seconds.append(int(order[1]))
                margins.append(round(float(logits[order[0]] - logits[order[1]]), 4))
                llm.eval([out[-1]])
            cases.append({"user_text": text, "prompt": text, "prompt_ids": ids,
                          "greedy_ids": out, "top2_margins": margins, "second_ids": seconds})
            print(arch, text, "->", repr(llm.detokenize(out)[:40]), min(margins), file=sys.stderr)
        models.append({"file": f"tiny-{arch}.gguf", "sha256": sha256(path), "n_tokens": N_TOKENS,
                       "cases": cases})
    meta = {"generator": "ci/tiny_models.py", "llama_cpp_python": __import__("llama_cpp").__version__,
            "models": models}
    with open(FIXTURE, "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main():
    cmd, d = sys.argv[1], sys.argv[2]
    os.makedirs(d, exist_ok=True)
    if cmd == "write":
        for arch in ARCHS:
            path = os.path.join(d, f"tiny-{arch}.gguf")
            write(arch, path + ".part")
            os.replace(path + ".part", path)
            print(path, sha256(path))
    else:
        reference(d)


if __name__ == "__main__":
    main()
