#!/usr/bin/env python3
"""Greedy reference of the real Gemma 3 270M GGUF (the catalog's gemma3-270m-it, Q4_K_M) from
transformers: the file loaded by transformers' own GGUF reader (weights dequantized to f32,
its norms un-shifted), run in f32 with eager attention on the CPU. kiln's f32 reference
path must give the same greedy tokens (crates/kiln-models/tests/gemma3_real.rs).

    pip install torch transformers accelerate gguf sentencepiece
    python3 tools/gemma3_reference.py --gguf PATH/gemma-3-270m-q4_k_m.gguf \
        --out crates/kiln-models/tests/fixtures/gemma3_270m_transformers.json

Cases: five short prompts, 32 greedy tokens each; and a long one (the first 700 tokens of
tools/text/eval_en.txt, past the 512-position sliding window), 8 greedy tokens. For each:
the prompt ids (BOS first, from transformers' tokenizer of the same file), the greedy ids
and the top-1/top-2 logit margin of every step.
"""

import argparse
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at",
]


def greedy(m, ids, n):
    gen, margins = [], []
    with torch.no_grad():
        o = m(input_ids=torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            top = torch.topk(o.logits[0, -1], 2)
            t = int(top.indices[0])
            gen.append(t)
            margins.append(float(top.values[0] - top.values[1]))
            o = m(input_ids=torch.tensor([[t]]), past_key_values=o.past_key_values,
                  use_cache=True)
    return gen, margins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    d, f = os.path.dirname(os.path.abspath(args.gguf)), os.path.basename(args.gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "text", "eval_en.txt")) as fh:
        long_ids = tok(fh.read()).input_ids[:700]
    cases = [(p, tok(p).input_ids, 32) for p in PROMPTS]
    cases.append(("eval_en.txt, first 700 tokens", long_ids, 8))
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "file_bytes": os.path.getsize(args.gguf), "cases": []}
    for name, ids, n in cases:
        gen, margins = greedy(m, ids, n)
        out["cases"].append({"name": name, "prompt_ids": ids, "greedy_ids": gen,
                             "margins": margins, "text": tok.decode(gen)})
        print(json.dumps(name), json.dumps(tok.decode(gen)),
              "min margin %.4f" % min(margins), flush=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
