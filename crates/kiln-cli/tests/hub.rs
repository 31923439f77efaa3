//! Models from Hugging Face, end to end against a local server laid out as the Hub is: the
//! model API's listing (`/api/models/{repo}/revision/{rev}?blobs=true`), `resolve/` URLs that
//! redirect LFS files to a content server, the `x-repo-commit` / `x-linked-etag` headers,
//! byte ranges, a gated repository and a corrupted file. The file served is the real
//! SmolLM2-135M GGUF, and what kiln fetched must answer as that file does.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

struct HubFile {
    name: String,
    data: Arc<Vec<u8>>,
    /// Stored with LFS (listed with its sha256 and served by the content server).
    lfs: bool,
    /// Served with a byte changed: not what the listing's sha256 says.
    corrupt: bool,
    /// The first full download is cut after 40% of its bytes.
    cut_first: bool,
}

struct HubRepo {
    id: String,
    commit: String,
    token: Option<String>,
    files: Vec<HubFile>,
}

#[derive(Default)]
struct Hub {
    repos: Vec<HubRepo>,
    /// Every request: "GET /path range".
    log: Mutex<Vec<String>>,
    cut: Mutex<Vec<String>>,
}

impl Hub {
    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn file(&self, sha: &str) -> Option<(&HubRepo, &HubFile)> {
        self.repos.iter().find_map(|r| {
            r.files
                .iter()
                .find(|f| f.lfs && sha256(&f.data) == sha)
                .map(|f| (r, f))
        })
    }
}

fn respond(s: &mut TcpStream, status: &str, headers: &[(String, String)], body: &[u8]) {
    let mut h = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let _ = s.write_all(h.as_bytes());
    let _ = s.write_all(body);
}

/// Bytes of `data` as asked by a `Range: bytes=a-[b]` header (206), or all of it (200).
fn serve_bytes(
    s: &mut TcpStream,
    data: &[u8],
    range: Option<&str>,
    mut headers: Vec<(String, String)>,
    cut: bool,
) {
    let total = data.len();
    let (status, lo, hi) = match range.and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap();
            let a: usize = a.parse().unwrap();
            let b: usize = if b.is_empty() {
                total - 1
            } else {
                b.parse::<usize>().unwrap().min(total - 1)
            };
            headers.push(("Content-Range".into(), format!("bytes {a}-{b}/{total}")));
            ("206 Partial Content", a, b + 1)
        }
        None => ("200 OK", 0, total),
    };
    if cut {
        // Headers promise the whole range; the connection closes part way.
        let mut h = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
        for (k, v) in &headers {
            h.push_str(&format!("{k}: {v}\r\n"));
        }
        h.push_str(&format!("Content-Length: {}\r\n\r\n", hi - lo));
        let _ = s.write_all(h.as_bytes());
        let _ = s.write_all(&data[lo..lo + (hi - lo) * 2 / 5]);
        let _ = s.flush();
        let _ = s.shutdown(std::net::Shutdown::Both);
        return;
    }
    respond(s, status, &headers, &data[lo..hi]);
}

fn handle(hub: &Hub, port: u16, mut s: TcpStream) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").map(|s| s.as_str());
    hub.log
        .lock()
        .unwrap()
        .push(format!("{method} {target} {}", range.unwrap_or("-")));
    let path = target.split('?').next().unwrap_or("");
    let auth_ok = |repo: &HubRepo| match &repo.token {
        None => true,
        Some(t) => headers.get("authorization") == Some(&format!("Bearer {t}")),
    };
    let not_found = |s: &mut TcpStream| {
        respond(
            s,
            "404 Not Found",
            &[("x-error-code".into(), "RepoNotFound".into())],
            b"{\"error\":\"Repository not found\"}",
        )
    };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((id, _rev)) = rest.split_once("/revision/") else {
            return not_found(&mut s);
        };
        let Some(repo) = hub.repos.iter().find(|r| r.id == id) else {
            return not_found(&mut s);
        };
        if !auth_ok(repo) {
            return respond(&mut s, "401 Unauthorized", &[], b"{\"error\":\"gated\"}");
        }
        let siblings: Vec<String> = repo
            .files
            .iter()
            .map(|f| {
                let lfs = if f.lfs {
                    format!(
                        ",\"lfs\":{{\"sha256\":\"{}\",\"size\":{}}}",
                        sha256(&f.data),
                        f.data.len()
                    )
                } else {
                    String::new()
                };
                format!(
                    "{{\"rfilename\":\"{}\",\"size\":{}{lfs}}}",
                    f.name,
                    f.data.len()
                )
            })
            .collect();
        let body = format!(
            "{{\"id\":\"{}\",\"sha\":\"{}\",\"siblings\":[{}]}}",
            repo.id,
            repo.commit,
            siblings.join(",")
        );
        return respond(&mut s, "200 OK", &[], body.as_bytes());
    }
    if let Some(sha) = path.strip_prefix("/cdn/") {
        let Some((_, f)) = hub.file(sha) else {
            return not_found(&mut s);
        };
        let mut data = f.data.to_vec();
        if f.corrupt {
            let mid = data.len() / 2;
            data[mid] ^= 0x55;
        }
        let probe = range == Some("bytes=0-0");
        let cut = f.cut_first && !probe && {
            let mut c = hub.cut.lock().unwrap();
            let first = !c.contains(&f.name);
            c.push(f.name.clone());
            first
        };
        return serve_bytes(&mut s, &data, range, Vec::new(), cut);
    }
    // /{owner}/{name}/resolve/{rev}/{file}
    let segs: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if segs.len() == 5 && segs[2] == "resolve" {
        let id = format!("{}/{}", segs[0], segs[1]);
        let Some(repo) = hub.repos.iter().find(|r| r.id == id) else {
            return not_found(&mut s);
        };
        if !auth_ok(repo) {
            return respond(&mut s, "401 Unauthorized", &[], b"gated");
        }
        if segs[3] != "main" && segs[3] != repo.commit {
            return not_found(&mut s);
        }
        let Some(f) = repo.files.iter().find(|f| f.name == segs[4]) else {
            return respond(
                &mut s,
                "404 Not Found",
                &[("x-error-code".into(), "EntryNotFound".into())],
                b"",
            );
        };
        let commit = ("x-repo-commit".to_string(), repo.commit.clone());
        if f.lfs {
            let sha = sha256(&f.data);
            return respond(
                &mut s,
                "302 Found",
                &[
                    commit,
                    ("x-linked-etag".into(), format!("\"{sha}\"")),
                    ("x-linked-size".into(), f.data.len().to_string()),
                    ("ETag".into(), "\"0123abcd\"".into()),
                    (
                        "Location".into(),
                        format!("http://127.0.0.1:{port}/cdn/{sha}"),
                    ),
                ],
                b"",
            );
        }
        let etag = (
            "ETag".to_string(),
            format!("\"{}\"", &sha256(&f.data)[..40]),
        );
        return serve_bytes(&mut s, &f.data, range, vec![commit, etag], false);
    }
    not_found(&mut s)
}

fn serve(hub: Hub) -> (Arc<Hub>, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hub = Arc::new(hub);
    let h = hub.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let h = h.clone();
            std::thread::spawn(move || handle(&h, port, s));
        }
    });
    (hub, port)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir()
        .join(format!("kiln-hub-test-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn kiln(env: &[(&str, &Path)], args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(args)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_ENDPOINT");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn assert_clean_error(out: &Output, needle: &str) {
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
}

fn gguf() -> PathBuf {
    kiln_assets::resolve("smollm2-135m-instruct", &mut |_| {}).unwrap()
}

fn lfs(name: &str, data: Arc<Vec<u8>>) -> HubFile {
    HubFile {
        name: name.into(),
        data,
        lfs: true,
        corrupt: false,
        cut_first: false,
    }
}

#[test]
fn hugging_face_repositories_fetch_resume_verify_and_run_offline() {
    let real = Arc::new(std::fs::read(gguf()).unwrap());
    let small = |s: &str| Arc::new(s.as_bytes().to_vec());
    let commit = "0123456789abcdef0123456789abcdef01234567".to_string();
    let hub = Hub {
        repos: vec![
            HubRepo {
                id: "kiln-test/SmolLM2-135M-Instruct-GGUF".into(),
                commit: commit.clone(),
                token: None,
                files: vec![
                    HubFile {
                        name: "README.md".into(),
                        data: small("# SmolLM2\n"),
                        lfs: false,
                        corrupt: false,
                        cut_first: false,
                    },
                    HubFile {
                        cut_first: true,
                        ..lfs("SmolLM2-135M-Instruct-Q4_1.gguf", real.clone())
                    },
                    lfs("SmolLM2-135M-Instruct-Q8_0.gguf", small("not fetched")),
                ],
            },
            HubRepo {
                id: "kiln-test/Broken-GGUF".into(),
                commit: commit.clone(),
                token: None,
                files: vec![HubFile {
                    corrupt: true,
                    ..lfs("m-Q4_K_M.gguf", small("bytes the listing does not match"))
                }],
            },
            HubRepo {
                id: "kiln-test/Gated-GGUF".into(),
                commit: commit.clone(),
                token: Some("hf_secret".into()),
                files: vec![lfs("m-Q4_K_M.gguf", small("gated bytes"))],
            },
            HubRepo {
                id: "kiln-test/Resume-GGUF".into(),
                commit: commit.clone(),
                token: None,
                files: vec![lfs("SmolLM2-Q4_1.gguf", real.clone())],
            },
        ],
        ..Default::default()
    };
    let (hub, port) = serve(hub);
    let endpoint = PathBuf::from(format!("http://127.0.0.1:{port}"));
    let hf = scratch("hf");
    let home = scratch("kiln");
    let env = [
        ("HF_ENDPOINT", endpoint.as_path()),
        ("HF_HOME", hf.as_path()),
        ("KILN_HOME", home.as_path()),
    ];
    let repo_dir = hf.join("hub/models--kiln-test--SmolLM2-135M-Instruct-GGUF");

    // Fetched by quantization; the first download is cut and resumed from where it stopped.
    let out = kiln(&env, &["pull", "kiln-test/SmolLM2-135M-Instruct-GGUF:q4_1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let path = PathBuf::from(text(&out.stdout).trim());
    let want = repo_dir.join(format!(
        "snapshots/{commit}/SmolLM2-135M-Instruct-Q4_1.gguf"
    ));
    assert_eq!(path, want);
    assert_eq!(std::fs::read(&path).unwrap(), *real, "fetched bytes differ");
    let sha = sha256(&real);
    assert!(
        repo_dir.join("blobs").join(&sha).is_file(),
        "blob named by its sha256"
    );
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        commit
    );
    let resumed: Vec<String> = hub
        .requests()
        .into_iter()
        .filter(|r| r.starts_with(&format!("GET /cdn/{sha} bytes=")) && !r.ends_with("=0-0"))
        .collect();
    assert_eq!(
        resumed.len(),
        2,
        "one cut download, one resumed: {resumed:?}"
    );
    let from: usize = resumed[1]
        .rsplit("bytes=")
        .next()
        .unwrap()
        .trim_end_matches('-')
        .parse()
        .unwrap();
    assert!(from > 0 && from < real.len(), "resumed from byte {from}");
    assert!(
        !hub.requests().iter().any(|r| r.contains("Q8_0")),
        "only the quant asked"
    );
    let parts: Vec<_> = std::fs::read_dir(repo_dir.join("blobs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
        .collect();
    assert!(parts.is_empty(), "partial files left: {parts:?}");

    // Run from the cache with the Hub switched off: the same answer as the file itself.
    let question = |model: &str, offline: bool| {
        let mut c = kiln(&env, &["run", "-m", model, "--temp", "0", "-n", "8"]);
        c.args(["-p", "What is the capital of France?"]);
        if offline {
            c.env("HF_HUB_OFFLINE", "1");
        }
        c.output().unwrap()
    };
    let seen = hub.requests().len();
    let direct = question(gguf().to_str().unwrap(), false);
    let offline = question("hf:kiln-test/SmolLM2-135M-Instruct-GGUF:Q4_1", true);
    assert!(offline.status.success(), "{}", text(&offline.stderr));
    assert!(!text(&direct.stdout).trim().is_empty());
    assert_eq!(text(&offline.stdout), text(&direct.stdout));
    // Online too, a cached repository is used without asking the Hub.
    let cached = question("kiln-test/SmolLM2-135M-Instruct-GGUF:Q4_1", false);
    assert_eq!(text(&cached.stdout), text(&direct.stdout));
    assert_eq!(hub.requests().len(), seen, "cached runs made requests");

    // A download interrupted in an earlier process resumes from its partial file.
    let resume_dir = hf.join("hub/models--kiln-test--Resume-GGUF/blobs");
    std::fs::create_dir_all(&resume_dir).unwrap();
    std::fs::write(resume_dir.join(format!("{sha}.part")), &real[..1_000_000]).unwrap();
    let out = kiln(&env, &["pull", "hf:kiln-test/Resume-GGUF"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(text(&out.stdout).trim()).unwrap(), *real);
    let log = hub.requests();
    assert!(
        log.iter()
            .any(|r| r == &format!("GET /cdn/{sha} bytes=1000000-")),
        "no resumed range in {log:?}"
    );

    // A file that does not match its listed sha256 is refused and not kept.
    let out = kiln(&env, &["pull", "hf:kiln-test/Broken-GGUF"])
        .output()
        .unwrap();
    assert_clean_error(&out, "sha256");
    let broken = hf.join("hub/models--kiln-test--Broken-GGUF");
    assert!(!broken
        .join(format!("snapshots/{commit}/m-Q4_K_M.gguf"))
        .exists());
    let blobs: Vec<_> = std::fs::read_dir(broken.join("blobs"))
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().ends_with(".lock"))
        .collect();
    assert!(blobs.is_empty(), "corrupt blob kept: {blobs:?}");

    // Gated: refused without a token, fetched with one.
    let out = kiln(&env, &["pull", "kiln-test/Gated-GGUF"])
        .output()
        .unwrap();
    assert_clean_error(&out, "HF_TOKEN");
    let out = kiln(&env, &["pull", "kiln-test/Gated-GGUF"])
        .env("HF_TOKEN", "hf_secret")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(text(&out.stdout).trim()).unwrap(),
        "gated bytes"
    );

    // Names that are not there, online and offline; a quant the repository lacks.
    let out = kiln(&env, &["pull", "hf:kiln-test/Nope"]).output().unwrap();
    assert_clean_error(&out, "no repository kiln-test/Nope");
    let out = kiln(&env, &["pull", "kiln-test/SmolLM2-135M-Instruct-GGUF:Q2_K"])
        .output()
        .unwrap();
    assert_clean_error(&out, "has no Q2_K GGUF file (it has Q8_0)");
    let out = question("hf:kiln-test/Gated-GGUF:Q8_0", true);
    assert_clean_error(&out, "HF_HUB_OFFLINE");

    // Listed with their sizes; removed by name.
    let out = kiln(&env, &["list"]).output().unwrap();
    let listing = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = listing
        .lines()
        .find(|l| l.starts_with("hf:kiln-test/SmolLM2-135M-Instruct-GGUF "))
        .unwrap_or_else(|| panic!("not listed: {listing}"));
    assert!(
        line.contains("huggingface") && line.contains("MB"),
        "{line}"
    );
    let out = kiln(&env, &["rm", "hf:kiln-test/Gated-GGUF"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!hf.join("hub/models--kiln-test--Gated-GGUF").exists());
    let out = kiln(&env, &["rm", "hf:kiln-test/Gated-GGUF"])
        .output()
        .unwrap();
    assert_clean_error(&out, "not in the cache");
}

/// An alias with a registry mirror: where the Hub cannot be reached, the mirror serves.
#[test]
fn aliases_fall_back_to_their_registry_mirror() {
    let mirror = gguf();
    let hf = scratch("hf-unreachable");
    // A port nothing listens on.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = PathBuf::from(format!("http://{}", dead.local_addr().unwrap()));
    drop(dead);
    let env = [
        ("HF_ENDPOINT", endpoint.as_path()),
        ("HF_HOME", hf.as_path()),
    ];
    let out = kiln(&env, &["pull", "smollm2:135m"]).output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(PathBuf::from(text(&out.stdout).trim()), mirror);
    assert!(
        err.contains("registry mirror (smollm2-135m-instruct)"),
        "{err}"
    );
    // A quant the mirror is not: no fallback, the Hub's error.
    let out = kiln(&env, &["pull", "smollm2:135m-q8_0"]).output().unwrap();
    assert_clean_error(&out, "cannot reach");
    // An unknown name lists what there is.
    let out = kiln(&env, &["run", "-m", "qwen9:1b", "-p", "hi"])
        .output()
        .unwrap();
    assert_clean_error(&out, "qwen3:0.6b");
}

/// The real Hub, where this machine reaches it (CI's does not: there the test says so and
/// checks nothing more): one small file of a public repository, into the Hub's cache layout.
#[test]
fn the_real_hub_when_it_is_reachable() {
    use std::net::ToSocketAddrs;
    let reachable = ("huggingface.co", 443)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, std::time::Duration::from_secs(3)).is_ok());
    if !reachable {
        eprintln!("skipped: huggingface.co is not reachable from here");
        return;
    }
    let hf = scratch("hf-real");
    let out = kiln(
        &[("HF_HOME", hf.as_path())],
        &["pull", "hf:openai-community/gpt2/config.json"],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let path = PathBuf::from(text(&out.stdout).trim());
    assert!(path.starts_with(hf.join("hub/models--openai-community--gpt2/snapshots")));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["model_type"], "gpt2");
}
