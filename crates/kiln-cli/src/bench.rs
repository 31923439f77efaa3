//! `kiln bench`: prompt processing (`pp`) and decode (`tg`) throughput, reported like
//! llama-bench (markdown table or JSON lines with its field names), with the effective memory
//! bandwidth of decode and, on request, the machine's read bandwidth to compare it with.

use kiln_backend::TensorOps;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use clap::Args;
use kiln_backend::cpu::{default_threads, membw, CpuBackend, Pool};
use kiln_backend::{Backend, FED_TOKEN};
use kiln_formats::GgufFile;
use kiln_models::llm::{Llama, Logits, SeqChunk};
use kiln_runtime::grammar::{Grammars, MaskWorker};
use kiln_runtime::Grammar;
use serde_json::json;

use crate::{resolve_model, DEFAULT_LLM};

/// Tokens per forward call when processing a prompt (llama-bench's default `n_ubatch`).
const UBATCH: usize = 512;
/// Bytes `membw::read_bandwidth` streams per pass.
const MEMBW_BYTES: usize = 1 << 30;
/// Token ids are drawn from a fixed seed, so runs repeat.
const SEED: u64 = 0x5eed;

#[derive(Args)]
pub struct BenchArgs {
    /// Model to test (repeatable): a GGUF file, a directory, or a catalog name
    /// [default: smollm2-135m-instruct, unless only --membw is asked for].
    #[arg(short = 'm', long = "model")]
    models: Vec<String>,
    /// Prompt lengths, comma-separated: one `ppP` test each (0 skips).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,
    /// Decode lengths, comma-separated: one `tgN` test each (0 skips).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,
    /// Sequences decoded together in each `tg` test, comma-separated (llama-batched-bench's
    /// -npl): P sequences each at its own cache, one batched forward a step for all of them
    /// (as `kiln serve --parallel` runs them), reported as `tgNxP`, tokens/s over all P.
    #[arg(long = "parallel", value_delimiter = ',', default_value = "1")]
    parallel: Vec<usize>,
    /// Cache depths, comma-separated (llama-bench's -d/--n-depth): each test starts with
    /// this many tokens already in the cache (filled untimed), reported as `ppP @ dD`.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    n_depth: Vec<usize>,
    /// How the KV cache stores keys and values: f32, f16, q8_0 (llama-bench's -ctk/-ctv).
    /// Default: f16 where the device's attention reads it directly, else f32 (as `run`).
    #[arg(long = "kv-type", value_name = "TYPE", value_parser = crate::parse_kv)]
    kv_type: Option<kiln_backend::KvType>,
    /// Timed repetitions of each test, after one untimed warm-up run.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Thread counts, comma-separated (default: all CPUs).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    threads: Vec<usize>,
    /// One JSON object per line per test instead of the table.
    #[arg(long)]
    json: bool,
    /// Also measure the memory read bandwidth: the host's per thread count (after the rows),
    /// or with `--device cuda` the GPU's (before them; each decode row then shows its
    /// effective GB/s as a share of it).
    #[arg(long)]
    membw: bool,
    /// Speech to text instead: transcribe this audio file with a Whisper model (-m, default
    /// whisper-tiny.en) and report encoder ms, decode ms/token and real-time factor.
    #[arg(long)]
    stt: Option<PathBuf>,
    /// With --stt: quantize the linear weights at load.
    #[arg(long, value_enum, default_value = "none")]
    quant: crate::stt_cmd::Quant,
    /// Text-to-speech instead: time to first audio and real-time factor for this text
    /// (`-m` then names the TTS model, default kokoro-82m).
    #[arg(long)]
    tts: Option<String>,
    /// Voice for --tts.
    #[arg(long, default_value = "jf_alpha")]
    voice: String,
    /// The --tts text is Kokoro phonemes (one utterance per line).
    #[arg(long)]
    phonemes: bool,
    /// Also time each single-sequence `tgN` constrained to this JSON schema (a file, or the
    /// schema itself when it starts with `{`; `object`: any JSON object), reported as
    /// `tgN json`: each step's grammar mask (computed while the forward runs on a device),
    /// the greedy pick from the masked row, as constrained requests decode (masked on the
    /// device where the backend can, else on the host).
    #[arg(long = "json-schema", value_name = "SCHEMA")]
    json_schema: Option<String>,
    /// Where the LLM runs: cpu, cuda (a build with `--features cuda` and an NVIDIA GPU), or
    /// gpu (a build with `--features gpu`: wgpu over Vulkan or Metal).
    #[arg(long, value_enum, default_value = "cpu")]
    device: crate::Device,
    /// With --device gpu: the first adapter whose name contains this (case-insensitive)
    /// [default: the best one, discrete > integrated > CPU].
    #[arg(long, value_name = "NAME")]
    adapter: Option<String>,
}

#[derive(Clone, Copy)]
enum Test {
    /// One forward of `n` prompt tokens from position 0.
    Prompt(usize),
    /// `n` single-token decode steps from position 0, of `p` sequences together.
    Gen(usize, usize),
    /// `n` decode steps of one sequence under the `--json-schema` grammar.
    GenSchema(usize),
}

impl Test {
    /// `pp512`, `tg128x4`, and ` @ d4096` after either at a depth.
    fn name(self, depth: usize) -> String {
        let t = match self {
            Test::Prompt(n) => format!("pp{n}"),
            Test::Gen(n, 1) => format!("tg{n}"),
            Test::Gen(n, p) => format!("tg{n}x{p}"),
            Test::GenSchema(n) => format!("tg{n} json"),
        };
        match depth {
            0 => t,
            d => format!("{t} @ d{d}"),
        }
    }

    fn tokens(self) -> usize {
        match self {
            Test::Prompt(n) => n,
            Test::Gen(n, p) => n * p,
            Test::GenSchema(n) => n,
        }
    }
}

/// A loaded model and what the report says about it.
struct BenchModel<B: Backend> {
    file: PathBuf,
    /// e.g. "llama 135M Q4_1": architecture, parameter count, the file type (its
    /// `general.file_type`, else the format holding most bytes).
    desc: String,
    model: Llama<B>,
    size: usize,
    n_params: usize,
    /// Weight bytes one decode step reads: every matrix but the embedding table (of which it
    /// reads one row) unless the table is also the output projection; norms and biases.
    decode_bytes: usize,
    /// K and V bytes per cached position of one layer, as the backend stores them.
    kv_bytes_per_pos: usize,
    /// Each attention layer's sliding window (0: every position).
    windows: Vec<usize>,
    /// The cache type asked for (`--kv-type`, else the backend's default for the model).
    kv: kiln_backend::KvType,
}

impl<B: Backend> BenchModel<B> {
    /// Loads `file` with `b` (CPU weights do not depend on the thread pool: one load serves
    /// every thread count); `kv`: the cache type asked for.
    fn load(file: &Path, b: &B, kv: Option<kiln_backend::KvType>) -> anyhow::Result<Self> {
        let load = || -> anyhow::Result<Self> {
            let (model, dominant) = if kiln_models::llm::is_hf_dir(file) {
                let ck = kiln_models::llm::HfCheckpoint::open(file)?;
                let ty = match &ck.mlx {
                    Some(q) => format!("MLX{}", q.bits),
                    None => hf_dominant_dtype(&ck.tensors).to_string(),
                };
                (Llama::load_hf(b, &ck, None)?, ty)
            } else {
                let g = GgufFile::open(file)?;
                // Refused before loading when it cannot fit, as every command does.
                kiln_runtime::memory::check_gguf_fits(&g, None, file)?;
                (Llama::load(b, &g)?, dominant_type(&g).to_string())
            };
            let size = model.weight_bytes(b);
            let n_params = model.n_params();
            let embed_unread = match model.output {
                Some(_) => b.weight_bytes(&model.embed),
                None => 0,
            };
            let c = &model.cfg;
            let desc = format!("{} {} {}", c.arch, params_label(n_params), dominant);
            // What the backend stores for the type asked (CUDA: f16 for f32); a type the
            // head size does not fit is refused as the cache would refuse it.
            let kv = kv.unwrap_or_else(|| b.kv_type_default(c.head_dim));
            let stored = b.kv_type_stored(kv);
            stored.check(c.head_dim)?;
            let row = stored.ggml().row_bytes(c.head_dim)?;
            let kv_bytes_per_pos = 2 * c.n_kv_heads * row;
            // Attention layers only read a KV cache (LFM2's convolution layers read k - 1 rows).
            let windows = (0..c.n_layers)
                .filter(|&il| !c.is_conv(il))
                .map(|il| c.window(il))
                .collect();
            Ok(BenchModel {
                file: file.to_path_buf(),
                desc,
                model,
                size,
                n_params,
                decode_bytes: size - embed_unread,
                kv_bytes_per_pos,
                windows,
                kv,
            })
        };
        load().with_context(|| format!("loading {}", file.display()))
    }

    /// Bytes one decode step of a `tgN` run from depth `d` reads, on average: the weights,
    /// and each layer's keys and values at the positions its tokens attend (d + t + 1 for
    /// the token t, at most the layer's window).
    fn decode_bytes_per_token(&self, n: usize, d: usize) -> f64 {
        let positions = attended_positions(&self.windows, n, d);
        self.decode_bytes as f64 + self.kv_bytes_per_pos as f64 * positions
    }

    /// Effective bandwidth of a `tgN` run at `tps` tokens/s from depth `d`.
    fn decode_gbps(&self, n: usize, d: usize, tps: f64) -> f64 {
        self.decode_bytes_per_token(n, d) * tps / 1e9
    }

    /// Errors unless the KV caches of `test` from depth `d` fit in the host's memory (the
    /// CPU's caches; a GPU backend's own memory says for itself): each sequence's cache
    /// of d + n positions, a windowed layer's slots for steps of up to `UBATCH`.
    fn check_cache_fits(&self, test: Test, d: usize) -> anyhow::Result<()> {
        let (n, par) = match test {
            Test::Gen(n, p) => (n, p),
            Test::Prompt(n) | Test::GenSchema(n) => (n, 1),
        };
        let ctx = d.saturating_add(n);
        let positions = self.model.cfg.kv_cache_positions(ctx, UBATCH);
        let need = (positions as u128 * self.kv_bytes_per_pos as u128 * par as u128)
            .min(u64::MAX as u128) as u64;
        let what = format!("the KV cache of {} ({ctx} positions)", test.name(d));
        Ok(kiln_runtime::memory::check_fits(need, &what)?)
    }
}

/// Cached positions a decode step reads over all layers (`windows`: each layer's sliding
/// window, 0 for none), averaged over the `n` tokens of a run from depth `d`: the token t
/// attends d + t + 1 positions, at most its layer's window.
fn attended_positions(windows: &[usize], n: usize, d: usize) -> f64 {
    let n = n.max(1);
    let per_layer = |w: usize| -> f64 {
        let seen = |t: usize| match w {
            0 => d + t + 1,
            w => (d + t + 1).min(w),
        };
        (0..n).map(seen).sum::<usize>() as f64 / n as f64
    };
    windows.iter().map(|&w| per_layer(w)).sum()
}

/// `n` tokens decoded greedily under `g` from `first` at `depth`, as `generate` runs where
/// the backend feeds picks: each step's mask is computed on a worker thread while its forward
/// runs; if the mask comes first, it is applied on the device, the pick fed to the next
/// forward (queued before the pick is read back); if the forward ends first, the best
/// allowed of its raw pick and top candidates is taken (the masked pick). A finished document
/// starts the next (the grammar reset, not compiled again). `print`: where a token's time
/// goes, on stderr.
#[allow(clippy::too_many_arguments)]
fn json_fed<B: Backend>(
    llama: &Llama<B>,
    b: &B,
    st: &mut kiln_models::llm::LlamaState<B>,
    grammars: &Grammars,
    g: &Grammar,
    first: u32,
    depth: usize,
    n: usize,
    print: bool,
) -> anyhow::Result<()> {
    let cols = grammars.vocab().min(llama.cfg.vocab_size);
    let mut c = grammars.compile(g)?;
    let mut worker = MaskWorker::new(c.fork());
    let (mut phase, mut raw_picks) = ([Duration::ZERO; 4], 0);
    llama.forward_last(b, st, &[first], depth)?;
    for i in 0..n {
        let t0 = Instant::now();
        let raw = worker.mask_or_raw(
            &mut c,
            || b.work_done(),
            |allowed| llama.best_allowed_last(b, st, cols, allowed),
        );
        let t1 = Instant::now();
        let (tok, t2) = match raw {
            Some(t) => {
                raw_picks += 1;
                if i + 1 < n {
                    llama.forward_last(b, st, &[t], depth + i + 1)?;
                }
                (t, Instant::now())
            }
            None => {
                let w = c.allowed_words().context("the grammar failed")?;
                anyhow::ensure!(
                    llama.mask_last(b, st, cols, w),
                    "the backend masks no logits"
                );
                llama.argmax_feed_last(b, st, cols);
                if i + 1 < n {
                    llama.forward_last(b, st, &[FED_TOKEN], depth + i + 1)?;
                }
                let t2 = Instant::now();
                (b.fed_token().context("the backend fed no pick")?, t2)
            }
        };
        let t3 = Instant::now();
        if grammars.is_end(tok) || c.accept(tok).is_err() || c.done() {
            c.reset()?;
            worker.reset();
        } else {
            worker.accept(tok);
        }
        for (p, d) in phase
            .iter_mut()
            .zip([t1 - t0, t2 - t1, t3 - t2, t3.elapsed()])
        {
            *p += d;
        }
    }
    if print {
        let us = |d: Duration| d.as_secs_f64() * 1e6 / n.max(1) as f64;
        eprintln!(
            "json (picks fed on the device): per token {:.1} us waiting for the mask or the \
             forward, {:.1} us queueing, {:.1} us waiting for the pick, {:.1} us accepting; \
             {raw_picks} of {n} picks found without the mask (the forward first)",
            us(phase[0]),
            us(phase[1]),
            us(phase[2]),
            us(phase[3])
        );
    }
    Ok(())
}

/// Runs `test` from cache depth `depth` once untimed, then `reps` times; returns each timed
/// run's nanoseconds.
fn run_test<B: Backend>(
    m: &BenchModel<B>,
    b: &B,
    test: Test,
    depth: usize,
    reps: usize,
    kv: kiln_backend::KvType,
    schema: Option<(&Grammars, &Grammar)>,
) -> anyhow::Result<(Vec<u64>, Option<HostPerToken>)> {
    let llama = &m.model;
    let n = test.tokens();
    let tokens = random_tokens(n, llama.cfg.vocab_size, SEED);
    let max_batch = match test {
        Test::Prompt(n) => n.min(UBATCH),
        Test::Gen(..) | Test::GenSchema(_) => 1,
    };
    // Every run starts at the same depth, and the positions after it are written before they
    // are read: one state (its first `depth` positions filled once) serves every run.
    let (ctx, par) = match test {
        Test::Gen(n, p) => (depth + n, p),
        Test::Prompt(n) | Test::GenSchema(n) => (depth + n, 1),
    };
    let fill = (depth > 0).then(|| random_tokens(depth, llama.cfg.vocab_size, SEED ^ 0xd));
    let fill_batch = depth.clamp(1, UBATCH);
    // Each run goes back `n` positions to the depth: a sliding-window layer's cache keeps
    // that many before its window (its steps' size).
    let step = max_batch.max(fill_batch);
    let mut st = match par > 1 {
        true => llama.new_state_kv(b, 1, 1, kv)?,
        false => llama.state_with(b, step, llama.new_cache_kv(b, ctx, step.max(n), kv)?),
    };
    if let (Some(f), 1) = (&fill, par) {
        for (i, c) in f.chunks(fill_batch).enumerate() {
            llama.forward(b, &mut st, c, i * fill_batch, false)?;
        }
    }
    // The parallel test's caches and scratch (rows for every sequence's token).
    let mut par = match par > 1 {
        true => {
            let mut caches = (0..par)
                .map(|_| llama.new_cache_kv(b, ctx, fill_batch.max(n), kv))
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(f) = &fill {
                let mut sc = llama.new_scratch(b, fill_batch, 1, 1);
                for cache in &mut caches {
                    for (i, c) in f.chunks(fill_batch).enumerate() {
                        let mut seq = [SeqChunk {
                            cache: &mut *cache,
                            tokens: c,
                            pos0: i * fill_batch,
                        }];
                        llama.forward_seqs(b, &mut sc, &mut seq, Logits::Last)?;
                    }
                }
            }
            Some((caches, llama.new_scratch(b, par, par, par)))
        }
        false => None,
    };
    let mut samples = Vec::with_capacity(reps);
    let mut host0 = None;
    for rep in 0..=reps {
        if rep == 1 {
            host0 = b.host_counters();
        }
        let t0 = Instant::now();
        match test {
            Test::Prompt(_) => {
                llama.forward(b, &mut st, &tokens, depth, false)?;
            }
            Test::Gen(_, 1) if llama.feeds_picks(b) => {
                // As greedy decoding runs where the device feeds its picks: each step's pick
                // is the next step's token, that step queued before the pick is read back;
                // timed to the last token on the host.
                let cols = llama.cfg.vocab_size;
                llama.forward_last(b, &mut st, &tokens[..1], depth)?;
                for i in 0..tokens.len() {
                    llama.argmax_feed_last(b, &st, cols);
                    if i + 1 < tokens.len() {
                        llama.forward_last(b, &mut st, &[FED_TOKEN], depth + i + 1)?;
                    }
                    b.fed_token().context("the backend fed no pick")?;
                }
            }
            Test::GenSchema(n) if llama.feeds_picks(b) => {
                let (grammars, g) = schema.context("a json test needs --json-schema")?;
                let print = rep == reps;
                json_fed(llama, b, &mut st, grammars, g, tokens[0], depth, n, print)?;
            }
            Test::Gen(_, 1) => {
                // Each step ends with a greedy pick (as decoding does), so a device backend
                // is timed to the token on the host, not to the queueing of its work.
                for (i, &tok) in tokens.iter().enumerate() {
                    llama.forward_argmax(b, &mut st, &[tok], depth + i)?;
                }
            }
            Test::GenSchema(n) => {
                let (grammars, g) = schema.context("a json test needs --json-schema")?;
                let cols = grammars.vocab().min(llama.cfg.vocab_size);
                let mut cs = vec![grammars.compile(g)?];

                let mut row = vec![0f32; cols];
                let mut tok = tokens[0];
                let beside = kiln_runtime::grammar::masks_beside(b);
                let mut masker = kiln_runtime::grammar::Masker::new(beside);
                cs[0].lazy = !beside;
                // Where a token's time goes (the timed repetitions'), for the line under
                // the row: the forward, waiting for the mask beyond it, the pick, the accept.
                let mut phase = [Duration::ZERO; 4];
                for i in 0..n {
                    let t_step = Instant::now();
                    let mut t_fwd = Duration::ZERO;
                    masker.around(&mut cs, || {
                        let t = Instant::now();
                        let r = llama.forward_last(b, &mut st, &[tok], depth + i);
                        t_fwd = t.elapsed();
                        r
                    })?;
                    let t_pick = Instant::now();
                    phase[0] += t_fwd;
                    phase[1] += t_pick - t_step - t_fwd;
                    let c = &mut cs[0];
                    // As greedy generation does: the raw pick if the grammar allows it, else
                    // masked and picked on the device where it can.
                    let raw = c.lazy.then(|| llama.argmax_last(b, &st, cols));
                    let fits = raw.is_some_and(|t| c.allows_fast(t));
                    let on_device = !fits
                        && c.allowed_words()
                            .is_some_and(|w| llama.mask_last(b, &mut st, cols, w));
                    tok = if let Some(t) = raw.filter(|_| fits) {
                        t
                    } else if on_device {
                        llama.argmax_last(b, &st, cols)
                    } else {
                        row.copy_from_slice(&llama.logits_last(b, &mut st)[..cols]);
                        c.apply(&mut row)?;
                        kiln_backend::argmax_first(&row)
                    };
                    // A finished document (or an end token) starts the next one (the grammar
                    // reset, not compiled again: compiling is per request, not per token).
                    let t_accept = Instant::now();
                    phase[2] += t_accept - t_pick;
                    if grammars.is_end(tok) || c.accept(tok).is_err() || c.done() {
                        c.reset()?;
                    }
                    phase[3] += t_accept.elapsed();
                }
                if rep == reps {
                    let us = |d: Duration| d.as_secs_f64() * 1e6 / n.max(1) as f64;
                    eprintln!(
                        "json: per token {:.1} us forward, {:.1} us waiting for the mask past it, \
                         {:.1} us picking, {:.1} us accepting",
                        us(phase[0]),
                        us(phase[1]),
                        us(phase[2]),
                        us(phase[3])
                    );
                }
            }
            Test::Gen(n, p) => {
                let par = par.as_mut().expect("made for parallel tests");
                let vocab = llama.cfg.vocab_size;
                for pos in 0..n {
                    // Sequence i reads the fixed tokens from offset i.
                    let feeds: Vec<[u32; 1]> = (0..p).map(|i| [tokens[(pos + i) % n]]).collect();
                    let mut seqs: Vec<SeqChunk<'_, B>> = par
                        .0
                        .iter_mut()
                        .zip(&feeds)
                        .map(|(cache, f)| SeqChunk {
                            cache,
                            tokens: f,
                            pos0: depth + pos,
                        })
                        .collect();
                    let rows = llama.forward_seqs(b, &mut par.1, &mut seqs, Logits::Last)?;
                    llama.argmax(b, &par.1, rows, vocab);
                }
            }
        }
        let ns = t0.elapsed().as_nanos() as u64;
        if rep > 0 {
            samples.push(ns.max(1));
        }
    }
    // The timed runs' host work, per token.
    let per_token = host0.zip(b.host_counters()).map(|(a, z)| {
        let n = (test.tokens() * reps).max(1) as f64;
        HostPerToken {
            dispatches: (z.dispatches - a.dispatches) as f64 / n,
            record_ns: (z.record_ns - a.record_ns) as f64 / n,
            submit_ns: (z.submit_ns - a.submit_ns) as f64 / n,
        }
    });
    Ok((samples, per_token))
}

/// A device backend's host work per token of a test ([`TensorOps::host_counters`]).
#[derive(Debug, Clone, Copy)]
struct HostPerToken {
    dispatches: f64,
    record_ns: f64,
    submit_ns: f64,
}

/// One test's timed runs and what the report needs to describe them.
struct Measured<'a, B: Backend> {
    model: &'a BenchModel<B>,
    backend: &'a str,
    threads: usize,
    test: Test,
    depth: usize,
    samples_ns: Vec<u64>,
    /// The backend's host work per token, where it counts it.
    host: Option<HostPerToken>,
    /// When the test started, RFC 3339.
    test_time: String,
    /// [`Run::peak_gbps`].
    peak_gbps: Option<f64>,
}

impl<B: Backend> Measured<'_, B> {
    fn samples_ts(&self) -> Vec<f64> {
        let n = self.test.tokens() as f64;
        self.samples_ns
            .iter()
            .map(|&ns| n * 1e9 / ns as f64)
            .collect()
    }

    /// Bytes per token of a single-sequence decode test.
    fn bytes_per_token(&self) -> Option<f64> {
        match self.test {
            Test::Gen(n, 1) | Test::GenSchema(n) => {
                Some(self.model.decode_bytes_per_token(n, self.depth))
            }
            Test::Gen(..) | Test::Prompt(_) => None,
        }
    }

    /// Effective GB/s of a decode test at its mean tokens/s.
    fn gbps(&self, avg_ts: f64) -> Option<f64> {
        match self.test {
            Test::Gen(n, 1) | Test::GenSchema(n) => {
                Some(self.model.decode_gbps(n, self.depth, avg_ts))
            }
            Test::Gen(..) => None,
            Test::Prompt(_) => None,
        }
    }

    fn table_row(&self) -> String {
        let m = self.model;
        let (avg_ts, sd_ts) = mean_sd(&self.samples_ts());
        let share = match self.peak_gbps {
            Some(p) => format!(
                " {:>6} |",
                self.gbps(avg_ts)
                    .map_or(String::new(), |g| format!("{:.0}%", 100.0 * g / p))
            ),
            None => String::new(),
        };
        format!(
            "| {:<30} | {:>10} | {:>10} | {:<7} | {:>7} | {:>13} | {:>20} | {:>8} | {:>7} |{share}",
            m.desc,
            size_label(m.size),
            n_params_label(m.n_params),
            self.backend,
            self.threads,
            self.test.name(self.depth),
            format!("{avg_ts:.2} ± {sd_ts:.2}"),
            self.gbps(avg_ts)
                .map_or(String::new(), |g| format!("{g:.2}")),
            self.bytes_per_token()
                .map_or(String::new(), |b| format!("{:.1}", b / 1e6)),
        )
    }

    /// llama-bench's JSON fields, plus `peak_rss_bytes`, `effective_gbps` and
    /// `bytes_per_token` (decode) and `kernels`.
    fn json(&self, cpu_info: &str, kernels: &str) -> serde_json::Value {
        let m = self.model;
        let samples_ts = self.samples_ts();
        let (avg_ts, sd_ts) = mean_sd(&samples_ts);
        let ns: Vec<f64> = self.samples_ns.iter().map(|&n| n as f64).collect();
        let (avg_ns, sd_ns) = mean_sd(&ns);
        let (n_prompt, n_gen) = match self.test {
            Test::Prompt(n) => (n, 0),
            Test::Gen(n, _) | Test::GenSchema(n) => (0, n),
        };
        let mut o = json!({
            "model_filename": m.file.display().to_string(),
            "model_type": m.desc,
            "model_size": m.size,
            "model_n_params": m.n_params,
            "backends": self.backend,
            "n_threads": self.threads,
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "n_depth": self.depth,
            "n_parallel": match self.test {
                Test::Gen(_, p) => p,
                Test::Prompt(_) | Test::GenSchema(_) => 1,
            },
            "constrained": matches!(self.test, Test::GenSchema(_)),
            "avg_ns": avg_ns.round() as u64,
            "stddev_ns": sd_ns.round() as u64,
            "avg_ts": avg_ts,
            "stddev_ts": sd_ts,
            "samples_ns": self.samples_ns,
            "samples_ts": samples_ts,
            "test_time": self.test_time,
            "build_commit": option_env!("KILN_GIT_HASH").unwrap_or("unknown"),
            "cpu_info": cpu_info,
            "kernels": kernels,
        });
        if let Some(rss) = peak_rss_bytes() {
            o["peak_rss_bytes"] = rss.into();
        }
        if let Some(g) = self.gbps(avg_ts) {
            o["effective_gbps"] = g.into();
            if let Some(p) = self.peak_gbps {
                o["membw_gbps"] = p.into();
                o["bw_fraction"] = (g / p).into();
            }
        }
        if let Some(b) = self.bytes_per_token() {
            o["bytes_per_token"] = (b.round() as u64).into();
        }
        if let Some(h) = self.host {
            o["dispatches_per_token"] = h.dispatches.into();
            o["host_record_ns_per_token"] = h.record_ns.round().into();
            o["host_submit_ns_per_token"] = h.submit_ns.round().into();
        }
        o
    }

    /// The host work line printed under a row (stderr), where the backend counts it.
    fn host_line(&self) -> Option<String> {
        let h = self.host?;
        let per = match self.test {
            Test::Prompt(_) => "prompt token",
            Test::Gen(..) | Test::GenSchema(_) => "token",
        };
        Some(format!(
            "{}: {:.1} dispatches a {per}, host {:.3} ms recording + {:.3} ms submitting a {per}",
            self.test.name(self.depth),
            h.dispatches,
            h.record_ns / 1e6,
            h.submit_ns / 1e6,
        ))
    }
}

pub fn bench(a: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.reps > 0, "-r/--repetitions must be at least 1");
    if let Some(file) = &a.stt {
        let m = crate::stt_cmd::SttModelArgs {
            model: a
                .models
                .first()
                .cloned()
                .unwrap_or(crate::stt_cmd::DEFAULT_STT.into()),
            threads: a.threads.first().copied(),
            quant: a.quant,
            // Whisper's own speed: every window of the file, as peers' benchmarks run.
            vad: crate::stt_cmd::VadArg::Off,
        };
        return crate::stt_cmd::bench(file, &m, a.reps, a.json, a.device, a.adapter.as_deref());
    }
    let threads = match a.threads.is_empty() {
        true => vec![default_threads()],
        false => a.threads.clone(),
    };
    anyhow::ensure!(
        !threads.contains(&0),
        "-t/--threads: thread counts must be at least 1"
    );
    anyhow::ensure!(
        !a.parallel.contains(&0),
        "--parallel: sequence counts must be at least 1"
    );
    if let Some(text) = &a.tts {
        let model = a
            .models
            .first()
            .map_or(crate::speak::DEFAULT_TTS, |m| m.as_str());
        return crate::speak::bench(
            text,
            a.phonemes,
            model,
            &a.voice,
            a.reps,
            &threads,
            a.json,
            a.device,
            a.adapter.as_deref(),
        );
    }
    let names = match a.models.is_empty() && !a.membw {
        true => vec![DEFAULT_LLM.to_string()],
        false => a.models.clone(),
    };
    let schema = a.json_schema.as_deref().map(schema_arg).transpose()?;
    let json_tests = schema.is_some();
    let tests: Vec<(Test, usize)> = (a.n_prompt.iter().map(|&n| Test::Prompt(n)))
        .chain(
            a.n_gen
                .iter()
                .flat_map(|&n| a.parallel.iter().map(move |&p| Test::Gen(n, p))),
        )
        .chain(
            a.n_gen
                .iter()
                .filter(|_| json_tests)
                .map(|&n| Test::GenSchema(n)),
        )
        .filter(|t| t.tokens() > 0)
        .flat_map(|t| a.n_depth.iter().map(move |&d| (t, d)))
        .collect();
    anyhow::ensure!(
        names.is_empty() || !tests.is_empty(),
        "nothing to measure: every -p and -n is 0"
    );
    // Resolve every model first, so a bad name fails before any measurement.
    let files = names
        .iter()
        .map(|n| Ok(kiln_runtime::llm_path(&resolve_model(n)?)?))
        .collect::<anyhow::Result<Vec<PathBuf>>>()?;

    // The header waits for the first row, so a model that fails to load prints only the error.
    let mut header_due = !a.json;
    let cpu = cpu_info();
    let mut run = Run {
        tests: &tests,
        reps: a.reps,
        json: a.json,
        cpu: &cpu,
        schema,
        peak_gbps: None,
    };
    match a.device {
        crate::Device::Cpu => {
            let load_b = CpuBackend::new(1);
            let backends: Vec<(usize, CpuBackend)> =
                threads.iter().map(|&t| (t, CpuBackend::new(t))).collect();
            for file in &files {
                let m = BenchModel::load(file, &load_b, a.kv_type)?;
                // Before any row: a depth past the host's memory is one line, not an abort.
                for &(test, d) in &tests {
                    m.check_cache_fits(test, d)
                        .with_context(|| format!("benchmarking {}", file.display()))?;
                }
                for (t, b) in &backends {
                    run.model(&m, b, *t, "CPU", b.kernels(), &mut header_due)?;
                }
            }
        }
        crate::Device::Cuda => {
            let b = crate::cuda_backend()?;
            if a.membw {
                // Before the models load: the probe's buffer is a quarter of the free memory
                // at most.
                let gbps = crate::cuda_read_bandwidth(&b, a.reps)? / 1e9;
                match a.json {
                    true => println!(
                        "{}",
                        json!({"test": "membw", "backends": "CUDA", "gbps": gbps})
                    ),
                    false => eprintln!("CUDA device memory read bandwidth: {gbps:.1} GB/s"),
                }
                run.peak_gbps = Some(gbps);
            }
            for file in &files {
                let m = BenchModel::load(file, &b, a.kv_type)?;
                run.model(&m, &b, 1, "CUDA", "cuda", &mut header_due)?;
            }
        }
        crate::Device::Gpu => {
            let b = crate::gpu_backend(a.adapter.as_deref())?;
            eprintln!("backend: {}", b.name());
            for file in &files {
                let m = BenchModel::load(file, &b, a.kv_type)?;
                run.model(&m, &b, 1, "wgpu", "wgsl", &mut header_due)?;
            }
        }
    }
    let table_printed = !a.json && !header_due;
    if table_printed {
        if let Some(rss) = peak_rss_bytes() {
            println!("\npeak RSS: {}", size_label(rss as usize));
        }
    }

    // After the models: the bandwidth probe's buffer would otherwise be their peak RSS. (The
    // host's: a GPU run measured its device before its rows.)
    if a.membw && a.device != crate::Device::Cuda {
        if !a.json {
            if table_printed {
                println!();
            }
            table_header(&[("test", -5), ("threads", 7), ("GB/s", 8)]);
        }
        for &t in &threads {
            let gbps = membw::read_bandwidth(&Pool::new(t), MEMBW_BYTES, 5) / 1e9;
            match a.json {
                true => println!("{}", json!({"test": "membw", "n_threads": t, "gbps": gbps})),
                false => println!("| {:<5} | {:>7} | {:>8.2} |", "membw", t, gbps),
            }
        }
    }
    Ok(())
}

/// The tests and output options of one `kiln bench` invocation.
struct Run<'a> {
    /// Each test with the cache depth it starts at.
    tests: &'a [(Test, usize)],
    reps: usize,
    json: bool,
    cpu: &'a str,
    schema: Option<Grammar>,
    /// The measured read bandwidth of the memory the model runs from, GB/s (`--membw` on a
    /// GPU): decode rows show their effective GB/s as a share of it.
    peak_gbps: Option<f64>,
}

impl Run<'_> {
    /// Every test on one model and backend, one output row each.
    fn model<B: Backend>(
        &self,
        m: &BenchModel<B>,
        b: &B,
        threads: usize,
        backend: &str,
        kernels: &str,
        header_due: &mut bool,
    ) -> anyhow::Result<()> {
        // The vocabulary's grammar tables, built once per model (untimed) when needed.
        let grammars = match &self.schema {
            Some(_) => Some(Grammars::new(&model_tokenizer(&m.file)?)?),
            None => None,
        };
        let schema = grammars.as_ref().zip(self.schema.as_ref());
        for &(test, depth) in self.tests {
            let test_time = kiln_formats::rfc3339_utc(SystemTime::now(), false);
            let (samples_ns, host) = run_test(m, b, test, depth, self.reps, m.kv, schema)?;
            let r = Measured {
                model: m,
                backend,
                threads,
                test,
                depth,
                samples_ns,
                host,
                test_time,
                peak_gbps: self.peak_gbps,
            };
            if self.json {
                println!("{}", r.json(self.cpu, kernels));
                continue;
            }
            if std::mem::take(header_due) {
                let mut cols = vec![
                    ("model", -30),
                    ("size", 10),
                    ("params", 10),
                    ("backend", -7),
                    ("threads", 7),
                    ("test", 13),
                    ("t/s", 20),
                    ("GB/s", 8),
                    ("MB/tok", 7),
                ];
                if self.peak_gbps.is_some() {
                    cols.push(("of bw", 6));
                }
                table_header(&cols);
            }
            println!("{}", r.table_row());
            if let Some(l) = r.host_line() {
                eprintln!("{l}");
            }
        }
        Ok(())
    }
}

/// The tokenizer of a GGUF file or a Hugging Face directory.
fn model_tokenizer(file: &Path) -> anyhow::Result<kiln_text::Tokenizer> {
    Ok(match kiln_models::llm::is_hf_dir(file) {
        true => kiln_text::Tokenizer::from_file(file)?,
        false => kiln_text::Tokenizer::from_gguf(&GgufFile::open(file)?)?,
    })
}

/// `--json-schema`: `object`, a schema, or a file holding one.
fn schema_arg(s: &str) -> anyhow::Result<Grammar> {
    if s == "object" {
        return Ok(Grammar::JsonObject);
    }
    let text = match s.trim_start().starts_with('{') {
        true => s.to_string(),
        false => std::fs::read_to_string(s).with_context(|| format!("reading {s}"))?,
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("--json-schema {s}: not JSON"))?;
    Ok(Grammar::JsonSchema(v))
}

/// Prints a markdown header; a negative width aligns the column left.
fn table_header(cols: &[(&str, i32)]) {
    let mut names = String::from("|");
    let mut rule = String::from("|");
    for &(name, w) in cols {
        let n = w.unsigned_abs() as usize;
        if w < 0 {
            names += &format!(" {name:<n$} |");
            rule += &format!(" {} |", "-".repeat(n));
        } else {
            names += &format!(" {name:>n$} |");
            rule += &format!(" {}: |", "-".repeat(n - 1));
        }
    }
    println!("{names}\n{rule}");
}

/// The tensor format that holds the most bytes of the file, e.g. "Q4_1".
fn dominant_type(g: &GgufFile) -> &'static str {
    // The file's own type where it names one (llama-bench's label: a Q4_K_M file keeps its
    // embeddings in Q8_0 or Q6_K, which may hold the most bytes of a small model).
    let named = match g.get_u64("general.file_type").ok() {
        Some(0) => Some("F32"),
        Some(1) => Some("F16"),
        Some(2) => Some("Q4_0"),
        Some(3) => Some("Q4_1"),
        Some(7) => Some("Q8_0"),
        Some(8) => Some("Q5_0"),
        Some(9) => Some("Q5_1"),
        Some(10) => Some("Q2_K"),
        Some(11) => Some("Q3_K_S"),
        Some(12) => Some("Q3_K_M"),
        Some(13) => Some("Q3_K_L"),
        Some(14) => Some("Q4_K_S"),
        Some(15) => Some("Q4_K_M"),
        Some(16) => Some("Q5_K_S"),
        Some(17) => Some("Q5_K_M"),
        Some(18) => Some("Q6_K"),
        Some(32) => Some("BF16"),
        _ => None,
    };
    if let Some(name) = named {
        return name;
    }
    let mut bytes: BTreeMap<&'static str, u64> = BTreeMap::new();
    for t in &g.tensors {
        *bytes.entry(t.ty.name()).or_default() += t.n_bytes;
    }
    bytes
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map_or("?", |(name, _)| name)
}

/// The dtype that holds the most bytes of a safetensors set, e.g. "BF16".
fn hf_dominant_dtype(s: &kiln_formats::SafetensorsSet) -> &'static str {
    let mut bytes: BTreeMap<&'static str, usize> = BTreeMap::new();
    for t in s.tensors() {
        *bytes.entry(t.dtype.name()).or_default() += t.n_bytes();
    }
    bytes
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map_or("?", |(name, _)| name)
}

/// "135M", "1.5B": a model's size class as model names give it.
fn params_label(n: usize) -> String {
    let n = n as f64;
    match n < 1e9 {
        true => format!("{:.0}M", n / 1e6),
        false => format!("{:.1}B", n / 1e9),
    }
}

/// The table's params column, as llama-bench prints it.
fn n_params_label(n: usize) -> String {
    let n = n as f64;
    match n < 1e9 {
        true => format!("{:.2} M", n / 1e6),
        false => format!("{:.2} B", n / 1e9),
    }
}

/// The table's size column, as llama-bench prints it.
fn size_label(bytes: usize) -> String {
    let b = bytes as f64;
    match b < (1u64 << 30) as f64 {
        true => format!("{:.2} MiB", b / (1u64 << 20) as f64),
        false => format!("{:.2} GiB", b / (1u64 << 30) as f64),
    }
}

/// Mean and sample standard deviation (0 for a single value).
fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// `n` token ids uniform in `0..vocab` (splitmix64).
fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e3779b97f4a7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
            ((z ^ (z >> 31)) % vocab as u64) as u32
        })
        .collect()
}

/// Peak resident set size (`VmHWM`); None where /proc is not there.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    let kb: u64 = kb.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kb * 1024)
}

/// The CPU's model name where /proc/cpuinfo gives it, else the architecture.
fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim() == "model name")
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_stats() {
        assert_eq!(size_label(100 << 20), "100.00 MiB");
        assert_eq!(size_label(3 << 29), "1.50 GiB");
        assert_eq!(params_label(134_515_008), "135M");
        assert_eq!(params_label(1_543_714_304), "1.5B");
        assert_eq!(n_params_label(134_515_008), "134.52 M");
        let (m, sd) = mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!((sd - 2.138).abs() < 1e-3);
        assert_eq!(mean_sd(&[3.0]), (3.0, 0.0));
    }

    #[test]
    fn random_tokens_repeat_and_stay_in_vocab() {
        let a = random_tokens(1000, 50, SEED);
        assert_eq!(a, random_tokens(1000, 50, SEED));
        assert!(a.iter().all(|&t| t < 50));
        assert!(a.iter().collect::<std::collections::BTreeSet<_>>().len() > 40);
    }
}

#[cfg(test)]
mod window_tests {
    use super::attended_positions;

    /// A window caps what a layer reads at depth; global layers read every position.
    #[test]
    fn windows_cap_the_positions_read() {
        // tg4 from depth 8192: tokens attend 8193..8196 positions, 8194.5 on average.
        assert_eq!(attended_positions(&[0, 0], 4, 8192), 2.0 * 8194.5);
        // Gemma 3's pattern, window 512: five layers read 512, one 8194.5.
        let gemma = [512, 512, 512, 512, 512, 0];
        assert_eq!(attended_positions(&gemma, 4, 8192), 5.0 * 512.0 + 8194.5);
        // Below the window a windowed layer reads what a global one does.
        assert_eq!(attended_positions(&[512], 2, 0), 1.5);
    }
}
