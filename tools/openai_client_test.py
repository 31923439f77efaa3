#!/usr/bin/env python3
"""kiln serve against the official `openai` Python client: models, chat (streamed and not),
completions (streamed and not), audio transcriptions (json, text, srt, vtt, verbose_json)
and speech (a WAV transcribed back through the server), with the answers' content checked.
Exits non-zero on any failure.

    python3 tools/openai_client_test.py --base-url http://127.0.0.1:8080/v1 \
        --audio jfk.wav [--api-key KEY]
"""

import argparse
import re
import struct
import sys

import openai


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--stt", default="whisper-tiny.en")
    ap.add_argument("--tts", default="kokoro-82m")
    ap.add_argument("--audio", required=True, help="jfk.wav: 'ask not what your country...'")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=120)

    ids = [m.id for m in client.models.list().data]
    assert a.model in ids, f"models: {ids}"

    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    r = client.chat.completions.create(
        model=a.model, messages=messages, temperature=0, max_tokens=32
    )
    answer = r.choices[0].message.content
    assert "Paris" in answer, f"chat answer: {answer!r}"
    assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    parts, usage, finish = [], None, None
    for chunk in client.chat.completions.create(
        model=a.model,
        messages=messages,
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    streamed = "".join(parts)
    assert streamed == answer, f"streamed {streamed!r} != {answer!r}"
    assert finish == "stop", finish
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage

    c = client.completions.create(
        model=a.model, prompt="The capital of France is", temperature=0, max_tokens=6
    )
    text = c.choices[0].text
    assert "Paris" in text, f"completion: {text!r}"
    assert c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 6, c.usage
    streamed = "".join(
        ch.choices[0].text
        for ch in client.completions.create(
            model=a.model,
            prompt="The capital of France is",
            temperature=0,
            max_tokens=6,
            stream=True,
        )
        if ch.choices
    )
    assert streamed == text, f"streamed {streamed!r} != {text!r}"

    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert "no-such-model" in str(e), e

    heard = audio_checks(client, a)

    print(f"openai {openai.__version__}: models, chat, chat stream, completions, "
          f"completions stream, unknown model: ok ({answer!r}); transcriptions json, text, "
          f"srt, vtt, verbose_json, speech wav -> transcription: ok ({heard!r})")
    return 0


def words(text: str) -> list:
    return re.findall(r"[a-z']+", text.lower())


def wav_info(b: bytes) -> tuple:
    """(rate, channels, bits, seconds) of a PCM WAV whose data chunk is last (its length
    field may be the streaming placeholder)."""
    assert b[:4] == b"RIFF" and b[8:12] == b"WAVE", b[:16]
    assert b[12:16] == b"fmt ", b[12:16]
    fmt, channels, rate, _, _, bits = struct.unpack("<HHIIHH", b[20:36])
    assert fmt == 1, f"format tag {fmt}"
    assert b[36:40] == b"data", b[36:40]
    return rate, channels, bits, (len(b) - 44) / (rate * channels * bits // 8)


def audio_checks(client, a) -> str:
    ids = [m.id for m in client.models.list().data]
    assert a.stt in ids and a.tts in ids, f"models: {ids}"
    phrase = "ask not what your country can do for you"
    with open(a.audio, "rb") as f:
        jfk = f.read()

    t = client.audio.transcriptions.create(model=a.stt, file=("jfk.wav", jfk))
    assert phrase in " ".join(words(t.text)), f"transcript: {t.text!r}"
    # OpenAI's own model name is taken as the loaded model.
    t1 = client.audio.transcriptions.create(
        model="whisper-1", file=("jfk.wav", jfk), response_format="text"
    )
    assert isinstance(t1, str) and t1.strip() == t.text.strip(), repr(t1)

    # Streamed: text deltas as windows are decoded, then the whole text.
    deltas, done = [], None
    for ev in client.audio.transcriptions.create(model=a.stt, file=("jfk.wav", jfk), stream=True):
        if ev.type == "transcript.text.delta":
            deltas.append(ev.delta)
        elif ev.type == "transcript.text.done":
            done = ev.text
    assert deltas and done == t.text.strip(), (deltas, done)
    assert "".join(deltas).strip() == done, (deltas, done)
    print("streamed transcription: ok")

    srt = client.audio.transcriptions.create(
        model=a.stt, file=("jfk.wav", jfk), response_format="srt"
    )
    blocks = [b for b in srt.strip().split("\n\n") if b]
    assert blocks, repr(srt)
    for i, b in enumerate(blocks):
        lines = b.split("\n")
        assert lines[0] == str(i + 1), repr(b)
        assert re.fullmatch(r"\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}", lines[1]), repr(b)
        assert len(lines) >= 3 and lines[2].strip(), repr(b)

    vtt = client.audio.transcriptions.create(
        model=a.stt, file=("jfk.wav", jfk), response_format="vtt"
    )
    assert vtt.startswith("WEBVTT\n\n"), repr(vtt[:20])
    cues = re.findall(r"\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}", vtt)
    assert len(cues) == len(blocks), f"{len(cues)} vtt cues, {len(blocks)} srt blocks"

    v = client.audio.transcriptions.create(
        model=a.stt, file=("jfk.wav", jfk), response_format="verbose_json"
    )
    assert v.language == "english", v.language
    assert 10.5 < v.duration < 11.5, v.duration
    assert phrase in " ".join(words(v.text)), v.text
    assert len(v.segments) == len(blocks), v.segments
    ends = [s.end for s in v.segments]
    assert all(s.start < s.end for s in v.segments) and ends == sorted(ends), v.segments
    assert ends[-1] <= v.duration + 0.5, (ends, v.duration)

    try:
        client.audio.transcriptions.create(model=a.stt, file=("notes.txt", b"not audio at all"))
        raise AssertionError("a text file was transcribed")
    except openai.BadRequestError as e:
        assert "not a supported audio file" in str(e), e

    said = "The quick brown fox jumps over the lazy dog. It is a sunny day."
    r = client.audio.speech.create(
        model=a.tts, voice="alloy", input=said, response_format="wav"
    )
    wav = r.read()
    rate, channels, bits, secs = wav_info(wav)
    assert (rate, channels, bits) == (24000, 1, 16), (rate, channels, bits)
    assert 2.0 < secs < 10.0, f"{secs:.2f} s for {len(said)} characters"
    back = client.audio.transcriptions.create(model=a.stt, file=("speech.wav", wav))
    heard = set(words(back.text))
    key = ["quick", "brown", "fox", "jumps", "lazy", "dog", "sunny", "day"]
    missing = [w for w in key if w not in heard]
    assert len(missing) <= 1, f"heard {back.text!r}, missing {missing}"

    # Ogg Opus out, and back in through the transcription route.
    opus = client.audio.speech.create(
        model=a.tts, voice="alloy", input=said, response_format="opus"
    ).read()
    assert opus[:4] == b"OggS" and len(opus) * 5 < len(wav), (len(opus), len(wav))
    back_opus = client.audio.transcriptions.create(model=a.stt, file=("speech.opus", opus))
    missing = [w for w in key if w not in set(words(back_opus.text))]
    assert len(missing) <= 1, f"opus: heard {back_opus.text!r}, missing {missing}"

    pcm = client.audio.speech.create(
        model=a.tts, voice="bf_emma", input="Hello there.", response_format="pcm"
    ).read()
    assert len(pcm) % 2 == 0 and 0.5 < len(pcm) / 48000 < 4.0, len(pcm)
    try:
        client.audio.speech.create(model=a.tts, voice="alloy", input="  ")
        raise AssertionError("empty input was spoken")
    except openai.BadRequestError as e:
        assert "input" in str(e), e
    return back.text.strip()


if __name__ == "__main__":
    sys.exit(main())
