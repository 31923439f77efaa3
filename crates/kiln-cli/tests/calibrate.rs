//! `kiln quantize --calibrate FILE --target-bpw B` through the binary, on the tiny Qwen3
//! Hugging Face fixture: the mix report, the GGUF it writes, the table file, clean errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kiln_formats::GgufFile;
use kiln_quant::GgmlType;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn fixture() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kiln-models/tests/fixtures/hf/qwen3")
        .to_string_lossy()
        .into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-calib-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// A text of `words` words (the fixture's tokenizer splits it into many more tokens).
fn text(name: &str, words: usize) -> String {
    let w = [
        "the", "kiln", "fires", "clay", "slowly", "while", "a", "river", "runs", "north",
    ];
    let s: Vec<&str> = (0..words).map(|i| w[(i * 7 + i / 3) % w.len()]).collect();
    let p = scratch(name);
    std::fs::write(&p, s.join(" ")).unwrap();
    p.to_string_lossy().into_owned()
}

fn ok(o: &Output) -> (String, String) {
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "kiln failed: {err}\n{out}");
    (out, err)
}

fn calib_args<'a>(out: &'a str, txt: &'a str, bpw: &'a str) -> Vec<&'a str> {
    vec![
        "quantize",
        "IN",
        out,
        "--calibrate",
        txt,
        "--target-bpw",
        bpw,
        "--calib-tokens",
        "48",
        "--calib-ctx",
        "24",
        "--candidates",
        "q4_0,q5_0,q8_0",
        "--eval-ctx",
        "16",
        "-t",
        "2",
    ]
}

#[test]
fn calibrated_mix_is_written_and_reported() {
    let txt = text("calib.txt", 400);
    let out = scratch("mix.gguf").to_string_lossy().into_owned();
    let table = scratch("table.json").to_string_lossy().into_owned();
    let fx = fixture();
    let mut args = calib_args(&out, &txt, "6");
    args[1] = &fx;
    args.extend(["--table", &table]);
    let (stdout, stderr) = ok(&kiln(&args));
    assert!(stderr.contains("wrote"), "{stderr}");
    assert!(
        stdout.contains("layer") && stdout.contains("token_embd:"),
        "{stdout}"
    );
    let size = stdout
        .lines()
        .find(|l| l.starts_with("size: "))
        .expect("a size line");
    let bpw: f64 = size["size: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(bpw <= 6.0 && bpw > 4.5, "{size}");
    assert!(stdout.contains("perplexity of"), "{stdout}");
    assert!(stdout.contains("measured: KL"), "{stdout}");

    // The file holds the reported mix, matrices only; it loads back.
    let g = GgufFile::open(&out).unwrap();
    let (mut bits, mut n) = (0u64, 0u64);
    let mut types = Vec::new();
    for t in g.tensors.iter().filter(|t| t.dims.len() == 2) {
        bits += 8 * g.tensor_data(t).len() as u64;
        n += t.n_elements();
        types.push(t.ty);
    }
    assert!(((bits as f64 / n as f64) - bpw).abs() < 1e-3);
    assert!(types.contains(&GgmlType::Q8_0), "{types:?}");
    assert!(types.iter().any(|t| *t != GgmlType::Q8_0), "{types:?}");

    // A second budget reuses the table; the larger budget's estimate is no worse.
    let out2 = scratch("mix2.gguf").to_string_lossy().into_owned();
    let mut args = calib_args(&out2, &txt, "7");
    args[1] = &fx;
    args.extend(["--table", &table, "--no-eval"]);
    let (stdout2, stderr2) = ok(&kiln(&args));
    assert!(stderr2.contains("sensitivities: read"), "{stderr2}");
    let loss = |s: &str| -> f64 {
        let l = s.lines().find(|l| l.starts_with("size: ")).unwrap();
        let v = l.split("estimated loss ").nth(1).unwrap();
        v.split(' ').next().unwrap().parse().unwrap()
    };
    assert!(loss(&stdout2) <= loss(&stdout));
    assert!(!stdout2.contains("perplexity of"));

    // The reference path measures too (f32 arithmetic).
    let out3 = scratch("mix3.gguf").to_string_lossy().into_owned();
    let mut args = calib_args(&out3, &txt, "6");
    args[1] = &fx;
    args.push("--reference");
    let (stdout3, _) = ok(&kiln(&args));
    assert!(stdout3.contains("measured: KL"), "{stdout3}");
}

#[test]
fn calibration_errors_are_clean() {
    let fx = fixture();
    let txt = text("calib-err.txt", 400);
    let short = text("short.txt", 3);
    let out = scratch("err.gguf").to_string_lossy().into_owned();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            calib_args(&out, "/nonexistent/calib.txt", "5"),
            "reading the calibration text",
        ),
        (calib_args(&out, &txt, "3"), "below the smallest mix"),
        (calib_args(&out, &txt, "20"), "above f16"),
        (calib_args(&out, &short, "5"), "needs a longer text"),
    ];
    for (mut args, want) in cases {
        args[1] = &fx;
        let o = kiln(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // --calibrate without a budget, and neither --type nor --calibrate.
    let o = kiln(&["quantize", &fx, &out, "--calibrate", &txt]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--target-bpw"));
    let o = kiln(&["quantize", &fx, &out]);
    assert!(!o.status.success());
    // A table for other candidates is refused, not misread.
    let table = scratch("other.json").to_string_lossy().into_owned();
    let mut args = calib_args(&out, &txt, "6");
    args[1] = &fx;
    args.extend(["--table", &table, "--no-eval"]);
    ok(&kiln(&args));
    args[12] = "q4_0,q8_0";
    let o = kiln(&args);
    assert!(String::from_utf8_lossy(&o.stderr).contains("other tensors or candidates"));
}
