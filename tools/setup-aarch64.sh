#!/usr/bin/env bash
# Installs what the aarch64 cross tests need (idempotent, quiet; skips what is present):
# the Rust targets aarch64-unknown-linux-gnu and aarch64-apple-darwin, a cross linker and
# libc, and qemu user-mode emulation (Debian packages). See .cargo/config.toml.
set -euo pipefail

targets=(aarch64-unknown-linux-gnu aarch64-apple-darwin)
installed=$(rustup target list --installed)
for t in "${targets[@]}"; do
    if ! grep -qx "$t" <<<"$installed"; then
        rustup -q target add "$t"
    fi
done

pkgs=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)
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
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"; } \
        >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "setup-aarch64: installing ${missing[*]} failed" >&2
        exit 1
    fi
    rm -f "$log"
fi
