#!/usr/bin/env bash
# Build the llama.cpp peer that kiln is benchmarked against (CPU only).
#
# Usage: tools/build-llama-cpp.sh [DEST]        (DEST default: /work/peers/llama.cpp)
#
# Nothing of llama.cpp lives in this repository: the source comes from the
# PyPI source distribution of llama-cpp-python, which vendors llama.cpp under
# vendor/llama.cpp. The version is pinned so that every run builds the same
# peer; override with LLAMA_CPP_PYTHON_VERSION=x.y.z.
#
#   llama-cpp-python 0.3.36  ->  llama.cpp b11312, commit 0c1e57098
#                                (commit per the sdist's CHANGELOG.md; ggml 0.25.3)
#
# The sdist has no .git, so llama.cpp's own build-info would say
# "build 0, commit unknown"; we pass the release number and commit explicitly,
# and `llama-bench --version` reports them.
#
# Result:
#   DEST/dl/llama_cpp_python-VER.tar.gz   the downloaded sdist
#   DEST/src/                             the vendored llama.cpp source tree
#   DEST/build/bin/llama-bench, llama-quantize, llama-completion, llama-perplexity
#
# Build flags: Release, GGML_NATIVE=ON (-march=native for this host's CPU) minus AMX,
# static libraries, OpenMP on (llama.cpp's default), no network features.
# Environment knobs: JOBS (default 2), NICE (default 10), CMAKE (default cmake).
#
# VULKAN=1 builds the Vulkan peer instead (llama-bench only, GGML_VULKAN=ON, GGML_NATIVE=OFF
# so the binary runs on another machine's CPU; DEST default /work/peers/llama.cpp-vulkan):
# the peer of `kiln bench --device gpu`. It needs glslc and the Vulkan headers (apt-get
# installs glslc and libvulkan-dev when glslc is missing). ggml-vulkan uses
# VK_EXT_layer_settings, which Debian bookworm's headers (1.3.239) lack: newer headers come
# from Debian trixie's libvulkan-dev, unpacked under DEST/vk-headers (nothing installed).
# The binary links libvulkan.so.1 (the loader), which the GPU machine may need carried.
set -euo pipefail

VULKAN="${VULKAN:-0}"
if [ "$VULKAN" = 1 ]; then
    DEST="${1:-/work/peers/llama.cpp-vulkan}"
else
    DEST="${1:-/work/peers/llama.cpp}"
fi
VER="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
# Commit of the llama.cpp that each pinned llama-cpp-python version vendors.
case "$VER" in
    0.3.36) BUILD=11312; COMMIT=0c1e57098 ;;
    *)      BUILD=0;     COMMIT=unknown ;;
esac
JOBS="${JOBS:-2}"
NICE="${NICE:-10}"
CMAKE="${CMAKE:-cmake}"
TARGETS=(llama-bench llama-quantize llama-completion llama-perplexity)
EXTRA=(-DGGML_NATIVE=ON)
if [ "$VULKAN" = 1 ]; then
    TARGETS=(llama-bench)
    EXTRA=(-DGGML_NATIVE=OFF -DGGML_VULKAN=ON)
fi

if ! command -v "$CMAKE" >/dev/null 2>&1; then
    echo "cmake missing: installing it with apt-get" >&2
    apt-get update && apt-get install -y cmake
fi

mkdir -p "$DEST/dl"
SDIST="$DEST/dl/llama_cpp_python-$VER.tar.gz"
if [ ! -f "$SDIST" ]; then
    # --no-binary only for llama-cpp-python itself: its build tools (cmake,
    # ninja, scikit-build-core) still come as wheels for the metadata step.
    pip download --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$VER" -d "$DEST/dl"
fi

# Unpack only the vendored llama.cpp tree into DEST/src. A tree already
# unpacked from the same version is kept, so a re-run rebuilds nothing.
if [ "$(cat "$DEST/src/.kiln-sdist" 2>/dev/null)" != "$VER" ]; then
    rm -rf "$DEST/src" "$DEST/src.tmp" "$DEST/build"
    mkdir -p "$DEST/src.tmp"
    tar xzf "$SDIST" -C "$DEST/src.tmp" "llama_cpp_python-$VER/vendor/llama.cpp"
    mv "$DEST/src.tmp/llama_cpp_python-$VER/vendor/llama.cpp" "$DEST/src"
    rm -rf "$DEST/src.tmp"
    echo "$VER" > "$DEST/src/.kiln-sdist"
fi

if [ "$VULKAN" = 1 ]; then
    if ! command -v glslc >/dev/null 2>&1; then
        echo "glslc missing: installing glslc and libvulkan-dev with apt-get" >&2
        apt-get update && apt-get install -y glslc libvulkan-dev
    fi
    if ! grep -q VK_EXT_LAYER_SETTINGS_SPEC_VERSION /usr/include/vulkan/vulkan_core.h 2>/dev/null; then
        if [ ! -f "$DEST/vk-headers/usr/include/vulkan/vulkan_core.h" ]; then
            # (The source list outside the lists directory: apt-get update empties that.)
            lists="$DEST/vk-headers.lists"
            mkdir -p "$lists/partial" "$DEST/vk-headers.dl"
            echo "deb http://deb.debian.org/debian trixie main" > "$DEST/vk-headers.list"
            apt_o=(-o Dir::Etc::sourcelist="$DEST/vk-headers.list" -o Dir::Etc::sourceparts=-
                -o Dir::State::Lists="$lists")
            apt-get "${apt_o[@]}" update
            (cd "$DEST/vk-headers.dl" && apt-get "${apt_o[@]}" download libvulkan-dev)
            dpkg -x "$DEST"/vk-headers.dl/libvulkan-dev_*.deb "$DEST/vk-headers"
        fi
        EXTRA+=(-DVulkan_INCLUDE_DIR="$DEST/vk-headers/usr/include")
    fi
fi

# AMX off: on machines whose CPU reports AMX tiles that the kernel does not grant (seen
# here on a Xeon VM), ggml's AMX matmul dies with SIGSEGV on every quantized model; with
# explicit -mno-amx-* the rest of -march=native (AVX-512, VNNI, BF16) stays on. kiln does
# not use AMX either.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
nice -n "$NICE" "$CMAKE" -S "$DEST/src" -B "$DEST/build" \
    -DCMAKE_BUILD_TYPE=Release \
    "${EXTRA[@]}" \
    -DCMAKE_C_FLAGS="$NO_AMX" \
    -DCMAKE_CXX_FLAGS="$NO_AMX" \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_NUMBER="$BUILD" \
    -DLLAMA_BUILD_COMMIT="$COMMIT"

nice -n "$NICE" "$CMAKE" --build "$DEST/build" --config Release -j "$JOBS" \
    --target "${TARGETS[@]}"

echo "llama-cpp-python $VER, llama.cpp b$BUILD-$COMMIT" > "$DEST/VERSION"
"$DEST/build/bin/llama-bench" --version 2>&1 | tee -a "$DEST/VERSION" || true
echo "built: $DEST/build/bin/{$(IFS=,; echo "${TARGETS[*]}")}"
