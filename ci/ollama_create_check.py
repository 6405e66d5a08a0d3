#!/usr/bin/env python3
"""Drives `/api/create` with the official `ollama` Python client (MOD-CREATE-1..4).

Run by orchestratord/tests/model_create.rs against a server whose model folder holds the real
default model as BASE. Every check asserts what a user of the client would notice; the first
failure exits non-zero with the reason.

    PYTHONPATH=.cache/pydeps python3 ci/ollama_create_check.py --host http://127.0.0.1:PORT --base smol
"""
import argparse
import json
import sys
import urllib.request

import ollama

from task_records import with_prompt

QUESTION = [{"role": "user", "content": "Name a colour."}]
# longer than the default system prompt SmolLM2's template puts in a chat without one
PIRATE = ("You are a pirate captain sailing the seven seas. Answer every question as a pirate "
          "would, with plenty of arr and ahoy, and never break character.")
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.content }}\n{% endfor %}"


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what.splitlines()[0][:120]}")


def refused(call, status, words):
    """`call` raises ResponseError with `status` and an error naming each of `words`."""
    try:
        call()
    except ollama.ResponseError as e:
        return e.status_code == status and all(w in e.error for w in words), e.error
    return False, "no error"


def raw_show(host, model):
    """`/api/show` as JSON (the client's ShowResponse has no `system`)."""
    req = urllib.request.Request(f"{host}/api/show", data=json.dumps({"model": model}).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--base", required=True)
    args = ap.parse_args()
    c = ollama.Client(host=args.host, timeout=300)
    base = args.base

    greedy = {"temperature": 0, "num_predict": 4}
    # the whole prompt each request was given, from its task record: prompt_eval_count
    # counts only what the engine's cache did not hold
    plain, plain_p = with_prompt(args.host, lambda c: c.chat(model=base, messages=QUESTION,
                                                           options=greedy))
    own_system = [{"role": "system", "content": "Be brief."}] + QUESTION
    plain_own, plain_own_p = with_prompt(args.host, lambda c: c.chat(
        model=base, messages=own_system, options=greedy))

    # a system prompt and sampling defaults over the base model
    r = c.create(model="pirate", from_=base, system=PIRATE,
                 parameters={"temperature": 0, "num_predict": 3, "top_k": 20})
    check(r.status == "success", f"create: success ({r})")
    names = [m.model for m in c.list().models]
    check("pirate" in names and base in names, f"list: pirate beside {base} ({names})")
    shown = c.show("pirate")
    check(f'SYSTEM """{PIRATE}"""' in shown.modelfile, f"show: its system prompt ({shown.modelfile!r})")
    check(raw_show(args.host, "pirate").get("system") == PIRATE, "show: `system`, as Ollama answers it")
    check("num_predict" in shown.parameters and "top_k" in shown.parameters,
          f"show: its parameters ({shown.parameters!r})")
    check(shown.details.parent_model == base, f"show: made from {base} ({shown.details})")

    a, a_p = with_prompt(args.host, lambda c: c.chat(model="pirate", messages=QUESTION))
    check(a.eval_count <= 3, f"its num_predict when the request says none ({a.eval_count} tokens)")
    check(a_p > plain_p, f"its system prompt is in the prompt ({a_p} > {plain_p} tokens)")
    b = c.chat(model="pirate", messages=QUESTION)
    check(a.message.content == b.message.content,
          f"its temperature 0: the same answer twice ({a.message.content!r})")
    one = c.chat(model="pirate", messages=QUESTION, options={"num_predict": 1})
    check(one.eval_count == 1, f"the request's own num_predict wins ({one.eval_count})")
    own, own_p = with_prompt(args.host, lambda c: c.chat(model="pirate", messages=own_system,
                                                       options=greedy))
    check(own_p == plain_own_p,
          f"a chat's own system prompt replaces the model's ({own_p} = {plain_own_p} tokens)")
    gen, gen_p = with_prompt(args.host, lambda c: c.generate(model="pirate", prompt="Name a colour."))
    check(gen_p == a_p, f"generate gets the system prompt too ({gen_p} tokens)")

    # a template by built-in name and as Jinja text change what the model is sent
    c.create(model="smol-llama3", from_=base, template="llama3")
    l3, l3_p = with_prompt(args.host, lambda c: c.chat(model="smol-llama3", messages=QUESTION,
                                                     options=greedy))
    check(l3_p != plain_p, f"template llama3: another prompt ({l3_p} vs {plain_p} tokens)")
    c.create(model="smol-plain", from_=base, template=PLAIN_TEMPLATE)
    bare, bare_p = with_prompt(args.host, lambda c: c.chat(model="smol-plain", messages=QUESTION,
                                                         options=greedy))
    check(bare_p < plain_p,
          f"a Jinja template without role markers: a shorter prompt ({bare_p} < {plain_p} tokens)")
    check(c.show("smol-plain").template == PLAIN_TEMPLATE, "show: the Jinja template")

    # made again under its own name: the new system prompt, the parameters kept
    c.create(model="pirate", from_="pirate", system="You are a robot.")
    again = c.show("pirate")
    check("You are a robot." in again.modelfile and "num_predict" in again.parameters,
          f"recreated in place: new system prompt, parameters kept ({again.modelfile!r})")
    check(c.chat(model="pirate", messages=QUESTION).eval_count <= 3,
          "recreated in place: still its num_predict")

    # what is refused, and why
    for call, status, words, what in [
        (lambda: c.create(model="gotpl", from_=base, template="{{ .System }} {{ .Prompt }}"),
         400, ["Go templates"], "an Ollama Go template"),
        (lambda: c.create(model="odd", from_=base, parameters={"mirostat_tau": 5.0}),
         400, ["mirostat_tau"], "a parameter not applied here"),
        (lambda: c.create(model="hot", from_=base, parameters={"temperature": -1}),
         400, ["temperature"], "a temperature a request would be refused for"),
        (lambda: c.create(model="x", from_="no-such-model"), 404, ["no-such-model"],
         "a model to build on that is not in the folder"),
        (lambda: c.create(model="pirate", from_=base), 409, ["exists"], "a name taken"),
        (lambda: c.create(model="../up", from_=base), 400, ["model name"], "a name that is a path"),
    ]:
        ok, err = refused(call, status, words)
        check(ok, f"refused {status}: {what} ({err})")

    ok, err = refused(lambda: c.delete(base), 409, ["configured pool"])
    check(ok, f"refused 409: deleting the model a configured pool serves ({err})")
    c.delete("pirate")
    names = [m.model for m in c.list().models]
    check("pirate" not in names and base in names, f"delete: pirate gone, {base} kept ({names})")
    print("all ollama create checks passed")


if __name__ == "__main__":
    main()
