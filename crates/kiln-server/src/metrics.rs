//! Prometheus text exposition: requests by route and status, tokens, queue depth, and
//! histograms of time to first token and request latency.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use kiln_runtime::SchedulerStats;

const BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        for (c, &b) in self.counts.iter_mut().zip(&BUCKETS) {
            if v <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += v;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(&BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    ttft: Mutex<Histogram>,
    latency: Mutex<Histogram>,
}

impl Metrics {
    pub fn request(&self, route: &'static str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((route, status)).or_insert(0) += 1;
    }

    /// A finished generation.
    pub fn generation(&self, c: &kiln_runtime::Completion) {
        self.prompt_tokens
            .fetch_add(c.prompt_tokens as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(c.cached_tokens as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(c.completion_tokens as u64, Ordering::Relaxed);
        if c.completion_tokens > 0 {
            let mut h = self.ttft.lock().unwrap_or_else(|p| p.into_inner());
            h.observe(c.ttft_secs);
        }
        let mut h = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        h.observe(c.total_secs);
    }

    pub fn render(&self, s: &SchedulerStats) -> String {
        let mut out = String::new();
        out.push_str("# HELP kiln_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE kiln_requests_total counter\n");
        for ((route, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "kiln_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: usize| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            &mut out,
            "kiln_prompt_tokens_total",
            "Prompt tokens of finished requests.",
            load(&self.prompt_tokens),
        );
        counter(
            &mut out,
            "kiln_prompt_cached_tokens_total",
            "Prompt tokens reused from the prefix cache.",
            load(&self.cached_tokens),
        );
        counter(
            &mut out,
            "kiln_generated_tokens_total",
            "Generated tokens of finished requests.",
            load(&self.generated_tokens),
        );
        gauge(
            &mut out,
            "kiln_queue_depth",
            "Requests waiting for a slot.",
            s.queued.load(Ordering::SeqCst),
        );
        gauge(
            &mut out,
            "kiln_running_requests",
            "Requests being generated.",
            s.running.load(Ordering::SeqCst),
        );
        counter(
            &mut out,
            "kiln_batch_steps_total",
            "Engine steps (the decode rows' forward and any prompt chunks' forwards each).",
            s.steps.load(Ordering::Relaxed) as u64,
        );
        counter(
            &mut out,
            "kiln_fed_steps_total",
            "Decode forwards queued before their token was on the host (picks fed on the device).",
            s.fed_steps.load(Ordering::Relaxed) as u64,
        );
        let secs = |a: &AtomicU64| {
            let ns = a.load(Ordering::Relaxed);
            format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
        };
        for (name, help, v) in [
            (
                "kiln_engine_step_seconds_total",
                "Time in the engine's steps (forwards, sampling, streaming, bookkeeping).",
                secs(&s.step_ns),
            ),
            (
                "kiln_engine_forward_seconds_total",
                "Time of those in the model's forwards and greedy picks.",
                secs(&s.forward_ns),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let ttft = self.ttft.lock().unwrap_or_else(|p| p.into_inner());
        ttft.write(
            &mut out,
            "kiln_time_to_first_token_seconds",
            "From arrival to the first generated token.",
        );
        let lat = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        lat.write(
            &mut out,
            "kiln_request_duration_seconds",
            "From arrival to the last generated token.",
        );
        out
    }
}
