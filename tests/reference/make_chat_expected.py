#!/usr/bin/env python3
"""Renders tests/data/chat_templates/*.jinja and Jinja feature snippets with Python's jinja2,
configured as Hugging Face transformers' apply_chat_template configures it, and writes the
outputs to tests/data/chat_templates/expected.json. tandem's Jinja subset must reproduce them
byte for byte (tests/test_chat_template.cpp). Run after changing a template or a case:

    python3 tests/reference/make_chat_expected.py
"""
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "chat_templates")


class TemplateError(Exception):
    pass


def environment():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


# name -> (bos_token, eos_token) as each family's vocabulary spells them
TEMPLATES = {
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "qwen2.5": ("", "<|im_end|>"),
    "llama-2": ("<s>", "</s>"),
    "llama-3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.1": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistral-instruct-v0.1": ("<s>", "</s>"),
    "mistral-instruct-v0.3": ("<s>", "</s>"),
    "gemma-2": ("<bos>", "<eos>"),
    "gemma-3": ("<bos>", "<eos>"),
    "phi-3-mini": ("<s>", "<|endoftext|>"),
    "phi-3.5-mini": ("<s>", "<|endoftext|>"),
    # OpenAI's harmony format, as llama.cpp ships it (models/templates/openai-gpt-oss-120b.jinja;
    # gpt-oss-20b's GGUF carries the same text). It prints strftime_now's date: the test masks it.
    "gpt-oss": ("<|startoftext|>", "<|return|>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

TRIP_TOOL = {
    "type": "function",
    "function": {
        "name": "plan_trip",
        "description": "Plans a trip",
        "parameters": {
            "type": "object",
            "properties": {
                "destination": {"type": "string", "description": "Where to go"},
                "days": {"type": "integer", "default": 3},
                "mode": {"type": "string", "enum": ["train", "plane"]},
                "budget": {"type": ["number", "null"]},
                "stops": {"type": "array", "items": {"type": "string"}},
                "prefs": {"type": "object", "properties": {"window": {"type": "boolean"}}},
            },
            "required": ["destination"],
        },
    },
}

CONVERSATIONS = {
    "one_user": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_user": {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]},
    "multi_turn": {
        "messages": [
            {"role": "user", "content": "  Hi there  "},
            {"role": "assistant", "content": " Hello! How can I help? "},
            {"role": "user", "content": "Tell me a joke.\n"},
        ]
    },
    "system_multi_turn": {
        "messages": [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Good morning"},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": "Thanks"},
        ]
    },
    "unicode_quotes": {
        "messages": [{"role": "user", "content": "Ünïcödé 😀 \"double\" 'single' \\ back\tslash {{ not a tag }}"}]
    },
    "roles_do_not_alternate": {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
    "system_only": {"messages": [{"role": "system", "content": "Be brief."}]},
    "system_content_parts": {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Ignored."}]},
            {"role": "user", "content": "Hi"},
        ]
    },
    "assistant_first": {"messages": [{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Hi"}]},
    "content_parts": {
        "messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe this. "}]},
        ]
    },
    "tool_call": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "abc123def", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
                ],
            },
            {"role": "tool", "tool_call_id": "abc123def", "content": "{\"temp_c\": 18}"},
        ],
        "extra": {"tools": [WEATHER_TOOL]},
    },
}

CONVERSATIONS["tools_offered"] = {
    "messages": [{"role": "system", "content": "Use tools when useful."}, {"role": "user", "content": "Plan a trip to Rome"}],
    "extra": {"tools": [WEATHER_TOOL, TRIP_TOOL]},
}
CONVERSATIONS["tool_call_then_answer"] = {
    "messages": CONVERSATIONS["tool_call"]["messages"] + [{"role": "assistant", "content": "It is 18 C in Paris."},
                                                          {"role": "user", "content": "And tomorrow?"}],
    "extra": {"tools": [WEATHER_TOOL]},
}
CONVERSATIONS["thinking_in_history"] = {
    "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "thinking": "Simple arithmetic.", "content": "4"},
        {"role": "user", "content": "Times 3?"},
    ],
    "extra": {"reasoning_effort": "high"},
}

# Which conversations each template is rendered with (others may be unsupported by design).
PLAIN = ["one_user", "system_user", "multi_turn", "system_multi_turn", "unicode_quotes", "roles_do_not_alternate"]
USES = {name: PLAIN for name in TEMPLATES}
USES["gemma-3"] = PLAIN + ["content_parts", "system_only", "system_content_parts", "assistant_first"]

# tandem's built-in templates (chat/templates/, for GGUFs without one) and the official
# template each stands in for: rendered by jinja2, both must give the same text or the same
# error for every conversation the official one is tested with.
BUILTINS = {"gemma": "gemma-3"}
BUILTIN_DIR = os.path.join(HERE, "..", "..", "chat", "templates")
for name in ("qwen2.5", "llama-3.1", "mistral-instruct-v0.3"):
    USES[name] = PLAIN + ["tool_call"]
USES["gpt-oss"] = PLAIN + ["system_only", "tool_call", "tools_offered", "tool_call_then_answer", "thinking_in_history"]

# Jinja features on their own: (name, template, context)
SNIPPETS = [
    ("whitespace_control", "a  {{- ' b ' -}}  c {%- if true %} d {% endif -%}\n e", {}),
    ("trim_and_lstrip_blocks", "<ul>\n  {% for x in xs %}\n  <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n", {"xs": [1, 2]}),
    ("plus_disables_lstrip", "  {%+ if true %}x{% endif %}", {}),
    ("comments", "a{# hidden #}b\n{#- trimmed -#}\n c", {}),
    ("loop_variables", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {}),
    ("loop_else_and_filter", "{% for x in xs if x > 1 %}{{ x }}{% else %}none{% endfor %};{% for y in [] %}{% else %}empty{% endfor %}", {"xs": [1, 2, 3]}),
    ("loop_controls", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("dict_iteration", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("scoping_and_namespace", "{% set x = 1 %}{% for i in [1,2] %}{% set x = x + i %}{% endfor %}{{ x }};{% set ns = namespace(t=0) %}{% for i in [1,2] %}{% set ns.t = ns.t + i %}{% endfor %}{{ ns.t }}", {}),
    ("set_block", "{% set greeting %}Hello {{ name }}{% endset %}[{{ greeting | upper }}]", {"name": "ann"}),
    ("macros", "{% macro tag(name, cls='x') %}<{{ name }} class={{ cls }}>{% endmacro %}{{ tag('a') }}{{ tag('b', cls='y') }}", {}),
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 10 - 2 - 3 }} {{ 1.5 + 1 }}", {}),
    ("comparisons_and_logic", "{{ 1 < 2 and 2 <= 2 }} {{ 'a' != 'b' or false }} {{ not 1 == 1 }} {{ 3 in [1,2,3] }} {{ 'x' not in 'abc' }} {{ none is none }} {{ 1 == 1.0 }}", {}),
    ("ternary_and_or_values", "{{ 'yes' if flag else 'no' }} {{ '' or 'fallback' }} {{ 0 and 1 }} {{ 'a' if false }}|", {"flag": True}),
    ("string_methods", "{{ '  pad  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ ' a'.lstrip() }}|{{ 'a '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|{{ 'a-b'.replace('-', '+') }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}", {}),
    ("filters", "{{ '  t  ' | trim }}|{{ [1,2,3] | length }}|{{ 'abc' | upper }}|{{ [3,1,2] | sort | join(',') }}|{{ [1,2] | first }}{{ [1,2] | last }}|{{ x | default('d') }}|{{ '' | default('e', true) }}|{{ [1,2,2] | unique | list }}|{{ ['a','b'] | reverse | join }}|{{ 'a b' | replace(' ', '_') }}|{{ 3.7 | int }}|{{ -3 | abs }}|{{ [1,2,3] | sum }}", {}),
    ("select_and_map", "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(' ') }}|{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}|{{ [0,1,2] | select | list }}", {"ms": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}, {"role": "user", "content": "c"}]}),
    ("tests", "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ 's' is string }}{{ 1 is number }}{{ d is mapping }}{{ l is iterable }}{{ 4 is divisibleby(2) }}{{ 3 is odd }}{{ x is not none }}{{ 1 is integer }}{{ 1.0 is float }}", {"x": 1, "d": {}, "l": []}),
    ("slicing", "{{ l[1:] }}{{ l[:-1] }}{{ l[::-1] }}{{ l[-1] }}{{ s[1:3] }}{{ s[::-1] }}{{ l[5] is defined }}", {"l": [1, 2, 3], "s": "héllo"}),
    ("tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\\n' | tojson }}|{{ [1, 2.5, true, none] | tojson }}|{{ {} | tojson }}", {"d": {"b": [1, {"c": None}], "a": "x"}}),
    ("printing_values", "{{ none }}|{{ true }}|{{ [1, 'a', none] }}|{{ {'k': 'v'} }}|{{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ undefined_thing }}|{{ \"it's\" }}", {}),
    ("attribute_and_item_access", "{{ m.role }}{{ m['role'] }}{{ m.missing is defined }}{{ m.get('role') }}{{ m.get('nope', 'dflt') }}{{ l.0 }}", {"m": {"role": "user"}, "l": ["z"]}),
    ("string_concat_tilde", "{{ 'a' ~ 1 ~ none }}{{ 'ab' * 3 }}", {}),
    ("raise_exception", "{% if bad %}{{ raise_exception('bad input: ' + bad) }}{% endif %}", {"bad": "yes"}),
    ("dict_literal_and_list_literal", "{% set d = {'a': 1, 'b': [1, 2]} %}{{ d.b[1] }}{{ d | length }}{% set t = (1, 2) %}{{ t[0] }}", {}),
    ("raw_block", "{% raw %}{{ not parsed }}{% endraw %}", {}),
]


def main():
    env = environment()
    cases = []
    for name, (bos, eos) in TEMPLATES.items():
        source = open(os.path.join(DATA, name + ".jinja"), encoding="utf-8").read()
        template = env.from_string(source)
        for conv in USES[name]:
            c = CONVERSATIONS[conv]
            for gen in (True, False):
                ctx = {"messages": c["messages"], "add_generation_prompt": gen, "bos_token": bos, "eos_token": eos}
                ctx.update(c.get("extra", {}))
                case = {"template": name, "conversation": conv, "add_generation_prompt": gen, "bos_token": bos,
                        "eos_token": eos, "messages": c["messages"], "extra": c.get("extra", {})}
                try:
                    case["expected"] = template.render(**ctx)
                except TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
    builtin_cases = []
    for builtin, official in BUILTINS.items():
        ours = env.from_string(open(os.path.join(BUILTIN_DIR, builtin + ".jinja"), encoding="utf-8").read())
        theirs = env.from_string(open(os.path.join(DATA, official + ".jinja"), encoding="utf-8").read())
        bos, eos = TEMPLATES[official]
        for conv in USES[official]:
            c = CONVERSATIONS[conv]
            for gen in (True, False):
                ctx = {"messages": c["messages"], "add_generation_prompt": gen, "bos_token": bos, "eos_token": eos}
                outputs = []
                for t in (theirs, ours):
                    try:
                        outputs.append(("expected", t.render(**ctx)))
                    except TemplateError as e:
                        outputs.append(("error", str(e)))
                if outputs[0] != outputs[1]:
                    raise SystemExit(f"built-in {builtin} differs from {official} on {conv} (generation prompt {gen}): "
                                     f"{outputs[1]!r} vs {outputs[0]!r}")
                builtin_cases.append({"builtin": builtin, "official": official, "conversation": conv,
                                      "add_generation_prompt": gen, "bos_token": bos, "eos_token": eos,
                                      "messages": c["messages"], outputs[0][0]: outputs[0][1]})
    snippets = []
    for name, source, ctx in SNIPPETS:
        s = {"name": name, "source": source, "context": ctx}
        try:
            s["expected"] = env.from_string(source).render(**ctx)
        except TemplateError as e:
            s["error"] = str(e)
        snippets.append(s)
    with open(os.path.join(DATA, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/reference/make_chat_expected.py", "jinja2": jinja2.__version__,
                   "cases": cases, "builtin_cases": builtin_cases, "snippets": snippets}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} template cases, {len(builtin_cases)} built-in template cases, {len(snippets)} snippets -> expected.json")


if __name__ == "__main__":
    main()
