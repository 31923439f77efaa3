//! Models on Hugging Face: `hf:owner/repo[:QUANT]`, `hf:owner/repo/path/file.gguf`, or an
//! alias that names a repository. Fetched with the `hf-hub` crate into the standard Hugging
//! Face cache (`$HF_HOME/hub`, default `~/.cache/huggingface/hub`), so files other tools already
//! fetched are used as they lie and kiln's downloads serve them too. `HF_ENDPOINT` (a mirror or
//! a test server), `HF_TOKEN` (else the token `huggingface-cli login` wrote) and
//! `HF_HUB_OFFLINE` are honoured. A download interrupted mid-file resumes from its `.part`
//! file (in the same run, after a cut connection, and in the next run); every LFS file is
//! checked against the sha256 the Hub lists for it, and a file that does not match is removed.
//!
//! A repository already in the cache with the files asked for is used without a network call
//! (as Ollama does; `kiln pull` asks the Hub again).
//!
//! Which files: in a GGUF repository, the one file of the quantization asked for (`:Q8_0`;
//! without one, Q4_K_M where there is one, as llama.cpp's `-hf` picks); in a CTranslate2
//! (faster-whisper) repository `model.bin` and its configuration and vocabulary; in a
//! safetensors (or MLX) repository the weights, configuration, tokenizer and templates.

use std::fs;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{ApiBuilder, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};

use crate::{dir_size, fetch_lock, io_err, sha256_file, AssetError, Progress};

/// A repository and what to take from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSpec {
    /// `owner/name`.
    pub repo: String,
    /// A branch, tag or commit (`main` unless given as `owner/name@rev`).
    pub revision: String,
    pub pick: Pick,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// The repository's model files (Q4_K_M, or the only GGUF, in a GGUF repository).
    Auto,
    /// The GGUF file of this quantization type (`Q8_0`, `q4_k_m`: case does not matter).
    Quant(String),
    /// This file.
    File(String),
}

fn valid_part(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(['.', '-'])
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// `owner/name[@rev][:QUANT]` or `owner/name[@rev]/path/in/repo.gguf`, with an optional `hf:`,
/// `hf.co/` or `huggingface.co/` in front. None when `s` is not of that shape.
pub fn parse(s: &str) -> Option<HubSpec> {
    let s = [
        "hf:",
        "hf.co/",
        "huggingface.co/",
        "https://huggingface.co/",
    ]
    .iter()
    .find_map(|p| s.strip_prefix(p))
    .unwrap_or(s);
    let (owner, rest) = s.split_once('/')?;
    let (name_rev, file) = match rest.split_once('/') {
        Some((n, f)) => (n, Some(f)),
        None => (rest, None),
    };
    let (name_rev, quant) = match (file, name_rev.split_once(':')) {
        (None, Some((n, q))) => (n, Some(q)),
        _ => (name_rev, None),
    };
    let (name, revision) = match name_rev.split_once('@') {
        Some((n, r)) => (n, r),
        None => (name_rev, "main"),
    };
    if !valid_part(owner) || !valid_part(name) || !valid_part(revision) {
        return None;
    }
    // `dir/model.gguf` that is not there is a mistyped path, not a repository.
    let file_like = [".gguf", ".bin", ".onnx", ".safetensors", ".pth", ".json"];
    if file.is_none() && file_like.iter().any(|x| name.ends_with(x)) {
        return None;
    }
    let pick = match (file, quant) {
        (Some(f), _) => {
            if f.is_empty() || f.split('/').any(|p| p.is_empty() || p == "..") {
                return None;
            }
            Pick::File(f.to_string())
        }
        (None, Some(q)) if valid_part(q) => Pick::Quant(q.to_string()),
        (None, Some(_)) => return None,
        (None, None) => Pick::Auto,
    };
    Some(HubSpec {
        repo: format!("{owner}/{name}"),
        revision: revision.to_string(),
        pick,
    })
}

impl std::fmt::Display for HubSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hf:{}", self.repo)?;
        if self.revision != "main" {
            write!(f, "@{}", self.revision)?;
        }
        match &self.pick {
            Pick::Auto => Ok(()),
            Pick::Quant(q) => write!(f, ":{q}"),
            Pick::File(p) => write!(f, "/{p}"),
        }
    }
}

/// The files to fetch and the one `-m` resolves to (None: the snapshot directory).
#[derive(Debug, PartialEq, Eq)]
struct Choice {
    files: Vec<String>,
    main: Option<String>,
}

/// Quantization types in the order a GGUF repository's file is picked without `:QUANT`.
const QUANT_ORDER: &[&str] = &[
    "Q4_K_M", "Q4_0", "Q4_K_S", "Q5_K_M", "Q5_0", "Q6_K", "Q8_0", "BF16", "F16", "F32",
];

/// Whether a GGUF file's name carries this quantization type as a word: `x-Q4_K_M.gguf`,
/// `x.q8_0.gguf`, `x-Q4_0-00001-of-00002.gguf`, but `Q4_K` is not `Q4_K_M`.
fn has_quant(file: &str, quant: &str) -> bool {
    let base = file.rsplit('/').next().unwrap_or(file).to_ascii_uppercase();
    let q = quant.to_ascii_uppercase();
    let b = base.as_bytes();
    base.match_indices(&q).any(|(i, _)| {
        let before = i == 0 || matches!(b[i - 1], b'-' | b'.' | b'_');
        let after = b.get(i + q.len()).is_some_and(|c| matches!(c, b'-' | b'.'));
        before && after
    })
}

/// `-00001-of-00003.gguf`: the parts of a split GGUF.
fn split_part(file: &str) -> Option<(u32, u32)> {
    let stem = file.strip_suffix(".gguf")?;
    let (rest, of) = stem.rsplit_once("-of-")?;
    let (_, part) = rest.rsplit_once('-')?;
    if part.len() != 5 || of.len() != 5 {
        return None;
    }
    Some((part.parse().ok()?, of.parse().ok()?))
}

const CONFIG_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "model.safetensors.index.json",
    "vocabulary.txt",
    "vocabulary.json",
];

fn choose(repo: &str, files: &[String], pick: &Pick) -> Result<Choice, String> {
    if let Pick::File(f) = pick {
        if !files.contains(f) {
            return Err(format!("{repo} has no file {f}"));
        }
        return Ok(Choice {
            files: vec![f.clone()],
            main: Some(f.clone()),
        });
    }
    let mut ggufs: Vec<&String> = files
        .iter()
        .filter(|f| f.ends_with(".gguf") && !f.rsplit('/').next().unwrap_or(f).contains("mmproj"))
        .collect();
    ggufs.sort();
    let quants = || {
        let mut q: Vec<&str> = QUANT_ORDER
            .iter()
            .copied()
            .filter(|q| ggufs.iter().any(|f| has_quant(f, q)))
            .collect();
        q.dedup();
        if q.is_empty() {
            "none of the usual types".to_string()
        } else {
            q.join(", ")
        }
    };
    let chosen: &String = match pick {
        Pick::Quant(q) => {
            if ggufs.is_empty() {
                return Err(format!(
                    "{repo} has no GGUF files, so no :{q} to pick (drop the :{q})"
                ));
            }
            match ggufs.iter().find(|f| has_quant(f, q)) {
                Some(f) => f,
                None => return Err(format!("{repo} has no {q} GGUF file (it has {})", quants())),
            }
        }
        _ if !ggufs.is_empty() => QUANT_ORDER
            .iter()
            .find_map(|q| ggufs.iter().find(|f| has_quant(f, q)))
            .unwrap_or(&ggufs[0]),
        _ => {
            let has = |f: &str| files.iter().any(|x| x == f);
            let top_safetensors: Vec<&String> = files
                .iter()
                .filter(|f| f.ends_with(".safetensors") && !f.contains('/'))
                .collect();
            let weights: Vec<String> = if has("model.bin") && has("config.json") {
                vec!["model.bin".into()]
            } else if !top_safetensors.is_empty() && has("config.json") {
                top_safetensors.into_iter().cloned().collect()
            } else {
                return Err(format!(
                    "{repo} has no model files kiln reads (GGUF, safetensors with config.json, \
                     or CTranslate2 model.bin)"
                ));
            };
            let mut list: Vec<String> = CONFIG_FILES
                .iter()
                .filter(|f| has(f))
                .map(|f| f.to_string())
                .collect();
            list.extend(weights);
            return Ok(Choice {
                files: list,
                main: None,
            });
        }
    };
    if let Some((_, n)) = split_part(chosen) {
        return Err(format!(
            "{chosen} is one of {n} parts of a split GGUF, which kiln does not read yet \
             (join them with llama-gguf-split --merge, or pick another quantization)"
        ));
    }
    Ok(Choice {
        files: vec![chosen.clone()],
        main: Some(chosen.clone()),
    })
}

/// Hugging Face's own rule: `1`, `ON`, `YES`, `TRUE` (any case) set it.
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

fn cache() -> Cache {
    Cache::from_env()
}

fn repo_dir(cache: &Cache, repo: &Repo) -> PathBuf {
    cache.path().join(repo.folder_name())
}

fn hub_err(spec: &HubSpec, why: impl std::fmt::Display) -> AssetError {
    AssetError::Hub {
        spec: spec.to_string(),
        why: why.to_string(),
    }
}

/// Every file under `dir`, as paths relative to it with `/` between parts.
fn list_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, prefix)) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let p = e.path();
            if p.is_dir() {
                stack.push((p, rel));
            } else if p.exists() {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// The snapshot of `spec.revision` already in the cache, when it holds every file asked for.
fn from_cache(cache: &Cache, spec: &HubSpec) -> Option<PathBuf> {
    let repo = Repo::with_revision(spec.repo.clone(), RepoType::Model, spec.revision.clone());
    let dir = repo_dir(cache, &repo);
    let commit = fs::read_to_string(dir.join("refs").join(&spec.revision))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| spec.revision.clone());
    let snap = dir.join("snapshots").join(commit);
    let files = list_files(&snap);
    let choice = choose(&spec.repo, &files, &spec.pick).ok()?;
    choice
        .files
        .iter()
        .all(|f| snap.join(f).exists())
        .then(|| match choice.main {
            Some(m) => snap.join(m),
            None => snap,
        })
}

/// The cached copy of `spec`, when every file it needs is in the cache (no network).
pub fn cached(spec: &HubSpec) -> Option<PathBuf> {
    from_cache(&cache(), spec)
}

/// What the Hub's model API says of a revision: its commit and each file's LFS sha256.
struct RepoListing {
    commit: String,
    files: Vec<String>,
    lfs_sha256: std::collections::HashMap<String, String>,
}

fn request_error(spec: &HubSpec, endpoint: &str, e: ureq::Error) -> AssetError {
    match e {
        ureq::Error::Status(401 | 403, _) => hub_err(
            spec,
            format!(
                "{} refused access (HTTP 401/403): the repository is gated or private; \
                 accept its terms on the Hub and set HF_TOKEN",
                endpoint
            ),
        ),
        ureq::Error::Status(404, _) => hub_err(
            spec,
            format!(
                "no repository {} (revision {}) at {endpoint}",
                spec.repo, spec.revision
            ),
        ),
        ureq::Error::Status(code, r) => hub_err(
            spec,
            format!("{endpoint} answered HTTP {code} for {}", r.get_url()),
        ),
        ureq::Error::Transport(t) => hub_err(spec, format!("cannot reach {endpoint}: {t}")),
    }
}

fn listing(api: &ApiRepo, spec: &HubSpec, endpoint: &str) -> Result<RepoListing, AssetError> {
    let resp = api
        .info_request()
        .query("blobs", "true")
        .call()
        .map_err(|e| request_error(spec, endpoint, e))?;
    let body = resp
        .into_string()
        .map_err(|e| hub_err(spec, format!("reading the repository listing: {e}")))?;
    let v: serde_json::Value = serde_json::from_str(&body)
        .map_err(|e| hub_err(spec, format!("the repository listing is not JSON: {e}")))?;
    let commit = v["sha"]
        .as_str()
        .ok_or_else(|| hub_err(spec, "the repository listing has no commit (sha)"))?
        .to_string();
    if !valid_part(&commit) {
        return Err(hub_err(
            spec,
            format!("odd commit id {commit:?} in the listing"),
        ));
    }
    let mut files = Vec::new();
    let mut lfs_sha256 = std::collections::HashMap::new();
    for s in v["siblings"].as_array().into_iter().flatten() {
        let Some(name) = s["rfilename"].as_str() else {
            continue;
        };
        if name.split('/').any(|p| p.is_empty() || p == "..") {
            continue;
        }
        files.push(name.to_string());
        if let Some(sha) = s["lfs"]["sha256"].as_str() {
            lfs_sha256.insert(name.to_string(), sha.to_ascii_lowercase());
        }
    }
    files.sort();
    Ok(RepoListing {
        commit,
        files,
        lfs_sha256,
    })
}

/// hf-hub's download progress as kiln's [`Progress`].
struct Bytes<'a> {
    what: String,
    done: u64,
    total: u64,
    progress: &'a mut dyn for<'x> FnMut(Progress<'x>),
}

impl hf_hub::api::Progress for Bytes<'_> {
    fn init(&mut self, size: usize, _filename: &str) {
        self.total = size as u64;
        self.done = 0;
    }
    fn update(&mut self, n: usize) {
        self.done += n as u64;
        (self.progress)(Progress::Bytes {
            what: &self.what,
            done: self.done,
            total: self.total,
        });
    }
    fn finish(&mut self) {}
}

fn endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .map(|e| e.trim_end_matches('/').to_string())
        .unwrap_or_else(|| "https://huggingface.co".into())
}

fn token(cache: &Cache) -> Option<String> {
    std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .map(|t| t.trim().to_string())
        .or_else(|| cache.token())
}

/// The local path of `spec`: from the cache when it is there (unless `refresh`), else fetched.
pub fn resolve(
    spec: &HubSpec,
    refresh: bool,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, AssetError> {
    let cache = cache();
    if !refresh {
        if let Some(p) = from_cache(&cache, spec) {
            return Ok(p);
        }
    }
    if offline() {
        if let Some(p) = from_cache(&cache, spec) {
            return Ok(p);
        }
        return Err(hub_err(
            spec,
            format!(
                "HF_HUB_OFFLINE is set and the files are not in the cache ({})",
                cache.path().display()
            ),
        ));
    }
    let _lock = fetch_lock(&format!("hf--{}", spec.repo))?;
    let endpoint = endpoint();
    let api = ApiBuilder::from_cache(cache.clone())
        .with_endpoint(endpoint.clone())
        .with_token(token(&cache))
        .with_progress(false)
        .with_retries(3)
        .with_user_agent("kiln", env!("CARGO_PKG_VERSION"))
        .build()
        .map_err(|e| hub_err(spec, e))?;
    let at_rev = Repo::with_revision(spec.repo.clone(), RepoType::Model, spec.revision.clone());
    let list = match listing(&api.repo(at_rev), spec, &endpoint) {
        Ok(l) => l,
        Err(e) => {
            // Unreachable (or refusing) Hub: what an earlier run fetched still serves.
            if let Some(p) = from_cache(&cache, spec) {
                progress(Progress::Notice(&format!("{e}; using the cached copy")));
                return Ok(p);
            }
            return Err(e);
        }
    };
    let choice = choose(&spec.repo, &list.files, &spec.pick).map_err(|w| hub_err(spec, w))?;
    // Every file from the listing's commit, so a directory's files are one snapshot.
    let at_commit = Repo::with_revision(spec.repo.clone(), RepoType::Model, list.commit.clone());
    let snap = repo_dir(&cache, &at_commit)
        .join("snapshots")
        .join(&list.commit);
    let api_repo = api.repo(at_commit.clone());
    for f in &choice.files {
        let dest = snap.join(f);
        if dest.exists() {
            continue;
        }
        let got = api_repo
            .download_with_progress(
                f,
                Bytes {
                    what: format!("downloading {f}"),
                    done: 0,
                    total: 0,
                    progress,
                },
            )
            .map_err(|e| match e {
                hf_hub::api::sync::ApiError::RequestError(r) => request_error(spec, &endpoint, *r),
                hf_hub::api::sync::ApiError::TooManyRetries(inner) => {
                    hub_err(spec, format!("{f}: gave up after retries: {inner}"))
                }
                e => hub_err(spec, format!("{f}: {e}")),
            })?;
        if let Some(want) = list.lfs_sha256.get(f) {
            let have = sha256_file(&got, progress)?;
            if &have != want {
                // The pointer and the blob both go: the next run fetches the file again.
                let blob = fs::canonicalize(&got).ok();
                let _ = fs::remove_file(&got);
                if let Some(b) = blob {
                    let _ = fs::remove_file(b);
                }
                return Err(AssetError::Checksum {
                    file: format!("{} ({f})", spec.repo),
                    expected: want.clone(),
                    got: have,
                });
            }
        }
    }
    // `refs/<revision>` names the commit, as the Hub's own clients leave it (offline runs and
    // other tools find the snapshot from it).
    if spec.revision != list.commit {
        let refs = repo_dir(&cache, &at_commit).join("refs");
        fs::create_dir_all(&refs).map_err(io_err(&refs))?;
        let r = refs.join(&spec.revision);
        fs::write(&r, &list.commit).map_err(io_err(&r))?;
        // hf-hub also wrote `refs/<commit>`; it means nothing to the other clients.
        let _ = fs::remove_file(refs.join(&list.commit));
    }
    progress(Progress::Done);
    Ok(match choice.main {
        Some(m) => snap.join(m),
        None => snap,
    })
}

/// Every model repository in the Hugging Face cache: `owner/name`, its directory, its size.
pub fn cached_repos() -> Vec<(String, PathBuf, u64)> {
    let root = cache().path().clone();
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(&root) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_prefix("models--") else {
            continue;
        };
        let Some((owner, repo)) = id.split_once("--") else {
            continue;
        };
        let dir = e.path();
        out.push((
            format!("{owner}/{repo}"),
            dir.clone(),
            dir_size(&dir.join("blobs")),
        ));
    }
    out.sort();
    out
}

/// The cache directory of a repository (`models--owner--name`), for `kiln rm`.
pub fn repo_cache_dir(repo: &str) -> PathBuf {
    let r = Repo::model(repo.to_string());
    repo_dir(&cache(), &r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn specs_parse_as_users_write_them() {
        let p = parse("hf:bartowski/Llama-3.2-1B-Instruct-GGUF:Q8_0").unwrap();
        assert_eq!(p.repo, "bartowski/Llama-3.2-1B-Instruct-GGUF");
        assert_eq!(p.revision, "main");
        assert_eq!(p.pick, Pick::Quant("Q8_0".into()));
        let p = parse("Qwen/Qwen3-0.6B-GGUF").unwrap();
        assert_eq!(p.pick, Pick::Auto);
        let p = parse("hf.co/o/r@v1.0/sub/x-Q4_0.gguf").unwrap();
        assert_eq!(p.revision, "v1.0");
        assert_eq!(p.pick, Pick::File("sub/x-Q4_0.gguf".into()));
        assert_eq!(p.to_string(), "hf:o/r@v1.0/sub/x-Q4_0.gguf");
        for bad in [
            "models/x.gguf",
            "o",
            "/r",
            "o/",
            "o/r:",
            "o/../x",
            "o/r/../x.gguf",
            "o/r/",
            "-o/r",
            "o r/x",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn gguf_files_are_picked_by_quant_as_a_word() {
        let files = s(&[
            "README.md",
            "m-Q4_K.gguf",
            "m-Q4_K_M.gguf",
            "m-Q8_0.gguf",
            "mmproj-m-Q4_K_M.gguf",
            "m.q5_0.gguf",
        ]);
        let pick = |p: Pick| choose("o/r", &files, &p);
        assert_eq!(pick(Pick::Auto).unwrap().main.unwrap(), "m-Q4_K_M.gguf");
        assert_eq!(
            pick(Pick::Quant("q4_k".into())).unwrap().main.unwrap(),
            "m-Q4_K.gguf"
        );
        assert_eq!(
            pick(Pick::Quant("Q5_0".into())).unwrap().main.unwrap(),
            "m.q5_0.gguf"
        );
        let e = pick(Pick::Quant("Q2_K".into())).unwrap_err();
        assert!(
            e.contains("no Q2_K") && e.contains("Q4_K_M, Q5_0, Q8_0"),
            "{e}"
        );
        // Only Q8_0 in the repository: that, without a quant given.
        let one = s(&["x-Q8_0.gguf", "config.json"]);
        assert_eq!(
            choose("o/r", &one, &Pick::Auto).unwrap().main.unwrap(),
            "x-Q8_0.gguf"
        );
        let split = s(&[
            "big-Q4_K_M-00001-of-00002.gguf",
            "big-Q4_K_M-00002-of-00002.gguf",
        ]);
        let e = choose("o/r", &split, &Pick::Auto).unwrap_err();
        assert!(e.contains("one of 2 parts"), "{e}");
    }

    #[test]
    fn directories_take_weights_and_configuration() {
        let ct2 = s(&[
            "README.md",
            "config.json",
            "model.bin",
            "tokenizer.json",
            "vocabulary.txt",
        ]);
        let c = choose("o/r", &ct2, &Pick::Auto).unwrap();
        assert_eq!(c.main, None);
        assert_eq!(
            c.files,
            s(&[
                "config.json",
                "tokenizer.json",
                "vocabulary.txt",
                "model.bin"
            ])
        );
        let st = s(&[
            ".gitattributes",
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "onnx/model.onnx",
            "tokenizer.json",
            "tokenizer_config.json",
        ]);
        let c = choose("o/r", &st, &Pick::Auto).unwrap();
        assert!(c
            .files
            .contains(&"model-00002-of-00002.safetensors".to_string()));
        assert!(c
            .files
            .contains(&"model.safetensors.index.json".to_string()));
        assert!(!c.files.iter().any(|f| f.contains("onnx")));
        let e = choose("o/r", &s(&["README.md"]), &Pick::Auto).unwrap_err();
        assert!(e.contains("no model files"), "{e}");
        let e = choose("o/r", &st, &Pick::Quant("Q4_0".into())).unwrap_err();
        assert!(e.contains("no GGUF files"), "{e}");
    }
}
