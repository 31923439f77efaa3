//! Every fuzz target over its seeds (each must parse) and a few thousand deterministic
//! mutations of them (none may panic or ask for an outsized allocation), so the normal test
//! run exercises the parsers the way `tools/fuzz.sh` does at length.

use std::panic::{catch_unwind, AssertUnwindSafe};

use kiln_fuzz::alloc::{CappedAlloc, DEFAULT_CAP};
use kiln_fuzz::mutate::{mutate, Rng};
use kiln_fuzz::TARGETS;

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc::new(DEFAULT_CAP);

const MUTATIONS: usize = 3000;

#[test]
fn seeds_parse_and_mutations_do_not_crash() {
    let mut failures = Vec::new();
    for t in TARGETS {
        let seeds = (t.seeds)();
        assert!(!seeds.is_empty(), "{}: no seeds", t.name);
        for (i, s) in seeds.iter().enumerate() {
            assert!((t.run)(s), "{}: seed {i} does not parse", t.name);
        }
        let mut r = Rng::new(0x6b69_6c6e ^ t.name.len() as u64);
        let mut parsed = 0;
        for _ in 0..MUTATIONS {
            let a = &seeds[r.below(seeds.len())];
            let b = &seeds[r.below(seeds.len())];
            let input = mutate(a, b, &mut r);
            match catch_unwind(AssertUnwindSafe(|| (t.run)(&input))) {
                Ok(ok) => parsed += ok as usize,
                Err(_) => failures.push(format!("{}: panics on {:02x?}", t.name, input)),
            }
        }
        eprintln!("{}: {MUTATIONS} mutations, {parsed} parsed", t.name);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
