#!/usr/bin/env python3
"""Records how the llama.cpp peer tokenizes tricky strings with Gemma 3's SentencePiece
vocabulary (262,144 tokens), into tests/data/gemma3_tokens.json; tests/test_tokenizer.cpp
(GemmaTokenizer.*) replays them through tandem's tokenizer and checks the decode round trip.

The peer is llama.cpp's `llama-tokenize`, from the llama-cpp-python source package that
bench/compare.py builds (bench/.peer/); build the tool there first:

    cmake --build bench/.peer/build --target llama-tokenize -j2
    python3 tests/reference/make_gemma_tokens.py [--peer-bin PATH] [--model PATH]
"""
import argparse
import json
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
OUT = os.path.join(ROOT, "tests", "data", "gemma3_tokens.json")

# (text, parse_special[, decoded]). Text is str, or bytes for invalid UTF-8 (stored as hex).
# `decoded` is what decoding the ids gives where that is not the text itself: SentencePiece
# writes spaces as U+2581, so a U+2581 in the text comes back as a space, and a broken lead
# byte swallowing a space's U+2581 keeps it as bytes (the peer decodes both the same way).
CASES = [
    ("", False),
    ("Hello world", False),
    (" ", False),
    ("  ", False),
    ("   ", False),
    (" Hello", False),
    ("  Hello", False),
    ("Hello ", False),
    ("Hello  world", False),
    ("Hello   world    again     ", False),
    (" " * 40, False),  # longer than the longest run of spaces in the vocabulary (31)
    ("\n", False),
    ("\n\n", False),
    ("\n\n\n\n\n", False),
    ("\n" * 40, False),
    ("a\nb", False),
    ("line one\n\nline two\n", False),
    ("\r\n", False),
    ("windows\r\nline\r\n", False),
    (" \n ", False),
    ("\n Hello\n  world", False),
    ("\t", False),
    ("\t\t", False),
    ("\tindented", False),
    ("a\tb\t\tc", False),
    ("\t" * 35, False),
    (" \t \n\t\n ", False),
    ("1234567890", False),
    ("3.14159 2.71828", False),
    ("2026-12-04T10:30:00Z", False),
    ("1,000,000 and 42%", False),
    ("Hello, world! How's it going?", False),
    ("...", False),
    ("!!!???", False),
    ("(a+b)*c=d; x[i] -> y{j}", False),
    ("@#$%^&*~`|\\/", False),
    ("\"quoted\" and 'single'", False),
    ("😀", False),
    ("👍🏽 thumbs", False),
    ("👨‍👩‍👧 family", False),
    ("🇫🇷🇩🇪", False),
    ("café naïve façade résumé", False),
    ("Привет, мир!", False),
    ("Γειά σου Κόσμε", False),
    ("مرحبا بالعالم", False),
    ("नमस्ते दुनिया", False),
    ("ภาษาไทย", False),
    ("你好，世界！", False),
    ("日本語のテキストです。", False),
    ("한국어 텍스트", False),
    ("\u2581literal lower one eighth block\u2581\u2581", False, " literal lower one eighth block  "),
    ("\x01\x02\x7f", False),  # control characters: byte fallback
    ("\ue000\uf8ff", False),  # private use area
    ("\U0002a6b2\U0002b820", False),  # rare CJK extension B/E ideographs
    ("\U000e0041\U0001d49c\U0001f9ff", False),
    ("\ufeffBOM", False),
    ("def foo(x):\n    return x * 2\n", False),
    ("int main() {\n\treturn 0;\n}\n", False),
    ("for (int i = 0; i < n; ++i) { sum += a[i]; }", False),
    ("x = {'a': [1, 2], \"b\": None}  # comment", False),
    ("<div class=\"note\"><b>bold</b> and <i>italic</i></div>", False),
    ("<table><tr><td>1</td><td>2</td></tr></table>", False),
    ("<s>struck</s> text", False),
    ("<s>struck</s> text", True),
    ("[multimodal] and <start_of_image>", False),
    ("<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", True),
    ("<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", False),
    # What the built-in Gemma template renders for a system + user message, after its <bos>
    # (tests/test_gemma_tokenizer.cpp: ChatPromptFromTheBuiltinTemplate).
    ("<start_of_turn>user\nYou are terse.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n", True),
    ("<bos>Hello", True),
    ("<bos>Hello", False),
    ("<start_of_turn> spaced <end_of_turn>  x", True),
    ("<eos><pad><unk><mask>", True),
    ("<unused0> <unused6241>", True),
    ("<unused0> <unused6241>", False),
    ("<start_of_image><end_of_image>", True),
    ("Tokenizers split text into pieces. Gemma 3's vocabulary has 262,144 of them, "
     "including runs of spaces, tabs and newlines,\n\n\tHTML tags like <table> and <b>, and "
     "byte-fallback tokens for anything else: \u00e9\u00e8, \u4e2d\u6587, \U0001f600.", False),
    (b"\xff\xfe", False),
    (b"abc\xc3", False),
    (b"\xe4\xbd truncated", False, b"\xe4\xbd\xe2\x96\x81truncated"),
    (b"a\x80b \xc0\xaf", False),
]


def peer_ids(peer_bin, model, data, parse_special):
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
        path = f.name
    try:
        cmd = [peer_bin, "-m", model, "-f", path, "--ids", "--log-disable"]
        if not parse_special:
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-bin", default=os.path.join(ROOT, "bench", ".peer", "build", "bin", "llama-tokenize"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    args = ap.parse_args()
    cases = []
    for text, parse_special, *decoded in CASES:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        case = {"parse_special": parse_special, "ids": peer_ids(args.peer_bin, args.model, data, parse_special)}
        if isinstance(text, bytes):
            case["text_hex"] = data.hex()
        else:
            case["text"] = text
        if decoded:
            d = decoded[0]
            case.update({"decoded_hex": d.hex()} if isinstance(d, bytes) else {"decoded": d})
        cases.append(case)
    doc = {
        "about": "llama.cpp's llama-tokenize (llama-cpp-python 0.3.36 sdist) on gemma-3-270m-q4_k_m.gguf; "
                 "BOS added as the vocabulary asks; written by tests/reference/make_gemma_tokens.py",
        "cases": cases,
    }
    with open(OUT, "w", encoding="utf-8") as f:  # one case per line, for readable diffs
        f.write('{"about": %s,\n "cases": [\n' % json.dumps(doc["about"]))
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n ]}\n")
    print(f"wrote {len(cases)} cases to {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
