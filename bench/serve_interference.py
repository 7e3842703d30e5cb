#!/usr/bin/env python3
"""Interference of prefill with decode (issue 48): 6 streams decode 256 tokens each, over and over,
while a 2,000-token prompt arrives every INTERVAL seconds; for each interval of the sweep, TPOT and
inter-token latency p50/p99 of the streams, TTFT p50/p99 of the long prompts and of the streams,
generated tok/s, and goodput (requests per second meeting both targets, stated). Servers, one at a
time on the same cores: colocated `tandem serve -t 2` (chunked prefill), disaggregated
`mpirun -np 2 tandem serve -t 1 --disaggregate 1:1`, and llama-server (with --peer-server).
Not a test; run on a quiet machine.

    python3 bench/serve_bench.py --interference [--peer-server PATH/llama-server] \
        [--intervals 4,2,1,0.5] [--duration 30] [--ttft-target 2.5] [--tpot-target 0.05] [--write]
"""
import argparse
import datetime
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_md  # noqa: E402
from serve_bench import ROOT, stream_timed, wait_port  # noqa: E402

WORDS = ("river stone light garden window market letter winter forest harbor music paper silver engine "
         "morning candle bridge valley orange planet shadow thunder island ribbon castle meadow").split()


def long_prompt(i, words=1500):
    """~2,000 tokens of text no earlier prompt shares (no prefix-cache hit)."""
    rng = random.Random(i)
    return f"Document {i}. " + " ".join(rng.choice(WORDS) for _ in range(words)) + "\nSummary:"


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_load(port, interval, duration, n_streams=6, stream_tokens=256, long_tokens=16):
    """The workload against one server; returns the requests' records."""
    records, lock, stop = [], threading.Lock(), time.time() + duration

    def record(kind, r):
        with lock:
            records.append((kind,) + r)

    def streamer(k):
        j = 0
        while time.time() < stop:
            body = {"prompt": f"Stream {k}, story {j}: once upon a time", "max_tokens": stream_tokens,
                    "temperature": 0, "ignore_eos": True, "stream": True}
            record("stream", stream_timed(port, "/v1/completions", body))
            j += 1

    def arrivals():
        i, threads = 0, []
        while time.time() < stop:
            body = {"prompt": long_prompt(i), "max_tokens": long_tokens, "temperature": 0, "stream": True}
            t = threading.Thread(target=lambda b=body: record("long", stream_timed(port, "/v1/completions", b)))
            t.start()
            threads.append(t)
            i += 1
            time.sleep(interval)
        for t in threads:
            t.join()

    workers = [threading.Thread(target=streamer, args=(k,)) for k in range(n_streams)]
    workers.append(threading.Thread(target=arrivals))
    t0 = time.time()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return records, time.time() - t0


def summarize(records, wall, ttft_target, tpot_target):
    streams = [r for r in records if r[0] == "stream"]
    longs = [r for r in records if r[0] == "long"]
    tpots = [(r[3] - r[2]) / (r[1] - 1) for r in streams if r[1] > 1]
    itls = [x for r in streams for x in r[4]]
    good = sum(1 for r in records if r[2] <= ttft_target and (r[1] <= 1 or (r[3] - r[2]) / (r[1] - 1) <= tpot_target))
    return {"tpot_p50": pct(tpots, 0.5), "tpot_p99": pct(tpots, 0.99), "itl_p50": pct(itls, 0.5), "itl_p99": pct(itls, 0.99),
            "ttft_long_p50": pct([r[2] for r in longs], 0.5), "ttft_long_p99": pct([r[2] for r in longs], 0.99),
            "ttft_stream_p99": pct([r[2] for r in streams], 0.99), "tok_s": sum(r[1] for r in records) / wall,
            "goodput": good / wall, "requests": len(records)}


def servers(a):
    """(name, command, env) of each server the sweep runs."""
    base = ["serve", "-m", a.model, "--kv-memory", a.kv_memory] + a.tandem_flags.split()
    out = [("colocated", [a.tandem] + base + ["-t", "2"], None),
           ("disaggregated", ["mpirun", "-np", "2", "--oversubscribe", a.tandem] + base + ["-t", "1", "--disaggregate", "1:1"],
            dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))]
    if a.peer_server:
        out.append(("llama-server", [a.peer_server, "-m", a.model, "-t", "2", "-np", "8", "-c", str(8 * 2560), "--log-disable"],
                    dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(a.peer_server))))
    return out


def measure(a):
    rows = []
    for name, cmd, env in servers(a):
        proc = subprocess.Popen(cmd + ["--port", str(a.port)], env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            wait_port(a.port, proc)
            stream_timed(a.port, "/v1/completions", {"prompt": "warm up", "max_tokens": 8, "stream": True})
            for interval in a.intervals:
                records, wall = run_load(a.port, interval, a.duration)
                s = summarize(records, wall, a.ttft_target, a.tpot_target)
                rows.append((name, interval, s))
                print(f"{name:<13} every {interval:>4} s: TPOT p50/p99 {s['tpot_p50'] * 1e3:.1f}/{s['tpot_p99'] * 1e3:.1f} ms, "
                      f"ITL p99 {s['itl_p99'] * 1e3:.1f} ms, long TTFT p50/p99 {s['ttft_long_p50']:.2f}/{s['ttft_long_p99']:.2f} s, "
                      f"{s['tok_s']:.1f} tok/s, goodput {s['goodput']:.2f} req/s", file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait()
    return rows


def table(rows, a):
    lines = [f"Targets: TTFT <= {a.ttft_target} s and TPOT <= {a.tpot_target * 1e3:.0f} ms (goodput: requests/s meeting both).",
             "",
             "| server | long prompt every | TPOT p50 ms | TPOT p99 ms | p99/p50 | ITL p99 ms | long TTFT p50 s | long TTFT p99 s "
             "| stream TTFT p99 s | tok/s | goodput req/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, interval, s in rows:
        lines.append(f"| {name} | {interval} s | {s['tpot_p50'] * 1e3:.1f} | {s['tpot_p99'] * 1e3:.1f} | "
                     f"{s['tpot_p99'] / s['tpot_p50']:.2f} | {s['itl_p99'] * 1e3:.1f} | {s['ttft_long_p50']:.2f} | "
                     f"{s['ttft_long_p99']:.2f} | {s['ttft_stream_p99']:.2f} | {s['tok_s']:.1f} | {s['goodput']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--peer-server", help="llama.cpp's llama-server binary")
    ap.add_argument("--intervals", default="4,2,1,0.5", help="seconds between long prompts, comma-separated")
    ap.add_argument("--duration", type=float, default=30, help="seconds of load per server and interval")
    ap.add_argument("--ttft-target", type=float, default=2.5)
    ap.add_argument("--tpot-target", type=float, default=0.05)
    ap.add_argument("--kv-memory", default="1GiB")
    ap.add_argument("--tandem-flags", default="")
    ap.add_argument("--port", type=int, default=18941)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    a.intervals = [float(x) for x in a.intervals.split(",")]
    out = table(measure(a), a)
    print(out)
    if a.write:
        results_md.add_section(f"## {datetime.date.today()}: prefill/decode interference, `bench/serve_bench.py --interference`\n\n"
                               f"{os.path.basename(a.model)}; 6 greedy streams of 256 tokens, a ~2,000-token prompt "
                               f"(16 tokens out) at each interval, {a.duration:.0f} s per cell.\n\n{out}\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
