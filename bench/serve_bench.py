#!/usr/bin/env python3
"""Serving throughput: total generated tok/s of `tandem serve` at 1, 4, 16 and 64 concurrent
streams, the TTFT drop the prefix cache gives a repeated system prompt, and (with --peer-server)
the same client against llama.cpp's llama-server with parallel slots. Not a test.

    python3 bench/serve_bench.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--peer-server PATH/llama-server] [--tokens 64] [--write]
        [--device cuda --streams 16,64 --kv-memory 8GiB]   (scripts/gpu_check.sh's serving stage)
A request the server answers with an error, or with no tokens, stops the run (exit 1): a failed
backend never reads as a throughput.
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
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{path} answered {r.status}: {r.read()[:300]!r}")
    ttft, chunks, usage, buf = None, 0, None, b""
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
                    if ttft is None:
                        ttft = time.time() - t0
    c.close()
    return (usage if usage is not None else chunks), ttft or 0.0, time.time() - t0


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
    a = ap.parse_args()
    rows, peer_rows, ttfts = [], [], None
    port = a.port
    cmd = [a.tandem, "serve", "-m", a.model, "--port", str(port), "-t", str(a.threads), "--kv-memory", a.kv_memory]
    proc = subprocess.Popen(cmd + (["--device", a.device] if a.device else []), stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        throughput(port, 2, 8)  # warm-up
        ttfts = None if a.no_prefix else prefix_ttft(port)
        for n in [int(s) for s in a.streams.split(",")]:
            rows.append((n,) + throughput(port, n, a.tokens))
            print(f"tandem    {n:>3} streams: {rows[-1][1]:7.1f} tok/s, mean TTFT {rows[-1][2] * 1e3:7.1f} ms", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait()
    if a.peer_server:
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(a.peer_server))
        pport = 18932
        peer = subprocess.Popen([a.peer_server, "-m", a.model, "--port", str(pport), "-t", str(a.threads), "-np", "16",
                                 "-c", str(16 * 512), "--log-disable"], env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            wait_port(pport, peer)
            throughput(pport, 2, 8)
            for n in (1, 4, 16):
                peer_rows.append((n,) + throughput(pport, n, a.tokens))
                print(f"llama.cpp {n:>3} streams: {peer_rows[-1][1]:7.1f} tok/s, mean TTFT {peer_rows[-1][2] * 1e3:7.1f} ms",
                      file=sys.stderr)
        finally:
            peer.terminate()
            peer.wait()
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
                   f"`tandem serve` (continuous batching, paged KV, {a.threads} threads) vs `llama-server -np 16 -c 8192` "
                   f"on {os.path.basename(a.model)}; each stream asks for {a.tokens} tokens (greedy), streamed over SSE by the "
                   f"same Python client.\n\n{table}\n\n{prefix}\n\n")
        results_md.add_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
