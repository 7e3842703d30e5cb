#!/usr/bin/env python3
"""Writes tiny Llama-architecture GGUFs with seeded random weights, one per weight type, each
quantized by the `gguf` package's own quantizers (not tandem's), for reference checks:

    python3 tests/reference/make_tiny_models.py OUT_DIR   -> OUT_DIR/tiny-{f32,f16,bf16,q8_0,q4_0,q4_1}.gguf
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

D, FF, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 128, 2, 4, 2, 300
TYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1}


def write(path, qtype):
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-reference")
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    toks = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    toks += [("\u2581" + chr(ord("a") + i % 26) * (1 + i // 26)).encode() for i in range(VOCAB - len(toks))]
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([-float(k) for k in range(VOCAB)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (VOCAB - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def mat(name, rows, cols, scale):
        a = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if qtype == Q.F32:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)

    def vec(name):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32))

    mat("token_embd.weight", VOCAB, D, 1.0)
    vec("output_norm.weight")
    mat("output.weight", VOCAB, D, 0.2)
    hd = D // HEADS
    for l in range(LAYERS):
        p = f"blk.{l}."
        vec(p + "attn_norm.weight")
        mat(p + "attn_q.weight", D, D, 0.3)
        mat(p + "attn_k.weight", hd * KV_HEADS, D, 0.3)
        mat(p + "attn_v.weight", hd * KV_HEADS, D, 0.3)
        mat(p + "attn_output.weight", D, D, 0.1)
        vec(p + "ffn_norm.weight")
        mat(p + "ffn_gate.weight", FF, D, 0.2)
        mat(p + "ffn_up.weight", FF, D, 0.2)
        mat(p + "ffn_down.weight", D, FF, 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, qtype in TYPES.items():
        write(os.path.join(out, f"tiny-{name}.gguf"), qtype)
    print("wrote", len(TYPES), "tiny models to", out)


if __name__ == "__main__":
    main()
