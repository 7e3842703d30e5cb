#!/usr/bin/env python3
"""Forced tool calls on gpt-oss (harmony): tool_choice "required" and a named function, served by
`tandem serve` on a tiny random-weight gpt-oss (tests/reference/family_gguf.py) with gpt-oss's own
vocabulary (models/o200k-harmony-vocab.gguf) and chat template. The grammar writes the call with
harmony's control tokens (<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}
<|call|>), so whatever the random weights prefer, the answer must come back as message.tool_calls,
finish_reason "tool_calls", arguments that are JSON valid under the function's schema (checked by
the jsonschema package, independent of tandem); the same streamed. A request's own grammar of
control tokens works the same way, and one naming a token the vocabulary lacks is a 400.
Exit code 77 (CTest: skipped) without the vocabulary, numpy/gguf, openai or jsonschema.

    python3 tests/server/test_harmony_tools.py --tandem build/tandem [--work DIR]
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from test_openai_server import SKIP, check, failures, start_server  # noqa: E402

VOCAB = os.path.join(ROOT, "models", "o200k-harmony-vocab.gguf")
TEMPLATE = os.path.join(ROOT, "tests", "data", "chat_templates", "gpt-oss.jinja")
# Bounded arguments (an enum, a capped string): a random model cannot ramble inside them.
WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Rome", "Paris", "Oslo"]},
    "unit": {"type": "string", "maxLength": 12}}, "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER_PARAMS}},
         {"type": "function", "function": {"name": "get_time", "description": "The time now"}}]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": {"type": "object", "maxProperties": 0}}
QUESTION = [{"role": "user", "content": "What is the weather in Rome?"}]


def valid_call(name, arguments, what):
    import jsonschema
    check(name in SCHEMAS, f"{what}: a call to an offered function ({name!r})")
    try:
        args = json.loads(arguments)
        jsonschema.validate(args, SCHEMAS.get(name, {}))
        check(True, f"{what}: arguments {arguments} are valid under {name}'s schema")
    except (ValueError, jsonschema.ValidationError) as e:
        check(False, f"{what}: arguments {arguments!r} are not valid under the schema: {e}")


def streamed(client, **kw):
    calls, content, finish = {}, "", None
    for ch in client.chat.completions.create(model="m", stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        finish = ch.choices[0].finish_reason or finish
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function:
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
    return [calls[i] for i in sorted(calls)], content, finish


def forced_checks(client, label, tool_choice, want_name=None):
    kw = dict(messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=96, temperature=0)
    r = client.chat.completions.create(model="m", **kw)
    choice = r.choices[0]
    calls = choice.message.tool_calls or []
    check(len(calls) == 1, f"{label}: one tool call ({choice.message})")
    check(choice.finish_reason == "tool_calls", f"{label}: finish_reason tool_calls ({choice.finish_reason})")
    check(not choice.message.content, f"{label}: no content beside the call ({choice.message.content!r})")
    if calls:
        if want_name:
            check(calls[0].function.name == want_name, f"{label}: the named function ({calls[0].function.name})")
        valid_call(calls[0].function.name, calls[0].function.arguments, label)
    s_calls, s_content, s_finish = streamed(client, **kw)
    check([(c["name"], json.loads(c["arguments"] or "null")) for c in s_calls] ==
          [(c.function.name, json.loads(c.function.arguments)) for c in calls] and s_finish == "tool_calls",
          f"{label}: streamed the same call ({s_calls}, {s_finish})")
    # Sampled, not greedy: still a call, still valid.
    for seed in (1, 2):
        r = client.chat.completions.create(model="m", **{**kw, "temperature": 1.0, "seed": seed})
        calls = r.choices[0].message.tool_calls or []
        check(len(calls) == 1 and r.choices[0].finish_reason == "tool_calls", f"{label}, seed {seed}: one call")
        if calls:
            if want_name:
                check(calls[0].function.name == want_name, f"{label}, seed {seed}: the named function")
            valid_call(calls[0].function.name, calls[0].function.arguments, f"{label}, seed {seed}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--work", help="folder for the model (default: a temporary one)")
    a = ap.parse_args()
    if not os.path.exists(VOCAB):
        print(f"skip: no {VOCAB} (scripts/setup.sh --models all writes it)")
        return SKIP
    try:
        import jsonschema  # noqa: F401
        import openai
        from family_gguf import write_family_gguf
    except ImportError as e:
        print(f"skip: {e} (scripts/setup.sh installs it)")
        return SKIP
    tmp = None
    if a.work is None:
        tmp = tempfile.TemporaryDirectory()
        a.work = tmp.name
    os.makedirs(a.work, exist_ok=True)
    model = os.path.join(a.work, "gpt-oss-tiny-o200k.gguf")
    if not os.path.exists(model):
        with open(TEMPLATE, encoding="utf-8") as f:
            template = f.read()
        write_family_gguf(model + ".part", "gpt-oss", "tiny", "q8_0", seed=0, vocab_from=VOCAB, chat_template=template)
        os.replace(model + ".part", model)
    proc, port = start_server(a.tandem, model)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        forced_checks(client, "required", "required")
        forced_checks(client, "named get_weather", {"type": "function", "function": {"name": "get_weather"}}, "get_weather")
        forced_checks(client, "named get_time", {"type": "function", "function": {"name": "get_time"}}, "get_time")
        # A request's own grammar may name control tokens too; one the vocabulary lacks is a 400.
        r = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=32, temperature=0, extra_body={
            "grammar": 'root ::= <|channel|> "final" <|message|> "Rome" <|return|>'})
        check(r.choices[0].message.content == "Rome" and r.choices[0].finish_reason == "stop",
              f"a grammar of control tokens: the final channel's content ({r.choices[0].message.content!r})")
        try:
            client.chat.completions.create(model="m", messages=QUESTION, max_tokens=8,
                                           extra_body={"grammar": "root ::= <|channel|> <|nonsense|>"})
            check(False, "a grammar naming a token the vocabulary lacks -> 400 (got 200)")
        except openai.BadRequestError as e:
            err = e.body if isinstance(e.body, dict) else {}
            check(err.get("param") == "grammar" and "<|nonsense|>" in str(err.get("message")),
                  f"a grammar naming a token the vocabulary lacks -> 400 naming it: {err}")
        # tool_choice auto is not constrained: whatever the model writes, a 200.
        r = client.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS, max_tokens=8, temperature=0)
        check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), "auto: an answer")
    finally:
        proc.kill()
        proc.wait()
        if tmp:
            tmp.cleanup()
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
