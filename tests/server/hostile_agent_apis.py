"""Hostile clients against the APIs of issue 49 (/v1/responses, /v1/messages, /v1/embeddings):
the same body bounds, list caps and nested-field checks as chat completions, and a Responses
stream whose client leaves is cancelled. Used by test_hostile_clients.py."""
import json
import time

from hostile_harness import CANCELLED, check, connect, error_of, healthy, http, metric, request_bytes

MSG = [{"role": "user", "content": "hi"}]


def anthropic_error_of(raw):
    try:
        return json.loads(raw).get("error", {})
    except Exception:
        return {}


def attack_agent_apis(srv):
    deep = "[" * 30000 + "]" * 30000
    for path, body in [("/v1/responses", '{"input":' + deep + "}"), ("/v1/messages", '{"max_tokens":1,"messages":' + deep + "}"),
                       ("/v1/embeddings", '{"input":' + deep + "}")]:
        st, _, raw = http(srv, "POST", path, body.encode())
        check(st == 400 and "64" in raw.decode(errors="replace"), f"{path}: 30,000 deep -> {st}")
    tools = [{"type": "function", "name": f"f{i}"} for i in range(40000)]
    t = time.time()
    st, _, raw = http(srv, "POST", "/v1/responses", {"input": "hi", "tools": tools})
    check(st == 400 and error_of(raw).get("param") == "tools" and time.time() - t < 3, f"/v1/responses: 40,000 tools -> {st} in {time.time() - t:.2f} s")
    t = time.time()
    st, _, raw = http(srv, "POST", "/v1/messages", {"max_tokens": 1, "messages": MSG, "tools": [{"name": f"f{i}", "input_schema": {}} for i in range(40000)]})
    check(st == 400 and "'tools'" in anthropic_error_of(raw).get("message", "") and time.time() - t < 3,
          f"/v1/messages: 40,000 tools -> {st} in {time.time() - t:.2f} s")
    st, _, raw = http(srv, "POST", "/v1/responses", {"input": MSG * 5000})
    check(st == 400 and error_of(raw).get("param") == "input", f"/v1/responses: 5,000 input items -> {st} {error_of(raw).get('param')}")
    st, _, raw = http(srv, "POST", "/v1/messages", {"max_tokens": 1, "messages": MSG * 5000})
    check(st == 400 and "'messages'" in anthropic_error_of(raw).get("message", ""), f"/v1/messages: 5,000 messages -> {st}")
    st, _, raw = http(srv, "POST", "/v1/embeddings", {"input": ["hi"] * 3000})
    check(st == 400, f"/v1/embeddings: 3,000 inputs -> {st}")
    for path, body, where in [("/v1/responses", {"input": [{"role": "user", "content": "hi", "temperature": 1}]}, "input[0].temperature"),
                              ("/v1/responses", {"input": "hi", "text": {"format": {"type": "text", "schema": {}}}}, "text.format.schema"),
                              ("/v1/messages", {"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]},
                               "messages[0].content[0].x")]:
        st, _, raw = http(srv, "POST", path, body)
        text = raw.decode(errors="replace")
        check(st == 400 and f"'{where}'" in text, f"{path}: an unknown nested field -> {st} naming {where}")
    before = metric(srv, CANCELLED)
    s = connect(srv.port)
    s.sendall(request_bytes("POST", "/v1/responses", srv.host, json.dumps(
        {"input": "1, 2, 3, 4, 5,", "max_output_tokens": 4000, "stream": True, "ignore_eos": True}).encode()))
    time.sleep(1.0)
    s.close()
    t0 = time.time()
    while time.time() - t0 < 10 and metric(srv, CANCELLED) <= before:
        time.sleep(0.2)
    check(metric(srv, CANCELLED) > before, "/v1/responses: a streaming client that leaves is cancelled")
    healthy(srv, "after the agent API attacks")
