#!/usr/bin/env bash
# kiln's portable GPU backend (wgpu over Vulkan) beside its CUDA backend, on one NVIDIA GPU
# machine, on the same GGUF files.
#
# Usage (from the repository root, on the GPU machine):
#   tools/gpu-bench.sh KILN [GGUF...]
#
#   KILN   a kiln binary built with both backends:
#          cargo build --release -p kiln-cli --features cuda,gpu
#   GGUF   model files [default: every $KILN_HOME/bench/*-shape-*.gguf, the random-weight
#          files of the real shapes (Qwen3-0.6B, ...) that tools/cuda-bench.sh writes with
#          tools/make_bench_models.py, and the catalog's SmolLM2-135M if it is cached]
#
# Environment:
#   KILN_CUDA        the binary for the CUDA column [default: KILN]
#   ADAPTER          substring of the Vulkan adapter to use [default: NVIDIA]: a run that
#                    finds no such adapter fails and lists the adapters it found, so a
#                    missing NVIDIA Vulkan driver never passes for a result on llvmpipe
#   VK_DRIVER_FILES  honoured by the Vulkan loader as usual. Unset, with no NVIDIA ICD file
#                    in the standard places but the driver's libGLX_nvidia.so.0 present (a
#                    container given the compute capabilities only), one is written to
#                    $WORK/nvidia_icd.json and used
#   LIBVULKAN_DEB    libvulkan1's .deb (apt-get download libvulkan1), unpacked and used when
#                    the machine has no libvulkan.so.1 (the Vulkan loader) of its own
#   REPS, PP, TG     repetitions [3], prompt length [512], decode length [128]
#   OUT              where the JSON lines go [$WORK/out]
#
# Both backends run pp512 and tg128, REPS repetitions after a warm-up; markdown tables on
# stdout, JSON lines in $OUT, then a side-by-side table (wgpu / CUDA).
set -euo pipefail
KILN="$1"; shift
KILN_CUDA="${KILN_CUDA:-$KILN}"
export KILN_HOME="${KILN_HOME:-/tmp/kiln-home}"
WORK="${WORK:-/tmp/kiln-gpu-bench}"
OUT="${OUT:-$WORK/out}"
ADAPTER="${ADAPTER:-NVIDIA}"
REPS="${REPS:-3}"; PP="${PP:-512}"; TG="${TG:-128}"
mkdir -p "$WORK" "$OUT"

command -v nvidia-smi >/dev/null && \
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

# The Vulkan loader.
if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; then
    if [ -n "${LIBVULKAN_DEB:-}" ]; then
        dpkg -x "$LIBVULKAN_DEB" "$WORK/vk"
        lib=$(dirname "$(find "$WORK/vk" -name 'libvulkan.so.1*' | head -1)")
        export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "Vulkan loader: $lib (from $LIBVULKAN_DEB)"
    else
        echo "gpu-bench: no libvulkan.so.1 (the Vulkan loader); install libvulkan1 or set LIBVULKAN_DEB" >&2
        exit 1
    fi
fi
# The NVIDIA ICD: the loader's standard places, else one written next to the driver.
if [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ]; then
    icd=$(ls /etc/vulkan/icd.d/nvidia*.json /usr/share/vulkan/icd.d/nvidia*.json \
        /usr/local/share/vulkan/icd.d/nvidia*.json 2>/dev/null | head -1 || true)
    if [ -z "$icd" ] && ldconfig -p 2>/dev/null | grep -q 'libGLX_nvidia\.so\.0'; then
        icd="$WORK/nvidia_icd.json"
        printf '{"file_format_version":"1.0.1","ICD":{"library_path":"libGLX_nvidia.so.0","api_version":"1.3.0"}}\n' > "$icd"
        export VK_DRIVER_FILES="$icd"
        echo "NVIDIA ICD: written to $icd"
    else
        echo "NVIDIA ICD: ${icd:-none found (the loader searches its defaults)}"
    fi
else
    echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-} VK_ICD_FILENAMES=${VK_ICD_FILENAMES:-}"
fi

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    shopt -s nullglob
    files=("$KILN_HOME"/bench/*-shape-*.gguf)
    shopt -u nullglob
    smol=$(ls "$KILN_HOME"/models/smollm2-135m-instruct/*.gguf 2>/dev/null | head -1 || true)
    [ -n "$smol" ] && files+=("$smol")
fi
if [ ${#files[@]} -eq 0 ]; then
    echo "gpu-bench: no GGUF files (pass them, or run tools/cuda-bench.sh first)" >&2
    exit 1
fi

: > "$OUT/kiln-wgpu.jsonl"
: > "$OUT/kiln-cuda.jsonl"
for f in "${files[@]}"; do
    echo "== $f"
    "$KILN" bench --device gpu --adapter "$ADAPTER" -m "$f" -p "$PP" -n "$TG" -r "$REPS" \
        --json >> "$OUT/kiln-wgpu.jsonl" || echo "kiln --device gpu failed on $f"
    "$KILN_CUDA" bench --device cuda -m "$f" -p "$PP" -n "$TG" -r "$REPS" \
        --json >> "$OUT/kiln-cuda.jsonl" || echo "kiln --device cuda failed on $f"
done
python3 "$(dirname "$0")/side_by_side.py" "$OUT/kiln-cuda.jsonl" "$OUT/kiln-wgpu.jsonl" \
    "kiln CUDA t/s" "kiln wgpu (Vulkan) t/s" "wgpu / CUDA"
