//! Run-time switches and values from the environment, read by one convention.
//!
//! A switch (`KILN_NO_SIMD`, `KILN_TRACE`, ...) is off when unset, empty or `0`, and on for
//! any other value; a switch that turns a default behaviour off is named for what it does
//! (`KILN_CUDA_NO_GRAPHS=1`), so every switch reads the same way. A value (`KILN_HOME`,
//! `KILN_X8_PREFETCH`, ...) is absent when unset or empty. Each is read where the component
//! that uses it is made (a backend, a model state), or once per process for those the hot
//! paths ask (`cpu::kernels::simd_disabled`); never per op. The README's "Environment"
//! table lists them all; command-line flags, where one exists, come first.

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
