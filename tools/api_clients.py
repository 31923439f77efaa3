#!/usr/bin/env python3
"""The official `openai` and `ollama` Python clients against a running `kiln serve`.

    python3 tools/api_clients.py http://127.0.0.1:PORT [MODEL_ID] [--samples N] [--tools-only]

(No MODEL_ID: the first model `/v1/models` lists.)

Checks, as an app would use them:
- openai: a tool round trip (required call, the result fed back, a text answer), streamed
  and not; `response_format` json_schema answers that parse and validate against their
  schema on N sampled generations (temperature 1); logprobs with top alternatives;
  an unknown field refused with a 400 that names it.
- ollama: chat (streamed and not), generate with `format` json, embed refused plainly,
  list, show, ps.
Exits non-zero with a message on the first failure.
"""

import argparse
import json
import math
import sys

import jsonschema
import ollama
import openai

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def tool_round_trip(client, model, stream, max_tokens=60):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model=model, messages=msgs, tools=[WEATHER], tool_choice="required",
              temperature=0, max_tokens=max_tokens, parallel_tool_calls=False)
    if stream:
        calls = {}
        finish = None
        for chunk in client.chat.completions.create(stream=True, **kw):
            ch = chunk.choices[0]
            for tc in ch.delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    c["id"] = tc.id
                if tc.function and tc.function.name:
                    c["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    c["arguments"] += tc.function.arguments
            finish = ch.finish_reason or finish
        check(finish == "tool_calls", f"streamed finish_reason {finish}")
        check(len(calls) == 1, f"streamed calls {calls}")
        call = calls[0]
        call_id, name, args = call["id"], call["name"], call["arguments"]
    else:
        r = client.chat.completions.create(**kw)
        ch = r.choices[0]
        check(ch.finish_reason == "tool_calls", f"finish_reason {ch.finish_reason}")
        check(ch.message.tool_calls and len(ch.message.tool_calls) == 1,
              f"tool_calls {ch.message.tool_calls}")
        tc = ch.message.tool_calls[0]
        call_id, name, args = tc.id, tc.function.name, tc.function.arguments
    check(call_id, "the call has an id")
    check(name == "get_weather", f"called {name!r}")
    parsed = json.loads(args)
    jsonschema.validate(parsed, WEATHER["function"]["parameters"])
    msgs.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]})
    msgs.append({"role": "tool", "tool_call_id": call_id,
                 "content": json.dumps({"city": parsed["city"], "sky": "sunny", "celsius": 21})})
    r = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER],
                                       tool_choice="none", temperature=0, max_tokens=40,
                                       stream=stream)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in r if c.choices)
    else:
        text = r.choices[0].message.content
        check(not r.choices[0].message.tool_calls, "no call after tool_choice none")
    check(text and text.strip(), "a text answer after the tool result")
    print(f"tool round trip (stream={stream}): {name}({args}) -> {text.strip()[:60]!r}")


def json_schema(client, model, n):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for i in range(n):
        r = client.chat.completions.create(
            model=model, temperature=1.0, max_tokens=120, seed=i, response_format=fmt,
            messages=[{"role": "user", "content": "Invent a person: name, age and hobbies."}])
        text = r.choices[0].message.content
        check(r.choices[0].finish_reason == "stop", f"sample {i} finished {r.choices[0].finish_reason}: {text!r}")
        try:
            jsonschema.validate(json.loads(text), PERSON)
        except Exception as e:  # noqa: BLE001 - the message is the report
            sys.exit(f"FAIL: sample {i} {text!r}: {e}")
    print(f"json_schema: {n} sampled answers valid")


def logprobs(client, model):
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=8, logprobs=True,
                                       top_logprobs=3,
                                       messages=[{"role": "user", "content": "Say hello."}])
    lp = r.choices[0].logprobs.content
    check(len(lp) == r.usage.completion_tokens or len(lp) == r.usage.completion_tokens - 1,
          f"{len(lp)} logprobs for {r.usage.completion_tokens} tokens")
    for t in lp:
        check(len(t.top_logprobs) == 3, "3 alternatives")
        check(t.logprob <= 0, "log-probabilities are <= 0")
        # Greedy: the token is the most likely one.
        check(abs(t.logprob - t.top_logprobs[0].logprob) < 1e-5, "greedy picks the top token")
        check(sum(math.exp(a.logprob) for a in t.top_logprobs) <= 1.0001, "a distribution")
    print(f"logprobs: {len(lp)} tokens, first {lp[0].token!r} {lp[0].logprob:.3f}")


def choices(client, model):
    msgs = [{"role": "user", "content": "Name a color."}]
    r = client.chat.completions.create(model=model, messages=msgs, n=3, temperature=1.0,
                                       seed=11, max_tokens=8)
    check([c.index for c in r.choices] == [0, 1, 2], f"indices {[c.index for c in r.choices]}")
    got = ["", "", ""]
    for chunk in client.chat.completions.create(model=model, messages=msgs, n=3, temperature=1.0,
                                                seed=11, max_tokens=8, stream=True):
        for c in chunk.choices:
            got[c.index] += c.delta.content or ""
    check(got == [c.message.content for c in r.choices], f"streamed {got} vs {r.choices}")
    print(f"n=3: {len(set(got))} different answers, streamed as whole")


def embeddings(client, model):
    # The client asks for base64 unless told otherwise: both must decode to the same.
    a = client.embeddings.create(model=model, input=["hello world", "goodbye"]).data
    b = client.embeddings.create(model=model, input="hello world", encoding_format="float").data
    check(len(a) == 2 and len(a[0].embedding) == len(b[0].embedding), "embedding sizes")
    check(max(abs(x - y) for x, y in zip(a[0].embedding, b[0].embedding)) < 1e-6, "base64 = float")
    check(abs(sum(x * x for x in a[0].embedding) - 1) < 1e-3, "unit length")
    print(f"embeddings: {len(a)} of {len(a[0].embedding)} dimensions")


def unknown_field(client, model):
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"frobnicate": 1})
    except openai.BadRequestError as e:
        check(e.body.get("param") == "frobnicate", f"param {e.body}")
        print("unknown field: 400 naming it")
        return
    sys.exit("FAIL: an unknown field was accepted")


def ollama_checks(host, model):
    c = ollama.Client(host=host)
    r = c.chat(model=model, messages=[{"role": "user", "content": "Say hi."}],
               options={"temperature": 0, "num_predict": 8})
    check(r.message.role == "assistant" and r.message.content, f"chat {r}")
    check(r.done and r.eval_count and r.eval_count <= 8, f"chat counts {r}")
    parts = list(c.chat(model=model, messages=[{"role": "user", "content": "Say hi."}],
                        options={"temperature": 0, "num_predict": 8}, stream=True))
    check(parts[-1].done and not any(p.done for p in parts[:-1]), "stream ends with done")
    streamed = "".join(p.message.content for p in parts)
    check(streamed == r.message.content, f"streamed {streamed!r} vs {r.message.content!r}")
    g = c.generate(model=model, prompt="Describe a cat as JSON.", format="json",
                   options={"temperature": 0, "num_predict": 60})
    check(isinstance(json.loads(g.response), dict), f"generate json {g.response!r}")
    t = c.chat(model=model, messages=[{"role": "user", "content": "Weather in Oslo?"}],
               tools=[WEATHER], options={"temperature": 0, "num_predict": 60})
    check(t.message.tool_calls is None or t.message.tool_calls[0].function.name == "get_weather",
          f"tool call {t.message}")
    names = [m.model for m in c.list().models]
    check(model in names, f"list {names}")
    s = c.show(model)
    check(s.modelfile and "completion" in (s.capabilities or []), f"show {s}")
    check(len(c.ps().models) == 1, "ps")
    e = c.embed(model=model, input=["hello", "good day"])
    check(len(e.embeddings) == 2 and abs(sum(x * x for x in e.embeddings[0]) - 1) < 1e-3,
          "embed: two unit vectors")
    print("ollama: chat, stream, generate json, tools, embed, list, show, ps")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("model", nargs="?")
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--tools-only", action="store_true",
                    help="the tool round trips alone (a tiny random model under a real template)")
    ap.add_argument("--max-tokens", type=int, default=60, help="for the tool call")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base + "/v1", api_key="none", max_retries=0)
    if a.model is None:
        a.model = client.models.list().data[0].id
    tool_round_trip(client, a.model, stream=False, max_tokens=a.max_tokens)
    tool_round_trip(client, a.model, stream=True, max_tokens=a.max_tokens)
    if a.tools_only:
        print("tool client checks passed")
        return
    logprobs(client, a.model)
    choices(client, a.model)
    unknown_field(client, a.model)
    embeddings(client, a.model)
    json_schema(client, a.model, a.samples)
    ollama_checks(a.base, a.model)
    print("all client checks passed")


if __name__ == "__main__":
    main()
