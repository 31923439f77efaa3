//! The conformance suite (`kiln_backend::conformance`) on the CPU backend with the best
//! kernels this CPU has, against the reference; the lesser kernel sets have their own
//! binaries (conformance_no_*.rs: the choice is made once per process).

use kiln_backend::conformance::Tolerances;
use kiln_backend::cpu::CpuBackend;

fn run(op: fn(&CpuBackend, &Tolerances)) {
    let b = CpuBackend::new(2);
    eprintln!("kernels: {}", b.kernels());
    op(&b, &Tolerances::cpu())
}

kiln_backend::conformance_tests!(run);
