#!/usr/bin/env python3
"""Records the llama.cpp peer's greedy choices into tests/data/peer_greedy_<name>.json (the models
and cases are peer_models.py's), for replay_peer_greedy.py to replay through tandem:

    python3 tests/reference/record_peer_greedy.py --peer-dir bench/.peer [--reference] [NAME ...]

The peer is the llama.cpp that bench/compare.py builds from the llama-cpp-python source package
(build it with `python3 bench/compare.py` first); tests/reference/peer_greedy.cpp is compiled
against its libllama. For every case the file holds the prompt's ids, the peer's argmax at every
prompt position (one batch, as a prefill) and its greedy continuation (one token at a time, no
stop at end-of-generation), each with the peer's top-1 margin. --reference also runs ref_forward
(float64) over the same tokens and records how far the peer is from it (not for the 2B+ models:
the reference holds every weight as float64).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_models import DATA, MODELS, RANDOM_PROMPTS, ROOT, build, random_prompt, recipe_file, sha256  # noqa: E402


def build_driver(peer_dir, out_dir):
    src = os.path.join(ROOT, "tests", "reference", "peer_greedy.cpp")
    llama = [d for d in os.listdir(peer_dir) if d.startswith("llama_cpp_python-") and os.path.isdir(os.path.join(peer_dir, d))]
    if not llama:
        sys.exit(f"error: no llama-cpp-python source under {peer_dir} (run bench/compare.py once)")
    inc = os.path.join(peer_dir, sorted(llama)[-1], "vendor", "llama.cpp")
    lib = os.path.join(peer_dir, "build", "bin")
    exe = os.path.join(out_dir, "peer_greedy")
    subprocess.run(["g++", "-O2", "-std=c++17", src, "-I", os.path.join(inc, "include"), "-I",
                    os.path.join(inc, "ggml", "include"), "-L", lib, "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{lib}", "-o", exe], check=True)
    return exe


def peer(exe, model, args):
    r = subprocess.run([exe, model] + args, check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


def peer_logits(exe, model, ids):
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        info = peer(exe, model, ["--ids", " ".join(map(str, ids)), "--logits", f.name])
        return np.fromfile(f.name, dtype=np.float32).reshape(len(ids), info["n_vocab"])


def margins(logits):
    s = np.sort(logits, axis=-1)
    return s[:, -1] - s[:, -2]


def gpt2_byte_of_char():
    """GPT-2's byte-level BPE writes byte b as itself when printable (33-126, 161-172, 174-255),
    else as chr(256 + n) for the n-th unprintable byte."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + n)] = b
            n += 1
    return table


def detok(model_fields, ids):
    """The continuation's text, from the vocabulary's pieces: SentencePiece (U+2581 is a space,
    <0xNN> a byte) or GPT-2 byte-level BPE."""
    toks = model_fields["tokenizer.ggml.tokens"].contents()
    types = model_fields["tokenizer.ggml.token_type"].contents()
    gpt2 = model_fields["tokenizer.ggml.model"].contents() == "gpt2"
    byte_of = gpt2_byte_of_char() if gpt2 else None
    out = bytearray()
    for t in ids:
        piece, kind = toks[t], types[t]
        if gpt2:
            if kind in (1, 4):
                out += bytes(byte_of[c] for c in piece)
        elif kind == 6 and piece.startswith("<0x"):
            out.append(int(piece[3:5], 16))
        elif kind in (1, 4):
            out += piece.replace("\u2581", " ").encode()
    return out.decode("utf-8", errors="replace")


def record(name, spec, exe, models_dir, with_reference, out_dir=DATA):
    from gguf import GGUFReader
    if "path" in spec:
        model = os.path.join(ROOT, spec["path"])
        about = dict(path=spec["path"], sha256=sha256(model))
    else:
        model = os.path.join(models_dir, recipe_file(spec["recipe"]))
        if not os.path.exists(model):
            print(f"{name}: writing {model}", flush=True)
            build(spec["recipe"], model)
        about = dict(recipe=dict(script="tests/reference/family_gguf.py", **spec["recipe"]), sha256=sha256(model),
                     opt_in=bool(spec.get("opt_in")))
    fields = GGUFReader(model).fields
    n_vocab = len(fields["tokenizer.ggml.tokens"].data)
    bos = fields["tokenizer.ggml.bos_token_id"].contents()
    ref = None
    if with_reference:
        from ref_forward import RefModel
        ref = RefModel(model)
    cases = []
    prompts = spec.get("prompts") or [dict(random=p) for p in RANDOM_PROMPTS]
    for p in prompts:
        if isinstance(p, str):
            g = peer(exe, model, ["--prompt", p, "-n", str(spec["n"])])
            case = dict(prompt=p)
        else:
            ids = random_prompt(n_vocab, bos, p["random"]["seed"], p["random"]["length"])
            g = peer(exe, model, ["--ids", " ".join(map(str, ids)), "-n", str(spec["n"])])
            case = dict(prompt_random=p["random"])
        pl = peer_logits(exe, model, g["prompt_ids"])
        case.update(prompt_ids=g["prompt_ids"], prompt_argmax=[int(i) for i in pl.argmax(-1)],
                    prompt_margins=[round(float(m), 4) for m in margins(pl)], peer_ids=g["ids"],
                    peer_margins=g["margins"], peer_continuation=detok(fields, g["ids"]))
        if ref is not None:
            seq = g["prompt_ids"] + g["ids"][:-1]
            want = ref.forward(np.array(seq))
            got = peer_logits(exe, model, seq)
            choice = case["prompt_argmax"][:-1] + g["ids"]
            top = want.max(-1)
            gap = top - want[np.arange(len(seq)), choice]  # how far below the reference's best the peer's pick is
            case["reference_check"] = dict(
                positions=len(seq), peer_choice_is_reference_argmax=int((gap == 0).sum()),
                worst_gap=round(float(gap.max()), 4), max_abs_diff=round(float(np.abs(got - want).max()), 4),
                logit_std=round(float(want.std()), 3))
        print(f"{name}: {len(set(g['ids']))} distinct of {len(g['ids'])} greedy tokens; median margin "
              f"{np.median(g['margins']):.2f}" + (f"; reference {case['reference_check']}" if ref else ""), flush=True)
        cases.append(case)
    doc = dict(peer=f"llama.cpp (vendored in {PEER_NAME}), peer_greedy.cpp: greedy, f16 KV cache, CPU",
               model=about, cases=cases)
    gaps = [c["reference_check"]["worst_gap"] for c in cases if "reference_check" in c]
    if gaps:
        # The peer's pick sat up to max(gaps) below the exact best; tandem's 8-bit activations err
        # as much the other way, so two such runs may differ by twice that.
        doc["tie"] = round(max(0.5, 2 * max(gaps)), 2)
        doc["tie_why"] = (f"the peer's pick was at worst {max(gaps)} logits below ref_forward's best (8-bit "
                          "activations); tandem's may be as far the other way")
        # Exact agreement expected of tandem: the peer's own with the reference, less 0.1 (two
        # noisy runs split more near-ties than one noisy run and an exact one).
        share = min(c["reference_check"]["peer_choice_is_reference_argmax"] / c["reference_check"]["positions"]
                    for c in cases if "reference_check" in c)
        doc["exact"] = round(max(0.5, share - 0.1), 2)
    elif "recipe" in spec:
        doc["tie"], doc["exact"] = BIG_TIE, BIG_EXACT
        doc["tie_why"] = ("not measured (ref_forward cannot hold a 2B+ model in float64 here): the loosest "
                          "measured random shape's (Gemma-3-270M, 1.33), rounded up")
    out = os.path.join(out_dir, f"peer_greedy_{name}.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")


PEER_NAME = "llama-cpp-python"
BIG_TIE, BIG_EXACT = 1.5, 0.8


def main():
    global PEER_NAME
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"which ({', '.join(MODELS)}); all by default")
    ap.add_argument("--peer-dir", default=os.path.join(ROOT, "bench", ".peer"))
    ap.add_argument("--models-dir", default=os.path.join(tempfile.gettempdir(), "tandem-peer-models"))
    ap.add_argument("--reference", action="store_true", help="also check the peer against ref_forward")
    ap.add_argument("--out-dir", default=DATA, help="where the .json files go (tests/data)")
    a = ap.parse_args()
    os.makedirs(a.models_dir, exist_ok=True)
    llama = sorted(d for d in os.listdir(a.peer_dir) if d.startswith("llama_cpp_python-") and not d.endswith(".gz"))
    PEER_NAME = llama[-1].replace("llama_cpp_python-", "llama-cpp-python ") if llama else PEER_NAME
    exe = build_driver(a.peer_dir, a.models_dir)
    for name in a.names or MODELS:
        if name not in MODELS:
            sys.exit(f"error: unknown {name!r} (one of {', '.join(MODELS)})")
        spec = MODELS[name]
        big = "recipe" in spec and spec["recipe"]["shape"] in ("granite-3.1-2b", "phi3-mini")
        record(name, spec, exe, a.models_dir, a.reference and not big, a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
