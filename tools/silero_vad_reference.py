#!/usr/bin/env python3
"""Silero VAD speech probabilities from ONNX Runtime: the reference kiln's VAD is tested
against.

    silero_vad_reference.py MODEL.onnx AUDIO.wav OUT.npy

AUDIO: 16 kHz mono 16-bit WAV. OUT: float32, one probability per 512 samples (the last step
zero-padded), each step fed with the previous step's last 64 samples before it, as the
package's own ONNX wrapper does.
"""
import sys
import wave

import numpy as np
import onnxruntime as ort


def main():
    model, audio, out = sys.argv[1:4]
    with wave.open(audio) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    s = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), dtype=np.float32)
    context = np.zeros((1, 64), dtype=np.float32)
    sr = np.array(16000, dtype=np.int64)
    probs = []
    for i in range(0, len(x), 512):
        step = np.zeros((1, 512), dtype=np.float32)
        chunk = x[i:i + 512]
        step[0, :len(chunk)] = chunk
        inp = np.concatenate([context, step], axis=1)
        p, state = s.run(None, {"input": inp, "state": state, "sr": sr})
        probs.append(float(p.reshape(-1)[0]))
        context = inp[:, -64:]
    with open(out, "wb") as f:
        np.save(f, np.array(probs, dtype=np.float32))


if __name__ == "__main__":
    main()
