#!/usr/bin/env bash
# `kiln serve --device cuda` beside llama-server on the same GGUF file, on an NVIDIA GPU
# machine, in one sitting: aggregate decode of N concurrent streamed /v1/completions
# requests (temperature 0, 128 tokens each; tools/bench_server.py), the servers alternated.
#
# Usage (from the repository root, on the GPU machine):
#   tools/cuda-serve-bench.sh KILN LLAMA_SRC_TGZ TOKENIZERS_TGZ GGUF_WHEEL
#
#   KILN, LLAMA_SRC_TGZ, TOKENIZERS_TGZ, GGUF_WHEEL   as for tools/cuda-bench.sh (the
#                   llama.cpp source must hold tools/server and tools/ui's CMake files)
#   SHAPE, QUANT    (env) the file: SHAPE-shape-QUANT.gguf written by make_bench_models.py
#                   with `kiln quantize` (default qwen3-0.6b, Q4_0)
#   STREAMS         (env) concurrencies, comma-separated (default 1,4,16,32,64)
#   PARALLEL, CTX   (env) slots of both servers and tokens a slot (default 64, 1024)
#   ROUNDS, R       (env) rounds of both servers in turn, repetitions a row (default 2, 5;
#                   the rows are medians)
#   TESTS           (env) optional: a directory of kiln-cuda test binaries (`ops`, `models`,
#                   `scheduler`, `conformance`: those present), run --ignored while
#                   llama.cpp builds
#   SERVERS         (env) which servers run (default "kiln llama"; "base" adds the kiln
#                   binary $KILN_BASE, an earlier build, as "kiln-base")
#   STAGE=build     (env) build llama-server only (start it with setsid in one call, run
#                   the table in the next on the same warm machine: this waits for it)
#
# llama-server runs with -ngl 99 -fa on -np PARALLEL -c PARALLEL*CTX (each slot CTX tokens,
# as kiln's --parallel PARALLEL -c CTX), no web UI. `kiln bench --device cuda` tg128 on the
# same file is printed first: one stream through HTTP against it. Results: tables on stdout,
# JSON lines in $OUT (serve.jsonl, kiln-bench.jsonl).
set -euo pipefail
KILN="$(realpath "$1")"; SRC="$2"; TOK="$3"; WHEEL="$4"
SHAPE="${SHAPE:-qwen3-0.6b}"; QUANT="${QUANT:-Q4_0}"
STREAMS="${STREAMS:-1,4,16,32,64}"
PARALLEL="${PARALLEL:-64}"; CTX="${CTX:-1024}"
ROUNDS="${ROUNDS:-2}"; R="${R:-5}"
JOBS="$(nproc)"
HERE="$(cd "$(dirname "$0")" && pwd)"
export KILN_HOME="${KILN_HOME:-/tmp/kiln-home}"
WORK="${WORK:-/tmp/kiln-serve-bench}"
OUT="${OUT:-$WORK/out}"
mkdir -p "$WORK" "$OUT" "$KILN_HOME/models"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

LS="$WORK/lc/build/bin/llama-server"
build_server() {
    mkdir -p "$WORK/lc" && tar xzf "$SRC" -C "$WORK/lc"
    local t0; t0=$(date +%s)
    cmake -S "$WORK/lc/src" -B "$WORK/lc/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_NUMBER=11312 -DLLAMA_BUILD_COMMIT=0c1e57098 > "$WORK/cmake.log" 2>&1
    cmake --build "$WORK/lc/build" -j "$JOBS" --target llama-server > "$WORK/build.log" 2>&1 \
        || { echo "llama-server build failed:"; tail -20 "$WORK/build.log"; return 1; }
    echo "llama-server CUDA build: $(( $(date +%s) - t0 )) s"
}
if [ "${STAGE:-all}" = build ]; then
    touch "$WORK/building"
    build_server || true
    rm -f "$WORK/building"
    exit 0
fi
BUILD_PID=""
case " ${SERVERS:-kiln llama} " in
    *" llama "*) [ -x "$LS" ] || [ -e "$WORK/building" ] || { build_server & BUILD_PID=$!; } ;;
esac

# The model, written by kiln quantize while llama.cpp builds.
python3 -m pip install -q --no-index --no-deps --target "$WORK/site" "$WHEEL"
tar xzf "$TOK" -C "$KILN_HOME/models"
q="$(echo "$QUANT" | tr 'A-Z' 'a-z')"
F="$KILN_HOME/bench/$SHAPE-shape-$q.gguf"
if [ ! -s "$F" ]; then
    t0=$(date +%s)
    KILN_QUANTIZE_BIN="$KILN" PYTHONPATH="$WORK/site" python3 "$HERE/make_bench_models.py" \
        "$KILN_HOME/bench" --llama-quantize "$HERE/kiln-as-llama-quantize.sh" --no-verify \
        --no-smollm2 --shapes "$SHAPE" --quants "$QUANT" > "$WORK/models.log" 2>&1 \
        || { echo "writing the model failed:"; tail -5 "$WORK/models.log"; exit 1; }
    rm -f "$KILN_HOME/bench/$SHAPE-shape-f16.gguf"
    echo "$F written in $(( $(date +%s) - t0 )) s"
fi
if [ -n "${TESTS:-}" ]; then
    for t in ops models scheduler conformance; do
        [ -x "$TESTS/$t" ] || continue
        echo "== $t --ignored --test-threads=1"
        { "$TESTS/$t" --ignored --test-threads=1 2>&1 || echo "$t: exit status $?"; } \
            | grep -E "^test |test result|panicked|exit status|equal alone" -A2 || true
    done
fi
[ -n "$BUILD_PID" ] && wait "$BUILD_PID"
case " ${SERVERS:-kiln llama} " in
    *" llama "*) while [ -e "$WORK/building" ]; do sleep 2; done ;;
esac

echo "== kiln bench --device cuda (tg128, the single-stream reference)"
"$KILN" bench --device cuda -m "$F" -p 512 -n 128 -r 5 --json | tee -a "$OUT/kiln-bench.jsonl"

# Waits until the server at port $1 answers /health (or its process $2 ends).
wait_ready() {
    for _ in $(seq 600); do
        python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
            "http://127.0.0.1:$1/health" > /dev/null 2>&1 && return 0
        kill -0 "$2" 2> /dev/null || return 1
        sleep 0.2
    done
    return 1
}
# kiln serve from binary $2 under the name $3 (round $1).
run_kiln() {
    "$2" serve --device cuda -m "$F" --parallel "$PARALLEL" -c "$CTX" --max-queue 1024 \
        --port 18180 --no-audio > "$WORK/$3-serve.log" 2>&1 & local p=$!
    if wait_ready 18180 $p; then
        echo "== $3 serve --device cuda --parallel $PARALLEL -c $CTX (round $1)"
        python3 "$HERE/bench_server.py" --url http://127.0.0.1:18180 --streams "$STREAMS" \
            -n 128 -r "$R" --stat median --json "$OUT/serve.jsonl" --label "$3" \
            || { grep -iE -m 5 "panic|error" "$WORK/$3-serve.log" || true; }
    else
        echo "$3 serve did not start:"; tail -5 "$WORK/$3-serve.log"
    fi
    kill $p 2> /dev/null; wait $p 2> /dev/null || true
}
run_llama() {
    "$LS" -m "$F" -ngl 99 -fa on -np "$PARALLEL" -c $(( PARALLEL * CTX )) --port 18181 \
        > "$WORK/llama-server.log" 2>&1 & local p=$!
    if wait_ready 18181 $p; then
        echo "== llama-server -ngl 99 -fa on -np $PARALLEL -c $(( PARALLEL * CTX )) (round $1)"
        python3 "$HERE/bench_server.py" --url http://127.0.0.1:18181 --streams "$STREAMS" \
            -n 128 -r "$R" --stat median --json "$OUT/serve.jsonl" --label llama-server \
            || { tail -5 "$WORK/llama-server.log" || true; }
    else
        echo "llama-server did not start:"; tail -5 "$WORK/llama-server.log"
    fi
    kill $p 2> /dev/null; wait $p 2> /dev/null || true
}
for round in $(seq "$ROUNDS"); do
    case " ${SERVERS:-kiln llama} " in *" kiln "*) run_kiln "$round" "$KILN" kiln ;; esac
    case " ${SERVERS:-kiln llama} " in *" base "*) run_kiln "$round" "$KILN_BASE" kiln-base ;; esac
    case " ${SERVERS:-kiln llama} " in *" llama "*) [ -x "$LS" ] && run_llama "$round" ;; esac
done
# The side-by-side table: per concurrency the median over rounds of each server's medians.
python3 - "$OUT/serve.jsonl" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault((r["streams"], r["server"]), []).append(r["aggregate"])
nan = float("nan")
med = lambda k, s: statistics.median(by.get((k, s), [nan]))
print("| streams | llama-server tok/s | kiln-base tok/s | kiln serve tok/s | kiln / llama-server |")
print("|---:|---:|---:|---:|---:|")
for k in sorted({s for s, _ in by}):
    a, b, c = med(k, "llama-server"), med(k, "kiln-base"), med(k, "kiln")
    print(f"| {k} | {a:.1f} | {b:.1f} | {c:.1f} | {c / a:.2f}x |")
EOF
