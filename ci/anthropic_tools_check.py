#!/usr/bin/env python3
"""Tool use through the official `anthropic` SDK on the real model (ADP-TOOL-3): a two-turn
round trip — `tool_choice: any` gives a `tool_use` block whose `input` validates against the
tool's `input_schema` (`stop_reason: tool_use`), the result goes back as a `tool_result` block
beside the assistant's `tool_use`, and the second turn answers; a named choice calls that tool;
`disable_parallel_tool_use` gives one call; `none` answers in text; the SDK's stream helper
builds the same call from `input_json_delta`s; count_tokens counts the tools; the refusals name
their field. Exits non-zero at the first failure.

    PYTHONPATH=.cache/pydeps python3 ci/anthropic_tools_check.py --base-url http://127.0.0.1:PORT
"""
import argparse
import json
import sys
import urllib.request

import anthropic
import jsonschema

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [
    {"name": "get_weather", "description": "The current weather in a city", "input_schema": WEATHER},
    {"name": "get_time", "description": "The current time in a time zone", "input_schema": TIME},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.splitlines()[0][:140]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    c = anthropic.Anthropic(base_url=args.base_url, api_key="unused", max_retries=0, timeout=300)
    with urllib.request.urlopen(f"{args.base_url}/v1/models", timeout=10) as r:
        model = json.load(r)["data"][0]["id"]
    common = dict(model=model, max_tokens=96, extra_body=GREEDY)

    # turn 1: a call is required
    r = c.messages.create(messages=QUESTION, tools=TOOLS, tool_choice={"type": "any"}, **common)
    check(r.stop_reason == "tool_use", f"stop_reason tool_use: {r.stop_reason}")
    uses = [b for b in r.content if b.type == "tool_use"]
    check(uses and len(uses) == len(r.content), f"tool_use blocks only: {r.content}")
    use = uses[0]
    check(use.id.startswith("toolu_") and use.name in SCHEMAS, f"a known tool, an id: {use}")
    jsonschema.validate(use.input, SCHEMAS[use.name])
    check(True, f"the input validates against {use.name}'s input_schema: {use.input}")

    # a named choice calls that tool; disable_parallel_tool_use: exactly one call
    named = c.messages.create(messages=QUESTION, tools=TOOLS,
                              tool_choice={"type": "tool", "name": "get_weather",
                                           "disable_parallel_tool_use": True}, **common)
    check(len(named.content) == 1 and named.content[0].type == "tool_use"
          and named.content[0].name == "get_weather",
          f"the named tool, one call: {named.content}")
    wuse = named.content[0]
    jsonschema.validate(wuse.input, WEATHER)
    check(True, "the named call's input validates")

    # turn 2: the result goes back in a user turn; the model answers
    history = QUESTION + [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": wuse.id, "name": wuse.name, "input": wuse.input}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": wuse.id,
             "content": [{"type": "text", "text": "18 degrees celsius, light rain"}]}]},
    ]
    r2 = c.messages.create(messages=history, tools=TOOLS, **common)
    check(r2.content, f"the second turn answers: {r2.content}")
    if r2.stop_reason == "tool_use":
        check(all(b.type == "tool_use" for b in r2.content), "a second call: tool_use blocks")
    else:
        check(r2.content[0].type == "text" and r2.content[0].text,
              f"a text answer ({r2.stop_reason}): {r2.content[0]}")
    # the SDK's own objects go back as they came (the assistant turn is r.content)
    echoed = c.messages.create(messages=QUESTION + [
        {"role": "assistant", "content": named.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": wuse.id,
                                      "content": "18 C", "is_error": False}]},
    ], tools=TOOLS, tool_choice={"type": "none"}, **common)
    check(echoed.content[0].type == "text" and echoed.content[0].text
          and echoed.stop_reason in ("end_turn", "max_tokens"),
          f"tool_choice none after a round trip answers in text: {echoed.content[0]}")

    # streamed: the helper assembles the same call (greedy) from input_json_delta events
    kinds = []
    with c.messages.stream(messages=QUESTION, tools=TOOLS,
                           tool_choice={"type": "tool", "name": "get_weather",
                                        "disable_parallel_tool_use": True}, **common) as s:
        for event in s:
            kinds.append(event.type)
        final = s.get_final_message()
    check(final.stop_reason == "tool_use" and final.content[0].type == "tool_use",
          f"streamed: a tool_use message ({final.stop_reason})")
    check(final.content[0].input == wuse.input and final.content[0].name == "get_weather",
          f"streamed input equals the whole answer's: {final.content[0].input}")
    check("input_json" in kinds and kinds[0] == "message_start" and kinds[-1] == "message_stop",
          f"streamed events: {sorted(set(kinds))}")

    # count_tokens counts the tools' description
    plain = c.messages.count_tokens(model=model, messages=QUESTION).input_tokens
    tooled = c.messages.count_tokens(model=model, messages=QUESTION, tools=TOOLS,
                                     tool_choice={"type": "any"}).input_tokens
    check(tooled > plain, f"count_tokens counts the tools: {plain} -> {tooled}")
    charged = r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
    check(charged == tooled, f"the charged input (computed and cached) equals the count: {r.usage}")

    # refusals name their field
    def refused(words, **kw):
        try:
            c.messages.create(messages=QUESTION, **{**common, **kw})
        except anthropic.BadRequestError as e:
            msg = e.body.get("error", {}).get("message", "") if isinstance(e.body, dict) else ""
            check(all(w in msg for w in words), f"{words[0]} refused: {msg}")
            return
        check(False, f"{words[0]} was not refused")

    refused(["tool_choice"], tool_choice={"type": "any"})
    refused(["tool_choice.name"], tools=TOOLS, tool_choice={"type": "tool", "name": "nope"})
    refused(["tools[0].type", "web_search"],
            tools=[{"type": "web_search_20250305", "name": "web_search"}])
    refused(["tools[0].input_schema"], tools=[{"name": "x", "input_schema": {"type": "string"}}])
    refused(["output_config.format"], tools=TOOLS,
            extra_body={**GREEDY, "output_config": {"format": {"type": "json_schema",
                                                               "schema": {"type": "object"}}}})
    print("all anthropic tools checks passed")


if __name__ == "__main__":
    main()
