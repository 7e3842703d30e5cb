#!/usr/bin/env python3
"""Writes seeded random-weight GGUFs of every architecture family tandem runs, with llama.cpp's
tensor names and metadata keys for that architecture, quantized by the `gguf` package's own
quantizers (not tandem's):

    python3 tests/reference/family_gguf.py OUT.gguf FAMILY [--shape tiny] [--type f32] [--seed 0] [--window N]
    python3 tests/reference/family_gguf.py OUT.gguf qwen2 --shape qwen2.5-0.5b --type q8_0

FAMILY is one of llama, qwen2, qwen3, gemma3, phi3, granite. --shape is "tiny" (D=64, 4 heads,
2 KV heads, FF=128, 300 tokens, 3 layers; Gemma 3 has 6 so layer 5 is its one global layer) or a
real model's shape (see REAL_SHAPES; "real" picks the family's). --type is f32, f16, q8_0 or q4_0
(2-D tensors; norms and biases stay f32, as llama.cpp's converter leaves them).

What each family exercises (all as llama.cpp reads them):
  llama    adjacent-pair RoPE, SwiGLU, untied output.weight
  qwen2    attn_q/k/v.bias, NeoX RoPE, tied output (no output.weight)
  qwen3    attn_q_norm/attn_k_norm [head_dim], attention.key_length 32 != D/heads, tied
  gemma3   sandwich norms (post_attention_norm, post_ffw_norm), GELU-tanh gate, embeddings scaled
           by sqrt(n_embd), QK-norm, key_length 32, sliding window on layers il % 6 != 5 with RoPE
           base 10000 there and rope.freq_base on the global ones; norm weights stored as 1+w
  phi3     fused attn_qkv (Q rows, then K, then V) and fused ffn_up (gate rows, then up rows)
  granite  embedding_scale, residual_scale, attention.scale, logit_scale (logits are divided)

Every tensor draws from its own generator seeded by (seed, name), so a model is the same bytes
whatever the order of writing; tensors are written one at a time, so a 4B-parameter shape needs
memory for its largest tensor only. The scales keep the logits spread (std ~5 tiny, ~8 real) and
the network calm enough that 8-bit activations move them by ~1-2%, not more.
"""
import argparse
import dataclasses
import itertools
import string
import sys
import zlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize, quant_shape_to_byte_shape

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "granite")
TYPES = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0}
FILE_TYPES = {Q.F32: gguf.LlamaFileType.ALL_F32, Q.F16: gguf.LlamaFileType.MOSTLY_F16,
              Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0, Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0}


@dataclasses.dataclass(frozen=True)
class Shape:
    family: str
    n_embd: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_ff: int
    n_vocab: int
    ctx: int
    rope_base: float
    eps: float
    tied: bool                     # no output.weight: the output reuses token_embd
    head_dim: int | None = None    # attention.key_length/value_length, when not n_embd / n_head
    window: int | None = None      # attention.sliding_window (gemma3, phi3)
    embedding_scale: float = 0.0   # granite's four
    residual_scale: float = 0.0
    attention_scale: float = 0.0
    logit_scale: float = 0.0
    logit_std: float = 6.0         # spread of the output logits the weights are scaled for

    @property
    def hd(self):
        return self.head_dim or self.n_embd // self.n_head


_TINY = dict(n_embd=64, n_layer=3, n_head=4, n_kv_head=2, n_ff=128, n_vocab=300, ctx=256, logit_std=5.0)
TINY = {
    "llama": Shape("llama", **_TINY, rope_base=10000.0, eps=1e-5, tied=False),
    "qwen2": Shape("qwen2", **_TINY, rope_base=1000000.0, eps=1e-6, tied=True),
    "qwen3": Shape("qwen3", **_TINY, rope_base=1000000.0, eps=1e-6, tied=True, head_dim=32),
    # 6 layers so that layer 5 is global; a window of 5 bites within a few tokens.
    "gemma3": Shape("gemma3", **{**_TINY, "n_layer": 6}, rope_base=1000000.0, eps=1e-6, tied=True, head_dim=32,
                    window=5),
    # llama.cpp ignores phi3's sliding_window (it warns "Phi SWA is currently disabled"); the tiny
    # model carries one, as Phi-3-mini's GGUF does (2047 of 4096), that 64 tokens never reach.
    "phi3": Shape("phi3", **_TINY, rope_base=10000.0, eps=1e-5, tied=False, window=127),
    # Granite's scales at values that a missing or inverted one cannot hide: logits are divided by
    # logit_scale, the residual branches multiplied by residual_scale, embeddings by embedding_scale,
    # and attention.scale replaces 1/sqrt(head_dim) (0.25 here).
    "granite": Shape("granite", **_TINY, rope_base=10000.0, eps=1e-5, tied=True, embedding_scale=6.0,
                     residual_scale=0.5, attention_scale=0.125, logit_scale=4.0),
}

# The real models' configurations (their HF config.json); the vocabulary is a random SentencePiece-
# style one of the real size. Real Gemma 3 270M also checked against the GGUF's own metadata.
REAL_SHAPES = {
    "qwen2.5-0.5b": Shape("qwen2", n_embd=896, n_layer=24, n_head=14, n_kv_head=2, n_ff=4864, n_vocab=151936,
                          ctx=32768, rope_base=1000000.0, eps=1e-6, tied=True, logit_std=8.0),
    "qwen3-0.6b": Shape("qwen3", n_embd=1024, n_layer=28, n_head=16, n_kv_head=8, n_ff=3072, n_vocab=151936,
                        ctx=40960, rope_base=1000000.0, eps=1e-6, tied=True, head_dim=128, logit_std=8.0),
    "gemma3-270m": Shape("gemma3", n_embd=640, n_layer=18, n_head=4, n_kv_head=1, n_ff=2048, n_vocab=262144,
                         ctx=32768, rope_base=1000000.0, eps=1e-6, tied=True, head_dim=256, window=512,
                         logit_std=8.0),
    "phi3-mini": Shape("phi3", n_embd=3072, n_layer=32, n_head=32, n_kv_head=32, n_ff=8192, n_vocab=32064,
                       ctx=4096, rope_base=10000.0, eps=1e-5, tied=False, window=2047, logit_std=8.0),
    "granite-3.1-2b": Shape("granite", n_embd=2048, n_layer=40, n_head=32, n_kv_head=8, n_ff=8192, n_vocab=49155,
                            ctx=131072, rope_base=5000000.0, eps=1e-5, tied=True, embedding_scale=12.0,
                            residual_scale=0.22, attention_scale=0.015625, logit_scale=8.0, logit_std=8.0),
}
REAL_OF_FAMILY = {s.family: name for name, s in REAL_SHAPES.items()}
REAL_OF_FAMILY["llama"] = None  # llama's real shapes are shared/tools/make_gguf.py's


def shape_of(family, shape):
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (one of {', '.join(FAMILIES)})")
    if shape == "tiny":
        return TINY[family]
    if shape == "real":
        shape = REAL_OF_FAMILY[family]
        if shape is None:
            raise ValueError(f"no real shape for {family} here")
    s = REAL_SHAPES.get(shape)
    if s is None:
        raise ValueError(f"unknown shape {shape!r} (tiny, real, {', '.join(REAL_SHAPES)})")
    if s.family != family:
        raise ValueError(f"shape {shape} is a {s.family} model, not {family}")
    return s


def vocab(family, n):
    """A SentencePiece-style vocabulary: specials, the 256 byte tokens, then pieces a-z, "▁a".. in
    order of length (scores fall with the index, so longer pieces merge last). Gemma's specials
    sit where Gemma's do (<pad> 0, <eos> 1, <bos> 2, <unk> 3); the others are Llama's."""
    if family == "gemma3":
        specials, types = [b"<pad>", b"<eos>", b"<bos>", b"<unk>"], [3, 3, 3, 2]
        ids = dict(pad=0, eos=1, bos=2, unk=3)
    else:
        specials, types = [b"<unk>", b"<s>", b"</s>"], [2, 3, 3]
        ids = dict(unk=0, bos=1, eos=2)
    toks = specials + [f"<0x{i:02X}>".encode() for i in range(256)]
    types = types + [6] * 256

    def pieces():
        yield "\u2581".encode()  # a lone space, as SentencePiece vocabularies have
        for length in itertools.count(1):
            for letters in itertools.product(string.ascii_lowercase, repeat=length):
                s = "".join(letters)
                yield ("\u2581" + s).encode()
                yield s.encode()

    # Phi-3's chat tokens sit in its last 64 ids (<|endoftext|> is 32000 of 32064; the tiny model
    # keeps 11); llama.cpp looks <|endoftext|> up by name in any model whose general.name says phi3.
    tail = []
    if family == "phi3":
        tail = [f"<|placeholder{i}|>".encode() for i in range(64 if n > 1000 else 11)]
        for i, t in ((0, "<|endoftext|>"), (1, "<|assistant|>"), (7, "<|end|>"), (10, "<|user|>")):
            tail[i] = t.encode()
        ids["eos"] = n - len(tail)
    toks += list(itertools.islice(pieces(), n - len(toks) - len(tail)))
    types += [1] * (n - len(types) - len(tail))
    return toks + tail, types + [3] * len(tail), ids


def tensor_specs(s):
    """(name, numpy shape, kind, scale) for every tensor, in llama.cpp's names. kind: "mat", "out"
    and "bias" are gaussian times scale, "norm" is scale times (1 + 0.1 gaussian)."""
    D, hd, FF = s.n_embd, s.hd, s.n_ff
    qd, kvd = s.n_head * hd, s.n_kv_head * hd
    # Output logits: the normed hidden state (rms ~ the output norm's weight) times rows of rms `out`
    # -> std ~ norm * out * sqrt(D); Granite divides by logit_scale afterwards, so it needs more.
    # A tied model reads its input from the same rows, and an input token whose embedding dominates
    # the last hidden state wins the next step by a mile, every step (random tied models then repeat
    # one token forever): so tied rows are small (input rms ~0.5/sqrt(D), the layers' outputs
    # dominate) and the output norm's weight makes up the logits' spread.
    target = s.logit_std * (s.logit_scale or 1.0)
    if s.tied:
        # Gemma's sqrt(D) and Granite's embedding_scale multiply the input rows: smaller still.
        m = np.sqrt(D) if s.family == "gemma3" else (s.embedding_scale or 1.0)
        out, out_norm = 0.5 / np.sqrt(D) / m, target * m / 0.5
        specs = [("token_embd.weight", (s.n_vocab, D), "out", out)]
    else:
        out, out_norm = target / np.sqrt(D), 1.0
        specs = [("token_embd.weight", (s.n_vocab, D), "mat", 0.5), ("output.weight", (s.n_vocab, D), "out", out)]
    # Attention scores of std ~0.65 (QK-norm: ~0.8): peakier attention makes a random model
    # chaotic, so that 8-bit activations (the peer's and tandem's fast path) move its logits by
    # several percent and greedy choices flip at many positions.
    qk = 0.8 / np.sqrt(D)
    if s.attention_scale:  # Granite's attention.scale is below 1/sqrt(head_dim): q and k make up for it
        qk *= (1.0 / np.sqrt(s.hd) / s.attention_scale) ** 0.5
    specs.append(("output_norm.weight", (D,), "norm", out_norm))
    for il in range(s.n_layer):
        p = f"blk.{il}."
        specs.append((p + "attn_norm.weight", (D,), "norm", 1.0))
        if s.family == "phi3":
            specs.append((p + "attn_qkv.weight", (qd + 2 * kvd, D), "mat", qk))  # V rows drawn at qk too
        else:
            specs += [(p + "attn_q.weight", (qd, D), "mat", qk), (p + "attn_k.weight", (kvd, D), "mat", qk),
                      (p + "attn_v.weight", (kvd, D), "mat", 1.0 / np.sqrt(D))]
        if s.family == "qwen2":
            # K's bias is seen through RoPE (q.R(p')b_k varies with the key's position). V's bias
            # adds one constant vector to every position of every layer; kept small, or greedy
            # continuations collapse onto the token it favours.
            specs += [(p + "attn_q.bias", (qd,), "bias", 0.5), (p + "attn_k.bias", (kvd,), "bias", 0.5),
                      (p + "attn_v.bias", (kvd,), "bias", 0.15)]
        if s.family in ("qwen3", "gemma3"):
            # QK-normed q and k have rms ~ the norm weight, so ~0.9 gives scores of std ~0.8.
            specs += [(p + "attn_q_norm.weight", (hd,), "norm", 0.9), (p + "attn_k_norm.weight", (hd,), "norm", 0.9)]
        specs.append((p + "attn_output.weight", (D, qd), "mat", 1.0 / np.sqrt(qd)))
        if s.family == "gemma3":
            specs.append((p + "post_attention_norm.weight", (D,), "norm", 1.0))
        specs.append((p + "ffn_norm.weight", (D,), "norm", 1.0))
        if s.family == "phi3":
            specs.append((p + "ffn_up.weight", (2 * FF, D), "mat", 1.0 / np.sqrt(D)))  # gate rows, then up rows
        else:
            specs += [(p + "ffn_gate.weight", (FF, D), "mat", 1.0 / np.sqrt(D)),
                      (p + "ffn_up.weight", (FF, D), "mat", 1.0 / np.sqrt(D))]
        specs.append((p + "ffn_down.weight", (D, FF), "mat", 1.0 / np.sqrt(FF)))
        if s.family == "gemma3":
            specs.append((p + "post_ffw_norm.weight", (D,), "norm", 1.0))
    return specs


def _values(rng, shape, kind, scale, rows_from, rows_to):
    n = (rows_to - rows_from,) + tuple(shape[1:])
    if kind == "norm":
        return (scale * (1.0 + 0.1 * rng.standard_normal(n))).astype(np.float32)
    return rng.standard_normal(n, dtype=np.float32) * np.float32(scale)


def _encode(rng, shape, kind, scale, qtype):
    """The tensor's bytes as stored: drawn and quantized in chunks of rows to bound memory."""
    if len(shape) == 1:
        return _values(rng, shape, kind, scale, 0, shape[0])
    step = max(1, (1 << 23) // shape[1])
    parts = []
    for r in range(0, shape[0], step):
        a = _values(rng, shape, kind, scale, r, min(shape[0], r + step))
        parts.append(a if qtype == Q.F32 else quantize(a, qtype))
    return np.concatenate(parts, axis=0)


def write_family_gguf(path, family, shape="tiny", qtype="f32", seed=0, window=None):
    """Writes the model; returns its Shape. qtype: f32, f16, q8_0, q4_0 (or a GGMLQuantizationType).
    window replaces the shape's attention.sliding_window (a real shape's 512 reached by short checks)."""
    s = shape_of(family, shape)
    if window is not None:
        if not s.window:
            raise ValueError(f"{family} {shape} has no sliding window to replace")
        s = dataclasses.replace(s, window=int(window))
    qt = TYPES[qtype] if isinstance(qtype, str) else Q(qtype)
    if qt not in FILE_TYPES:
        raise ValueError(f"unsupported type {qtype!r} (one of {', '.join(TYPES)})")
    arch = s.family
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"random-{family}-{shape}-{qt.name.lower()}-seed{seed}" + (f"-window{window}" if window else ""))
    w.add_file_type(int(FILE_TYPES[qt]))
    w.add_context_length(s.ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_kv_head)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(s.eps)
    if s.head_dim:
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    if arch in ("llama", "granite"):  # LlamaModel's converter writes both
        w.add_vocab_size(s.n_vocab)
        w.add_rope_dimension_count(s.hd)
    if arch == "phi3":
        w.add_rope_dimension_count(s.hd)
        w.add_rope_scaling_orig_ctx_len(s.ctx)
    if s.window:
        w.add_sliding_window(s.window)
    if arch == "granite":
        w.add_attention_scale(s.attention_scale)
        w.add_embedding_scale(s.embedding_scale)
        w.add_residual_scale(s.residual_scale)
        w.add_logit_scale(s.logit_scale)
    toks, types, ids = vocab(arch, s.n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([-float(k) for k in range(s.n_vocab)])
    w.add_token_types(types)
    w.add_bos_token_id(ids["bos"])
    w.add_eos_token_id(ids["eos"])
    w.add_unk_token_id(ids["unk"])
    if "pad" in ids:
        w.add_pad_token_id(ids["pad"])
    if arch == "gemma3":  # as Gemma's GGUF says
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)

    specs = tensor_specs(s)
    for name, shp, kind, scale in specs:
        t = qt if len(shp) == 2 else Q.F32
        nbytes = int(np.prod(quant_shape_to_byte_shape(shp, t))) if t not in (Q.F32, Q.F16) else \
            int(np.prod(shp)) * (4 if t == Q.F32 else 2)
        if t in (Q.F32, Q.F16):
            w.add_tensor_info(name, shp, np.dtype(np.float32 if t == Q.F32 else np.float16), nbytes)
        else:
            w.add_tensor_info(name, quant_shape_to_byte_shape(shp, t), np.dtype(np.uint8), nbytes, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp, kind, scale in specs:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        t = qt if len(shp) == 2 else Q.F32
        w.write_tensor_data(_encode(rng, shp, kind, scale, t))
    w.close()
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("family", choices=FAMILIES)
    ap.add_argument("--shape", default="tiny", help="tiny, real, or one of " + ", ".join(REAL_SHAPES))
    ap.add_argument("--type", default="f32", choices=list(TYPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, help="replace the shape's attention.sliding_window")
    a = ap.parse_args()
    try:
        s = write_family_gguf(a.out, a.family, a.shape, a.type, a.seed, a.window)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {a.family} {a.shape} {a.type} seed {a.seed} ({s.n_layer} layers, D={s.n_embd}, "
          f"vocab {s.n_vocab})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
