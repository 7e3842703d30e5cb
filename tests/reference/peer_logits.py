#!/usr/bin/env python3
"""The llama.cpp peer's logits from Python, with no compiler: bench/compare.py's build of the
vendored llama.cpp (bench/.peer/build/bin/libllama.so) driven through the ctypes bindings of the
llama-cpp-python source package beside it (bench/.peer/llama_cpp_python-*/llama_cpp/llama_cpp.py),
loaded on their own (the package's __init__ wants modules the bindings do not need).

    python3 tests/reference/peer_logits.py MODEL.gguf [--ids "1 2 3" | --random N] [--f16-kv] [--compare]

Every position's logits of one batch (a prefill), [T, n_vocab] float32, with an f32 KV cache and no
flash attention unless --f16-kv, so that a float64 reference can be held to ~1e-4 of the logits'
spread on f32 weights. --compare also runs ref_forward.py over the same ids and prints how far the
peer is from it. --random N draws BOS and N-1 seeded ids over the vocabulary, as check_logits.py does.
Exits 77 when the peer is not built.
"""
import argparse
import ctypes
import glob
import os
import sys
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = 77
_L = None


def bindings(peer_dir=None):
    """llama-cpp-python's llama_cpp.llama_cpp module bound to the peer's libllama, or None."""
    global _L
    if _L is not None:
        return _L
    peer_dir = peer_dir or os.path.join(ROOT, "bench", ".peer")
    lib = os.path.join(peer_dir, "build", "bin")
    src = sorted(glob.glob(os.path.join(peer_dir, "llama_cpp_python-*", "llama_cpp", "llama_cpp.py")))
    if not os.path.exists(os.path.join(lib, "libllama.so")) or not src:
        return None
    os.environ["LLAMA_CPP_LIB_PATH"] = lib
    pkg = types.ModuleType("llama_cpp")
    pkg.__path__ = [os.path.dirname(src[-1])]
    sys.modules.setdefault("llama_cpp", pkg)
    import llama_cpp.llama_cpp as L  # noqa: E402  (the bindings only, not the package's __init__)
    L.llama_log_set(_QUIET, None)
    L.llama_backend_init()
    _L = L
    return L


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _QUIET(level, text, data):
    if level >= 4:  # GGML_LOG_LEVEL_ERROR
        sys.stderr.write(text.decode(errors="replace"))


def peer_logits(model_path, ids, f32_kv=True, threads=2):
    """[T, n_vocab] float32 logits of every position, the ids decoded as one batch."""
    L = bindings()
    if L is None:
        raise RuntimeError("the llama.cpp peer is not built (python3 bench/compare.py builds it)")
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp cannot load {model_path}")
    try:
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        T = len(ids)
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = T + 8
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = True
        if f32_kv:  # no f16 rounding of K and V
            cp.type_k = cp.type_v = 0  # GGML_TYPE_F32
            cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise RuntimeError("llama.cpp cannot make a context")
        try:
            b = L.llama_batch_init(T, 0, 1)
            for i, t in enumerate(ids):
                b.token[i] = int(t)
                b.pos[i] = i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 1
            b.n_tokens = T
            if L.llama_decode(ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
            out = np.empty((T, n_vocab), dtype=np.float32)
            for i in range(T):
                out[i] = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
            L.llama_batch_free(b)
            return out
        finally:
            L.llama_free(ctx)
    finally:
        L.llama_model_free(model)


def random_ids(n_vocab, bos, n, seed=1234):
    ids = [int(t) for t in np.random.default_rng(seed).integers(0, n_vocab, n)]
    return ([int(bos)] if bos is not None else []) + ids[:n - (bos is not None)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--ids", help="token ids, space-separated")
    ap.add_argument("--random", type=int, default=64, help="else BOS and N-1 seeded random ids")
    ap.add_argument("--f16-kv", action="store_true", help="the peer's default f16 KV cache and attention")
    ap.add_argument("--compare", action="store_true", help="and against ref_forward.py")
    ap.add_argument("--out", help="write the peer's logits as .npy")
    a = ap.parse_args()
    if bindings() is None:
        print("SKIP: no llama.cpp peer under bench/.peer (python3 bench/compare.py builds it)")
        return SKIP
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ref_forward import RefModel
    ref = RefModel(a.model) if a.compare or not a.ids else None
    if a.ids:
        ids = [int(t) for t in a.ids.split()]
    else:
        ids = random_ids(ref.out_w.shape[0], ref.value("tokenizer.ggml.bos_token_id"), a.random)
    got = peer_logits(a.model, ids, f32_kv=not a.f16_kv)
    if a.out:
        np.save(a.out, got)
    print("peer argmax per position:", " ".join(str(i) for i in got.argmax(-1)))
    if a.compare:
        want = ref.forward(np.array(ids))
        d = np.abs(got - want)
        print(f"{os.path.basename(a.model)}: logits std {want.std():.3f}; peer - reference: max {d.max():.2e} "
              f"({d.max() / want.std():.1e} of the std), median {np.median(d):.1e}, last token max "
              f"{d[-1].max():.2e}; top-1 same at {(got.argmax(-1) == want.argmax(-1)).sum()}/{len(ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
