#!/usr/bin/env python3
"""Independent reference forward pass of a GGUF model of the families tandem runs (llama, qwen2,
qwen3, gemma3, phi3, granite), in numpy.

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


# Families and how llama.cpp runs each (src/models/<arch>.cpp in the peer): RoPE on adjacent pairs
# (GGUF Q/K rows are permuted for it) or on NeoX halves.
NEOX_ROPE = {"qwen2", "qwen3", "gemma3", "phi3"}
FAMILIES = {"llama", "granite"} | NEOX_ROPE


class RefModel:
    def __init__(self, path):
        r = GGUFReader(path)
        self.fields = r.fields
        arch = self.value("general.architecture")
        if arch not in FAMILIES:
            raise ValueError(f"architecture {arch!r} is not one the reference knows ({', '.join(sorted(FAMILIES))})")
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
        # Linear RoPE scaling divides positions by the factor (Gemma 3 4B+: 8, global layers only).
        scaling = num("rope.scaling.type", "linear")
        factor = float(num("rope.scaling.factor", 0.0) or 0.0)
        if scaling != "linear" and factor not in (0.0, 1.0):
            raise ValueError(f"RoPE scaling {scaling!r} is not in the reference")
        self.rope_pos_scale = 1.0 / factor if factor else 1.0
        self.neox = arch in NEOX_ROPE
        # Sliding window: Gemma 3 only. llama.cpp reads phi3's attention.sliding_window and then
        # turns it off ("Phi SWA is currently disabled"), so phi3 attends to everything, as here.
        self.window = int(num("attention.sliding_window", 0) or 0) if arch == "gemma3" else 0
        self.swa_layers = self._swa_layers(num("attention.sliding_window_pattern")) if self.window else set()
        # Local layers' RoPE: base rope.freq_base_swa (llama.cpp's default 10000), no scaling.
        self.rope_base_swa = float(num("rope.freq_base_swa", 10000.0))
        # Attention scale: Gemma 3 uses 1/sqrt(head_dim) except the 27B (62 layers), 1/sqrt(D/heads)
        # (llama.cpp hard-codes this from gemma_pytorch's query_pre_attn_scalar); Granite reads
        # attention.scale; the rest 1/sqrt(head_dim).
        self.attn_scale = 1.0 / np.sqrt(self.head_dim)
        if arch == "gemma3" and self.n_layer == 62:
            self.attn_scale = 1.0 / np.sqrt(self.n_embd // self.n_head)
        if arch == "granite" and num("attention.scale"):
            self.attn_scale = float(num("attention.scale"))
        self.embd_scale = np.sqrt(self.n_embd) if arch == "gemma3" else 1.0
        self.residual_scale = 1.0
        self.logit_div = 1.0
        if arch == "granite":
            self.embd_scale = float(num("embedding_scale", 0.0)) or 1.0
            self.residual_scale = float(num("residual_scale", 0.0)) or 1.0
            self.logit_div = float(num("logit_scale", 1.0))
        self.softcap = float(num("final_logit_softcapping", 0.0) or 0.0) if arch == "gemma3" else 0.0
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float32)
            shape = [int(d) for d in reversed(t.shape)]  # GGUF lists the row length first
            self.w[t.name] = a.reshape(shape)
        self.out_w = self.w.get("output.weight", self.w["token_embd.weight"])

    def _swa_layers(self, pattern):
        """Which layers use the window: attention.sliding_window_pattern as per-layer flags, or as n
        (layer il is local unless il % n == n - 1); Gemma 3's default n is 6 (every 6th is global)."""
        if isinstance(pattern, list):
            return {il for il, local in enumerate(pattern) if local}
        n = int(pattern) if pattern is not None else 6
        return {il for il in range(self.n_layer) if n == 0 or il % n < n - 1}

    def value(self, key):
        f = self.fields.get(key)
        if f is None:
            return None
        v = f.contents()
        return v

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, base=None):
        # x: [T, heads, head_dim]; rotates the first rope_dim dims in pairs (2i, 2i+1), or for the
        # NeoX style in pairs (i, i + rope_dim/2).
        half = self.rope_dim // 2
        base = self.rope_base if base is None else base
        freq = base ** (-2.0 * np.arange(half) / self.rope_dim)
        if "rope_freqs.weight" in self.w:
            freq = freq / self.w["rope_freqs.weight"].astype(np.float64)
        ang = pos[:, None] * freq[None, :]  # [T, half]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        if self.neox:
            a, b = x[..., 0:half], x[..., half:self.rope_dim]
            out[..., 0:half] = a * c - b * s
            out[..., half:self.rope_dim] = a * s + b * c
            return out
        a = x[..., 0:self.rope_dim:2]
        b = x[..., 1:self.rope_dim:2]
        out[..., 0:self.rope_dim:2] = a * c - b * s
        out[..., 1:self.rope_dim:2] = a * s + b * c
        return out

    def forward(self, tokens):
        """Logits of every position, [T, n_vocab], float64."""
        T = len(tokens)
        pos = np.arange(T, dtype=np.float64)
        x = self.w["token_embd.weight"][tokens].astype(np.float64) * self.embd_scale
        hd, nh, nkv = self.head_dim, self.n_head, self.n_kv_head
        qd, kvd = nh * hd, nkv * hd
        causal = np.triu(np.full((T, T), -np.inf), k=1)
        # A query at p sees a key at p' when p - p' < window.
        windowed = causal + np.tril(np.full((T, T), -np.inf), k=-self.window) if self.window else causal
        for l in range(self.n_layer):
            def W(n, kind="weight"):
                t = self.w.get(f"blk.{l}.{n}.{kind}")
                return None if t is None else t.astype(np.float64)

            def linear(h, n):
                y = h @ W(n).T
                b = W(n, "bias")
                return y if b is None else y + b

            h = self.rmsnorm(x, W("attn_norm"))
            if W("attn_qkv") is not None:  # phi3: Q rows, then K, then V
                qkv = linear(h, "attn_qkv")
                q, k, v = qkv[:, :qd], qkv[:, qd:qd + kvd], qkv[:, qd + kvd:qd + 2 * kvd]
            else:
                q, k, v = linear(h, "attn_q"), linear(h, "attn_k"), linear(h, "attn_v")
            q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
            if W("attn_q_norm") is not None:  # QK-norm: RMS over each head's vector
                q = self.rmsnorm(q, W("attn_q_norm"))
                k = self.rmsnorm(k, W("attn_k_norm"))
            local = l in self.swa_layers
            if local:
                q, k = self.rope(q, pos, self.rope_base_swa), self.rope(k, pos, self.rope_base_swa)
            else:
                q, k = self.rope(q, pos * self.rope_pos_scale), self.rope(k, pos * self.rope_pos_scale)
            rep = nh // nkv
            k = np.repeat(k, rep, axis=1)
            v = np.repeat(v, rep, axis=1)
            att = np.einsum("thd,shd->hts", q, k) * self.attn_scale + (windowed if local else causal)
            att = np.exp(att - att.max(axis=-1, keepdims=True))
            att /= att.sum(axis=-1, keepdims=True)
            o = linear(np.einsum("hts,shd->thd", att, v).reshape(T, qd), "attn_output")
            if W("post_attention_norm") is not None:  # Gemma's sandwich
                o = self.rmsnorm(o, W("post_attention_norm"))
            x = x + o * self.residual_scale
            h = self.rmsnorm(x, W("ffn_norm"))
            if W("ffn_gate") is None:  # phi3: ffn_up holds the gate rows, then the up rows
                gu = linear(h, "ffn_up")
                ff = gu.shape[1] // 2
                g, u = gu[:, :ff], gu[:, ff:]
            else:
                g, u = linear(h, "ffn_gate"), linear(h, "ffn_up")
            if self.arch == "gemma3":  # GELU, tanh approximation
                a = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))
            else:
                a = g / (1.0 + np.exp(-g))
            f = linear(a * u, "ffn_down")
            if W("post_ffw_norm") is not None:
                f = self.rmsnorm(f, W("post_ffw_norm"))
            x = x + f * self.residual_scale
        x = self.rmsnorm(x, self.w["output_norm.weight"].astype(np.float64))
        logits = x @ self.out_w.astype(np.float64).T
        if self.softcap:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits / self.logit_div


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
