#!/usr/bin/env python3
"""Serving throughput: total generated tok/s of `tandem serve` at 1, 4, 16 and 64 concurrent
streams, the TTFT drop the prefix cache gives a repeated system prompt, and (with --peer-server)
the same client against llama.cpp's llama-server with parallel slots. Not a test.

    python3 bench/serve_bench.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--peer-server PATH/llama-server | build] [--tokens 64] [--rounds 3] [--write]
        [--device cuda --streams 16,64 --kv-memory 8GiB]   (scripts/gpu_check.sh's serving stage)
A request the server answers with an error, or with no tokens, stops the run (exit 1): a failed
backend never reads as a throughput. `--interference` runs bench/serve_interference.py instead
(prefill arriving while streams decode: colocated, disaggregated and llama-server).
"""
import argparse
import concurrent.futures
import datetime
import http.client
import json
import os
import re
import subprocess
import sys
import time

import results_md

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stream(port, path, body):
    """Sends one streaming request; returns (tokens, seconds to first token, total seconds)."""
    return stream_timed(port, path, body)[:3]


def stream_timed(port, path, body):
    """stream(), and the gaps between its streamed pieces (inter-token latencies, seconds)."""
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{path} answered {r.status}: {r.read()[:300]!r}")
    ttft, chunks, usage, buf, gaps, last = None, 0, None, b"", [], None
    while True:
        data = r.read1(65536)
        if not data:
            break
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            j = json.loads(event[6:])
            if j.get("error"):
                raise RuntimeError(f"{path}: error event: {j['error']}")
            if j.get("usage"):
                usage = j["usage"]["completion_tokens"]
            for ch in j.get("choices", []):
                piece = ch.get("text") or (ch.get("delta") or {}).get("content") or ""
                if piece:
                    chunks += 1
                    now = time.time()
                    if ttft is None:
                        ttft = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
    c.close()
    return (usage if usage is not None else chunks), ttft or 0.0, time.time() - t0, gaps


def wait_port(port, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("server did not come up")


def throughput(port, n, tokens):
    body = lambda i: {"prompt": f"Once upon a time, in village number {i}, there lived", "max_tokens": tokens,
                      "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as ex:
        res = list(ex.map(lambda i: stream(port, "/v1/completions", body(i)), range(n)))
    dt = time.time() - t0
    total = sum(r[0] for r in res)
    if total == 0:
        raise RuntimeError(f"{n} streams generated no tokens")
    return total / dt, sum(r[1] for r in res) / n, total


def prefix_ttft(port):
    system = "You are a meticulous assistant who answers in one short sentence. " * 12
    out = []
    for q in ("What is the capital of France?", "What is the capital of Italy?"):
        _, ttft, _ = stream(port, "/v1/chat/completions", {"messages": [{"role": "system", "content": system},
                                                                        {"role": "user", "content": q}],
                                                           "max_tokens": 4, "temperature": 0, "stream": True})
        out.append(ttft)
    return out


def main():
    if "--interference" in sys.argv:
        import serve_interference
        return serve_interference.main([x for x in sys.argv[1:] if x != "--interference"])
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tandem", default=os.path.join(ROOT, "build", "tandem"))
    ap.add_argument("--peer-server", help="llama.cpp's llama-server binary")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--device", help="tandem's --device (cpu | cuda | auto; default: its own)")
    ap.add_argument("--streams", default="1,4,16,64", help="concurrent stream counts, comma-separated")
    ap.add_argument("--kv-memory", default="1GiB")
    ap.add_argument("--port", type=int, default=18931)
    ap.add_argument("--no-prefix", action="store_true", help="skip the prefix-cache TTFT probe (needs a chat template)")
    ap.add_argument("--tandem-flags", default="", help="more `tandem serve` options, e.g. \"--exact-products none\"")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating rounds (tandem, then llama-server, at each stream count); medians are reported")
    a = ap.parse_args()
    if a.peer_server == "build":  # llama-server from the llama-cpp-python source package, as compare.py builds llama-bench
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import compare
        a.peer_server = os.path.join(compare.build_peer(server=True), "llama-server")
    streams = [int(s) for s in a.streams.split(",")]
    peer_streams = [n for n in streams if n <= 16]  # llama-server runs 16 slots (-np 16)
    ttfts = None
    port, pport = a.port, a.port + 1
    servers = []
    # Both servers stay up for the whole run and take turns, so the host's drift (this shared
    # machine's speed moves by 20-30% between minutes) falls on both alike; an idle server
    # sleeps, and the client is one Python process using a few % of a core.
    cmd = [a.tandem, "serve", "-m", a.model, "--port", str(port), "-t", str(a.threads), "--kv-memory", a.kv_memory]
    cmd += a.tandem_flags.split()
    try:
        servers.append(("tandem", port, subprocess.Popen(cmd + (["--device", a.device] if a.device else []),
                                                         stderr=subprocess.DEVNULL)))
        if a.peer_server:
            env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(a.peer_server))
            servers.append(("llama.cpp", pport, subprocess.Popen(
                [a.peer_server, "-m", a.model, "--port", str(pport), "-t", str(a.threads), "-np", "16", "-c", str(16 * 512),
                 "--log-disable"], env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)))
        for _, p, proc in servers:
            wait_port(p, proc)
            throughput(p, 2, 8)  # warm-up
        ttfts = None if a.no_prefix else prefix_ttft(port)
        runs = {}  # (server, streams) -> [(tok/s, mean TTFT)]
        for r in range(a.rounds):
            for n in streams:
                for name, p, _ in servers:
                    if name != "tandem" and n not in peer_streams:
                        continue
                    tps, ttft, _ = throughput(p, n, a.tokens)
                    runs.setdefault((name, n), []).append((tps, ttft))
                    print(f"round {r + 1} {name:<9} {n:>3} streams: {tps:7.1f} tok/s, mean TTFT {ttft * 1e3:7.1f} ms",
                          file=sys.stderr)
    finally:
        for _, _, proc in servers:
            proc.terminate()
            proc.wait()
    med = lambda xs: sorted(xs)[len(xs) // 2]
    rows = [(n, med([x[0] for x in runs[("tandem", n)]]), med([x[1] for x in runs[("tandem", n)]]), 0) for n in streams]
    peer_rows = [(n, med([x[0] for x in runs[("llama.cpp", n)]]), med([x[1] for x in runs[("llama.cpp", n)]]))
                 for n in peer_streams if ("llama.cpp", n) in runs]
    lines = ["| concurrent streams | tandem total tok/s | tandem mean TTFT ms | llama.cpp total tok/s | llama.cpp mean TTFT ms | ratio |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, tps, ttft, _ in rows:
        p = next((r for r in peer_rows if r[0] == n), None)
        lines.append(f"| {n} | {tps:.1f} | {ttft * 1e3:.0f} | " + (f"{p[1]:.1f} | {p[2] * 1e3:.0f} | {tps / p[1]:.2f}x |" if p else "- | - | - |"))
    table = "\n".join(lines)
    prefix = (f"Prefix cache: the same 12-sentence system prompt, two questions: TTFT {ttfts[0] * 1e3:.0f} ms, then "
              f"{ttfts[1] * 1e3:.0f} ms." if ttfts else "")
    print(table + "\n\n" + prefix)
    if a.write:
        section = (f"## {datetime.date.today()}: serving throughput, `bench/serve_bench.py`\n\n"
                   f"`tandem serve{(' ' + a.tandem_flags) if a.tandem_flags else ''}` (continuous batching, paged KV, {a.threads} threads) vs `llama-server -np 16 -c 8192` "
                   f"on {os.path.basename(a.model)}; each stream asks for {a.tokens} tokens (greedy), streamed over SSE by the "
                   f"same Python client. Medians of {a.rounds} alternating rounds (both servers up, taking turns at each "
                   f"stream count).\n\n{table}\n\n{prefix}\n\n")
        results_md.add_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
