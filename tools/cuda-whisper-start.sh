#!/usr/bin/env bash
# kiln's Whisper on CUDA beside whisper.cpp's, each process whole (start to exit), on an
# NVIDIA GPU machine: what a user waits for when transcribing one file.
#
# Usage (from the repository root, on the GPU machine):
#   tools/cuda-whisper-start.sh KILN WHISPER_CLI MODEL AUDIO...
#
#   KILN          kiln built with `--features cuda` and KILN_CUDA_ARCHS set (kernels built
#                 ahead of time, so no first-run compile)
#   WHISPER_CLI   whisper.cpp's whisper-cli built with CUDA, its libcudart and libcublas on
#                 LD_LIBRARY_PATH; for example, where no GPU is needed to build it:
#                   cmake -B build-cuda -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
#                       -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
#                       -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release
#                   cmake --build build-cuda --target whisper-cli
#   MODEL         a whisper.cpp ggml file, read by both (e.g. ggml-tiny.en-q8_0.bin)
#   AUDIO         16 kHz WAV files
#   REPS (env)    rounds (default 7); each round runs every binary once on each file
#   BEFORE (env)  another kiln binary, run in the same rounds (an A/B of two builds)
#   THREADS (env) whisper.cpp's -t (default 4)
#
# Both run with their defaults but kiln's VAD off (`--vad off`: whisper.cpp runs none by
# default). Prints every run, then the median of each binary and file and whisper.cpp's
# median over kiln's.
set -euo pipefail
[ $# -ge 4 ] || { sed -n 2,24p "$0"; exit 2; }
KILN=$1 WCLI=$2 MODEL=$3
shift 3
REPS=${REPS:-7} THREADS=${THREADS:-4}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

run() { # label file command...
    local label=$1 f=$2
    shift 2
    local t0 t1
    t0=$(date +%s%N)
    "$@" > /dev/null 2>&1 || { echo "$label $f: failed" >&2; return 1; }
    t1=$(date +%s%N)
    echo "$label $(basename "$f") $(( (t1 - t0) / 1000000 ))" | tee -a "$out"
}

# One untimed run each: page cache and driver state as a user's second run finds them.
for f in "$@"; do
    "$KILN" transcribe -m "$MODEL" --device cuda --vad off "$f" > /dev/null 2>&1
    "$WCLI" -m "$MODEL" -t "$THREADS" -np -f "$f" > /dev/null 2>&1
done
for _ in $(seq "$REPS"); do
    for f in "$@"; do
        [ -z "${BEFORE:-}" ] || run kiln-before "$f" "$BEFORE" transcribe -m "$MODEL" --device cuda --vad off "$f"
        run kiln "$f" "$KILN" transcribe -m "$MODEL" --device cuda --vad off "$f"
        run whisper.cpp "$f" "$WCLI" -m "$MODEL" -t "$THREADS" -np -f "$f"
    done
done
echo "== medians (ms, whole process)"
python3 - "$out" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    label, f, ms = line.split()
    runs.setdefault((f, label), []).append(int(ms))
for f in sorted({f for f, _ in runs}):
    med = {l: statistics.median(v) for (g, l), v in runs.items() if g == f}
    for l, m in sorted(med.items()):
        ratio = f"  whisper.cpp / {l}: {med['whisper.cpp'] / m:.2f}x" if l != "whisper.cpp" else ""
        print(f"{f:<16} {l:<12} {m:7.0f}{ratio}")
EOF
