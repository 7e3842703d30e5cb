#!/usr/bin/env python3
"""Checks tandem's logits against the independent numpy reference (ref_forward.py).

For each model: a fixed 64-token prompt goes through tandem's three paths (prefill, decode one
token at a time, no-cache), and every position's logits are compared with the reference:
max |diff| below the tolerance and the same top-1 token at every position.

    check_logits.py --tandem build/tandem [--model M.gguf ...] [--tiny-dir DIR]

Exits 77 (CTest: skipped) when numpy/gguf or every model is missing.
"""
import argparse
import os
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ref_forward import RefModel
except ImportError as e:
    print(f"SKIP: reference needs numpy and gguf ({e}); run scripts/setup.sh")
    sys.exit(SKIP)

TEXT = ("The history of the bicycle begins in the early nineteenth century, when inventors in Europe "
        "experimented with two-wheeled machines pushed along by the rider's feet. Later designs added "
        "pedals, chains and pneumatic tyres, and within a few decades cycling had become a popular way "
        "to travel to work, to deliver goods and to explore the countryside.")


def tandem_logits(tandem, model, tokens, mode, kv_dtype, acts, vocab):
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        subprocess.run([tandem, "logits", "-m", model, "--tokens", " ".join(map(str, tokens)), "--mode", mode,
                        "--kv-dtype", kv_dtype, "--activations", acts, "-o", f.name], check=True)
        return np.fromfile(f.name, dtype=np.float32).reshape(len(tokens), vocab)


def prompt_tokens(tandem, model, n):
    out = subprocess.run([tandem, "tokenize", "-m", model, "--ids"], input=TEXT.encode(), capture_output=True,
                         check=True).stdout.decode().split()
    ids = [int(t) for t in out]
    return (ids * (n // max(1, len(ids)) + 1))[:n]


def check(tandem, model, n_tokens, tol, q8_tol):
    ref = RefModel(model)
    tokens = prompt_tokens(tandem, model, n_tokens)
    want = ref.forward(np.array(tokens))
    vocab = want.shape[1]
    ok = True
    # Exact products must meet the tolerance; the f16 cache and the 8-bit activations (the
    # default fast path, llama.cpp's numerics) add their own rounding, bounded more loosely.
    configs = [("f32", "f32", tol), ("f16", "f32", 5 * tol), ("f16", "q8", q8_tol)]
    for mode in ("prefill", "decode", "naive"):
        for kv_dtype, acts, limit in configs:
            got = tandem_logits(tandem, model, tokens, mode, kv_dtype, acts, vocab)
            diff = float(np.abs(got - want).max())
            top1 = int((got.argmax(-1) == want.argmax(-1)).sum())
            # A top-1 mismatch is only excused at a near-tie of the reference (margin < 2x the error).
            srt = np.sort(want, axis=-1)
            margin = srt[:, -1] - srt[:, -2]
            bad = [p for p in range(len(tokens)) if got[p].argmax() != want[p].argmax() and margin[p] > 2 * diff]
            status = "ok" if diff < limit and not bad else "FAIL"
            ok &= status == "ok"
            print(f"{os.path.basename(model)} {mode:7s} kv={kv_dtype} act={acts}: max|diff| {diff:.2e} (limit {limit:.1e}), "
                  f"top-1 same at {top1}/{len(tokens)} positions {status}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--tiny-dir", help="write the tiny per-type models here and check them too")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tol", type=float, default=1e-2)
    # 8-bit activations round every block to 1/254 of its largest value; on SmolLM2 that moves
    # logits (range about 40) by up to about 1.2, near-ties aside the top-1 stays the same.
    ap.add_argument("--q8-tol", type=float, default=1.5, help="limit with 8-bit activations")
    a = ap.parse_args()
    models = [m for m in a.model if os.path.exists(m)]
    for m in a.model:
        if m not in models:
            print(f"note: {m} not found (run scripts/setup.sh); skipping it")
    if a.tiny_dir:
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "make_tiny_models.py"), a.tiny_dir],
                       check=True)
        models += sorted(os.path.join(a.tiny_dir, f) for f in os.listdir(a.tiny_dir) if f.endswith(".gguf"))
    if not models:
        print("SKIP: no model to check")
        return SKIP
    ok = all([check(a.tandem, m, a.tokens, a.tol, a.q8_tol) for m in models])
    print("all paths match the reference" if ok else "MISMATCH against the reference")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
