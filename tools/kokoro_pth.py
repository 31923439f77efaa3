#!/usr/bin/env python3
"""Writes Kokoro weights in hexgrad's PyTorch layout, in torch.save's own file format, with the
Python standard library alone (no torch, no numpy). kiln's tests use it to make a
`kokoro-v1_0.pth` (and `.pt` voices) from the weights of the int8 ONNX export, so the checkpoint
reader is exercised on a whole model without the real file.

    tools/kokoro_pth.py model params.safetensors kokoro-v1_0.pth
    tools/kokoro_pth.py voice voices.safetensors af_x.pt      # one tensor: saved bare
    tools/kokoro_pth.py voice voices.safetensors voices.pt    # several: a dict of them

Input: f32 tensors in a safetensors file, under kiln's canonical names (`Params`: hexgrad's
module paths, `bias_l0` for an LSTM's summed biases, convolutions with plain `weight`).

Output (`model`): `{bert, bert_encoder, predictor, text_encoder, decoder}`, each an OrderedDict
state dict (with torch's `_metadata`) whose keys start with `module.`, as hexgrad's checkpoint
is laid out:
- weight-normed convolutions (those hexgrad's modules wrap in `weight_norm`) as `weight_g`
  (out, 1, ..) = |w| per output slice and `weight_v` = 2 w, so g v / |v| = w;
- LSTM biases split into `bias_ih_l0` and `bias_hh_l0` (halves; exact in binary floating point);
- each AdaIN's instance-norm affine `norm.weight` = 1, `norm.bias` = 0;
- ALBERT's unused pooler and its `position_ids` buffer (int64);
- the export's own iSTFT constants left out.

File format (as torch 2.x writes it): a zip archive of stored members `<stem>/data.pkl` (pickle
protocol 2; storages as persistent ids `('storage', torch.FloatStorage, key, 'cpu', numel)`,
tensors as `torch._utils._rebuild_tensor_v2`), `.format_version`, `.storage_alignment`,
`byteorder`, `data/<key>`, `version`, `.data/serialization_id`; local headers without sizes
(flag bit 3, data descriptors after the data), padded with an extra field so every member's data
starts on a 64-byte boundary; a ZIP64 end of central directory.
"""
import collections
import json
import math
import operator
import os
import pickle
import re
import struct
import sys
import types
import zlib
from array import array

# Stand-ins for the torch names the pickle refers to (pickle checks a global is importable).
_torch = types.ModuleType("torch")
_utils = types.ModuleType("torch._utils")


def _rebuild_tensor_v2(*args):
    raise RuntimeError("only written here")


_rebuild_tensor_v2.__module__ = "torch._utils"
_utils._rebuild_tensor_v2 = _rebuild_tensor_v2
_torch._utils = _utils


def _storage_class(name):
    c = type(name, (), {})
    c.__module__ = "torch"
    setattr(_torch, name, c)
    return c


FloatStorage = _storage_class("FloatStorage")
LongStorage = _storage_class("LongStorage")
sys.modules.setdefault("torch", _torch)
sys.modules.setdefault("torch._utils", _utils)


class Storage:
    def __init__(self, kind, data, numel):
        self.kind, self.data, self.numel = kind, data, numel


class Tensor:
    """A contiguous tensor over its own storage."""

    def __init__(self, shape, data, kind=FloatStorage):
        numel = math.prod(shape)
        self.shape = tuple(shape)
        self.storage = Storage(kind, data, numel)

    def __reduce_ex__(self, protocol):
        stride, acc = [], 1
        for d in reversed(self.shape):
            stride.insert(0, acc)
            acc *= d
        args = (self.storage, 0, self.shape, tuple(stride), False, collections.OrderedDict())
        return (_rebuild_tensor_v2, args)


class Saver(pickle.Pickler):
    def __init__(self, f):
        super().__init__(f, protocol=2)
        self.keys = {}

    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            key = self.keys.setdefault(id(obj), (str(len(self.keys)), obj))[0]
            return ("storage", obj.kind, key, "cpu", obj.numel)
        return None


def save(obj, path):
    """torch.save(obj, path) for objects made of dicts and the Tensors above."""
    import io

    buf = io.BytesIO()
    saver = Saver(buf)
    saver.dump(obj)
    stem = os.path.splitext(os.path.basename(path))[0]
    members = [
        ("data.pkl", buf.getvalue()),
        (".format_version", b"1"),
        (".storage_alignment", b"64"),
        ("byteorder", b"little"),
    ]
    for key, storage in sorted(saver.keys.values(), key=lambda kv: int(kv[0])):
        members.append((f"data/{key}", storage.data))
    members.append(("version", b"3\n"))
    digest = zlib.crc32(b"".join(d for _, d in members))
    members.append((".data/serialization_id", f"{digest:040d}".encode()))
    with open(path, "wb") as f:
        write_zip(f, [(f"{stem}/{n}", d) for n, d in members])


def write_zip(f, members):
    central = []
    pos = 0
    for name, data in members:
        nb = name.encode()
        # Pad the local header with an extra field ('FB', filled with 'Z') to align the data.
        pad = (-(pos + 30 + len(nb) + 4)) % 64
        crc = zlib.crc32(data)
        head = struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, 0x0808, 0, 0, 0, 0, 0, 0, len(nb), pad + 4)
        f.write(head + nb + struct.pack("<HH", 0x4246, pad) + b"Z" * pad)
        f.write(data)
        f.write(struct.pack("<IIII", 0x08074B50, crc, len(data), len(data)))
        central.append(
            struct.pack(
                "<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, 0x0808, 0, 0, 0, crc, len(data),
                len(data), len(nb), 0, 0, 0, 0, 0, pos,
            )
            + nb
        )
        pos += 30 + len(nb) + 4 + pad + len(data) + 16
    cd = b"".join(central)
    n = len(members)
    f.write(cd)
    eocd64 = pos + len(cd)
    f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 0x2D, 0, 0, n, n, len(cd), pos))
    f.write(struct.pack("<IIQI", 0x07064B50, 0, eocd64, 1))
    f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(cd), pos, 0))


def read_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8 : 8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            sys.exit(f"{path}: '{name}' is {t['dtype']}, only F32 is read")
        a, e = t["data_offsets"]
        out[name] = (t["shape"], b[8 + n + a : 8 + n + e])
    return out


WEIGHT_NORMED = re.compile(
    r"^(text_encoder\.cnn\.\d+\.0"
    r"|predictor\.(F0|N)\.\d+\.(conv1|conv2|conv1x1|pool)"
    r"|decoder\.(encode|decode\.\d+)\.(conv1|conv2|conv1x1|pool)"
    r"|decoder\.generator\.(resblocks|noise_res)\.\d+\.convs[12]\.\d+"
    r"|decoder\.generator\.(ups\.\d+|conv_post)"
    r"|decoder\.(F0_conv|N_conv|asr_res\.0))\.weight$"
)
ADAIN = re.compile(r"\.(norm1|norm2|adain1\.\d+|adain2\.\d+)\.fc\.weight$")
SECTIONS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")


def f32(values):
    return array("f", values).tobytes()


def weight_norm(shape, data):
    w = array("f", data)
    out = shape[0]
    inner = len(w) // out
    g = array("f")
    for o in range(out):
        row = w[o * inner : (o + 1) * inner]
        g.append(math.sqrt(math.fsum(map(operator.mul, row, row))))
    v = array("f", map((2.0).__mul__, w))
    return (Tensor([out] + [1] * (len(shape) - 1), g.tobytes()), Tensor(shape, v.tobytes()))


def model(src, dst):
    params = read_safetensors(src)
    state = {s: collections.OrderedDict() for s in SECTIONS}
    for name, (shape, data) in params.items():
        if ".istft." in name or name.startswith("decoder.generator.istft."):
            continue
        section, _, rest = name.partition(".")
        if section not in state or not rest:
            sys.exit(f"{src}: '{name}' is outside hexgrad's modules")
        sd = state[section]
        key = "module." + rest
        if WEIGHT_NORMED.match(name):
            g, v = weight_norm(shape, data)
            sd[key[: -len("weight")] + "weight_g"] = g
            sd[key[: -len("weight")] + "weight_v"] = v
        elif re.search(r"\.bias_l0(_reverse)?$", name):
            half = f32(x * 0.5 for x in array("f", data))
            sd[key.replace(".bias_l0", ".bias_ih_l0")] = Tensor(shape, half)
            sd[key.replace(".bias_l0", ".bias_hh_l0")] = Tensor(shape, half)
        else:
            sd[key] = Tensor(shape, data)
            if ADAIN.search(name):
                c = shape[0] // 2
                base = key[: -len("fc.weight")]
                sd[base + "norm.weight"] = Tensor([c], f32([1.0] * c))
                sd[base + "norm.bias"] = Tensor([c], f32([0.0] * c))
    bert = state["bert"]
    h = params["bert_encoder.weight"][0][1]
    bert["module.pooler.weight"] = Tensor([h, h], bytes(4 * h * h))
    bert["module.pooler.bias"] = Tensor([h], bytes(4 * h))
    n_pos = params["bert.embeddings.position_embeddings.weight"][0][0]
    bert["module.embeddings.position_ids"] = Tensor(
        [1, n_pos], array("q", range(n_pos)).tobytes(), LongStorage
    )
    for sd in state.values():
        sd._metadata = collections.OrderedDict([("", {"version": 1})])
    save(state, dst)


def voice(src, dst):
    tensors = read_safetensors(src)
    voices = {n: Tensor(s, d) for n, (s, d) in tensors.items()}
    save(next(iter(voices.values())) if len(voices) == 1 else voices, dst)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("model", "voice"):
        sys.exit(__doc__)
    {"model": model, "voice": voice}[sys.argv[1]](sys.argv[2], sys.argv[3])
