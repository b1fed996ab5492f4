//! Schedule planning for the slice kernels ([`clip_rows`](crate::clip_rows),
//! [`clip_blocks`](crate::clip_blocks)).
//!
//! Each call belongs to a *shape class*: records B and entries per record P (each rounded to the
//! nearest power of two), number of blocks and groups, and the rayon pool's thread count
//! ([`shape_class`]). The first call of a class times the candidate [`Schedule`]s on its own
//! data — the cache-model estimate, the best-fitting row and column pipelines, and the two-pass
//! norms-then-`Gᵀf` schedule that libtorch uses ([`candidates`]) — in interleaved rounds within
//! [`raptor_plan::DEFAULT_BUDGET`] runs, returns the fastest one's result and remembers it for
//! the process; later calls of the class run it with no timing. Cache sizes come from the
//! machine at run time ([`raptor_plan::machine()`]).
//!
//! - Wisdom: with `RAPTOR_WISDOM=path` the choices are loaded from and saved to that file;
//!   [`load_wisdom`] / [`save_wisdom`] do it explicitly. A missing file means "plan again"; a
//!   corrupt one (or one from another machine) is reported by `load_wisdom` as an error and,
//!   through the environment variable, ignored with a warning.
//! - `RAPTOR_PLAN=estimate` (or [`set_mode`]) skips timing and runs the cache-model estimate.
//! - [`with_schedule`] forces a schedule on the calling thread (tests, experiments).
//!
//! **Results and privacy.** Every schedule computes the same norms and factors up to f64
//! rounding (relative ≲ 1e-15) and the same sums up to f32 summation order: tested against an
//! f64 reference at a relative error below 1e-6 of Σ_i |clipped terms| for every schedule,
//! and each record's factor keeps it within its bound in all of them. The choice depends on
//! timings (which may depend on the data, e.g. through non-finite records), so it can change
//! an output only within that rounding tolerance — never a record's clipping decision beyond
//! rounding, never the sensitivity. Calls with the same schedule are deterministic; the
//! column pipeline's and two-pass schedule's results do not depend on the thread count.

pub use crate::kernel::{Schedule, with_schedule};
pub use raptor_plan::{PlanMode, load_wisdom, save_wisdom, set_mode};

use crate::kernel::{Budgets, Seg, known_schedule, shape_key};

fn segs_of(widths: &[usize]) -> Vec<Seg<'static>> {
    widths
        .iter()
        .map(|&width| Seg {
            data: &[],
            width,
            group: 0,
        })
        .collect()
}

/// The shape class (the wisdom key) of a call on `batch` records with blocks of `widths` in
/// `n_groups` groups, on the current rayon pool.
///
/// ```
/// let k = raptor_clip::plan::shape_class(256, &[1_000_000], 1);
/// assert!(k.starts_with("clip b2^8 p2^20 s1 g1 t"));
/// ```
pub fn shape_class(batch: usize, widths: &[usize], n_groups: usize) -> String {
    shape_key(
        &segs_of(widths),
        batch,
        n_groups,
        rayon::current_num_threads().max(1),
    )
}

/// The schedule such a call would run now without timing: the one forced on this thread by
/// [`with_schedule`], else the one remembered for its shape class, else `None` (the next call
/// plans).
pub fn planned(batch: usize, widths: &[usize], n_groups: usize) -> Option<Schedule> {
    known_schedule(&segs_of(widths), batch, n_groups)
}

/// The cache-model estimate for `batch` records of `rec_entries` entries on `threads` threads
/// (what `RAPTOR_PLAN=estimate` runs).
pub fn estimate(batch: usize, rec_entries: usize, threads: usize) -> Schedule {
    crate::kernel::schedule(rec_entries, batch, threads.max(1), &Budgets::here())
}

/// The schedules the planner times for such a call, the estimate first.
pub fn candidates(batch: usize, rec_entries: usize, threads: usize) -> Vec<Schedule> {
    crate::kernel::candidates(rec_entries, batch, threads.max(1), &Budgets::here())
}
