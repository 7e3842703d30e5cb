#!/usr/bin/env python3
"""Writes tests/data/quant_vectors.bin: random blocks of each GGUF type tandem computes with,
and their values as decoded by the `gguf` package's dequantize (independent of tandem); and
tests/data/mxfp4_vectors.bin: MXFP4's every scale byte with every code, then floats that the
package's quantize made MXFP4 blocks of.

Format, per record: u32 ggml type id, u32 element count, u32 byte count, the raw blocks,
then element-count float32 values. Regenerate with: python3 tests/reference/make_quant_vectors.py
"""
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

rng = np.random.default_rng(20261202)
N = 512  # elements per record: two K-quant super-blocks, sixteen legacy blocks


def f16(x):
    return np.asarray(x, dtype=np.float16).tobytes()


def blocks(qtype):
    out = b""
    if qtype == Q.F32:
        return rng.standard_normal(N).astype(np.float32).tobytes()
    if qtype == Q.F16:
        return rng.standard_normal(N).astype(np.float16).tobytes()
    if qtype == Q.BF16:
        f = rng.standard_normal(N).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    for _ in range(N // (256 if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 32)):
        if qtype == Q.Q4_0:
            out += f16(rng.uniform(0.01, 0.1)) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
        elif qtype == Q.Q4_1:
            out += f16(rng.uniform(0.01, 0.1)) + f16(rng.uniform(-1, 0)) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
        elif qtype == Q.Q5_0:
            out += f16(rng.uniform(0.01, 0.1)) + rng.integers(0, 256, 20, dtype=np.uint8).tobytes()
        elif qtype == Q.Q5_1:
            out += f16(rng.uniform(0.01, 0.1)) + f16(rng.uniform(-1, 0)) + rng.integers(0, 256, 20, dtype=np.uint8).tobytes()
        elif qtype == Q.Q8_0:
            out += f16(rng.uniform(0.001, 0.01)) + rng.integers(-128, 128, 32, dtype=np.int8).tobytes()
        elif qtype == Q.Q4_K:
            out += f16(rng.uniform(0.001, 0.01)) + f16(rng.uniform(0.001, 0.01))
            out += rng.integers(0, 256, 12, dtype=np.uint8).tobytes() + rng.integers(0, 256, 128, dtype=np.uint8).tobytes()
        elif qtype == Q.Q5_K:
            out += f16(rng.uniform(0.001, 0.01)) + f16(rng.uniform(0.001, 0.01))
            out += rng.integers(0, 256, 12 + 32 + 128, dtype=np.uint8).tobytes()
        elif qtype == Q.MXFP4:  # scales 2^-10 .. 2^-4 (E8M0 118 .. 124, halved): values up to 0.75
            out += bytes([int(rng.integers(118, 125))]) + rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
        elif qtype == Q.Q6_K:
            out += rng.integers(0, 256, 128, dtype=np.uint8).tobytes() + rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
            out += rng.integers(-128, 128, 16, dtype=np.int8).tobytes() + f16(rng.uniform(0.0001, 0.001))
    return out


def record(qtype, raw, n):
    with np.errstate(over="ignore"):  # E8M0 255 with codes past +-1: infinities, as ggml's
        vals = dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32).reshape(-1)
    assert vals.size == n, (qtype, vals.size)
    return struct.pack("<III", int(qtype), n, len(raw)) + raw + vals.tobytes()


def mxfp4_records():
    # Block e: scale byte e; element j code j % 16 (bytes 0x10 * (j % 16) + j % 16: each code in
    # both nibbles), so every scale meets every code, the subnormal (0, 1) and largest (255) too.
    every = b"".join(bytes([e]) + bytes(0x11 * (j % 16) for j in range(16)) for e in range(256))
    # Floats in several ranges (a block each), quantized by the package.
    x = rng.standard_normal(32 * 64).astype(np.float32) * np.repeat(2.0 ** rng.integers(-12, 6, 64), 32).astype(np.float32)
    quantized = quantize(x.reshape(-1, 32), Q.MXFP4).tobytes()
    return record(Q.MXFP4, every, 256 * 32) + record(Q.MXFP4, quantized, x.size)


def main():
    data = os.path.join(os.path.dirname(__file__), "..", "data")
    path = os.path.join(data, "quant_vectors.bin")
    with open(path, "wb") as f:
        for qtype in (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4):
            f.write(record(qtype, blocks(qtype), N))
    print("wrote", os.path.normpath(path))
    path = os.path.join(data, "mxfp4_vectors.bin")
    with open(path, "wb") as f:
        f.write(mxfp4_records())
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
