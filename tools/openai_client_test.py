#!/usr/bin/env python3
"""kiln serve against the official `openai` Python client: models, chat (streamed and not),
completions (streamed and not), with the answers' content checked. Exits non-zero on any
failure.

    python3 tools/openai_client_test.py --base-url http://127.0.0.1:8080/v1 [--api-key KEY]
"""

import argparse
import sys

import openai


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=120)

    ids = [m.id for m in client.models.list().data]
    assert a.model in ids, f"models: {ids}"

    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    r = client.chat.completions.create(
        model=a.model, messages=messages, temperature=0, max_tokens=32
    )
    answer = r.choices[0].message.content
    assert "Paris" in answer, f"chat answer: {answer!r}"
    assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    parts, usage, finish = [], None, None
    for chunk in client.chat.completions.create(
        model=a.model,
        messages=messages,
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    streamed = "".join(parts)
    assert streamed == answer, f"streamed {streamed!r} != {answer!r}"
    assert finish == "stop", finish
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage

    c = client.completions.create(
        model=a.model, prompt="The capital of France is", temperature=0, max_tokens=6
    )
    text = c.choices[0].text
    assert "Paris" in text, f"completion: {text!r}"
    assert c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 6, c.usage
    streamed = "".join(
        ch.choices[0].text
        for ch in client.completions.create(
            model=a.model,
            prompt="The capital of France is",
            temperature=0,
            max_tokens=6,
            stream=True,
        )
        if ch.choices
    )
    assert streamed == text, f"streamed {streamed!r} != {text!r}"

    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert "no-such-model" in str(e), e

    print(f"openai {openai.__version__}: models, chat, chat stream, completions, "
          f"completions stream, unknown model: ok ({answer!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
