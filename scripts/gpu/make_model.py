#!/usr/bin/env python3
"""Random-weight Llama-architecture GGUFs in a real model's shape, written in seconds (numpy only,
no `gguf` package: the GPU machine has none and reaches no network).

    python3 scripts/gpu/make_model.py OUT.gguf SHAPE TYPE
    SHAPE: tiny | smollm2-135m | llama-1b | llama-8b (../shared/tools/make_gguf.py's shapes)
    TYPE:  f16 | q4_0

Speed does not depend on the weights' values, so every tensor's bytes are tiled from one pool of
valid random blocks (a few MB) instead of drawing and quantizing 8 billion numbers: the 8B F16
file (16 GB) takes about as long as the disk takes to write it. q4_0 follows llama-quantize's
Q4_0 mix, as the llama.cpp figures in ../shared/README.md were measured: every matrix Q4_0
except the output head (output.weight, or token_embd when tied), which is Q6_K (Q8_0 when
d_model is not a multiple of 256); norms F32.
The vocabulary is make_gguf.py's: <unk> <s> </s>, 256 byte tokens, then "▁a", "▁b", ...
"""
import struct
import sys

import numpy as np

# d_model, d_ff, layers, heads, kv heads, vocab, rope base, tied embeddings
SHAPES = {
    "tiny": (64, 192, 4, 8, 4, 512, 10000.0, True),
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, 100000.0, True),
    "llama-1b": (2048, 8192, 16, 32, 8, 128256, 500000.0, True),
    "llama-8b": (4096, 14336, 32, 32, 8, 128256, 500000.0, False),
}

F32, F16, Q4_0, Q8_0, Q6_K = 0, 1, 2, 8, 14  # ggml type ids
BLOCK = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q8_0: (32, 34), Q6_K: (256, 210)}  # (weights, bytes) per block
FILE_TYPE = {"f16": 1, "q4_0": 2}  # general.file_type: MOSTLY_F16, MOSTLY_Q4_0
ALIGN = 32
POOL_BYTES = 24 << 20


def block_pool(ggml_type, rng):
    """POOL_BYTES (rounded to whole blocks) of valid random blocks of the type, scales small."""
    per, size = BLOCK[ggml_type]
    n = POOL_BYTES // size
    if ggml_type == F16:
        return (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float16).view(np.uint8)
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    scale = (rng.uniform(0.002, 0.006, size=n)).astype(np.float16).view(np.uint8).reshape(n, 2)
    if ggml_type in (Q4_0, Q8_0):  # d (f16), then 16 bytes of nibbles or 32 int8
        raw[:, 0:2] = scale
    else:  # Q6_K: ql[128], qh[64], scales[16] (int8), d (f16)
        raw[:, 192:208] = rng.integers(-32, 32, size=(n, 16), dtype=np.int8).view(np.uint8)
        raw[:, 208:210] = scale
    return raw.reshape(-1)


class Writer:
    def __init__(self):
        self.kv = []  # encoded key/value records
        self.tensors = []  # (name, dims [cols, rows], type, nbytes, source)

    @staticmethod
    def _str(s):
        b = s.encode() if isinstance(s, str) else s
        return struct.pack("<Q", len(b)) + b

    def add(self, key, kind, value):
        enc = {"u32": (4, "<I"), "f32": (6, "<f"), "bool": (7, "<?"), "str": (8, None)}
        code, fmt = enc[kind]
        body = self._str(value) if kind == "str" else struct.pack(fmt, value)
        self.kv.append(self._str(key) + struct.pack("<I", code) + body)

    def add_array(self, key, kind, values):
        if kind == "str":
            body = b"".join(self._str(v) for v in values)
            code = 8
        else:
            code, dt = {"f32": (6, "<f4"), "i32": (5, "<i4")}[kind]
            body = np.asarray(values, dtype=dt).tobytes()
        self.kv.append(self._str(key) + struct.pack("<IIQ", 9, code, len(values)) + body)

    def tensor(self, name, rows, cols, ggml_type, source):
        per, size = BLOCK[ggml_type]
        assert cols % per == 0, (name, cols, per)
        self.tensors.append((name, rows, cols, ggml_type, rows * (cols // per) * size, source))

    def write(self, path):
        with open(path, "wb", buffering=1 << 24) as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
            for rec in self.kv:
                f.write(rec)
            offset = 0
            for name, rows, cols, t, nbytes, _ in self.tensors:
                dims = [cols] if rows == 1 else [cols, rows]
                f.write(self._str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims))
                f.write(struct.pack("<IQ", t, offset))
                offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
            f.write(b"\0" * (-f.tell() % ALIGN))
            for _, _, _, _, nbytes, source in self.tensors:
                if isinstance(source, np.ndarray):
                    data = source.view(np.uint8).reshape(-1)
                    assert data.size == nbytes
                    f.write(data.tobytes())
                else:  # a pool: tiled from a per-tensor start, whole blocks at a time
                    pool, start = source
                    view = memoryview(pool)
                    left, at = nbytes, start
                    while left:
                        n = min(left, len(pool) - at)
                        f.write(view[at:at + n])
                        left -= n
                        at = 0
                f.write(b"\0" * (-nbytes % ALIGN))


def vocabulary(V):
    toks = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    types = [2, 3, 3] + [6] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(toks) < V:
        s, n = "", i
        while True:
            s += letters[n % 26]
            n //= 26
            if n == 0:
                break
        toks.append(("\u2581" + s).encode())
        types.append(1)
        i += 1
    return toks, types


def main(out, shape, kind):
    d, ff, L, h, kv, V, theta, tied = SHAPES[shape]
    hd = d // h
    rng = np.random.default_rng(1234)
    w = Writer()
    w.add("general.architecture", "str", "llama")
    w.add("general.name", "str", f"random-{shape}-{kind}")
    w.add("general.alignment", "u32", ALIGN)
    w.add("general.file_type", "u32", FILE_TYPE[kind])
    for key, k, v in (("context_length", "u32", 8192), ("embedding_length", "u32", d), ("block_count", "u32", L),
                      ("feed_forward_length", "u32", ff), ("attention.head_count", "u32", h),
                      ("attention.head_count_kv", "u32", kv), ("rope.dimension_count", "u32", hd),
                      ("rope.freq_base", "f32", theta), ("attention.layer_norm_rms_epsilon", "f32", 1e-5)):
        w.add("llama." + key, k, v)
    toks, types = vocabulary(V)
    w.add("tokenizer.ggml.model", "str", "llama")
    w.add_array("tokenizer.ggml.tokens", "str", toks)
    w.add_array("tokenizer.ggml.scores", "f32", [-float(k) for k in range(V)])
    w.add_array("tokenizer.ggml.token_type", "i32", types)
    for key, v in (("bos_token_id", 1), ("eos_token_id", 2), ("unknown_token_id", 0)):
        w.add("tokenizer.ggml." + key, "u32", v)

    matrix = F16 if kind == "f16" else Q4_0
    # llama-quantize's choice: Q6_K, or Q8_0 where rows are not whole 256-blocks (SmolLM2's 576).
    head = F16 if kind == "f16" else Q6_K if d % 256 == 0 else Q8_0
    pools = {t: block_pool(t, rng) for t in {matrix, head}}

    def mat(name, rows, cols, t):
        size = BLOCK[t][1]
        start = int(rng.integers(0, len(pools[t]) // size)) * size
        w.tensor(name, rows, cols, t, (pools[t], start))

    ones = np.ones(d, dtype=np.float32)
    mat("token_embd.weight", V, d, head if tied else matrix)
    w.tensor("output_norm.weight", 1, d, F32, ones)
    if not tied:
        mat("output.weight", V, d, head)
    for l in range(L):
        p = f"blk.{l}."
        w.tensor(p + "attn_norm.weight", 1, d, F32, ones)
        mat(p + "attn_q.weight", d, d, matrix)
        mat(p + "attn_k.weight", kv * hd, d, matrix)
        mat(p + "attn_v.weight", kv * hd, d, matrix)
        mat(p + "attn_output.weight", d, d, matrix)
        w.tensor(p + "ffn_norm.weight", 1, d, F32, ones)
        mat(p + "ffn_gate.weight", ff, d, matrix)
        mat(p + "ffn_up.weight", ff, d, matrix)
        mat(p + "ffn_down.weight", d, ff, matrix)
    w.write(out)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[2] not in SHAPES or sys.argv[3] not in FILE_TYPE:
        sys.exit(__doc__)
    main(*sys.argv[1:])
