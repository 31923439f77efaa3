//! What the server's HTTP tests share: a server on an ephemeral port, raw HTTP/1.1
//! exchanges (chunked bodies decoded) and server-sent events parsed.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use kiln_backend::cpu::CpuBackend;
use kiln_runtime::{Llm, RuntimeError, Scheduler, SchedulerConfig};
use kiln_server::{AppState, ServerConfig};
use serde_json::Value;

pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A server for the model `load` makes, on an ephemeral port of its own.
pub fn spawn(
    load: fn() -> Result<Llm<CpuBackend>, RuntimeError>,
    sched: SchedulerConfig,
    cfg: ServerConfig,
) -> SocketAddr {
    let state = AppState::new(Scheduler::spawn(sched, load).unwrap(), cfg);
    serve_state(state)
}

/// Serves `state` on an ephemeral port of its own (a runtime on a thread); its address.
pub fn serve_state(state: std::sync::Arc<AppState>) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            kiln_server::serve(l, state).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

pub struct Reply {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// An OpenAI-style error with this status.
    pub fn assert_error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        v
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s
}

pub fn send(s: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    // The server may answer (413) before it has read everything: a short write is fine.
    let _ = s.write_all(body);
}

/// One HTTP/1.1 exchange on a fresh connection (chunked bodies decoded).
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut s = connect(addr);
    send(&mut s, method, path, headers, body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse_reply(&raw)
}

pub fn parse_reply(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .expect("a complete response head");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Reply {
        status,
        headers: head.to_string(),
        body,
    }
}

pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").expect("chunk size line");
        let n = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

/// Server-sent events: every event one `data: ` line then a blank line, `[DONE]` last.
/// Returns the JSON events before `[DONE]`.
pub fn sse_events(body: &str) -> Vec<Value> {
    assert!(
        body.ends_with("data: [DONE]\n\n"),
        "no [DONE] at the end: {body:?}"
    );
    let events: Vec<&str> = body.split_terminator("\n\n").collect();
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let payload = e
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("event without 'data: ': {e:?}"));
        assert!(!payload.contains('\n'), "multi-line event: {e:?}");
        if i + 1 == events.len() {
            assert_eq!(payload, "[DONE]");
        } else {
            out.push(serde_json::from_str(payload).expect("JSON event"));
        }
    }
    out
}
