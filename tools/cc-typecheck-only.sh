#!/usr/bin/env bash
# A stand-in C compiler for `cargo check` of targets this machine has no C toolchain for
# (macOS: no Apple SDK here). Build scripts that compile C (ring, under the Hugging Face
# client's TLS) only need their object files to exist for a type-check, which links nothing:
# this writes each output file (`-o FILE`, or MSVC's `-FoFILE`, the style cc-rs picks when
# the compiler does not say what it is) empty. Never use it for a build that links.
set -euo pipefail
out=""
while (($#)); do
    case "$1" in
    -o) (($# > 1)) && out=$2 && shift ;;
    -Fo*) out=${1#-Fo} ;;
    esac
    shift
done
if [ -n "$out" ]; then
    : >"$out"
fi
