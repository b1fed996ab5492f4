//! Shared helpers for the criterion benchmarks in `benches/benches/`: reading criterion's
//! medians back after a run (for the per-size summary tables the benches print: our time,
//! libtorch's, their ratio and the schedule the planner chose) and describing the machine.

use std::path::PathBuf;
use std::sync::Mutex;

/// Criterion's output folder: `$CRITERION_HOME`, else `$CARGO_TARGET_DIR/criterion`, else
/// `<target>/criterion` found from the bench executable's path (`target/<profile>/deps/…`).
pub fn criterion_home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("CRITERION_HOME") {
        return Some(PathBuf::from(h));
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return Some(PathBuf::from(t).join("criterion"));
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.parent()?.join("criterion"))
}

/// The median (seconds) criterion stored for `group/function/value` in its latest run, if
/// any.
pub fn criterion_median_s(group: &str, function: &str, value: &str) -> Option<f64> {
    let p = criterion_home()?
        .join(group)
        .join(function)
        .join(value)
        .join("new")
        .join("estimates.json");
    let text = std::fs::read_to_string(p).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("median")?
        .get("point_estimate")?
        .as_f64()
        .map(|ns| ns * 1e-9)
}

/// Benchmarks that ran in this process (criterion's filter may skip some): `(group, value)`.
static RAN: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Note that the benchmarks of `group` for `value` ran in this process (call it from inside
/// the `bench_function` closure, which criterion only calls when the filter matches).
pub fn mark_ran(group: &str, value: &str) {
    let mut r = match RAN.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let e = (group.to_string(), value.to_string());
    if !r.contains(&e) {
        r.push(e);
    }
}

/// Whether [`mark_ran`] was called for `group`, `value`.
pub fn ran(group: &str, value: &str) -> bool {
    let r = match RAN.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    r.iter().any(|(g, v)| g == group && v == value)
}

/// One line on the machine and the thread counts of both backends.
pub fn machine_line() -> String {
    format!(
        "machine: {}; rayon threads {}, libtorch intra-op threads {}",
        raptor_plan::machine().describe(),
        rayon::current_num_threads(),
        tch::get_num_threads()
    )
}
