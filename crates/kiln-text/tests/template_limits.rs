//! Hostile chat templates (they come from model files) fail with an error naming the bound
//! they hit, and the process stays well: an endless loop, a string doubled in a loop, runaway
//! recursion, a flood of output, and work that is slow without allocating much.

use std::time::{Duration, Instant};

use kiln_text::{ChatTemplate, GuardedAlloc, Limits, Message};

#[global_allocator]
static ALLOC: GuardedAlloc = GuardedAlloc;

fn render(src: &str, limits: Limits) -> (Result<String, String>, ChatTemplate) {
    let t = ChatTemplate::new(src, "<s>", "</s>")
        .unwrap()
        .with_limits(limits);
    let r = t.render(&[Message::new("user", "hi")], true);
    (r.map_err(|e| e.to_string()), t)
}

fn small() -> Limits {
    Limits {
        memory: 32 << 20,
        time: Duration::from_secs(20),
        ..Limits::default()
    }
}

#[test]
fn the_guard_is_installed() {
    assert!(kiln_text::memory_guard_installed());
}

#[test]
fn an_endless_loop_runs_out_of_fuel() {
    let src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let start = Instant::now();
    let (r, _) = render(src, small());
    let e = r.unwrap_err();
    assert!(
        e.contains("ran out of fuel: more than 5000000 instructions"),
        "{e}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_string_doubled_in_a_loop_is_stopped_at_the_memory_bound() {
    let src = "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}";
    let (r, t) = render(src, small());
    let e = r.unwrap_err();
    assert!(
        e.contains("stopped: rendering needed more than 32 MiB"),
        "{e}"
    );
    // The stopped template is not run again.
    let e = t.render(&[], false).unwrap_err().to_string();
    assert!(e.contains("not rendered"), "{e}");
    // Straight-line doubling (no loop, no output) is stopped the same way.
    let chain = "{% set a = 'abcd' * 1000 %}".to_string()
        + &"{% set a = a ~ a %}".repeat(40)
        + "{{ a | length }}";
    let e = render(&chain, small()).0.unwrap_err();
    assert!(e.contains("more than 32 MiB"), "{e}");
}

#[test]
fn runaway_recursion_hits_the_recursion_limit() {
    let src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    let e = render(src, small()).0.unwrap_err();
    assert!(
        e.contains("chat template") && e.contains("recursion"),
        "{e}"
    );
    // Doubling through the arguments is stopped before the recursion limit is reached.
    let src = "{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('ab') }}";
    let e = render(src, small()).0.unwrap_err();
    assert!(
        e.contains("recursion") || e.contains("more than 32 MiB"),
        "{e}"
    );
}

#[test]
fn a_flood_of_output_hits_the_output_bound() {
    let limits = Limits {
        output: 1 << 20,
        ..small()
    };
    let src = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}";
    let e = render(src, limits).0.unwrap_err();
    assert!(
        e.contains("output limit: the template emits more than 1048576 bytes"),
        "{e}"
    );
    // Captured output (a macro body) counts too.
    let src = "{% macro m() %}{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}{% endmacro %}{% set s = m() %}{{ s | length }}";
    let e = render(src, limits).0.unwrap_err();
    assert!(e.contains("output limit"), "{e}");
}

#[test]
fn slow_work_is_stopped_at_the_time_bound() {
    let limits = Limits {
        memory: 256 << 20,
        time: Duration::from_millis(300),
        ..Limits::default()
    };
    // 40 MB copied per iteration, freed again: little memory held, a lot of time.
    let src = "{% set big = 'x' * 40000000 %}{% for i in range(100000) %}{% set y = big ~ i %}{% endfor %}";
    let start = Instant::now();
    let e = render(src, limits).0.unwrap_err();
    assert!(e.contains("took longer than 300ms"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn real_templates_render_within_the_default_bounds() {
    let src = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    let msgs: Vec<Message> = (0..500)
        .map(|i| {
            Message::new(
                if i % 2 == 0 { "user" } else { "assistant" },
                "word ".repeat(50),
            )
        })
        .collect();
    let out = t.render(&msgs, true).unwrap();
    assert_eq!(out.matches("<|im_start|>").count(), 501);
}
