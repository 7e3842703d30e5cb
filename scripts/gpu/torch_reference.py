#!/usr/bin/env python3
"""An independent float32 forward pass of a Llama GGUF in PyTorch (on the GPU when there is
one): the logits of every position of a prompt, for the CUDA backend's check against it.

    python3 torch_reference.py MODEL.gguf OUT_DIR [n_tokens=64]

Writes OUT_DIR/model.gguf (a link to MODEL), tokens.txt (the prompt's ids, seeded) and
logits.f32 ([n_tokens, n_vocab] float32), which tests/test_cuda_forward.cpp reads when
TANDEM_TORCH_REF names OUT_DIR.
"""
import os
import sys

import numpy as np
import torch
import gguf
from gguf import quants


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]]
    return v.tolist()[0] if hasattr(v, "tolist") else v


def main(model, out_dir, n=64):
    n = int(n)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    r = gguf.GGUFReader(model)
    arch = bytes(r.fields["general.architecture"].parts[r.fields["general.architecture"].data[0]]).decode()
    d = field(r, f"{arch}.embedding_length")
    L = field(r, f"{arch}.block_count")
    H = field(r, f"{arch}.attention.head_count")
    KV = field(r, f"{arch}.attention.head_count_kv", H)
    eps = field(r, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    base = field(r, f"{arch}.rope.freq_base", 10000.0)
    hd = d // H
    rope_dim = field(r, f"{arch}.rope.dimension_count", hd)
    T = {}
    for t in r.tensors:
        a = quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape.tolist())]
        T[t.name] = torch.from_numpy(a.reshape(shape)).to(dev)
    emb = T["token_embd.weight"]
    out_w = T.get("output.weight", emb)
    V = emb.shape[0]
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, V, size=n)

    def norm(x, w):
        return x * torch.rsqrt((x.double() ** 2).mean(-1, keepdim=True) + eps).float() * w

    pos = torch.arange(n, device=dev, dtype=torch.float64)
    inv = base ** (-2.0 * torch.arange(rope_dim // 2, device=dev, dtype=torch.float64) / rope_dim)
    ang = pos[:, None] * inv[None, :]
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()  # [n, rope_dim / 2]

    def rope(x, heads):  # adjacent pairs of the first rope_dim dims of each head
        x = x.view(n, heads, hd).clone()
        a, b = x[..., 0:rope_dim:2].clone(), x[..., 1:rope_dim:2].clone()
        c, s = cos[:, None, :], sin[:, None, :]
        x[..., 0:rope_dim:2] = a * c - b * s
        x[..., 1:rope_dim:2] = a * s + b * c
        return x

    x = emb[torch.as_tensor(tokens, device=dev)]
    mask = torch.full((n, n), float("-inf"), device=dev).triu(1)
    for l in range(L):
        p = f"blk.{l}."
        xb = norm(x, T[p + "attn_norm.weight"])
        q = rope(xb @ T[p + "attn_q.weight"].T, H)
        k = rope(xb @ T[p + "attn_k.weight"].T, KV)
        v = (xb @ T[p + "attn_v.weight"].T).view(n, KV, hd)
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = torch.einsum("qhd,khd->hqk", q, k) / (hd ** 0.5) + mask
        o = torch.einsum("hqk,khd->qhd", att.softmax(-1), v).reshape(n, H * hd)
        x = x + o @ T[p + "attn_output.weight"].T
        xb = norm(x, T[p + "ffn_norm.weight"])
        g = xb @ T[p + "ffn_gate.weight"].T
        u = xb @ T[p + "ffn_up.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ T[p + "ffn_down.weight"].T
    logits = norm(x, T["output_norm.weight"]) @ out_w.T
    os.makedirs(out_dir, exist_ok=True)
    link = os.path.join(out_dir, "model.gguf")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.abspath(model), link)
    with open(os.path.join(out_dir, "tokens.txt"), "w") as f:
        f.write(" ".join(str(int(t)) for t in tokens) + "\n")
    logits.float().cpu().numpy().astype(np.float32).tofile(os.path.join(out_dir, "logits.f32"))
    print(f"torch reference: {model}: {n} tokens x {V} logits on {dev}, |logit| up to {logits.abs().max().item():.3g}")


if __name__ == "__main__":
    main(*sys.argv[1:])
