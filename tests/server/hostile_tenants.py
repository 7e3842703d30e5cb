#!/usr/bin/env python3
"""test_hostile_clients.py's issue-45 checks: bodies that are quadratic to parse, duplicated
access headers and unknown /tokenize fields, and tenants (API keys) that must neither see nor
starve each other, nor lose their connection slots to an unauthenticated flood."""
import json
import os
import statistics
import tempfile
import threading
import time

from hostile_harness import *  # noqa: F401,F403


def ordinary_completion(srv, key=None):
    hdr = {"Authorization": f"Bearer {key}"} if key else None
    t = time.time()
    st, _, raw = http(srv, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 5, "temperature": 0}, headers=hdr)
    return st, time.time() - t


def quadratic_json_checks(srv):
    """300k keys in an unknown field (2.3 MiB) took 160 s to get their 400 (ordered_json searches
    keys linearly), and four such bodies held every worker: a 5-token completion beside them took
    157 s. The body's shape is now bounded before parsing."""
    keys = ",".join(f'"{i:06d}":0' for i in range(300000))
    body = ('{"prompt":"hi","max_tokens":1,"x":{' + keys + '}}').encode()
    alone = statistics.median(ordinary_completion(srv)[1] for _ in range(3))
    results = []

    def send():
        t = time.time()
        st, _, raw = http(srv, "POST", "/v1/completions", body, timeout=300)
        results.append((st, time.time() - t, error_of(raw).get("message", "")))
    threads = [threading.Thread(target=send) for _ in range(4)]
    for th in threads:
        th.start()
    time.sleep(0.01)
    st, beside = ordinary_completion(srv)
    for th in threads:
        th.join()
    slowest = max(r[1] for r in results)
    check(len(results) == 4 and all(r[0] == 400 and "more than 1024 keys" in r[2] for r in results) and slowest < 1.0,
          f"4 bodies of 300k keys: {[r[0] for r in results]} in at most {slowest * 1000:.0f} ms "
          f"({results[0][2][:60]!r})")
    bound = 0.05 * (5 if under_asan(srv) else 1)
    check(st == 200 and beside - alone < bound,
          f"a 5-token completion beside them: {st} in {beside * 1000:.0f} ms (alone {alone * 1000:.0f} ms; bound +{bound * 1000:.0f} ms)")
    # Many objects each under the per-object bound still cost n^2/2 each: bounded over the body.
    many = "[" + ",".join("{" + ",".join(f'"{i:04d}":0' for i in range(1000)) + "}" for _ in range(64)) + "]"
    t = time.time()
    st, _, raw = http(srv, "POST", "/v1/completions", ('{"prompt":"hi","x":' + many + "}").encode())
    check(st == 400 and "too many keys together" in error_of(raw).get("message", "") and time.time() - t < 1.0,
          f"64 objects of 1000 keys: {st} in {(time.time() - t) * 1000:.0f} ms")
    healthy(srv, "after quadratic JSON bodies")


def header_and_field_checks(srv):
    """Two Authorization headers were read as the first; /tokenize ignored unknown fields."""
    s = connect(srv.port)
    body = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {srv.host}\r\nContent-Type: application/json\r\n"
              f"Authorization: Bearer a\r\nAuthorization: Bearer b\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    st, _, raw = Reader(s).response()
    s.close()
    check(st == 400 and "Authorization" in error_of(raw).get("message", ""), f"two Authorization headers -> {st} {raw[:80]!r}")
    st, _, raw = http(srv, "POST", "/tokenize", {"content": "hi", "add_bos": True})
    err = error_of(raw)
    check(st == 400 and err.get("param") == "add_bos", f"/tokenize with an unknown field -> {st} {err.get('message', '')[:70]!r}")
    st, _, raw = http(srv, "POST", "/detokenize", {"tokens": [1], "extra": 1})
    check(st == 400 and error_of(raw).get("param") == "extra", f"/detokenize with an unknown field -> {st}")


def metric_text(srv, key):
    return http(srv, "GET", "/metrics", headers={"Authorization": f"Bearer {key}"})[2].decode()


def value(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def ttft(srv, key):
    """Time to the first token event of a short streamed completion (the server's own TTFT is
    read from the stream: the first chunk with text)."""
    s = connect(srv.port, timeout=120)
    body = json.dumps({"prompt": "Say hi", "max_tokens": 2, "temperature": 0, "stream": True}).encode()
    t = time.time()
    s.sendall(request_bytes("POST", "/v1/completions", srv.host, body, {"Authorization": f"Bearer {key}"}))
    buf, got = b"", None
    while got is None:
        data = s.recv(65536)
        if not data:
            break
        buf += data
        for line in buf.split(b"\n"):
            if line.startswith(b"data: {") and b'"text":""' not in line:
                got = time.time() - t
                break
    s.close()
    return got if got is not None else float("inf")


def flood(srv, key, n, stop, out, tokens=400):
    """n streams of `tokens` tokens (ignore_eos), restarted as they end, until `stop`."""
    def one():
        while not stop.is_set():
            try:
                st, _, raw = http(srv, "POST", "/v1/completions",
                                  {"prompt": "Write a long story about a dragon.", "max_tokens": tokens, "temperature": 0,
                                   "ignore_eos": True, "stream": True}, headers={"Authorization": f"Bearer {key}"}, timeout=300)
                out.append(st)
            except Exception as e:
                out.append(str(e))
    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for th in threads:
        th.start()
    return threads


def tenant_checks(tandem, model):
    """With several keys: /metrics was one global view (tenant A read B's prompt and output
    lengths and cache hits from counter deltas); A's 32 long streams pushed B's TTFT from 15 ms
    to 8.3 s; an unauthenticated client holding every connection slot made every tenant and
    /health get 503."""
    keys = {"A": "ka-" + os.urandom(8).hex(), "B": "kb-" + os.urandom(8).hex()}
    op = "op-" + os.urandom(8).hex()
    with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as f:
        f.write(keys["A"] + "\n" + keys["B"] + "\n")
    with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as g:
        g.write(op + "\n")
    srv = Server(tandem, model, ["--api-key-file", f.name, "--operator-key-file", g.name, "--max-connections", "128"])
    try:
        # Each key sees its own requests; another tenant's leave its view unchanged.
        a_before = metric_text(srv, keys["A"])
        st, _, _ = http(srv, "POST", "/v1/completions", {"prompt": "The quick brown fox " * 20, "max_tokens": 7, "temperature": 0},
                        headers={"Authorization": f"Bearer {keys['B']}"})
        a_after, b_view, o_view = metric_text(srv, keys["A"]), metric_text(srv, keys["B"]), metric_text(srv, op)
        check(st == 200 and a_before == a_after, f"tenant A's /metrics is unchanged by B's request ({st})")
        check(value(b_view, "tandem_requests_started_total") == 1 and value(b_view, "tandem_generated_tokens_total") == 7
              and value(b_view, "tandem_prompt_tokens_total") > 40,
              f"tenant B's /metrics counts its request: started {value(b_view, 'tandem_requests_started_total')}, "
              f"generated {value(b_view, 'tandem_generated_tokens_total')}, prompt {value(b_view, 'tandem_prompt_tokens_total')}")
        check(value(a_after, "tandem_kv_blocks_used") is None and value(o_view, "tandem_kv_blocks_used") is not None
              and value(o_view, "tandem_requests_started_total") >= 1,
              "engine-wide gauges only in the operator key's view")

        # Fairness: B's first token while A floods with 32 streams of 400 tokens (8 of 100 under
        # ASan, whose passes are ~5x slower: the same check, in CI's time).
        streams, tokens = (8, 100) if under_asan(srv) else (32, 400)
        idle = statistics.median(ttft(srv, keys["B"]) for _ in range(5))
        stop, statuses = threading.Event(), []
        threads = flood(srv, keys["A"], streams, stop, statuses, tokens)
        deadline = time.time() + 60
        while time.time() < deadline and (value(metric_text(srv, op), "tandem_running_sequences") or 0) < streams - 2:
            time.sleep(0.2)
        time.sleep(1.0)
        steps0, t0 = value(metric_text(srv, op), "tandem_engine_steps_total"), time.time()
        under = [ttft(srv, keys["B"]) for _ in range(5)]
        step_s = (time.time() - t0) / max(1.0, value(metric_text(srv, op), "tandem_engine_steps_total") - steps0)
        stop.set()
        busy = statistics.median(under)
        # B's first token waits for the step in flight (one of the flood's batch steps) and one short
        # step of its own: bounded by 3x idle plus one and a half of the flood's steps, not by A's queue.
        bound = 3 * idle + 1.5 * step_s
        check(busy < bound, f"tenant B's TTFT while A floods with {streams} streams: median {busy * 1000:.0f} ms "
              f"(idle {idle * 1000:.0f} ms, the flood's step {step_s * 1000:.0f} ms; bound {bound * 1000:.0f} ms; was 8.3 s)")
        for th in threads:
            th.join(300)
        check(all(s == 200 for s in statuses), f"the flood's {len(statuses)} streams all answered 200")

        # An unauthenticated flood of connections from two other addresses: the tenants and
        # /health are still served (one address holds at most half the 128 slots; the last 16 are kept).
        held = []
        for source in ("127.0.0.2", "127.0.0.3"):
            for _ in range(70):
                try:
                    held.append(connect(srv.port, timeout=5, source=source))
                except OSError:
                    pass
        time.sleep(1.5)  # those that landed in the kept slots sent no header within 1 s: cut
        st_h, _, _ = http(srv, "GET", "/health")
        st_a, dt = ordinary_completion(srv, keys["A"])
        st_b, _ = ordinary_completion(srv, keys["B"])
        check(st_h == 200 and st_a == 200 and st_b == 200,
              f"{len(held)} unauthenticated connections from 2 addresses: /health {st_h}, tenant A {st_a} ({dt * 1000:.0f} ms), "
              f"tenant B {st_b}")
        for s in held:
            s.close()
    finally:
        srv.stop()
        os.unlink(f.name)
        os.unlink(g.name)
