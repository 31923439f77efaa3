#!/usr/bin/env bash
# Installs Mesa's CPU Vulkan driver (lavapipe) and the Vulkan loader, so the wgpu backend's
# tests run on a machine without a GPU (idempotent, quiet; skips what is present). CI runs
# it before the tests and sets KILN_REQUIRE_GPU=1, so that a missing adapter fails there.
set -euo pipefail

pkgs=(mesa-vulkan-drivers libvulkan1)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    log=$(mktemp)
    # Quiet unless it fails: then the whole apt log.
    if ! { $sudo apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
            "${missing[@]}"; } >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "setup-lavapipe: installing ${missing[*]} failed" >&2
        exit 1
    fi
    rm -f "$log"
fi
# The lavapipe ICD must be where the loader looks.
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
    echo "setup-lavapipe: no lavapipe ICD under /usr/share/vulkan/icd.d" >&2
    exit 1
fi
