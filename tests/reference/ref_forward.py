#!/usr/bin/env python3
"""Independent reference forward pass of a GGUF model of the families tandem runs (llama, qwen2,
qwen3, gemma3, phi3, granite, and the mixtures of experts qwen3moe, olmoe, qwen2moe, llama with
expert_count (Mixtral) and gpt-oss), in numpy.

Shares no code with tandem: weights are decoded by the `gguf` package's own dequantizers and
every operation is written here from the architecture's definition, computed in float64.
Used by check_logits.py to check tandem's logits; usable alone:

    python3 tests/reference/ref_forward.py MODEL.gguf 1 2 3 --out logits.npy
"""
import argparse
import math
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


# Families and how llama.cpp runs each (src/models/<arch>.cpp in the peer): RoPE on adjacent pairs
# (GGUF Q/K rows are permuted for it) or on NeoX halves.
NEOX_ROPE = {"qwen2", "qwen3", "gemma3", "phi3", "qwen3moe", "olmoe", "qwen2moe", "gpt-oss"}
FAMILIES = {"llama", "granite"} | NEOX_ROPE
# Mixtures of experts (llama too when expert_count > 0), as llama.cpp's build_moe_ffn runs them:
#   softmax: probs = softmax(router logits) over all experts; the k largest probs chosen;
#            their probs the weights, divided by their sum where renormalised (norm_w);
#   softmax_weight: the k largest logits chosen (router bias added first); weights = softmax over them.
# None of these architectures reads expert_weights_scale or expert_weights_norm: both are fixed here.
MOE_ROUTING = {  # arch: (gating, renormalise over the k)
    "qwen3moe": ("softmax", True),   # norm_w hard-coded true (norm_topk_prob)
    "llama": ("softmax", True),      # Mixtral
    "olmoe": ("softmax", False),
    "qwen2moe": ("softmax", False),
    "gpt-oss": ("softmax_weight", False),
}


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def swiglu_oai(g, u, alpha=1.702, limit=7.0):
    """gpt-oss's gated activation (ggml_swiglu_oai): the gate clamped above at limit, up clamped to
    [-limit, limit], out = g * sigmoid(alpha * g) * (u + 1)."""
    g = np.minimum(g, limit)
    u = np.clip(u, -limit, limit)
    return g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)


class Experts:
    """A 3-D expert tensor, GGUF ne [cols, rows, n_expert]: e -> that expert's [rows, cols] matrix in
    float64. Small tensors are decoded once; large ones (a real shape's 128 experts) one expert at a
    time, on demand, so that the reference needs memory for one expert, not all."""

    def __init__(self, t):
        self.t = t
        self.n_expert, self.rows, self.cols = (int(d) for d in reversed(t.shape))
        self.all = None
        if self.n_expert * self.rows * self.cols <= (1 << 24):
            self.all = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(self.n_expert, self.rows,
                                                                                       self.cols)

    def __getitem__(self, e):
        if self.all is not None:
            return self.all[e].astype(np.float64)
        return dequantize(self.t.data[e], self.t.tensor_type).astype(np.float64).reshape(self.rows, self.cols)


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
        self.yarn = None
        if scaling == "yarn" and factor not in (0.0, 1.0):
            # YaRN as ggml's rope runs it (ext_factor 1, llama.cpp's default when the type is yarn):
            # each rotary pair i's angle blends the interpolated p*theta_i/factor and the extrapolated
            # p*theta_i by ramp(i) = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1), with
            # lo = max(0, floor(c(beta_fast))), hi = min(rope_dim - 1, ceil(c(beta_slow))),
            # c(b) = rope_dim * ln(n_ctx_orig / (2 pi b)) / (2 ln base); cos and sin are both
            # multiplied by mscale = (1 + 0.1 ln factor) * rope.scaling.attn_factor (so the scores by
            # its square). llama.cpp reads yarn_beta_fast/slow only for some architectures (not
            # gpt-oss): its defaults 32 and 1 are gpt-oss's config, and what is used here.
            self.yarn = dict(factor=factor, orig_ctx=int(num("rope.scaling.original_context_length",
                                                              num("context_length"))),
                             beta_fast=32.0, beta_slow=1.0,
                             mscale=(1.0 + 0.1 * math.log(factor)) * float(num("rope.scaling.attn_factor", 1.0)))
            factor = 0.0
        elif scaling != "linear" and factor not in (0.0, 1.0):
            raise ValueError(f"RoPE scaling {scaling!r} is not in the reference")
        self.rope_pos_scale = 1.0 / factor if factor else 1.0
        self.neox = arch in NEOX_ROPE
        # Sliding window: Gemma 3 and gpt-oss. llama.cpp reads phi3's attention.sliding_window and
        # then turns it off ("Phi SWA is currently disabled"), so phi3 attends to everything, as here.
        self.window = int(num("attention.sliding_window", 0) or 0) if arch in ("gemma3", "gpt-oss") else 0
        # Gemma 3: every 6th layer global (il % 6 == 5); gpt-oss: every 2nd (even layers windowed).
        pattern_default = 2 if arch == "gpt-oss" else 6
        self.swa_layers = (self._swa_layers(num("attention.sliding_window_pattern"), pattern_default)
                           if self.window else set())
        # Local layers' RoPE: base rope.freq_base_swa, by default 10000 with no scaling (Gemma 3);
        # gpt-oss's default is the global base, and its local layers keep the (YaRN) scaling.
        self.rope_base_swa = float(num("rope.freq_base_swa", self.rope_base if arch == "gpt-oss" else 10000.0))
        self.swa_scaled = arch == "gpt-oss"
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
        # Mixture of experts: expert_count, expert_used_count (both 0 when absent: dense).
        self.n_expert = int(num("expert_count", 0) or 0)
        self.n_expert_used = int(num("expert_used_count", 0) or 0)
        if self.n_expert:
            if arch not in MOE_ROUTING:
                raise ValueError(f"{arch} with experts is not in the reference")
            if not 0 < self.n_expert_used <= self.n_expert:
                raise ValueError(f"expert_used_count {self.n_expert_used} with expert_count {self.n_expert}")
            self.gating, self.norm_topk = MOE_ROUTING[arch]
        # gpt-oss: the FFN's input norm is post_attention_norm (there is no ffn_norm); Gemma 3's
        # post_attention_norm instead normalises the attention's output (the sandwich).
        self.ffn_norm_name = "post_attention_norm" if arch == "gpt-oss" else "ffn_norm"
        self.act = "swiglu_oai" if arch == "gpt-oss" else "gelu" if arch == "gemma3" else "silu"
        self.w = {}
        for t in r.tensors:
            shape = [int(d) for d in reversed(t.shape)]  # GGUF lists the row length first
            if len(shape) == 3:
                self.w[t.name] = Experts(t)
                continue
            a = np.empty(shape, dtype=np.float32)
            rows = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data[None]
            step = max(1, (1 << 24) // max(1, a.size // max(1, len(rows))))
            flat = a.reshape(len(rows), -1)
            for r0 in range(0, len(rows), step):  # in chunks: a 201088-row vocabulary decoded at once needs GBs
                flat[r0:r0 + step] = dequantize(rows[r0:r0 + step], t.tensor_type).reshape(-1, flat.shape[1])
            self.w[t.name] = a
        self.out_w = self.w.get("output.weight", self.w["token_embd.weight"])
        self.routes = []  # the last forward's expert choices: [layer] -> [T, k] ids
        self.route_gaps = []  # and [layer] -> [T]: the k-th largest router logit less the (k+1)-th

    def _swa_layers(self, pattern, default):
        """Which layers use the window: attention.sliding_window_pattern as per-layer flags, or as n
        (layer il is local unless il % n == n - 1); Gemma 3's default n is 6 (every 6th is global),
        gpt-oss's 2 (the even layers are local)."""
        if isinstance(pattern, list):
            return {il for il, local in enumerate(pattern) if local}
        n = int(pattern) if pattern is not None else default
        return {il for il in range(self.n_layer) if n == 0 or il % n < n - 1}

    def value(self, key):
        f = self.fields.get(key)
        if f is None:
            return None
        v = f.contents()
        return v

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, base=None, yarn=None):
        # x: [T, heads, head_dim]; rotates the first rope_dim dims in pairs (2i, 2i+1), or for the
        # NeoX style in pairs (i, i + rope_dim/2).
        half = self.rope_dim // 2
        base = self.rope_base if base is None else base
        freq = base ** (-2.0 * np.arange(half) / self.rope_dim)
        if "rope_freqs.weight" in self.w:
            freq = freq / self.w["rope_freqs.weight"].astype(np.float64)
        ang = pos[:, None] * freq[None, :]  # [T, half]
        mscale = 1.0
        if yarn:
            def corr(b):
                return self.rope_dim * math.log(yarn["orig_ctx"] / (2 * math.pi * b)) / (2 * math.log(base))
            lo = max(0.0, math.floor(corr(yarn["beta_fast"])))
            hi = min(self.rope_dim - 1.0, math.ceil(corr(yarn["beta_slow"])))
            ramp = 1.0 - np.clip((np.arange(half) - lo) / max(0.001, hi - lo), 0.0, 1.0)
            ang = ang / yarn["factor"] * (1.0 - ramp) + ang * ramp
            mscale = yarn["mscale"]
        c, s = mscale * np.cos(ang)[:, None, :], mscale * np.sin(ang)[:, None, :]
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
        self.routes, self.route_gaps = [], []
        for l in range(self.n_layer):
            def W(n, kind="weight"):
                t = self.w.get(f"blk.{l}.{n}.{kind}")
                return None if t is None else t if isinstance(t, Experts) else t.astype(np.float64)

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
            qn, kn = W("attn_q_norm"), W("attn_k_norm")
            if qn is not None and qn.shape[0] != hd:
                # OLMoE: one RMS norm over the whole q (and k) vector, all heads together
                q, k = self.rmsnorm(q, qn), self.rmsnorm(k, kn)
            q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
            if qn is not None and qn.shape[0] == hd:  # QK-norm: RMS over each head's vector
                q = self.rmsnorm(q, qn)
                k = self.rmsnorm(k, kn)
            local = l in self.swa_layers
            if local and not self.swa_scaled:
                q, k = self.rope(q, pos, self.rope_base_swa), self.rope(k, pos, self.rope_base_swa)
            else:
                base = self.rope_base_swa if local else self.rope_base
                p = pos * self.rope_pos_scale
                q, k = self.rope(q, p, base, self.yarn), self.rope(k, p, base, self.yarn)
            rep = nh // nkv
            k = np.repeat(k, rep, axis=1)
            v = np.repeat(v, rep, axis=1)
            att = np.einsum("thd,shd->hts", q, k) * self.attn_scale + (windowed if local else causal)
            sinks = W("attn_sinks")
            if sinks is None:
                att = softmax(att)
            else:
                # gpt-oss: one logit per head (not scaled) joins each row's softmax denominator:
                # p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink_h)); no value goes with it.
                m = np.maximum(att.max(axis=-1, keepdims=True), sinks[:, None, None])
                e = np.exp(att - m)
                att = e / (e.sum(axis=-1, keepdims=True) + np.exp(sinks[:, None, None] - m))
            o = linear(np.einsum("hts,shd->thd", att, v).reshape(T, qd), "attn_output")
            if self.arch == "gemma3":  # Gemma's sandwich
                o = self.rmsnorm(o, W("post_attention_norm"))
            x = x + o * self.residual_scale
            h = self.rmsnorm(x, W(self.ffn_norm_name))
            if self.n_expert:
                f = self.moe(h, W)
            else:
                if W("ffn_gate") is None:  # phi3: ffn_up holds the gate rows, then the up rows
                    gu = linear(h, "ffn_up")
                    ff = gu.shape[1] // 2
                    g, u = gu[:, :ff], gu[:, ff:]
                else:
                    g, u = linear(h, "ffn_gate"), linear(h, "ffn_up")
                f = linear(self.activate(g, u), "ffn_down")
            if W("post_ffw_norm") is not None:
                f = self.rmsnorm(f, W("post_ffw_norm"))
            x = x + f * self.residual_scale
        x = self.rmsnorm(x, self.w["output_norm.weight"].astype(np.float64))
        self.last_hidden = x  # [T, n_embd]: what embedding() pools
        logits = np.empty((T, self.out_w.shape[0]))
        step = max(1, (1 << 24) // self.out_w.shape[1])  # rows of a 201088-token output at a time
        for r in range(0, self.out_w.shape[0], step):
            logits[:, r:r + step] = x @ self.out_w[r:r + step].astype(np.float64).T
        if self.softcap:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return logits / self.logit_div

    def activate(self, g, u):
        if self.act == "gelu":  # GELU, tanh approximation
            return 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3))) * u
        if self.act == "swiglu_oai":
            return swiglu_oai(g, u)
        return g / (1.0 + np.exp(-g)) * u

    def route(self, logits):
        """[T, n_expert] router logits -> ([T, k] expert ids, [T, k] weights). Ties (none in float64
        from random weights) go to the lower id."""
        k = self.n_expert_used
        if self.gating == "softmax":
            probs = softmax(logits)
            sel = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
            w = np.take_along_axis(probs, sel, axis=-1)
            if self.norm_topk:
                w = w / np.maximum(w.sum(axis=-1, keepdims=True), 6.103515625e-5)
        else:  # softmax_weight: the top k of the logits, then a softmax over those k
            sel = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
            w = softmax(np.take_along_axis(logits, sel, axis=-1))
        return sel, w

    def moe(self, h, W):
        """The mixture of experts over the FFN's normed input h [T, D]: router, top-k, and the weighted
        sum of the chosen experts' SwiGLU (gpt-oss: swiglu_oai with per-expert biases) outputs, plus
        qwen2moe's shared expert scaled by sigmoid(ffn_gate_inp_shexp . h)."""
        logits = h @ W("ffn_gate_inp").T
        if W("ffn_gate_inp", "bias") is not None:
            logits = logits + W("ffn_gate_inp", "bias")
        sel, wts = self.route(logits)
        self.routes.append(sel)
        if self.n_expert_used < self.n_expert:  # how near the choice came to another expert
            top = -np.partition(-logits, self.n_expert_used, axis=-1)[:, :self.n_expert_used + 1]
            top.sort(axis=-1)
            self.route_gaps.append(top[:, 1] - top[:, 0])
        gate, up, down = W("ffn_gate_exps"), W("ffn_up_exps"), W("ffn_down_exps")
        gb, ub, db = W("ffn_gate_exps", "bias"), W("ffn_up_exps", "bias"), W("ffn_down_exps", "bias")
        out = np.zeros_like(h)
        for e in np.unique(sel):
            rows, slot = np.nonzero(sel == e)
            g, u = h[rows] @ gate[e].T, h[rows] @ up[e].T
            if gb is not None:
                g, u = g + gb[e], u + ub[e]
            d = self.activate(g, u) @ down[e].T
            if db is not None:
                d = d + db[e]
            out[rows] += wts[rows, slot][:, None] * d
        if W("ffn_gate_shexp") is not None:
            g, u = h @ W("ffn_gate_shexp").T, h @ W("ffn_up_shexp").T
            shared = self.activate(g, u) @ W("ffn_down_shexp").T
            out = out + shared / (1.0 + np.exp(-(h @ W("ffn_gate_inp_shexp"))))[:, None]
        return out


def embedding(model, tokens, pooling):
    """An embedding model's vector for `tokens`: the final hidden states after the output norm,
    pooled (llama.cpp's pooling_type: 1 mean, 2 cls = the first position, 3 last), L2-normalised."""
    model.forward(np.array(tokens))
    h = model.last_hidden
    v = h.mean(axis=0) if pooling == 1 else h[0] if pooling == 2 else h[-1]
    return v / np.linalg.norm(v)


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
