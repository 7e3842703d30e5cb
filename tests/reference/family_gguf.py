#!/usr/bin/env python3
"""Writes seeded random-weight GGUFs of every architecture family tandem runs, with llama.cpp's
tensor names and metadata keys for that architecture, quantized by the `gguf` package's own
quantizers (not tandem's):

    python3 tests/reference/family_gguf.py OUT.gguf FAMILY [--shape tiny] [--type f32] [--seed 0] [--window N]
                                           [--layers N] [--expert-type T] [--block-pool]
                                           [--vocab-from GGUF] [--chat-template FILE]
    python3 tests/reference/family_gguf.py OUT.gguf qwen2 --shape qwen2.5-0.5b --type q8_0
    python3 tests/reference/family_gguf.py OUT.gguf qwen3moe --shape qwen3-30b-a3b --type q8_0 --layers 2
    python3 tests/reference/family_gguf.py OUT.gguf qwen3 --pooling last    # Qwen3-Embedding-shaped
    python3 tests/reference/family_gguf.py OUT.gguf gpt-oss --shape gpt-oss-20b --type q8_0 --layers 4 \
        --block-pool --vocab-from models/o200k-harmony-vocab.gguf          # bench/compare.py's gpt-oss shape

FAMILY is one of llama, qwen2, qwen3, gemma3, phi3, granite (dense) or qwen3moe, olmoe, qwen2moe,
mixtral, gpt-oss (mixture of experts; mixtral is written as general.architecture = llama with
expert_count > 0, as Mixtral's GGUFs are). --shape is "tiny" (D=64, 4 heads, 2 KV heads, FF=128,
300 tokens, 3 layers; Gemma 3 has 6 so layer 5 is its one global layer, gpt-oss 4 so two layers of
each kind; the MoE ones 8 experts) or a real model's shape (see REAL_SHAPES; "real" picks the
family's), --layers N keeping only its first N layers. --type is f32, f16, q8_0 or q4_0 (2-D and
3-D weights; norms, biases, attention sinks and the MoE routers (ffn_gate_inp) stay f32, as
llama.cpp's converter and llama-quantize leave them). --expert-type overrides the type of the 3-D
expert tensors (ffn_{gate,up,down}_exps): gpt-oss's default is mxfp4, as its GGUFs hold them.
--pooling (mean, cls or last) writes <arch>.pooling_type, as an embedding model's GGUF has it
(Qwen3-Embedding: a qwen3 decoder with last-token pooling).

What each family exercises (all as llama.cpp reads them):
  llama    adjacent-pair RoPE, SwiGLU, untied output.weight
  qwen2    attn_q/k/v.bias, NeoX RoPE, tied output (no output.weight)
  qwen3    attn_q_norm/attn_k_norm [head_dim], attention.key_length 32 != D/heads, tied
  gemma3   sandwich norms (post_attention_norm, post_ffw_norm), GELU-tanh gate, embeddings scaled
           by sqrt(n_embd), QK-norm, key_length 32, sliding window on layers il % 6 != 5 with RoPE
           base 10000 there and rope.freq_base on the global ones; norm weights stored as 1+w
  phi3     fused attn_qkv (Q rows, then K, then V) and fused ffn_up (gate rows, then up rows)
  granite  embedding_scale, residual_scale, attention.scale, logit_scale (logits are divided)
  qwen3moe qwen3's attention (QK-norm per head, key_length 32 != D/heads); every layer MoE: softmax
           router, top-k, weights renormalised over the k; expert_feed_forward_length 32 != FF 128
  olmoe    QK-norm over the whole q (and k) vector (attn_q_norm/attn_k_norm [n_embd]), so KV heads =
           heads; softmax router, top-k, not renormalised; the experts' FF is feed_forward_length
  qwen2moe qwen2's q/k/v biases; routed experts (softmax, top-k, not renormalised) plus a shared
           expert (ffn_*_shexp, expert_shared_feed_forward_length) scaled by sigmoid(ffn_gate_inp_shexp . x)
  mixtral  llama's attention (adjacent-pair RoPE) with expert_count 8: softmax, top-2, renormalised
  gpt-oss  q/k/v/o biases, attention sinks (attn_sinks [heads]), window on even layers (il % 2 == 0),
           YaRN RoPE (factor 32), post_attention_norm as the FFN's norm, router bias, top-k over the
           router's logits then softmax over the k, expert biases, swiglu_oai, MXFP4 experts

Every tensor draws from its own generator seeded by (seed, name), so a model is the same bytes
whatever the order of writing; tensors are written one at a time, so a 4B-parameter shape needs
memory for its largest tensor only. The scales keep the logits spread (std ~5 tiny, ~8 real) and
the network calm enough that 8-bit activations move them by ~1-2%, not more. A real MoE shape is
slow to write: ~35 s a layer of Qwen3-30B-A3B in q8_0, ~2 min a layer of gpt-oss-20b (the gguf
package's MXFP4 quantizer does ~5M weights/s on this host). --block-pool writes such a shape in
seconds a gigabyte: each block-quantized matrix is a random gather from 65,536 blocks the gguf
package quantized from that tensor's floats (plausible codes and scale bytes, not independent
weights: a file for timing, never for reference checks); norms, biases and routers are drawn as
always. --vocab-from copies another GGUF's tokenizer (gpt-oss's o200k_harmony from
models/o200k-harmony-vocab.gguf, which scripts/setup.sh --models all writes).
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

DENSE_FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "granite")
MOE_FAMILIES = ("qwen3moe", "olmoe", "qwen2moe", "mixtral", "gpt-oss")
FAMILIES = DENSE_FAMILIES + MOE_FAMILIES
TYPES = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0}
EXPERT_TYPES = {**TYPES, "mxfp4": Q.MXFP4}
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
    n_expert: int = 0              # expert_count; 0: a dense model
    n_expert_used: int = 0         # expert_used_count (top-k)
    n_ff_exp: int = 0              # expert_feed_forward_length; 0: not written, the experts' FF is n_ff
    n_ff_shexp: int = 0            # expert_shared_feed_forward_length (qwen2moe's shared expert)
    yarn_factor: float = 0.0       # rope.scaling.type yarn with this factor (gpt-oss)
    yarn_orig_ctx: int = 0         # rope.scaling.original_context_length

    @property
    def hd(self):
        return self.head_dim or self.n_embd // self.n_head

    @property
    def arch(self):
        """general.architecture: Mixtral's GGUFs say llama (with expert_count > 0)."""
        return "llama" if self.family == "mixtral" else self.family

    @property
    def ff_exp(self):
        return self.n_ff_exp or self.n_ff


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
    # Mixtures of experts, untied like the real ones. Every FF width is a multiple of 32 (q8_0, q4_0
    # and mxfp4 blocks run along the rows of ffn_down_exps, n_ff_exp long); the expert FF differs
    # from feed_forward_length where the family reads expert_feed_forward_length, so reading the
    # wrong key gives the wrong shapes.
    "qwen3moe": Shape("qwen3moe", **_TINY, rope_base=1000000.0, eps=1e-6, tied=False, head_dim=32,
                      n_expert=8, n_expert_used=4, n_ff_exp=32),
    # OLMoE's k_norm is [n_embd], as long as K only when KV heads = heads (OLMoE-1B-7B: 16 and 16).
    "olmoe": Shape("olmoe", **{**_TINY, "n_kv_head": 4, "n_ff": 32}, rope_base=10000.0, eps=1e-5, tied=False,
                   n_expert=8, n_expert_used=3),
    "qwen2moe": Shape("qwen2moe", **_TINY, rope_base=1000000.0, eps=1e-6, tied=False,
                      n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=96),
    "mixtral": Shape("mixtral", **{**_TINY, "n_ff": 64}, rope_base=1000000.0, eps=1e-5, tied=False,
                     n_expert=8, n_expert_used=2),
    # 4 layers: 0 and 2 windowed, 1 and 3 global. 4 heads of 32 (q is 128 wide, D is 64: gpt-oss-20b
    # has 64 x 64 = 4096 against 2880). YaRN's original context of 256 puts the ramp between the
    # interpolated and the extrapolated frequencies at rotary pairs 0..5 of 16.
    "gpt-oss": Shape("gpt-oss", **{**_TINY, "n_layer": 4, "n_ff": 64, "ctx": 8192}, rope_base=150000.0, eps=1e-5,
                     tied=False, head_dim=32, window=8, n_expert=8, n_expert_used=4, n_ff_exp=64,
                     yarn_factor=32.0, yarn_orig_ctx=256),
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
    # Mixtures of experts: billions of parameters at full depth, so use --layers N.
    "qwen3-30b-a3b": Shape("qwen3moe", n_embd=2048, n_layer=48, n_head=32, n_kv_head=4, n_ff=6144, n_vocab=151936,
                           ctx=40960, rope_base=1000000.0, eps=1e-6, tied=False, head_dim=128, logit_std=8.0,
                           n_expert=128, n_expert_used=8, n_ff_exp=768),
    "olmoe-1b-7b": Shape("olmoe", n_embd=2048, n_layer=16, n_head=16, n_kv_head=16, n_ff=1024, n_vocab=50304,
                         ctx=4096, rope_base=10000.0, eps=1e-5, tied=False, logit_std=8.0, n_expert=64,
                         n_expert_used=8),
    "qwen1.5-moe-a2.7b": Shape("qwen2moe", n_embd=2048, n_layer=24, n_head=16, n_kv_head=16, n_ff=5632,
                               n_vocab=151936, ctx=8192, rope_base=1000000.0, eps=1e-6, tied=False, logit_std=8.0,
                               n_expert=60, n_expert_used=4, n_ff_exp=1408, n_ff_shexp=5632),
    "mixtral-8x7b": Shape("mixtral", n_embd=4096, n_layer=32, n_head=32, n_kv_head=8, n_ff=14336, n_vocab=32000,
                          ctx=32768, rope_base=1000000.0, eps=1e-5, tied=False, logit_std=8.0, n_expert=8,
                          n_expert_used=2),
    "gpt-oss-20b": Shape("gpt-oss", n_embd=2880, n_layer=24, n_head=64, n_kv_head=8, n_ff=2880, n_vocab=201088,
                         ctx=131072, rope_base=150000.0, eps=1e-5, tied=False, head_dim=64, window=128,
                         logit_std=8.0, n_expert=32, n_expert_used=4, n_ff_exp=2880, yarn_factor=32.0,
                         yarn_orig_ctx=4096),
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
        if s.family in ("qwen2", "qwen2moe", "gpt-oss"):
            # K's bias is seen through RoPE (q.R(p')b_k varies with the key's position). V's bias
            # adds one constant vector to every position of every layer; kept small, or greedy
            # continuations collapse onto the token it favours.
            specs += [(p + "attn_q.bias", (qd,), "bias", 0.5), (p + "attn_k.bias", (kvd,), "bias", 0.5),
                      (p + "attn_v.bias", (kvd,), "bias", 0.15)]
        if s.family in ("qwen3", "gemma3", "qwen3moe"):
            # QK-normed q and k have rms ~ the norm weight, so ~0.9 gives scores of std ~0.8.
            specs += [(p + "attn_q_norm.weight", (hd,), "norm", 0.9), (p + "attn_k_norm.weight", (hd,), "norm", 0.9)]
        if s.family == "olmoe":  # one RMS norm over the whole q (k) vector, all heads together
            specs += [(p + "attn_q_norm.weight", (qd,), "norm", 0.9), (p + "attn_k_norm.weight", (kvd,), "norm", 0.9)]
        specs.append((p + "attn_output.weight", (D, qd), "mat", 1.0 / np.sqrt(qd)))
        if s.family == "gpt-oss":
            # One learned logit per head in every softmax's denominator: N(0, 1.5) against scores of
            # std ~0.65 takes from a few percent to most of a row's mass, more at early positions.
            specs += [(p + "attn_output.bias", (D,), "bias", 0.15), (p + "attn_sinks.weight", (s.n_head,), "bias", 1.5)]
        if s.family == "gemma3":
            specs.append((p + "post_attention_norm.weight", (D,), "norm", 1.0))
        # gpt-oss names its FFN's input norm post_attention_norm (it has no ffn_norm).
        ffn_norm = "post_attention_norm.weight" if s.family == "gpt-oss" else "ffn_norm.weight"
        specs.append((p + ffn_norm, (D,), "norm", 1.0))
        if s.n_expert:
            specs += moe_specs(s, p)
        elif s.family == "phi3":
            specs.append((p + "ffn_up.weight", (2 * FF, D), "mat", 1.0 / np.sqrt(D)))  # gate rows, then up rows
        else:
            specs += [(p + "ffn_gate.weight", (FF, D), "mat", 1.0 / np.sqrt(D)),
                      (p + "ffn_up.weight", (FF, D), "mat", 1.0 / np.sqrt(D))]
        if not s.n_expert:
            specs.append((p + "ffn_down.weight", (D, FF), "mat", 1.0 / np.sqrt(FF)))
        if s.family == "gemma3":
            specs.append((p + "post_ffw_norm.weight", (D,), "norm", 1.0))
    return specs


def moe_specs(s, p):
    """One layer's mixture of experts, numpy shapes (GGUF's ne reversed): the router
    ffn_gate_inp [n_expert, D], the experts as 3-D tensors [n_expert, n_ff_exp, D] (gate, up) and
    [n_expert, D, n_ff_exp] (down), one expert's rows contiguous."""
    D, E, F = s.n_embd, s.n_expert, s.ff_exp
    # Router logits of std ~2 (the input is RMS-normed): the softmax weights differ by several times
    # between the chosen experts, and neighbouring tokens choose different experts.
    specs = [(p + "ffn_gate_inp.weight", (E, D), "mat", 2.0 / np.sqrt(D))]
    if s.family == "gpt-oss":
        # gate and up of std ~3 (plus their biases), so that the clamps of swiglu_oai (gate <= 7,
        # |up| <= 7) bite on a few percent of the values; down is scaled down to match.
        specs += [(p + "ffn_gate_inp.bias", (E,), "bias", 0.5),
                  (p + "ffn_gate_exps.weight", (E, F, D), "mat", 3.0 / np.sqrt(D)),
                  (p + "ffn_gate_exps.bias", (E, F), "bias", 0.5),
                  (p + "ffn_up_exps.weight", (E, F, D), "mat", 3.0 / np.sqrt(D)),
                  (p + "ffn_up_exps.bias", (E, F), "bias", 0.5),
                  (p + "ffn_down_exps.weight", (E, D, F), "mat", 0.15 / np.sqrt(F)),
                  (p + "ffn_down_exps.bias", (E, D), "bias", 0.1)]
        return specs
    specs += [(p + "ffn_gate_exps.weight", (E, F, D), "mat", 1.0 / np.sqrt(D)),
              (p + "ffn_up_exps.weight", (E, F, D), "mat", 1.0 / np.sqrt(D)),
              (p + "ffn_down_exps.weight", (E, D, F), "mat", 1.0 / np.sqrt(F))]
    if s.n_ff_shexp:
        FS = s.n_ff_shexp
        # The shared expert's gate: sigmoid of a logit of std ~1.5.
        specs += [(p + "ffn_gate_inp_shexp.weight", (D,), "bias", 1.5 / np.sqrt(D)),
                  (p + "ffn_gate_shexp.weight", (FS, D), "mat", 1.0 / np.sqrt(D)),
                  (p + "ffn_up_shexp.weight", (FS, D), "mat", 1.0 / np.sqrt(D)),
                  (p + "ffn_down_shexp.weight", (D, FS), "mat", 1.0 / np.sqrt(FS))]
    return specs


def tensor_type(name, shape, qt, expert_qt):
    """Norms, biases, sinks and routers stay f32 (llama.cpp's converter and llama-quantize leave
    ffn_gate_inp alone); the 3-D expert tensors take expert_qt; the other matrices qt."""
    if len(shape) == 1 or name.endswith(".bias") or name.endswith("ffn_gate_inp.weight"):
        return Q.F32
    if name.endswith("_exps.weight"):
        return expert_qt
    return qt


def _values(rng, shape, kind, scale, rows_from, rows_to):
    n = (rows_to - rows_from,) + tuple(shape[1:])
    if kind == "norm":
        return (scale * (1.0 + 0.1 * rng.standard_normal(n))).astype(np.float32)
    return rng.standard_normal(n, dtype=np.float32) * np.float32(scale)


def _encode(rng, shape, kind, scale, qtype):
    """The tensor's bytes as stored: drawn and quantized in chunks of rows to bound memory."""
    if len(shape) == 1:
        return _values(rng, shape, kind, scale, 0, shape[0])
    # A 3-D tensor is drawn as its rows in order (expert 0's first), as if it were 2-D.
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    step = max(1, (1 << (21 if qtype == Q.MXFP4 else 23)) // cols)  # mxfp4's quantizer needs 64 bytes a weight
    parts = []
    for r in range(0, rows, step):
        a = _values(rng, (rows, cols), kind, scale, r, min(rows, r + step))
        parts.append(a if qtype == Q.F32 else quantize(a, qtype))
    out = np.concatenate(parts, axis=0)
    return out.reshape(tuple(shape[:-1]) + out.shape[1:])


POOL_BLOCKS = 1 << 16  # distinct blocks a pooled tensor draws from


def _pooled_blocks(rng, shape, kind, scale, qtype):
    """A block-quantized matrix's bytes drawn from a pool, for speed shapes of billions of weights:
    POOL_BLOCKS blocks quantized (by the gguf package) from floats of the tensor's scale, then every
    block of the tensor a uniformly random one of them. Codes and scale bytes are those a quantizer
    writes for such weights, at the cost of one gather (seconds a gigabyte, where the float path's
    MXFP4 quantizer takes minutes); the values are not a draw of independent weights, so pooled
    files are for timing, never for reference checks."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = int(np.prod(shape)) // block
    n_pool = min(POOL_BLOCKS, n_blocks)
    pool = quantize(_values(rng, (n_pool, block), kind, scale, 0, n_pool), qtype)  # [n_pool, nbytes]
    pool = np.ascontiguousarray(pool).view(f"V{nbytes}").reshape(-1)  # one item a block
    out = np.empty(n_blocks, dtype=pool.dtype)  # [n_blocks] blocks, rows in order (expert 0's first)
    step = 1 << 22
    for b in range(0, n_blocks, step):
        m = min(step, n_blocks - b)
        np.take(pool, rng.integers(0, n_pool, m), out=out[b:b + m])
    return out.view(np.uint8).reshape(tuple(shape[:-1]) + (shape[-1] // block * nbytes,))


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_kv(path):
    """A GGUF's metadata: {key: (GGUFValueType, value, element type of an array or None)}. A plain
    reader of the header, since gguf.GGUFReader takes a minute over o200k's 650k strings."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 24  # magic, version, tensor count

    def scalar(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = scalar("<Q")
        pos += n
        return data[pos - n:pos].decode("utf-8")

    def value(t):
        nonlocal pos
        if t == 8:
            return string()
        if t != 9:
            return scalar(_SCALARS[t])
        sub, n = scalar("<I"), scalar("<Q")
        if sub == 8:
            return [string() for _ in range(n)]
        fmt = _SCALARS[sub]
        out = np.frombuffer(data, dtype=np.dtype(fmt), count=n, offset=pos).tolist()
        pos += n * struct.calcsize(fmt)
        return out

    n_kv = struct.unpack_from("<Q", data, 16)[0]
    kv = {}
    for _ in range(n_kv):
        key = string()
        t = scalar("<I")
        sub = struct.unpack_from("<I", data, pos)[0] if t == 9 else None
        kv[key] = (gguf.GGUFValueType(t), value(t), None if sub is None else gguf.GGUFValueType(sub))
    return kv


def read_vocab(path):
    """The tokenizer.* metadata of the GGUF at path (a vocabulary-only file such as
    models/o200k-harmony-vocab.gguf) and its token count."""
    kv = {k: v for k, v in read_kv(path).items() if k.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in kv:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens to copy")
    return kv, len(kv["tokenizer.ggml.tokens"][1])


def copy_vocab(w, kv):
    """Writes read_vocab's metadata into w."""
    for key, (vtype, val, sub) in kv.items():
        w.add_key_value(key, val, vtype, sub_type=sub)


POOLING = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS, "last": gguf.PoolingType.LAST}


def write_family_gguf(path, family, shape="tiny", qtype="f32", seed=0, window=None, layers=None, expert_type=None,
                      pooling=None, block_pool=False, vocab_from=None, chat_template=None):
    """Writes the model; returns its Shape. qtype: f32, f16, q8_0, q4_0 (or a GGMLQuantizationType).
    window replaces the shape's attention.sliding_window (a real shape's 512 reached by short checks);
    layers keeps the first N layers (a real MoE shape at full depth is tens of GB); expert_type
    (f32, f16, q8_0, q4_0, mxfp4) is the 3-D expert tensors' type, by default qtype (gpt-oss: mxfp4);
    pooling (mean, cls, last) makes it an embedding model. block_pool draws every block-quantized
    matrix from a pool of random blocks (_pooled_blocks: speed shapes only); vocab_from copies the
    tokenizer of another GGUF in place of the random one (a real shape must have its vocabulary
    size; the tiny shape takes it); chat_template is written as tokenizer.chat_template."""
    s = shape_of(family, shape)
    if window is not None:
        if not s.window:
            raise ValueError(f"{family} {shape} has no sliding window to replace")
        s = dataclasses.replace(s, window=int(window))
    if layers is not None:
        if not 1 <= int(layers) <= s.n_layer:
            raise ValueError(f"--layers {layers}: {family} {shape} has 1 to {s.n_layer}")
        s = dataclasses.replace(s, n_layer=int(layers))
    vocab_file = None
    if vocab_from is not None:
        # A tiny shape takes the copied vocabulary's size; a real one must have it already.
        vocab_file, n_vocab = read_vocab(vocab_from)
        if shape == "tiny":
            s = dataclasses.replace(s, n_vocab=n_vocab)
        elif n_vocab != s.n_vocab:
            raise ValueError(f"{vocab_from}: {n_vocab} tokens, {shape} has a vocabulary of {s.n_vocab}")
    qt = TYPES[qtype] if isinstance(qtype, str) else Q(qtype)
    if qt not in FILE_TYPES:
        raise ValueError(f"unsupported type {qtype!r} (one of {', '.join(TYPES)})")
    if expert_type is None:
        eqt = Q.MXFP4 if s.family == "gpt-oss" else qt
    else:
        if not s.n_expert:
            raise ValueError(f"{family} has no experts for --expert-type")
        eqt = EXPERT_TYPES.get(expert_type) if isinstance(expert_type, str) else Q(expert_type)
        if eqt not in EXPERT_TYPES.values():
            raise ValueError(f"unsupported expert type {expert_type!r} (one of {', '.join(EXPERT_TYPES)})")
    arch = s.arch
    w = gguf.GGUFWriter(path, arch)
    name = f"random-{family}-{shape}-{qt.name.lower()}-seed{seed}" + (f"-window{window}" if window else "")
    if layers is not None:
        name += f"-layers{s.n_layer}"
    if expert_type is not None:
        name += f"-experts{eqt.name.lower()}"
    if block_pool:
        name += "-pooled"
    if pooling is not None:
        name += f"-pooling{pooling}"
        w.add_pooling_type(POOLING[pooling])
    w.add_name(name)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if eqt == Q.MXFP4 else FILE_TYPES[qt]))
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
    if s.n_expert:  # as the converters write them: the experts' FF only where it is not n_ff
        w.add_expert_count(s.n_expert)
        w.add_expert_used_count(s.n_expert_used)
        if s.n_ff_exp:
            w.add_expert_feed_forward_length(s.n_ff_exp)
        if s.n_ff_shexp:
            w.add_expert_shared_feed_forward_length(s.n_ff_shexp)
    if s.yarn_factor:  # gpt-oss's config: rope_type yarn, beta_fast 32, beta_slow 1
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(s.yarn_factor)
        w.add_rope_scaling_orig_ctx_len(s.yarn_orig_ctx)
        w.add_rope_scaling_yarn_beta_fast(32.0)
        w.add_rope_scaling_yarn_beta_slow(1.0)
    if arch == "granite":
        w.add_attention_scale(s.attention_scale)
        w.add_embedding_scale(s.embedding_scale)
        w.add_residual_scale(s.residual_scale)
        w.add_logit_scale(s.logit_scale)
    if vocab_file is not None:
        copy_vocab(w, vocab_file)
    else:
        write_random_vocab(w, arch, s.n_vocab)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    specs = [(n, shp, kind, scale, tensor_type(n, shp, qt, eqt)) for n, shp, kind, scale in tensor_specs(s)]
    for name, shp, kind, scale, t in specs:
        if t in (Q.F32, Q.F16):
            nbytes = int(np.prod(shp)) * (4 if t == Q.F32 else 2)
            w.add_tensor_info(name, shp, np.dtype(np.float32 if t == Q.F32 else np.float16), nbytes)
        else:
            bshape = quant_shape_to_byte_shape(shp, t)
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), int(np.prod(bshape)), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp, kind, scale, t in specs:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        pooled = block_pool and len(shp) > 1 and t not in (Q.F32, Q.F16)
        w.write_tensor_data(_pooled_blocks(rng, shp, kind, scale, t) if pooled else _encode(rng, shp, kind, scale, t))
    w.close()
    return s


def write_random_vocab(w, arch, n_vocab):
    """The SentencePiece-style vocabulary of vocab(), with its special ids."""
    toks, types, ids = vocab(arch, n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([-float(k) for k in range(n_vocab)])
    w.add_token_types(types)
    w.add_bos_token_id(ids["bos"])
    w.add_eos_token_id(ids["eos"])
    w.add_unk_token_id(ids["unk"])
    if "pad" in ids:
        w.add_pad_token_id(ids["pad"])
    if arch == "gemma3":  # as Gemma's GGUF says
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("family", choices=FAMILIES)
    ap.add_argument("--shape", default="tiny", help="tiny, real, or one of " + ", ".join(REAL_SHAPES))
    ap.add_argument("--type", default="f32", choices=list(TYPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, help="replace the shape's attention.sliding_window")
    ap.add_argument("--layers", type=int, help="keep the shape's first N layers")
    ap.add_argument("--expert-type", choices=list(EXPERT_TYPES),
                    help="type of the 3-D expert tensors (default: --type; gpt-oss: mxfp4)")
    ap.add_argument("--pooling", choices=list(POOLING), help="an embedding model: its pooling_type")
    ap.add_argument("--block-pool", action="store_true",
                    help="draw block-quantized matrices from a pool of random blocks (seconds, for speed shapes)")
    ap.add_argument("--vocab-from", metavar="GGUF", help="copy this GGUF's tokenizer (e.g. models/o200k-harmony-vocab.gguf)")
    ap.add_argument("--chat-template", metavar="FILE", help="write this Jinja file as tokenizer.chat_template")
    a = ap.parse_args()
    try:
        template = None
        if a.chat_template:
            with open(a.chat_template, encoding="utf-8") as f:
                template = f.read()
        s = write_family_gguf(a.out, a.family, a.shape, a.type, a.seed, a.window, a.layers, a.expert_type, a.pooling,
                              a.block_pool, a.vocab_from, template)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    moe = f", {s.n_expert} experts, {s.n_expert_used} used" if s.n_expert else ""
    print(f"wrote {a.out}: {a.family} {a.shape} {a.type} seed {a.seed} ({s.n_layer} layers, D={s.n_embd}, "
          f"vocab {s.n_vocab}{moe})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
