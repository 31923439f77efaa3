#!/usr/bin/env python3
"""Writes a CTranslate2 Whisper model (model.bin + tokenizer.json + config.json) as a Hugging
Face `openai/whisper-*` checkpoint directory with the same weights: config.json,
generation_config.json, model.safetensors (or shards + model.safetensors.index.json),
tokenizer.json and preprocessor_config.json.

usage: whisper_ct2_to_hf.py MODEL_DIR OUT_DIR [--dtype f16|f32|bf16] [--shards N]

Only numpy and the project's own reading of the formats: CTranslate2's variable records
(crates/kiln-formats/src/ct2.rs, read by whisper_ct2_to_ggml.py) and safetensors (an 8-byte
little-endian header length, a JSON header of dtype/shape/data_offsets, then the bytes).
Names follow transformers' WhisperForConditionalGeneration; the key projections have no
bias there (CTranslate2's fused bias holds zeros for them, checked).
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whisper_ct2_to_ggml import read_ct2  # noqa: E402


def bf16_bytes(a):
    """float32 -> bfloat16 bytes, rounding to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r.tobytes()


def tensors_of(v):
    emb = v["decoder/embeddings/weight"]
    d = emb.shape[1]
    out = {}

    def put(name, a):
        out[name] = np.asarray(a, dtype=np.float32)

    def count(p):
        return len({k.split("/")[1] for k in v if k.startswith(p + "/layer_") and k.split("/")[1][6:].isdigit()})

    put("model.encoder.conv1.weight", v["encoder/conv1/weight"])
    put("model.encoder.conv1.bias", v["encoder/conv1/bias"])
    put("model.encoder.conv2.weight", v["encoder/conv2/weight"])
    put("model.encoder.conv2.bias", v["encoder/conv2/bias"])
    put("model.encoder.embed_positions.weight", v["encoder/position_encodings/encodings"])
    put("model.encoder.layer_norm.weight", v["encoder/layer_norm/gamma"])
    put("model.encoder.layer_norm.bias", v["encoder/layer_norm/beta"])
    put("model.decoder.embed_tokens.weight", emb)
    put("model.decoder.embed_positions.weight", v["decoder/position_encodings/encodings"])
    put("model.decoder.layer_norm.weight", v["decoder/layer_norm/gamma"])
    put("model.decoder.layer_norm.bias", v["decoder/layer_norm/beta"])

    def ln(dst, src):
        put(dst + ".weight", v[src + "/gamma"])
        put(dst + ".bias", v[src + "/beta"])

    def linear(dst, w, b):
        put(dst + ".weight", w)
        if b is not None:
            put(dst + ".bias", b)

    def no_key_bias(b, where):
        if np.any(np.asarray(b, dtype=np.float32) != 0):
            raise SystemExit("%s: the key bias is not zero (Hugging Face Whisper has none)" % where)

    for stack in ("encoder", "decoder"):
        for i in range(count(stack)):
            s, t = "%s/layer_%d" % (stack, i), "model.%s.layers.%d" % (stack, i)
            sa = s + "/self_attention"
            ln(t + ".self_attn_layer_norm", sa + "/layer_norm")
            q, k, vv = np.split(v[sa + "/linear_0/weight"], 3)
            qb, kb, vb = np.split(v[sa + "/linear_0/bias"], 3)
            no_key_bias(kb, sa)
            linear(t + ".self_attn.q_proj", q, qb)
            linear(t + ".self_attn.k_proj", k, None)
            linear(t + ".self_attn.v_proj", vv, vb)
            linear(t + ".self_attn.out_proj", v[sa + "/linear_1/weight"], v[sa + "/linear_1/bias"])
            if stack == "decoder":
                ca = s + "/attention"
                ln(t + ".encoder_attn_layer_norm", ca + "/layer_norm")
                linear(t + ".encoder_attn.q_proj", v[ca + "/linear_0/weight"], v[ca + "/linear_0/bias"])
                k, vv = np.split(v[ca + "/linear_1/weight"], 2)
                kb, vb = np.split(v[ca + "/linear_1/bias"], 2)
                no_key_bias(kb, ca)
                linear(t + ".encoder_attn.k_proj", k, None)
                linear(t + ".encoder_attn.v_proj", vv, vb)
                linear(t + ".encoder_attn.out_proj", v[ca + "/linear_2/weight"], v[ca + "/linear_2/bias"])
            ln(t + ".final_layer_norm", s + "/ffn/layer_norm")
            linear(t + ".fc1", v[s + "/ffn/linear_0/weight"], v[s + "/ffn/linear_0/bias"])
            linear(t + ".fc2", v[s + "/ffn/linear_1/weight"], v[s + "/ffn/linear_1/bias"])
    return out, d, count("encoder"), count("decoder")


def write_safetensors(path, tensors, dtype):
    st_name, data = {"f16": "F16", "f32": "F32", "bf16": "BF16"}[dtype], []
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(tensors):
        a = tensors[name]
        if dtype == "f16":
            b = np.ascontiguousarray(a.astype(np.float16)).tobytes()
        elif dtype == "f32":
            b = np.ascontiguousarray(a.astype(np.float32)).tobytes()
        else:
            b = bf16_bytes(a)
        header[name] = {"dtype": st_name, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        data.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in data:
            f.write(b)
    return off


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", choices=["f16", "f32", "bf16"], default="f16")
    ap.add_argument("--shards", type=int, default=1)
    a = ap.parse_args()

    v = read_ct2(os.path.join(a.model_dir, "model.bin"))
    ct2_cfg = {}
    p = os.path.join(a.model_dir, "config.json")
    if os.path.exists(p):
        ct2_cfg = json.load(open(p))
    tensors, d, n_enc, n_dec = tensors_of(v)
    n_vocab = v["decoder/embeddings/weight"].shape[0]
    n_mels = v["encoder/conv1/weight"].shape[1]
    heads = int(np.asarray(v["encoder/num_heads"]).reshape(-1)[0])
    dec_heads = int(np.asarray(v["decoder/num_heads"]).reshape(-1)[0])
    ffn = v["encoder/layer_0/ffn/linear_0/weight"].shape[0]
    multilingual = n_vocab >= 51865
    eot = 50257 if multilingual else 50256
    sot = eot + 1
    no_ts = n_vocab - 1501 - 1

    os.makedirs(a.out_dir, exist_ok=True)
    dt_name = {"f16": "float16", "f32": "float32", "bf16": "bfloat16"}[a.dtype]
    config = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "vocab_size": n_vocab,
        "num_mel_bins": n_mels,
        "d_model": d,
        "encoder_layers": n_enc,
        "encoder_attention_heads": heads,
        "decoder_layers": n_dec,
        "decoder_attention_heads": dec_heads,
        "encoder_ffn_dim": ffn,
        "decoder_ffn_dim": ffn,
        "num_hidden_layers": n_enc,
        "max_source_positions": v["encoder/position_encodings/encodings"].shape[0],
        "max_target_positions": v["decoder/position_encodings/encodings"].shape[0],
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "init_std": 0.02,
        "pad_token_id": eot,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "decoder_start_token_id": sot,
        "begin_suppress_tokens": [220, eot],
        "torch_dtype": dt_name,
    }
    json.dump(config, open(os.path.join(a.out_dir, "config.json"), "w"), indent=2)
    gen = {
        "decoder_start_token_id": sot,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "no_timestamps_token_id": no_ts,
        "is_multilingual": multilingual,
        "max_length": config["max_target_positions"],
        "max_initial_timestamp_index": 50,
        "begin_suppress_tokens": ct2_cfg.get("suppress_ids_begin", [220, eot]),
        "suppress_tokens": ct2_cfg.get("suppress_ids", []),
    }
    if "alignment_heads" in ct2_cfg:
        gen["alignment_heads"] = ct2_cfg["alignment_heads"]
    json.dump(gen, open(os.path.join(a.out_dir, "generation_config.json"), "w"), indent=2)
    json.dump(
        {
            "feature_extractor_type": "WhisperFeatureExtractor",
            "processor_class": "WhisperProcessor",
            "feature_size": n_mels,
            "sampling_rate": 16000,
            "hop_length": 160,
            "n_fft": 400,
            "chunk_length": 30,
            "n_samples": 480000,
            "nb_max_frames": 3000,
            "padding_side": "right",
            "padding_value": 0.0,
            "return_attention_mask": False,
        },
        open(os.path.join(a.out_dir, "preprocessor_config.json"), "w"),
        indent=2,
    )
    shutil.copy(os.path.join(a.model_dir, "tokenizer.json"), os.path.join(a.out_dir, "tokenizer.json"))

    names = sorted(tensors)
    if a.shards <= 1:
        write_safetensors(os.path.join(a.out_dir, "model.safetensors"), tensors, a.dtype)
        return
    per = -(-len(names) // a.shards)
    weight_map, total = {}, 0
    for s in range(a.shards):
        part = names[s * per:(s + 1) * per]
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, a.shards)
        total += write_safetensors(os.path.join(a.out_dir, fname), {n: tensors[n] for n in part}, a.dtype)
        weight_map.update({n: fname for n in part})
    json.dump(
        {"metadata": {"total_size": total}, "weight_map": weight_map},
        open(os.path.join(a.out_dir, "model.safetensors.index.json"), "w"),
        indent=2,
    )


if __name__ == "__main__":
    main()
