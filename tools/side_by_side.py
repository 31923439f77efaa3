#!/usr/bin/env python3
"""A markdown table of two engines' llama-bench-style JSON lines, file by file and test by test.

usage: side_by_side.py A.jsonl B.jsonl "A's column" "B's column" "ratio column"

Lines that are not JSON objects with n_prompt/n_gen (headers, logs) are skipped. Each cell is
the median of the repetitions' samples (`samples_ts`; llama-bench's first repetition is its
slowest, so a mean of few understates it) with the best sample beside it; the ratio is B's
median over A's. Lines without samples fall back to their mean. Where a decode row carries
`effective_gbps` (and `bw_fraction`: `kiln bench --membw` on a GPU, against the device's
measured read bandwidth), they follow its cell.
"""
import json
import os
import statistics
import sys


def rows(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "n_prompt" not in r:
            continue
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        if r.get("n_depth"):
            test += f" @ d{r['n_depth']}"
        samples = r.get("samples_ts") or [r["avg_ts"]]
        bw = ""
        if "effective_gbps" in r:
            bw = f", {r['effective_gbps']:.0f} GB/s"
            if "bw_fraction" in r:
                bw += f" = {100 * r['bw_fraction']:.0f}% of {r['membw_gbps']:.0f}"
        out[(os.path.basename(r["model_filename"]), test)] = (statistics.median(samples),
                                                              max(samples), bw)
    return out


a_rows, b_rows = rows(sys.argv[1]), rows(sys.argv[2])
a_name, b_name, ratio_name = sys.argv[3:6]
print(f"| model file | test | {a_name} | {b_name} | {ratio_name} |")
print("|---|---|---:|---:|---:|")
def order(key):
    # pp before tg, then by depth (numerically).
    name, test = key
    depth = int(test.split(" @ d")[1]) if " @ d" in test else 0
    return (name, test.split(" @ d")[0], depth)


for key in sorted(set(a_rows) | set(b_rows), key=order):
    a, b = a_rows.get(key), b_rows.get(key)
    ratio = f"{b[0] / a[0]:.2f}x" if a and b else ""
    fa = f"{a[0]:.1f} (best {a[1]:.1f}{a[2]})" if a else "-"
    fb = f"{b[0]:.1f} (best {b[1]:.1f}{b[2]})" if b else "-"
    print(f"| {key[0]} | {key[1]} | {fa} | {fb} | {ratio} |")
