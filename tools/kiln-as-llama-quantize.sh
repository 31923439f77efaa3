#!/bin/sh
# llama-quantize's command line ([--allow-requantize] SRC DST TYPE [THREADS]) run by
# `kiln quantize` ($KILN_QUANTIZE_BIN, default `kiln` on PATH), for tools/make_bench_models.py
# where llama.cpp is not built yet (tools/cuda-bench.sh with QUANTIZE=kiln).
set -e
[ "$1" = "--allow-requantize" ] && shift
t=$(echo "$3" | tr 'A-Z' 'a-z')
threads=${4:+-t $4}
# shellcheck disable=SC2086
exec "${KILN_QUANTIZE_BIN:-kiln}" quantize "$1" "$2" --type "$t" $threads > /dev/null
