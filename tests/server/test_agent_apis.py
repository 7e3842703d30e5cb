#!/usr/bin/env python3
"""The APIs agents speak (issue 49), under the official clients: OpenAI's Responses API
(`openai`) and Anthropic's Messages API (`anthropic`), against a live `tandem serve` on the
bundled SmolLM2 (tools in the generic format, issue 51).

Responses: a call and a stream (client.responses.stream checks every event's order and indices)
give the greedy text of /v1/chat/completions for the same conversation; usage with cached
tokens; a function-tool round trip through previous_response_id equals chat's for the same
turns; a streamed call has function_call_arguments events; a json_schema answer parses;
store: false, an unknown id, a deleted one and an evicted one are 400s naming
previous_response_id; GET/DELETE /v1/responses/{id}; another API key reads nothing of them.
Reasoning (gpt-oss's harmony template, a grammar-forced answer): a reasoning item, a thinking block.
Messages: a call and a stream equal chat's greedy text; stop_sequences ends with
stop_reason "stop_sequence"; a tool_use / tool_result round trip equals chat's; x-api-key is
the key; errors in Anthropic's shape. Both: unknown and unhonoured fields are 400s naming
their JSON path.
Exit code 77 (CTest: skipped) when the model or a client package is missing.

    python3 tests/server/test_agent_apis.py --tandem build/tandem --model models/....gguf
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_openai_server import SKIP, args_or_skip, check, failures, raw, start_server  # noqa: E402

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
ANTHROPIC_WEATHER = {"name": "get_weather", "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
SYSTEM = "You are a helpful assistant."
QUESTION = "What is the capital of France?"
N = 40  # tokens per greedy answer


def chat_text(oc, messages, **kw):
    r = oc.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=N, **kw)
    return r.choices[0].message, r.usage


def post(port, path, body, headers=None):
    code, data = raw(port, "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})})
    return code, json.loads(data)


def responses_basics(oc, port):
    chat, cu = chat_text(oc, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
    r = oc.responses.create(model="m", instructions=SYSTEM, input=QUESTION, temperature=0, max_output_tokens=N)
    check(r.output_text == chat.content and r.output_text, f"responses: greedy text equals chat's: {r.output_text!r} / {chat.content!r}")
    check(r.usage.input_tokens == cu.prompt_tokens and r.usage.output_tokens == cu.completion_tokens,
          f"responses: usage counts equal chat's ({r.usage.input_tokens}/{r.usage.output_tokens})")
    check(r.usage.input_tokens_details.cached_tokens > 0, f"responses: cached_tokens {r.usage.input_tokens_details.cached_tokens} after the same prompt")
    types, seqs = [], []
    with oc.responses.stream(model="m", instructions=SYSTEM, input=QUESTION, temperature=0, max_output_tokens=N) as s:
        for ev in s:
            types.append(ev.type)
            seqs.append(ev.sequence_number)
        final = s.get_final_response()
    check(final.output_text == r.output_text, f"responses stream: the same text ({final.output_text!r})")
    expected = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
                "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                "response.output_item.done", "response.completed"]
    check([t for t in dict.fromkeys(types)] == expected, f"responses stream: event order {list(dict.fromkeys(types))}")
    check(seqs == list(range(len(seqs))), "responses stream: sequence numbers count up from 0")
    # A list of message items is the same conversation as instructions + a string.
    r2 = oc.responses.create(model="m", input=[{"role": "developer", "content": SYSTEM},
                                               {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
                             temperature=0, max_output_tokens=N)
    check(r2.output_text == r.output_text, "responses: message items give the same answer")
    got = raw(port, "GET", f"/v1/responses/{r.id}")
    check(got[0] == 200 and json.loads(got[1])["output"][0]["content"][0]["text"] == r.output_text, "GET /v1/responses/{id}: the stored response")
    check(raw(port, "DELETE", f"/v1/responses/{r.id}")[0] == 200 and raw(port, "GET", f"/v1/responses/{r.id}")[0] == 404,
          "DELETE /v1/responses/{id}: then 404")
    code, body = post(port, "/v1/responses", {"input": "hi", "previous_response_id": r.id})
    check(code == 400 and body["error"]["param"] == "previous_response_id", "responses: a deleted previous_response_id is a 400 naming it")


def responses_tools(oc, openai):
    r = oc.responses.create(model="m", input="What is the weather in Rome?", tools=[WEATHER], tool_choice="required",
                            parallel_tool_calls=False, temperature=0, max_output_tokens=60)
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) >= 1 and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments),
          f"responses: a forced function_call item ({calls[0].arguments if calls else r.output})")
    with oc.responses.stream(model="m", input="What is the weather in Rome?", tools=[WEATHER], tool_choice="required",
                             parallel_tool_calls=False, temperature=0, max_output_tokens=60) as s:
        types = [ev.type for ev in s]
        final = s.get_final_response()
    scalls = [o for o in final.output if o.type == "function_call"]
    check("response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types and
          [c.arguments for c in scalls] == [c.arguments for c in calls], "responses stream: function_call_arguments events, the same call")
    # The round trip: the tool's output after previous_response_id, against chat's same turns.
    out = '{"temperature_c": 22, "sky": "clear"}'
    r2 = oc.responses.create(model="m", previous_response_id=r.id, tools=[WEATHER], temperature=0, max_output_tokens=N,
                             input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": out}])
    chat_calls = [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    m, _ = chat_text(oc, [{"role": "user", "content": "What is the weather in Rome?"},
                          {"role": "assistant", "content": None, "tool_calls": chat_calls},
                          {"role": "tool", "tool_call_id": calls[0].call_id, "content": out}], tools=[CHAT_WEATHER])
    rcalls = [(o.name, o.arguments) for o in r2.output if o.type == "function_call"]
    ccalls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
    check(r2.output_text == (m.content or "") and rcalls == ccalls and r2.usage.input_tokens > r.usage.input_tokens,
          f"responses: the round trip through previous_response_id equals chat's ({r2.output_text!r} {rcalls})")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r3 = oc.responses.create(model="m", input="A person:", temperature=0, max_output_tokens=60,
                             text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    try:
        p = json.loads(r3.output_text)
        ok = isinstance(p.get("name"), str) and isinstance(p.get("age"), int)
    except ValueError:
        ok = False
    check(ok, f"responses: a json_schema answer parses and has its fields: {r3.output_text!r}")
    r4 = oc.responses.create(model="m", input="hi", store=False, max_output_tokens=4)
    try:
        oc.responses.create(model="m", input="again", previous_response_id=r4.id, max_output_tokens=4)
        check(False, "responses: store false is not kept")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "previous_response_id", "responses: store false is not kept (400 naming previous_response_id)")


def bad_fields(port):
    cases = [("/v1/responses", {"input": "x", "conversation": "c"}, "conversation"),
             ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0].content[0]"),
             ("/v1/responses", {"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
             ("/v1/responses", {"input": "x", "tools": [{"type": "function", "name": "f", "strict": "yes"}]}, "tools[0].strict"),
             ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {}, "extra": 1}}}, "text.format.extra"),
             ("/v1/responses", {"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
             ("/v1/responses", {"input": "x", "previous_response_id": "resp_unknown"}, "previous_response_id"),
             ("/v1/responses", {"input": [{"type": "function_call_output", "output": "o"}]}, "input[0].call_id"),
             ("/v1/responses", {"input": "x", "include": ["reasoning.encrypted_content"]}, "include")]
    for path, body, param in cases:
        code, b = post(port, path, body)
        check(code == 400 and b["error"]["param"] == param and f"'{param}'" in b["error"]["message"],
              f"{path}: {json.dumps(body)[:70]} -> 400 naming {param} ({b['error'].get('param')})")
    msgs = [{"role": "user", "content": "hi"}]
    for body, path in [({"messages": msgs}, "max_tokens"),
                       ({"messages": msgs, "max_tokens": 4, "foo": 1}, "foo"),
                       ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}], "max_tokens": 4}, "messages[0].content[0].type"),
                       ({"messages": msgs, "max_tokens": 4, "tools": [{"name": "f", "input_schema": {}, "x": 1}]}, "tools[0].x"),
                       ({"messages": msgs, "max_tokens": 4, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
                       ({"messages": [{"role": "system", "content": "s"}], "max_tokens": 4}, "messages[0].role")]:
        code, b = post(port, "/v1/messages", body)
        check(code == 400 and b.get("type") == "error" and b["error"]["type"] == "invalid_request_error" and f"'{path}'" in b["error"]["message"],
              f"/v1/messages: {json.dumps(body)[:70]} -> 400 naming {path}")


def messages_checks(oc, ac):
    chat, cu = chat_text(oc, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
    kw = dict(model="m", max_tokens=N, system=SYSTEM, messages=[{"role": "user", "content": QUESTION}], extra_body={"temperature": 0})
    m = ac.messages.create(**kw)
    text = "".join(b.text for b in m.content if b.type == "text")
    check(text == chat.content and m.stop_reason in ("end_turn", "max_tokens"), f"messages: greedy text equals chat's ({text!r}, {m.stop_reason})")
    check(m.usage.input_tokens + m.usage.cache_read_input_tokens == cu.prompt_tokens and m.usage.output_tokens == cu.completion_tokens,
          f"messages: usage ({m.usage.input_tokens}+{m.usage.cache_read_input_tokens} cached, {m.usage.output_tokens})")
    with ac.messages.stream(**kw) as s:
        types = [ev.type for ev in s]
        final = s.get_final_message()
    check("".join(b.text for b in final.content if b.type == "text") == text and final.stop_reason == m.stop_reason,
          "messages stream: the same text and stop_reason")
    check(types[0] == "message_start" and "content_block_delta" in types and types[-2:] == ["message_delta", "message_stop"],
          f"messages stream: event order ({types[0]} ... {types[-2:]})")
    words = text.split()
    if len(words) > 2:
        stop = " " + words[2]
        sm = ac.messages.create(**{**kw, "stop_sequences": [stop]})
        check(sm.stop_reason == "stop_sequence" and sm.stop_sequence == stop and stop not in sm.content[0].text,
              f"messages: stop_sequences ends with stop_reason stop_sequence ({sm.stop_reason}, {sm.stop_sequence!r})")
    q = [{"role": "user", "content": "What is the weather in Rome?"}]
    forced = {"type": "any", "disable_parallel_tool_use": True}
    t = ac.messages.create(model="m", max_tokens=60, messages=q, tools=[ANTHROPIC_WEATHER], tool_choice=forced,
                           extra_body={"temperature": 0})
    uses = [b for b in t.content if b.type == "tool_use"]
    check(uses and uses[0].name == "get_weather" and isinstance(uses[0].input.get("city"), str) and t.stop_reason == "tool_use",
          f"messages: a forced tool_use block ({uses[0].input if uses else t.content}, {t.stop_reason})")
    with ac.messages.stream(model="m", max_tokens=60, messages=q, tools=[ANTHROPIC_WEATHER], tool_choice=forced,
                            extra_body={"temperature": 0}) as s:
        sfinal = s.get_final_message()
    check([b.input for b in sfinal.content if b.type == "tool_use"] == [u.input for u in uses], "messages stream: input_json_delta gives the same input")
    if not uses:
        return
    out = '{"temperature_c": 22, "sky": "clear"}'
    turns = q + [{"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": uses[0].name, "input": uses[0].input}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": out}]}]
    t2 = ac.messages.create(model="m", max_tokens=N, messages=turns, tools=[ANTHROPIC_WEATHER], extra_body={"temperature": 0})
    cm, _ = chat_text(oc, q + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": uses[0].id, "type": "function", "function": {"name": uses[0].name, "arguments": json.dumps(uses[0].input, separators=(",", ":"))}}]},
        {"role": "tool", "tool_call_id": uses[0].id, "content": out}], tools=[CHAT_WEATHER])
    check("".join(b.text for b in t2.content if b.type == "text") == (cm.content or "") and
          [b.input for b in t2.content if b.type == "tool_use"] == [json.loads(c.function.arguments) for c in cm.tool_calls or []],
          "messages: the tool_use / tool_result round trip equals chat's")


def tenants(a, openai, anthropic):
    with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as f:
        f.write("key-a\nkey-b\n")
    proc, port = start_server(a.tandem, a.model, ["--api-key-file", f.name, "--responses-store", "12KiB"])
    try:
        url = f"http://127.0.0.1:{port}/v1"
        ka, kb = openai.OpenAI(base_url=url, api_key="key-a"), openai.OpenAI(base_url=url, api_key="key-b")
        r = ka.responses.create(model="m", input="hi", max_output_tokens=4)
        try:
            kb.responses.create(model="m", input="again", previous_response_id=r.id, max_output_tokens=4)
            check(False, "responses: another key cannot continue a response")
        except openai.BadRequestError as e:
            check(e.body.get("param") == "previous_response_id", "responses: another key cannot continue a response (400)")
        check(raw(port, "GET", f"/v1/responses/{r.id}", headers={"Authorization": "Bearer key-b"})[0] == 404 and
              raw(port, "GET", f"/v1/responses/{r.id}", headers={"Authorization": "Bearer key-a"})[0] == 200,
              "GET /v1/responses/{id}: only its own key reads it")
        for _ in range(12):  # a 12 KiB store holds a few: the first is evicted
            ka.responses.create(model="m", input="tell me more " * 20, max_output_tokens=4)
        try:
            ka.responses.create(model="m", input="again", previous_response_id=r.id, max_output_tokens=4)
            check(False, "responses: an evicted id is refused")
        except openai.BadRequestError as e:
            check(e.body.get("param") == "previous_response_id" and r.id in e.body.get("message", ""),
                  "responses: an evicted id is a 400 naming it")
        ac = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="key-b")
        m = ac.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        check(m.type == "message", "messages: x-api-key is the API key")
        try:
            anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="wrong").messages.create(
                model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
            check(False, "messages: a wrong x-api-key is refused")
        except anthropic.AuthenticationError as e:
            check(e.body.get("type") == "error" and e.body["error"]["type"] == "authentication_error",
                  "messages: a wrong x-api-key is a 401 in Anthropic's shape")
    finally:
        proc.kill()
        os.unlink(f.name)


def reasoning(a, openai, anthropic):
    """gpt-oss's harmony template and a grammar-forced harmony answer: a reasoning item (Responses)
    and a thinking block (Messages) beside the answer, whole and streamed."""
    template = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "chat_templates", "gpt-oss.jinja")
    answer = "<|channel|>analysis<|message|>Add two and two.<|end|><|start|>assistant<|channel|>final<|message|>It is 4."
    grammar = {"grammar": "root ::= " + json.dumps(answer)}
    proc, port = start_server(a.tandem, a.model, ["--chat-template-file", template])
    try:
        oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        r = oc.responses.create(model="m", input="What is 2+2?", max_output_tokens=200, extra_body=grammar)
        with oc.responses.stream(model="m", input="What is 2+2?", max_output_tokens=200, extra_body=grammar) as s:
            types = [ev.type for ev in s]
            sr = s.get_final_response()
        for label, resp in (("whole", r), ("streamed", sr)):
            items = [(o.type, o.content[0].text) for o in resp.output]
            check(items == [("reasoning", "Add two and two."), ("message", "It is 4.")], f"responses ({label}): a reasoning item, then the message: {items}")
        check("response.reasoning_text.delta" in types, "responses stream: response.reasoning_text.delta events")
        ac = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="none")
        kw = dict(model="m", max_tokens=200, messages=[{"role": "user", "content": "What is 2+2?"}], extra_body=grammar)
        m = ac.messages.create(**kw)
        with ac.messages.stream(**kw) as s:
            sm = s.get_final_message()
        for label, msg in (("whole", m), ("streamed", sm)):
            blocks = [(b.type, b.thinking if b.type == "thinking" else b.text) for b in msg.content]
            check(blocks == [("thinking", "Add two and two."), ("text", "It is 4.")], f"messages ({label}): a thinking block, then the text: {blocks}")
    finally:
        proc.kill()


def main():
    a = args_or_skip()
    if a is None:
        return SKIP
    try:
        import anthropic
        import openai
    except ImportError as e:
        print(f"skip: {e.name} is not installed (scripts/setup.sh installs it)")
        return SKIP
    proc, port = start_server(a.tandem, a.model)
    try:
        oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        ac = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="none")
        responses_basics(oc, port)
        responses_tools(oc, openai)
        bad_fields(port)
        messages_checks(oc, ac)
    finally:
        proc.kill()
    tenants(a, openai, anthropic)
    reasoning(a, openai, anthropic)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
