#!/usr/bin/env bash
# Quantize the tiny Qwen3 fixture with llama.cpp's llama-quantize, for the test that holds
# kiln's quantizer and loader to llama.cpp's files (crates/kiln-cli/tests/hf.rs,
# llama_cpp_quantized_files_read_alike).
#
# Usage: tools/make_llama_cpp_quant_fixtures.sh [LLAMA_QUANTIZE]
#   (default /work/peers/llama.cpp/build/bin/llama-quantize, built by build-llama-cpp.sh)
#
# kiln writes the f16 GGUF (`kiln quantize DIR f16.gguf --type f16`, as the test does too),
# llama-quantize turns it into Q8_0 and Q4_0; only those two small files are committed.
set -euo pipefail
cd "$(dirname "$0")/.."
Q="${1:-/work/peers/llama.cpp/build/bin/llama-quantize}"
OUT=crates/kiln-models/tests/fixtures/llama-cpp
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cargo build --release -p kiln-cli
target/release/kiln quantize crates/kiln-models/tests/fixtures/hf/qwen3 "$TMP/f16.gguf" --type f16
mkdir -p "$OUT"
for t in Q8_0 Q4_0; do
    "$Q" "$TMP/f16.gguf" "$OUT/qwen3-$(echo "$t" | tr 'A-Z' 'a-z').gguf" "$t" 1
done
head -1 "$(dirname "$Q")/../../VERSION" > "$OUT/VERSION" 2>/dev/null || echo "llama-quantize: $Q" > "$OUT/VERSION"
ls -la "$OUT"
