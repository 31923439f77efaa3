#!/usr/bin/env python3
"""Load test for `kiln serve`: many concurrent streaming clients, random cancellations.

Usage:

    python3 tools/load_test.py [--kiln target/release/kiln] [--clients 32] [--minutes 10]
        [--cancel 0.2] [--serve-args "-t 2 --parallel 4"] [--json OUT.json] [--gpu]

Starts `kiln serve` on a free port (default model), then runs `--clients` threads for
`--minutes`. Each client loops: a streamed chat completion (one of a few prompts, max_tokens
16-128); with probability `--cancel` it closes the connection after a random number of
chunks. Every 5 s the server's resident memory (VmRSS) is sampled. At the end it prints:
requests finished / cancelled / failed (a failure is any request that was not cancelled by
its client and did not end with [DONE] after HTTP 200), streamed tokens per second over the
run, time to first token and total latency (p50, p99), and RSS over time: after warm-up
(the first minute) the RSS must stay within 10% of its post-warm-up level; with --gpu the
server's device memory (nvidia-smi) is sampled and held to the same bound. Exit status 1
when any request failed or memory grew more than 10%.

Standard library only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import subprocess
import sys
import threading
import time

PROMPTS = [
    "Tell me a short story about a lighthouse keeper.",
    "What are three good habits for writing code?",
    "Explain how a rainbow forms, in two sentences.",
    "List five fruits and one fact about each.",
    "Write a haiku about winter mornings.",
    "How do I make a cup of tea?",
]


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def pct(v: list[float], p: float) -> float:
    if not v:
        return float("nan")
    s = sorted(v)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = 0
        self.cancelled = 0
        self.failed: list[str] = []
        self.tokens = 0
        self.ttft: list[float] = []
        self.total: list[float] = []


def one_request(port: int, model: str, rng: random.Random, cancel_p: float, st: Stats) -> None:
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "max_tokens": rng.randint(16, 128),
        "temperature": 0.7,
        "seed": rng.randint(0, 1 << 30),
        "stream": True,
    })
    cancel_after = rng.randint(1, 20) if rng.random() < cancel_p else None
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            msg = resp.read()[:200].decode("utf-8", "replace")
            with st.lock:
                st.failed.append(f"HTTP {resp.status}: {msg}")
            return
        chunks, first, finished = 0, None, False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                finished = True
                break
            ev = json.loads(data)
            if ev.get("choices") and ev["choices"][0].get("delta", {}).get("content"):
                chunks += 1
                if first is None:
                    first = time.monotonic() - t0
                if cancel_after is not None and chunks >= cancel_after:
                    conn.close()  # the client goes away mid-stream
                    with st.lock:
                        st.cancelled += 1
                        st.tokens += chunks
                    return
        with st.lock:
            st.tokens += chunks
            if finished:
                st.done += 1
                st.total.append(time.monotonic() - t0)
                if first is not None:
                    st.ttft.append(first)
            elif cancel_after is None:
                st.failed.append("stream ended without [DONE]")
            else:
                st.cancelled += 1
    except Exception as e:  # noqa: BLE001 - every client-side failure is counted
        with st.lock:
            st.failed.append(f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def gpu_mib(pid: int) -> int | None:
    """Device memory (MiB) of process `pid` by nvidia-smi, else of the whole GPU."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            p, mib = [x.strip() for x in line.split(",")]
            if p == str(pid):
                return int(mib)
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="target/release/kiln")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--cancel", type=float, default=0.2)
    ap.add_argument("--serve-args", default="-t 2 --parallel 4")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--gpu", action="store_true",
                    help="also sample the server's GPU memory (nvidia-smi) and hold it to "
                         "the same 10%% bound")
    a = ap.parse_args()

    srv = subprocess.Popen(
        [a.kiln, "serve", "--port", "0", "--no-audio", *a.serve_args.split()],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = None
    t_start = time.monotonic()
    while time.monotonic() - t_start < 300:
        line = srv.stdout.readline()
        if not line:
            break
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        print("kiln serve did not start", file=sys.stderr)
        srv.kill()
        return 1
    # Keep draining the server's output so it never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in srv.stdout], daemon=True).start()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/v1/models")
    model = json.loads(conn.getresponse().read())["data"][0]["id"]
    conn.close()

    st = Stats()
    end = time.monotonic() + a.minutes * 60
    rss: list[tuple[float, int]] = []

    def client(i: int) -> None:
        rng = random.Random(1000 + i)
        while time.monotonic() < end:
            one_request(port, model, rng, a.cancel, st)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(a.clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    gpu: list[tuple[float, int]] = []
    while any(t.is_alive() for t in threads):
        r = rss_kib(srv.pid)
        if r is not None:
            rss.append((time.monotonic() - t0, r))
        g = gpu_mib(srv.pid) if a.gpu else None
        if g is not None:
            gpu.append((time.monotonic() - t0, g))
        time.sleep(5)
    elapsed = time.monotonic() - t0
    r = rss_kib(srv.pid)
    if r is not None:
        rss.append((elapsed, r))
    srv.terminate()
    srv.wait(timeout=30)

    warm = [v for t, v in rss if t >= 60] or [v for _, v in rss]
    base, peak, last = warm[0], max(warm), warm[-1]
    growth = (peak - base) / base
    res = {
        "clients": a.clients,
        "seconds": round(elapsed, 1),
        "cancel_probability": a.cancel,
        "serve_args": a.serve_args,
        "finished": st.done,
        "cancelled": st.cancelled,
        "failed": len(st.failed),
        "failures": st.failed[:10],
        "tokens_per_s": round(st.tokens / elapsed, 2),
        "ttft_p50_s": round(pct(st.ttft, 50), 3),
        "ttft_p99_s": round(pct(st.ttft, 99), 3),
        "total_p50_s": round(pct(st.total, 50), 3),
        "total_p99_s": round(pct(st.total, 99), 3),
        "rss_mib_after_warmup": round(base / 1024, 1),
        "rss_mib_peak": round(peak / 1024, 1),
        "rss_mib_last": round(last / 1024, 1),
        "rss_growth_after_warmup": round(growth, 4),
        "rss_mib_series": [(round(t), round(v / 1024, 1)) for t, v in rss[:: max(1, len(rss) // 24)]],
    }
    gpu_growth = 0.0
    if a.gpu:
        gw = [v for t, v in gpu if t >= 60] or [v for _, v in gpu]
        if gw:
            gpu_growth = (max(gw) - gw[0]) / max(gw[0], 1)
            res["gpu_mib_after_warmup"] = gw[0]
            res["gpu_mib_peak"] = max(gw)
            res["gpu_mib_last"] = gw[-1]
            res["gpu_growth_after_warmup"] = round(gpu_growth, 4)
            res["gpu_mib_series"] = [(round(t), v) for t, v in gpu[:: max(1, len(gpu) // 24)]]
        else:
            res["gpu_mib_series"] = "nvidia-smi gave no reading"
            gpu_growth = float("inf")
    print(json.dumps(res, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    ok = not st.failed and growth <= 0.10 and gpu_growth <= 0.10
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
