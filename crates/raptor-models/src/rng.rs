//! libtorch's global random generator, seeded and drawn from under one process-wide lock.
//!
//! Model constructors (`Init::Randn`, `Init::Uniform`) and LoRA initialisation draw from
//! libtorch's one global generator. `tch::manual_seed` followed by a construction is only
//! reproducible if no other thread seeds or draws in between: two training sessions built on
//! two threads of one process (a test harness, a sweep driver) would otherwise interleave
//! their draws and give "identical" seeds different models. Every seeded section of raptor
//! (building a model, initialising the adapters of a run, reloading a run) holds this lock;
//! code of yours that seeds and draws on several threads should hold it too.
//!
//! The lock is reentrant on one thread: a seeded section may call another (the inner seed
//! then applies from there on, as `tch::manual_seed` would).
//!
//! ```
//! use raptor_models::rng;
//! let a = rng::seeded(7, || tch::Tensor::randn([3], (tch::Kind::Float, tch::Device::Cpu)));
//! let b = rng::seeded(7, || tch::Tensor::randn([3], (tch::Kind::Float, tch::Device::Cpu)));
//! assert!(a.equal(&b));
//! ```

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard, PoisonError};

static GLOBAL: Mutex<()> = Mutex::new(());

thread_local! {
    /// How many [`GlobalRng`] guards this thread holds (the mutex is held while > 0).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Exclusive use of libtorch's global generator until dropped (see the module docs).
///
/// Not `Send`: it is released on the thread that took it.
#[must_use = "the generator is only exclusive while the guard lives"]
pub struct GlobalRng {
    /// The outermost guard of this thread holds the mutex; nested ones hold nothing.
    _outer: Option<MutexGuard<'static, ()>>,
}

impl GlobalRng {
    /// Seeds libtorch's global generator (`tch::manual_seed`) while the lock is held.
    pub fn seed(&self, seed: i64) {
        tch::manual_seed(seed);
    }
}

impl std::fmt::Debug for GlobalRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalRng")
            .field("outer", &self._outer.is_some())
            .finish()
    }
}

impl Drop for GlobalRng {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Takes exclusive use of libtorch's global generator: waits for another thread's section to
/// end; immediate when this thread already holds it. A section that panicked does not poison
/// it (the generator's state is reseeded by whoever needs it reproducible).
pub fn global_rng() -> GlobalRng {
    let outer = DEPTH.with(|d| d.get()) == 0;
    let guard = outer.then(|| GLOBAL.lock().unwrap_or_else(PoisonError::into_inner));
    DEPTH.with(|d| d.set(d.get() + 1));
    GlobalRng { _outer: guard }
}

/// Runs `f` with libtorch's global generator seeded by `seed` and no other thread seeding or
/// drawing from it until `f` returns.
pub fn seeded<T>(seed: i64, f: impl FnOnce() -> T) -> T {
    let rng = global_rng();
    rng.seed(seed);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use tch::{Device, Kind, Tensor};

    fn draw() -> Tensor {
        Tensor::randn([4], (Kind::Float, Device::Cpu))
    }

    /// Set in the process that runs the interleaving check alone.
    const ALONE: &str = "RAPTOR_RNG_CHECK_ALONE";

    #[test]
    fn a_seeded_section_is_not_interleaved_with_another_thread() {
        // Other tests of this binary may draw from the global generator without the lock while
        // this one runs (tests are free to), which would look like an interleaving: the check
        // runs in a process of its own, where only its two threads draw.
        if std::env::var_os(ALONE).is_some() {
            interleaving_check();
            return;
        }
        let name = "rng::tests::a_seeded_section_is_not_interleaved_with_another_thread";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Seeded sections on this thread against another thread seeding and drawing in a loop.
    fn interleaving_check() {
        // Reference: seed, draw, draw, with nobody else around.
        let (x0, y0) = seeded(1, || (draw(), draw()));
        let stop = AtomicBool::new(false);
        /// Stops the other thread however this one leaves the scope (a failed assertion
        /// included: the scope would otherwise wait for it forever).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let mut interleaved = 0;
        std::thread::scope(|s| {
            // Another thread reseeding and drawing as fast as it can.
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let _ = seeded(2, draw);
                }
            });
            let _stop = Stop(&stop);
            for _ in 0..5 {
                let (x, y) = seeded(1, || {
                    let x = draw();
                    // Room for the other thread's seed to land between the two draws.
                    std::thread::sleep(Duration::from_millis(10));
                    (x, draw())
                });
                interleaved += usize::from(!(x.equal(&x0) && y.equal(&y0)));
            }
        });
        assert_eq!(
            interleaved, 0,
            "draws interleaved in {interleaved} of 5 sections"
        );
    }

    #[test]
    fn sections_nest_on_one_thread_and_release_the_lock() {
        let inner = seeded(3, || {
            let _outer_draw = draw();
            seeded(4, draw)
        });
        assert!(inner.equal(&seeded(4, draw)));
        assert_eq!(DEPTH.with(|d| d.get()), 0);
        // Released: another thread can take it.
        let other = std::thread::spawn(|| seeded(5, draw)).join().unwrap();
        assert!(other.equal(&seeded(5, draw)));
    }
}
