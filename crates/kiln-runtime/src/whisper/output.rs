//! Transcript formats: plain text, SubRip (.srt), WebVTT (.vtt), JSON.

use super::Transcript;

/// `HH:MM:SS<sep>mmm`
pub fn timestamp(seconds: f64, sep: char) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    let (h, m, s, ms) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    format!("{h:02}:{m:02}:{s:02}{sep}{ms:03}")
}

pub fn txt(t: &Transcript) -> String {
    let mut out = String::new();
    for s in &t.segments {
        out.push_str(s.text.trim());
        out.push('\n');
    }
    out
}

/// The cues of a transcript: one per segment, or one per word where the segments carry
/// their words (word timestamps asked for).
fn cues(t: &Transcript) -> Vec<(f64, f64, &str)> {
    let mut out = Vec::new();
    for s in &t.segments {
        if s.words.is_empty() {
            out.push((s.start, s.end, s.text.trim()));
        } else {
            out.extend(s.words.iter().map(|w| (w.start, w.end, w.word.trim())));
        }
    }
    out
}

pub fn srt(t: &Transcript) -> String {
    let mut out = String::new();
    for (i, (start, end, text)) in cues(t).into_iter().enumerate() {
        out.push_str(&format!(
            "{}\n{} --> {}\n{}\n\n",
            i + 1,
            timestamp(start, ','),
            timestamp(end, ','),
            text.replace("-->", "->")
        ));
    }
    out
}

pub fn vtt(t: &Transcript) -> String {
    let mut out = String::from("WEBVTT\n\n");
    for (start, end, text) in cues(t) {
        out.push_str(&format!(
            "{} --> {}\n{}\n\n",
            timestamp(start, '.'),
            timestamp(end, '.'),
            text.replace("-->", "->")
        ));
    }
    out
}

pub fn json(t: &Transcript) -> String {
    serde_json::to_string_pretty(t).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// OpenAI's `verbose_json` transcription object: task, language, duration, text, segments.
pub fn openai_verbose(t: &Transcript, task: &str) -> serde_json::Value {
    let segments: Vec<serde_json::Value> = t
        .segments
        .iter()
        .map(|s| {
            serde_json::json!({
                "id": s.id,
                "seek": s.seek,
                "start": s.start,
                "end": s.end,
                "text": s.text,
                "tokens": s.tokens,
                "temperature": s.temperature,
                "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio,
                "no_speech_prob": s.no_speech_prob,
            })
        })
        .collect();
    let mut v = serde_json::json!({
        "task": task,
        "language": language_name(&t.language),
        "duration": t.stats.audio_s,
        "text": t.text.trim(),
        "segments": segments,
    });
    // OpenAI's `timestamp_granularities[]=word`: every word of the transcript, in order.
    if t.segments.iter().any(|s| !s.words.is_empty()) {
        let words: Vec<serde_json::Value> = t
            .segments
            .iter()
            .flat_map(|s| &s.words)
            .map(|w| serde_json::json!({"word": w.word.trim(), "start": w.start, "end": w.end}))
            .collect();
        v["words"] = serde_json::Value::Array(words);
    }
    v
}

/// OpenAI names languages in full ("english"); codes it does not know stay codes.
fn language_name(code: &str) -> &str {
    match code {
        "en" => "english",
        "de" => "german",
        "fr" => "french",
        "es" => "spanish",
        "it" => "italian",
        "pt" => "portuguese",
        "nl" => "dutch",
        "ja" => "japanese",
        "zh" => "chinese",
        "ru" => "russian",
        "ko" => "korean",
        other => other,
    }
}
