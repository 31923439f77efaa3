#!/usr/bin/env bash
# Calibrated mixes (`kiln quantize --calibrate`) against plain types on SmolLM2-135M-Instruct.
# The source is the catalog GGUF (Q4_1 matrices, Q8_0 embeddings): its dequantized weights
# are the reference every file is requantized from. Perplexity on a held-out text
# (tools/text/eval_en.txt), the mix chosen on another (tools/text/calibration_en.txt).
# Usage: tools/bench_calibrate.sh [OUT_DIR]   (every command under the shared build lock)
set -euo pipefail
M=${M:-$HOME/.cache/kiln/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${1:-/tmp/calib}
LLAMA=${LLAMA:-/work/peers/llama.cpp/build/bin}
KILN=./target/release/kiln
L="flock /tmp/kiln-build.lock"
mkdir -p "$OUT"
CAND=q4_0,q4_1,q4_k,q5_0,q5_1,q5_k,q6_k,q8_0
for b in 4.5 5.0 5.5 6.0; do
  $L $KILN quantize "$M" "$OUT/mix-$b.gguf" --calibrate tools/text/calibration_en.txt \
    --target-bpw $b --candidates $CAND --table "$OUT/smollm2-table.json" --no-eval -t 2 \
    > "$OUT/mix-$b.txt"
done
# Without the source's own format (Q4_1): the same measurements less that column.
python3 - "$OUT" <<'PY'
import json, sys
t = json.load(open(f"{sys.argv[1]}/smollm2-table.json"))
for x in t["tensors"]:
    x["choices"] = [c for c in x["choices"] if c["type"] != "Q4_1"]
json.dump(t, open(f"{sys.argv[1]}/smollm2-table-noq41.json", "w"), indent=1)
PY
for b in 5.0 5.5 6.0; do
  $L $KILN quantize "$M" "$OUT/mixnoq41-$b.gguf" --calibrate tools/text/calibration_en.txt \
    --target-bpw $b --candidates ${CAND/q4_1,/} --table "$OUT/smollm2-table-noq41.json" \
    --eval tools/text/eval_en.txt -t 2 > "$OUT/mixnoq41-$b.txt"
done
for t in q4_0 q4_1 q4_k q4_k_m q5_0 q5_1 q8_0; do
  $L $KILN quantize "$M" "$OUT/plain-$t.gguf" --type $t 2>/dev/null
done
bpw() {  # bits per weight over the 2-D tensors, as llama.cpp counts matrices
  python3 - "$1" <<'PY'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
t = [x for x in r.tensors if len(x.shape) == 2]
print(f"{8 * sum(int(x.n_bytes) for x in t) / sum(int(x.n_elements) for x in t):.4f}")
PY
}
ppl() { $L "$@" 2>&1 | grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' | sed 's/Final estimate: PPL = //'; }
echo "| file | bpw | kiln PPL | llama-perplexity PPL |"
echo "|---|---|---|---|"
for f in "$M" "$OUT"/plain-*.gguf "$OUT"/mix-*.gguf "$OUT"/mixnoq41-*.gguf; do
  k=$(ppl $KILN perplexity -m "$f" -f tools/text/eval_en.txt -c 512 -t 2)
  l=$( [ -x "$LLAMA/llama-perplexity" ] && ppl "$LLAMA/llama-perplexity" -m "$f" -f tools/text/eval_en.txt -c 512 -t 2 || echo n/a)
  echo "| $(basename "$f") | $(bpw "$f") | $k | $l |"
done
