"""Writes a WAV (16 kHz mono 16-bit) to stdout as raw PCM at real-time pace: 0.5 s of silence,
the speech, 2 s of silence; after an optional delay in seconds (let the reader load first).

    python3 tools/feed_realtime.py IN.wav [DELAY] | kiln voice --live - -o reply.wav
"""
import sys, time, wave
w = wave.open(sys.argv[1]); data = w.readframes(w.getnframes())
pcm = b"\0" * 16000 + data + b"\0" * 64000
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
t0 = time.time()
for i in range(0, len(pcm), 3200):
    sys.stdout.buffer.write(pcm[i:i+3200]); sys.stdout.buffer.flush()
    d = t0 + (i + 3200) / 32000 - time.time()
    if d > 0: time.sleep(d)
