//! A persistent team of worker threads that spin between calls, for parallel kernels whose
//! calls are short (tens to hundreds of microseconds).
//!
//! Why: a call into a work-stealing pool (rayon) from outside it sends the work to threads that
//! are usually asleep, and waking a sleeping thread costs tens of microseconds on a virtual
//! machine (an inter-processor interrupt through the hypervisor) — as much as a whole
//! cache-resident clip-and-sum or a small Newton–Schulz call. OpenMP runtimes (libtorch's
//! among them) avoid it by letting their threads spin for a while after each parallel region,
//! so back-to-back calls find them awake. This module does the same:
//!
//! - [`run`]`(threads, f)` calls `f(member, size)` once for every member of a team of `size`
//!   (≤ `threads`): member 0 is the calling thread, members 1.. are persistent workers started
//!   on first use (never more than the largest team asked for). It returns when every member has
//!   returned, so `f` may borrow from the caller's stack.
//! - After a call, a worker spins (with the CPU's pause hint) for the spin budget, then parks.
//!   The budget is [`spin_budget`]: `RAPTOR_TEAM_SPIN_US` microseconds (default
//!   [`DEFAULT_SPIN_US`]), or [`set_spin_budget`]. A zero budget parks at once (rayon-like
//!   wake-ups, no idle spinning).
//! - One team per process, used by one call at a time: a call made while the team is busy
//!   (from another thread, or from inside a member) gets scoped threads started for it
//!   instead of waiting (the same team size, at the cost of starting them). Kernels whose
//!   results must not depend on which threads run what split their work into a fixed number
//!   of parts and use [`for_each_part`].
//! - A panic in any member is re-raised in the caller after every member has finished; the
//!   team stays usable.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! let hits: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
//! // Eight parts of work over a team of two: each part runs exactly once.
//! raptor_plan::team::for_each_part(2, 8, |p| {
//!     hits[p].fetch_add(1, Ordering::Relaxed);
//! });
//! assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
//! ```

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Environment variable: `off` (or `0`) makes [`enabled`] false, so kernels that can use the
/// team fall back to their work-stealing pool (for comparisons on one machine).
pub const TEAM_ENV: &str = "RAPTOR_TEAM";

/// Should kernels use the team? True unless `RAPTOR_TEAM` is `off` or `0` (read once) or
/// [`set_enabled`] said otherwise.
pub fn enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on = !matches!(
                std::env::var(TEAM_ENV).as_deref().map(str::trim),
                Ok("off" | "0")
            );
            ENABLED.store(if on { 1 } else { 2 }, Ordering::Relaxed);
            on
        }
    }
}

/// Turn the team on or off for kernels (overrides `RAPTOR_TEAM`).
pub fn set_enabled(on: bool) {
    ENABLED.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// 0 = not read yet, 1 = on, 2 = off.
static ENABLED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Environment variable: how long (µs) an idle worker spins before it parks.
pub const SPIN_ENV: &str = "RAPTOR_TEAM_SPIN_US";

/// Default spin budget (µs) of an idle worker: long enough that calls made back to back (a
/// kernel in a loop, a training step's successive releases) find the workers awake, short
/// enough that an idle process gives its cores back within a millisecond.
pub const DEFAULT_SPIN_US: u64 = 500;

/// Checks made with the CPU's pause hint before a waiting thread starts yielding its core
/// between checks (about 5–60 µs of pausing, depending on the CPU's pause latency): short
/// waits — a member a few µs behind — cost no system call, and a member that waits for a
/// thread the OS has descheduled gives its core away soon.
pub const PURE_SPINS: u32 = 1 << 10;

/// The spin budget in µs; `u64::MAX` = not set yet (read `RAPTOR_TEAM_SPIN_US` on first use).
static SPIN_US: AtomicU64 = AtomicU64::new(u64::MAX);

/// How long an idle worker spins before it parks.
pub fn spin_budget() -> Duration {
    let mut us = SPIN_US.load(Ordering::Relaxed);
    if us == u64::MAX {
        us = std::env::var(SPIN_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_SPIN_US)
            .min(u64::MAX - 1);
        SPIN_US.store(us, Ordering::Relaxed);
    }
    Duration::from_micros(us)
}

/// Set the spin budget for the rest of the process (overrides `RAPTOR_TEAM_SPIN_US`). Workers
/// that are already spinning finish their current wait with the old budget.
pub fn set_spin_budget(budget: Duration) {
    let us = u64::try_from(budget.as_micros()).unwrap_or(u64::MAX - 1);
    SPIN_US.store(us.min(u64::MAX - 1), Ordering::Relaxed);
}

/// The job of one call, its lifetime erased (see [`run`] for why that is sound).
type Job<'a> = dyn Fn(usize, usize) + Sync + 'a;

#[derive(Clone, Copy)]
struct JobPtr(*const Job<'static>);

// SAFETY: the pointee is `Sync` (shared calls from several threads are allowed), and the
// pointer is only dereferenced by members of the call that published it, while that call is
// blocked in `run` waiting for them (so the pointee is alive).
unsafe impl Send for JobPtr {}

/// What the current call asks of the workers.
struct Slot {
    /// The call's number (the same as `Team::generation` once published).
    generation: u64,
    /// The job; `None` between calls.
    job: Option<JobPtr>,
    /// Team size of the call (the caller included).
    size: usize,
}

/// A worker as the caller sees it.
struct WorkerHandle {
    thread: Thread,
    sleeping: Arc<AtomicBool>,
}

struct Team {
    /// Held by the one call that uses the team.
    busy: AtomicBool,
    /// Number of the latest published call.
    generation: AtomicU64,
    slot: Mutex<Slot>,
    /// Workers of the current call that have not finished it.
    remaining: AtomicUsize,
    /// The first panic of a worker in the current call.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Started workers (member w + 1 is `workers[w]`); only the busy holder changes it.
    workers: Mutex<Vec<WorkerHandle>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a panic happened while it was held; the data (plain values)
    // is still consistent.
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn team() -> &'static Team {
    static TEAM: OnceLock<Team> = OnceLock::new();
    TEAM.get_or_init(|| Team {
        busy: AtomicBool::new(false),
        generation: AtomicU64::new(0),
        slot: Mutex::new(Slot {
            generation: 0,
            job: None,
            size: 1,
        }),
        remaining: AtomicUsize::new(0),
        panic: Mutex::new(None),
        workers: Mutex::new(Vec::new()),
    })
}

/// Releases `busy` on every exit path of [`run`].
struct Busy(&'static Team);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// Number of workers started so far (0 before the first parallel call).
pub fn workers() -> usize {
    lock(&team().workers).len()
}

/// Is the calling thread one of the team's workers?
pub fn on_worker() -> bool {
    ON_WORKER.with(|c| c.get())
}

thread_local! {
    static ON_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Team {
    /// Start workers until there are `want` (or a start fails); returns how many there are.
    fn ensure_workers(&'static self, want: usize) -> usize {
        let mut ws = lock(&self.workers);
        while ws.len() < want {
            let member = ws.len() + 1;
            let sleeping = Arc::new(AtomicBool::new(false));
            let s = sleeping.clone();
            let seen = self.generation.load(Ordering::SeqCst);
            let started = std::thread::Builder::new()
                .name(format!("raptor-team-{member}"))
                .spawn(move || self.worker(member, seen, &s));
            match started {
                Ok(h) => ws.push(WorkerHandle {
                    thread: h.thread().clone(),
                    sleeping,
                }),
                Err(_) => break,
            }
        }
        ws.len().min(want)
    }

    /// A worker's life: wait for a call, run its part if it is a member, repeat.
    fn worker(&'static self, member: usize, mut seen: u64, sleeping: &AtomicBool) {
        ON_WORKER.with(|c| c.set(true));
        loop {
            self.wait_for_call(seen, sleeping);
            let (generation, job, size) = {
                let s = lock(&self.slot);
                (s.generation, s.job, s.size)
            };
            seen = generation;
            if member < size
                && let Some(job) = job
            {
                // SAFETY: `job` was published by the call `generation`, which counts this
                // member in `remaining` and does not return (so the closure stays alive) until
                // the decrement below.
                let r = catch_unwind(AssertUnwindSafe(|| unsafe { (*job.0)(member, size) }));
                if let Err(p) = r {
                    let mut first = lock(&self.panic);
                    if first.is_none() {
                        *first = Some(p);
                    }
                }
                self.remaining.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Wait until a call after `seen` is published: spin with the pause hint for the first
    /// [`PURE_SPINS`] checks, then yield the core between checks (so that other runnable
    /// threads — a rayon pool, libtorch's OpenMP threads — are not held off by an idle
    /// worker), and park once the spin budget is spent.
    fn wait_for_call(&self, seen: u64, sleeping: &AtomicBool) {
        let mut start = Instant::now();
        let mut budget = spin_budget();
        let mut i = 0u32;
        loop {
            if self.generation.load(Ordering::Acquire) != seen {
                return;
            }
            if i < PURE_SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            i = i.saturating_add(1);
            if i.is_multiple_of(64) && start.elapsed() >= budget {
                // Announce the sleep, then re-check: a caller that publishes after our check
                // sees the flag and unparks us (an unpark before the park makes it return).
                sleeping.store(true, Ordering::SeqCst);
                if self.generation.load(Ordering::SeqCst) == seen {
                    std::thread::park();
                }
                sleeping.store(false, Ordering::SeqCst);
                start = Instant::now();
                budget = spin_budget();
                i = 0;
            }
        }
    }
}

/// Call `f(member, size)` for every member of a team of `size` ≤ `threads` threads (the caller
/// is member 0) and return when all have returned. `size` is `threads` unless a worker thread
/// could not be started (then fewer). When the persistent team is busy with another call (from
/// another thread, or from inside a member), this call gets a team of scoped threads started
/// for it instead (slower to start, same size). Members run at the same time, so `f` may
/// synchronize them (a barrier over `size` members). A panic in any member is re-raised here
/// after all have finished.
pub fn run<F>(threads: usize, f: F)
where
    F: Fn(usize, usize) + Sync,
{
    if threads <= 1 {
        f(0, 1);
        return;
    }
    let t = team();
    if t.busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        run_scoped(threads, &f);
        return;
    }
    let busy = Busy(t);
    let size = 1 + t.ensure_workers(threads - 1);
    if size == 1 {
        f(0, 1);
        return;
    }
    let job: &Job<'_> = &f;
    // SAFETY: only the lifetime is erased. The pointer is dereferenced by the workers of this
    // call alone, and this function does not return — not even by unwinding: the caller's
    // own part runs under `catch_unwind` — before `remaining` is back to 0, i.e. before every
    // one of them has finished with it; it is cleared from the slot before return.
    let ptr: JobPtr =
        JobPtr(unsafe { std::mem::transmute::<&Job<'_>, &'static Job<'static>>(job) });
    let generation = {
        let mut s = lock(&t.slot);
        s.generation += 1;
        s.job = Some(ptr);
        s.size = size;
        s.generation
    };
    t.remaining.store(size - 1, Ordering::SeqCst);
    t.generation.store(generation, Ordering::SeqCst);
    {
        let ws = lock(&t.workers);
        for w in ws.iter().take(size - 1) {
            if w.sleeping.load(Ordering::SeqCst) {
                w.thread.unpark();
            }
        }
    }
    let mine = catch_unwind(AssertUnwindSafe(|| f(0, size)));
    let mut i = 0u32;
    while t.remaining.load(Ordering::Acquire) != 0 {
        if i < PURE_SPINS {
            std::hint::spin_loop();
            i += 1;
        } else {
            std::thread::yield_now();
        }
    }
    lock(&t.slot).job = None;
    let theirs = lock(&t.panic).take();
    drop(busy);
    if let Err(p) = mine {
        resume_unwind(p);
    }
    if let Some(p) = theirs {
        resume_unwind(p);
    }
}

/// The team of a call that found the persistent team busy: `threads − 1` scoped threads
/// started for this call (what a call costs without the persistent team), so that the team
/// size — and any result that depends on it — is the same as on the persistent team.
fn run_scoped<F>(threads: usize, f: &F)
where
    F: Fn(usize, usize) + Sync,
{
    let size = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let mut started = 1;
        for member in 1..threads {
            let size = &size;
            let spawned = std::thread::Builder::new().spawn_scoped(s, move || {
                // Wait until the caller knows how many threads started.
                let mut n = size.load(Ordering::Acquire);
                while n == 0 {
                    std::hint::spin_loop();
                    n = size.load(Ordering::Acquire);
                }
                if member < n {
                    f(member, n);
                }
            });
            if spawned.is_err() {
                break;
            }
            started += 1;
        }
        size.store(started, Ordering::Release);
        f(0, started);
    });
}

/// Run `f(part)` for every `part` in `0..parts` on a team of at most `threads` (see [`run`]):
/// member m of a team of `size` takes parts m, m + size, m + 2·size, …, so the parts and what
/// each computes do not depend on the team's size — only which thread runs them.
pub fn for_each_part<F>(threads: usize, parts: usize, f: F)
where
    F: Fn(usize) + Sync,
{
    if parts == 0 {
        return;
    }
    run(threads.min(parts), |member, size| {
        let mut p = member;
        while p < parts {
            f(p);
            p += size;
        }
    });
}

/// [`for_each_part`] collecting `f(part)` in part order.
pub fn map_parts<T, F>(threads: usize, parts: usize, f: F) -> Vec<T>
where
    T: Send,
    F: Fn(usize) -> T + Sync,
{
    let slots: Vec<Mutex<Option<T>>> = (0..parts).map(|_| Mutex::new(None)).collect();
    for_each_part(threads, parts, |p| {
        let v = f(p);
        *lock(&slots[p]) = Some(v);
    });
    slots
        .into_iter()
        .filter_map(|m| match m.into_inner() {
            Ok(v) => v,
            Err(p) => p.into_inner(),
        })
        .collect()
}

/// [`map_parts`] over owned items (e.g. disjoint `&mut` slices): `f(i, items[i])` for every
/// item, results in item order.
pub fn map_items<I, T, F>(threads: usize, items: Vec<I>, f: F) -> Vec<T>
where
    I: Send,
    T: Send,
    F: Fn(usize, I) -> T + Sync,
{
    let slots: Vec<Mutex<Option<I>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
    map_parts(threads, slots.len(), |p| {
        let item = lock(&slots[p]).take();
        item.map(|it| f(p, it))
    })
    .into_iter()
    .flatten()
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// The tests share the process-wide team: each runs its calls under this lock so that the
    /// "busy" fallback is only seen where a test asks for it.
    fn serial() -> MutexGuard<'static, ()> {
        static L: Mutex<()> = Mutex::new(());
        lock(&L)
    }

    #[test]
    fn every_member_runs_once_with_the_team_size() {
        let _g = serial();
        for threads in 1..=4 {
            for _ in 0..200 {
                let seen: Vec<AtomicUsize> = (0..threads).map(|_| AtomicUsize::new(0)).collect();
                let sizes = Mutex::new(Vec::new());
                run(threads, |m, size| {
                    seen[m].fetch_add(1, Ordering::Relaxed);
                    lock(&sizes).push(size);
                });
                let sizes = lock(&sizes).clone();
                assert_eq!(sizes.len(), threads, "one call per member");
                assert!(sizes.iter().all(|&s| s == threads), "{sizes:?}");
                assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
            }
        }
        assert!(workers() >= 3);
    }

    #[test]
    fn members_run_at_the_same_time() {
        // A barrier over the members would deadlock if they ran one after another.
        let _g = serial();
        let arrived = AtomicUsize::new(0);
        run(3, |_, size| {
            arrived.fetch_add(1, Ordering::AcqRel);
            let t0 = Instant::now();
            while arrived.load(Ordering::Acquire) < size {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "members not concurrent"
                );
                std::hint::spin_loop();
            }
        });
        assert_eq!(arrived.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn parked_workers_wake_up_and_spinning_ones_do_not_park() {
        let _g = serial();
        // A zero budget parks at once: every call after a pause must unpark its workers.
        set_spin_budget(Duration::ZERO);
        for k in 0..50 {
            std::thread::sleep(Duration::from_micros(200));
            let n = AtomicUsize::new(0);
            run(3, |_, _| {
                n.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(n.load(Ordering::Relaxed), 3, "call {k}");
        }
        set_spin_budget(Duration::from_micros(DEFAULT_SPIN_US));
        assert_eq!(spin_budget(), Duration::from_micros(DEFAULT_SPIN_US));
    }

    #[test]
    fn a_busy_team_runs_the_call_alone_and_nested_calls_do_not_deadlock() {
        let _g = serial();
        let inner_sizes = Mutex::new(Vec::new());
        run(2, |m, _| {
            // Nested: the team is busy with the outer call, so scoped threads run these.
            run(2, |im, isize| lock(&inner_sizes).push((m, im, isize)));
            assert_eq!(on_worker(), m > 0);
        });
        let mut v = lock(&inner_sizes).clone();
        v.sort_unstable();
        assert_eq!(v, vec![(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]);
        // Callers on several threads at once: every call completes, each part once.
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        let got = map_parts(2, 5, |p| p * p);
                        assert_eq!(got, vec![0, 1, 4, 9, 16]);
                        // Whether it got the persistent team or scoped threads, a call gets
                        // the size it asked for.
                        let sizes = Mutex::new(Vec::new());
                        run(3, |_, size| lock(&sizes).push(size));
                        assert_eq!(*lock(&sizes), vec![3, 3, 3]);
                    }
                });
            }
        });
    }

    #[test]
    fn panics_reach_the_caller_after_every_member_finished() {
        let _g = serial();
        let finished = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            run(3, |m, _| {
                if m == 0 {
                    panic!("member 0 fails");
                }
                std::thread::sleep(Duration::from_millis(20));
                finished.fetch_add(1, Ordering::SeqCst);
            })
        }));
        assert!(r.is_err());
        assert_eq!(
            finished.load(Ordering::SeqCst),
            2,
            "the workers were waited for"
        );
        let r = catch_unwind(AssertUnwindSafe(|| {
            run(2, |m, _| {
                if m == 1 {
                    panic!("a worker fails");
                }
            })
        }));
        let msg = r
            .err()
            .and_then(|p| p.downcast_ref::<&str>().map(|s| s.to_string()));
        assert_eq!(msg.as_deref(), Some("a worker fails"));
        // Still usable.
        assert_eq!(map_parts(3, 4, |p| p + 1), vec![1, 2, 3, 4]);
    }

    #[test]
    fn parts_do_not_depend_on_the_team_size() {
        let _g = serial();
        for threads in 1..=4 {
            for parts in 0..=9 {
                let got = map_parts(threads, parts, |p| 3 * p + 1);
                assert_eq!(got, (0..parts).map(|p| 3 * p + 1).collect::<Vec<_>>());
            }
        }
    }
}
