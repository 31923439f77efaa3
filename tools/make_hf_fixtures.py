#!/usr/bin/env python3
"""Make the tiny Hugging Face / MLX reference fixtures of kiln-models' HF tests.

Run once where PyTorch and transformers are installed (no network needed), then unpack the
archive into the repository:

    python3 tools/make_hf_fixtures.py --out OUTDIR
    tar -xzf OUTDIR/hf_fixtures.tar.gz -C crates/kiln-models/tests/fixtures

What it writes (in the archive, folder `hf/`):
  qwen3/, qwen2/ (sharded: model.safetensors.index.json), llama3/ (llama3 rope scaling):
      random tiny models saved by transformers' `save_pretrained` (f32 safetensors,
      config.json as transformers writes it), plus a tiny byte-level BPE tokenizer.json,
      tokenizer_config.json (ChatML template) and generation_config.json.
  qwen3-bf16/: qwen3 with bf16 weights.
  qwen3-mlx4/: qwen3 quantized with MLX's affine rule, 4 bits, groups of 64, bf16 scales and
      biases (embedding included, norms kept in bf16); llama3-mlx8/: llama3 at 8 bits, groups
      of 32, f16 scales and biases.
  reference.json: for every model: prompts (token ids), transformers' f32 logits at every
      position, 32 greedy tokens after the first prompt with the top-1/top-2 margin of each
      step; for bf16 and MLX models the logits of the rounded / dequantized weights run in
      f32 arithmetic; the tokenizer's ids for a few strings.

References: transformers' modeling_{qwen3,qwen2,llama}.py (eager attention, f32, CPU), MLX's
affine quantization rule (per group: scale = (max-min)/(2^bits-1), sign and edge chosen so
the larger-magnitude extreme is exact, q = round((w-bias)/scale) clipped; w = scale*q + bias).
"""

import argparse
import copy
import json
import os
import shutil
import tarfile
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

torch.set_num_threads(4)
MAJOR = int(transformers.__version__.split(".")[0])

# ---- tokenizer: bytes (GPT-2's byte-to-unicode map), a few merges, ChatML specials ----


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"),
    ("Ġ", "w"), ("r", "e"), ("Ġ", "s"), ("a", "t"), ("o", "r"), ("e", "n"), ("l", "l"),
    ("e", "ll"), ("h", "ell"), ("hell", "o"), ("Ġw", "or"), ("Ġwor", "l"), ("Ġworl", "d"),
    ("Ġ", "i"), ("Ġi", "s"), ("Ġ", "c"), ("Ġc", "at"),
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def tokenizer_files():
    vocab = {}
    for ch in bytes_to_unicode().values():
        vocab[ch] = len(vocab)
    for a, b in MERGES:
        assert a in vocab and b in vocab, (a, b)
        vocab[a + b] = len(vocab)
    added = []
    for s in SPECIALS:
        added.append({"id": len(vocab), "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
        vocab[s] = len(vocab)
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
          "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT}, "behavior": "Isolated",
             "invert": False}, bl]},
        "post_processor": bl, "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {k: v for k, v in vocab.items() if k not in SPECIALS},
                  "merges": [f"{a} {b}" for a, b in MERGES]},
    }
    cfg = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "chat_template": CHATML, "model_max_length": 4096,
           "tokenizer_class": "PreTrainedTokenizerFast"}
    return tok, cfg, vocab


# ---- models ----

MODELS = {
    "qwen3": dict(model_type="qwen3", vocab_size=320, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  max_position_embeddings=512, theta=1e6, scaling=None),
    "qwen2": dict(model_type="qwen2", vocab_size=320, hidden_size=96, intermediate_size=160,
                  num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=512,
                  theta=1e6, scaling=None),
    "llama3": dict(model_type="llama", vocab_size=384, hidden_size=128,
                   intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
                   max_position_embeddings=512, theta=500000.0,
                   scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 64}),
}

PROMPTS = [
    [5, 71, 290, 3, 150, 42, 17, 255, 256, 100, 9, 77],
    [281, 33, 64, 200, 12],
]
TOKENIZE = ["hello world", "the cat is here", "Hi!\n<|im_start|>user\nhey<|im_end|>"]


def make_config(spec):
    kw = {k: v for k, v in spec.items() if k not in ("model_type", "theta", "scaling")}
    kw["initializer_range"] = 0.1
    kw["attention_dropout"] = 0.0
    if MAJOR >= 5:
        rp = {"rope_type": "default", "rope_theta": spec["theta"]}
        if spec["scaling"]:
            rp.update(spec["scaling"])
        kw["rope_parameters"] = rp
    else:
        kw["rope_theta"] = spec["theta"]
        if spec["scaling"]:
            kw["rope_scaling"] = dict(spec["scaling"])
    cfg = AutoConfig.for_model(spec["model_type"], **kw)
    return cfg


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


@torch.no_grad()
def logits_of(model, ids):
    out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()


@torch.no_grad()
def greedy(model, ids, n=32):
    ids = list(ids)
    toks, margins = [], []
    for _ in range(n):
        l = logits_of(model, ids)[-1]
        top = torch.topk(l, 2)
        toks.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(toks[-1])
    return toks, margins


def f32_list(t):
    return [float(f"{v:.9g}") for v in t.reshape(-1).tolist()]


def f32_config(cfg):
    """A copy of `cfg` that builds f32 models (never the caller's object: transformers
    records a model's dtype in its config)."""
    cfg = copy.deepcopy(cfg)
    for k in ("dtype", "torch_dtype"):
        if hasattr(cfg, k):
            setattr(cfg, k, torch.float32)
    return cfg


def reference_of(model, with_greedy=True):
    # Every parameter and buffer in f32: the reference is f32 arithmetic.
    for n, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert t.dtype == torch.float32, (n, t.dtype)
    r = {"prompts": PROMPTS, "logits": [f32_list(logits_of(model, p)) for p in PROMPTS]}
    if with_greedy:
        r["greedy"], r["margins"] = greedy(model, PROMPTS[0])
    return r


# ---- MLX affine quantization (numpy) ----


def mlx_quantize(w, group, bits, sdtype):
    """w (rows, cols) f32 -> packed uint32 (rows, cols*bits/32), scales, biases (sdtype),
    and the dequantized f32 weights w' = scale*q + bias (with the stored scales/biases)."""
    rows, cols = w.shape
    n_bins = (1 << bits) - 1
    g = w.reshape(rows, cols // group, group).astype(np.float32)
    w_max, w_min = g.max(-1, keepdims=True), g.min(-1, keepdims=True)
    mask = np.abs(w_min) > np.abs(w_max)
    scale = np.maximum((w_max - w_min) / n_bins, 1e-7)
    scale = np.where(mask, scale, -scale)
    edge = np.where(mask, w_min, w_max)
    q0 = np.rint(edge / scale)
    scale = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1), scale)
    bias = np.where(q0 == 0, 0.0, edge)
    q = np.clip(np.rint((g - bias) / scale), 0, n_bins).astype(np.uint32)
    # Scales and biases are stored in the model's dtype; dequantization uses those values.
    s_t = torch.from_numpy(scale[..., 0].astype(np.float32)).to(sdtype)
    b_t = torch.from_numpy(bias[..., 0].astype(np.float32)).to(sdtype)
    s32, b32 = s_t.float().numpy()[..., None], b_t.float().numpy()[..., None]
    deq = (s32 * q.astype(np.float32) + b32).reshape(rows, cols)
    per = 32 // bits
    qf = q.reshape(rows, cols // per, per)
    packed = np.zeros((rows, cols // per), dtype=np.uint32)
    for j in range(per):
        packed |= qf[:, :, j] << np.uint32(bits * j)
    return packed, s_t, b_t, deq


def write_safetensors(path, tensors, metadata):
    """The safetensors layout (8-byte header length, JSON header, data), written directly so
    uint32 and bf16 tensors need no library support."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        if isinstance(t, np.ndarray):
            assert t.dtype == np.uint32
            raw, dt = np.ascontiguousarray(t).tobytes(), "U32"
        elif t.dtype == torch.bfloat16:
            raw, dt = t.contiguous().view(torch.int16).numpy().tobytes(), "BF16"
        elif t.dtype == torch.float16:
            raw, dt = t.contiguous().numpy().tobytes(), "F16"
        else:
            raw, dt = t.contiguous().float().numpy().tobytes(), "F32"
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def save(model, d, shard="50MB"):
    try:
        model.save_pretrained(d, safe_serialization=True, max_shard_size=shard)
    except TypeError:
        model.save_pretrained(d, max_shard_size=shard)


def save_mlx(model, src_dir, dst, group, bits, sdtype):
    """An MLX-style checkpoint of `model` and the model with its dequantized weights."""
    shutil.copytree(src_dir, dst)
    for f in os.listdir(dst):
        if f.endswith(".safetensors") or f.endswith(".index.json"):
            os.remove(os.path.join(dst, f))
    tensors = {}
    sd = model.state_dict()
    deq_model = AutoModelForCausalLM.from_config(f32_config(model.config),
                                                 attn_implementation="eager").eval()
    deq_model.load_state_dict(sd)
    with torch.no_grad():
        for name, p in deq_model.named_parameters():
            w = p.detach().float()
            quantizable = name.endswith(".weight") and w.ndim == 2 and w.shape[1] % group == 0
            if quantizable:
                packed, s, b, deq = mlx_quantize(w.numpy(), group, bits, sdtype)
                base = name[: -len(".weight")]
                tensors[name] = packed
                tensors[base + ".scales"] = s
                tensors[base + ".biases"] = b
                p.copy_(torch.from_numpy(deq))
            else:
                v = w.to(sdtype)
                tensors[name] = v.contiguous()
                p.copy_(v.float())
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
        tensors.pop("lm_head.scales", None)
        tensors.pop("lm_head.biases", None)
    write_safetensors(os.path.join(dst, "model.safetensors"), tensors, {"format": "mlx"})
    cfg_path = os.path.join(dst, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization"] = {"group_size": group, "bits": bits}
    cfg["quantization_config"] = {"group_size": group, "bits": bits}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    try:
        from safetensors import safe_open

        with safe_open(os.path.join(dst, "model.safetensors"), "np") as f:
            assert sorted(f.keys()) == sorted(tensors)
    except ImportError:
        pass
    return deq_model


def save_with_reference(model, d, class_name):
    """Saves `model` into d with the tiny tokenizer, reloads the saved files (catching anything
    save drops) and returns their reference (reference_of), the class checked."""
    save(model, d)
    tok, tok_cfg, _ = tokenizer_files()
    for fn, obj in [("tokenizer.json", tok), ("tokenizer_config.json", tok_cfg)]:
        with open(os.path.join(d, fn), "w") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
    dkw = {"dtype": torch.float32} if MAJOR >= 5 else {"torch_dtype": torch.float32}
    reloaded = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", **dkw).eval()
    assert type(reloaded).__name__ == class_name, type(reloaded).__name__
    return reference_of(reloaded)


def write_archive(top, names, out, filename):
    """top/<name> for each of names, as folders of the archive out/filename."""
    archive = os.path.join(out, filename)
    with tarfile.open(archive, "w:gz") as t:
        for n in names:
            t.add(os.path.join(top, n), arcname=n)
    print("wrote", archive, os.path.getsize(archive), "bytes")
    return archive


def pick_seed(spec, min_margin):
    for seed in range(50):
        cfg = make_config(spec)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(f32_config(cfg), attn_implementation="eager").eval()
        randomize(model, seed)
        _, margins = greedy(model, PROMPTS[0])
        if min(margins) >= min_margin:
            return seed, model
    raise SystemExit(f"no seed gives greedy margins >= {min_margin}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    root = os.path.join(tmp, "hf")
    os.makedirs(root)
    tok, tok_cfg, vocab = tokenizer_files()
    ref = {"transformers": transformers.__version__, "torch": torch.__version__,
           "models": {}}
    try:
        import tokenizers

        t = tokenizers.Tokenizer.from_str(json.dumps(tok))
        ref["tokenize"] = {s: t.encode(s).ids for s in TOKENIZE}
        ref["tokenizers"] = tokenizers.__version__
    except ImportError:
        pass

    models = {}
    for name, spec in MODELS.items():
        seed, model = pick_seed(spec, 2e-3)
        d = os.path.join(root, name)
        shard = "150KB" if name == "qwen2" else "50MB"
        save(model, d, shard)
        for fn, obj in [("tokenizer.json", tok), ("tokenizer_config.json", tok_cfg)]:
            with open(os.path.join(d, fn), "w") as f:
                json.dump(obj, f, ensure_ascii=False, indent=1)
        gen = {"bos_token_id": vocab["<|endoftext|>"],
               "eos_token_id": [vocab["<|im_end|>"], vocab["<|endoftext|>"]],
               "do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump(gen, f, indent=2)
        # The saved files, reloaded, are the reference (catches anything save drops).
        dkw = {"dtype": torch.float32} if MAJOR >= 5 else {"torch_dtype": torch.float32}
        reloaded = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                        **dkw).eval()
        r = reference_of(reloaded)
        r["seed"] = seed
        try:
            r["inv_freq"] = f32_list(reloaded.model.rotary_emb.inv_freq)
        except AttributeError:
            pass
        ref["models"][name] = r
        models[name] = (reloaded, d)
        print(name, "seed", seed, "min margin", min(r["margins"]), flush=True)

    # bf16 weights (saved as bf16; reference: those files loaded as f32, f32 arithmetic).
    m, d = models["qwen3"]
    bf = AutoModelForCausalLM.from_config(f32_config(m.config),
                                          attn_implementation="eager").eval()
    bf.load_state_dict(m.state_dict())
    d_bf = os.path.join(root, "qwen3-bf16")
    save(bf.to(torch.bfloat16), d_bf)
    for fn in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copy(os.path.join(d, fn), d_bf)
    dkw = {"dtype": torch.float32} if MAJOR >= 5 else {"torch_dtype": torch.float32}
    bf = AutoModelForCausalLM.from_pretrained(d_bf, attn_implementation="eager", **dkw).eval()
    ref["models"]["qwen3-bf16"] = reference_of(bf)

    for name, group, bits, sdtype, src in [
        ("qwen3-mlx4", 64, 4, torch.bfloat16, "qwen3"),
        ("llama3-mlx8", 32, 8, torch.float16, "llama3"),
    ]:
        m, d = models[src]
        deq = save_mlx(m, d, os.path.join(root, name), group, bits, sdtype)
        ref["models"][name] = reference_of(deq)

    with open(os.path.join(root, "reference.json"), "w") as f:
        json.dump(ref, f)
    archive = os.path.join(args.out, "hf_fixtures.tar.gz")
    with tarfile.open(archive, "w:gz") as t:
        t.add(root, arcname="hf")
    print("wrote", archive, os.path.getsize(archive), "bytes")
    for dp, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(dp, f)
            print(os.path.relpath(p, root), os.path.getsize(p))


if __name__ == "__main__":
    main()
