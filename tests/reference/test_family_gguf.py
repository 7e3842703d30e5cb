#!/usr/bin/env python3
"""Checks of the checkers: family_gguf.py writes what llama.cpp reads for each family, and
ref_forward.py reads those families as llama.cpp runs them (which layers are windowed, which RoPE
base and attention scale each uses). Runs in seconds:

    python3 tests/reference/test_family_gguf.py
"""
import hashlib
import os
import sys
import tempfile
import unittest

try:
    import numpy as np
    from gguf import GGUFReader
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from family_gguf import FAMILIES, REAL_SHAPES, write_family_gguf
    from ref_forward import RefModel
except ImportError as e:
    print(f"SKIP: needs numpy and gguf ({e}); run scripts/setup.sh")
    sys.exit(77)


def layer_tensors(path, il):
    names = {t.name for t in GGUFReader(path).tensors}
    prefix = f"blk.{il}."
    return {n[len(prefix):] for n in names if n.startswith(prefix)}, names


class FamilyModels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.path = {}
        for fam in FAMILIES:
            cls.path[fam] = os.path.join(cls.dir.name, f"{fam}.gguf")
            write_family_gguf(cls.path[fam], fam, "tiny", "q8_0", seed=0)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_tensor_names_are_llama_cpps(self):
        common = {"attn_norm.weight", "attn_output.weight", "ffn_norm.weight", "ffn_down.weight"}
        separate = {"attn_q.weight", "attn_k.weight", "attn_v.weight", "ffn_gate.weight", "ffn_up.weight"}
        want = {
            "llama": common | separate,
            "granite": common | separate,
            "qwen2": common | separate | {"attn_q.bias", "attn_k.bias", "attn_v.bias"},
            "qwen3": common | separate | {"attn_q_norm.weight", "attn_k_norm.weight"},
            "gemma3": common | separate | {"attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
                                           "post_ffw_norm.weight"},
            "phi3": common | {"attn_qkv.weight", "ffn_up.weight"},
        }
        for fam in FAMILIES:
            got, names = layer_tensors(self.path[fam], 0)
            self.assertEqual(got, want[fam], fam)
            self.assertIn("token_embd.weight", names)
            self.assertIn("output_norm.weight", names)
            # Tied like the real models: Qwen2.5-0.5B, Qwen3-0.6B, Gemma 3, Granite 3.1 2B.
            self.assertEqual("output.weight" in names, fam in ("llama", "phi3"), fam)

    def test_fused_and_head_shapes(self):
        r = GGUFReader(self.path["phi3"])
        shape = {t.name: [int(d) for d in t.shape] for t in r.tensors}
        self.assertEqual(shape["blk.0.attn_qkv.weight"], [64, 64 + 2 * 32])  # Q 4x16, K and V 2x16
        self.assertEqual(shape["blk.0.ffn_up.weight"], [64, 2 * 128])  # gate rows, then up rows
        r = GGUFReader(self.path["qwen3"])
        shape = {t.name: [int(d) for d in t.shape] for t in r.tensors}
        self.assertEqual(shape["blk.0.attn_q.weight"], [64, 4 * 32])  # key_length 32, not 64/4
        self.assertEqual(shape["blk.0.attn_q_norm.weight"], [32])
        self.assertEqual(shape["blk.0.attn_output.weight"], [4 * 32, 64])

    def test_metadata_keys(self):
        def kv(fam, key):
            f = GGUFReader(self.path[fam]).fields.get(f"{fam}.{key}")
            return None if f is None else f.contents()
        self.assertEqual(kv("gemma3", "attention.sliding_window"), 5)
        self.assertEqual(kv("gemma3", "attention.key_length"), 32)
        self.assertEqual(kv("gemma3", "block_count"), 6)
        self.assertEqual(kv("qwen3", "attention.key_length"), 32)
        self.assertEqual(kv("phi3", "rope.dimension_count"), 16)
        for key, value in (("embedding_scale", 6.0), ("residual_scale", 0.5), ("attention.scale", 0.125),
                           ("logit_scale", 4.0)):
            self.assertAlmostEqual(kv("granite", key), value, places=6)

    def test_same_seed_same_bytes_other_seed_other_weights(self):
        def digest(p):
            with open(p, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()
        again = os.path.join(self.dir.name, "again.gguf")
        write_family_gguf(again, "gemma3", "tiny", "q8_0", seed=0)
        self.assertEqual(digest(again), digest(self.path["gemma3"]))
        write_family_gguf(again, "gemma3", "tiny", "q8_0", seed=1)
        self.assertNotEqual(digest(again), digest(self.path["gemma3"]))

    def test_bad_requests_are_errors(self):
        with self.assertRaises(ValueError):
            write_family_gguf(os.path.join(self.dir.name, "x.gguf"), "mamba")
        with self.assertRaises(ValueError):
            write_family_gguf(os.path.join(self.dir.name, "x.gguf"), "qwen2", "gemma3-270m")
        with self.assertRaises(ValueError):
            write_family_gguf(os.path.join(self.dir.name, "x.gguf"), "qwen2", "tiny", window=8)

    def test_real_shapes_match_their_configs(self):
        s = REAL_SHAPES["gemma3-270m"]
        self.assertEqual((s.n_embd, s.n_layer, s.n_head, s.n_kv_head, s.hd, s.n_ff, s.n_vocab, s.window),
                         (640, 18, 4, 1, 256, 2048, 262144, 512))
        s = REAL_SHAPES["qwen3-0.6b"]
        self.assertEqual((s.n_embd, s.n_layer, s.n_head, s.n_kv_head, s.hd), (1024, 28, 16, 8, 128))


class ReferenceReadsFamilies(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.ref = {}
        for fam in FAMILIES:
            p = os.path.join(cls.dir.name, f"{fam}.gguf")
            write_family_gguf(p, fam, "tiny", "f32", seed=0)
            cls.ref[fam] = RefModel(p)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_gemma3_every_sixth_layer_is_global(self):
        g = self.ref["gemma3"]
        self.assertEqual(g.swa_layers, {0, 1, 2, 3, 4})
        self.assertEqual(g.window, 5)
        self.assertEqual(g.rope_base_swa, 10000.0)
        self.assertEqual(g.rope_base, 1000000.0)
        self.assertAlmostEqual(g.attn_scale, 1 / np.sqrt(32))  # head_dim, not D/heads
        self.assertAlmostEqual(g.embd_scale, 8.0)

    def test_phi3_window_is_ignored_as_llama_cpp_does(self):
        self.assertEqual(self.ref["phi3"].window, 0)
        self.assertEqual(self.ref["phi3"].swa_layers, set())

    def test_rope_styles(self):
        self.assertFalse(self.ref["llama"].neox)
        self.assertFalse(self.ref["granite"].neox)
        for fam in ("qwen2", "qwen3", "gemma3", "phi3"):
            self.assertTrue(self.ref[fam].neox, fam)

    def test_window_limits_what_a_local_layer_sees(self):
        # With every layer local, each layer looks back window-1 = 4 positions, so 6 stacked
        # layers carry a token's influence exactly 24 positions on, and no further.
        g = self.ref["gemma3"]
        saved = g.swa_layers
        g.swa_layers = set(range(g.n_layer))
        try:
            toks = np.arange(10, 50)
            changed = toks.copy()
            changed[5] += 1
            a, b = g.forward(toks), g.forward(changed)
            reach = 5 + g.n_layer * (g.window - 1)
            self.assertTrue(np.allclose(a[reach + 1:], b[reach + 1:]))
            self.assertFalse(np.allclose(a[reach], b[reach]))
        finally:
            g.swa_layers = saved

    def test_granite_divides_logits_by_logit_scale(self):
        r = self.ref["granite"]
        toks = np.arange(5, 20)
        a = r.forward(toks)
        r.logit_div = 1.0
        try:
            self.assertTrue(np.allclose(r.forward(toks), a * 4.0))
        finally:
            r.logit_div = 4.0


if __name__ == "__main__":
    unittest.main()
