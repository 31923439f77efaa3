#!/usr/bin/env bash
# kiln's CUDA backend beside llama.cpp's, on an NVIDIA GPU machine, in one sitting.
#
# Usage (from the repository root, on the GPU machine):
#   tools/cuda-bench.sh KILN LLAMA_SRC_TGZ TOKENIZERS_TGZ GGUF_WHEEL [SHAPES]
#
#   KILN            a kiln binary built with `cargo build --release -p kiln-cli --features cuda`
#   LLAMA_SRC_TGZ   llama.cpp's source (tools/build-llama-cpp.sh unpacks the pinned one),
#                   without its docs and vocabulary files so it travels small:
#                   tar czf llama-src.tgz -C /work/peers/llama.cpp --anchored \
#                       --exclude=src/docs --exclude=src/models --exclude=src/benches \
#                       --exclude=src/tests src
#   TOKENIZERS_TGZ  $KILN_HOME/models/{qwen3-tokenizer,llama3.2-tokenizer} as a tarball
#                   (tools/make_bench_models.py embeds them)
#   GGUF_WHEEL      the `gguf` Python package's wheel (pip download gguf==0.19.0)
#   SHAPES          shapes in order, each with its types after a colon, space-separated
#                   (default "qwen3-0.6b:Q4_0,Q8_0,Q4_K_M"; also qwen3-4b, llama3.2-3b)
#   TESTS (env)     optional: a directory with the `ops` and `models` test binaries of
#                   kiln-cuda, run while the files are written (the GPU is idle then)
#   DEPTHS (env)    cache depths every test runs at, comma-separated (both engines' -d;
#                   default 0; e.g. 0,4096,16384)
#   REPS (env)      repetitions of each test, both engines (default 5: compare medians or
#                   best samples; llama-bench's first repetition is its slowest)
#   PP (env)        the prompt test's length (default 512; 0: decode rows only)
#   GPU (env)       text the GPU's name must hold (e.g. H200): on another card the script
#                   stops before any work, exit status 3
#   A rerun on the same machine (a call that ran out of time, then the next) skips the
#   files whose rows both engines already wrote ($WORK/rows) and prints the whole table.
#   LLAMA_BENCH     (env) a llama-bench built elsewhere (CUDA, this GPU's architecture, its
#                   libcudart and libcublas on LD_LIBRARY_PATH; with
#                   QUANTIZE=kiln nothing else of llama.cpp is needed): no build here, and
#                   LLAMA_SRC_TGZ is not read. llama.cpp builds without a GPU with NVIDIA's
#                   PyPI compiler (nvidia-cuda-nvcc, -runtime, -cublas, -cccl) and
#                   -DGGML_CUDA_NO_VMM=ON where no libcuda is there to link
#   PREPARE_ONLY=1  (env) build llama.cpp and write the files only; files already written
#                   (in $KILN_HOME/bench) are kept, and an existing build is reused
#
# llama.cpp is built with CUDA for sm_90 (GGML_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=90) and run
# with flash attention on and every layer on the GPU (-fa 1 -ngl 99); both engines run
# pp512 and tg128, REPS repetitions after a warm-up, on the same GGUF files (random weights
# of the exact shapes, written by tools/make_bench_models.py: Q4_0 from random blocks
# directly, with QUANTIZE=kiln Q4_K_M too, the other types quantized by llama-quantize or
# kiln from an f16 file).
# kiln measures the GPU's memory read bandwidth first (`--membw`), and its decode cells show
# their effective GB/s as a share of it.
# Results: markdown tables on stdout and, with $OUT set, JSON lines in $OUT.
set -euo pipefail
KILN="$1"; SRC="$2"; TOK="$3"; WHEEL="$4"
SHAPES="${5:-qwen3-0.6b:Q4_0,Q8_0,Q4_K_M}"
DEPTHS="${DEPTHS:-0}"
REPS="${REPS:-5}"
JOBS="$(nproc)"
export KILN_HOME="${KILN_HOME:-/tmp/kiln-home}"
WORK="${WORK:-/tmp/kiln-cuda-bench}"
OUT="${OUT:-$WORK/out}"
mkdir -p "$WORK" "$OUT" "$KILN_HOME/models"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ -n "${GPU:-}" ] && ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q "$GPU"; then
    echo "cuda-bench: this GPU is not an $GPU: nothing run" >&2
    exit 3
fi
PP="${PP:-512}"

# The quantizer of the benchmark files: llama.cpp's llama-quantize (default; it waits for the
# build), or QUANTIZE=kiln: `kiln quantize` (tools/kiln-as-llama-quantize.sh), so the files
# are written while llama.cpp builds. Either way both engines run the same files.
build_llama() {
    mkdir -p "$WORK/lc" && tar xzf "$SRC" -C "$WORK/lc"
    t0=$(date +%s)
    cmake -S "$WORK/lc/src" -B "$WORK/lc/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_NUMBER=11312 -DLLAMA_BUILD_COMMIT=0c1e57098 > "$WORK/cmake.log"
    cmake --build "$WORK/lc/build" -j "$JOBS" --target llama-bench llama-quantize > "$WORK/build.log"
    echo "llama.cpp CUDA build: $(( $(date +%s) - t0 )) s"
}
LB="${LLAMA_BENCH:-$WORK/lc/build/bin/llama-bench}"
BUILD_PID=""
if [ ! -x "$LB" ]; then
    if [ "${QUANTIZE:-llama}" = kiln ]; then
        build_llama & BUILD_PID=$!
    else
        build_llama
    fi
fi
if [ "${QUANTIZE:-llama}" = kiln ]; then
    QBIN="$(cd "$(dirname "$0")" && pwd)/kiln-as-llama-quantize.sh"
    export KILN_QUANTIZE_BIN="$KILN"
else
    QBIN="$WORK/lc/build/bin/llama-quantize"
fi

python3 -m pip install -q --no-index --no-deps --target "$WORK/site" "$WHEEL"
tar xzf "$TOK" -C "$KILN_HOME/models"
# All files first (while llama.cpp builds, with QUANTIZE=kiln), every shape at once (on the
# H200's machine: 0.6B/4B/3B in 191 s together instead of about 8 minutes one after the
# other), then both engines on each.
write_shape() {
    local s="$1" quants="$2" t0 q missing=0
    for q in ${quants//,/ }; do
        [ -s "$KILN_HOME/bench/$s-shape-$(echo "$q" | tr 'A-Z' 'a-z').gguf" ] || missing=1
    done
    [ "$missing" = 0 ] && { echo "$s: models already written"; return; }
    t0=$(date +%s)
    # Q4_0 straight from random blocks (seconds, no f16 file), and with QUANTIZE=kiln Q4_K_M
    # too (random blocks in kiln quantize's mix); the other types through the f16 file and
    # the quantizer (files already there are kept).
    local direct=() rest=()
    for q in ${quants//,/ }; do
        case "$q:${QUANTIZE:-llama}" in
            Q4_0:*) direct+=(--direct-q4_0) ;;
            Q4_K_M:kiln) direct+=(--direct-q4_k_m) ;;
            *) rest+=("$q") ;;
        esac
    done
    if [ "${#direct[@]}" -gt 0 ]; then
        PYTHONPATH="$WORK/site" python3 tools/make_bench_models.py "$KILN_HOME/bench" \
            "${direct[@]}" --shapes "$s" > "$WORK/models-$s.log" 2>&1 \
            || { echo "$s: writing ${direct[*]} failed:"; tail -5 "$WORK/models-$s.log"; }
    fi
    if [ "${#rest[@]}" -gt 0 ]; then
        local list="${rest[*]}"
        PYTHONPATH="$WORK/site" python3 tools/make_bench_models.py "$KILN_HOME/bench" \
            --llama-quantize "$QBIN" --no-verify --no-smollm2 \
            --shapes "$s" --quants "${list// /,}" >> "$WORK/models-$s.log" 2>&1 \
            || { echo "$s: writing the models failed:"; tail -5 "$WORK/models-$s.log"; }
    fi
    echo "$s: models written in $(( $(date +%s) - t0 )) s"
    rm -f "$KILN_HOME/bench/$s-shape-f16.gguf"
}
WRITERS=()
for spec in $SHAPES; do
    write_shape "${spec%%:*}" "${spec#*:}" & WRITERS+=("$!")
done
# Meanwhile the GPU is idle: with TESTS set (a directory holding the stripped `ops`, `models`
# and `conformance` binaries of `cargo test --release -p kiln-cuda --no-run`), the CUDA tests
# run.
if [ -n "${TESTS:-}" ]; then
    for t in ops models conformance; do
        [ -x "$TESTS/$t" ] || continue
        echo "== $t --ignored --test-threads=1"
        { "$TESTS/$t" --ignored --test-threads=1 2>&1 || echo "$t: exit status $?"; } \
            | grep -E "^test |test result|panicked|exit status" -A2 || true
    done
fi
wait "${WRITERS[@]}"
[ -n "$BUILD_PID" ] && wait "$BUILD_PID"
# PREPARE_ONLY=1: llama.cpp built and the files written, nothing run (a later call on the
# same machine runs the table without either).
[ "${PREPARE_ONLY:-0}" = 1 ] && exit 0
"$LB" --version 2>&1 | head -2
# Each file's rows apart (a rerun skips the files both engines wrote), gathered into $OUT
# after each file, so a call cut short still leaves the rows it made.
ROWS="$WORK/rows"
mkdir -p "$ROWS"
TAGS=()
gather() {
    local t
    : > "$OUT/llama-cpp.jsonl"; : > "$OUT/kiln.jsonl"
    for t in "${TAGS[@]}"; do
        cat "$ROWS/llama-$t.jsonl" >> "$OUT/llama-cpp.jsonl" 2>/dev/null || true
        cat "$ROWS/kiln-$t.jsonl" >> "$OUT/kiln.jsonl" 2>/dev/null || true
    done
}
for spec in $SHAPES; do
    s="${spec%%:*}"; QUANTS="${spec#*:}"
    for q in ${QUANTS//,/ }; do
        name="$s-shape-$(echo "$q" | tr 'A-Z' 'a-z')"
        f="$KILN_HOME/bench/$name.gguf"
        tag="$name-p$PP-d${DEPTHS//,/_}-r$REPS"
        TAGS+=("$tag")
        if [ -s "$ROWS/llama-$tag.jsonl" ] && [ -s "$ROWS/kiln-$tag.jsonl" ]; then
            echo "$name: rows already written"
            continue
        fi
        # (A file an engine failed on keeps no rows of it, so a rerun measures it again.)
        if "$LB" -m "$f" -p "$PP" -n 128 -d "$DEPTHS" -r "$REPS" -fa 1 -ngl 99 -o jsonl \
            2>/dev/null > "$ROWS/llama-$tag.part"; then
            mv "$ROWS/llama-$tag.part" "$ROWS/llama-$tag.jsonl"
        else
            echo "llama-bench failed on $f"
        fi
        if "$KILN" bench --device cuda -m "$f" -p "$PP" -n 128 -d "$DEPTHS" -r "$REPS" --json \
            --membw > "$ROWS/kiln-$tag.part"; then
            mv "$ROWS/kiln-$tag.part" "$ROWS/kiln-$tag.jsonl"
        else
            echo "kiln failed on $f"
        fi
        gather
    done
done
gather
# The side-by-side table.
python3 "$(dirname "$0")/side_by_side.py" "$OUT/llama-cpp.jsonl" "$OUT/kiln.jsonl" \
    "llama.cpp CUDA t/s" "kiln CUDA t/s" "kiln / llama.cpp"
