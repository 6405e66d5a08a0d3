#!/usr/bin/env python3
"""ggml's own K-quant dot products, recorded for engine-candle's bit-identity tests
(`engine-candle/src/kquant_parity.rs`). Writes engine-candle/tests/fixtures/ggml_kquant_dots.json,
or OUT.

Calls the CPU backend of llama-cpp-python 0.3.36 (built from its PyPI sdist as
ci/llama_reference.py says; PYTHONPATH=DIR) through ctypes: for Q4_K, Q5_K and Q6_K, random weight
rows (random bytes with finite f16 scales) and random activations, ggml's `from_float` of the
activation type (Q8_K) and its `vec_dot`, the function llama.cpp's matmuls call per row. The
fixture keeps the weight bytes, the activations and the result's f32 bits.
    python3 ci/ggml_kquant_reference.py
"""
import ctypes
import json
import os
import random
import struct
import sys

import llama_cpp

LIB = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
ggml = ctypes.CDLL(os.path.join(LIB, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(os.path.join(LIB, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)

FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
)


class Traits(ctypes.Structure):
    # struct ggml_type_traits_cpu (ggml-cpu.h)
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)
cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
cpu.ggml_cpu_init.restype = None
cpu.ggml_cpu_init()

Q4_K, Q5_K, Q6_K, Q8_K = 12, 13, 14, 15
Q8_K_BYTES = 4 + 256 + 32  # d (f32), qs, bsums


def f16(x):
    return struct.pack("<e", x)


def block(kind, rng):
    if kind in (Q4_K, Q5_K):
        # d, dmin, 12 bytes of 6-bit scales and minimums, (Q5_K: 32 bytes of fifth bits,)
        # 128 bytes of nibbles
        rest = 140 if kind == Q4_K else 172
        return (f16(rng.uniform(1e-4, 2e-2)) + f16(rng.uniform(1e-4, 2e-2))
                + bytes(rng.randrange(256) for _ in range(rest)))
    # ql, qh, signed scales, d
    return bytes(rng.randrange(256) for _ in range(208)) + f16(rng.uniform(1e-4, 2e-2))


def case(kind, blocks, rng, scale):
    n = 256 * blocks
    w = b"".join(block(kind, rng) for _ in range(blocks))
    x = [rng.gauss(0.0, scale) for _ in range(n)]
    traits = cpu.ggml_get_type_traits_cpu(kind).contents
    assert traits.vec_dot_type == Q8_K
    from_float = FROM_FLOAT(cpu.ggml_get_type_traits_cpu(Q8_K).contents.from_float)
    xs = (ctypes.c_float * n)(*x)
    y = ctypes.create_string_buffer(Q8_K_BYTES * blocks)
    from_float(ctypes.addressof(xs), ctypes.addressof(y), n)
    wb = ctypes.create_string_buffer(w, len(w))
    out = ctypes.c_float(0.0)
    VEC_DOT(traits.vec_dot)(n, ctypes.addressof(out), 0, ctypes.addressof(wb), 0,
                            ctypes.addressof(y), 0, 1)
    return {
        "type": {Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k"}[kind],
        "blocks": blocks,
        "weight_hex": w.hex(),
        "x": x,
        "dot_bits": struct.unpack("<I", struct.pack("<f", out.value))[0],
    }


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "engine-candle/tests/fixtures/ggml_kquant_dots.json"
    rng = random.Random(20261126)
    cases = [case(kind, blocks, rng, scale)
             for kind in (Q4_K, Q6_K, Q5_K)
             for blocks, scale in ((1, 1.0), (4, 0.05), (8, 3.0), (3, 20.0))]
    with open(out, "w") as f:
        json.dump({"llama_cpp_python": llama_cpp.__version__, "cases": cases}, f)
    print(f"{out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
