#!/usr/bin/env python3
"""Write the Llama-3.2-1B-shaped model of the tensor-parallel measurements as Q4_0 directly.

Usage: python3 bench/tp_model.py OUT.gguf [SHAPE]   (SHAPE: llama-1b, as ../shared/tools/make_gguf.py)
make_gguf.py's file (its vocabulary, keys and tensor names), with every matrix written as random
Q4_0 blocks (scale 0.02/8, random nibbles) instead of F16 that a quantizer then reads: no
llama.cpp build needed, and a fraction of the memory (731 MiB, not 2.5 GB of F16).
"""
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "shared", "tools"))
import make_gguf  # noqa: E402

Q4_0 = gguf.GGMLQuantizationType.Q4_0
real_default_rng = np.random.default_rng
rng = real_default_rng(4321)
real_add_tensor = gguf.GGUFWriter.add_tensor


def add_tensor(self, name, tensor, *args, **kwargs):
    if tensor.ndim != 2 or tensor.dtype != np.float16:
        return real_add_tensor(self, name, tensor, *args, **kwargs)
    rows, cols = tensor.shape
    blocks = rng.integers(0, 256, size=(rows, cols // 32, 18), dtype=np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(0.02 / 8).tobytes(), dtype=np.uint8)
    return real_add_tensor(self, name, blocks.reshape(rows, cols // 32 * 18), raw_dtype=Q4_0)


class Cheap:
    """Skips make_gguf's normal draws for matrices (their values are replaced anyway)."""

    def __init__(self, seed):
        self.real = real_default_rng(seed)

    def standard_normal(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype=dtype)

    def __getattr__(self, k):
        return getattr(self.real, k)


gguf.GGUFWriter.add_tensor = add_tensor
make_gguf.np.random.default_rng = Cheap
make_gguf.main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "llama-1b")
