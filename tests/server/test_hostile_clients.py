#!/usr/bin/env python3
"""`tandem serve` against hostile clients, on loopback only, bounded in time and count (issue 22):

  - model output that is not valid UTF-8 (Chinese prompts, many seeds, streaming or not, logprobs)
  - JSON nested 30,000 deep (messages content, tools, prompt)
  - 200 slowloris sockets and 500 idle keep-alive connections at once
  - pipelined requests (all answered, in order)
  - a chunked body past 4 MiB, a 200 MB header line, 300,000 headers, too many header fields
  - 100 connections announcing 4 MiB bodies at once (the bodies held at once are bounded)
  - a client that stops reading a stream, a non-streaming client that vanishes
  - the API key (from a file and from the environment; /metrics behind it; checked before the body)
  - Host, Origin and Content-Type guards, CORS for an allowed origin, a connection limit
  - a stop (SIGTERM) that does not wait on a stuck client
  - role forgery (control-token text in a message) and a hostile chat template (--chat-template-file)
  - issue 45: bodies quadratic to parse, two Authorization headers, unknown /tokenize fields, and
    tenants (API keys) that must not read each other's metrics, starve each other's first token,
    or lose every connection slot to an unauthenticated flood (hostile_tenants.py)

After each attack a normal request must be answered within a bound, the process must be alive
and its RSS bounded; each bad input must get its 4xx. Exit 77 (CTest: skipped) without the model.

    python3 tests/server/test_hostile_clients.py --tandem build/tandem --model models/....gguf
"""
import argparse
import concurrent.futures
import json
import os
import re
import select
import signal
import socket
import sys
import tempfile
import threading
import time

from hostile_harness import *  # noqa: F401,F403  (the server, the client helpers, check)
from hostile_own_servers import *  # noqa: F401,F403  (checks that start servers of their own)
from hostile_tenants import *  # noqa: F401,F403  (issue 45: parse bounds, tenants)
from hostile_agent_apis import attack_agent_apis  # issue 49: /v1/responses, /v1/messages, /v1/embeddings


def attack_utf8(srv):
    prompts = ["Write in Chinese: 你好，世界。今天", "日本語で答えてください：空は", "Emoji story: 😀🎉🚀", "Ελληνικά: καλημέρα κόσμε"]
    seeds = range(1, 11)
    jobs = []
    for p in prompts:
        for seed in seeds:
            base = {"prompt": p, "max_tokens": 6, "seed": seed, "temperature": 1.0}
            jobs += [("cmpl", dict(base)), ("cmpl", dict(base, stream=True)), ("cmpl", dict(base, logprobs=5)),
                     ("cmpl", dict(base, logprobs=5, stream=True)),
                     ("chat", {"messages": [{"role": "user", "content": p}], "max_tokens": 6, "seed": seed,
                               "logprobs": True, "top_logprobs": 5, "stream": seed % 2 == 0})]

    def one(job):
        kind, body = job
        path = "/v1/completions" if kind == "cmpl" else "/v1/chat/completions"
        st, _, raw = http(srv, "POST", path, body)
        if st != 200:
            return f"{st} {raw[:200]!r}", None, None
        raw.decode("utf-8")  # strict: every byte sent is valid UTF-8
        events = sse_events(raw) if body.get("stream") else [json.loads(raw)]
        text, tops = "", []
        for ev in events:
            for ch in ev.get("choices", []):
                text += ch.get("text") or (ch.get("message") or {}).get("content") or (ch.get("delta") or {}).get("content") or ""
                lp = ch.get("logprobs")
                if lp and kind == "cmpl":
                    if lp.get("top_logprobs") is None:
                        return "completions logprobs=5 returned top_logprobs: null", None, None
                    tops += lp["top_logprobs"]
                elif lp and kind == "chat":
                    for entry in lp["content"]:
                        if not isinstance(entry.get("token"), str) or not isinstance(entry.get("bytes"), list):
                            return "chat logprob entry without token/bytes", None, None
                        tops.append(entry["top_logprobs"])
        return None, text, tops

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
        results = list(ex.map(one, jobs))
    errors = [e for e, _, _ in results if e]
    check(not errors, f"UTF-8: {len(jobs)} requests ({len(prompts)} prompts x {len(seeds)} seeds x stream/plain/logprobs) "
                      f"all 200 with valid UTF-8 JSON {errors[:3]}")
    # Same seed, same text, streamed or not (and with logprobs or not).
    same = all(results[i][1] == results[i + 1][1] == results[i + 2][1] == results[i + 3][1] for i in range(0, len(jobs), 5))
    check(same, "UTF-8: streamed text equals non-streamed text for every seed")
    replaced = sum(1 for _, t, _ in results if t and "\ufffd" in t)
    print(f"     ({replaced} answers ended inside a character or held invalid bytes, shown as U+FFFD)")
    tops = [t for _, _, ts in results if ts for t in ts]
    filled = [t for t in tops if len(t) > 0]
    if filled:
        check(all(len(t) == 5 for t in tops), "top_logprobs: 5 alternatives per token")
    else:
        print("note the engine does not fill top_logprobs yet (engine/scheduler.cpp): the lists are present but empty")
    healthy(srv, "after UTF-8 attack")


def attack_nesting(srv):
    deep = "[" * 30000 + "]" * 30000
    bodies = {
        "messages content": '{"messages":[{"role":"user","content":' + deep + "}]}",
        "tools": '{"messages":[{"role":"user","content":"hi"}],"tools":' + deep + "}",
        "objects": '{"messages":[{"role":"user","content":"hi"}],"x":' + '{"a":' * 30000 + "1" + "}" * 30000 + "}",
    }
    for name, body in bodies.items():
        st, _, raw = http(srv, "POST", "/v1/chat/completions", body.encode())
        msg = error_of(raw).get("message", "")
        check(st == 400 and "64" in msg, f"nesting: 30,000 deep in {name} ({len(body) // 1000} KB) -> {st} {msg!r}")
    st, _, raw = http(srv, "POST", "/v1/completions", ('{"prompt":' + deep + "}").encode())
    check(st == 400, f"nesting: 30,000 deep prompt -> {st}")
    st, _, raw = http(srv, "POST", "/v1/completions", b"[" * ((4 << 20) - 1))
    check(st == 400, f"nesting: 4 MiB of '[' -> {st}")
    ok = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 1}
    st, _, raw = http(srv, "POST", "/v1/chat/completions", ok)
    check(st in (200, 400) and st != 500, f"nesting: ordinary content parts -> {st}")
    healthy(srv, "after nesting attack")


def attack_slow_and_idle(srv):
    slow = []
    for i in range(200):
        s = connect(srv.port, timeout=30)
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {srv.host}\r\n".encode())
        slow.append(s)
    stop = threading.Event()

    def drip():  # one header line per socket every second, as slowloris does
        k = 0
        while not stop.is_set():
            for s in slow:
                try:
                    s.send(b"X-a%d: b\r\n" % k)
                except OSError:
                    pass
            k += 1
            stop.wait(1.0)
    threading.Thread(target=drip, daemon=True).start()
    t_open = time.time()
    idle = []
    for i in range(500):
        s = connect(srv.port, timeout=30)
        s.sendall(request_bytes("GET", "/health", srv.host))
        idle.append((s, Reader(s)))
    answered = sum(1 for s, r in idle if r.response()[0] == 200)
    check(answered == 500, f"500 keep-alive connections each answered ({answered})")
    lat = sorted(healthy(srv, f"during 200 slowloris + 500 idle keep-alive (#{k})") for k in range(5))
    print(f"     /health under 200 slowloris + 500 idle: median {lat[2] * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms")
    # The idle connections still work (keep-alive), and the slowloris ones are cut at the header deadline.
    s, r = idle[0]
    s.sendall(request_bytes("GET", "/health", srv.host))
    check(r.response()[0] == 200, "an idle keep-alive connection serves its next request")
    closed, statuses = 0, set()
    deadline = t_open + 10 + 8  # header timeout 10 s, some slack
    for s in slow:
        s.settimeout(max(0.1, deadline - time.time()))
        try:
            data = s.recv(4096)
            while data and not data.endswith(b"}"):
                more = s.recv(4096)
                if not more:
                    break
                data += more
            if data.startswith(b"HTTP/1.1 "):
                statuses.add(int(data.split()[1]))
            closed += 1
        except (socket.timeout, OSError):
            pass
    stop.set()
    check(closed == 200 and statuses == {408}, f"slowloris: the server closed {closed}/200 at the header deadline ({statuses})")
    for s in slow:
        s.close()
    for s, _ in idle:
        s.close()
    healthy(srv, "after slowloris and idle connections")


def attack_pipelining(srv):
    s = connect(srv.port, timeout=60)
    reqs = [("GET", "/health", None), ("POST", "/v1/completions", {"prompt": "One", "max_tokens": 2, "temperature": 0}),
            ("GET", "/v1/models", None), ("POST", "/v1/completions", {"prompt": "Two", "max_tokens": 3, "temperature": 0, "stream": True}),
            ("GET", "/nope", None), ("POST", "/v1/completions", {"prompt": "x", "max_tokens": -1}),
            ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
            ("GET", "/health", None)]
    blob = b"".join(request_bytes(m, p, srv.host, json.dumps(b).encode() if b else b"") for m, p, b in reqs)
    s.sendall(blob)  # all eight in one write
    r = Reader(s)
    got = []
    try:
        for _ in reqs:
            got.append(r.response())
    except Exception as e:
        print(f"     pipelining stopped after {len(got)}: {e}")
    s.close()
    expect = [200, 200, 200, 200, 404, 400, 200, 200]
    kinds_ok = len(got) == 8 and b"status" in got[0][2] and b"text_completion" in got[1][2] and b'"list"' in got[2][2] \
        and b"data: [DONE]" in got[3][2] and b"chat.completion" in got[6][2] and b"status" in got[7][2]
    check([g[0] for g in got] == expect and kinds_ok, f"pipelining: 8 requests in one write, 8 answers in order {[g[0] for g in got]}")
    healthy(srv, "after pipelining")


def send_until_cut(srv, head, piece, limit_bytes):
    """Sends `head`, then `piece` repeatedly until the server answers/closes or `limit_bytes` went out."""
    s = connect(srv.port, timeout=10)
    sent = 0
    try:
        s.sendall(head)
        s.setblocking(False)
        while sent < limit_bytes:
            r, w, _ = select.select([s], [s], [], 5)
            if r:
                break
            if not w:
                break
            try:
                sent += s.send(piece)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                break
        s.setblocking(True)
        s.settimeout(5)
        try:
            status = Reader(s).response()[0]
        except Exception:
            status = None
    finally:
        s.close()
    return status, sent


def attack_limits(srv):
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {srv.host}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
    st, sent = send_until_cut(srv, head, chunk, 300 << 20)
    check(st == 413 and sent < 32 << 20, f"chunked body past 4 MiB -> {st} after {sent >> 20} MiB sent (of 300 MiB tried)")
    st, sent = send_until_cut(srv, f"GET /health HTTP/1.1\r\nHost: {srv.host}\r\nX-Big: ".encode(), b"a" * 65536, 200 << 20)
    check(st == 431 and sent < 32 << 20, f"a 200 MB header line -> {st} after {sent >> 10} KiB sent")
    many = b"".join(b"X-h%d: v\r\n" % i for i in range(1000))
    st, sent = send_until_cut(srv, f"GET /health HTTP/1.1\r\nHost: {srv.host}\r\n".encode(), many, 300000 * 12)
    check(st == 431 and sent < 32 << 20, f"300,000 headers -> {st} after {sent >> 10} KiB sent")
    st, _, raw = http(srv, "GET", "/health", headers={f"X-h{i}": "v" for i in range(150)})
    check(st == 431, f"150 small header fields (over the 100-field limit) -> {st} {error_of(raw).get('message')}")
    st, _, raw = http(srv, "POST", "/v1/completions", b" " * ((4 << 20) + 1))
    check(st == 413, f"a 4 MiB + 1 byte body -> {st}")
    st, _, raw = http(srv, "POST", "/v1/completions", {"prompt": "word " * 800000, "max_tokens": 1})
    msg = error_of(raw).get("message", "")
    check(st == 400 and "bytes" in msg, f"a 4 MB prompt is refused by its size before tokenizing -> {st} {msg[:90]!r}")
    s = connect(srv.port)
    s.sendall(b"GARBAGE\r\n\r\n")
    check(Reader(s).response()[0] == 400, "a malformed request line -> 400")
    s.close()
    healthy(srv, "after header/body limits")


def attack_body_budget(srv):
    """100 connections each announce a 4 MiB body and trickle it: the bodies held at once are
    bounded (256 MiB), so the ones past it get a quick 503 instead of memory."""
    socks, busy = [], 0
    for _ in range(100):
        s = connect(srv.port, timeout=5)
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {srv.host}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {(4 << 20) - 1}\r\n\r\n".encode() + b" " * 1024)
        socks.append(s)
    time.sleep(0.5)
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(4096).startswith(b"HTTP/1.1 503"):
                busy += 1
        except (BlockingIOError, OSError):
            pass
    check(30 <= busy <= 40, f"in-flight bodies: {busy} of 100 announced 4 MiB bodies got a quick 503 (64 fit in 256 MiB)")
    healthy(srv, "while 64 bodies trickle in")
    for s in socks:
        s.close()


def attack_stuck_reader(srv):
    before = metric(srv, CANCELLED)
    s = connect(srv.port, timeout=30, rcvbuf=4096)
    # Greedy counting runs on for thousands of tokens; logprobs make each chunk 0.5-2 KB, so the
    # socket buffers (the server's is 128 KiB) fill after a few hundred tokens.
    body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 7000, "temperature": 0, "stream": True, "logprobs": 5,
            "ignore_eos": True}
    s.sendall(request_bytes("POST", "/v1/completions", srv.host, json.dumps(body).encode()))
    t0 = time.time()
    healthy(srv, "while a client does not read its stream")
    ended = False
    while time.time() - t0 < 90:
        if metric(srv, CANCELLED) > before:
            ended = True
            break
        if metric(srv, "tandem_running_sequences") == 0 and time.time() - t0 > 5:
            break
        time.sleep(0.5)
    check(ended, f"a client that stops reading its stream is cut off and its sequence cancelled ({time.time() - t0:.1f} s)")
    s.close()
    healthy(srv, "after the stuck reader")


def attack_vanishing(srv):
    before = metric(srv, CANCELLED)
    gen_before = metric(srv, "tandem_generated_tokens_total")
    s = connect(srv.port)
    s.sendall(request_bytes("POST", "/v1/completions", srv.host,
                            json.dumps({"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 4000, "temperature": 0,
                                        "ignore_eos": True}).encode()))
    time.sleep(1.0)
    s.close()
    t0 = time.time()
    while time.time() - t0 < 10 and metric(srv, CANCELLED) <= before:
        time.sleep(0.2)
    generated = metric(srv, "tandem_generated_tokens_total") - gen_before
    check(metric(srv, CANCELLED) > before and generated < 4000,
          f"a non-streaming client that leaves is cancelled ({generated:.0f} of 4000 tokens made)")
    healthy(srv, "after the vanishing client")


def attack_origin(srv):
    hdr = {"Host": f"evil.example:{srv.port}"}
    st, _, raw = http(srv, "GET", "/v1/models", headers=hdr)
    check(st == 403, f"Host evil.example (DNS rebinding) -> {st} {error_of(raw).get('message', '')[:60]!r}")
    st, _, _ = http(srv, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}, host=f"evil.example:{srv.port}")
    check(st == 403, f"POST with Host evil.example -> {st}")
    for h in (f"localhost:{srv.port}", f"127.0.0.1:{srv.port}", f"[::1]:{srv.port}"):
        st, _, _ = http(srv, "GET", "/v1/models", host=h)
        check(st == 200, f"Host {h} -> {st}")
    st, _, _ = http(srv, "GET", "/v1/models", host=f"127.0.0.1:{srv.port + 1}")
    check(st == 403, f"Host with another port -> {st}")
    st, _, _ = http(srv, "GET", "/v1/models", headers={"Origin": "http://evil.example"})
    check(st == 403, f"Origin http://evil.example -> {st}")
    st, _, _ = http(srv, "GET", "/v1/models", headers={"Origin": f"http://127.0.0.1:{srv.port}"})
    check(st == 200, f"same Origin -> {st}")
    st, _, raw = http(srv, "POST", "/v1/completions", json.dumps({"prompt": "x"}).encode(), content_type="text/plain")
    check(st == 415, f"POST as text/plain (a page's no-preflight form post) -> {st}")
    st, _, _ = http(srv, "POST", "/v1/completions", json.dumps({"prompt": "x"}).encode(), content_type=None)
    check(st == 415, f"POST without Content-Type -> {st}")
    st, _, _ = http(srv, "OPTIONS", "/v1/completions", headers={"Origin": "http://evil.example",
                                                               "Access-Control-Request-Method": "POST"})
    check(st == 403, f"preflight from a foreign origin -> {st}")
    st, _, _ = http(srv, "PUT", "/v1/completions")
    check(st == 405, f"PUT /v1/completions -> {st}")
    st, _, _ = http(srv, "DELETE", "/health")
    check(st == 405, f"DELETE /health -> {st} (open to read, not to anything else)")
    healthy(srv, "after Host/Origin checks")


# ---- issue 34: strict HTTP framing (RFC 9112) and answers nobody reads ------------------------

def raw_exchange(srv, data, wait=2.0):
    """Sends `data` on a new connection; returns (bytes received, status codes of every response
    line in them, whether the server closed the connection)."""
    s = connect(srv.port, timeout=wait)
    s.sendall(data)
    got, closed = b"", False
    try:
        while True:
            more = s.recv(65536)
            if not more:
                closed = True
                break
            got += more
    except (socket.timeout, OSError):
        pass
    s.close()
    return got, [int(x) for x in re.findall(rb"(?m)^HTTP/1\.1 (\d{3}) ", got)], closed


def attack_framing(srv):
    """A request whose body length is uncertain is answered 400 and its connection closed: the
    bytes after its header (here a whole request, as a smuggler sends) are never answered. One Host;
    unknown methods 501; an Expect the server cannot meet 417, before the body."""
    host = srv.host
    smuggled = request_bytes("GET", "/v1/models", host)
    post = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    cases = [
        ("Transfer-Encoding: chunked, identity", post + "Transfer-Encoding: chunked, identity\r\n\r\n", 400),
        ("Transfer-Encoding: identity", post + "Transfer-Encoding: identity\r\n\r\n", 400),
        ("Transfer-Encoding + Content-Length", post + f"Transfer-Encoding: chunked\r\nContent-Length: {len(smuggled)}\r\n\r\n", 400),
        ("Content-Length + Transfer-Encoding", post + f"Content-Length: {len(smuggled)}\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        ("two Content-Lengths", post + f"Content-Length: 2\r\nContent-Length: {len(smuggled)}\r\n\r\n", 400),
        ("Transfer-Encoding: gzip, chunked", post + "Transfer-Encoding: gzip, chunked\r\n\r\n", 501),
        ("two Host lines", f"GET /health HTTP/1.1\r\nHost: {host}\r\nHost: evil.example\r\n\r\n", 400),
        ("no Host on HTTP/1.1", "GET /health HTTP/1.1\r\n\r\n", 400),
        ("method FOOBAR", f"FOOBAR /health HTTP/1.1\r\nHost: {host}\r\n\r\n", 501),
        ("Expect: 999-bogus", post + f"Expect: 999-bogus\r\nContent-Length: {len(smuggled)}\r\n\r\n", 417),
    ]
    for label, head, want in cases:
        got, statuses, closed = raw_exchange(srv, head.encode() + smuggled)
        check(statuses == [want] and closed and b'"list"' not in got,
              f"framing: {label} -> {statuses} (want [{want}]), connection {'closed' if closed else 'OPEN'}, "
              f"smuggled request {'ANSWERED' if b'list' in got else 'not answered'}")
    # The 417 comes before the body is sent (not after a body deadline), and the 501 before routing.
    s = connect(srv.port, timeout=5)
    t = time.time()
    s.sendall((post + "Expect: 999-bogus\r\nContent-Length: 100000\r\n\r\n").encode())
    try:
        st = Reader(s).response()[0]
    except Exception as e:
        st = str(e)
    s.close()
    check(st == 417 and time.time() - t < 1, f"framing: Expect: 999-bogus with the body unsent -> {st} in {(time.time() - t) * 1000:.0f} ms")
    st, _, _ = http(srv, "FOOBAR", "/nope")
    check(st == 501, f"framing: FOOBAR /nope -> {st}")
    for method, want in (("PUT", 405), ("DELETE", 405), ("PATCH", 405)):
        st, _, _ = http(srv, method, "/v1/completions")
        check(st == want, f"framing: a known method not routed, {method} /v1/completions -> {st}")
    # What stays allowed: HTTP/1.0 without Host, an Expect: 100-continue in any case, HEAD without a body.
    _, statuses, _ = raw_exchange(srv, b"GET /health HTTP/1.0\r\n\r\n")
    check(statuses == [200], f"framing: HTTP/1.0 without Host -> {statuses}")
    st, _, raw = http(srv, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, headers={"Expect": "100-Continue"})
    check(st == 200, f"framing: Expect: 100-Continue -> {st}")
    got, statuses, closed = raw_exchange(srv, request_bytes("HEAD", "/health", host) + request_bytes("GET", "/health", host), wait=1.0)
    check(statuses == [200, 200] and got.count(b'{"status":"ok"}') == 1 and not closed,
          f"framing: HEAD /health then GET on one connection -> {statuses}, one body (the GET's)")
    healthy(srv, "after framing attacks")


def attack_unread_answers(srv):
    """60 clients each ask /detokenize for a 21 MB answer (a 1.8 MiB request) and never read it.
    The answers waiting are bounded across connections (256 MiB): the rest get a quick 503 with
    Retry-After, RSS stays bounded (unbounded it grew by 1.3 GB), and the memory is given back to
    the system once the clients are gone (it was kept)."""
    st, _, raw = http(srv, "POST", "/tokenize", {"content": "#" * 80})
    ids = json.loads(raw)["tokens"] if st == 200 else []
    if not check(len(ids) == 1, f"unread answers: '#' x 80 is one token ({ids})"):
        return
    body = json.dumps({"tokens": ids * (1 << 18)}).encode()  # 262,144 tokens of 80 bytes: 21 MB of text
    if under_asan(srv):
        # Its bounds are the release build's: under ASan answers are made too slowly to fill the
        # budget and the quarantine keeps freed memory. Here it checks memory safety only.
        socks = [connect(srv.port, rcvbuf=4096) for _ in range(4)]
        for s in socks:
            s.sendall(request_bytes("POST", "/detokenize", srv.host, body))
        time.sleep(3)
        for s in socks:
            s.close()
        print("     (under ASan: 4 unread 21 MB answers, memory safety only; the bounds are checked in the release build)")
        healthy(srv, "after unread 21 MB answers (ASan)")
        return
    time.sleep(1.0)
    rss_before = srv.rss_mb()
    peak = [rss_before]
    sampling = threading.Event()

    def sample():
        while not sampling.is_set():
            peak[0] = max(peak[0], srv.rss_mb())
            time.sleep(0.02)
    threading.Thread(target=sample, daemon=True).start()
    socks = []
    for _ in range(60):
        s = connect(srv.port, timeout=10, rcvbuf=4096)
        s.sendall(request_bytes("POST", "/detokenize", srv.host, body))
        socks.append(s)
    time.sleep(1.5)
    t = time.time()
    st, _, _ = http(srv, "GET", "/health", timeout=HEALTH_BOUND_S + 5)
    dt = time.time() - t
    check(st == 200 and dt < HEALTH_BOUND_S, f"unread answers: /health meanwhile {st} in {dt * 1000:.1f} ms")
    # A client that does read: a quick 503 while the budget is spent, then (the stalled clients cut
    # off) its answer, retrying as Retry-After says.
    t, tries, st = time.time(), [], None
    while st != 200 and time.time() - t < COMPLETION_BOUND_S:
        try:
            st, h, raw = http(srv, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0},
                              timeout=COMPLETION_BOUND_S + 5)
        except Exception as e:
            st, h = str(e), {}
        tries.append(st)
        if st == 503:
            time.sleep(float(h.get("retry-after", "1")))
    dt = time.time() - t
    check(st == 200 and dt < COMPLETION_BOUND_S, f"unread answers: a completion meanwhile {tries} in {dt:.2f} s")
    # Every client hears back: a 503 with Retry-After while the budget is spent, or its answer
    # (made once the budget had room, stalled clients being cut off). How many get which depends
    # on how fast this machine makes 21 MB answers (a fast idle host: 40-50 of 60 get the 503; a
    # loaded CI host 12), so the bound itself is checked by RSS below, not by the count.
    busy = retry_after = answered = 0
    deadline = time.time() + 30
    for s in socks:
        s.settimeout(max(0.1, deadline - time.time()))
        try:
            head = s.recv(4096)
        except (socket.timeout, OSError):
            continue
        if head.startswith(b"HTTP/1.1 503"):
            busy += 1
            retry_after += b"\r\nRetry-After: " in head
        elif head.startswith(b"HTTP/1.1 200"):
            answered += 1
    sampling.set()
    grew = peak[0] - rss_before
    check(busy >= 1 and retry_after == busy and busy + answered == 60,
          f"unread answers: every client heard back: {busy} of 60 a 503 ({retry_after} with Retry-After), {answered} "
          f"their answer, {60 - busy - answered} nothing in 30 s")
    scale = srv.rss_bound_mb / RSS_GROWTH_BOUND_MB  # ASan
    check(grew < 700 * scale, f"unread answers: RSS grew {grew:.0f} MB at most ({rss_before:.0f} -> {peak[0]:.0f} MB; "
                      f"bounded by the 256 MiB budget, the bodies and the answers being made; 60 x 21 MB unbounded)")
    for s in socks:
        s.close()
    rss_after = srv.rss_mb()
    for _ in range(20):  # the server notices the closes, frees the answers, gives the memory back (every 0.5 s)
        if rss_after - rss_before < 48 * scale:
            break
        time.sleep(0.25)
        rss_after = srv.rss_mb()
    check(rss_after - rss_before < 48 * scale, f"unread answers: RSS back to {rss_after:.0f} MB after the clients closed "
                                       f"(before {rss_before:.0f}, peak {peak[0]:.0f} MB)")
    healthy(srv, "after 60 unread 21 MB answers")


def probe_grammar(rules, step="[a-z]", leaf='"\\x04"'):
    """Issue 34's GBNF probe: `rules` rules r_i ::= step r_i "i" | leaf, the root picking any. With a leaf
    no token can produce (byte 0x04 in SmolLM2's vocabulary) its parses never close: every token deepens them."""
    root = "root ::= " + " | ".join(f"r{i}" for i in range(rules))
    return root + "\n" + "".join(f'r{i} ::= {step} r{i} "i" | {leaf}\n' for i in range(rules))


def defs_probe_schema(n):
    """Issue 34's schema probe: an anyOf of n self-referencing $defs arrays."""
    return {"$defs": {f"a{i}": {"type": "array", "items": {"$ref": f"#/$defs/a{i}"}} for i in range(n)},
            "anyOf": [{"$ref": f"#/$defs/a{i}"} for i in range(n)]}


def token_gaps(srv, n=6):
    """Median time per output token (and per request) of n streamed 20-token greedy completions."""
    tpots, totals = [], []
    for _ in range(n):
        s = connect(srv.port, timeout=60)
        t0, stamps, buf = time.time(), [], b""
        try:
            s.sendall(request_bytes("POST", "/v1/completions", srv.host, json.dumps(
                {"prompt": "Count: 1, 2, 3, 4,", "max_tokens": 20, "temperature": 0, "stream": True}).encode()))
            while b"[DONE]" not in buf:
                data = s.recv(65536)
                if not data:
                    break
                buf += data
                stamps += [time.time()] * (data.count(b'"text":"') - data.count(b'"text":""'))
        finally:
            s.close()
        totals.append(time.time() - t0)
        if len(stamps) > 2:
            tpots.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    tpots.sort()
    totals.sort()
    return (tpots[len(tpots) // 2] if tpots else float("inf")), totals[len(totals) // 2]


def grammar_budget_checks(tandem, model):
    """Issue 34 items 1 and 7: a grammar whose parses multiply or deepen with every byte ends its own
    request with an error naming the grammar budget (a 400 when its start already shows it), while other
    requests' time per token moves no more than a normal neighbour's would, and RSS stays bounded; a
    grammar no token can start is a 400 naming the parameter."""
    srv = Server(tandem, model, [])
    try:
        healthy(srv, "grammar budget: before")
        rss0 = srv.rss_mb()
        chat = lambda schema: {"messages": [{"role": "user", "content": "A list:"}], "max_tokens": 50,
                               "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}
        t = time.time()
        st, _, body = http(srv, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 50, "grammar": probe_grammar(1024, "[a-z ,.]", '"!"')})
        e = error_of(body)
        check(st == 400 and e.get("param") == "grammar" and "grammar budget" in e.get("message", "") and time.time() - t < 2,
              f"the 1024-rule GBNF probe (40 KB): {st} in {(time.time() - t) * 1000:.0f} ms, {e.get('param')}: {e.get('message', '')[:90]}")
        t = time.time()
        st, _, body = http(srv, "POST", "/v1/chat/completions", chat(defs_probe_schema(600)))
        e = error_of(body)
        check(st == 400 and e.get("param") == "response_format" and "grammar budget" in e.get("message", "") and time.time() - t < 2,
              f"the anyOf of 600 $defs arrays: {st} in {(time.time() - t) * 1000:.0f} ms, {e.get('param')}: {e.get('message', '')[:90]}")
        st, _, body = http(srv, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 5, "grammar": 'root ::= "\\x04" "q"'})
        e = error_of(body)
        check(st == 400 and e.get("param") == "grammar" and "no token" in e.get("message", ""),
              f"a grammar no token can start: {st}, {e.get('param')}: {e.get('message', '')[:90]}")

        # Probes that start within the budget and die on the way, run back to back by two clients, against a
        # normal neighbour (an unconstrained sampled completion) as the reference for what sharing costs.
        idle = token_gaps(srv, 10)

        def neighbour_load(kind, stop, outcomes):
            while not stop.is_set():
                if kind == "probes":  # the two probes by turns
                    kind = "gbnf30" if not outcomes or outcomes[-1][2] == "gbnf100" else "gbnf100"
                if kind == "plain":
                    st, _, body = http(srv, "POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 100, "temperature": 1.0})
                    outcomes.append((st, "", kind))
                    continue
                rules, stream = (30, False) if kind == "gbnf30" else (100, True)
                st, _, body = http(srv, "POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 1.0,
                                                                    "stream": stream, "grammar": probe_grammar(rules)}, timeout=120)
                if stream:
                    msg = next((ev["error"]["message"] for ev in sse_events(body) if "error" in ev), "")
                else:
                    msg = error_of(body).get("message", "")
                outcomes.append((st, msg, kind))
                kind = "probes"

        def under(kinds):
            stop, outcomes = threading.Event(), []
            threads = [threading.Thread(target=neighbour_load, args=(k, stop, outcomes)) for k in kinds]
            for th in threads:
                th.start()
            time.sleep(0.5)
            gaps = token_gaps(srv, 10)
            deadline = time.time() + 60
            while len(outcomes) < 2 and time.time() < deadline:  # both probes ran (streamed and not)
                time.sleep(0.1)
            stop.set()
            for th in threads:
                th.join()
            return gaps, outcomes

        normal, _ = under(["plain"])
        probed, outcomes = under(["probes"])
        # Streamed: an error event; not streamed: a 400 (the grammar is the request's fault, not a 500).
        budget_errors = sum(1 for st, msg, kind in outcomes if "grammar budget" in msg and st == (200 if kind == "gbnf100" else 400))
        print(f"     TPOT of 20-token greedy completions: alone {idle[0] * 1000:.2f} ms ({idle[1]:.3f} s per request), "
              f"beside a normal request {normal[0] * 1000:.2f} ms, beside a probe client {probed[0] * 1000:.2f} ms "
              f"({probed[1]:.3f} s per request, x{probed[0] / idle[0]:.2f} of alone)")
        check(outcomes and budget_errors == len(outcomes),
              f"every probe run ended with an error naming the grammar budget ({budget_errors} of {len(outcomes)}: "
              f"{sorted(set((st, msg[:60]) for st, msg, _ in outcomes))[:3]})")
        # Any neighbour shares the engine's threads (one beside a normal request already costs ~2x on 2 cores):
        # the probe may cost 2x, or no more than a normal neighbour does.
        check(probed[0] < max(2 * idle[0], 1.3 * normal[0]),
              f"a probe client moves the others' time per token by at most 2x (or a normal neighbour's cost): "
              f"{probed[0] * 1000:.2f} ms (alone {idle[0] * 1000:.2f} ms, beside a normal request {normal[0] * 1000:.2f} ms)")
        rss = srv.rss_mb()
        check(rss - rss0 < 200 * (3 if under_asan(srv) else 1), f"RSS after the probes: {rss:.0f} MB (before {rss0:.0f} MB; the mask caches hold at most 64 MiB)")
        healthy(srv, "grammar budget: after the probes")
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print(f"skip: no model at {a.model} (run scripts/setup.sh)")
        return SKIP
    t_start = time.time()
    srv = Server(a.tandem, a.model, ["--write-timeout", "3"])
    try:
        healthy(srv, "baseline")
        for attack in (attack_utf8, attack_nesting, attack_slow_and_idle, attack_pipelining, attack_limits, attack_body_budget, attack_stuck_reader,
                       attack_vanishing, attack_origin, attack_request_lists, attack_nested_fields, attack_framing,
                       attack_unread_answers, quadratic_json_checks, header_and_field_checks, attack_agent_apis):
            t = time.time()
            attack(srv)
            print(f"     [{attack.__name__}: {time.time() - t:.1f} s]")
        # A stop must not wait on a stuck client: one slowloris socket and one unread stream are open.
        s1 = connect(srv.port)
        s1.sendall(f"GET /health HTTP/1.1\r\nHost: {srv.host}\r\n".encode())
        s2 = connect(srv.port, rcvbuf=4096)
        s2.sendall(request_bytes("POST", "/v1/completions", srv.host,
                                 json.dumps({"prompt": "1, 2, 3,", "max_tokens": 3000, "stream": True, "ignore_eos": True}).encode()))
        time.sleep(1)
        # The first SIGTERM drains (the unread stream may hold it); a second one stops at once.
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        rc, dt = sigterm(srv)
        check(rc == 0 and dt < 5, f"a second SIGTERM with stuck clients: exit {rc} in {dt:.1f} s")
        s1.close()
        s2.close()
    finally:
        srv.stop()

    srv = Server(a.tandem, a.model, [])
    permissive = Server(a.tandem, a.model, ["--allow-special-in-messages"])
    try:
        role_forgery_checks(srv, permissive)
    finally:
        srv.stop()
        permissive.stop()
    hostile_template_checks(a.tandem, a.model)
    prefix_oracle_checks(a.tandem, a.model)
    preemption_checks(a.tandem, a.model)
    drain_checks(a.tandem, a.model)
    grammar_budget_checks(a.tandem, a.model)
    tenant_checks(a.tandem, a.model)

    # The API key from a file (and the environment), a connection limit, an allowed origin.
    key = "k-" + os.urandom(12).hex()
    with tempfile.NamedTemporaryFile("w", suffix=".key", delete=False) as f:
        f.write(key + "\n")
    try:
        srv = Server(a.tandem, a.model, ["--api-key-file", f.name, "--max-connections", "40", "--allow-origin", "https://app.example"])
        try:
            auth_server_checks(srv, key)
            connection_limit_checks(srv, key, 40)
        finally:
            srv.stop()
    finally:
        os.unlink(f.name)
    env = dict(os.environ, TANDEM_API_KEY=key)
    srv = Server(a.tandem, a.model, [], env=env)
    try:
        st, _, _ = http(srv, "GET", "/v1/models")
        st2, _, _ = http(srv, "GET", "/v1/models", headers={"Authorization": f"Bearer {key}"})
        check(st == 401 and st2 == 200, f"TANDEM_API_KEY from the environment: {st} without, {st2} with")
    finally:
        srv.stop()

    print(f"\n{len(failures)} failures ({time.time() - t_start:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
