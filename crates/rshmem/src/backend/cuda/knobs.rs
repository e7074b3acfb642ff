//! Measurement knobs: sizes read from the environment with a range check, for the typed
//! tuning values' `from_env` (the collectives' and MoE's) and the benchmarks.

use crate::error::{Error, Result};

/// A measurement knob from `name`: `default` when unset, an error naming the variable and
/// `what` when the value is not a size or `ok` refuses it.
pub(crate) fn knob_from_env(
    name: &str,
    default: usize,
    ok: impl Fn(usize) -> bool,
    what: &str,
) -> Result<usize> {
    knob_value(name, std::env::var(name).ok().as_deref(), default, ok, what)
}

/// [`knob_from_env`] on the value `v` of variable `name` (`None` or empty: unset).
pub(crate) fn knob_value(
    name: &str,
    v: Option<&str>,
    default: usize,
    ok: impl Fn(usize) -> bool,
    what: &str,
) -> Result<usize> {
    let v = crate::config::size_value(name, v)?.unwrap_or(default);
    if !ok(v) {
        return Err(Error::invalid(format!("{name}={v}: {what}")));
    }
    Ok(v)
}

/// Space-separated NVRTC options from variable `name`'s value `v`; an error naming the variable
/// for a `-D` of a switch in `refused` (kernel switches that give wrong results on purpose, for
/// rshmem's own tests).
pub(crate) fn nvrtc_options(name: &str, v: &str, refused: &[&str]) -> Result<Vec<String>> {
    let opts: Vec<String> = v.split_whitespace().map(str::to_string).collect();
    for o in &opts {
        let switch = o
            .strip_prefix("-D")
            .unwrap_or("")
            .split('=')
            .next()
            .unwrap_or("");
        if refused.contains(&switch) {
            return Err(Error::invalid(format!(
                "{name}: {o} gives wrong results on purpose (a switch for rshmem's own tests)"
            )));
        }
    }
    Ok(opts)
}
