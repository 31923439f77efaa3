#!/usr/bin/env python3
"""kiln transcribe (fp16 and --quant q8_0) vs whisper.cpp (whisper-cli, OMP_NUM_THREADS=2)
vs faster-whisper (FW_TYPES, default int8), 2 threads, beam BEAM (default 1: greedy), no
VAD, on the same CTranslate2 weights; after a warm-up, REPS rounds of one run per engine
(interleaved). Prints one markdown row per engine and file: median total ms without model
load (min-max), encoder ms, decode ms/token, the ratio to kiln q8_0 and the transcript's
start. kiln's variables (KILN_NO_AMX, KILN_NO_AVX512) pass through to it.

usage: WHISPER_CLI=.../whisper-cli WHISPER_GGML=.../ggml-tiny.en-ct2.bin \
       FW_PYTHON=.../venv/bin/python [BEAM=5] tools/bench_stt_vs_peers.py REPS AUDIO...
"""
import json, os, re, subprocess, sys, statistics, time
KILN = os.environ.get("KILN", "target/release/kiln")
WCPP = os.environ["WHISPER_CLI"]
GGML = os.environ["WHISPER_GGML"]
FW = os.environ.get("FW_PYTHON", "python3")
MODEL = os.environ.get("KILN_WHISPER_DIR", os.path.expanduser("~/.cache/kiln/models/whisper-tiny.en"))
reps = int(sys.argv[1]); files = sys.argv[2:]
BEAM = int(os.environ.get("BEAM", "1"))
FW_TYPES = os.environ.get("FW_TYPES", "int8").split(",")
fw_code = r"""
import sys, time, json
from faster_whisper import WhisperModel
m = WhisperModel(sys.argv[1], device="cpu", compute_type=sys.argv[2], cpu_threads=2)
f, beam = sys.argv[3], int(sys.argv[4])
out = []
for r in range(2):
    t0 = time.perf_counter()
    segs, info = m.transcribe(f, beam_size=beam, language="en", vad_filter=False)
    text = " ".join(s.text.strip() for s in segs)
    dt = time.perf_counter() - t0
    if r: out = (dt * 1e3, text)
print(json.dumps(out))
"""
def kiln(f, quant):
    p = subprocess.run([KILN, "transcribe", f, "-t", "2", "--quant", quant, "--vad", "off",
                        "--beam", str(BEAM)], capture_output=True, text=True)
    s = p.stderr
    g = lambda k: float(re.search(k + r" ([0-9.]+) ms", s).group(1))
    return g("total"), g("encode"), float(re.search(r"([0-9.]+) ms/token", s).group(1)), p.stdout.strip().replace("\n", " ")
def wcpp(f):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    p = subprocess.run([WCPP, "-m", GGML, "-f", f, "-t", "2", "-bs", str(BEAM), "-bo", "5", "-nt"],
                       capture_output=True, text=True, env=env)
    s = p.stderr
    g = lambda k: float(re.search(k + r" time = +([0-9.]+) ms", s).group(1))
    dec = re.search(r"decode time = +[0-9.]+ ms / +[0-9]+ runs \( +([0-9.]+) ms per run", s).group(1)
    return g("total") - g("load"), g("encode"), float(dec), p.stdout.strip().replace("\n", " ")
def fw(f, ct):
    o = subprocess.run([FW, "-c", fw_code, MODEL, ct, f, str(BEAM)], capture_output=True, text=True)
    dt, text = json.loads(o.stdout.strip().splitlines()[-1])
    return dt, 0.0, 0.0, text
for f in files:
    engines = {"kiln f16": lambda: kiln(f, "none"), "kiln q8_0": lambda: kiln(f, "q8_0"),
               "whisper.cpp f16": lambda: wcpp(f)}
    for ct in FW_TYPES:
        engines[f"faster-whisper {ct}"] = (lambda ct=ct: fw(f, ct))
    rows = {k: [] for k in engines}
    kiln(f, "none"); wcpp(f)
    for _ in range(reps):
        for k, run in engines.items():  # interleaved: one run of each engine a round
            rows[k].append(run())
    print(f"## {f} (beam {BEAM}; median, min-max of {reps}; ms)")
    base = statistics.median(x[0] for x in rows["kiln q8_0"])
    for k, v in rows.items():
        tot = sorted(x[0] for x in v); enc = [x[1] for x in v]; dec = [x[2] for x in v]
        med = statistics.median(tot)
        print(f"| {k} | {med:.0f} ({tot[0]:.0f}-{tot[-1]:.0f}) | {statistics.median(enc):.0f} | "
              f"{statistics.median(dec):.2f} | {med / base:.2f} | {v[-1][3][:70]}")
