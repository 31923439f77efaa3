#!/usr/bin/env python3
"""Generate the reference fixtures for crates/kiln-quant/tests/reference.rs.

Run from the repository root:

    pip install numpy gguf==0.19.0
    python3 tools/gen_quant_fixtures.py            # writes crates/kiln-quant/tests/fixtures/*.json
    python3 tools/gen_quant_fixtures.py --check    # regenerate in memory, diff against the files

The committed fixtures were made with gguf 0.19.0 and numpy 2.4. Output is deterministic
(fixed seeds, one generator per format), so re-running with the same versions reproduces
the files byte for byte; the script refuses another gguf version unless --any-version.

Every fixture is one JSON file per format:

    {"format": "Q4_0", "type_id": 2, "block_size": 32, "type_size": 18,
     "gguf_version": ..., "numpy_version": ..., "seed": ...,
     "cases": [{"name": ..., "rows": R, "n_per_row": N,
                "input_f32": [hex per row],        # only where gguf.quants quantizes
                "quantized": [hex per row],
                "dequantized_f32": [hex per row]}]}

Floats are stored as the hex of their little-endian f32 bytes so every bit (signed
zeros, infinities, NaN payloads) survives. Cases:

- "python_quantized": awkward f32 rows (zeros, a constant block, all-negative, large
  and tiny magnitudes, exact rounding ties, ...) -> gguf.quants.quantize -> bytes ->
  gguf.quants.dequantize. Only for the formats gguf.quants can quantize.
- "random_blocks": random but valid block bytes (f16 scale fields set from real finite
  floats, a few set to 0, -0, subnormal and the largest f16) -> gguf.quants.dequantize.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

GGUF_VERSION = "0.19.0"
SEED = 0x6B696C6E  # "kiln"
OUT_DIR = Path(__file__).resolve().parent.parent / "crates" / "kiln-quant" / "tests" / "fixtures"

# Formats gguf.quants can quantize (F32/F16 are plain casts there).
QUANTIZABLE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
# Formats it can only dequantize.
DEQUANT_ONLY = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]

# Byte offsets of the f16 scale fields in one block of each format.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


def gguf_version() -> str:
    try:
        from importlib.metadata import version

        return version("gguf")
    except Exception:  # pragma: no cover - metadata missing
        return getattr(gguf, "__version__", "unknown")


def f32_hex(a: np.ndarray) -> str:
    return np.ascontiguousarray(a, dtype="<f4").tobytes().hex()


def rows_hex(a: np.ndarray, f32: bool) -> list[str]:
    return [f32_hex(r) if f32 else np.ascontiguousarray(r, dtype=np.uint8).tobytes().hex() for r in a]


# ------------------------------------------------------------------ inputs


def awkward_blocks(rng: np.random.Generator, block: int) -> list[np.ndarray]:
    """Blocks of `block` f32 values that stress scale choice and rounding."""
    n = block
    g = lambda s=1.0: (rng.standard_normal(n) * s).astype(np.float32)  # noqa: E731
    out = [
        np.zeros(n, np.float32),  # all zero: d = 0, no division by zero
        np.full(n, -0.0, np.float32),  # all negative zero (sign of d and m)
        np.full(n, 0.7, np.float32),  # constant: max == min
        -np.abs(g()),  # all negative
        g(1e4),  # large, still finite in f16 after scaling
        g(1e-6),  # tiny: scales underflow to f16 subnormals or zero
        g(1e-9),  # tinier: scales flush to zero in f16
        g(),
        g(3.0),
    ]
    # Exact rounding ties on a grid where the scale is exactly 1 (Q4_0: max -8,
    # Q5_0: max -16, Q8_0: max 127) or simple (Q4_1/Q5_1: integer range).
    for top in (-8.0, -16.0, 127.0):
        lim = abs(top)
        t = rng.integers(-2 * int(lim), 2 * int(lim) + 1, n).astype(np.float32) * 0.5
        t[rng.integers(n)] = top
        out.append(t)
    # One spike among small values; equal magnitudes of both signs (first one wins).
    s = g(0.01)
    s[rng.integers(n)] = 50.0
    out.append(s)
    tie = g()
    tie[3], tie[n - 2] = 4.0, -4.0
    out.append(tie)
    return out


def quant_input(rng: np.random.Generator, qt: T) -> np.ndarray:
    block, _ = gguf.GGML_QUANT_SIZES[qt]
    if block == 1:
        return float_input(rng, qt)
    n_per_row = 8 * block
    blocks = awkward_blocks(rng, block)
    # Fill to whole rows with blocks of random magnitude (log-uniform 1e-3 .. 1e3).
    rows = -(-len(blocks) // 8) + 2
    while len(blocks) < rows * 8:
        scale = 10.0 ** rng.uniform(-3, 3)
        blocks.append((rng.standard_normal(block) * scale).astype(np.float32))
    return np.concatenate(blocks).reshape(rows, n_per_row)


def float_input(rng: np.random.Generator, qt: T) -> np.ndarray:
    """Values for F32/F16/BF16: specials, rounding ties, overflow, subnormals."""
    f = np.float32
    bits = lambda u: np.array([u], np.uint32).view(np.float32)[0]  # noqa: E731
    special = [
        0.0, -0.0, 1.0, -1.0, 0.5, 3.14159265, 65504.0, 65519.99, 65520.0, 1e5, -1e5,
        6e-8, 2.98e-8, 2.9802322e-8, 5.96e-8, 1e-10, 3.0e38, -3.0e38,
        float("inf"), float("-inf"), float("nan"),
        1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, -(1.0 + 2.0**-11),  # f16 ties
        bits(0x3F808000), bits(0x3F818000), bits(0x3F808001), bits(0xBF808000),  # bf16 ties
        bits(0x7F7FFFFF), bits(0x00000001), bits(0x80800000), bits(0x7F7F8000),
    ]
    if qt != T.F16:
        # NaN payloads survive F32 and are kept (quieted) by BF16. F16 leaves them out:
        # float16 narrowing of a payload NaN is not pinned down across implementations.
        special += [bits(0x7F800001), bits(0x7FA12345), bits(0xFFC00001)]
    vals = np.array(special, f)
    n_per_row = 64
    normal = [rng.standard_normal(n_per_row) * 10.0 ** rng.uniform(-6, 6) for _ in range(3)]
    raw = rng.integers(0, 2**32, n_per_row, dtype=np.uint64).astype(np.uint32).view(np.float32)
    raw = np.where(np.isnan(raw), f(1.5), raw)  # random bit patterns, minus NaNs
    pad = np.zeros(n_per_row - len(vals) % n_per_row if len(vals) % n_per_row else 0, f)
    return np.concatenate([vals, pad, *normal, raw]).astype(f).reshape(-1, n_per_row)


# ------------------------------------------------------------------ random blocks


def random_f16(rng: np.random.Generator, count: int) -> np.ndarray:
    """Finite f16 scales: mostly modest, with 0, -0, a subnormal and the extremes."""
    v = (rng.standard_normal(count) * 10.0 ** rng.uniform(-4, 1, count)).astype(np.float16)
    special = np.array([0.0, -0.0, 6e-8, 65504.0, -65504.0, 1.0], np.float16)
    k = min(count, len(special))
    v[rng.choice(count, k, replace=False)] = special[:k]
    return v


def random_blocks(rng: np.random.Generator, qt: T, n_blocks: int) -> np.ndarray:
    block, type_size = gguf.GGML_QUANT_SIZES[qt]
    if block == 1:
        if qt == T.F16:
            u = rng.integers(0, 2**16, n_blocks, dtype=np.uint32).astype(np.uint16)
            nan = (u & 0x7C00) == 0x7C00
            nan &= (u & 0x03FF) != 0
            u = np.where(nan, np.uint16(0x3C00), u).astype(np.uint16)  # no NaNs for F16
            return u.view(np.uint8).reshape(n_blocks, 2)
        width = 4 if qt == T.F32 else 2
        return rng.integers(0, 256, (n_blocks, width), dtype=np.uint64).astype(np.uint8)
    b = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint64).astype(np.uint8)
    for off in F16_FIELDS[qt]:
        b[:, off : off + 2] = random_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return b


# ------------------------------------------------------------------ fixtures


def fixture(qt: T) -> dict:
    block, type_size = gguf.GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng([SEED, int(qt)])
    cases = []

    if qt in QUANTIZABLE:
        x = quant_input(rng, qt)
        q = quants.quantize(x, qt).view(np.uint8).reshape(x.shape[0], -1)
        y = quants.dequantize(q, qt).astype(np.float32, copy=False).reshape(x.shape)
        cases.append(
            {
                "name": "python_quantized",
                "rows": int(x.shape[0]),
                "n_per_row": int(x.shape[1]),
                "input_f32": rows_hex(x, True),
                "quantized": rows_hex(q, False),
                "dequantized_f32": rows_hex(y, True),
            }
        )

    rows, blocks_per_row = (4, 2) if block == 256 else (4, 8) if block == 32 else (4, 64)
    b = random_blocks(rng, qt, rows * blocks_per_row).reshape(rows, -1)
    y = quants.dequantize(b, qt).astype(np.float32, copy=False).reshape(rows, -1)
    cases.append(
        {
            "name": "random_blocks",
            "rows": rows,
            "n_per_row": blocks_per_row * block,
            "quantized": rows_hex(b, False),
            "dequantized_f32": rows_hex(y, True),
        }
    )

    return {
        "format": qt.name,
        "type_id": int(qt),
        "block_size": block,
        "type_size": type_size,
        "gguf_version": gguf_version(),
        "numpy_version": np.__version__.rsplit(".", 1)[0],
        "seed": SEED,
        "cases": cases,
    }


def render(fx: dict) -> str:
    return json.dumps(fx, indent=1) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    ap.add_argument("--any-version", action="store_true", help=f"allow a gguf other than {GGUF_VERSION}")
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    args = ap.parse_args()

    if gguf_version() != GGUF_VERSION and not args.any_version:
        print(f"gguf {gguf_version()} installed, fixtures are pinned to {GGUF_VERSION}", file=sys.stderr)
        return 2

    np.seterr(all="ignore")  # overflow to inf in the F16/BF16 casts is part of the test
    args.out.mkdir(parents=True, exist_ok=True)
    stale = 0
    for qt in QUANTIZABLE + DEQUANT_ONLY:
        path = args.out / f"{qt.name.lower()}.json"
        text = render(fixture(qt))
        if args.check:
            same = path.exists() and path.read_text() == text
            stale += not same
            print(f"{'ok   ' if same else 'STALE'} {path.name}")
        else:
            path.write_text(text)
            print(f"wrote {path.name} ({len(text)} bytes)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
