#!/usr/bin/env python3
"""Reasoning apart from content in chat answers (chat/reasoning.h), as llama-server returns it.

The bundled SmolLM2 serves with gpt-oss's harmony template (--chat-template-file
tests/data/chat_templates/gpt-oss.jinja), and a grammar makes it write a harmony answer:
  - an analysis message then a final one: message.reasoning_content and message.content, the
    same joined from streamed deltas (reasoning_content deltas, then content deltas);
  - with tools offered, a message to functions.get_weather: message.tool_calls, finish_reason
    "tool_calls", the same streamed; a forced call, which harmony writes with control tokens
    SmolLM2's vocabulary lacks, is a 400 naming tool_choice and the token (test_harmony_tools.py
    forces calls on gpt-oss's vocabulary); an earlier answer's reasoning_content is accepted;
and with a ChatML template that names </think> (as Qwen3's does), <think>...</think> goes to
reasoning_content.
Exit code 77 (CTest: skipped) when the model or the openai package is missing.

    python3 tests/server/test_reasoning.py --tandem build/tandem --model models/....gguf
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_openai_server import SKIP, args_or_skip, check, failures, raw, start_server  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "chat_templates")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "What is 2+2?"}]


def literal(text):
    return json.dumps(text)  # a GBNF string literal: JSON's escapes are GBNF's


def joined(chunks):
    reasoning, content, finish, calls = "", "", None, {}
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        content += d.content or ""
        finish = ch.choices[0].finish_reason or finish
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function:
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
    return reasoning, content, finish, [calls[i] for i in sorted(calls)]


def both(client, **kw):
    """The whole answer and the streamed one, for the same greedy request."""
    r = client.chat.completions.create(model="m", temperature=0, max_tokens=120, **kw)
    s = joined(client.chat.completions.create(model="m", temperature=0, max_tokens=120, stream=True, **kw))
    return r, s


def split_checks(client, label, answer, reasoning, content):
    """A grammar-forced answer: its reasoning and content apart, whole and streamed."""
    r, (sr, sc, sf, _) = both(client, messages=QUESTION, extra_body={"grammar": "root ::= " + literal(answer)})
    m = r.choices[0].message
    check(m.content == content and (m.model_extra or {}).get("reasoning_content") == reasoning,
          f"{label}: reasoning_content and content apart: {m.content!r} / {m.model_extra}")
    check(sr == reasoning and sc == content and sf == "stop", f"{label}: streamed the same: {sr!r} {sc!r} {sf}")


def harmony_checks(client):
    answer = "<|channel|>analysis<|message|>Add two and two.<|end|><|start|>assistant<|channel|>final<|message|>It is 4."
    split_checks(client, "harmony", answer, "Add two and two.", "It is 4.")

    call = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
            "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Rome\"}<|call|>")
    r, (sr, sc, sf, scalls) = both(client, messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[WEATHER],
                                   extra_body={"grammar": "root ::= " + literal(call)})
    raw_r = client.chat.completions.with_raw_response.create(
        model="m", messages=QUESTION, tools=[WEATHER], max_tokens=2, temperature=0)
    check(raw_r.headers.get("X-Tandem-Tool-Format") == "harmony", f"harmony: X-Tandem-Tool-Format {raw_r.headers.get('X-Tandem-Tool-Format')}")
    m = r.choices[0].message
    calls = m.tool_calls or []
    check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather"
          and json.loads(calls[0].function.arguments) == {"city": "Rome"} and not m.content,
          f"harmony: a message to functions.get_weather is a tool call: {r.choices[0]}")
    check((m.model_extra or {}).get("reasoning_content") == "Need the weather.", "harmony: the call's analysis is reasoning")
    check(sf == "tool_calls" and len(scalls) == 1 and scalls[0]["name"] == "get_weather"
          and json.loads(scalls[0]["arguments"]) == {"city": "Rome"} and sr == "Need the weather." and sc == "",
          f"harmony: the call streamed: {scalls} {sr!r} {sc!r} {sf}")


def harmony_request_checks(client):
    """A forced call is refused on a vocabulary without harmony's control tokens; an earlier
    answer's reasoning_content is accepted and rendered back before its call."""
    import openai
    try:
        client.chat.completions.create(model="m", messages=QUESTION, tools=[WEATHER], tool_choice="required", max_tokens=4)
        check(False, "harmony: tool_choice required -> 400 (got 200)")
    except openai.BadRequestError as e:
        err = e.body if isinstance(e.body, dict) else {}
        check(err.get("param") == "tool_choice" and "<|channel|>" in str(err.get("message")),
              f"harmony: tool_choice required without harmony's tokens -> 400 naming tool_choice and the token: {err}")
    history = [{"role": "user", "content": "Weather in Rome?"},
               {"role": "assistant", "content": None, "reasoning_content": "Need the weather.", "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    r = client.chat.completions.create(model="m", messages=history, tools=[WEATHER], max_tokens=4, temperature=0,
                                       reasoning_effort="high")
    check(r.choices[0].finish_reason in ("stop", "length"), "harmony: a round trip with reasoning_content in history")
    port = int(str(client.base_url).rsplit(":", 1)[1].split("/")[0])
    code, data = raw(port, "POST", "/apply-template", json.dumps({"messages": history, "reasoning_effort": "high"}).encode())
    prompt = json.loads(data).get("prompt", "")
    check(code == 200 and "Reasoning: high" in prompt and "<|channel|>analysis<|message|>Need the weather.<|end|>" in prompt,
          f"harmony: reasoning_effort and the earlier reasoning reach the template: {prompt[-300:]!r}")


def think_checks(client):
    import openai
    try:
        client.chat.completions.create(model="m", messages=QUESTION, max_tokens=4, reasoning_effort="low")
        check(False, "reasoning_effort on a template that never reads it -> 400 (got 200)")
    except openai.BadRequestError as e:
        err = e.body if isinstance(e.body, dict) else {}
        check(err.get("param") == "reasoning_effort", f"reasoning_effort on a template without it -> 400 naming it: {err}")
    split_checks(client, "think", "<think>\nTwo plus two.\n</think>\n\nFour.", "Two plus two.", "Four.")


def with_server(a, template, checks):
    import openai

    proc, port = start_server(a.tandem, a.model, ["--chat-template-file", template])
    try:
        checks(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x"))
    finally:
        proc.kill()
        proc.wait()


def main():
    a = args_or_skip()
    if a is None:
        return SKIP
    with_server(a, os.path.join(DATA, "gpt-oss.jinja"), lambda c: (harmony_checks(c), harmony_request_checks(c)))
    # A ChatML template that names </think> (as Qwen3's does when it strips past reasoning).
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(open(os.path.join(DATA, "smollm2.jinja")).read().replace(
            "{% for message in messages %}", "{% for message in messages %}{# </think> #}", 1))
    try:
        with_server(a, f.name, think_checks)
    finally:
        os.unlink(f.name)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
