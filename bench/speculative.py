#!/usr/bin/env python3
"""Speculative decoding, side by side in one alternating run: tandem's plain decode, prompt
lookup and draft model, and llama.cpp's own lookup and draft-model decoding from the same peer
build, on the same files, prompts and threads, greedy.

    python3 bench/speculative.py [--threads 2] [--rounds 3] [--n 128] [--draft-max 4]
                                 [--pairs bundled,gemma,smollm2,qwen] [--tasks rewrite,code,free]
                                 [--tandem-flags "--exact-products none"] [--write]

Pairs (target <- draft, the same vocabulary):
  bundled  the bundled SmolLM2-135M-Instruct Q4_1 itself, prompt lookup only (no smaller model of
           its vocabulary exists here to draft for it).
  gemma    the second bundled model, Gemma 3 270M Q4_K_M (scripts/setup.sh --models all), prompt lookup
           only, the prompts in its chat turns.
  smollm2  SmolLM2-135M-Instruct F16 <- its Q4_1 (models/). The F16 is the bundled Q4_1
           dequantized by the peer's llama-quantize (the only real SmolLM2 weights here), so the
           two hold the same values: the draft agrees with the target as often as a well
           matched draft can, and the F16 target reads 2.8x the draft's bytes per token.
  qwen     Qwen2.5-0.5B-shaped F16 <- its Q4_0 (bench/.models, random weights, made by
           bench/compare.py): the quantized copy of the same weights agrees often.
(bench/.models/smollm2-135m-f16.gguf is a random model with a made-up vocabulary: it cannot
pair with the real SmolLM2, whose vocabulary differs.)

Tasks: rewriting a given paragraph with one change, editing a given function, free text.
Decode tok/s is the rate after the first token (tandem: the report's "decode" line; the peer:
its "decoded N tokens in S seconds" line, which starts after the prompt). The peer's plain
decode is llama-lookup with --spec-draft-n-max 0 (the same loop and timer, no draft).
Every tandem mode must produce the same text (greedy): the script checks it.

The run takes a quiet machine: it refuses when the 1-minute load average is 1.5 or more
(other work steals cores and the alternation cannot cancel that), unless --force.
"""
import argparse
import datetime
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys

import results_md

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")

PARAGRAPH = (
    "The history of the bicycle begins in the early nineteenth century, when inventors in Europe experimented "
    "with two-wheeled machines pushed along by the rider's feet. Later designs added pedals, chains and pneumatic "
    "tyres, and within a few decades cycling had become a popular pastime and an affordable way to travel to work. "
    "Cities built lanes for riders, clubs organised long tours through the countryside, and manufacturers competed "
    "to make frames lighter and stronger.")

FUNCTION = '''def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "paid":
            total += order.amount
            count += 1
    average = total / count if count else 0
    return {"total": total, "count": count, "average": average}
'''


def chatml(user):
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def gemma_turns(user):
    return f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"


# The user's message of each task; each pair wraps it in its model's chat turns.
USER = {
    "rewrite": f"Here is a paragraph:\n\n{PARAGRAPH}\n\nRewrite the paragraph exactly, word for word, "
               "but replace 'Europe' with 'France'.",
    "code": f"Here is a Python function:\n\n{FUNCTION}\nRename the variable `total` to `revenue` everywhere "
            "and return the whole function.",
    "free": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def sh(cmd, **kw):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


def peer_env(bin_dir):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = bin_dir + ":" + env.get("LD_LIBRARY_PATH", "")
    return env


def peer_bins(build):
    """llama-lookup and llama-speculative, built in the peer build compare.py made if missing."""
    bin_dir = os.path.join(build, "bin")
    want = ["llama-lookup", "llama-speculative", "llama-quantize"]
    missing = [t for t in want if not os.path.exists(os.path.join(bin_dir, t))]
    if missing:
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            sys.exit(f"no peer build at {build}: run bench/compare.py first (it builds the peer), or give --peer-build")
        sh(["cmake", "--build", build, "--target"] + missing + ["-j", "2"])
    return bin_dir


def make_pairs(bin_dir, models_dir, which):
    pairs = []
    if "bundled" in which:
        pairs.append(("SmolLM2-135M-Instruct Q4_1 (bundled)", os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"), None))
    if "gemma" in which:
        gemma = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
        if not os.path.exists(gemma):
            sys.exit(f"{gemma} missing: run scripts/setup.sh --models all first")
        pairs.append(("Gemma 3 270M Q4_K_M (bundled)", gemma, None))
    if "smollm2" in which:
        q41 = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        f16 = os.path.join(models_dir, "smollm2-135m-instruct-from-q4_1-f16.gguf")
        if not os.path.exists(f16):
            os.makedirs(models_dir, exist_ok=True)
            sh([os.path.join(bin_dir, "llama-quantize"), "--allow-requantize", q41, f16, "F16"], env=peer_env(bin_dir),
               stdout=subprocess.DEVNULL)
        pairs.append(("SmolLM2-135M-Instruct F16 <- Q4_1 (real)", f16, q41))
    if "qwen" in which:
        f16 = os.path.join(models_dir, "qwen2.5-0.5b-f16.gguf")
        q40 = os.path.join(models_dir, "qwen2.5-0.5b-q4_0.gguf")
        if not (os.path.exists(f16) and os.path.exists(q40)):
            sys.exit(f"{f16} or {q40} missing: run bench/compare.py --models qwen2.5-0.5b-q4_0 first")
        pairs.append(("Qwen2.5-0.5B-shaped F16 <- Q4_0 (random)", f16, q40))
    return pairs


def run_tandem(a, mode, target, draft, prompt):
    cmd = [a.tandem, "run", "-m", target, "-p", prompt, "-n", str(a.n), "--temp", "0", "-t", str(a.threads),
           "--draft-max", str(a.draft_max)] + shlex.split(a.tandem_flags)
    if mode == "lookup":
        cmd += ["--speculative", "lookup"]
    elif mode == "draft":
        cmd += ["--speculative", "draft", "--draft-model", draft]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed: {r.stderr.strip()[-400:]}")
    m = re.search(r"decode\s+(\d+) tokens in ([\d.]+) ms = ([\d.]+) tok/s", r.stderr)
    acc = re.search(r"speculative .*?\(([\d.]+)%\)", r.stderr)
    per_pass = re.search(r"decode passes, ([\d.]+) tokens each", r.stderr)
    return {"tok_s": float(m.group(3)), "tokens": int(m.group(1)), "accept": float(acc.group(1)) if acc else None,
            "per_pass": float(per_pass.group(1)) if per_pass else None, "text": r.stdout}


def run_peer(a, bin_dir, mode, target, draft, prompt):
    common = ["-m", target, "-p", prompt, "-n", str(a.n), "--temp", "0", "-t", str(a.threads), "-c", "4096"]
    if mode == "peer-plain":
        cmd = [os.path.join(bin_dir, "llama-lookup")] + common + ["--spec-draft-n-max", "0"]
    elif mode == "peer-lookup":
        cmd = [os.path.join(bin_dir, "llama-lookup")] + common + ["--spec-draft-n-max", str(a.draft_max)]
    else:
        cmd = [os.path.join(bin_dir, "llama-speculative")] + common + [
            "-md", draft, "-td", str(a.threads), "--spec-draft-n-max", str(a.draft_max)]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=peer_env(bin_dir))
    out = r.stdout + r.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", out)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"{os.path.basename(cmd[0])} failed: {out.strip()[-600:]}")
    acc = re.search(r"accept\s+=\s+([\d.]+)%", out)
    return {"tok_s": float(m.group(3)), "tokens": int(m.group(1)), "accept": float(acc.group(1)) if acc else None}


TANDEM_MODES = ["plain", "lookup", "draft"]
PEER_MODES = ["peer-plain", "peer-lookup", "peer-draft"]


def load_average():
    return os.getloadavg()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median of each cell is reported")
    ap.add_argument("--n", type=int, default=128, help="tokens to generate at most (greedy; stops at end of turn)")
    ap.add_argument("--draft-max", type=int, default=4, help="tokens drafted per step at most, both engines")
    ap.add_argument("--pairs", default="bundled,gemma,smollm2,qwen")
    ap.add_argument("--tandem-flags", default="", help="more flags for every tandem run (e.g. \"--exact-products none\")")
    ap.add_argument("--tasks", default="rewrite,code,free")
    ap.add_argument("--no-peer", action="store_true", help="tandem's modes only")
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--peer-build", default=os.path.join(BENCH, ".peer", "build"), help="the peer's cmake build folder")
    ap.add_argument("--models-dir", default=os.path.join(BENCH, ".models"))
    ap.add_argument("--write", action="store_true", help="add the table to bench/RESULTS.md")
    ap.add_argument("--force", action="store_true", help="run even on a busy machine")
    a = ap.parse_args()

    load = load_average()
    if load >= 1.5 and not a.force:
        sys.exit(f"load average {load:.2f} >= 1.5: the machine is busy; rerun when it is quiet (or --force)")
    bin_dir = peer_bins(a.peer_build)
    pairs = make_pairs(bin_dir, a.models_dir, set(a.pairs.split(",")))
    tasks = a.tasks.split(",")
    modes = TANDEM_MODES + ([] if a.no_peer else PEER_MODES)
    results = {}  # (pair, task, mode) -> list of runs
    loads = [load]
    for rnd in range(a.rounds):
        for label, target, draft in pairs:
            for task in tasks:
                # Rotate the order each round so no mode always runs first (warm caches, drift).
                order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
                for mode in order:
                    if draft is None and mode in ("draft", "peer-draft"):
                        continue
                    prompt = (gemma_turns if "Gemma" in label else chatml)(USER[task])
                    run = run_tandem(a, mode, target, draft, prompt) if mode in TANDEM_MODES else \
                        run_peer(a, bin_dir, mode, target, draft, prompt)
                    results.setdefault((label, task, mode), []).append(run)
                    print(f"round {rnd + 1} {label} {task} {mode}: {run['tok_s']:.1f} tok/s"
                          + (f", accept {run['accept']:.0f}%" if run["accept"] is not None else ""), file=sys.stderr, flush=True)
        loads.append(load_average())

    def cell(label, task, mode):
        runs = results.get((label, task, mode), [])
        return (statistics.median(r["tok_s"] for r in runs) if runs else 0.0,
                statistics.median(r["accept"] for r in runs) if runs and runs[0]["accept"] is not None else None,
                statistics.median(r["per_pass"] for r in runs) if runs and runs[0].get("per_pass") is not None else None)

    names = {"plain": "tandem plain", "lookup": "tandem lookup", "draft": "tandem draft", "peer-plain": "llama.cpp plain",
             "peer-lookup": "llama.cpp lookup", "peer-draft": "llama.cpp draft"}
    lines = ["| pair | task | " + " | ".join(names[m] for m in modes) + " |", "| --- | --- |" + " ---: |" * len(modes)]
    same_text = True
    for label, _, _ in pairs:
        for task in tasks:
            texts = [results[(label, task, m)][0]["text"] for m in TANDEM_MODES if (label, task, m) in results]
            same = all(t == texts[0] for t in texts)
            same_text &= same
            row = [label, task + ("" if same else " (TEXT DIFFERS)")]
            base = cell(label, task, "plain")[0]
            peer_base = cell(label, task, "peer-plain")[0]
            for mode in modes:
                if (label, task, mode) not in results:
                    row.append("-")
                    continue
                tok_s, acc, per_pass = cell(label, task, mode)
                ref = base if mode in TANDEM_MODES else peer_base
                s = f"{tok_s:.1f}"
                if mode not in ("plain", "peer-plain"):
                    s += (f" ({tok_s / ref:.2f}x" + (f", {acc:.0f}% acc." if acc is not None else "")
                          + (f", {per_pass:.2f} tok/pass" if per_pass is not None else "") + ")") if ref else ""
                row.append(s)
            lines.append("| " + " | ".join(row) + " |")
    table = "\n".join(lines)
    print(table)
    if not same_text:
        print("\nWARNING: tandem's modes produced different text for some task (greedy output must be equal)", file=sys.stderr)
    cmd = "python3 bench/speculative.py " + shlex.join(sys.argv[1:])
    note = (f"Decode tok/s, median of {a.rounds} alternating rounds, greedy, at most {a.n} tokens, draft-max {a.draft_max}, "
            f"{a.threads} threads" + (f", tandem with `{a.tandem_flags}`" if a.tandem_flags else "") + "; (x) is the speed-up over the same engine's plain decode, acc. its acceptance rate, "
            "tok/pass the tokens each target pass produced (tandem's report): the speed-up that verify passes "
            "costing no more than a one-token pass would give, so the ceiling of what drafting can gain on that output. "
            f"Load average over the run: {min(loads):.2f}-{max(loads):.2f}. "
            f"tandem's three modes produced {'the same' if same_text else 'DIFFERENT'} text for every task.")
    print("\n" + note)
    if a.write:
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
        section = (f"## Speculative decoding vs llama.cpp ({datetime.date.today()}, {machine})\n\n"
                   f"`{cmd}`\n\n{table}\n\n{note}\n\n")
        results_md.add_section(section)


if __name__ == "__main__":
    main()
