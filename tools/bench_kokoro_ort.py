#!/usr/bin/env python3
"""ONNX Runtime side of BENCHMARKS.md's Kokoro rows: the same model file, voice and phoneme
utterances (one per line of PHONEMES_FILE) that `kiln bench --tts FILE --phonemes` times.

kokoro-onnx (PyPI) runs exactly this session call per utterance (tokens, style row by phoneme
count, speed); timing the call directly leaves its G2P out, as --phonemes does for kiln.
Usage: python3 tools/bench_kokoro_ort.py MODEL_DIR PHONEMES_FILE [threads] [reps]
With reps 0: a cold process, as a one-shot script is: the session is made and the first line
spoken once (time the whole process from outside, e.g. against `kiln speak --phonemes`).
"""
import time
t_start = time.perf_counter()
import json, os, sys

import numpy as np
import onnxruntime as ort

model_dir, path = sys.argv[1], sys.argv[2]
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab"]
voice = np.load(os.path.join(model_dir, "voices.npz"))["jf_alpha"]
lines = [l.strip() for l in open(path, encoding="utf-8") if l.strip()]
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
t_session = time.perf_counter()
sess = ort.InferenceSession(os.path.join(model_dir, "kokoro-v1.0.int8.onnx"), so, providers=["CPUExecutionProvider"])
t_session = time.perf_counter() - t_session

def speak():
    t0 = time.perf_counter()
    first, samples = None, 0
    for p in lines:
        ids = [0] + [vocab[c] for c in p if c in vocab] + [0]
        style = voice[len(ids) - 3].reshape(1, 256).astype(np.float32)
        a = sess.run(["audio"], {"tokens": np.array([ids], dtype=np.int64), "style": style, "speed": np.array([1.0], dtype=np.float32)})[0]
        samples += a.size
        if first is None:
            first = time.perf_counter() - t0
    return first, time.perf_counter() - t0, samples / 24000

if reps == 0:
    lines = lines[:1]
    first, total, audio = speak()
    print(f"cold: imports and files {time.perf_counter() - t_start - t_session - total:.3f} s, session {t_session:.3f} s, first line {total:.3f} s ({audio:.2f} s audio)", file=sys.stderr)
    sys.exit(0)
speak()  # warm-up
runs = [speak() for _ in range(reps)]
f = np.array([r[0] for r in runs]); rtf = np.array([r[1] / r[2] for r in runs])
print(f"| onnxruntime {ort.__version__} | {threads} threads | {runs[0][2]:.2f} s audio | first audio {f.mean():.3f} ± {f.std(ddof=1):.3f} s | RTF {rtf.mean():.3f} ± {rtf.std(ddof=1):.3f} |")
