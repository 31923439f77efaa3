#!/usr/bin/env bash
# Installs espeak-ng (Debian package; idempotent, quiet unless it fails). kiln runs it as a
# program (never links it: it is GPL) for Kokoro's Spanish, French, Hindi, Italian and
# Portuguese voices and for English words outside misaki's lexicons.
set -euo pipefail
if command -v espeak-ng >/dev/null; then
    exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
log=$(mktemp)
if ! { $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq espeak-ng; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "setup-espeak: installing espeak-ng failed" >&2
    exit 1
fi
rm -f "$log"
