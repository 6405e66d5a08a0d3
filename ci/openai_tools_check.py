#!/usr/bin/env python3
"""Tool calling through the official `openai` SDK on the real model (ADP-TOOL-1): a two-turn
round trip — `tool_choice: required` gives a call whose arguments parse and validate against
the function's schema (`finish_reason: tool_calls`, `content: null`), the tool's result goes back
as a `tool` message beside the assistant's `tool_calls`, and the second turn answers; a named
choice calls that function; `none` answers in text; streamed calls arrive as `tool_calls` deltas
(index, id, name, then argument fragments) that add up to the non-streamed call; and the
refusals name their field; parallel calls (the default) end at a repeated call, streamed
and whole, and an answer cut by max_tokens never shows its JSON (ADP-TOOL-6). The same through
the Responses API (ADP-TOOL-4): `function_call`
output items whose arguments validate, the call and its `function_call_output` sent back as input
items, a named choice, and the streamed `function_call_arguments` events adding up to the call.
Exits non-zero at the first failure.

    PYTHONPATH=.cache/pydeps python3 ci/openai_tools_check.py --base-url http://127.0.0.1:PORT
"""
import argparse
import json
import sys

import jsonschema
import openai

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": WEATHER}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 40}},
                       "required": ["zone"], "additionalProperties": False}}},
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.splitlines()[0][:140]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    common = dict(model=model, temperature=0, max_tokens=96)

    # turn 1: a call is required
    r = client.chat.completions.create(messages=QUESTION, tools=TOOLS, tool_choice="required", **common)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls", f"finish_reason tool_calls: {c.finish_reason}")
    check(c.message.content is None and c.message.tool_calls, f"a call, no content: {c.message}")
    call = c.message.tool_calls[0]
    check(call.type == "function" and call.id.startswith("call_"), f"call id and type: {call}")
    check(call.function.name in ("get_weather", "get_time"), f"a known function: {call.function.name}")
    arguments = json.loads(call.function.arguments)
    schema = WEATHER if call.function.name == "get_weather" else TOOLS[1]["function"]["parameters"]
    jsonschema.validate(arguments, schema)
    check(True, f"the arguments validate against {call.function.name}'s schema: {arguments}")

    # a named choice calls that function
    named = client.chat.completions.create(
        messages=QUESTION, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, **common)
    wcall = named.choices[0].message.tool_calls[0]
    check(wcall.function.name == "get_weather", f"the named function is called: {wcall.function.name}")
    jsonschema.validate(json.loads(wcall.function.arguments), WEATHER)
    check(True, "the named call's arguments validate")
    check(len(named.choices[0].message.tool_calls) >= 1, "at least one call")

    # parallel_tool_calls false: exactly one call
    single = client.chat.completions.create(
        messages=QUESTION, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, **common)
    check(len(single.choices[0].message.tool_calls) == 1, "parallel_tool_calls false: one call")

    # turn 2: the result goes back; the model answers (auto may call again or answer in text)
    history = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": wcall.id, "type": "function",
             "function": {"name": wcall.function.name, "arguments": wcall.function.arguments}}]},
        {"role": "tool", "tool_call_id": wcall.id, "content": "18 degrees celsius, light rain"},
    ]
    r2 = client.chat.completions.create(messages=history, tools=TOOLS, tool_choice="auto", **common)
    m2 = r2.choices[0].message
    check((m2.content or "") != "" or m2.tool_calls, f"the second turn answers: {m2}")
    if m2.tool_calls:
        for tc in m2.tool_calls:
            json.loads(tc.function.arguments)
        check(r2.choices[0].finish_reason == "tool_calls", "a second call ends with tool_calls")
    else:
        check(r2.choices[0].finish_reason in ("stop", "length"), f"text answer: {r2.choices[0].finish_reason}")
    # with tool_choice none, the same history gets text
    r3 = client.chat.completions.create(messages=history, tools=TOOLS, tool_choice="none", **common)
    check(r3.choices[0].message.content and not r3.choices[0].message.tool_calls,
          f"tool_choice none answers in text: {r3.choices[0].message.content!r}")

    # streamed: the deltas add up to the same call (greedy)
    stream = client.chat.completions.create(
        messages=QUESTION, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True, **common)
    calls, finish = {}, None
    for chunk in stream:
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    check(entry["id"] is None, "a call's id comes once")
                    entry["id"] = d.id
                if d.function and d.function.name:
                    entry["name"] = d.function.name
                if d.function and d.function.arguments:
                    entry["arguments"] += d.function.arguments
            if ch.finish_reason:
                finish = ch.finish_reason
    check(finish == "tool_calls", f"streamed finish_reason: {finish}")
    check(calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_"), f"streamed call: {calls}")
    check(calls[0]["arguments"] == wcall.function.arguments,
          f"streamed arguments equal the whole answer's: {calls[0]['arguments']!r}")

    # refusals name their field
    def refused(field, **kw):
        try:
            client.chat.completions.create(messages=QUESTION, **{**common, **kw})
        except openai.BadRequestError as e:
            param = e.body.get("param") if isinstance(e.body, dict) else None
            check(param == field, f"{field} refused: {e.body}")
            return
        check(False, f"{field} was not refused")

    refused("tool_choice", tool_choice="required")
    refused("tool_choice", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    refused("tools[0].function.name", tools=[{"type": "function", "function": {"name": "bad name"}}])
    refused("response_format", tools=TOOLS, response_format={"type": "json_object"})
    repeats_and_cuts(client, model)
    responses(client, model)
    print("all tools checks passed")


SEARCH = [{"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


def repeats_and_cuts(client, model):
    """ADP-TOOL-6 (issue 49): with parallel calls on (the default) the 135M model repeated its
    call until max_tokens — 8 identical calls — and a runaway argument cut by max_tokens came
    back as the answer object's JSON in `content`."""
    cats = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hi! Search for cats and dogs."}]
    r = client.chat.completions.create(model=model, messages=cats, tools=SEARCH, temperature=0,
                                       max_tokens=300)
    c = r.choices[0]
    calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
    check(calls and len(set(calls)) == len(calls) and c.finish_reason == "tool_calls",
          f"parallel calls by default: distinct calls, finish_reason tool_calls "
          f"({c.finish_reason}, {r.usage.completion_tokens} tokens): {calls}")
    check(r.usage.completion_tokens < 300, "the answer ended at the repeat, not at max_tokens")
    stream = client.chat.completions.create(model=model, messages=cats, tools=SEARCH,
                                            temperature=0, max_tokens=300, stream=True)
    streamed, finish = {}, None
    for chunk in stream:
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                e = streamed.setdefault(d.index, ["", ""])
                e[0] += (d.function.name or "") if d.function else ""
                e[1] += (d.function.arguments or "") if d.function else ""
            finish = ch.finish_reason or finish
    check([tuple(v) for _, v in sorted(streamed.items())] == calls and finish == "tool_calls",
          f"streamed: the same distinct calls, no repeat sent ({finish}): {streamed}")
    # a runaway argument (the 135M model writes a URL that never ends) cut by max_tokens
    news = [{"role": "user", "content": "Find me news about Rust."}]
    for mt in (48, 300):
        r = client.chat.completions.create(model=model, messages=news, tools=SEARCH,
                                           temperature=0, max_tokens=mt)
        m = r.choices[0].message
        check("tool_calls" not in (m.content or "") and not (m.content or "").startswith("{"),
              f"max_tokens {mt}: no answer JSON as content ({r.choices[0].finish_reason}): "
              f"{m.content!r} {m.tool_calls}")


def responses(client, model):
    """Function tools on /v1/responses, with the SDK's types and stream helper."""
    tools = [{"type": "function", "name": t["function"]["name"],
              "description": t["function"]["description"],
              "parameters": t["function"]["parameters"], "strict": True} for t in TOOLS]
    common = dict(model=model, temperature=0, max_output_tokens=96)
    question = "What is the weather in Paris?"
    r = client.responses.create(input=question, tools=tools, tool_choice="required", **common)
    calls = [o for o in r.output if o.type == "function_call"]
    check(r.status == "completed" and calls and len(calls) == len(r.output),
          f"responses: function_call items only ({r.status}): {r.output}")
    call = calls[0]
    check(call.call_id.startswith("call_") and call.id.startswith("fc_"),
          f"responses: call ids: {call.id} {call.call_id}")
    schema = WEATHER if call.name == "get_weather" else TOOLS[1]["function"]["parameters"]
    jsonschema.validate(json.loads(call.arguments), schema)
    check(True, f"responses: the arguments validate against {call.name}'s schema")
    check(r.tool_choice == "required" and len(r.tools) == 2, "responses: tools and choice echoed")

    named = client.responses.create(input=question, tools=tools,
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    parallel_tool_calls=False, **common)
    check(len(named.output) == 1 and named.output[0].name == "get_weather",
          f"responses: the named function, once: {named.output}")
    wcall = named.output[0]
    jsonschema.validate(json.loads(wcall.arguments), WEATHER)

    # the second turn: the SDK's own call item goes back beside its output
    second = client.responses.create(input=[
        {"role": "user", "content": question}, wcall,
        {"type": "function_call_output", "call_id": wcall.call_id,
         "output": "18 degrees celsius, light rain"},
    ], tools=tools, tool_choice="none", **common)
    check(second.output[0].type == "message" and second.output_text,
          f"responses: the second turn answers in text: {second.output_text!r}")

    # streamed: the helper assembles the same call from the argument deltas
    kinds = []
    with client.responses.stream(input=question, tools=tools,
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 parallel_tool_calls=False, **common) as s:
        for event in s:
            kinds.append(event.type)
        final = s.get_final_response()
    check("response.function_call_arguments.delta" in kinds
          and "response.function_call_arguments.done" in kinds
          and kinds[-1] == "response.completed",
          f"responses stream: argument events ({sorted(set(kinds))})")
    check(final.output[0].type == "function_call"
          and final.output[0].arguments == wcall.arguments,
          f"responses stream: the same call: {final.output[0].arguments!r}")

    def refused(field, **kw):
        try:
            client.responses.create(input=question, **{**common, **kw})
        except openai.BadRequestError as e:
            param = e.body.get("param") if isinstance(e.body, dict) else None
            check(param == field, f"responses: {field} refused: {e.body}")
            return
        check(False, f"responses: {field} was not refused")

    refused("tools[0].type", tools=[{"type": "web_search"}])
    refused("tool_choice.name", tools=tools, tool_choice={"type": "function", "name": "nope"})
    refused("text.format", tools=tools,
            text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}})


if __name__ == "__main__":
    main()
