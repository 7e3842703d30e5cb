#!/usr/bin/env python3
"""tandem vs the llama.cpp peer, same files, same threads, alternating in one run.

    python3 bench/compare.py [--threads 2] [--reps 3] [--rounds 2] [--depth 0[,1024,4096,...]] [--models all|real|...] [--write]

1. Builds the peer (llama-bench, llama-quantize) from the llama-cpp-python source package,
   which vendors llama.cpp, into bench/.peer/ unless --peer-bin points at a build.
2. Makes the benchmark models in bench/.models/: the real SmolLM2-135M Q4_1 (models/), random
   weights in its shape as Q8_0 and F16 (../shared/tools/make_gguf.py, quantized by the peer's
   llama-quantize) and a Llama-3.2-1B-shaped Q4_0; with --models moe, two mixtures of experts with
   real layer geometry and 4 layers: Qwen3-30B-A3B in Q4_K_M and gpt-oss-20b in MXFP4 (--models
   gptoss for that one alone; its blocks drawn from a random pool, gpt_oss_model()).
3. Runs `tandem bench --json` and `llama-bench -o json` alternately, --rounds times each, and
   prints a markdown table of pp/tg tok/s, ratios, and tandem's GB/s and % of measured
   bandwidth; --write appends it, with the machine and the commands, to bench/RESULTS.md.
4. With several depths (--depth 0,1024,4096,16384) each model runs at every context its file
   allows, and bench/plots/<model>.svg draws tok/s against context for both engines: the
   curve, not one point, is what is compared.
"""
import argparse
import datetime
import glob
import json
import os
import platform
import shutil
import subprocess
import sys

import results_md
import svg_plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
PEER_DIR = os.path.join(BENCH, ".peer")
MODELS_DIR = os.path.join(BENCH, ".models")
SHARED = os.path.join(ROOT, "..", "shared")
def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def peer_cmake():
    """The peer's ISA options for this CPU: its x86 paths, each on only where the CPU has it (a
    build with AVX-512 on dies of SIGILL on an AVX2-only machine of the same kind). Not NATIVE:
    its AMX kernels crash on this machine kind, so the peer runs its AVX-512 or AVX2 paths."""
    f = cpu_flags()
    on = lambda cond: "ON" if cond else "OFF"
    isa = [f"-DGGML_AVX={on('avx' in f)}", f"-DGGML_AVX2={on('avx2' in f)}", f"-DGGML_FMA={on('fma' in f)}", f"-DGGML_F16C={on('f16c' in f)}",
           f"-DGGML_AVX512={on('avx512f' in f and 'avx512bw' in f)}", f"-DGGML_AVX512_VNNI={on('avx512_vnni' in f)}",
           f"-DGGML_AVX512_VBMI={on('avx512vbmi' in f)}", f"-DGGML_AVX512_BF16={on('avx512_bf16' in f)}",
           f"-DGGML_AVX_VNNI={on('avx_vnni' in f)}", f"-DGGML_BMI2={on('bmi2' in f)}"]
    return (["-DGGML_NATIVE=OFF"] + isa + ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
            "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DCMAKE_BUILD_TYPE=Release"])


def sh(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def build_peer(server=False):
    """Builds the peer's llama-bench (or, with server=True, llama-server in its own build folder,
    so the bench build keeps its options) from the llama-cpp-python source package; returns the
    folder holding the binary. Rebuilt when the CPU differs from the one it was built for."""
    build = os.path.join(PEER_DIR, "build-server" if server else "build")
    binary = os.path.join(build, "bin", "llama-server" if server else "llama-bench")
    stamp = os.path.join(build, "tandem-cmake-options")
    options = peer_cmake()
    if server:
        options = [o.replace("-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_SERVER=ON") for o in options]
    if os.path.exists(binary) and os.path.exists(stamp) and open(stamp).read() == " ".join(options):
        return os.path.dirname(binary)
    os.makedirs(PEER_DIR, exist_ok=True)
    if not glob.glob(os.path.join(PEER_DIR, "llama_cpp_python-*.tar.gz")):
        sh([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "llama-cpp-python", "-d", PEER_DIR])
    tarball = sorted(glob.glob(os.path.join(PEER_DIR, "llama_cpp_python-*.tar.gz")))[-1]
    src = os.path.join(tarball[:-len(".tar.gz")], "vendor", "llama.cpp")
    if not os.path.isdir(src):
        sh(["tar", "xzf", tarball, "-C", PEER_DIR])
    sh(["cmake", "-S", src, "-B", build] + options)
    targets = ["llama-server"] if server else ["llama-bench", "llama-quantize"]
    sh(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target"] + targets)
    with open(stamp, "w") as f:
        f.write(" ".join(options))
    return os.path.dirname(binary)


def peer_env(bin_dir):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = bin_dir + ":" + env.get("LD_LIBRARY_PATH", "")
    return env


def make_models(bin_dir, which):
    os.makedirs(MODELS_DIR, exist_ok=True)
    out = []
    real = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if "real" in which and os.path.exists(real):
        out.append(("SmolLM2-135M Q4_1 (real)", real))
    gemma = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")  # scripts/setup.sh --models all
    if ("gemma3" in which or "all" in which) and os.path.exists(gemma):
        out.append(("Gemma-3-270M Q4_K_M (real)", gemma))
    if "qwen2.5-0.5b-q4_0" in which or "all" in which:
        # A random-weight Qwen2.5-0.5B shape (QKV bias, NeoX RoPE, 152k vocab), written by the
        # family writer of the reference checks and quantized by the peer's own quantizer.
        f16 = os.path.join(MODELS_DIR, "qwen2.5-0.5b-f16.gguf")
        if not os.path.exists(f16):
            sh([sys.executable, os.path.join(ROOT, "tests", "reference", "family_gguf.py"), f16, "qwen2", "--shape",
                "qwen2.5-0.5b", "--type", "f16"])
        path = os.path.join(MODELS_DIR, "qwen2.5-0.5b-q4_0.gguf")
        if not os.path.exists(path):
            sh([os.path.join(bin_dir, "llama-quantize"), f16, path, "Q4_0"], env=peer_env(bin_dir), stdout=subprocess.DEVNULL)
        out.append(("Qwen2.5-0.5B-shaped Q4_0 (random)", path))
    if "qwen3-30b-a3b-q4_k_m" in which or "moe" in which:
        # A mixture of experts with Qwen3-30B-A3B's layer geometry (2048 wide, 128 experts of
        # 768, 8 used, 32/4 heads of 128) and 4 of its 48 layers: random weights written by the
        # reference checks' family writer, quantized by the peer's own quantizer.
        f16 = os.path.join(MODELS_DIR, "qwen3-30b-a3b-4l-f16.gguf")
        if not os.path.exists(f16):
            sh([sys.executable, os.path.join(ROOT, "tests", "reference", "family_gguf.py"), f16, "qwen3moe", "--shape",
                "qwen3-30b-a3b", "--layers", "4", "--type", "f16"])
        path = os.path.join(MODELS_DIR, "qwen3-30b-a3b-4l-q4_k_m.gguf")
        if not os.path.exists(path):
            sh([os.path.join(bin_dir, "llama-quantize"), f16, path, "Q4_K_M"], env=peer_env(bin_dir), stdout=subprocess.DEVNULL)
        out.append(("Qwen3-30B-A3B-shaped Q4_K_M, 4 of 48 layers (random)", path))
    if "gpt-oss-20b-mxfp4" in which or "gptoss" in which or "moe" in which:
        out.append(("gpt-oss-20b-shaped MXFP4, 4 of 24 layers (random)", gpt_oss_model()))
    gen = os.path.join(SHARED, "tools", "make_gguf.py")
    for shape, qtype, label in (("smollm2-135m", "Q8_0", "SmolLM2-135M-shaped Q8_0 (random)"),
                                ("smollm2-135m", "F16", "SmolLM2-135M-shaped F16 (random)"),
                                ("llama-1b", "Q4_0", "Llama-3.2-1B-shaped Q4_0 (random)")):
        key = f"{shape}-{qtype}".lower()
        if key not in which and "all" not in which:
            continue
        f16 = os.path.join(MODELS_DIR, f"{shape}-f16.gguf")
        if not os.path.exists(f16):
            sh([sys.executable, gen, f16, shape])
        path = f16 if qtype == "F16" else os.path.join(MODELS_DIR, f"{shape}-{qtype.lower()}.gguf")
        if not os.path.exists(path):
            sh([os.path.join(bin_dir, "llama-quantize"), f16, path, qtype], env=peer_env(bin_dir), stdout=subprocess.DEVNULL)
        out.append((label, path))
    return out


def gpt_oss_model():
    """gpt-oss-20b's layer geometry (2880 wide, 32 experts of 2880, 4 used, 64/8 heads of 64, a
    128-token window on even layers, sinks, YaRN) with 4 of its 24 layers, stored as ggml-org's
    gpt-oss-20b-mxfp4.gguf stores it: experts MXFP4, the other matrices Q8_0, norms, biases, sinks
    and routers F32; the o200k_harmony tokenizer and the harmony chat template. Written straight
    as quantized blocks from a random pool (family_gguf.py --block-pool): 2.8 GiB in 1-2 minutes on
    2 cores, where quantizing floats took ~11."""
    path = os.path.join(MODELS_DIR, "gpt-oss-20b-4l-mxfp4.gguf")
    if os.path.exists(path):
        return path
    vocab = os.path.join(ROOT, "models", "o200k-harmony-vocab.gguf")
    if not os.path.exists(vocab):
        sys.exit(f"compare.py: the gpt-oss shape needs gpt-oss's tokenizer {vocab}; scripts/setup.sh --models all writes it")
    tmp = path + ".part"
    sh([sys.executable, os.path.join(ROOT, "tests", "reference", "family_gguf.py"), tmp, "gpt-oss", "--shape", "gpt-oss-20b",
        "--layers", "4", "--type", "q8_0", "--expert-type", "mxfp4", "--block-pool", "--vocab-from", vocab,
        "--chat-template", os.path.join(ROOT, "tests", "data", "chat_templates", "gpt-oss.jinja")])
    os.replace(tmp, path)
    return path


def test_name(kind, n, depth):
    """As both tools name a test: pp512, or pp512 @ d4096 after a prefilled context."""
    return f"{kind}{n} @ d{depth}" if depth else f"{kind}{n}"


def run_tandem(tandem, model, threads, reps, depth):
    r = subprocess.run([tandem, "bench", "-m", model, "-t", str(threads), "-r", str(reps), "-d", str(depth), "--json"],
                       check=True, capture_output=True, text=True)
    j = json.loads(r.stdout)
    pp, tg = j[test_name("pp", 512, depth)], j[test_name("tg", 128, depth)]
    return {"pp": pp["tok_s"], "tg": tg["tok_s"], "tg_gbs": tg["gb_s"],
            "tg_bw": tg["pct_read_bandwidth"], "bw": j["machine"]["read_gb_s"],
            "tg_probe": tg.get("probe_read_gb_s", j["machine"]["read_gb_s"])}


def run_peer(bin_dir, model, threads, reps, depth):
    r = subprocess.run([os.path.join(bin_dir, "llama-bench"), "-m", model, "-t", str(threads), "-r", str(reps),
                        "-p", "512", "-n", "128", "-d", str(depth), "-o", "json"], check=True, capture_output=True, text=True,
                       env=peer_env(bin_dir))
    res = {}
    for t in json.loads(r.stdout):
        res["pp" if t["n_prompt"] > 0 else "tg"] = t["avg_ts"]
    return res


def context_length(path):
    """The model's training context (GGUF <arch>.context_length), or None when unreadable."""
    try:
        import gguf
        r = gguf.GGUFReader(path)
        arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
        f = r.fields[f"{arch}.context_length"]
        return int(f.parts[f.data[0]][0])
    except Exception:  # no gguf package, or a file without the key: run every depth
        return None


def plot_sweep(label, runs, out_dir):
    """runs: {depth: (tandem means, peer means)}; writes out_dir/<slug>.svg, returns its path."""
    series = []
    for kind, dashed in (("pp", False), ("tg", True)):
        for engine, k in (("tandem", 0), ("llama.cpp", 1)):
            pts = [(d, r[k][kind]) for d, r in sorted(runs.items())]
            series.append((f"{engine} {'pp512' if kind == 'pp' else 'tg128'}", engine, dashed, pts))
    os.makedirs(out_dir, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    path = os.path.join(out_dir, f"{slug}.svg")
    with open(path, "w") as f:
        f.write(svg_plot.line_chart(f"{label}: tok/s against context (2 threads)", series))
    return path


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--models", default="all", help="all, or a comma list of: real, gemma3, qwen2.5-0.5b-q4_0, smollm2-135m-q8_0, smollm2-135m-f16, llama-1b-q4_0, "
                    "qwen3-30b-a3b-q4_k_m, gpt-oss-20b-mxfp4 (or gptoss; moe: both mixtures of experts; not in all)")
    ap.add_argument("--depth", default="0", help="context tokens prefilled (untimed) before each test, both tools' -d; "
                    "a comma list sweeps them (each model to its context) and plots the curves")
    ap.add_argument("--plot-dir", default=os.path.join(BENCH, "plots"), help="where a sweep's SVG plots go")
    ap.add_argument("--peer-bin", help="folder holding a built llama-bench and llama-quantize")
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--write", action="store_true", help="append the table to bench/RESULTS.md")
    a = ap.parse_args()
    which = set(a.models.split(","))
    if "all" in which:
        which |= {"real"}
    bin_dir = a.peer_bin or build_peer()
    models = make_models(bin_dir, which)
    depths = [int(d) for d in a.depth.split(",")]
    rows, plots = [], []
    for label, path in models:
        ctx = context_length(path)
        runs = {d: ([], []) for d in depths if ctx is None or d + 512 <= ctx}
        for _ in range(a.rounds):  # alternate, so drift in the machine's speed hits both
            for d, (t_runs, p_runs) in runs.items():
                t_runs.append(run_tandem(a.tandem, path, a.threads, a.reps, d))
                p_runs.append(run_peer(bin_dir, path, a.threads, a.reps, d))
        means = {}
        for d, (t_runs, p_runs) in runs.items():
            t = {k: mean([r[k] for r in t_runs]) for k in t_runs[0]}
            p = {k: mean([r[k] for r in p_runs]) for k in p_runs[0]}
            means[d] = (t, p)
            rows.append((label, os.path.getsize(path), d, t, p))
            print(f"{label} @ d{d}: tandem pp512 {t['pp']:.1f} tg128 {t['tg']:.1f} | llama.cpp pp512 {p['pp']:.1f} "
                  f"tg128 {p['tg']:.1f}", file=sys.stderr)
        if len(means) > 1:
            plots.append((label, plot_sweep(label, means, a.plot_dir)))
    lines = ["| model | size | context | tandem pp512 | llama.cpp pp512 | ratio | tandem tg128 | llama.cpp tg128 | ratio | "
             "tandem decode GB/s | % of read BW |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, size, d, t, p in rows:
        lines.append(f"| {label} | {size / 2**20:.0f} MiB | {d} | {t['pp']:.1f} | {p['pp']:.1f} | {t['pp'] / p['pp']:.2f}x | "
                     f"{t['tg']:.1f} | {p['tg']:.1f} | {t['tg'] / p['tg']:.2f}x | {t['tg_gbs']:.1f} | {t['tg_bw']:.0f}% |")
    table = "\n".join(lines)
    if plots:
        table += "\n\n" + "\n".join(f"![{label}]({os.path.relpath(path, BENCH)})" for label, path in plots)
    print(table)
    if a.write:
        bw = mean([r[3]["bw"] for r in rows])
        tg_probe = mean([r[3]["tg_probe"] for r in rows])
        cpu = ""
        try:
            cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
        except (OSError, StopIteration):
            cpu = platform.processor()
        flags = cpu_flags()  # the same "AMD EPYC" name covers AVX-512 and AVX2-only hosts here
        cpu += " (AVX-512 VNNI)" if "avx512_vnni" in flags else " (AVX2, no AVX-512)" if "avx2" in flags else ""
        section = (f"## {datetime.date.today()}: side by side, `bench/compare.py`\n\n"
                   f"Machine: {cpu}, {os.cpu_count()} cores, {a.threads} threads; tandem's read-bandwidth probe "
                   f"{bw:.1f} GB/s (best pass) at start, {tg_probe:.1f} GB/s between the decode repetitions "
                   f"(what % of read BW divides by). Each figure is the mean of {a.rounds} alternating rounds of "
                   f"{a.reps} repetitions.\n"
                   f"Commands: `tandem bench -m MODEL -t {a.threads} -r {a.reps} -d D --json` and "
                   f"`llama-bench -m MODEL -t {a.threads} -r {a.reps} -p 512 -n 128 -d D -o json`, D each row's context "
                   f"(peer: llama.cpp vendored in llama-cpp-python, built by bench/compare.py).\n\n{table}\n\n")
        results_md.add_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
