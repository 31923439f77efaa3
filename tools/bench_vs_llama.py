#!/usr/bin/env python3
"""Run kiln and llama.cpp side by side on the benchmark models and print BENCHMARKS.md rows.

Usage:

    cargo build --release                       # target/release/kiln
    tools/build-llama-cpp.sh                    # the peer, once
    python3 tools/make_bench_models.py          # the models, once
    python3 tools/bench_vs_llama.py [--threads 1,2] [-p 512] [-n 128] [-r 5] [--out FILE.jsonl]

For every model and thread count it runs `kiln bench --json` and `llama-bench -o jsonl`
back to back (same sitting, same machine), interleaved model by model so that drift in the
machine's load hits both alike, then prints a markdown table with tok/s of each, the ratio
kiln / llama.cpp, kiln's effective GB/s against the measured read bandwidth, and peak RSS.
Raw JSON lines of both tools go to --out (default bench-results.jsonl).
"""

import argparse
import json
import os
import subprocess
import sys

HOME = os.environ.get("KILN_HOME") or os.path.expanduser("~/.cache/kiln")
MODELS = [
    ("SmolLM2-135M Q4_1", f"{HOME}/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("SmolLM2-135M Q4_0", f"{HOME}/bench/smollm2-135m-q4_0.gguf"),
    ("SmolLM2-135M Q8_0", f"{HOME}/bench/smollm2-135m-q8_0.gguf"),
    ("SmolLM2-135M Q4_K_M", f"{HOME}/bench/smollm2-135m-q4_k_m.gguf"),
    ("Qwen3-0.6B-shape Q4_0", f"{HOME}/bench/qwen3-0.6b-shape-q4_0.gguf"),
    ("Qwen3-0.6B-shape Q8_0", f"{HOME}/bench/qwen3-0.6b-shape-q8_0.gguf"),
    ("Qwen3-0.6B-shape Q4_K_M", f"{HOME}/bench/qwen3-0.6b-shape-q4_k_m.gguf"),
    # Written by make_bench_models.py --shapes qwen3-4b,llama3.2-3b (skipped when absent).
    ("Qwen3-4B-shape Q4_0", f"{HOME}/bench/qwen3-4b-shape-q4_0.gguf"),
    ("Qwen3-4B-shape Q4_K_M", f"{HOME}/bench/qwen3-4b-shape-q4_k_m.gguf"),
    ("Llama-3.2-3B-shape Q4_0", f"{HOME}/bench/llama3.2-3b-shape-q4_0.gguf"),
    ("Llama-3.2-3B-shape Q4_K_M", f"{HOME}/bench/llama3.2-3b-shape-q4_k_m.gguf"),
]


def run_jsonl(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.strip().startswith("{")]


def peak_rss_of(cmd):
    """Peak RSS (bytes) of a child, from GNU time if present."""
    try:
        r = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, capture_output=True, text=True)
        return int(r.stderr.strip().splitlines()[-1]) * 1024
    except (FileNotFoundError, ValueError, IndexError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="target/release/kiln")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", "/work/peers/llama.cpp/build/bin/llama-bench"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("-p", default="512")
    ap.add_argument("-n", default="128")
    ap.add_argument("-r", default="5")
    ap.add_argument("--models", default="", help="comma list of name substrings to keep")
    ap.add_argument("--out", default="bench-results.jsonl")
    a = ap.parse_args()

    keep = [m for m in MODELS if not a.models or any(k in m[0] for k in a.models.split(","))]
    raw = []
    membw = {}
    for line in run_jsonl([a.kiln, "bench", "--membw", "--json", "-t", a.threads]):
        membw[line["n_threads"]] = line["gbps"]
        raw.append({"tool": "kiln", **line})
    rows = []
    for name, path in keep:
        if not os.path.exists(path):
            print(f"skip {name}: {path} missing", file=sys.stderr)
            continue
        for t in a.threads.split(","):
            common = ["-m", path, "-p", a.p, "-n", a.n, "-r", a.r, "-t", t]
            k = run_jsonl([a.kiln, "bench", "--json"] + common)
            l = run_jsonl([a.llama_bench, "-o", "jsonl"] + common)
            raw += [{"tool": "kiln", **x} for x in k] + [{"tool": "llama.cpp", **x} for x in l]
            l_rss = peak_rss_of([a.llama_bench] + common + ["-r", "1"])
            for kx in k:
                lx = next((x for x in l if x["n_prompt"] == kx["n_prompt"] and x["n_gen"] == kx["n_gen"]), None)
                test = f"pp{kx['n_prompt']}" if kx["n_prompt"] else f"tg{kx['n_gen']}"
                rows.append((name, int(t), test, kx, lx, l_rss))
            print(f"done {name} t={t}", file=sys.stderr)
    with open(a.out, "w") as f:
        for x in raw:
            f.write(json.dumps(x) + "\n")

    print("| model | threads | test | kiln t/s | llama.cpp t/s | kiln / llama.cpp | kiln GB/s (% of membw) | kiln RSS MiB | llama.cpp RSS MiB |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, t, test, kx, lx, l_rss in rows:
        kt = f"{kx['avg_ts']:.1f} ± {kx['stddev_ts']:.1f}"
        lt = f"{lx['avg_ts']:.1f} ± {lx['stddev_ts']:.1f}" if lx else "-"
        ratio = f"{kx['avg_ts'] / lx['avg_ts']:.2f}x" if lx else "-"
        gb = ""
        if "effective_gbps" in kx and t in membw:
            gb = f"{kx['effective_gbps']:.1f} ({100 * kx['effective_gbps'] / membw[t]:.0f}%)"
        krss = f"{kx.get('peak_rss_bytes', 0) / 2**20:.0f}"
        lrss = f"{l_rss / 2**20:.0f}" if l_rss else "-"
        print(f"| {name} | {t} | {test} | {kt} | {lt} | {ratio} | {gb} | {krss} | {lrss} |")
    print()
    print("membw: " + ", ".join(f"{t} thread(s) {g:.1f} GB/s" for t, g in sorted(membw.items())))


if __name__ == "__main__":
    main()
