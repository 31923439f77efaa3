#!/usr/bin/env python3
"""Generate the kiln-text test fixtures (token ids and chat-template renders).

Run from the repository root, after `cargo test -p kiln-text` has fetched the assets once:

    python3 tools/gen_text_fixtures.py

Inputs (from the kiln cache, $KILN_HOME, default ~/.cache/kiln):
  models/qwen3-tokenizer/{tokenizer.json,tokenizer_config.json}
  models/llama3.2-tokenizer/{tokenizer.json,tokenizer_config.json}
  models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf

References:
  - Qwen3, Llama-3.2: the Python `tokenizers` package on their tokenizer.json.
  - SmolLM2: a Python `tokenizers` byte-level BPE built from the GGUF's tokens and merges with
    SmolLM2's Hugging Face pre-tokenizer (Digits(individual_digits) + ByteLevel with the GPT-2
    regex), control tokens (token_type 3) added as special tokens. This is the published
    SmolLM2 tokenizer.json layout, built independently of kiln's regex-split construction.
  - Chat templates: Jinja2 set up like transformers' chat-template renderer
    (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, raise_exception,
    strftime_now, tojson = json.dumps(ensure_ascii=False, ...)), with strftime_now pinned to
    FIXED_TIME.

Generated with Python 3.11, tokenizers 0.23, Jinja2 3.1, gguf 0.19 (versions are recorded in
the output files).

Outputs: crates/kiln-text/tests/fixtures/{tokens_qwen3,tokens_llama3.2,tokens_smollm2,chat}.json
"""

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import gguf
import jinja2
import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "kiln-text" / "tests" / "fixtures"
KILN_HOME = Path(os.environ.get("KILN_HOME", Path.home() / ".cache" / "kiln"))
MODELS = KILN_HOME / "models"
SMOLLM2_GGUF = MODELS / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# strftime_now() returns this instant (UTC): 2025-03-04 15:30:00, a Tuesday.
FIXED_TIME = 1741102200

CORPUS = [
    "Hello, world! This is a test.",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure we'll see; don't you think? They've said it'd be OK. YOU'RE RIGHT, I'LL GO.",
    "日本語のテキストと中文字符，还有한국어。",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷",
    "def f(x):\n\tif x > 1:\n\t\treturn x * 2\n    return None\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * i).collect();\n}\n",
    "a  b   c    d\n\n\nend   \n  \t \n",
    "   leading spaces",
    "trailing spaces   ",
    "",
    " ",
    "\n",
    "12345678 3.14159 1,000,000 2024-07-26 0x1F 007",
    "Café naïve résumé façade Ångström Œuvre São Paulo",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "<think>\nLet me reason.\n</think>\n\nThe answer is 42.",
    "Wow!!! ... ??? (parens) [brackets] {braces} <tags> & \"quotes\" 'single'",
    "Привет мир! مرحبا بالعالم שלום עולם नमस्ते दुनिया",
    "∀x∈ℝ: x² ≥ 0 → √(x²) = |x|",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "https://example.com/path?query=1&b=2#frag",
    "non\u00a0breaking\u2003em-space\u200bzero-width",
]


def write(name, obj):
    path = OUT / name
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def token_cases(tok):
    return [
        {
            "text": t,
            "ids": tok.encode(t, add_special_tokens=False).ids,
            "ids_special": tok.encode(t, add_special_tokens=True).ids,
        }
        for t in CORPUS
    ]


def gguf_field(reader, key):
    f = reader.fields[key]
    return f.contents()


def smollm2_reference():
    r = gguf.GGUFReader(SMOLLM2_GGUF)
    assert gguf_field(r, "tokenizer.ggml.model") == "gpt2"
    assert gguf_field(r, "tokenizer.ggml.pre") == "smollm"
    tokens = gguf_field(r, "tokenizer.ggml.tokens")
    types = gguf_field(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in gguf_field(r, "tokenizer.ggml.merges")]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, ty in zip(tokens, types) if ty == 3])
    template = gguf_field(r, "tokenizer.chat_template")
    bos = tokens[gguf_field(r, "tokenizer.ggml.bos_token_id")]
    eos = tokens[gguf_field(r, "tokenizer.ggml.eos_token_id")]
    return tok, template, bos, eos


def special(cfg, key):
    v = cfg.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    return v or ""


def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return datetime.fromtimestamp(FIXED_TIME, tz=timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


SYNTHETIC = {
    "loop_controls": (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% if loop.index > 3 %}{% break %}{% endif %}"
        "[{{ loop.index }}/{{ loop.length }}:{{ m.role }}] {{ m.content | trim }}\n"
        "{% endfor %}"
    ),
    "tojson": (
        '{% set d = {"name": "get_weather", "args": {"city": "Zürich", "units": ["c", "f"],'
        ' "n": 3, "x": 1.5, "big": 1e20, "ok": true, "nothing": none}, "html": "<b>&\'\\"</b>"} %}'
        "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ messages | tojson }}\n"
        '{{ {"b": 1, "a": [], "c": {}} | tojson(sort_keys=true) }}\n'
        '{{ "é😀" | tojson(ensure_ascii=true) }}\n'
    ),
    "python_methods": (
        "{%- set ns = namespace(count=0, last='') %}\n"
        "{%- for m in messages %}\n"
        "{%- set ns.count = ns.count + 1 %}{% set ns.last = m.role %}\n"
        "{{ m.content.strip().upper() }}|{{ m.content.split(' ')[0] }}|"
        "{{ m.content.replace('a', 'A') }}|{{ m.content.lstrip('W') }}|"
        "{% if m.content.startswith('Wh') %}starts{% endif %}|{{ m.content[::-1][:3] }}\n"
        "{% endfor %}"
        "{{ ns.count }} {{ ns.last }} {{ messages[0]['role'] }} {{ messages[-1].role }}"
        "{% if tools is none %} no-tools{% endif %}{% if foo is not defined %} no-foo{% endif %}"
        " {{ true }} {{ none }} {{ bos_token }}{{ eos_token }}\n"
    ),
    "strftime": "{{ strftime_now('%Y-%m-%d %H:%M:%S %A %a %B %b %d %j') }}",
    "raise": (
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
        "{{ raise_exception('Unsupported role: ' + m.role) }}{% endif %}{{ m.content }}{% endfor %}"
    ),
}

CONVERSATIONS = {
    "system_user": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "user_only": [{"role": "user", "content": "What is the capital of France?"}],
    "multi_turn": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "tricky_content": [
        {"role": "user", "content": 'He said "hi" & <b>bold</b> — 日本 😀 \\ backslash {{ not jinja }}'},
        {"role": "assistant", "content": "It's <i>fine</i>.\n\nReally."},
        {"role": "user", "content": "  padded  \n"},
    ],
    "thinking": [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "<think>\nBecause.\n</think>\n\nIt just is."},
        {"role": "user", "content": "What about now?"},
    ],
    # A tool round trip as kiln's server hands it to templates: the call's arguments as an
    # object, the result with its call id and function name (rendered with TOOLS).
    "tool_calls": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call-1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"sky\": \"sunny\", \"celsius\": 21}",
         "tool_call_id": "call-1", "name": "get_weather"},
    ],
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather of a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}},
]


def render(env, source, bos, eos, messages, agp, extra):
    ctx = dict(
        messages=messages,
        tools=None,
        documents=None,
        add_generation_prompt=agp,
        bos_token=bos,
        eos_token=eos,
    )
    ctx.update(extra)
    try:
        return env.from_string(source).render(**ctx), None
    except jinja2.exceptions.TemplateError as e:
        return None, str(e)


def chat_cases(templates, tool_calls=True):
    env = hf_env()
    cases = []
    for name, (source, bos, eos) in templates.items():
        for conv, msgs in CONVERSATIONS.items():
            if conv == "tool_calls" and not tool_calls:
                continue
            extras = [{}]
            if name == "qwen3":
                extras.append({"enable_thinking": False})
            if conv == "tool_calls":
                extras = [{"tools": TOOLS}]
            for extra in extras:
                for agp in (False, True):
                    out, err = render(env, source, bos, eos, msgs, agp, extra)
                    cases.append(
                        {
                            "template": name,
                            "conversation": conv,
                            "add_generation_prompt": agp,
                            "extra": extra,
                            "expected": out,
                            "error": err,
                        }
                    )
    return cases


def main():
    for d in ("qwen3-tokenizer", "llama3.2-tokenizer"):
        if not (MODELS / d / "tokenizer.json").is_file():
            sys.exit(f"missing {MODELS / d}: run `cargo test -p kiln-text` once to fetch it")
    if not SMOLLM2_GGUF.is_file():
        sys.exit(f"missing {SMOLLM2_GGUF}: run `cargo test -p kiln-text` once to fetch it")
    versions = {
        "python": sys.version.split()[0],
        "tokenizers": tokenizers.__version__,
        "jinja2": jinja2.__version__,
    }

    templates = {}
    for name, d in (("qwen3", "qwen3-tokenizer"), ("llama3.2", "llama3.2-tokenizer")):
        tok = Tokenizer.from_file(str(MODELS / d / "tokenizer.json"))
        write(f"tokens_{name}.json", {"versions": versions, "cases": token_cases(tok)})
        cfg = json.loads((MODELS / d / "tokenizer_config.json").read_text(encoding="utf-8"))
        templates[name] = (cfg["chat_template"], special(cfg, "bos_token"), special(cfg, "eos_token"))

    tok, template, bos, eos = smollm2_reference()
    write("tokens_smollm2.json", {"versions": versions, "cases": token_cases(tok)})
    templates["smollm2"] = (template, bos, eos)

    cases = chat_cases(templates)
    synth = {k: (v, "<s>", "</s>") for k, v in SYNTHETIC.items()}
    # (The synthetic templates reverse each message's content with `[::-1]`, which the
    # tool-call turn's empty content makes minijinja 2.24 panic on: kiln reports that as a
    # template error; the real templates do not do it.)
    cases += chat_cases(synth, tool_calls=False)
    write(
        "chat.json",
        {
            "versions": versions,
            "fixed_time": FIXED_TIME,
            "conversations": CONVERSATIONS,
            "synthetic": SYNTHETIC,
            "bos_eos": {k: [b, e] for k, (_, b, e) in {**templates, **synth}.items()},
            "cases": cases,
        },
    )


if __name__ == "__main__":
    main()
