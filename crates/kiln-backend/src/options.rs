//! Run-time options, parsed once per process by one convention.
//!
//! [`RuntimeOptions`] holds what a user may change about how kiln computes: the `kiln`
//! command's flags first (it calls [`init`] before it makes a backend), the documented
//! environment variables second (README, "Environment"). Components read [`get`] when they
//! are made, never per op.
//!
//! A switch is off when unset, empty or `0`, and on for any other value; a switch that turns
//! a default behaviour off is named for what it does (`KILN_CUDA_NO_GRAPHS=1`). A value is
//! absent when unset or empty.
//!
//! Debugging and A/B switches (`KILN_CUDA_TIMES`, `KILN_X8_PREFETCH`, ...) are read through
//! [`dev_flag`] and [`dev_parsed`]: only in builds with the `dev-switches` feature; in other
//! builds they are off and the code they guard compiles away.

use std::sync::OnceLock;

/// What this process may change about how kiln computes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// CPU: the scalar kernels only (`--no-simd`, `KILN_NO_SIMD`).
    pub no_simd: bool,
    /// CPU: the AVX2 versions on an AVX-512 machine (`--no-avx512`, `KILN_NO_AVX512`).
    pub no_avx512: bool,
    /// CPU: no AVX-VNNI (the VEX-encoded integer dot products of Intel's client CPUs since
    /// Alder Lake and of AMD's since Zen 5): with `no_avx512`, the plain AVX2 kernels that
    /// older laptops and desktops run (`--no-avx-vnni`, `KILN_NO_AVX_VNNI`).
    pub no_avx_vnni: bool,
    /// CPU: no AMX tiles, what most users' CPUs run (`--no-amx`, `KILN_NO_AMX`).
    pub no_amx: bool,
    /// CPU: no AVX-512 BF16 products, as Intel's CPUs before Cooper Lake (`--no-bf16`,
    /// `KILN_NO_BF16`).
    pub no_bf16: bool,
    /// CUDA: decode steps launched op by op instead of replayed as graphs
    /// (`--no-cuda-graphs`, `KILN_CUDA_NO_GRAPHS`).
    pub no_cuda_graphs: bool,
    /// A summary of named activations per layer on stderr, to diff two backends (`--trace`,
    /// `KILN_TRACE`).
    pub trace: bool,
    /// Bytes a model may take before it is refused (`--memory-limit`, `KILN_MEMORY_LIMIT`;
    /// default: what the machine has available).
    pub memory_limit: Option<u64>,
    /// Load without the memory check (`--no-memory-check`, `KILN_NO_MEMORY_CHECK`).
    pub no_memory_check: bool,
}

impl RuntimeOptions {
    /// The options the environment sets (each unset variable: the default).
    pub fn from_env() -> RuntimeOptions {
        RuntimeOptions {
            no_simd: flag("KILN_NO_SIMD"),
            no_avx512: flag("KILN_NO_AVX512"),
            no_avx_vnni: flag("KILN_NO_AVX_VNNI"),
            no_amx: flag("KILN_NO_AMX"),
            no_bf16: flag("KILN_NO_BF16"),
            no_cuda_graphs: flag("KILN_CUDA_NO_GRAPHS"),
            trace: flag("KILN_TRACE"),
            memory_limit: parsed("KILN_MEMORY_LIMIT"),
            no_memory_check: flag("KILN_NO_MEMORY_CHECK"),
        }
    }
}

static CURRENT: OnceLock<RuntimeOptions> = OnceLock::new();

/// Sets this process's options (a program's flags over [`RuntimeOptions::from_env`]), before
/// anything reads them; gives them back if they were already read or set.
pub fn init(opts: RuntimeOptions) -> Result<(), RuntimeOptions> {
    CURRENT.set(opts)
}

/// This process's options: those given to [`init`], or the environment's as first read.
pub fn get() -> &'static RuntimeOptions {
    CURRENT.get_or_init(RuntimeOptions::from_env)
}

/// A debugging or A/B switch: read like [`flag`] where the `dev-switches` feature is built,
/// off otherwise.
pub fn dev_flag(name: &str) -> bool {
    cfg!(feature = "dev-switches") && flag(name)
}

/// A debugging or tuning value: read like [`parsed`] where the `dev-switches` feature is
/// built, absent otherwise.
pub fn dev_parsed<T: std::str::FromStr>(name: &str) -> Option<T> {
    if cfg!(feature = "dev-switches") {
        parsed(name)
    } else {
        None
    }
}

/// A debugging value as text: like [`value`] where the `dev-switches` feature is built,
/// absent otherwise.
pub fn dev_value(name: &str) -> Option<String> {
    if cfg!(feature = "dev-switches") {
        value(name)
    } else {
        None
    }
}

/// Whether switch `name` is on: set to anything but the empty string or `0`.
pub fn flag(name: &str) -> bool {
    switch_on(std::env::var_os(name).as_deref())
}

/// Value `name`, unless unset or empty.
pub fn value(name: &str) -> Option<String> {
    present(std::env::var(name).ok())
}

/// Value `name` parsed as `T`, unless unset, empty or not a `T`.
pub fn parsed<T: std::str::FromStr>(name: &str) -> Option<T> {
    value(name).and_then(|v| v.trim().parse().ok())
}

fn switch_on(v: Option<&std::ffi::OsStr>) -> bool {
    v.is_some_and(|v| !v.is_empty() && v != "0")
}

fn present(v: Option<String>) -> Option<String> {
    v.filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    /// One convention: unset, empty and "0" are off; anything else is on; an empty value is
    /// no value.
    #[test]
    fn switches_and_values_read_one_way() {
        for (v, on) in [
            (None, false),
            (Some(""), false),
            (Some("0"), false),
            (Some("1"), true),
            (Some("yes"), true),
            (Some("00"), true),
        ] {
            assert_eq!(super::switch_on(v.map(OsStr::new)), on, "{v:?}");
        }
        assert_eq!(super::present(Some(String::new())), None);
        assert_eq!(super::present(Some("x".into())), Some("x".into()));
        assert_eq!(super::present(None), None);
    }
}
