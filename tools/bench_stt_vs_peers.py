#!/usr/bin/env python3
"""kiln transcribe vs whisper.cpp (whisper-cli) vs faster-whisper (float32, int8), 2 threads,
greedy, on the same CTranslate2 weights; REPS timed runs per engine after a warm-up, kiln and
whisper.cpp interleaved. Prints one markdown row per engine and file: total ms without model
load, encoder ms, decode ms/token, and the transcript's start.

usage: WHISPER_CLI=.../whisper-cli WHISPER_GGML=.../ggml-tiny.en-ct2.bin \
       FW_PYTHON=.../venv/bin/python tools/bench_stt_vs_peers.py REPS AUDIO...
"""
import re, subprocess, sys, statistics, time
import os
KILN = os.environ.get("KILN", "target/release/kiln")
WCPP = os.environ["WHISPER_CLI"]
GGML = os.environ["WHISPER_GGML"]
FW = os.environ.get("FW_PYTHON", "python3")
MODEL = os.environ.get("KILN_WHISPER_DIR", os.path.expanduser("~/.cache/kiln/models/whisper-tiny.en"))
reps = int(sys.argv[1]); files = sys.argv[2:]
fw_code = r'''
import sys, time, json
from faster_whisper import WhisperModel
m = WhisperModel(sys.argv[1], device="cpu", compute_type=sys.argv[2], cpu_threads=2)
out = []
for f in sys.argv[4:]:
    for r in range(int(sys.argv[3]) + 1):
        t0 = time.perf_counter()
        segs, info = m.transcribe(f, beam_size=1, best_of=5, language="en", vad_filter=False)
        text = " ".join(s.text.strip() for s in segs)
        dt = time.perf_counter() - t0
        if r: out.append((f, dt * 1e3, info.duration, text))
print(json.dumps(out))
'''
def kiln(f, quant):
    p = subprocess.run([KILN, "transcribe", f, "-t", "2", "--quant", quant], capture_output=True, text=True)
    s = p.stderr
    g = lambda k: float(re.search(k + r" ([0-9.]+) ms", s).group(1))
    return g("total"), g("encode"), float(re.search(r"([0-9.]+) ms/token", s).group(1)), p.stdout.strip().replace("\n", " ")
def wcpp(f):
    p = subprocess.run([WCPP, "-m", GGML, "-f", f, "-t", "2", "-bs", "1", "-bo", "5", "-nt"], capture_output=True, text=True)
    s = p.stderr
    g = lambda k: float(re.search(k + r" time = +([0-9.]+) ms", s).group(1))
    dec = re.search(r"decode time = +[0-9.]+ ms / +[0-9]+ runs \( +([0-9.]+) ms per run", s).group(1)
    return g("total") - g("load"), g("encode"), float(dec), p.stdout.strip().replace("\n", " ")
for f in files:
    rows = {"kiln f16": [], "kiln q8_0": [], "whisper.cpp f16": []}
    kiln(f, "none"); wcpp(f)
    for _ in range(reps):
        rows["kiln f16"].append(kiln(f, "none"))
        rows["kiln q8_0"].append(kiln(f, "q8_0"))
        rows["whisper.cpp f16"].append(wcpp(f))
    fw = {}
    for ct in ["float32", "int8"]:
        o = subprocess.run([FW, "-c", fw_code, MODEL, ct, str(reps), f], capture_output=True, text=True)
        import json
        fw[ct] = json.loads(o.stdout.strip().splitlines()[-1])
    print(f"## {f}")
    for k, v in rows.items():
        tot = [x[0] for x in v]; enc = [x[1] for x in v]; dec = [x[2] for x in v]
        print(f"| {k} | {statistics.mean(tot):.0f} ± {statistics.stdev(tot):.0f} | {statistics.mean(enc):.0f} | {statistics.mean(dec):.2f} | {v[-1][3][:90]}")
    for ct, v in fw.items():
        tot = [x[1] for x in v]
        print(f"| faster-whisper {ct} | {statistics.mean(tot):.0f} ± {statistics.stdev(tot):.0f} | | | {v[-1][3][:90]} (dur {v[-1][2]:.1f})")
