#!/usr/bin/env python3
"""Regenerates tests/golden/chat/renders.json: each template in tests/golden/chat rendered by Jinja2 itself
over a set of conversations, set up as transformers' apply_chat_template sets it up
(ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with loopcontrols, tojson as
json.dumps(ensure_ascii=False), raise_exception; {% generation %} spans as UTF-8 byte offsets).
tests/chat_template_test.cpp renders the same with src/formats/jinja (Note [jinja subset]).

Usage: /usr/bin/python3 tools/make_chat_golden.py   (needs Debian's python3-jinja2)
"""
import json
import os

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden", "chat")
OPEN, CLOSE = "\ue000", "\ue001"  # private-use marks around {% generation %} output, removed after


class Generation(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

    def _mark(self, caller):
        return OPEN + caller() + CLOSE


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def render(source, context):
    try:
        out = environment().from_string(source).render(**context)
    except Exception as ex:  # the template's own error
        return {"error": type(ex).__name__ + ": " + str(ex)}
    text, spans, begin = "", [], None
    for ch in out:
        if ch == OPEN:
            begin = len(text.encode())
        elif ch == CLOSE:
            spans.append([begin, len(text.encode())])
        else:
            text += ch
    return {"text": text, "generation": spans}


U = {"role": "user", "content": "Hi there, h\u00e9llo \u2713 \u65e5\u672c?"}
A = {"role": "assistant", "content": "Hello! How can I help?"}
S = {"role": "system", "content": "  You are terse.  "}
T = {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nThe answer is 4."}
U2 = {"role": "user", "content": "And 2+2?"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
RESULT = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "sunny, 21C"}
CASES = {
    "one": ([U, A], False, None), "gen": ([U], True, None), "multi": ([S, U, A, U2, T], False, None),
    "multigen": ([S, U, A, U2], True, None), "think": ([U, T], False, None), "nosys": ([U, A, U2, A], False, None),
    "tools": ([U, CALL, RESULT, A], False, TOOLS), "toolsgen": ([S, U], True, TOOLS), "bad": ([A], False, None),
    "empty": ([], True, None),
}
FEATURES = {"messages": [{"role": "system", "content": " sys "}, {"role": "user", "content": "u1"},
                         {"role": "assistant", "content": "a1"}],
            "tools": [{"name": "f", "args": {"z": 1, "a": [1.5, None, True]}}]}


def main():
    out = []
    for name in sorted(os.listdir(HERE)):
        if not name.endswith(".jinja"):
            continue
        source = open(os.path.join(HERE, name), encoding="utf-8").read()
        contexts = {"features": FEATURES} if name == "features.jinja" else {
            case: {"bos_token": "<s>", "eos_token": "</s>", "messages": m, "add_generation_prompt": g, "tools": t,
                   "documents": None} for case, (m, g, t) in CASES.items()}
        if name == "think.jinja":  # a variable apply_chat_template passes on (Qwen3's enable_thinking)
            contexts["nothink"] = dict(contexts["gen"], enable_thinking=False)
        for case, context in contexts.items():
            out.append({"template": name, "case": case, "context": context, **render(source, context)})
    with open(os.path.join(HERE, "renders.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(out)} renders of {len({r['template'] for r in out})} templates; "
          f"{sum('error' in r for r in out)} are the template's own errors")


if __name__ == "__main__":
    main()
