#!/usr/bin/env python3
"""Independent reference forward pass of a Llama-family GGUF model, in numpy.

Shares no code with tandem: weights are decoded by the `gguf` package's own dequantizers and
every operation is written here from the architecture's definition, computed in float64.
Used by check_logits.py to check tandem's logits; usable alone:

    python3 tests/reference/ref_forward.py MODEL.gguf 1 2 3 --out logits.npy
"""
import argparse
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class RefModel:
    def __init__(self, path):
        r = GGUFReader(path)
        self.fields = r.fields
        arch = self.value("general.architecture")
        self.arch = arch

        def num(key, default=None):
            v = self.value(f"{arch}.{key}")
            return default if v is None else v

        self.n_embd = int(num("embedding_length"))
        self.n_layer = int(num("block_count"))
        self.n_head = int(num("attention.head_count"))
        self.n_kv_head = int(num("attention.head_count_kv", self.n_head))
        self.head_dim = int(num("attention.key_length", self.n_embd // self.n_head))
        self.rope_dim = int(num("rope.dimension_count", self.head_dim))
        self.rope_base = float(num("rope.freq_base", 10000.0))
        self.eps = float(num("attention.layer_norm_rms_epsilon", 1e-5))
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float32)
            shape = [int(d) for d in reversed(t.shape)]  # GGUF lists the row length first
            self.w[t.name] = a.reshape(shape)
        self.out_w = self.w.get("output.weight", self.w["token_embd.weight"])

    def value(self, key):
        f = self.fields.get(key)
        if f is None:
            return None
        v = f.contents()
        return v

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        # x: [T, heads, head_dim]; rotates adjacent pairs (2i, 2i+1) of the first rope_dim dims.
        half = self.rope_dim // 2
        freq = self.rope_base ** (-2.0 * np.arange(half) / self.rope_dim)
        if "rope_freqs.weight" in self.w:
            freq = freq / self.w["rope_freqs.weight"].astype(np.float64)
        ang = pos[:, None] * freq[None, :]  # [T, half]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        a = x[..., 0:self.rope_dim:2]
        b = x[..., 1:self.rope_dim:2]
        out[..., 0:self.rope_dim:2] = a * c - b * s
        out[..., 1:self.rope_dim:2] = a * s + b * c
        return out

    def forward(self, tokens):
        """Logits of every position, [T, n_vocab], float64."""
        T = len(tokens)
        pos = np.arange(T, dtype=np.float64)
        x = self.w["token_embd.weight"][tokens].astype(np.float64)
        hd, nh, nkv = self.head_dim, self.n_head, self.n_kv_head
        mask = np.triu(np.full((T, T), -np.inf), k=1)
        for l in range(self.n_layer):
            W = lambda n: self.w[f"blk.{l}.{n}.weight"].astype(np.float64)
            h = self.rmsnorm(x, W("attn_norm"))
            q = self.rope((h @ W("attn_q").T).reshape(T, nh, hd), pos)
            k = self.rope((h @ W("attn_k").T).reshape(T, nkv, hd), pos)
            v = (h @ W("attn_v").T).reshape(T, nkv, hd)
            rep = nh // nkv
            k = np.repeat(k, rep, axis=1)
            v = np.repeat(v, rep, axis=1)
            att = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
            att = np.exp(att - att.max(axis=-1, keepdims=True))
            att /= att.sum(axis=-1, keepdims=True)
            o = np.einsum("hts,shd->thd", att, v).reshape(T, nh * hd)
            x = x + o @ W("attn_output").T
            h = self.rmsnorm(x, W("ffn_norm"))
            g = h @ W("ffn_gate").T
            u = h @ W("ffn_up").T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ W("ffn_down").T
        x = self.rmsnorm(x, self.w["output_norm.weight"].astype(np.float64))
        return x @ self.out_w.astype(np.float64).T


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("tokens", type=int, nargs="+")
    ap.add_argument("--out", help="write [T, n_vocab] float32 logits as .npy")
    a = ap.parse_args()
    logits = RefModel(a.model).forward(np.array(a.tokens))
    if a.out:
        np.save(a.out, logits.astype(np.float32))
    print("argmax per position:", " ".join(str(i) for i in logits.argmax(axis=-1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
