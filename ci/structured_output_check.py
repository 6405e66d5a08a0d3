#!/usr/bin/env python3
"""Structured output through the real model (ADP-SO-1..3): 24 JSON Schemas (nested objects,
arrays, enums, bounded numbers, required and optional properties, patterns, $ref, anyOf, null
unions, a top-level array) through `response_format` with the official `openai` SDK, each
answer validated with the `jsonschema` package; the same constraint through Ollama's `format`,
Anthropic's `output_config.format`, and `json_schema` / `grammar` on `POST /v1/tasks`;
streamed answers; schemas and grammars that do not compile refused with a 400 naming the
field. Exits non-zero at the first failure.

    PYTHONPATH=.cache/pydeps python3 ci/structured_output_check.py --base-url http://127.0.0.1:PORT
"""
import argparse
import json
import sys
import urllib.error
import urllib.request

import anthropic
import jsonschema
import ollama
import openai


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.splitlines()[0][:140]}")


def obj(props, required=None, extra=False):
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": extra}


S = {"type": "string", "maxLength": 24}
SCHEMAS = [
    ("person", "Describe a person.", obj({"name": S, "age": {"type": "integer", "minimum": 0,
                                                             "maximum": 120}})),
    ("color", "Pick a color.", obj({"color": {"type": "string",
                                              "enum": ["red", "green", "blue"]}})),
    ("price", "Price a coffee in euros.", obj({"item": S, "price": {
        "type": "number", "minimum": 0.5, "maximum": 9.5}})),
    ("rating", "Rate a film from 1 to 5.", obj({"film": S, "stars": {
        "type": "integer", "minimum": 1, "maximum": 5}})),
    ("flag", "Is water wet?", obj({"answer": {"type": "boolean"}})),
    ("fruits", "List some fruits.", obj({"fruits": {"type": "array", "items": S,
                                                    "minItems": 1, "maxItems": 3}})),
    ("address", "Give an address.", obj({"name": S, "address": obj({
        "street": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})),
    ("team", "List a team.", obj({"team": {"type": "array", "maxItems": 3, "items": obj(
        {"name": S, "role": {"type": "string", "enum": ["lead", "dev", "qa"]}})}})),
    ("optional", "Describe a book.", obj({"title": S, "year": {
        "type": "integer", "minimum": 1500, "maximum": 2030}, "subtitle": S}, ["title"])),
    ("airport", "Give an airport code.", obj({"code": {"type": "string",
                                                       "pattern": "^[A-Z]{3}$"}})),
    ("date", "When is the meeting?", obj({"event": S, "day": {"type": "string",
                                                              "format": "date"}})),
    ("either", "Give an id.", obj({"id": {"anyOf": [{"type": "integer", "minimum": 0,
                                                     "maximum": 9999}, S]}})),
    ("const", "Confirm the status.", obj({"status": {"const": "ok"}, "note": S})),
    ("matrix", "Give a small matrix.", obj({"rows": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": -9,
                                                  "maximum": 9}}}})),
    ("refs", "Give two points.", {"$defs": {"point": obj({
        "x": {"type": "integer", "minimum": 0, "maximum": 99},
        "y": {"type": "integer", "minimum": 0, "maximum": 99}})},
        **obj({"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}})}),
    ("levels", "Pick a level.", obj({"level": {"type": "integer", "enum": [1, 2, 3]}})),
    ("nullable", "Who is the manager?", obj({"manager": {"type": ["string", "null"],
                                                         "maxLength": 24}})),
    ("settings", "Describe app settings.", obj({
        "theme": {"type": "string", "enum": ["light", "dark"]}, "font_size": {
            "type": "integer", "minimum": 8, "maximum": 32}, "beta": {"type": "boolean"},
        "language": {"type": "string", "enum": ["en", "fr", "de"]}})),
    ("probability", "How likely is rain?", obj({"p": {"type": "number", "minimum": 0,
                                                      "maximum": 1}})),
    ("word", "Give a word.", obj({"word": {"type": "string", "minLength": 2,
                                           "maxLength": 10}})),
    ("inventory", "List items in stock.", obj({"items": {"type": "array", "maxItems": 3,
        "items": obj({"sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                      "qty": {"type": "integer", "minimum": 0, "maximum": 500},
                      "tags": {"type": "array", "maxItems": 2, "items": {
                          "type": "string", "enum": ["new", "sale", "old"]}}})}})),
    ("deep", "Describe a company.", obj({"company": obj({"name": S, "ceo": obj({
        "name": S, "since": {"type": "integer", "minimum": 1950, "maximum": 2026}})})})),
    ("open", "Describe a cat.", {"type": "object", "properties": {"name": S},
                                 "required": ["name"], "maxProperties": 3,
                                 "additionalProperties": {"type": "integer", "minimum": 0,
                                                          "maximum": 9}}),
    ("list", "List three numbers.", {"type": "array", "minItems": 3, "maxItems": 3,
                                     "items": {"type": "integer", "minimum": 0,
                                               "maximum": 100}}),
]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def task_text(base, body):
    """Runs a task on /v1/tasks and returns its text and end event."""
    status, adm = post(f"{base}/v1/tasks", body)
    if status != 202 and status != 200:
        return status, adm, None
    with urllib.request.urlopen(f"{base}/v1/tasks/{adm['task_id']}/stream", timeout=300) as r:
        text, end = "", None
        for line in r.read().decode().splitlines():
            if line.startswith("data:"):
                d = json.loads(line[5:])
                if "t" in d and "i" in d:
                    text += d["t"]
                elif "finish_reason" in d:
                    end = d
        return status, text, end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    base = args.base_url
    with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as r:
        model = json.load(r)["data"][0]["id"]
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)

    valid = 0
    for name, prompt, schema in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema)
        if schema.get("type") == "object":
            r = oa.chat.completions.create(
                model=model, max_tokens=400, messages=[{"role": "user", "content": prompt}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": name, "schema": schema,
                                                 "strict": True}})
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        else:
            # OpenAI asks for an object at the top; the task API takes any schema
            _, text, end = task_text(base, {"model": model, "max_tokens": 400,
                                            "messages": [{"role": "user", "content": prompt}],
                                            "json_schema": schema})
            finish = end and end["finish_reason"]
        try:
            value = json.loads(text)
            jsonschema.validate(value, schema,
                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
            ok = finish == "stop"
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            ok, value = False, e
        valid += ok
        check(ok, f"schema {name}: valid ({finish}) {json.dumps(value)[:90]}")
    check(valid == len(SCHEMAS) and len(SCHEMAS) >= 20,
          f"{valid}/{len(SCHEMAS)} schemas: every answer parses and validates")

    person = SCHEMAS[0][2]
    question = [{"role": "user", "content": "Describe a person."}]
    # any JSON object; streamed deltas make the same JSON
    r = oa.chat.completions.create(model=model, max_tokens=200, messages=question,
                                   response_format={"type": "json_object"})
    check(r.choices[0].finish_reason in ("stop", "length"), "json_object answers")
    if r.choices[0].finish_reason == "stop":
        check(isinstance(json.loads(r.choices[0].message.content), dict),
              "json_object: an object")
    parts = oa.chat.completions.create(
        model=model, max_tokens=200, messages=question, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": person}})
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    jsonschema.validate(json.loads(streamed), person)
    check(True, "stream: the deltas make JSON valid under the schema")
    # the other APIs
    oc = ollama.Client(host=base, timeout=300)
    out = oc.chat(model=model, messages=question, format=person,
                  options={"num_predict": 200}).message.content
    jsonschema.validate(json.loads(out), person)
    check("\n" not in out, f"ollama format schema: valid and compact ({out[:60]!r})")
    out = oc.generate(model=model, prompt="Describe a person.", format="json",
                      options={"num_predict": 200})
    check(out.done_reason == "length" or isinstance(json.loads(out.response), dict),
          "ollama format json: an object")
    an = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=300)
    m = an.messages.create(model=model, max_tokens=200, messages=question,
                           output_config={"format": {"type": "json_schema", "schema": person}})
    jsonschema.validate(json.loads(m.content[0].text), person)
    check(m.stop_reason == "end_turn", "anthropic output_config.format: valid, end_turn")
    # a grammar on the task API
    _, text, end = task_text(base, {"model": model, "max_tokens": 10,
                                    "messages": [{"role": "user", "content": "Is Paris in France?"}],
                                    "grammar": 'start: "yes" | "no"'})
    check(text in ("yes", "no") and end["finish_reason"] == "stop",
          f"grammar: the answer is in the language ({text!r})")
    # what does not compile is refused before anything runs, naming the field
    bad = {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}
    try:
        oa.chat.completions.create(model=model, max_tokens=5, messages=question,
                                   response_format={"type": "json_schema",
                                                    "json_schema": {"name": "b", "schema": bad}})
        check(False, "a bad schema is refused")
    except openai.BadRequestError as e:
        check(e.body["param"] == "response_format" and "nowhere" in e.body["message"],
              f"openai: a schema that does not compile is a 400 naming response_format ({e.body})")
    try:
        oc.chat(model=model, messages=question, format=bad)
        check(False, "ollama: a bad schema is refused")
    except ollama.ResponseError as e:
        check(e.status_code == 400 and e.error.startswith("format"),
              f"ollama: a 400 naming format ({e.error[:60]})")
    for body, field in [({"grammar": "start: ((("}, "grammar"),
                        ({"json_schema": [1]}, "json_schema"),
                        ({"json_schema": {"type": "object"}, "grammar": 'start: "a"'}, "grammar")]:
        status, v, _ = task_text(base, {"model": model, "max_tokens": 5,
                                        "messages": question, **body})
        check(status == 400 and v["field"] == field and v["code"] == "INVALID_PARAMS",
              f"task API: {field} refused by name ({v['message'][:60]})")
    print("all structured output checks passed")


if __name__ == "__main__":
    main()
