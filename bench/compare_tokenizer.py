#!/usr/bin/env python3
"""Token ids and speed, tandem vs the llama.cpp peer's llama-tokenize, on the same vocabularies
and texts. Not a test (it needs the peer built): a check whose figures go to bench/RESULTS.md.

    python3 bench/compare_tokenizer.py --peer PATH/TO/llama-tokenize [--tandem build/tandem]

Texts: 1 MB of English (GPL-3 and the seed notes, repeated), a seeded random mix of scripts,
emoji, digits, whitespace runs, code and broken UTF-8, and every llama.cpp vector input joined.
"""
import argparse
import glob
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared")


def texts():
    out = {}
    english = ""
    for p in ("/usr/share/common-licenses/GPL-3", os.path.join(SHARED, "seed-llm-inference-notes.txt")):
        if os.path.exists(p):
            english += open(p, encoding="utf-8").read()
    out["english_1mb"] = ((english * (1_000_000 // max(1, len(english)) + 1))[:1_000_000]).encode()
    rng = random.Random(7)
    words = ["hello", "World", "don't", "I'LL", "naïve", "café", "Ünïcödé", "привет", "мир", "γειά", "σου", "שלום",
             "مرحبا", "नमस्ते", "你好", "世界", "こんにちは", "カタカナ", "안녕하세요", "🦙", "👍🏽", "🇫🇷", "3.14159", "2026",
             "1234567890", "x=y+1;", "def f(a):", "\treturn a", "<|im_start|>", "<s>", "</s>", "\u00a0", "\u2028", "…", "—"]
    seps = [" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "   \n", ""]
    mix = []
    for _ in range(40000):
        mix.append(rng.choice(words))
        mix.append(rng.choice(seps))
    raw = "".join(mix).encode()
    broken = bytearray(raw)
    for _ in range(200):  # sprinkle invalid UTF-8
        broken[rng.randrange(len(broken))] = rng.choice([0x80, 0xbf, 0xc3, 0xe2, 0xf0, 0xff])
    out["multilingual_mix"] = raw
    out["broken_utf8_mix"] = bytes(broken)
    vec = b""
    for p in sorted(glob.glob(os.path.join(SHARED, "tokenizer-vectors", "*.inp"))):
        vec += open(p, "rb").read().replace(b"\n__ggml_vocab_test__\n", b"\n")
    out["vector_inputs"] = vec
    return out


def run(cmd, data):
    t = time.perf_counter()
    r = subprocess.run(cmd, input=data, capture_output=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {r.stderr.decode(errors='replace')[-400:]}")
    return r.stdout.decode(), dt


def ids_of(text):
    return [int(x) for x in text.replace("[", " ").replace("]", " ").replace(",", " ").split()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", required=True, help="llama.cpp's llama-tokenize binary")
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    args = ap.parse_args()
    vocabs = sorted(glob.glob(os.path.join(SHARED, "tokenizer-vectors", "*.gguf")))
    model = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(model):
        vocabs.append(model)
    failures = 0
    print(f"| vocabulary | text | bytes | tokens | ids equal | tandem s | llama.cpp s |")
    print(f"|---|---|---:|---:|---|---:|---:|")
    for v in vocabs:
        for name, data in texts().items():
            for special in (False, True):
                peer_cmd = [args.peer, "-m", v, "--stdin", "--ids", "--no-bos", "--no-escape", "--log-disable"]
                if not special:
                    peer_cmd.append("--no-parse-special")
                tandem_cmd = [args.tandem, "tokenize", "-m", v, "--ids", "--no-bos"] + (["--special"] if special else [])
                p_out, p_dt = run(peer_cmd, data)
                t_out, t_dt = run(tandem_cmd, data)
                a, b = ids_of(t_out), ids_of(p_out)
                same = a == b
                if not same:
                    failures += 1
                    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
                    detail = f"no: first difference at {k}: tandem {a[k:k+5]} peer {b[k:k+5]}"
                else:
                    detail = "yes"
                label = name + (" (special)" if special else "")
                print(f"| {os.path.basename(v)} | {label} | {len(data)} | {len(b)} | {detail} | {t_dt:.3f} | {p_dt:.3f} |")
                sys.stdout.flush()
    print(f"\n{failures} mismatching runs")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
