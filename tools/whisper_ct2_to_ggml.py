#!/usr/bin/env python3
"""Writes a CTranslate2 Whisper model (model.bin + tokenizer.json, fp16) as a whisper.cpp
ggml .bin with the same weights, so both engines can be benchmarked on identical numbers.

usage: whisper_ct2_to_ggml.py MODEL_DIR MEL_FILTERS_NPZ OUT.bin [--type f16|f32|q8_0|q5_0|q4_0]

With a quantized type, every 2-D weight but the positional embeddings is stored in that
ggml block format (as whisper.cpp's quantize tool chooses: the 3-D conv kernels and the
1-D vectors keep f16/f32), quantized by ggml's reference rounding (see kiln-quant): the
q4_0/q5_0/q8_0 files come out byte-identical to whisper.cpp's quantize of the f16 file.

Only the project's own reading of the two formats: CTranslate2's variable records
(see crates/kiln-formats/src/ct2.rs) and the ggml whisper layout (hparams, mel filters,
vocabulary, then tensors as n_dims, name length, type, dims innermost first, name, data).
"""
import argparse
import json
import struct

import numpy as np

DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2(path):
    b = open(path, "rb").read()
    o = 0

    def take(fmt):
        nonlocal o
        v = struct.unpack_from(fmt, b, o)
        o += struct.calcsize(fmt)
        return v

    def string():
        nonlocal o
        (n,) = take("<H")
        s = b[o:o + n].split(b"\0")[0].decode()
        o += n
        return s

    (version,) = take("<I")
    assert version >= 4, version
    string()
    take("<I")
    (n,) = take("<I")
    out = {}
    for _ in range(n):
        name = string()
        (rank,) = take("<B")
        dims = take("<%dI" % rank)
        (dt,) = take("<B")
        (nb,) = take("<I")
        out[name] = np.frombuffer(b, DTYPES[dt], nb // np.dtype(DTYPES[dt]).itemsize, o).reshape(dims)
        o += nb
    (na,) = take("<I")
    for _ in range(na):
        a, t = string(), string()
        out[a] = out[t]
    return out


# ggml type ids, and whisper.cpp's file type for a model quantized to each.
GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q5_0": 6, "q8_0": 8}
FTYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q5_0": 8}


def quantize(a, kind):
    """Rows of `a` (float32, row length a multiple of 32) as ggml blocks of `kind`."""
    x = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, 32)
    if kind == "q8_0":
        amax = np.abs(x).max(axis=1)
        d = amax / 127.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = x * inv[:, None]
        q = (np.sign(q) * np.floor(np.abs(q) + 0.5)).astype(np.int8)  # roundf: half away from 0
        blocks = np.empty((x.shape[0], 34), dtype=np.uint8)
        blocks[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
        blocks[:, 2:] = q.view(np.uint8)
        return blocks.tobytes()
    # q4_0 / q5_0: the value of largest magnitude, sign kept, maps to -8 / -16.
    idx = np.abs(x).argmax(axis=1)
    mx = x[np.arange(x.shape[0]), idx]
    levels = 8 if kind == "q4_0" else 16
    d = mx / -levels
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    xi = np.minimum(2 * levels - 1, np.trunc(x * inv[:, None] + levels + 0.5)).astype(np.uint32)
    lo, hi = xi[:, :16], xi[:, 16:]
    qs = ((lo & 0x0F) | ((hi & 0x0F) << 4)).astype(np.uint8)
    dd = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    if kind == "q4_0":
        return np.concatenate([dd, qs], axis=1).tobytes()
    bit = np.arange(16, dtype=np.uint32)
    qh = (((lo >> 4) & 1) << bit).sum(axis=1) | (((hi >> 4) & 1) << (bit + 16)).sum(axis=1)
    qh = qh.astype("<u4").view(np.uint8).reshape(-1, 4)
    return np.concatenate([dd, qh, qs], axis=1).tobytes()


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for c in range(256):
        if c not in bs:
            bs.append(c)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("mel_filters_npz")
    ap.add_argument("out")
    ap.add_argument("--type", choices=list(GGML_TYPE), default="f16")
    a = ap.parse_args()
    model_dir, npz, out_path, wtype = a.model_dir, a.mel_filters_npz, a.out, a.type
    v = read_ct2(model_dir + "/model.bin")
    tok = json.load(open(model_dir + "/tokenizer.json", encoding="utf-8"))
    emb = v["decoder/embeddings/weight"]
    n_vocab, d = emb.shape
    n_mels = v["encoder/conv1/weight"].shape[1]
    n_audio_ctx = v["encoder/position_encodings/encodings"].shape[0]
    n_text_ctx = v["decoder/position_encodings/encodings"].shape[0]
    n_head = int(v["encoder/num_heads"].reshape(-1)[0])
    count = lambda p: len({k.split("/")[1] for k in v if k.split("/")[1][6:].isdigit() and k.startswith(p + "/layer_")})
    n_audio_layer, n_text_layer = count("encoder"), count("decoder")

    f = open(out_path, "wb")
    f.write(struct.pack("<I", 0x67676D6C))
    # Quantized files carry ggml's quantization version (2) as whisper.cpp's quantize writes it.
    ftype = FTYPE[wtype] + (0 if wtype in ("f16", "f32") else 2 * 1000)
    for x in [n_vocab, n_audio_ctx, d, n_head, n_audio_layer, n_text_ctx, d, n_head, n_text_layer, n_mels, ftype]:
        f.write(struct.pack("<i", x))
    filters = np.load(npz)["mel_%d" % n_mels].astype(np.float32)
    f.write(struct.pack("<ii", *filters.shape))
    f.write(filters.tobytes())
    # Text tokens as raw bytes, id order (specials are implied by whisper.cpp from n_vocab).
    dec = byte_decoder()
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = [t for t, i in vocab if i < 50256]
    assert len(vocab) == 50256
    f.write(struct.pack("<i", len(vocab)))
    for t in vocab:
        raw = bytes(dec[c] for c in t)
        f.write(struct.pack("<I", len(raw)))
        f.write(raw)

    def tensor(name, a, f16):
        # f16: a weight matrix or kernel (stored in the chosen type); else kept f32.
        kind = "f32"
        if f16:
            quantizable = a.ndim == 2 and a.shape[-1] % 32 == 0
            kind = wtype if wtype in ("f16", "f32") or quantizable else "f16"
        dims = a.shape[::-1]
        if kind in ("f16", "f32"):
            data = np.ascontiguousarray(a.astype(np.float16 if kind == "f16" else np.float32)).tobytes()
        else:
            data = quantize(a, kind)
        nb = name.encode()
        f.write(struct.pack("<iii", len(dims), len(nb), GGML_TYPE[kind]))
        for x in dims:
            f.write(struct.pack("<i", x))
        f.write(nb)
        f.write(data)

    tensor("encoder.positional_embedding", v["encoder/position_encodings/encodings"], False)
    for i in (1, 2):
        tensor("encoder.conv%d.weight" % i, v["encoder/conv%d/weight" % i], True)
        tensor("encoder.conv%d.bias" % i, v["encoder/conv%d/bias" % i].reshape(-1, 1), False)
    tensor("encoder.ln_post.weight", v["encoder/layer_norm/gamma"], False)
    tensor("encoder.ln_post.bias", v["encoder/layer_norm/beta"], False)

    def linear(prefix, w, b, bias=True):
        tensor(prefix + ".weight", w, True)
        if bias:
            tensor(prefix + ".bias", b, False)

    def attn(dst, qkv_w, qkv_b, out_w, out_b):
        q, k, vv = np.split(qkv_w, 3)
        qb, _, vb = np.split(qkv_b, 3)
        linear(dst + ".query", q, qb)
        linear(dst + ".key", k, None, bias=False)
        linear(dst + ".value", vv, vb)
        linear(dst + ".out", out_w, out_b)

    def mlp_ln(dst, src):
        tensor(dst + ".mlp_ln.weight", v[src + "/ffn/layer_norm/gamma"], False)
        tensor(dst + ".mlp_ln.bias", v[src + "/ffn/layer_norm/beta"], False)
        linear(dst + ".mlp.0", v[src + "/ffn/linear_0/weight"], v[src + "/ffn/linear_0/bias"])
        linear(dst + ".mlp.2", v[src + "/ffn/linear_1/weight"], v[src + "/ffn/linear_1/bias"])

    for i in range(n_audio_layer):
        s, t = "encoder/layer_%d" % i, "encoder.blocks.%d" % i
        sa = s + "/self_attention"
        tensor(t + ".attn_ln.weight", v[sa + "/layer_norm/gamma"], False)
        tensor(t + ".attn_ln.bias", v[sa + "/layer_norm/beta"], False)
        attn(t + ".attn", v[sa + "/linear_0/weight"], v[sa + "/linear_0/bias"], v[sa + "/linear_1/weight"], v[sa + "/linear_1/bias"])
        mlp_ln(t, s)

    tensor("decoder.positional_embedding", v["decoder/position_encodings/encodings"], False)
    tensor("decoder.token_embedding.weight", emb, True)
    tensor("decoder.ln.weight", v["decoder/layer_norm/gamma"], False)
    tensor("decoder.ln.bias", v["decoder/layer_norm/beta"], False)
    for i in range(n_text_layer):
        s, t = "decoder/layer_%d" % i, "decoder.blocks.%d" % i
        sa, ca = s + "/self_attention", s + "/attention"
        tensor(t + ".attn_ln.weight", v[sa + "/layer_norm/gamma"], False)
        tensor(t + ".attn_ln.bias", v[sa + "/layer_norm/beta"], False)
        attn(t + ".attn", v[sa + "/linear_0/weight"], v[sa + "/linear_0/bias"], v[sa + "/linear_1/weight"], v[sa + "/linear_1/bias"])
        tensor(t + ".cross_attn_ln.weight", v[ca + "/layer_norm/gamma"], False)
        tensor(t + ".cross_attn_ln.bias", v[ca + "/layer_norm/beta"], False)
        linear(t + ".cross_attn.query", v[ca + "/linear_0/weight"], v[ca + "/linear_0/bias"])
        k, vv = np.split(v[ca + "/linear_1/weight"], 2)
        _, vb = np.split(v[ca + "/linear_1/bias"], 2)
        linear(t + ".cross_attn.key", k, None, bias=False)
        linear(t + ".cross_attn.value", vv, vb)
        linear(t + ".cross_attn.out", v[ca + "/linear_2/weight"], v[ca + "/linear_2/bias"])
        mlp_ln(t, s)
    f.close()


if __name__ == "__main__":
    main()
