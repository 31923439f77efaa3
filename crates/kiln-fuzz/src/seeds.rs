//! Synthetic seed inputs, small and valid (or nearly so), written with kiln's own writers or
//! assembled field by field, so a mutation starts from a file that parses deep.

use kiln_formats::{GgufWriter, Value};
use kiln_quant::GgmlType;

fn s(v: &str) -> Value {
    Value::String(v.into())
}

fn strs(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|x| s(x)).collect())
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A one-layer Llama header with two small tensors (F32 and Q8_0), and variations.
pub fn gguf() -> Vec<Vec<u8>> {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", s("llama"))
        .meta("general.alignment", Value::U32(32))
        .meta("llama.block_count", Value::U32(1))
        .meta("llama.context_length", Value::U32(128))
        .meta("llama.embedding_length", Value::U32(32))
        .meta("llama.feed_forward_length", Value::U64(64))
        .meta("llama.attention.head_count", Value::U32(4))
        .meta("llama.attention.head_count_kv", Value::U32(2))
        .meta("llama.rope.freq_base", Value::F32(10000.0))
        .meta("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .meta("llama.rope.scaling.type", s("linear"))
        .meta("llama.rope.scaling.factor", Value::F32(2.0))
        .meta("tokenizer.ggml.tokens", strs(&["a", "b", "c", "d"]))
        .meta(
            "nested",
            Value::Array(vec![Value::Array(vec![Value::I8(-1), Value::I8(2)])]),
        )
        .meta("flag", Value::Bool(true))
        .meta("f64", Value::F64(0.5))
        .tensor(
            "token_embd.weight",
            &[4, 2],
            GgmlType::F32,
            f32_bytes(&[1.0; 8]),
        )
        .tensor("blk.0.attn_q.weight", &[32, 1], GgmlType::Q8_0, vec![1; 34]);
    let full = w.to_bytes();
    let mut q = GgufWriter::new();
    q.meta("general.architecture", s("qwen3"))
        .meta("qwen3.block_count", Value::I32(2))
        .meta("qwen3.embedding_length", Value::U32(16))
        .meta("qwen3.attention.head_count", Value::U32(2))
        .meta("qwen3.attention.key_length", Value::U32(8))
        .meta("qwen3.rope.dimension_count", Value::U32(8))
        .meta("qwen3.feed_forward_length", Value::U32(32))
        .meta("qwen3.context_length", Value::U32(64))
        .meta("qwen3.vocab_size", Value::U32(4))
        .tensor("output.weight", &[16], GgmlType::F16, vec![0; 32]);
    let mut empty = GgufWriter::new();
    empty.meta("general.name", s("x"));
    vec![full, q.to_bytes(), empty.to_bytes()]
}

/// GGUF vocabularies: a byte-level BPE (gpt2) one with merges and a SentencePiece (llama) one
/// with scores and byte tokens.
pub fn gguf_vocab() -> Vec<Vec<u8>> {
    let mut bpe = GgufWriter::new();
    let toks = [
        "<|endoftext|>",
        "H",
        "e",
        "l",
        "o",
        "He",
        "ll",
        "Hell",
        "Hello",
        "Ġ",
        "w",
    ];
    bpe.meta("general.architecture", s("llama"))
        .meta("tokenizer.ggml.model", s("gpt2"))
        .meta("tokenizer.ggml.pre", s("smollm"))
        .meta("tokenizer.ggml.tokens", strs(&toks))
        .meta(
            "tokenizer.ggml.token_type",
            Value::Array(
                (0..toks.len())
                    .map(|i| Value::I32(if i == 0 { 3 } else { 1 }))
                    .collect(),
            ),
        )
        .meta(
            "tokenizer.ggml.merges",
            strs(&["H e", "l l", "He ll", "Hell o"]),
        )
        .meta("tokenizer.ggml.bos_token_id", Value::U32(0))
        .meta("tokenizer.ggml.eos_token_id", Value::U32(0))
        .meta("tokenizer.ggml.add_bos_token", Value::Bool(true))
        .meta("tokenizer.chat_template", s("{{ messages }}"));
    let mut spm = GgufWriter::new();
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    tokens.extend((0..8u8).map(|b| format!("<0x{b:02X}>")));
    tokens.extend(["▁he", "llo", "▁", "h", "e", "l", "o"].map(String::from));
    let n = tokens.len();
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    spm.meta("general.architecture", s("llama"))
        .meta("tokenizer.ggml.model", s("llama"))
        .meta("tokenizer.ggml.tokens", strs(&refs))
        .meta(
            "tokenizer.ggml.scores",
            Value::Array((0..n).map(|i| Value::F32(-(i as f32))).collect()),
        )
        .meta(
            "tokenizer.ggml.token_type",
            Value::Array(
                (0..n)
                    .map(|i| {
                        Value::I32(if i < 3 {
                            3
                        } else if i < 11 {
                            6
                        } else {
                            1
                        })
                    })
                    .collect(),
            ),
        )
        .meta("tokenizer.ggml.unknown_token_id", Value::U32(0))
        .meta("tokenizer.ggml.bos_token_id", Value::U32(1))
        .meta("tokenizer.ggml.eos_token_id", Value::U32(2));
    vec![bpe.to_bytes(), spm.to_bytes()]
}

/// `u64 header length | JSON header | data`, as the safetensors format lays it out.
pub fn safetensors_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

pub fn safetensors() -> Vec<Vec<u8>> {
    let two = safetensors_file(
        r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}}"#,
        &[0x3f; 22],
    );
    let one = safetensors_file(
        r#"{"w":{"dtype":"U32","shape":[1,1],"data_offsets":[0,4]}}"#,
        &[1, 0, 0, 0],
    );
    let empty = safetensors_file(
        r#"{"z":{"dtype":"F16","shape":[0],"data_offsets":[0,0]}}"#,
        &[],
    );
    vec![two, one, empty]
}

pub fn safetensors_index() -> Vec<Vec<u8>> {
    vec![
        br#"{"metadata":{"total_size":1024},"weight_map":{"lm_head.weight":"model-00002-of-00002.safetensors","model.embed_tokens.weight":"model-00001-of-00002.safetensors","model.norm.weight":"model-00002-of-00002.safetensors"}}"#.to_vec(),
        br#"{"weight_map":{"a":"model.safetensors"}}"#.to_vec(),
    ]
}

pub fn hf_config() -> Vec<Vec<u8>> {
    vec![
        br#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_attention_heads":4,"num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":100,"max_position_embeddings":2048,"rms_norm_eps":1e-05,"rope_theta":500000.0,"hidden_act":"silu","tie_word_embeddings":true,"rope_scaling":{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#.to_vec(),
        br#"{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","hidden_size":32,"head_dim":16,"intermediate_size":64,"num_attention_heads":2,"num_key_value_heads":1,"num_hidden_layers":1,"vocab_size":10,"rope_parameters":{"rope_theta":1000000.0,"rope_type":"linear","factor":2.0},"quantization":{"group_size":64,"bits":4,"mode":"affine","lm_head":{"group_size":64,"bits":8},"model.embed_tokens":false}}"#.to_vec(),
        br#"{"model_type":"qwen2","hidden_size":8,"intermediate_size":8,"num_attention_heads":2,"num_hidden_layers":1,"vocab_size":4,"quantization_config":{"group_size":32,"bits":8}}"#.to_vec(),
    ]
}

fn ct2_str(out: &mut Vec<u8>, v: &str) {
    out.extend_from_slice(&(v.len() as u16 + 1).to_le_bytes());
    out.extend_from_slice(v.as_bytes());
    out.push(0);
}

/// CTranslate2 model.bin: version 6 (dtype ids, aliases) and version 1 (item sizes).
pub fn ct2() -> Vec<Vec<u8>> {
    let mut v6 = 6u32.to_le_bytes().to_vec();
    ct2_str(&mut v6, "WhisperSpec");
    v6.extend_from_slice(&3u32.to_le_bytes());
    v6.extend_from_slice(&3u32.to_le_bytes()); // variables
    ct2_str(&mut v6, "encoder/conv1/weight");
    v6.push(2);
    for d in [2u32, 2] {
        v6.extend_from_slice(&d.to_le_bytes());
    }
    v6.push(0); // float32
    v6.extend_from_slice(&16u32.to_le_bytes());
    v6.extend_from_slice(&f32_bytes(&[1.0, -2.0, 0.5, 3.0]));
    ct2_str(&mut v6, "num_heads");
    v6.push(0); // scalar
    v6.push(3); // int32
    v6.extend_from_slice(&4u32.to_le_bytes());
    v6.extend_from_slice(&6i32.to_le_bytes());
    ct2_str(&mut v6, "decoder/embeddings/weight");
    v6.push(1);
    v6.extend_from_slice(&3u32.to_le_bytes());
    v6.push(4); // float16
    v6.extend_from_slice(&6u32.to_le_bytes());
    v6.extend_from_slice(&[0, 0x3c, 0, 0xc0, 0, 0x38]);
    v6.extend_from_slice(&1u32.to_le_bytes()); // aliases
    ct2_str(&mut v6, "decoder/projection/weight");
    ct2_str(&mut v6, "decoder/embeddings/weight");

    let mut v1 = 1u32.to_le_bytes().to_vec();
    v1.extend_from_slice(&1u32.to_le_bytes());
    ct2_str(&mut v1, "w");
    v1.push(1);
    v1.extend_from_slice(&2u32.to_le_bytes());
    v1.push(4); // item size 4: float32
    v1.extend_from_slice(&2u32.to_le_bytes());
    v1.extend_from_slice(&f32_bytes(&[1.0, 2.0]));
    vec![v6, v1]
}

/// whisper.cpp ggml files: hparams, a 2 x 2 filterbank, a vocabulary of the 256 bytes and a
/// few merges, then an f32 bias, an f16 matrix and a q8_0 row.
pub fn whisper_ggml() -> Vec<Vec<u8>> {
    let i32s = |out: &mut Vec<u8>, v: &[i32]| {
        for x in v {
            out.extend_from_slice(&x.to_le_bytes());
        }
    };
    let mut f = 0x6767_6d6cu32.to_le_bytes().to_vec();
    i32s(&mut f, &[51864, 1500, 384, 6, 4, 448, 384, 6, 4, 80, 1]);
    i32s(&mut f, &[2, 2]);
    f.extend_from_slice(&f32_bytes(&[0.0, 0.5, 1.0, 1.5]));
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for t in [&b"th"[..], b"the", b" t", b" the", b"12"] {
        tokens.push(t.to_vec());
    }
    i32s(&mut f, &[tokens.len() as i32]);
    for t in &tokens {
        f.extend_from_slice(&(t.len() as u32).to_le_bytes());
        f.extend_from_slice(t);
    }
    let small = f.clone();
    let mut tensor = |name: &str, ty: i32, dims: &[i32], data: &[u8]| {
        i32s(&mut f, &[dims.len() as i32, name.len() as i32, ty]);
        i32s(&mut f, dims);
        f.extend_from_slice(name.as_bytes());
        f.extend_from_slice(data);
    };
    tensor("encoder.conv1.bias", 0, &[1, 2], &f32_bytes(&[1.0, 2.0]));
    tensor("w", 1, &[2, 2], &[0, 0x3c, 0, 0xc0, 0, 0x38, 0, 0x3c]);
    let row: Vec<f32> = (0..32).map(|i| i as f32 * 0.25 - 4.0).collect();
    let q = kiln_quant::quantize(GgmlType::Q8_0, &row).unwrap_or_default();
    tensor("encoder.blocks.0.mlp.0.weight", 8, &[32, 1], &q);
    let mut one = small;
    i32s(&mut one, &[1, 1, 0, 1]);
    one.extend_from_slice(b"x");
    one.extend_from_slice(&f32_bytes(&[3.0]));
    vec![f, one]
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// One protobuf field: key, then the length for wire type 2.
fn field(num: u64, wt: u64, body: &[u8], out: &mut Vec<u8>) {
    varint(num << 3 | wt, out);
    if wt == 2 {
        varint(body.len() as u64, out);
    }
    out.extend_from_slice(body);
}

/// ONNX ModelProto: a graph with a raw f32 initializer, a typed int64 one, a Constant node
/// with float/int/ints/tensor attributes, and a graph input and output.
pub fn onnx() -> Vec<Vec<u8>> {
    let mut raw = Vec::new();
    field(1, 2, &[2, 3], &mut raw); // packed dims
    field(2, 0, &[1], &mut raw); // float
    field(8, 2, b"w", &mut raw);
    field(9, 2, &f32_bytes(&[0., 1., 2., 3., 4., 5.]), &mut raw);
    let mut typed = Vec::new();
    field(1, 0, &[2], &mut typed);
    field(2, 0, &[7], &mut typed); // int64
    field(8, 2, b"shape", &mut typed);
    let mut packed = Vec::new();
    varint(5, &mut packed);
    varint((-1i64) as u64, &mut packed);
    field(7, 2, &packed, &mut typed);
    let mut node = Vec::new();
    field(1, 2, b"w", &mut node);
    field(2, 2, b"y", &mut node);
    field(3, 2, b"n0", &mut node);
    field(4, 2, b"Constant", &mut node);
    let mut a = Vec::new();
    field(1, 2, b"alpha", &mut a);
    field(2, 5, &0.5f32.to_le_bytes(), &mut a);
    field(20, 0, &[1], &mut a);
    field(5, 2, &a, &mut node);
    let mut a = Vec::new();
    field(1, 2, b"axes", &mut a);
    field(8, 2, &[1, 2, 3], &mut a);
    field(20, 0, &[7], &mut a);
    field(5, 2, &a, &mut node);
    let mut a = Vec::new();
    field(1, 2, b"value", &mut a);
    field(5, 2, &raw, &mut a);
    field(20, 0, &[4], &mut a);
    field(5, 2, &a, &mut node);
    let mut vi = Vec::new();
    field(1, 2, b"x", &mut vi);
    let mut g = Vec::new();
    field(1, 2, &node, &mut g);
    field(5, 2, &raw, &mut g);
    field(5, 2, &typed, &mut g);
    field(11, 2, &vi, &mut g);
    field(12, 2, &vi, &mut g);
    let mut m = Vec::new();
    field(1, 0, &[8], &mut m); // ir_version
    field(7, 2, &g, &mut m);
    vec![m]
}

/// A version-1 `.npy` image of little-endian f32.
pub fn npy(shape: &str, vals: &[f32]) -> Vec<u8> {
    let mut h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend((h.len() as u16).to_le_bytes());
    b.extend(h.as_bytes());
    b.extend(f32_bytes(vals));
    b
}

pub fn voice_npy() -> Vec<Vec<u8>> {
    vec![
        npy("(1, 1, 256)", &[0.25; 256]),
        npy("(2, 256)", &[0.5; 512]),
    ]
}

/// An `.npz` (zip, members stored) of `(name, npy bytes)`, with its central directory.
pub fn npz(members: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in members {
        let at = out.len() as u32;
        let mut h = b"PK\x03\x04".to_vec();
        h.extend(20u16.to_le_bytes()); // version
        h.extend(0u16.to_le_bytes()); // flags
        h.extend(0u16.to_le_bytes()); // stored
        h.extend([0; 8]); // time, date, crc (not checked by the reader)
        h.extend((data.len() as u32).to_le_bytes());
        h.extend((data.len() as u32).to_le_bytes());
        h.extend((name.len() as u16).to_le_bytes());
        h.extend(0u16.to_le_bytes());
        h.extend(name.as_bytes());
        out.extend(h);
        out.extend(data);
        let mut c = b"PK\x01\x02".to_vec();
        c.extend([20, 0, 20, 0, 0, 0, 0, 0]);
        c.extend([0; 8]);
        c.extend((data.len() as u32).to_le_bytes());
        c.extend((data.len() as u32).to_le_bytes());
        c.extend((name.len() as u16).to_le_bytes());
        c.extend([0; 12]);
        c.extend(at.to_le_bytes());
        c.extend(name.as_bytes());
        central.extend(c);
    }
    let cd_at = out.len() as u32;
    out.extend(&central);
    out.extend(b"PK\x05\x06");
    out.extend([0; 4]);
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(cd_at.to_le_bytes());
    out.extend([0; 2]);
    out
}

pub fn voice_npz() -> Vec<Vec<u8>> {
    vec![npz(&[
        ("af_heart.npy", npy("(1, 1, 256)", &[0.1; 256])),
        ("am_adam.npy", npy("(2, 1, 256)", &[-0.1; 512])),
    ])]
}

/// Files written by PyTorch 2.11 itself (`tools/make_torch_fixtures.py`): a nested state dict
/// (OrderedDict, f32 / f16 / bf16 / int64 / 0-d tensors, a transposed and a sliced view of one
/// storage, weight-norm pairs) and a bare tensor.
pub fn torch() -> Vec<Vec<u8>> {
    vec![
        include_bytes!("../../kiln-formats/tests/fixtures/torch/state.pth").to_vec(),
        include_bytes!("../../kiln-formats/tests/fixtures/torch/voice.pt").to_vec(),
    ]
}

/// A RIFF/WAVE file: PCM (format 1) or IEEE float (format 3).
pub fn wav(format: u16, channels: u16, rate: u32, bits: u16, data: &[u8]) -> Vec<u8> {
    let mut b = b"RIFF".to_vec();
    b.extend((36 + data.len() as u32).to_le_bytes());
    b.extend(b"WAVEfmt ");
    b.extend(16u32.to_le_bytes());
    b.extend(format.to_le_bytes());
    b.extend(channels.to_le_bytes());
    b.extend(rate.to_le_bytes());
    let align = channels * bits / 8;
    b.extend((rate * align as u32).to_le_bytes());
    b.extend(align.to_le_bytes());
    b.extend(bits.to_le_bytes());
    b.extend(b"data");
    b.extend((data.len() as u32).to_le_bytes());
    b.extend(data);
    b
}

pub fn audio() -> Vec<Vec<u8>> {
    let pcm16: Vec<u8> = (0..64i16).flat_map(|i| (i * 300).to_le_bytes()).collect();
    let pcm24: Vec<u8> = (0..32u32)
        .flat_map(|i| (i * 5000).to_le_bytes()[..3].to_vec())
        .collect();
    let float: Vec<u8> = f32_bytes(&(0..32).map(|i| (i as f32 / 40.0).sin()).collect::<Vec<_>>());
    vec![
        wav(1, 1, 16000, 16, &pcm16),
        wav(1, 2, 44100, 24, &pcm24),
        wav(3, 2, 22050, 32, &float),
        wav(1, 1, 8000, 8, &[128, 140, 150, 120, 100, 128]),
        flac(&[(0..16).map(|i| i * 100 - 800).collect(), vec![7; 16]]),
        mp3_silence(4),
        ogg_opus(),
    ]
}

/// 60 ms of a tone as Ogg Opus (kiln's own encoder), three packets and the header pages.
fn ogg_opus() -> Vec<u8> {
    let tone: Vec<i16> = (0..1440)
        .map(|i| ((i as f32 * 0.07).sin() * 9000.0) as i16)
        .collect();
    let mut s = kiln_audio::opus::OpusStream::new(24_000).expect("24 kHz is an Opus rate");
    let mut b = s.push(&tone).expect("encodes");
    b.extend(s.finish().expect("encodes"));
    b
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

/// A mono 16-bit 44.1 kHz FLAC stream: STREAMINFO, then one frame of 16 samples per block,
/// each a verbatim subframe (so every sample is stored as is), with both frame CRCs.
pub fn flac(blocks: &[Vec<i16>]) -> Vec<u8> {
    let mut b = b"fLaC".to_vec();
    b.extend([0x80, 0, 0, 34]); // last block, STREAMINFO, 34 bytes
    b.extend(16u16.to_be_bytes()); // min block size
    b.extend(16u16.to_be_bytes()); // max block size
    b.extend([0; 6]); // min, max frame size: unknown
    let total = 16 * blocks.len() as u64;
    let packed = 44100u64 << 44 | 15 << 36 | total; // rate, channels - 1 = 0, bits - 1 = 15
    b.extend(packed.to_be_bytes());
    b.extend([0; 16]); // MD5: not given
    for (i, block) in blocks.iter().enumerate() {
        // Sync + fixed blocking; block size from an 8-bit field, 44.1 kHz; mono, 16-bit.
        let mut f = vec![0xff, 0xf8, 0x69, 0x08, i as u8, 15];
        f.push(crc8(&f));
        f.push(0x02); // verbatim subframe, no wasted bits
        for &s in block.iter().take(16) {
            f.extend(s.to_be_bytes());
        }
        let crc = crc16(&f);
        f.extend(crc.to_be_bytes());
        b.extend(f);
    }
    b
}

/// `n` silent MPEG-1 Layer III frames (128 kb/s, 44.1 kHz, mono): header, zero side info and
/// zero main data, 417 bytes each.
pub fn mp3_silence(n: usize) -> Vec<u8> {
    let mut frame = vec![0xff, 0xfb, 0x90, 0xc0];
    frame.resize(417, 0);
    frame.repeat(n)
}

/// Chat templates in the shapes models ship: ChatML, Llama 3 with a system-message split,
/// one with macros, namespaces, filters and tojson.
pub fn chat_template() -> Vec<Vec<u8>> {
    [
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        "{{- bos_token }}\n{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{{- system_message }}{{- \"<|eot_id|>\" }}\n{%- for message in messages %}\n    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n{%- endfor %}\n{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}",
        "{%- macro render(m) -%}[{{ m.role | upper }}] {{ m.content.strip() }}{%- endmacro -%}\n{%- set ns = namespace(n=0, last='') -%}\n{%- for m in messages -%}{%- set ns.n = ns.n + 1 -%}{%- set ns.last = m.role -%}{{ render(m) }}{% if not loop.last %}\\n{% endif %}{%- endfor -%}\n{{ ns.n }} {{ ns.last }} {{ messages | length }} {{ {'a': [1, 2.5, none, true]} | tojson }} {{ 'x,y'.split(',') | join('|') }} {{ (messages | map(attribute='role') | list)[-1] }}{% if tools is none %}{{ raise_exception('no tools') if false }}{% endif %}",
    ]
    .iter()
    .map(|t| t.as_bytes().to_vec())
    .collect()
}
