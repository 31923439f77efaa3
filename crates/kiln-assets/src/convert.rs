//! Whisper tiny.en in the other formats kiln reads, written by the project's own scripts
//! (`tools/whisper_ct2_to_ggml.py`, `tools/whisper_ct2_to_hf.py`) from the catalog's
//! CTranslate2 weights. Tests use these so that every loader runs on real weights; nothing
//! written here is committed. The scripts need Python 3 with numpy (pip-installed if missing).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::AssetError;

const TOOLS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools");
/// OpenAI's mel filterbanks (`mel_80`, `mel_128`), where the shared assets lie.
const MEL_FILTERS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/assets/whisper/mel_filters.npz"
);

fn fail(what: &str, why: String) -> AssetError {
    AssetError::Convert {
        what: what.into(),
        why,
    }
}

fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Makes `import module` work in `python3`, installing `pip_name` with pip if needed.
pub fn python_module(module: &str, pip_name: &str) -> Result<(), AssetError> {
    if python_has(module) {
        return Ok(());
    }
    let out = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", pip_name])
        .output()
        .map_err(|e| fail(pip_name, format!("cannot run python3 -m pip: {e}")))?;
    if !out.status.success() || !python_has(module) {
        return Err(fail(
            pip_name,
            format!(
                "pip install failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(())
}

fn ct2_dir() -> Result<PathBuf, AssetError> {
    let p = crate::resolve("whisper-tiny.en", &mut |_| {})?;
    Ok(if p.is_dir() {
        p
    } else {
        p.parent().map(Path::to_path_buf).unwrap_or(p)
    })
}

/// Runs `script args.. out` into `out.partial`, then renames it to `out` (so a reader never
/// sees half a file). Kept when `out` is newer than the script.
fn convert(script: &str, args: &[&str], out: &Path) -> Result<PathBuf, AssetError> {
    // One conversion at a time in this process (tests run in threads and share outputs).
    static LOCK: Mutex<()> = Mutex::new(());
    let _held = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let script = Path::new(TOOLS).join(script);
    let newer = |p: &Path| -> Option<bool> {
        Some(p.metadata().ok()?.modified().ok()? >= script.metadata().ok()?.modified().ok()?)
    };
    if newer(out) == Some(true) {
        return Ok(out.to_path_buf());
    }
    python_module("numpy", "numpy")?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(crate::io_err(dir))?;
    }
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let _ = std::fs::remove_dir_all(&partial);
    let _ = std::fs::remove_file(&partial);
    let what = script.display().to_string();
    let o = Command::new("python3")
        .arg(&script)
        .args(args)
        .arg(&partial)
        .output()
        .map_err(|e| fail(&what, format!("cannot run python3: {e}")))?;
    if !o.status.success() {
        return Err(fail(
            &what,
            String::from_utf8_lossy(&o.stderr).trim().into(),
        ));
    }
    let _ = std::fs::remove_dir_all(out);
    let _ = std::fs::remove_file(out);
    std::fs::rename(&partial, out).map_err(crate::io_err(out))?;
    Ok(out.to_path_buf())
}

/// `dir/ggml-tiny.en[-TYPE].bin`: a whisper.cpp file of weight type `wtype` (f16, f32, q8_0,
/// q5_0, q4_0), no tokenizer beside it.
pub fn whisper_ggml(dir: &Path, wtype: &str) -> Result<PathBuf, AssetError> {
    let src = ct2_dir()?;
    let name = match wtype {
        "f16" => "ggml-tiny.en.bin".to_string(),
        t => format!("ggml-tiny.en-{t}.bin"),
    };
    let src = src.to_string_lossy();
    convert(
        "whisper_ct2_to_ggml.py",
        &[&src, MEL_FILTERS, "--type", wtype],
        &dir.join(name),
    )
}

/// `dir/whisper-tiny.en-hf-DTYPE[-Nshards]/`: a Hugging Face checkpoint directory in `dtype`
/// (f16, f32, bf16), one safetensors file or `shards` of them with an index.
pub fn whisper_hf(dir: &Path, dtype: &str, shards: usize) -> Result<PathBuf, AssetError> {
    let src = ct2_dir()?;
    let name = match shards {
        0 | 1 => format!("whisper-tiny.en-hf-{dtype}"),
        n => format!("whisper-tiny.en-hf-{dtype}-{n}shards"),
    };
    let src = src.to_string_lossy();
    let n = shards.to_string();
    convert(
        "whisper_ct2_to_hf.py",
        &["--dtype", dtype, "--shards", &n, &src],
        &dir.join(name),
    )
}

/// `dir/NAME.vad.npy`: ONNX Runtime's Silero VAD probabilities for the 16 kHz mono WAV
/// `wav` (one per 512 samples), from the catalog's `silero_vad.onnx`.
pub fn silero_vad_reference(dir: &Path, wav: &Path) -> Result<PathBuf, AssetError> {
    python_module("onnxruntime", "onnxruntime")?;
    let vad = crate::resolve("silero-vad", &mut |_| {})?;
    let onnx = vad.with_file_name("silero_vad.onnx");
    let name = wav
        .file_stem()
        .map_or("audio".into(), |s| s.to_string_lossy());
    convert(
        "silero_vad_reference.py",
        &[&onnx.to_string_lossy(), &wav.to_string_lossy()],
        &dir.join(format!("{name}.vad.npy")),
    )
}
