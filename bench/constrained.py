#!/usr/bin/env python3
"""What constrained decoding costs: decode time per token with and without a JSON Schema on the
bundled model, alternating in one run, greedy and sampled.

    python3 bench/constrained.py [--tandem build/tandem] [--model models/...gguf] [--rounds 3] [--write]

Each round runs `tandem run` four ways (plain, --json-schema; greedy, then temperature 1 with
no truncation, the worst case: a full mask every step) on the same prompt and reads the
end-of-run report: decode tok/s, TPOT, and for constrained runs the full masks computed and
the share of decode time masks and matching took. The plain runs use --ignore-eos so they last
as long as the constrained ones (the schema's documents run to about the same length).
--write appends the table, the machine and the command to bench/RESULTS.md.
"""
import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = os.path.join(ROOT, "bench", "constrained_list.schema.json")
PROMPT = "A list of European cities with their countries and populations, as JSON:\n"


def run(tandem, model, threads, flags):
    cmd = [tandem, "run", "-m", model, "-p", PROMPT, "-t", str(threads)] + flags
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr[-1000:]}")
    m = re.search(r"decode\s+(\d+) tokens in ([\d.]+) ms = ([\d.]+) tok/s\s+TPOT ([\d.]+) ms", r.stderr)
    masks = re.search(r"constrained\s+(\d+) full token masks; masks and matching took ([\d.]+) ms \(([\d.]+)% of decode\)", r.stderr)
    if not m:
        sys.exit(f"no decode line in: {r.stderr[-1000:]}")
    return {
        "tokens": int(m.group(1)), "tok_s": float(m.group(3)), "tpot_ms": float(m.group(4)),
        "masks": int(masks.group(1)) if masks else 0, "mask_share": float(masks.group(3)) if masks else 0.0,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    load = os.getloadavg()[0]
    if load > 1.5:
        print(f"warning: load average {load:.1f}: other work shares the cores, the figures will be noisy", file=sys.stderr)
    modes = {
        "greedy, plain": ["--temp", "0", "--ignore-eos"],
        "greedy, JSON Schema": ["--temp", "0", "--json-schema", SCHEMA],
        "sampled, plain": ["--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "7", "--ignore-eos"],
        "sampled, JSON Schema": ["--temp", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "7",
                                 "--json-schema", SCHEMA],
    }
    results = {k: [] for k in modes}
    for r in range(a.rounds):
        for name, flags in modes.items():
            res = run(a.tandem, a.model, a.threads, flags + ["-n", str(a.n)])
            results[name].append(res)
            print(f"round {r + 1} {name}: {res}", file=sys.stderr)
    rows = ["| mode | decode tokens | decode tok/s | TPOT ms | full masks | masks+matching, % of decode |",
            "| --- | --- | --- | --- | --- | --- |"]
    med = {}
    for name in modes:
        rs = results[name]
        med[name] = statistics.median(x["tpot_ms"] for x in rs)
        rows.append(f"| {name} | {statistics.median(x['tokens'] for x in rs):.0f} | "
                    f"{statistics.median(x['tok_s'] for x in rs):.1f} | {med[name]:.2f} | "
                    f"{statistics.median(x['masks'] for x in rs):.0f} | {statistics.median(x['mask_share'] for x in rs):.1f}% |")
    for kind in ("greedy", "sampled"):
        extra = med[f"{kind}, JSON Schema"] / med[f"{kind}, plain"] - 1
        rows.append(f"\n{kind}: TPOT with the schema is {100 * extra:+.1f}% against plain decoding")
    table = "\n".join(rows)
    print(table)
    if a.write:
        cmd = "python3 bench/constrained.py " + " ".join(sys.argv[1:])
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as f:
            f.write(f"\n## {datetime.date.today()}: constrained decoding cost (issue 25)\n\n"
                    f"`{cmd}`; {platform.node()}, {a.threads} threads, load average {load:.1f} at the start, "
                    f"median of {a.rounds} alternating rounds, {os.path.basename(a.model)}, "
                    f"schema bench/constrained_list.schema.json.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
