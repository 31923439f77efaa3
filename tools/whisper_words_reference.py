"""Word-level timestamps of jfk.wav from faster-whisper (whose word alignment is
openai-whisper's: cross-attention of the alignment heads, median filter, DTW, punctuation
merged, long words clipped), for kiln's test of the same on the same CTranslate2 model.

    pip install faster-whisper==1.2.1
    python3 tools/whisper_words_reference.py ~/.cache/kiln/models/whisper-tiny.en \
        ../shared/assets/audio/jfk.wav crates/kiln-runtime/tests/fixtures/jfk_words_tiny_en.json
"""
import json
import sys

from faster_whisper import WhisperModel

model_dir, wav, out = sys.argv[1:4]
m = WhisperModel(model_dir, device="cpu", compute_type="float32")
segs, info = m.transcribe(
    wav, beam_size=1, temperature=0.0, word_timestamps=True, vad_filter=False, language="en"
)
words = []
for s in segs:
    for w in s.words:
        words.append({"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)})
json.dump({"model": "whisper-tiny.en (CTranslate2 fp16, run in f32)", "words": words},
          open(out, "w"), indent=1, ensure_ascii=False)
print(json.dumps(words, ensure_ascii=False))
