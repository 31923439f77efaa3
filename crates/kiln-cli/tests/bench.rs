//! `kiln bench` on the real default model with tiny sizes: the table and the JSON lines have
//! llama-bench's shape and sane values.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The default model, fetched into the cache if it is not there yet.
fn model() -> PathBuf {
    kiln_assets::resolve("smollm2-135m-instruct", &mut |_| {}).unwrap()
}

/// stdout of a successful run.
fn bench_ok(args: &[&str]) -> String {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    let out = kiln(&all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// Cells of the markdown table rows of `s` (header and rule included).
fn table(s: &str) -> Vec<Vec<String>> {
    s.lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| {
            let l = l.trim().trim_start_matches('|').trim_end_matches('|');
            l.split('|').map(|c| c.trim().to_string()).collect()
        })
        .collect()
}

fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn table_has_a_row_per_test_and_thread_count() {
    model();
    // No -m: the default model.
    let so = bench_ok(&["-p", "16", "-n", "4", "-r", "2", "-t", "1,2"]);
    let t = table(&so);
    assert_eq!(
        t[0],
        ["model", "size", "params", "backend", "threads", "test", "t/s", "GB/s", "MB/tok"],
        "{so}"
    );
    assert!(t[1].iter().all(|c| c.starts_with("---")), "{so}");
    let rows = &t[2..];
    let seen: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r[4].as_str(), r[5].as_str()))
        .collect();
    assert_eq!(
        seen,
        [("1", "pp16"), ("1", "tg4"), ("2", "pp16"), ("2", "tg4")],
        "{so}"
    );
    for r in rows {
        assert_eq!(r.len(), 9, "{so}");
        assert!(r[0].starts_with("llama 135M "), "model: {so}");
        assert!(r[1].ends_with(" MiB"), "size: {so}");
        assert!(r[2].ends_with(" M"), "params: {so}");
        assert_eq!(r[3], "CPU");
        let (mean, sd) = r[6].split_once(" ± ").expect("t/s is mean ± sd");
        assert!(mean.parse::<f64>().unwrap() > 0.0, "{so}");
        assert!(sd.parse::<f64>().unwrap() >= 0.0, "{so}");
        match r[5].starts_with("tg") {
            true => {
                assert!(r[7].parse::<f64>().unwrap() > 0.0, "GB/s: {so}");
                assert!(r[8].parse::<f64>().unwrap() > 0.0, "MB/tok: {so}");
            }
            false => assert_eq!((r[7].as_str(), r[8].as_str()), ("", ""), "pp rows: {so}"),
        }
    }
    assert!(so.contains("peak RSS: "), "{so}");
}

#[test]
fn json_lines_carry_llama_bench_fields() {
    let m = model();
    let so = bench_ok(&[
        "-m",
        m.to_str().unwrap(),
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1,2",
        "--json",
    ]);
    let lines = json_lines(&so);
    assert_eq!(lines.len(), 4, "{so}");
    for (o, (threads, n_prompt, n_gen)) in
        lines
            .iter()
            .zip([(1, 16, 0), (1, 0, 4), (2, 16, 0), (2, 0, 4)])
    {
        assert_eq!(o["n_threads"], threads, "{o}");
        assert_eq!(o["n_prompt"], n_prompt, "{o}");
        assert_eq!(o["n_gen"], n_gen, "{o}");
        assert_eq!(o["backends"], "CPU");
        assert!(o["model_filename"].as_str().unwrap().ends_with(".gguf"));
        assert!(o["model_type"].as_str().unwrap().starts_with("llama 135M "));
        let size = o["model_size"].as_u64().unwrap();
        assert!((50 << 20..300 << 20).contains(&size), "model_size {size}");
        let params = o["model_n_params"].as_u64().unwrap();
        assert!(
            (130_000_000..140_000_000).contains(&params),
            "params {params}"
        );
        assert!(o["avg_ts"].as_f64().unwrap() > 0.0);
        assert!(o["stddev_ts"].as_f64().unwrap() >= 0.0);
        assert!(o["avg_ns"].as_u64().unwrap() > 0);
        assert!(o["stddev_ns"].as_u64().is_some());
        assert_eq!(o["samples_ns"].as_array().unwrap().len(), 2);
        assert_eq!(o["samples_ts"].as_array().unwrap().len(), 2);
        let time = o["test_time"].as_str().unwrap();
        assert!(time.len() == 20 && time.ends_with('Z') && &time[10..11] == "T");
        assert!(o["build_commit"].is_string() && o["cpu_info"].is_string());
        assert!(!o["kernels"].as_str().unwrap().is_empty());
        if cfg!(target_os = "linux") {
            assert!(o["peak_rss_bytes"].as_u64().unwrap() > size);
        }
        match n_gen > 0 {
            true => {
                assert!(o["effective_gbps"].as_f64().unwrap() > 0.0);
                assert!(o["bytes_per_token"].as_u64().unwrap() > 0);
            }
            false => {
                assert!(o.get("effective_gbps").is_none() && o.get("bytes_per_token").is_none())
            }
        }
    }
}

/// `-d` (llama-bench's --n-depth): every test again from a cache already holding that many
/// tokens, single and parallel decode alike, named `... @ dD` and carrying `n_depth`.
#[test]
fn tests_start_at_each_depth() {
    let m = model();
    let args = [
        "-m",
        m.to_str().unwrap(),
        "-p",
        "16",
        "-n",
        "3",
        "-r",
        "1",
        "-t",
        "2",
    ];
    let so = bench_ok(&[&args[..], &["-d", "0,40", "--parallel", "1,2"]].concat());
    let tests: Vec<String> = table(&so)[2..].iter().map(|r| r[5].clone()).collect();
    assert_eq!(
        tests,
        [
            "pp16",
            "pp16 @ d40",
            "tg3",
            "tg3 @ d40",
            "tg3x2",
            "tg3x2 @ d40"
        ],
        "{so}"
    );
    let so = bench_ok(&[&args[..], &["-d", "600", "--json"]].concat());
    let lines = json_lines(&so);
    assert_eq!(lines.len(), 2, "{so}");
    for o in &lines {
        assert_eq!(o["n_depth"], 600, "{o}");
        assert!(o["avg_ts"].as_f64().unwrap() > 0.0, "{o}");
    }
    // Decode at depth reads the cache too: 600 positions count in its bandwidth.
    let g = lines[1]["effective_gbps"].as_f64().unwrap();
    assert!(g > 0.0, "{}", lines[1]);
    // ... as the cache stores them: an f16 cache's positions weigh half an f32 one's.
    let cache_bytes = |kv: &str| {
        let so = bench_ok(&[&args[..], &["-d", "0,600", "--kv-type", kv, "--json"]].concat());
        // The decode rows (the prompt rows carry no bytes per token).
        let b: Vec<f64> = json_lines(&so)
            .iter()
            .filter_map(|o| o["bytes_per_token"].as_f64())
            .collect();
        assert_eq!(b.len(), 2, "{so}");
        b[1] - b[0]
    };
    let (f32_bytes, f16_bytes) = (cache_bytes("f32"), cache_bytes("f16"));
    assert!(
        f32_bytes > 0.0 && (f32_bytes / f16_bytes - 2.0).abs() < 1e-9,
        "{f32_bytes} {f16_bytes}"
    );
}

#[test]
fn zero_prompt_skips_pp() {
    model();
    let so = bench_ok(&["-p", "0", "-n", "2", "-r", "1", "-t", "1"]);
    let tests: Vec<String> = table(&so)[2..].iter().map(|r| r[5].clone()).collect();
    assert_eq!(tests, ["tg2"], "{so}");
}

#[test]
fn membw_alone_runs_no_model() {
    let so = bench_ok(&["--membw", "-t", "1", "--json"]);
    let lines = json_lines(&so);
    assert_eq!(lines.len(), 1, "{so}");
    assert_eq!(lines[0]["test"], "membw");
    assert_eq!(lines[0]["n_threads"], 1);
    assert!(lines[0]["gbps"].as_f64().unwrap() > 0.0, "{so}");
}

#[test]
fn bad_input_is_a_one_line_error() {
    let dir = std::env::temp_dir().join(format!("kiln-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trunc = dir.join("truncated.gguf");
    std::fs::write(&trunc, &std::fs::read(model()).unwrap()[..1 << 20]).unwrap();
    let trunc = trunc.to_str().unwrap();
    for (args, needle) in [
        (&["-m", "/no/such/model.gguf"][..], "/no/such/model.gguf"),
        (
            &["-m", "no-such-model"][..],
            "unknown model 'no-such-model'",
        ),
        (&["-m", trunc][..], "truncated.gguf"),
        (&["-t", "0"][..], "at least 1"),
        (&["-p", "0", "-n", "0"][..], "nothing to measure"),
        // A depth whose cache cannot fit is refused before any row (it was an abort on a
        // failed allocation of terabytes).
        (
            &["-p", "0", "-n", "4", "-d", "99999999"][..],
            "the KV cache of tg4 @ d99999999 (100000003 positions) needs",
        ),
        // A model that does not fit is refused before loading, as by every command.
        (
            &["--memory-limit", "50000000"][..],
            "of memory but 48 MiB is available",
        ),
    ] {
        let out = kiln(&[&["bench"][..], args].concat());
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!err.contains("panicked"), "panic: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
        assert!(err.contains(needle), "expected '{needle}' in: {err}");
        assert_eq!(text(&out.stdout), "", "no table for {args:?}");
    }
}
