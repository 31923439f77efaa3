#!/usr/bin/env python3
"""Make the tiny LFM2 reference fixtures of kiln-models' tests (beside the ones
`make_hf_fixtures.py` makes, whose helpers this script uses; those are left as they are).

Run where PyTorch and transformers (5.x) are installed (no network needed), then unpack:

    python3 tools/make_lfm2_fixtures.py --out OUTDIR [--llama-cpp SRC]
    tar -xzf OUTDIR/lfm2_fixtures.tar.gz -C crates/kiln-models/tests/fixtures

What it writes (in the archive):
  hf/lfm2/: a random tiny Lfm2ForCausalLM saved by transformers' `save_pretrained` (f32
      safetensors, config.json as transformers writes it): 6 layers, convolution layers
      at 0, 1, 3 and 5 and attention at 2 and 4 (so the stack mixes both and ends on a
      convolution), convolutions of width 3, 4 heads over 2 KV heads of 16, the MLP width
      from LFM2's rule (intermediate_size 144 -> 2/3 -> 96, multiple of 32), tied embeddings,
      the same tiny byte-level BPE tokenizer as the other fixtures.
  hf/reference_lfm2.json: {"models": {"lfm2": ...}} in reference.json's form: prompts,
      transformers' f32 logits at every position (eager attention, CPU), 32 greedy tokens
      after the first prompt with the top-1/top-2 margin of each step.
  llama-cpp/lfm2-tiny-f32.gguf (with --llama-cpp SRC, a llama.cpp source tree such as
      tools/build-llama-cpp.sh unpacks): that checkpoint converted by llama.cpp's own
      convert_hf_to_gguf.py (--outtype f32), so the GGUF reader is checked against the same
      reference through llama.cpp's names and layout.

Reference: transformers' modeling_lfm2.py (Lfm2ForCausalLM).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import AutoModelForCausalLM, Lfm2Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_fixtures as base  # noqa: E402

torch.set_num_threads(2)

SPEC = dict(vocab_size=320, hidden_size=64, intermediate_size=144, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, norm_eps=1e-5,
            max_position_embeddings=512, tie_word_embeddings=True, conv_L_cache=3,
            conv_bias=False, block_auto_adjust_ff_dim=True, block_ffn_dim_multiplier=1.0,
            block_multiple_of=32, initializer_range=0.1,
            layer_types=["conv", "conv", "full_attention", "conv", "full_attention", "conv"],
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            bos_token_id=None, eos_token_id=None, pad_token_id=None)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("conv.conv.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def pick_seed(min_margin):
    for seed in range(50):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(Lfm2Config(**SPEC), attn_implementation="eager",
                                                 dtype=torch.float32).eval()
        randomize(model, seed)
        _, margins = base.greedy(model, base.PROMPTS[0])
        if min(margins) >= min_margin:
            return seed, model
    raise SystemExit(f"no seed gives greedy margins >= {min_margin}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--llama-cpp", help="a llama.cpp source tree (for the GGUF conversion)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    top = tempfile.mkdtemp()
    root = os.path.join(top, "hf")
    d = os.path.join(root, "lfm2")
    os.makedirs(root)
    seed, model = pick_seed(2e-3)
    r = base.save_with_reference(model, d, "Lfm2ForCausalLM")
    r["seed"] = seed
    ref = {"transformers": transformers.__version__, "torch": torch.__version__,
           "models": {"lfm2": r}}
    with open(os.path.join(root, "reference_lfm2.json"), "w") as f:
        json.dump(ref, f)
    print("lfm2 seed", seed, "min margin", min(r["margins"]), flush=True)
    names = ["hf"]
    if args.llama_cpp:
        os.makedirs(os.path.join(top, "llama-cpp"))
        out = os.path.join(top, "llama-cpp", "lfm2-tiny-f32.gguf")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [args.llama_cpp, os.path.join(args.llama_cpp, "gguf-py")]))
        # The converter recognises pre-tokenizers by a hash of known vocabularies; the tiny
        # test vocabulary is none of them, so it is named GPT-2's (the split it uses).
        shim = ("import sys, runpy; from conversion import base; "
                "base.TextModel.get_vocab_base_pre = lambda self, tok: 'gpt-2'; "
                "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
        subprocess.run([sys.executable, "-c", shim,
                        os.path.join(args.llama_cpp, "convert_hf_to_gguf.py"),
                        d, "--outtype", "f32", "--outfile", out], check=True, env=env)
        names.append("llama-cpp")
    base.write_archive(top, names, args.out, "lfm2_fixtures.tar.gz")


if __name__ == "__main__":
    main()
