//! # raptor-plan
//!
//! Kernels that plan for the machine they run on, in the spirit of FFTW's planner:
//!
//! - [`machine()`]: cache sizes and hardware threads read at run time (Linux sysfs, with a
//!   generic fallback), from which kernels size their blocks and prune their candidate
//!   schedules — no size tuned for one machine is compiled in.
//! - [`measure`]: time a few candidate schedules on the caller's own data, interleaved (each
//!   round runs every candidate once, starting with a different one), within a total budget of
//!   runs, and return the fastest with its result.
//! - The wisdom store: the choice per *shape class* (a key string built by the kernel, e.g.
//!   `clip/rows b2^8 p2^17 s1 g1 t2`) is kept for the life of the process ([`lookup`],
//!   [`remember`]), and can be saved to and loaded from a small text file ([`save_wisdom`],
//!   [`load_wisdom`]). With the environment variable `RAPTOR_WISDOM=path` the file is loaded
//!   on first use and rewritten after each new choice. Wisdom is never required: a missing
//!   file means "plan again", and a corrupt one, or one written on another machine, is ignored
//!   with a warning on stderr ([`warnings`]) — never a panic, never an abort.
//! - [`team`]: a persistent team of worker threads that spin between calls (as OpenMP
//!   runtimes do), for parallel kernels whose calls are too short to pay for waking sleeping
//!   pool threads.
//! - [`PlanMode`]: `Measure` (the default) times candidates; `Estimate` takes the kernel's
//!   cache-model choice without timing (deterministic; `RAPTOR_PLAN=estimate`).
//!
//! Planning only ever picks among computations that the kernels document as equivalent
//! (bitwise, or within a stated rounding tolerance), so a timing-based choice cannot change
//! what a kernel computes beyond that tolerance.
//!
//! ```
//! use raptor_plan::{measure, lookup, remember};
//! let data: Vec<f32> = (0..10_000).map(|i| i as f32).collect();
//! let candidates = ["forward", "chunked"];
//! let m = measure(&candidates, 6, |c| -> Result<f32, ()> {
//!     Ok(match *c {
//!         "forward" => data.iter().sum(),
//!         _ => data.chunks(64).map(|c| c.iter().sum::<f32>()).sum(),
//!     })
//! })?
//! .expect("two candidates");
//! assert!(m.winner < 2 && m.runs == 6);
//! remember("doc/sum n2^14", candidates[m.winner]);
//! assert_eq!(lookup("doc/sum n2^14").as_deref(), Some(candidates[m.winner]));
//! # Ok::<(), ()>(())
//! ```

mod error;
pub mod machine;
pub mod team;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

pub use error::PlanError;
pub use machine::{CacheSource, MachineInfo, machine};

/// First line of a wisdom file.
pub const WISDOM_HEADER: &str = "raptor-wisdom 1";

/// Environment variable naming the wisdom file.
pub const WISDOM_ENV: &str = "RAPTOR_WISDOM";

/// Environment variable selecting the plan mode (`measure` or `estimate`).
pub const PLAN_ENV: &str = "RAPTOR_PLAN";

/// Default budget of timed runs per shape class (all candidates together).
pub const DEFAULT_BUDGET: usize = 9;

/// Default time under which [`measure_within`] adds whole rounds after the budget (50 ms: a
/// one-off cost per shape class and process, for kernels whose calls take milliseconds or
/// less, where one disturbed run can decide a close race).
pub const DEFAULT_EXTRA_TIME: std::time::Duration = std::time::Duration::from_millis(50);

/// How kernels choose a schedule for a shape class they have no wisdom for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanMode {
    /// Time the candidates on the first call (the default).
    Measure,
    /// Take the kernel's cache-model estimate, no timing (deterministic).
    Estimate,
}

static MODE: AtomicU8 = AtomicU8::new(0);

/// Set the plan mode for the process (overrides `RAPTOR_PLAN`).
pub fn set_mode(mode: PlanMode) {
    MODE.store(
        match mode {
            PlanMode::Measure => 1,
            PlanMode::Estimate => 2,
        },
        Ordering::Relaxed,
    );
}

/// The plan mode: the one set by [`set_mode`], else `RAPTOR_PLAN` (`estimate` or `measure`;
/// anything else warns once and measures), else [`PlanMode::Measure`].
pub fn mode() -> PlanMode {
    match MODE.load(Ordering::Relaxed) {
        1 => PlanMode::Measure,
        2 => PlanMode::Estimate,
        _ => {
            static ENV: OnceLock<PlanMode> = OnceLock::new();
            *ENV.get_or_init(|| match std::env::var(PLAN_ENV) {
                Ok(v) if v.eq_ignore_ascii_case("estimate") => PlanMode::Estimate,
                Ok(v) if v.eq_ignore_ascii_case("measure") || v.is_empty() => PlanMode::Measure,
                Ok(v) => {
                    warn(format!(
                        "{PLAN_ENV}={v:?} is neither `measure` nor `estimate`; measuring"
                    ));
                    PlanMode::Measure
                }
                Err(_) => PlanMode::Measure,
            })
        }
    }
}

/// The outcome of [`measure`].
#[derive(Debug, Clone)]
pub struct Measured<T> {
    /// Index of the fastest candidate.
    pub winner: usize,
    /// The result of the winner's last run (so the caller's call returns what the chosen
    /// schedule computes).
    pub output: T,
    /// Minimum seconds per candidate over its runs.
    pub best_secs: Vec<f64>,
    /// Runs made in all.
    pub runs: usize,
}

/// Time every candidate on the caller's data and pick the fastest (minimum wall time).
///
/// At most `budget` timed runs in all (but at least one per candidate), in interleaved rounds:
/// each round runs every remaining candidate once, round k starting with the (k mod n)-th of
/// them, so that a machine whose speed drifts affects all alike. When the budget left cannot
/// give every remaining candidate another run, the slower half (by best time so far) is
/// dropped before the next round (successive halving), so that many candidates cost no more
/// runs than the budget: 6 candidates and a budget of 9 run all six once, then the fastest
/// three once more. The search stops when one candidate is left or the budget cannot pay a
/// full round. An error from any run is returned at once. `Ok(None)` when there are no
/// candidates.
pub fn measure<C, T, E>(
    candidates: &[C],
    budget: usize,
    run: impl FnMut(&C) -> Result<T, E>,
) -> Result<Option<Measured<T>>, E> {
    measure_within(candidates, budget, std::time::Duration::ZERO, run)
}

/// [`measure`] that may run more rounds where they are cheap: after the `budget` runs, whole
/// extra rounds of every candidate run while the time spent so far is below `extra_time`
/// (at most four times the budget in all). Noise on a shared machine only ever makes a run
/// slower, so more runs per candidate make the minimum — and the choice — more reliable;
/// `extra_time` bounds what that costs once per shape class (calls of a few milliseconds get
/// several runs each, calls of a second get the plain budget).
pub fn measure_within<C, T, E>(
    candidates: &[C],
    budget: usize,
    extra_time: std::time::Duration,
    mut run: impl FnMut(&C) -> Result<T, E>,
) -> Result<Option<Measured<T>>, E> {
    let started = Instant::now();
    let n = candidates.len();
    if n == 0 {
        return Ok(None);
    }
    let mut best = vec![f64::INFINITY; n];
    let mut last: Vec<Option<T>> = (0..n).map(|_| None).collect();
    // Remaining candidates, in their given order.
    let mut alive: Vec<usize> = (0..n).collect();
    let mut runs = 0usize;
    let mut round = 0usize;
    loop {
        let m = alive.len();
        for j in 0..m {
            let c = alive[(round + j) % m];
            let t = Instant::now();
            let out = run(&candidates[c])?;
            best[c] = best[c].min(t.elapsed().as_secs_f64());
            last[c] = Some(out);
            runs += 1;
        }
        round += 1;
        let left = budget.saturating_sub(runs);
        if left < alive.len()
            && alive.len() == n
            && runs + n <= 4 * budget.max(n)
            && started.elapsed() < extra_time
        {
            // The budget is spent but the runs were cheap: another whole round of every
            // candidate.
            continue;
        }
        if left < alive.len() {
            // Keep the faster half (ties: the earlier candidate), in the given order.
            let keep = alive.len().div_ceil(2);
            let mut by_time = alive.clone();
            by_time.sort_by(|&a, &b| best[a].total_cmp(&best[b]).then(a.cmp(&b)));
            by_time.truncate(keep);
            alive.retain(|c| by_time.contains(c));
        }
        if alive.len() <= 1 || left < alive.len() {
            break;
        }
    }
    let mut winner = 0;
    for c in 1..n {
        if best[c] < best[winner] {
            winner = c;
        }
    }

    Ok(last[winner].take().map(|output| Measured {
        winner,
        output,
        best_secs: best,
        runs,
    }))
}

/// The process's wisdom and the state of the `RAPTOR_WISDOM` file.
#[derive(Default)]
struct Store {
    entries: BTreeMap<String, String>,
    env_checked: bool,
    env_path: Option<PathBuf>,
    warnings: Vec<String>,
}

fn store() -> MutexGuard<'static, Store> {
    static S: OnceLock<Mutex<Store>> = OnceLock::new();
    let m = S.get_or_init(|| Mutex::new(Store::default()));
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn warn_in(st: &mut Store, msg: String) {
    eprintln!("raptor: warning: {msg}");
    st.warnings.push(msg);
}

fn warn(msg: String) {
    warn_in(&mut store(), msg);
}

/// Load `RAPTOR_WISDOM` once (a missing file is fine; a bad one warns and is ignored).
fn ensure_env(st: &mut Store) {
    if st.env_checked {
        return;
    }
    st.env_checked = true;
    let Some(path) = std::env::var_os(WISDOM_ENV).filter(|p| !p.is_empty()) else {
        return;
    };
    let path = PathBuf::from(path);
    // Only a file that is absent or holds wisdom (of any machine) is ever rewritten: a path
    // set by mistake to another file is left alone.
    let writable = match std::fs::read_to_string(&path) {
        Ok(text) => match parse(&text) {
            Ok(map) => {
                for (k, v) in map {
                    st.entries.entry(k).or_insert(v);
                }
                true
            }
            Err(e) => {
                let ours = text.lines().next().map(str::trim_end) == Some(WISDOM_HEADER);
                let also = if ours {
                    ""
                } else {
                    " (and not overwriting it)"
                };
                warn_in(
                    st,
                    format!("ignoring {WISDOM_ENV}={}{also}: {e}", path.display()),
                );
                ours
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            warn_in(st, format!("ignoring {WISDOM_ENV}={}: {e}", path.display()));
            false
        }
    };
    if writable {
        st.env_path = Some(path);
    }
}

/// The choice remembered for a shape class, if any.
pub fn lookup(key: &str) -> Option<String> {
    let mut st = store();
    ensure_env(&mut st);
    st.entries.get(key).cloned()
}

/// Remember `choice` for shape class `key` in this process, and rewrite the `RAPTOR_WISDOM`
/// file if one is set (a failed write warns and is otherwise ignored; a file there that is not
/// a wisdom file is never overwritten). Keys and choices with
/// tabs, line breaks or surrounding spaces cannot be stored and are ignored with a warning.
pub fn remember(key: &str, choice: &str) {
    let mut st = store();
    ensure_env(&mut st);
    if let Err(e) = check_entry(key, choice) {
        warn_in(&mut st, e.to_string());
        return;
    }
    st.entries.insert(key.to_string(), choice.to_string());
    if let Some(path) = st.env_path.clone() {
        let text = render(&st.entries);
        if let Err(e) = write_atomic(&path, &text) {
            warn_in(&mut st, e.to_string());
        }
    }
}

/// Forget every remembered choice whose key starts with `prefix` (`""`: all), so that the
/// next call of those shape classes plans again.
pub fn forget(prefix: &str) {
    let mut st = store();
    ensure_env(&mut st);
    st.entries.retain(|k, _| !k.starts_with(prefix));
}

/// Every remembered `(shape class, choice)`, sorted by key.
pub fn entries() -> Vec<(String, String)> {
    let mut st = store();
    ensure_env(&mut st);
    st.entries
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Warnings issued so far (bad wisdom files, failed writes, bad `RAPTOR_PLAN`).
pub fn warnings() -> Vec<String> {
    store().warnings.clone()
}

/// The wisdom as text (the file format): [`WISDOM_HEADER`], a `machine` line with
/// [`MachineInfo::signature`], then one `key<TAB>choice` line per entry.
pub fn export_wisdom() -> String {
    let mut st = store();
    ensure_env(&mut st);
    render(&st.entries)
}

/// Merge wisdom text into the process's wisdom (its entries replace those with the same key).
/// Returns the number of entries read. The whole text is rejected, and nothing merged, when any
/// line is malformed or when it was written on a machine with another signature.
pub fn import_wisdom(text: &str) -> Result<usize, PlanError> {
    let map = parse(text)?;
    let n = map.len();
    let mut st = store();
    ensure_env(&mut st);
    st.entries.extend(map);
    Ok(n)
}

/// [`import_wisdom`] from a file.
pub fn load_wisdom(path: &Path) -> Result<usize, PlanError> {
    let text = std::fs::read_to_string(path).map_err(|e| PlanError::WisdomIo {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    import_wisdom(&text)
}

/// Write [`export_wisdom`] to a file (through a temporary file and a rename).
pub fn save_wisdom(path: &Path) -> Result<(), PlanError> {
    write_atomic(path, &export_wisdom())
}

fn check_entry(key: &str, choice: &str) -> Result<(), PlanError> {
    for (what, v) in [("key", key), ("choice", choice)] {
        if v.is_empty() || v.trim() != v || v.contains(['\t', '\n', '\r']) {
            return Err(PlanError::InvalidEntry {
                what,
                value: v.to_string(),
                reason: "must be non-empty, without tabs, line breaks or surrounding spaces",
            });
        }
    }
    Ok(())
}

fn render(entries: &BTreeMap<String, String>) -> String {
    let mut s = format!("{WISDOM_HEADER}\nmachine\t{}\n", machine().signature());
    for (k, v) in entries {
        s.push_str(k);
        s.push('\t');
        s.push_str(v);
        s.push('\n');
    }
    s
}

fn parse(text: &str) -> Result<BTreeMap<String, String>, PlanError> {
    let corrupt = |line: usize, reason: String| PlanError::CorruptWisdom { line, reason };
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, l)) if l.trim_end() == WISDOM_HEADER => {}
        Some((_, l)) => {
            let shown: String = l.chars().take(40).collect();
            return Err(corrupt(
                1,
                format!("expected the header {WISDOM_HEADER:?}, found {shown:?}"),
            ));
        }
        None => return Err(corrupt(0, "empty text".into())),
    }
    let here = machine().signature();
    match lines.next() {
        Some((_, l)) => match l.split_once('\t') {
            Some(("machine", sig)) if sig == here => {}
            Some(("machine", sig)) => {
                return Err(corrupt(
                    2,
                    format!("written on another machine ({sig}); this one is {here}"),
                ));
            }
            _ => return Err(corrupt(2, "expected a `machine<TAB>...` line".into())),
        },
        None => return Err(corrupt(2, "missing the machine line".into())),
    }
    let mut map = BTreeMap::new();
    for (i, l) in lines {
        if l.is_empty() {
            continue;
        }
        let Some((k, v)) = l.split_once('\t') else {
            return Err(corrupt(i + 1, "expected `key<TAB>choice`".into()));
        };
        check_entry(k, v).map_err(|e| corrupt(i + 1, e.to_string()))?;
        map.insert(k.to_string(), v.to_string());
    }
    Ok(map)
}

fn write_atomic(path: &Path, text: &str) -> Result<(), PlanError> {
    let io = |e: std::io::Error| PlanError::WisdomIo {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn measure_interleaves_and_returns_the_winners_last_output() {
        // No assertion on which candidate wins (that is wall-clock); only the logic: every
        // candidate runs once per round, round k starts with candidate k mod n, the winner is
        // one of them and its last output is returned.
        let c = [10u64, 20, 30];
        let mut order = Vec::new();
        let m = measure(&c, 9, |&v| -> Result<(u64, usize), ()> {
            order.push(v);
            Ok((v, order.len()))
        })
        .unwrap()
        .unwrap();
        assert_eq!(order, vec![10, 20, 30, 20, 30, 10, 30, 10, 20]);
        assert_eq!(m.runs, 9);
        assert_eq!(m.best_secs.len(), 3);
        assert!(m.best_secs.iter().all(|t| t.is_finite() && *t >= 0.0));
        let want = c[m.winner];
        assert_eq!(m.output.0, want);
        let last = order.iter().rposition(|&v| v == want).unwrap() + 1;
        assert_eq!(m.output.1, last);
        assert!(m.best_secs.iter().all(|&t| t >= m.best_secs[m.winner]));
    }

    #[test]
    fn measure_drops_the_slower_half_when_the_budget_cannot_pay_a_full_round() {
        // Six candidates, budget 9: one round of all six, then the three fastest once more
        // (the rotated start of round 2). Candidates 0, 2, 4 sleep 75 ms, the others not, so
        // the survivors are 1, 3, 5 whatever the machine's noise.
        let c = [3u64, 0, 3, 0, 3, 0];
        let mut order = Vec::new();
        let m = measure(&c, 9, |&v| -> Result<u64, ()> {
            order.push(order.len());
            std::thread::sleep(std::time::Duration::from_millis(25 * v));
            Ok(v)
        })
        .unwrap()
        .unwrap();
        assert_eq!(m.runs, 9);
        assert_eq!(order.len(), 9);
        assert!([1, 3, 5].contains(&m.winner), "{m:?}");
        assert_eq!(m.output, 0);
        // the slow ones ran once, so their best is their one (slow) run
        for i in [0, 2, 4] {
            assert!(m.best_secs[i] >= 0.075, "{:?}", m.best_secs);
        }
        // a single candidate runs once, whatever the budget
        let mut n = 0;
        let one = measure(&[7u8], 9, |_| {
            n += 1;
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
        assert_eq!((n, one.runs, one.winner), (1, 1, 0));
        // four candidates and a budget of 9: two full rounds (8 runs), as without halving
        let mut seen = Vec::new();
        let m4 = measure(&[0u8, 1, 2, 3], 9, |&v| {
            seen.push(v);
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
        assert_eq!(m4.runs, 8);
        assert_eq!(seen, vec![0, 1, 2, 3, 1, 2, 3, 0]);
    }

    #[test]
    fn measure_runs_the_survivors_in_their_order_with_a_rotated_start() {
        // Seven candidates, budget 12: 7 runs, then 4 survivors (the budget left, 5, pays
        // one more round of 4), started at the second of them; then 2 survivors and 1 run
        // left: stop. The timing decides which survive, so check the structure only.
        let mut seen: Vec<usize> = Vec::new();
        let m = measure(&[0usize, 1, 2, 3, 4, 5, 6], 12, |&v| {
            seen.push(v);
            Ok::<_, ()>(v)
        })
        .unwrap()
        .unwrap();
        assert_eq!(m.runs, 11);
        assert_eq!(&seen[..7], &[0, 1, 2, 3, 4, 5, 6]);
        let mut second = seen[7..].to_vec();
        assert_eq!(second.len(), 4);
        // a rotation by one of an increasing sequence
        assert!(second[..3].windows(2).all(|w| w[0] < w[1]) && second[3] < second[0]);
        second.sort_unstable();
        second.dedup();
        assert_eq!(second.len(), 4);
        assert!(second.contains(&m.winner));
    }

    /// Cheap runs get whole extra rounds (every candidate, rotated starts) up to four times the
    /// budget; a zero extra time, or runs slower than it, get the plain budget.
    #[test]
    fn measure_within_adds_whole_rounds_while_cheap() {
        let cands = [0usize, 1, 2];
        let mut seen: Vec<usize> = Vec::new();
        let m = measure_within(&cands, 6, std::time::Duration::from_secs(60), |&v| {
            seen.push(v);
            Ok::<_, ()>(v)
        })
        .unwrap()
        .unwrap();
        // budget 6 = two rounds; extra rounds up to 4 × 6 = 24 runs (8 rounds of 3); then
        // the halving: the budget is spent, so it stops.
        assert_eq!(m.runs, 24);
        for (k, round) in seen.chunks(3).enumerate() {
            let mut r = round.to_vec();
            assert_eq!(r[0], k % 3, "round {k} starts rotated: {seen:?}");
            r.sort_unstable();
            assert_eq!(r, vec![0, 1, 2], "round {k} runs every candidate");
        }
        let plain = measure_within(&cands, 6, std::time::Duration::ZERO, |&v| Ok::<_, ()>(v))
            .unwrap()
            .unwrap();
        assert_eq!(plain.runs, 6);
        // Runs slower than the extra time: no extra round.
        let slow = measure_within(&cands, 6, std::time::Duration::from_millis(1), |&v| {
            std::thread::sleep(std::time::Duration::from_millis(2));
            Ok::<_, ()>(v)
        })
        .unwrap()
        .unwrap();
        assert_eq!(slow.runs, 6);
        // The winner is still the minimum over every run of every candidate.
        let mut calls = [0u32; 2];
        let m = measure_within(&[0usize, 1], 2, std::time::Duration::from_secs(60), |&v| {
            calls[v] += 1;
            // candidate 1 is slow on its first run only
            if v == 1 && calls[1] == 1 {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            if v == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok::<_, ()>(v)
        })
        .unwrap()
        .unwrap();
        assert_eq!((m.winner, m.runs), (1, 8));
    }

    #[test]
    fn measure_budget_and_errors() {
        let none = measure(&[] as &[u8], 9, |_| Ok::<_, ()>(())).unwrap();
        assert!(none.is_none());
        // budget below the candidate count: one run each
        let mut n = 0;
        let m = measure(&[1, 2, 3, 4], 2, |_| {
            n += 1;
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
        assert_eq!((n, m.runs), (4, 4));
        let e = measure(&[1, 2], 4, |&c| if c == 2 { Err("boom") } else { Ok(c) });
        assert_eq!(e.unwrap_err(), "boom");
    }

    #[test]
    fn corrupt_wisdom_is_an_error_not_a_panic() {
        let sig = machine().signature();
        for bad in [
            String::new(),
            "not wisdom".to_string(),
            format!("{WISDOM_HEADER}\n"),
            format!("{WISDOM_HEADER}\nmachine\tsomewhere else\nk\tv\n"),
            format!("{WISDOM_HEADER}\nmachine\t{sig}\nno tab here\n"),
            format!("{WISDOM_HEADER}\nmachine\t{sig}\n k\tv\n"),
            format!("{WISDOM_HEADER}\nmachine\t{sig}\nk\t\n"),
            "\u{0}\u{1}garbage\n\t\t".to_string(),
        ] {
            let e = import_wisdom(&bad).unwrap_err();
            assert!(matches!(e, PlanError::CorruptWisdom { .. }), "{bad:?}: {e}");
        }
        let e = load_wisdom(Path::new("/nonexistent/raptor/wisdom")).unwrap_err();
        assert!(matches!(e, PlanError::WisdomIo { .. }));
    }

    #[test]
    fn wisdom_round_trips_through_a_file() {
        remember("test/rt a", "x1");
        remember("test/rt b", "y2");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wisdom");
        save_wisdom(&path).unwrap();
        forget("test/rt");
        assert_eq!(lookup("test/rt a"), None);
        assert!(load_wisdom(&path).unwrap() >= 2);
        assert_eq!(lookup("test/rt a").as_deref(), Some("x1"));
        assert_eq!(lookup("test/rt b").as_deref(), Some("y2"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(WISDOM_HEADER));
    }

    #[test]
    fn bad_entries_are_not_stored() {
        remember("test/bad\tkey", "v");
        remember("test/bad key2", "a\nb");
        assert!(entries().iter().all(|(k, _)| !k.starts_with("test/bad")));
        assert!(
            warnings()
                .iter()
                .any(|w| w.contains("invalid wisdom entry"))
        );
    }

    proptest! {
        #[test]
        fn any_text_parses_or_errs_without_panicking(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }

        #[test]
        fn rendered_entries_parse_back(
            m in proptest::collection::btree_map("[a-z/ ^0-9]{0,12}[a-z0-9]", "[A-Za-z0-9()]{1,8}", 0..8)
        ) {
            let m: BTreeMap<String, String> = m
                .into_iter()
                .filter(|(k, _)| k.trim() == k)
                .collect();
            prop_assert_eq!(parse(&render(&m)).unwrap(), m);
        }
    }
}
