//! Decoding, resampling and Whisper's log-mel against independent references: OpenAI's
//! filterbanks (`mel_filters.npz`), a direct f64 DFT, and WAV files written here.

use std::path::Path;

use kiln_audio::{
    decode_bytes, is_container, load_16k, log_mel_spectrogram, mel_filters, AudioError,
};

/// The system allocator, refusing any one request over 256 MiB: a decoder that sizes a buffer
/// from a length in the file before checking it aborts these tests instead of passing on
/// memory the OS lent lazily (the fuzz targets run under the same cap).
struct Capped;

const CAP: usize = 256 << 20;

// SAFETY: forwards to `System`, or refuses with null, as `GlobalAlloc` allows.
unsafe impl std::alloc::GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        std::alloc::System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        std::alloc::System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        std::alloc::System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
        if n > CAP {
            return std::ptr::null_mut();
        }
        std::alloc::System.realloc(p, l, n)
    }
}

#[global_allocator]
static ALLOC: Capped = Capped;

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/assets");

/// The arrays of an `.npz` (a zip of `.npy`), as f32 with their shapes.
fn read_npz(path: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let f = std::fs::read(path).unwrap();
    let u16_at = |i: usize| u16::from_le_bytes([f[i], f[i + 1]]) as usize;
    let u32_at = |i: usize| u32::from_le_bytes([f[i], f[i + 1], f[i + 2], f[i + 3]]) as usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i + 30 <= f.len() && f[i..i + 4] == *b"PK\x03\x04" {
        let (method, csize) = (u16_at(i + 8), u32_at(i + 18));
        let (name_len, extra_len) = (u16_at(i + 26), u16_at(i + 28));
        let name = String::from_utf8(f[i + 30..i + 30 + name_len].to_vec()).unwrap();
        let start = i + 30 + name_len + extra_len;
        let raw = &f[start..start + csize];
        let npy = match method {
            0 => raw.to_vec(),
            8 => miniz_oxide::inflate::decompress_to_vec(raw).unwrap(),
            m => panic!("zip method {m}"),
        };
        assert_eq!(&npy[..6], b"\x93NUMPY");
        let (hlen, hstart) = if npy[6] == 1 {
            (u16::from_le_bytes([npy[8], npy[9]]) as usize, 10)
        } else {
            (
                u32::from_le_bytes([npy[8], npy[9], npy[10], npy[11]]) as usize,
                12,
            )
        };
        let header = std::str::from_utf8(&npy[hstart..hstart + hlen]).unwrap();
        assert!(header.contains("'descr': '<f4'"), "{header}");
        assert!(header.contains("'fortran_order': False"), "{header}");
        let shape_s = header.split("'shape': (").nth(1).unwrap();
        let shape: Vec<usize> = shape_s[..shape_s.find(')').unwrap()]
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().parse().unwrap())
            .collect();
        let data: Vec<f32> = npy[hstart + hlen..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(data.len(), shape.iter().product::<usize>());
        out.push((name.trim_end_matches(".npy").to_string(), shape, data));
        i = start + csize;
    }
    out
}

#[test]
fn mel_filterbanks_match_openai_whisper() {
    let arrays = read_npz(&format!("{SHARED}/whisper/mel_filters.npz"));
    assert_eq!(arrays.len(), 2);
    for (name, shape, want) in arrays {
        let n_mels: usize = name.trim_start_matches("mel_").parse().unwrap();
        assert_eq!(shape, vec![n_mels, 201]);
        let got = mel_filters(n_mels);
        let peak = want.iter().fold(0f32, |m, &v| m.max(v));
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-6 * peak,
            "{name}: max |diff| {worst} (peak {peak})"
        );
        // Same sparsity pattern: no filter leaks into bins the reference leaves at zero.
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(*a == 0.0, *b == 0.0, "{name}: zero pattern differs");
        }
    }
}

/// Log-mel by the definition, in f64, with a direct DFT (no FFT, explicit reflect padding).
fn log_mel_direct(x: &[f32], n_mels: usize) -> Vec<f64> {
    let n = x.len();
    let padded: Vec<f64> = (-200..n as isize + 200)
        .map(|j| {
            let j = if j < 0 {
                -j
            } else if j >= n as isize {
                2 * (n as isize - 1) - j
            } else {
                j
            };
            x[j as usize] as f64
        })
        .collect();
    let n_frames = n / 160;
    let filters = mel_filters(n_mels);
    let mut mel = vec![0f64; n_mels * n_frames];
    for t in 0..n_frames {
        let frame = &padded[t * 160..t * 160 + 400];
        let mut power = [0f64; 201];
        for (k, p) in power.iter_mut().enumerate() {
            let (mut re, mut im) = (0.0, 0.0);
            for (i, &v) in frame.iter().enumerate() {
                let w = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / 400.0).cos();
                let ph = -2.0 * std::f64::consts::PI * (k * i) as f64 / 400.0;
                re += v * w * ph.cos();
                im += v * w * ph.sin();
            }
            *p = re * re + im * im;
        }
        for m in 0..n_mels {
            let s: f64 = (0..201)
                .map(|k| filters[m * 201 + k] as f64 * power[k])
                .sum();
            mel[m * n_frames + t] = s.max(1e-10).log10();
        }
    }
    let max = mel.iter().cloned().fold(f64::MIN, f64::max);
    mel.iter().map(|v| (v.max(max - 8.0) + 4.0) / 4.0).collect()
}

#[test]
fn log_mel_matches_direct_dft_definition() {
    // A chirp plus noise, 0.3 s: every bin and the reflect-padded edges get exercised.
    let mut seed = 12345u64;
    let x: Vec<f32> = (0..4800)
        .map(|i| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.05;
            let t = i as f32 / 16000.0;
            (2.0 * std::f32::consts::PI * (200.0 + 6000.0 * t) * t).sin() * 0.5 + noise
        })
        .collect();
    for n_mels in [80, 128] {
        let got = log_mel_spectrogram(&x, n_mels, 0).unwrap();
        assert_eq!(got.n_frames, 30);
        let want = log_mel_direct(&x, n_mels);
        let worst = got
            .data
            .iter()
            .zip(&want)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0f64, f64::max);
        assert!(worst < 2e-4, "{n_mels} bins: max |diff| {worst}");
    }
}

#[test]
fn jfk_log_mel_is_sane() {
    let a = load_16k(Path::new(&format!("{SHARED}/audio/jfk.wav"))).unwrap();
    assert_eq!(a.rate, 16_000);
    assert_eq!(a.samples.len(), 176_000);
    let mel = log_mel_spectrogram(&a.samples, 80, 480_000).unwrap();
    assert_eq!((mel.n_mels, mel.n_frames), (80, 4100));
    let max = mel.data.iter().cloned().fold(f32::MIN, f32::max);
    let min = mel.data.iter().cloned().fold(f32::MAX, f32::min);
    // Dynamic range clamped to 8 decades, scaled by 1/4.
    assert!((max - min - 2.0).abs() < 1e-5, "range {min}..{max}");
    // Speech (first 11 s) is louder on average than the zero padding (the floor).
    let mean = |a: usize, b: usize| {
        let mut s = 0f64;
        for m in 0..80 {
            for t in a..b {
                s += mel.data[m * mel.n_frames + t] as f64;
            }
        }
        s / (80 * (b - a)) as f64
    };
    assert!(mean(0, 1100) > mean(1200, 4000) + 0.5);
    assert!((mean(1200, 4000) - min as f64).abs() < 1e-6);
    // A 30 s window past the end is all floor.
    let w = mel.window(4000, 3000, min);
    assert_eq!(w.len(), 80 * 3000);
}

#[test]
fn tone_peaks_in_its_mel_bin() {
    let x: Vec<f32> = (0..16000)
        .map(|i| (2.0 * std::f32::consts::PI * 1000.0 * i as f32 / 16000.0).sin())
        .collect();
    let mel = log_mel_spectrogram(&x, 80, 0).unwrap();
    let t = 50;
    let best = (0..80)
        .max_by(|&a, &b| mel.data[a * 100 + t].total_cmp(&mel.data[b * 100 + t]))
        .unwrap();
    // Slaney scale: 1 kHz sits at mel 15 of 0..45.25, i.e. between filters 25 and 27 of 80.
    assert!((25..=27).contains(&best), "peak at bin {best}");
}

/// A WAV file: `bits` 8/16/24/32 integer PCM, or 32 float (`float`), interleaved channels.
fn wav(samples: &[f32], channels: u16, rate: u32, bits: u16, float: bool) -> Vec<u8> {
    let mut data = Vec::new();
    for &s in samples {
        match (bits, float) {
            (32, true) => data.extend(s.to_le_bytes()),
            (8, false) => data.push(((s * 127.0).round() as i32 + 128) as u8),
            (16, false) => data.extend(((s * 32767.0).round() as i16).to_le_bytes()),
            (24, false) => data.extend(&((s * 8_388_607.0).round() as i32).to_le_bytes()[..3]),
            (32, false) => data.extend(((s as f64 * 2_147_483_647.0).round() as i32).to_le_bytes()),
            _ => unreachable!(),
        }
    }
    let block = channels * bits / 8;
    let mut f = Vec::new();
    f.extend(b"RIFF");
    f.extend((36 + data.len() as u32).to_le_bytes());
    f.extend(b"WAVEfmt ");
    f.extend(16u32.to_le_bytes());
    f.extend((if float { 3u16 } else { 1u16 }).to_le_bytes());
    f.extend(channels.to_le_bytes());
    f.extend(rate.to_le_bytes());
    f.extend((rate * block as u32).to_le_bytes());
    f.extend(block.to_le_bytes());
    f.extend(bits.to_le_bytes());
    f.extend(b"data");
    f.extend((data.len() as u32).to_le_bytes());
    f.extend(data);
    f
}

#[test]
fn wav_formats_decode_to_the_same_signal() {
    let n = 4410;
    let left: Vec<f32> = (0..n).map(|i| (i as f32 * 0.01).sin() * 0.5).collect();
    let right: Vec<f32> = (0..n).map(|i| (i as f32 * 0.013).cos() * 0.25).collect();
    let inter: Vec<f32> = left
        .iter()
        .zip(&right)
        .flat_map(|(&l, &r)| [l, r])
        .collect();
    let p = Path::new("test.wav");
    for (bits, float, tol) in [
        (8, false, 1.0 / 100.0),
        (16, false, 1e-4),
        (24, false, 1e-6),
        (32, false, 1e-6),
        (32, true, 1e-7),
    ] {
        let d = decode_bytes(wav(&inter, 2, 44_100, bits, float), Some("wav"), p).unwrap();
        assert_eq!((d.channels, d.rate), (2, 44_100), "{bits}-bit");
        assert_eq!(d.samples.len(), inter.len(), "{bits}-bit");
        let worst = d
            .samples
            .iter()
            .zip(&inter)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < tol, "{bits}-bit float={float}: max |diff| {worst}");
        let a = kiln_audio::to_16k_mono(d).unwrap();
        assert_eq!(a.rate, 16_000);
        assert_eq!(a.samples.len(), 1600);
    }
}

#[test]
fn bad_input_is_one_clear_error() {
    let p = Path::new("x.wav");
    let e = decode_bytes(Vec::new(), Some("wav"), p).unwrap_err();
    assert!(matches!(e, AudioError::Empty { .. }), "{e}");
    let e = decode_bytes(b"hello, this is text, not audio\n".repeat(20), None, p).unwrap_err();
    assert!(matches!(e, AudioError::NotAudio { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("x.wav: not a supported audio file"),
        "{e}"
    );
    // A WAV cut inside its header, and one whose data chunk is empty.
    let full = wav(&[0.1; 100], 1, 16_000, 16, false);
    for cut in [12, 30, 44] {
        let e = decode_bytes(full[..cut].to_vec(), Some("wav"), p).unwrap_err();
        assert!(!e.to_string().is_empty());
    }
    // Cut inside the data: keeps what is there.
    let d = decode_bytes(full[..44 + 100].to_vec(), Some("wav"), p).unwrap();
    assert_eq!(d.samples.len(), 50);
    // Random bytes with a RIFF header.
    let mut junk = b"RIFF\x10\x00\x00\x00WAVEjunk".to_vec();
    junk.extend((0..1000u32).map(|i| (i * 7919 % 251) as u8));
    assert!(decode_bytes(junk, Some("wav"), p).is_err());
    // Raw PCM.
    assert!(kiln_audio::pcm_s16le(&[1, 2, 3], p).is_err());
    assert!(kiln_audio::pcm_s16le(&[], p).is_err());
    assert_eq!(
        kiln_audio::pcm_s16le(&[0, 0x40, 0, 0xc0], p).unwrap(),
        vec![0.5, -0.5]
    );
    let e = load_16k(Path::new("/nonexistent/file.wav")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/file.wav"), "{e}");
}

/// A WAV whose fmt chunk says 0 Hz: symphonia panics building a zero time base; kiln reports
/// corrupt audio (found by the `audio` fuzz target).
#[test]
fn wav_with_zero_sample_rate_is_an_error() {
    let mut b = b"RIFF".to_vec();
    b.extend(40u32.to_le_bytes());
    b.extend(b"WAVEfmt ");
    b.extend(16u32.to_le_bytes());
    b.extend(1u16.to_le_bytes()); // PCM
    b.extend(1u16.to_le_bytes()); // mono
    b.extend(0u32.to_le_bytes()); // 0 Hz
    b.extend(0u32.to_le_bytes());
    b.extend(2u16.to_le_bytes());
    b.extend(16u16.to_le_bytes());
    b.extend(b"data");
    b.extend(4u32.to_le_bytes());
    b.extend([1, 0, 2, 0]);
    let e = kiln_audio::decode_bytes(b, None, std::path::Path::new("zero.wav"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("zero.wav") && e.contains("corrupt"), "{e}");
}

/// A 39-byte FLAC whose Vorbis comment block claims a 453 MB comment: symphonia allocated it
/// before reading (found by the `audio` fuzz target as a refused allocation). kiln drops
/// every metadata block but STREAMINFO, and a block running past the end is corrupt audio.
#[test]
fn flac_metadata_lengths_are_checked_before_decoding() {
    let crash: &[u8] = &[
        0x66, 0x4c, 0x61, 0x43, 0x84, 0x00, 0x1b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x22, 0x00, 0x10, 0x00, 0x1b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc4, 0x40, 0xf0,
        0x9e, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0xa5, 0x20,
    ];
    let e = decode_bytes(crash.to_vec(), None, Path::new("tag.flac"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tag.flac") && e.contains("runs past the end"),
        "{e}"
    );

    // The same comment inside a well-formed chain is skipped, and the samples decode.
    let mut f = b"fLaC".to_vec();
    f.extend([0x00, 0, 0, 34]); // STREAMINFO, mono 16-bit 44.1 kHz, 16 samples
    f.extend([0, 16, 0, 16, 0, 0, 0, 0, 0, 0]);
    f.extend((44100u64 << 44 | 15 << 36 | 16).to_be_bytes());
    f.extend([0; 16]);
    f.extend([0x84, 0, 0, 12]); // last block: Vorbis comment, vendor "", 1 comment of 2^31
    f.extend([0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x80]);
    let mut frame = vec![0xff, 0xf8, 0x69, 0x08, 0, 15];
    frame.push(crc8(&frame));
    frame.push(0x02); // verbatim subframe
    for i in 0..16i16 {
        frame.extend((i * 1000).to_be_bytes());
    }
    let crc = crc16(&frame);
    frame.extend(crc.to_be_bytes());
    f.extend(frame);
    let d = decode_bytes(f, None, Path::new("ok.flac")).unwrap();
    assert_eq!((d.rate, d.channels, d.samples.len()), (44100, 1, 16));
    assert!((d.samples[1] - 1000.0 / 32768.0).abs() < 1e-6);
}

fn crc8(b: &[u8]) -> u8 {
    let mut c = 0u8;
    for &x in b {
        c ^= x;
        for _ in 0..8 {
            c = if c & 0x80 != 0 { c << 1 ^ 0x07 } else { c << 1 };
        }
    }
    c
}

fn crc16(b: &[u8]) -> u16 {
    let mut c = 0u16;
    for &x in b {
        c ^= (x as u16) << 8;
        for _ in 0..8 {
            c = if c & 0x8000 != 0 {
                c << 1 ^ 0x8005
            } else {
                c << 1
            };
        }
    }
    c
}

/// Junk, then "fLaC" and the same oversized Vorbis comment: symphonia's probe scans the file
/// for any format's marker and started the FLAC reader mid-file, past kiln's metadata check
/// (found by the `audio` fuzz target, 788 MB refused). A stream must now start (after an
/// optional ID3v2 tag) with a WAV, FLAC, OGG or MPEG header.
#[test]
fn audio_must_start_with_a_known_header() {
    let mut b = b"[9[\r\0\0\0[[[[[[[".to_vec();
    b.extend(b"fLaC\x84\x00\x3b\x22\x1b\x00\x00\x00\x00\xc4\xf0\x9e\x00\x7e");
    b.extend([0xa7; 40]);
    let e = decode_bytes(b, None, Path::new("junk.bin")).unwrap_err();
    assert!(matches!(e, AudioError::NotAudio { .. }), "{e}");
    assert!(
        e.to_string().contains("no WAV, FLAC, OGG or MP3 header"),
        "{e}"
    );
    // An ID3v2 tag before MPEG audio is skipped; one that swallows the file is an error.
    let mut id3 = b"ID3\x04\x00\x00\x00\x00\x00\x05".to_vec();
    id3.extend([0; 5]);
    let e = decode_bytes(id3.clone(), None, Path::new("t.mp3")).unwrap_err();
    assert!(e.to_string().contains("no audio after it"), "{e}");
    let mut frame = vec![0xff, 0xfb, 0x90, 0xc0];
    frame.resize(417, 0);
    id3.extend(frame.repeat(4));
    let d = decode_bytes(id3, None, Path::new("t.mp3")).unwrap();
    assert_eq!((d.rate, d.channels), (44100, 1));
}

/// An MPEG frame sync (0xfff9) with a "fLaC" and an oversized Vorbis comment later in the
/// file: the probe did not take the sync for MP3, scanned on, and started the FLAC reader
/// there (found by the `audio` fuzz target, 4.1 GB refused). The header at the start now
/// picks the one reader that runs.
#[test]
fn the_leading_header_picks_the_only_reader() {
    let mut b = vec![0xff, 0xf9, 0x90, 0xc0];
    b.extend([0; 28]);
    b.extend(b"fLaC\x04\x00\x00\x0c\x00\x00\x00\x00\x01\x00\x00\x00\xf6\xf5\xf4\xf6");
    b.extend([0xa8; 64]);
    let e = decode_bytes(b, None, Path::new("sync.mp3")).unwrap_err();
    let e = e.to_string();
    assert!(
        e.starts_with("sync.mp3:") && e.contains("not a supported audio file"),
        "{e}"
    );
}

/// A FLAC stream whose only metadata block is padding: with no STREAMINFO to keep, the frames
/// were glued to the marker and read as metadata headers (found by the `audio` fuzz target,
/// 1.2 GB refused). The first block must be STREAMINFO.
#[test]
fn flac_must_open_with_streaminfo() {
    let mut b = b"fLaC\x81\x00\x00\x22".to_vec();
    b.extend([0; 34]);
    b.extend([0xff, 0xf8, 0x1e, 0x02, 0x00, 0x0f, 0x30, 0xea, 0xea]);
    b.extend([0x07; 64]);
    let e = decode_bytes(b, None, Path::new("pad.flac"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pad.flac") && e.contains("not STREAMINFO"),
        "{e}"
    );
}

/// Stdin is sniffed for a container (`cat a.flac | kiln transcribe -`) without taking raw PCM
/// for one: magics and an ID3 tag count, and MPEG audio only when its first three frames
/// chain; PCM that starts with a frame-sync pattern (a sample of -1 is `ff ff`) stays PCM.
#[test]
fn stdin_sniffing_tells_containers_from_pcm() {
    for magic in [&b"RIFF"[..], b"fLaC", b"OggS", b"ID3\x04"] {
        let mut b = magic.to_vec();
        b.extend([0; 60]);
        assert!(is_container(&b), "{magic:?}");
    }
    // MPEG-1 layer III, 128 kbit/s, 44.1 kHz: 417-byte frames (418 with padding).
    let mut frame = vec![0xff, 0xfb, 0x90, 0xc0];
    frame.resize(417, 0);
    let mut padded = vec![0xff, 0xfb, 0x92, 0xc0];
    padded.resize(418, 0);
    let mut chain = frame.repeat(2);
    chain.extend(&padded);
    chain.extend(&frame);
    assert!(is_container(&chain));
    // MPEG-2 layer III, 64 kbit/s, 22.05 kHz: 72 * 64000 / 22050 = 208 bytes.
    let mut m2 = vec![0xff, 0xf3, 0x80, 0xc0];
    m2.resize(208, 0);
    assert!(is_container(&m2.repeat(3)));
    // One frame whose successor is not where its length says.
    let mut broken = frame.clone();
    broken.extend([0; 10]);
    broken.extend(frame.repeat(2));
    assert!(!is_container(&broken));
    // Raw PCM: silence with a -1 sample first, a reserved version, a free bitrate, noise.
    let mut pcm = vec![0xff, 0xff, 0xff, 0xff];
    pcm.extend([0; 2000]);
    assert!(!is_container(&pcm));
    assert!(!is_container(&[0xff, 0xeb, 0x90, 0xc0, 0, 0]));
    assert!(!is_container(&[0xff, 0xfb, 0x00, 0xc0, 0, 0]));
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let noise: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    assert!(!is_container(&noise));
    assert!(!is_container(&[]));
}
