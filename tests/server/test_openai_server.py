#!/usr/bin/env python3
"""`tandem serve` driven by real clients: the official `openai` package for completions, chat
and streaming; raw HTTP for bad input, llama-server's /tokenize, /detokenize and /apply-template,
and a client that disconnects mid-stream; and a bounded
load test (64 concurrent streaming requests) that checks every request completes with the
right token count and the KV pool returns to empty. Exit code 77 (CTest: skipped) when the
model or the openai package is missing.

    python3 tests/server/test_openai_server.py --tandem build/tandem --model models/....gguf
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

SKIP = 77
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def start_server(tandem, model, extra=()):
    proc = subprocess.Popen([tandem, "serve", "-m", model, "--port", "0", "--kv-memory", "256MiB", *extra],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("tandem serve did not start")


def raw(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def metric(port, name):
    _, text = raw(port, "GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return None


def wait_idle(port):
    for _ in range(200):
        if metric(port, "tandem_running_sequences") == 0 and metric(port, "tandem_queue_length") == 0:
            return
        time.sleep(0.05)


def args_or_skip():
    """--tandem and --model, or None (after saying why) when the model or the openai package is missing."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print(f"skip: no model at {a.model} (run scripts/setup.sh)")
        return None
    try:
        import openai  # noqa: F401
    except ImportError:
        print("skip: the openai package is not installed (scripts/setup.sh installs it)")
        return None
    return a


def main():
    a = args_or_skip()
    if a is None:
        return SKIP
    import openai

    proc, port = start_server(a.tandem, a.model)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        models = client.models.list()
        check(len(models.data) == 1 and models.data[0].id, "GET /v1/models lists the model")

        c = client.completions.create(model="m", prompt="The capital of France is", max_tokens=8, temperature=0)
        check("Paris" in c.choices[0].text, f"completion mentions Paris: {c.choices[0].text!r}")
        check(c.usage.completion_tokens <= 8 and c.usage.prompt_tokens == 5, f"completion usage {c.usage}")

        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is the capital of France?"}],
                                              max_tokens=24, temperature=0)
        check(chat.choices[0].message.role == "assistant" and len(chat.choices[0].message.content) > 0,
              f"chat answer {chat.choices[0].message.content!r}")

        chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hello"}],
                                                     max_tokens=12, temperature=0, stream=True))
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        same = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hello"}],
                                              max_tokens=12, temperature=0)
        check(streamed == same.choices[0].message.content, f"streamed chat equals non-streamed: {streamed!r}")
        check(chunks[-1].choices[0].finish_reason in ("stop", "length"), "stream ends with a finish reason")

        s1 = client.completions.create(model="m", prompt="Once upon a time", max_tokens=16, temperature=0.9, seed=7)
        s2 = client.completions.create(model="m", prompt="Once upon a time", max_tokens=16, temperature=0.9, seed=7)
        check(s1.choices[0].text == s2.choices[0].text, "same seed, same sampled text")

        st = client.completions.create(model="m", prompt="1, 2, 3, 4, 5,", max_tokens=30, temperature=0, stop=[" 8"])
        check(" 8" not in st.choices[0].text and st.choices[0].finish_reason == "stop", f"stop string: {st.choices[0].text!r}")

        lp = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                            temperature=0, logprobs=True)
        content = lp.choices[0].logprobs.content
        check(len(content) >= 1 and all(t.logprob <= 0 for t in content), "chat logprobs are log-probabilities")
        lpc = client.completions.create(model="m", prompt="Hello", max_tokens=3, temperature=0, logprobs=1)
        check(len(lpc.choices[0].logprobs.token_logprobs) == lpc.usage.completion_tokens, "completion logprobs per token")

        # llama-server's tokenizer endpoints agree with what the OpenAI endpoints count.
        def post(path, body):
            code, data = raw(port, "POST", path, json.dumps(body).encode())
            return code, json.loads(data)
        code, tk = post("/tokenize", {"content": "The capital of France is"})
        check(code == 200 and len(tk["tokens"]) == c.usage.prompt_tokens and all(isinstance(t, int) for t in tk["tokens"]),
              f"/tokenize counts the completion's prompt tokens: {tk}")
        code, dt = post("/detokenize", {"tokens": tk["tokens"]})
        check(code == 200 and dt == {"content": "The capital of France is"}, f"/detokenize inverts it: {dt}")
        code, wp = post("/tokenize", {"content": "Paris, café 🤗", "with_pieces": True})
        joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in wp["tokens"])
        check(code == 200 and joined == "Paris, café 🤗".encode() and all(set(p) == {"id", "piece"} for p in wp["tokens"]),
              f"with_pieces: pieces (text, or bytes when a piece splits a character) join to the content: {wp}")
        code, sp = post("/tokenize", {"content": "<|im_start|>"})
        code2, sp2 = post("/tokenize", {"content": "<|im_start|>", "parse_special": False})
        check(sp["tokens"] == [1] and len(sp2["tokens"]) > 1, f"parse_special: {sp} vs {sp2}")
        question = [{"role": "user", "content": "What is the capital of France?"}]
        code, at = post("/apply-template", {"messages": question})
        check(code == 200 and at["prompt"].endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"),
              f"/apply-template renders the model's template: {at}")
        code, tk = post("/tokenize", {"content": at["prompt"]})
        check(len(tk["tokens"]) == chat.usage.prompt_tokens, f"its prompt is what the chat counted ({chat.usage.prompt_tokens} tokens)")
        for path, body, param in [("/detokenize", {"tokens": [1, 10 ** 6]}, "tokens"), ("/detokenize", {"tokens": [-3]}, "tokens"),
                                  ("/detokenize", {"tokens": "1 2"}, "tokens"), ("/tokenize", {"content": 7}, "content"),
                                  ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
                                  ("/apply-template", {"messages": []}, "messages")]:
            code, err = post(path, body)
            check(code == 400 and err["error"]["param"] == param, f"{path} {body} -> {code} {err['error']['message']}")
        code, data = raw(port, "POST", "/tokenize", b"[" * 100000)
        check(code == 400 and b"deeper" in data, f"/tokenize: deep JSON -> {code}")

        # Bad input: clear 4xx errors with an OpenAI error object; the server keeps serving.
        bad = [
            (b"{not json", 400, None),
            (json.dumps({"prompt": "x", "max_tokens": "many"}).encode(), 400, "max_tokens"),
            (json.dumps({"prompt": "x", "max_tokens": -1}).encode(), 400, "max_tokens"),
            (json.dumps({"prompt": "x", "max_tokens": 10**9}).encode(), 400, "max_tokens"),
            (json.dumps({"prompt": "x", "temperature": "hot"}).encode(), 400, "temperature"),
            (json.dumps({"prompt": 5}).encode(), 400, "prompt"),
            (json.dumps({"prompt": "x", "n": 2}).encode(), 400, "n"),
            (json.dumps({"prompt": "word " * 9000}).encode(), 400, "prompt"),
        ]
        for body, status, param in bad:
            code, data = raw(port, "POST", "/v1/completions", body)
            err = json.loads(data).get("error", {}) if data.startswith(b"{") else {}
            check(code == status and err.get("message") and (param is None or err.get("param") == param),
                  f"bad request -> {code} {err.get('param')}: {err.get('message')}")
        code, data = raw(port, "POST", "/v1/completions", b"x" * (5 << 20))
        check(code == 413 and b"error" in data, f"oversized body -> {code}")
        code, _ = raw(port, "POST", "/v1/chat/completions", json.dumps({"messages": []}).encode())
        check(code == 400, "empty messages -> 400")
        # ignore_eos (vLLM's and llama-server's): the answer runs to max_tokens whatever the model says.
        code, data = raw(port, "POST", "/v1/completions", json.dumps({"prompt": "The end.", "max_tokens": 40,
                                                                      "temperature": 0, "ignore_eos": True}).encode())
        usage = json.loads(data).get("usage", {}) if code == 200 else {}
        check(code == 200 and usage.get("completion_tokens") == 40 and json.loads(data)["choices"][0]["finish_reason"] == "length",
              f"ignore_eos: {usage.get('completion_tokens')} of 40 tokens, finish {json.loads(data)['choices'][0]['finish_reason'] if code == 200 else code}")

        # A client that disconnects mid-stream: its sequence is cancelled and its blocks freed.
        cancelled_before = metric(port, 'tandem_requests_finished_total{reason="cancelled"}') or 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        # 2000 tokens that no end-of-text cuts short (ignore_eos): seconds of decoding on any CPU,
        # far past the few chunks read here.
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 2000,
                                                                 "temperature": 0, "stream": True, "ignore_eos": True}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        got, deadline = b"", time.time() + 60
        while got.count(b"data:") < 4 and time.time() < deadline:
            chunk = resp.read1(4096)
            if not chunk:
                break
            got += chunk
        check(got.count(b"data:") >= 4 and b"[DONE]" not in got, "a long stream is under way when its client leaves")
        conn.sock.close()
        conn.close()
        for _ in range(100):
            if (metric(port, 'tandem_requests_finished_total{reason="cancelled"}') or 0) > cancelled_before:
                break
            time.sleep(0.1)
        wait_idle(port)
        check((metric(port, 'tandem_requests_finished_total{reason="cancelled"}') or 0) > cancelled_before,
              "a disconnected stream is cancelled")
        check(metric(port, "tandem_kv_blocks_used") == 0, "and its KV blocks are freed")
        ok = client.completions.create(model="m", prompt="Still there?", max_tokens=4, temperature=0)
        check(ok.usage.completion_tokens >= 1, "the server keeps serving after bad input and disconnects")

        # Prefix cache: a second request with the same long system prompt reuses its blocks.
        system = "You are a careful assistant. " * 20
        hits_before = metric(port, "tandem_prompt_tokens_cached_total") or 0
        for q in ("What is 1+1?", "What is 2+2?"):
            client.chat.completions.create(model="m", messages=[{"role": "system", "content": system},
                                                                {"role": "user", "content": q}], max_tokens=4, temperature=0)
        check((metric(port, "tandem_prompt_tokens_cached_total") or 0) - hits_before >= 96,
              "a shared system prompt comes from the prefix cache")

        # Bounded load: 64 concurrent streaming requests, 16 tokens each.
        def one(i):
            stream = client.completions.create(model="m", prompt=f"Once upon a time, in village number {i},", max_tokens=16,
                                               temperature=0, stream=True, stream_options={"include_usage": True})
            text, usage, finish = "", None, None
            for ch in stream:
                if ch.choices:
                    text += ch.choices[0].text or ""
                    finish = ch.choices[0].finish_reason or finish
                if ch.usage:
                    usage = ch.usage
            return usage, finish
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(max_workers=64) as ex:
            results = list(ex.map(one, range(64)))
        dt = time.time() - t0
        complete = [u for u, f in results if u is not None and (u.completion_tokens == 16 if f == "length" else f == "stop")]
        total = sum(u.completion_tokens for u, _ in results if u)
        check(len(complete) == 64, f"64 concurrent streams complete with the right token counts ({total} tokens in {dt:.1f} s, "
                                   f"{total / dt:.0f} tok/s)")
        wait_idle(port)
        check(metric(port, "tandem_kv_blocks_used") == 0, "the KV pool returns to empty")

        # Greedy rows without logprobs let the backend compute only their argmax exactly (the
        # bounded head, kernels/cpu/bounded_head.h); asking for logprobs needs every logit. The
        # 16 texts must be the same either way.
        def greedy(i, logprobs):
            extra = {"logprobs": 1} if logprobs else {}
            r = client.completions.create(model="m", prompt=f"In the year {1900 + i}, the town of", max_tokens=32,
                                          temperature=0, **extra)
            return r.choices[0].text
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
            argmax_only = list(ex.map(lambda i: greedy(i, False), range(16)))
            every_logit = list(ex.map(lambda i: greedy(i, True), range(16)))
        same = sum(a == b for a, b in zip(argmax_only, every_logit))
        check(same == 16, f"16 batched greedy texts equal with and without logprobs ({same}/16)")
        _, text = raw(port, "GET", "/metrics")
        for name in ("tandem_time_to_first_token_seconds_bucket", "tandem_time_per_output_token_seconds_count",
                     "tandem_queue_length", "tandem_kv_blocks_free", "tandem_prefix_cache_hit_rate",
                     "tandem_generation_tokens_per_second"):
            check(name in text.decode(), f"/metrics has {name}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()

    # An API key, when set, is required.
    proc, port = start_server(a.tandem, a.model, ["--api-key", "sekrit"])
    try:
        code, data = raw(port, "GET", "/v1/models")
        check(code == 401 and b"authentication_error" in data, "no key -> 401")
        code, _ = raw(port, "GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})
        check(code == 200, "right key -> 200")
        code, _ = raw(port, "POST", "/tokenize", json.dumps({"content": "hi"}).encode())
        check(code == 401, "/tokenize without the key -> 401")
        code, _ = raw(port, "POST", "/tokenize", json.dumps({"content": "hi"}).encode(),
                      headers={"Authorization": "Bearer sekrit", "Content-Type": "application/json"})
        check(code == 200, "/tokenize with the key -> 200")
        code, page = raw(port, "GET", "/")
        check(code == 200 and b"<title>tandem chat</title>" in page, "the chat page itself is open (its API calls need the key)")
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    print(f"\n{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
