#!/usr/bin/env bash
# Installs what the aarch64 cross tests need (idempotent, quiet; skips what is present):
# the Rust targets aarch64-unknown-linux-gnu and aarch64-apple-darwin, a cross linker and
# libc, and qemu user-mode emulation (Debian packages). See .cargo/config.toml.
set -euo pipefail

targets=(aarch64-unknown-linux-gnu aarch64-apple-darwin)
installed=$(rustup target list --installed)
for t in "${targets[@]}"; do
    if ! grep -qx "$t" <<<"$installed"; then
        rustup target add "$t" >/dev/null 2>&1 || rustup target add "$t"
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
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
        "${missing[@]}" >/dev/null
fi
