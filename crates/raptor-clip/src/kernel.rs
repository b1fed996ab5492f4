//! The fused single-pass clip-and-sum kernel on slices.
//!
//! Layout: a record (example) i consists of one row of each block (block k is a row-major
//! `batch × width_k` matrix). Each block belongs to one group; the squared norm of record i in
//! group g is the sum of the squared norms of its rows in the group's blocks.
//!
//! Schedule: software-pipelined. A sweep over the columns of a step of R records does two
//! things at once: it accumulates factor × row for the R records of step k (their rows are in
//! cache: the previous sweep streamed them in) and it takes the squared norms of the R records
//! of step k + 1 (streamed from memory now, with software prefetch). Memory streaming thus
//! overlaps the in-cache work, every gradient byte is read from memory once, and the partial
//! sums are read and written once per R records. Norms are accumulated in f64 (each f32 entry
//! widened, so its square is exact), sums in f32.
//!
//! - Row pipeline ([`pipeline`]): the records are split into one contiguous range per rayon
//!   thread with private partial sums (reduced in parallel over column ranges at the end);
//!   R ∈ {8, 4, 2, 1} records per step.
//! - Column pipeline ([`column_pipeline`]: huge records or few of them): the whole batch in
//!   steps of R ∈ {4, 2, 1}, each sweep split over column chunks, each pool thread always on
//!   the same contiguous range of chunks (so a row's lines never move between cores), walked
//!   forward and backward in turn so that it starts on the chunks it touched last.
//! - Two-pass ([`two_pass`], libtorch's schedule): all norms, then `Gᵀ f` over column chunks.
//!
//! Which one runs, and R, is planned per shape class (see [`fused_clip_sum`] and the `plan`
//! module): the candidates admitted by cache budgets derived from the machine's L2 and L3 at
//! run time ([`Budgets`]) are timed on the first call and the fastest kept.
//!
//! The inner sweep has AVX-512F and AVX2 + FMA versions (intrinsics, the widest the CPU has,
//! chosen at run time; `RAPTOR_CLIP_SIMD=avx2|portable` caps it) and a portable one.

use rayon::prelude::*;

use crate::ClipError;

/// How the factor of a record is derived from its group norms.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BoundMode<'a> {
    /// Group g is clipped to `bounds[g]` on its own.
    PerGroup(&'a [f64]),
    /// One factor from the norm over all groups, bound C, applied to every group.
    Joint(f64),
}

/// One block of a record set: `data` is `batch × width`, row-major.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seg<'a> {
    pub data: &'a [f32],
    pub width: usize,
    pub group: usize,
}

/// Raw kernel result.
#[derive(Debug)]
pub(crate) struct Fused {
    /// Per block clipped sum.
    pub sums: Vec<Vec<f32>>,
    /// `[batch × n_groups]` norms of the weighted record restricted to each group.
    pub norms: Vec<f64>,
    /// `[batch]` norm of the weighted record over all groups.
    pub total_norms: Vec<f64>,
    /// `[batch × n_groups]` multiplier applied to the raw record's rows in each group.
    pub factors: Vec<f64>,
}

/// Whether the AVX2 + FMA code paths can run (checked once per call; std caches the CPUID).
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx2() -> bool {
    simd_cap() >= 1
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
}

/// Whether the AVX-512F sweep can run: the CPU has AVX-512F and `RAPTOR_CLIP_SIMD` does not
/// cap the kernels at `avx2` (or `portable`; read once per process; for comparisons on one
/// machine).
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx512() -> bool {
    simd_cap() >= 2 && std::arch::is_x86_feature_detected!("avx512f")
}

/// The widest instruction set the kernels may use: 2 = AVX-512, 1 = AVX2, 0 = portable, from
/// `RAPTOR_CLIP_SIMD` (`avx512`, the default; `avx2`; `portable`), read once.
#[cfg(target_arch = "x86_64")]
fn simd_cap() -> u8 {
    static CAP: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("RAPTOR_CLIP_SIMD").as_deref() {
        Ok("avx2") => 1,
        Ok("portable") => 0,
        _ => 2,
    })
}

/// Generate a dispatching function: the body is compiled twice, once for the baseline target
/// and once with AVX2 + FMA enabled (selected at run time), so that LLVM vectorizes it with
/// 256-bit registers where the CPU has them. No intrinsics, no unsafe memory access.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn imp($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            fn avx2($($arg: $ty),*) -> $ret { imp($($arg),*) }
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: the CPU supports AVX2 and FMA (checked just above).
                return unsafe { avx2($($arg),*) };
            }
            imp($($arg),*)
        }
    };
}

/// Squared L2 norm with f64 accumulation (each f32 entry widened, so its square is exact):
/// AVX-512F or AVX2 + FMA intrinsics where the CPU has them (four independent FMA chains, enough
/// to hide the FMA latency; LLVM's own vectorization of the portable loop keeps one or two), else
/// the portable loop with 8 lanes.
#[inline]
pub(crate) fn sq_norm(x: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU supports AVX-512F (checked just above).
        return unsafe { sq_norm_avx512(x) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { sq_norm_avx2(x) };
    }
    sq_norm_portable(x)
}

/// Portable [`sq_norm`]: 8 f64 lanes, summed pairwise.
fn sq_norm_portable(x: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            let v = f64::from(c[j]);
            acc[j] += v * v;
        }
    }
    let mut tail = 0f64;
    for &v in rem {
        let v = f64::from(v);
        tail += v * v;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// AVX-512F [`sq_norm`]: 32 entries per iteration widened to f64 eight at a time, squared by
/// FMA into four f64 vectors.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sq_norm_avx512(x: &[f32]) -> f64 {
    use std::arch::x86_64::*;
    let n = x.len();
    let full = n - n % 32;
    let p = x.as_ptr();
    let mut acc = [_mm512_setzero_pd(); 4];
    let mut k = 0;
    while k < full {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: k + 8·j + 8 ≤ full ≤ n.
            let v = _mm512_cvtps_pd(unsafe { _mm256_loadu_ps(p.add(k + 8 * j)) });
            *a = _mm512_fmadd_pd(v, v, *a);
        }
        k += 32;
    }
    let t = _mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3]));
    let mut lanes = [0f64; 8];
    // SAFETY: `lanes` holds 8 f64.
    unsafe { _mm512_storeu_pd(lanes.as_mut_ptr(), t) };
    let mut tail = 0f64;
    for &v in &x[full..] {
        let v = f64::from(v);
        tail += v * v;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
        + tail
}

/// AVX2 + FMA [`sq_norm`]: 16 entries per iteration widened to f64 four at a time, squared by
/// FMA into four f64 vectors.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sq_norm_avx2(x: &[f32]) -> f64 {
    use std::arch::x86_64::*;
    let n = x.len();
    let full = n - n % 16;
    let p = x.as_ptr();
    let mut acc = [_mm256_setzero_pd(); 4];
    let mut k = 0;
    while k < full {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: k + 4·j + 4 ≤ full ≤ n.
            let v = _mm256_cvtps_pd(unsafe { _mm_loadu_ps(p.add(k + 4 * j)) });
            *a = _mm256_fmadd_pd(v, v, *a);
        }
        k += 16;
    }
    let t = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
    let mut lanes = [0f64; 4];
    // SAFETY: `lanes` holds 4 f64.
    unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), t) };
    let mut tail = 0f64;
    for &v in &x[full..] {
        let v = f64::from(v);
        tail += v * v;
    }
    (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]) + tail
}

multiversion! {
    /// `y += a · x`.
    #[inline]
    pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) -> () {
        if a == 1.0 {
            for (yv, &xv) in y.iter_mut().zip(x) {
                *yv += xv;
            }
        } else {
            for (yv, &xv) in y.iter_mut().zip(x) {
                *yv += a * xv;
            }
        }
    }
}

multiversion! {
    /// `y += a0·x0 + a1·x1 + a2·x2 + a3·x3` (one pass over `y` for four rows).
    #[inline]
    pub(crate) fn axpy4(y: &mut [f32], a: [f32; 4], x0: &[f32], x1: &[f32], x2: &[f32], x3: &[f32]) -> () {
        let n = y.len();
        let (x0, x1, x2, x3) = (&x0[..n], &x1[..n], &x2[..n], &x3[..n]);
        for ((((yv, &v0), &v1), &v2), &v3) in y.iter_mut().zip(x0).zip(x1).zip(x2).zip(x3) {
            *yv += (a[0] * v0 + a[1] * v1) + (a[2] * v2 + a[3] * v3);
        }
    }
}

multiversion! {
    /// `y += Σ_r a[r] · x[r]` for eight rows (one pass over `y`), by fused multiply-adds.
    #[inline]
    pub(crate) fn axpy8(y: &mut [f32], a: [f32; 8], x: [&[f32]; 8]) -> () {
        let n = y.len();
        let x: [&[f32]; 8] = std::array::from_fn(|r| &x[r][..n]);
        for j in 0..n {
            let mut v = y[j];
            for r in 0..8 {
                v = a[r].mul_add(x[r][j], v);
            }
            y[j] = v;
        }
    }
}

multiversion! {
    /// One record's gradient of a linear weight from its rows: `out = Σ_t g_t a_tᵀ`, `a` the
    /// record's `rows × d_in` input rows and `g` its `rows × d_out` output-gradient rows (both
    /// row-major), `out` `d_out × d_in` row-major. `tmp` (`d_in · d_out` entries) is scratch for
    /// the narrow-input case. The long dimension is the inner loop (vectorized), four rows at a
    /// time per pass over the accumulator.
    pub(crate) fn outer_sum_rows(a: &[f32], d_in: usize, g: &[f32], d_out: usize, out: &mut [f32], tmp: &mut [f32]) -> () {
        // Accumulate Σ_t x_t[j] · y_t (y_t of length w, x_t of length h) into acc (h × w).
        #[inline(always)]
        fn acc_rows(x: &[f32], h: usize, y: &[f32], w: usize, acc: &mut [f32]) {
            acc.fill(0.0);
            if h == 0 || w == 0 {
                return;
            }
            let mut xs = x.chunks_exact(4 * h);
            let mut ys = y.chunks_exact(4 * w);
            for (xb, yb) in (&mut xs).zip(&mut ys) {
                let (y0, rest) = yb.split_at(w);
                let (y1, rest) = rest.split_at(w);
                let (y2, y3) = rest.split_at(w);
                for (j, row) in acc.chunks_exact_mut(w).enumerate() {
                    let c = [xb[j], xb[h + j], xb[2 * h + j], xb[3 * h + j]];
                    for ((((v, &v0), &v1), &v2), &v3) in row.iter_mut().zip(y0).zip(y1).zip(y2).zip(y3) {
                        *v += (c[0] * v0 + c[1] * v1) + (c[2] * v2 + c[3] * v3);
                    }
                }
            }
            for (xr, yr) in xs.remainder().chunks_exact(h).zip(ys.remainder().chunks_exact(w)) {
                for (row, &c) in acc.chunks_exact_mut(w).zip(xr) {
                    for (v, &yv) in row.iter_mut().zip(yr) {
                        *v += c * yv;
                    }
                }
            }
        }
        if d_in >= d_out {
            // out[o, :] += g_t[o] · a_t: rows of length d_in.
            acc_rows(g, d_out, a, d_in, out);
        } else {
            // tmp[i, :] += a_t[i] · g_t: rows of length d_out, then transposed into out.
            acc_rows(a, d_in, g, d_out, tmp);
            // Written row by row (sequential stores; the d_in rows of tmp are read in step).
            for (o, row) in out.chunks_exact_mut(d_in).enumerate() {
                for (i, v) in row.iter_mut().enumerate() {
                    *v = tmp[i * d_out + o];
                }
            }
        }
    }
}

multiversion! {
    /// One record's squared gradient norm of a linear weight by the ghost identity over its
    /// own rows, `‖Σ_t g_t a_tᵀ‖² = Σ_{t,t'} (a_t·a_t')(g_t·g_t')` (`a`: `rows × d_in`, `g`:
    /// `rows × d_out`, row-major): each pair once (the off-diagonal ones doubled), the dot
    /// products in f32 with eight lanes, their products summed in f64. A negative result of
    /// rounding is 0; NaN stays NaN.
    pub(crate) fn ghost_sq_rows(a: &[f32], d_in: usize, g: &[f32], d_out: usize) -> f64 {
        #[inline(always)]
        fn dot(x: &[f32], y: &[f32]) -> f32 {
            let mut acc = [0f32; 8];
            let xs = x.chunks_exact(8);
            let ys = y.chunks_exact(8);
            let (xr, yr) = (xs.remainder(), ys.remainder());
            for (xc, yc) in xs.zip(ys) {
                for k in 0..8 {
                    acc[k] += xc[k] * yc[k];
                }
            }
            let mut tail = 0f32;
            for (&u, &v) in xr.iter().zip(yr) {
                tail += u * v;
            }
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
        }
        if d_in == 0 || d_out == 0 {
            return 0.0;
        }
        // Rows as (a_t, g_t) pairs; no allocation (this runs per record and parameter).
        let rows = || a.chunks_exact(d_in).zip(g.chunks_exact(d_out));
        let mut diag = 0f64;
        let mut off = 0f64;
        for (t, (at, gt)) in rows().enumerate() {
            diag += f64::from(dot(at, at)) * f64::from(dot(gt, gt));
            for (au, gu) in rows().take(t) {
                off += f64::from(dot(at, au)) * f64::from(dot(gt, gu));
            }
        }
        let sq = diag + 2.0 * off;
        if sq < 0.0 { 0.0 } else { sq }
    }
}

multiversion! {
    /// `y += x`.
    #[inline]
    fn add_into(y: &mut [f32], x: &[f32]) -> () {
        for (yv, &xv) in y.iter_mut().zip(x) {
            *yv += xv;
        }
    }
}

multiversion! {
    /// Sum of a slice with 16 f32 lanes (the inner loop of the STREAM-like read).
    #[inline]
    fn lane_sum(c: &[f32]) -> f32 {
        let mut acc = [0f32; 16];
        let chunks = c.chunks_exact(16);
        let rem = chunks.remainder();
        for x in chunks {
            for j in 0..16 {
                acc[j] += x[j];
            }
        }
        acc.iter().sum::<f32>() + rem.iter().sum::<f32>()
    }
}

/// The clip factor of a (weighted) norm: min(1, C / n); 1 for n = 0 (C / 0 = +∞), 0 for an
/// infinite n. (`f64::min` returns 1 where C / n is NaN, i.e. C = n = 0 or C = n = ∞; a
/// non-finite record never gets here: [`factors_for_record`] gives it factor 0 first.)
#[inline]
pub(crate) fn clip_factor(norm: f64, bound: f64) -> f64 {
    (bound / norm).min(1.0)
}

/// Per record: from raw per-group squared norms, fill norms / total / factors. `sq` holds the
/// raw (unweighted) squared norms per group.
///
/// A record with a non-finite squared norm in any group (a NaN or infinite entry) gets factor 0
/// in every group and a non-finite total (its norms are reported as computed): it contributes
/// nothing, which is within any bound, and the step goes on. Aborting the step instead would be
/// an event that depends on one record's private data.
fn factors_for_record(
    sq: &[f64],
    weight: f64,
    mode: BoundMode<'_>,
    norms_out: &mut [f64],
    factors_out: &mut [f64],
) -> Result<f64, ClipError> {
    let total_sq: f64 = sq.iter().sum();
    if !total_sq.is_finite() {
        for g in 0..sq.len() {
            norms_out[g] = weight * sq[g].sqrt();
            factors_out[g] = 0.0;
        }
        // NaN when the squared norms hold NaN, else +∞: never finite.
        return Ok(if total_sq.is_nan() {
            f64::NAN
        } else {
            f64::INFINITY
        });
    }
    let total = weight * total_sq.sqrt();
    match mode {
        BoundMode::PerGroup(bounds) => {
            for g in 0..sq.len() {
                let n = weight * sq[g].sqrt();
                norms_out[g] = n;
                factors_out[g] = weight * clip_factor(n, bounds[g]);
            }
        }
        BoundMode::Joint(c) => {
            let f = weight * clip_factor(total, c);
            for g in 0..sq.len() {
                norms_out[g] = weight * sq[g].sqrt();
                factors_out[g] = f;
            }
        }
    }
    Ok(total)
}

/// Cache budgets of the schedules, derived at run time from the machine's caches
/// ([`raptor_plan::machine()`]): no size tuned for one machine is compiled in. The fractions
/// leave room for the other data a sweep touches (partial sums of other blocks, the stack,
/// the next records' prefetched lines); the timing planner then picks among the schedules
/// these budgets admit, so a budget that is off for a machine costs at most a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budgets {
    /// Working set of a row-pipeline step that stays in one core's L2 (3/4 of it).
    pub l2: usize,
    /// Row-pipeline working sets of all threads together in the L3 (1/4 of it).
    pub row_l3: usize,
    /// At most this much of the L3 for one thread's row pipeline (1/8 of it).
    pub row_l3_thread: usize,
    /// The column pipeline's shared working set (5/8 of the L3).
    pub col_l3: usize,
    /// Entries per column chunk of the column pipeline and of the two-pass GEMV (1/8 of L2
    /// in f32, a multiple of 1024 in 4 Ki..64 Ki entries).
    pub col_chunk: usize,
    /// Software-prefetch distance (bytes) of the sweeps: L1d / 32, so that the lines
    /// prefetched ahead on the up to 16 streams of a sweep (8 rows streamed in, 8 read for the
    /// last time; two lines each) take at most half of the L1d; a multiple of 128 bytes
    /// (two lines) in 256..4096 (1 KiB for a 32 KiB L1d, 1.5 KiB for 48 KiB).
    pub prefetch: usize,
}

impl Budgets {
    /// Budgets for caches of `l2` and `l3` bytes and an L1d of `l1d` bytes.
    pub(crate) fn new(l1d: usize, l2: usize, l3: usize) -> Self {
        let l3 = l3.max(l2);
        Budgets {
            prefetch: (l1d / 32 / 128 * 128).clamp(256, 4096),
            l2: l2 / 4 * 3,
            row_l3: l3 / 4,
            row_l3_thread: l3 / 8,
            col_l3: l3 / 8 * 5,
            col_chunk: (l2 / 32 / 1024 * 1024).clamp(4 << 10, 64 << 10),
        }
    }

    /// Budgets for the machine this process runs on (read once).
    pub(crate) fn here() -> Self {
        static B: std::sync::OnceLock<Budgets> = std::sync::OnceLock::new();
        *B.get_or_init(|| {
            let m = raptor_plan::machine();
            Budgets::new(m.l1d_bytes, m.l2_bytes, m.l3_bytes)
        })
    }
}

/// Which schedule runs, and how many records per pipeline step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// One record range per thread, software-pipelined with private partial sums, `r` records
    /// per step (`r` ∈ {1, 2, 4, 8}).
    Rows(usize),
    /// The whole batch software-pipelined, each sweep parallel over column chunks with a
    /// static owner per chunk, `r` records per step (`r` ∈ {1, 2, 4}).
    Columns(usize),
    /// libtorch's schedule: all squared norms first (parallel over records), then the sums as
    /// a column-blocked matrix–vector product `Gᵀ f` (parallel over column chunks). Every
    /// entry is read from memory twice.
    TwoPass,
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::Rows(r) => write!(f, "rows({r})"),
            Schedule::Columns(r) => write!(f, "columns({r})"),
            Schedule::TwoPass => write!(f, "two-pass"),
        }
    }
}

impl std::str::FromStr for Schedule {
    type Err = ClipError;

    /// Parse the [`Display`](std::fmt::Display) form: `rows(8)`, `columns(2)`, `two-pass`.
    fn from_str(s: &str) -> Result<Self, ClipError> {
        let bad = || ClipError::InvalidSchedule {
            value: s.to_string(),
        };
        if s == "two-pass" {
            return Ok(Schedule::TwoPass);
        }
        let (name, rest) = s.split_once('(').ok_or_else(bad)?;
        let r: usize = rest
            .strip_suffix(')')
            .and_then(|v| v.parse().ok())
            .ok_or_else(bad)?;
        match (name, r) {
            ("rows", 1 | 2 | 4 | 8) => Ok(Schedule::Rows(r)),
            ("columns", 1 | 2 | 4) => Ok(Schedule::Columns(r)),
            _ => Err(bad()),
        }
    }
}

/// The cache-model estimate for `batch` records of `rec_floats` entries on `threads` threads:
/// the per-thread row pipeline with the largest r ∈ {8, 4, 2} whose working set (2r + 1) ·
/// record bytes fits in L2, else in the thread's share of the L3 budget, with at least two
/// steps per thread; otherwise (huge records, or fewer than 2 records per thread) the column
/// pipeline with the largest r ∈ {4, 2, 1} whose working set fits in the L3 budget.
pub(crate) fn schedule(rec_floats: usize, batch: usize, threads: usize, b: &Budgets) -> Schedule {
    let bytes = rec_floats.saturating_mul(4);
    let fits = |r: usize, budget: usize| (2 * r + 1).saturating_mul(bytes) <= budget;
    if batch >= 2 * threads {
        let per = batch.div_ceil(threads);
        let l3_share = (b.row_l3 / threads).min(b.row_l3_thread);
        for budget in [b.l2, l3_share] {
            for r in [8usize, 4, 2] {
                if fits(r, budget) && 2 * r <= per {
                    return Schedule::Rows(r);
                }
            }
        }
    }
    for r in [4usize, 2] {
        if fits(r, b.col_l3) && 2 * r <= batch {
            return Schedule::Columns(r);
        }
    }
    Schedule::Columns(1)
}

/// The schedules worth timing for a shape, the estimate first (at most six): the estimate;
/// every row pipeline (r ∈ {8, 4, 2, 1}) and the best column pipeline whose working sets fit
/// the cache budgets (if they differ from it); and the two-pass schedule. The cache model
/// only prunes: which r is fastest among those that fit differs between machines (register
/// pressure, prefetch streams, 4 KiB aliasing), so they are all timed. Row pipelines need at
/// least two steps per thread; pipelines whose working set fits no cache are pruned, except
/// the column pipeline with r = 1 when nothing else fits.
pub(crate) fn candidates(
    rec_floats: usize,
    batch: usize,
    threads: usize,
    b: &Budgets,
) -> Vec<Schedule> {
    let est = schedule(rec_floats, batch, threads, b);
    let mut v = vec![est];
    let bytes = rec_floats.saturating_mul(4);
    let fits = |r: usize, budget: usize| (2 * r + 1).saturating_mul(bytes) <= budget;
    let per = batch.div_ceil(threads.max(1));
    let l3_share = (b.row_l3 / threads.max(1)).min(b.row_l3_thread).max(b.l2);
    if batch >= 2 * threads {
        for r in [8usize, 4, 2, 1] {
            let s = Schedule::Rows(r);
            if fits(r, l3_share) && 2 * r <= per && !v.contains(&s) {
                v.push(s);
            }
        }
    }
    let col = [4usize, 2]
        .into_iter()
        .find(|&r| fits(r, b.col_l3) && 2 * r <= batch)
        .map_or(Schedule::Columns(1), Schedule::Columns);
    if !v.contains(&col) {
        v.push(col);
    }
    v.push(Schedule::TwoPass);
    v
}

/// Read-only context of one thread's record range.
struct RangeCtx<'a, 'b> {
    segs: &'b [Seg<'a>],
    /// First record of the range.
    start: usize,
    ng: usize,
    mode: BoundMode<'b>,
    weights: Option<&'b [f64]>,
}

/// The per-record outputs of one thread's range (local indices).
struct Out<'a> {
    norms: &'a mut [f64],
    factors: &'a mut [f64],
    totals: &'a mut [f64],
}

impl RangeCtx<'_, '_> {
    /// Row of local record `li` in segment `s`.
    #[inline]
    fn row<'s>(&self, s: &Seg<'s>, li: usize) -> &'s [f32] {
        let i = self.start + li;
        &s.data[i * s.width..(i + 1) * s.width]
    }

    /// Norms and factors of local record `li` from its raw per-group squared norms.
    fn finish(&self, li: usize, sq: &[f64], out: &mut Out<'_>) -> Result<(), ClipError> {
        let ng = self.ng;
        let i = self.start + li;
        let w = self.weights.map_or(1.0, |w| w[i]);
        out.totals[li] = factors_for_record(
            sq,
            w,
            self.mode,
            &mut out.norms[li * ng..(li + 1) * ng],
            &mut out.factors[li * ng..(li + 1) * ng],
        )?;
        Ok(())
    }

    /// Norms of local records `lo..hi` on their own (pipeline fill, ragged last step).
    fn norms_plain(&self, lo: usize, hi: usize, out: &mut Out<'_>) -> Result<(), ClipError> {
        let mut sq = vec![0f64; self.ng];
        for li in lo..hi {
            sq.iter_mut().for_each(|v| *v = 0.0);
            for s in self.segs {
                sq[s.group] += sq_norm(self.row(s, li));
            }
            self.finish(li, &sq, out)?;
        }
        Ok(())
    }

    /// Accumulate local records `lo..hi` (factors known) into `part` on their own.
    fn accumulate_plain(&self, lo: usize, hi: usize, factors: &[f64], part: &mut [Vec<f32>]) {
        let ng = self.ng;
        for (s, p) in self.segs.iter().zip(part.iter_mut()) {
            let mut li = lo;
            while li + 4 <= hi {
                let f = |l: usize| factors[l * ng + s.group] as f32;
                let a = [f(li), f(li + 1), f(li + 2), f(li + 3)];
                let (r0, r1) = (self.row(s, li), self.row(s, li + 1));
                let (r2, r3) = (self.row(s, li + 2), self.row(s, li + 3));
                axpy4(p, a, r0, r1, r2, r3);
                li += 4;
            }
            for l in li..hi {
                let f = factors[l * ng + s.group];
                if f != 0.0 {
                    axpy(p, f as f32, self.row(s, l));
                }
            }
        }
    }
}

/// One thread's range, software-pipelined in steps of `R` records: a single sweep over the
/// columns accumulates factor × row for the `R` records of step k (their rows are in cache since
/// the previous sweep streamed them in) and the squared norms of the `R` records of step k + 1
/// (streamed from memory now). Memory streaming thus overlaps the in-cache work, and the
/// partial sums are read and written once per `R` records.
fn pipeline<const R: usize>(
    ctx: &RangeCtx<'_, '_>,
    mut out: Out<'_>,
) -> Result<Vec<Vec<f32>>, ClipError> {
    let n = out.totals.len();
    let ng = ctx.ng;
    let mut part: Vec<Vec<f32>> = ctx.segs.iter().map(|s| scratch_zeroed(s.width)).collect();
    let step_end = |k: usize| ((k + 1) * R).min(n);
    let steps = n.div_ceil(R);
    ctx.norms_plain(0, step_end(0), &mut out)?;
    let mut sq = vec![0f64; R * ng];
    for k in 0..steps {
        let (lo, hi) = (k * R, step_end(k));
        let next_hi = if k + 1 < steps { step_end(k + 1) } else { hi };
        if hi - lo == R && next_hi - hi == R {
            sq.iter_mut().for_each(|v| *v = 0.0);
            for (s, p) in ctx.segs.iter().zip(part.iter_mut()) {
                let a: [f32; R] =
                    std::array::from_fn(|r| out.factors[(lo + r) * ng + s.group] as f32);
                let cur: [&[f32]; R] = std::array::from_fn(|r| ctx.row(s, lo + r));
                let next: [&[f32]; R] = std::array::from_fn(|r| ctx.row(s, hi + r));
                let got = sweep::<R>(p, &a, &cur, &next, false);
                for r in 0..R {
                    sq[r * ng + s.group] += got[r];
                }
            }
            for r in 0..R {
                ctx.finish(hi + r, &sq[r * ng..(r + 1) * ng], &mut out)?;
            }
        } else {
            ctx.norms_plain(hi, next_hi, &mut out)?;
            ctx.accumulate_plain(lo, hi, out.factors, &mut part);
        }
    }
    Ok(part)
}

/// Column chunk of the column-parallel pipeline: (segment, first column, its partial sums).
type ColChunk<'p> = (usize, usize, &'p mut [f32]);

/// The whole batch, software-pipelined in steps of `R` records like [`pipeline`], each sweep
/// split over the columns. Used for records too large for per-thread pipelines (the working
/// set (2R + 1) · record bytes is shared by all threads instead of per thread) and for batches
/// smaller than twice the thread count. No per-thread partials: every column chunk has one
/// owner.
///
/// The full steps run on a static split: thread t always owns the same contiguous range
/// of column chunks (member t of raptor-plan's persistent team when called from outside a
/// rayon pool, else [`rayon::broadcast`]'s job t of the current pool), and walks it forward on even steps and backward on odd ones, so that it starts on
/// the chunks it touched last. A chunk's rows are thus streamed in and later accumulated by the
/// same core: no cache lines move between cores (they would cross the die when a machine
/// places the two threads on different L3s; a work-stealing split was ≈ 25 % slower there).
/// The per-chunk norms are combined in chunk order whatever thread computed them, so the
/// result does not depend on the split. A step needs every pool thread: in a pool busy with
/// other long jobs it waits for them (calls from inside pool jobs are fine; tested).
fn column_pipeline<const R: usize>(
    ctx: &RangeCtx<'_, '_>,
    mut out: Out<'_>,
) -> Result<Vec<Vec<f32>>, ClipError> {
    let n = out.totals.len();
    let ng = ctx.ng;
    let segs = ctx.segs;
    let col_chunk = Budgets::here().col_chunk;
    let mut sums: Vec<Vec<f32>> = segs.iter().map(|s| vec![0f32; s.width]).collect();
    let mut chunks: Vec<ColChunk<'_>> = Vec::new();
    for (k, s) in sums.iter_mut().enumerate() {
        for (c, p) in s.chunks_mut(col_chunk).enumerate() {
            chunks.push((k, c * col_chunk, p));
        }
    }
    let owners = owner_ranges(&chunks, rayon::current_num_threads().max(1));
    let piece = |k: usize, lo: usize, len: usize, li: usize| {
        let s = &segs[k];
        let i = ctx.start + li;
        &s.data[i * s.width + lo..i * s.width + lo + len]
    };
    // Squared norms of records lo..hi, parallel over chunks, summed in chunk order.
    let norms_par = |lo: usize, hi: usize, out: &mut Out<'_>, chunks: &mut [ColChunk<'_>]| {
        let parts: Vec<Vec<f64>> = par_items(
            chunks.iter_mut().collect(),
            |_, (k, c0, p): &mut ColChunk<'_>| {
                (lo..hi)
                    .map(|li| sq_norm(piece(*k, *c0, p.len(), li)))
                    .collect()
            },
        );
        let mut sq = vec![0f64; ng];
        for li in lo..hi {
            sq.iter_mut().for_each(|v| *v = 0.0);
            for ((k, _, _), v) in chunks.iter().zip(&parts) {
                sq[segs[*k].group] += v[li - lo];
            }
            ctx.finish(li, &sq, out)?;
        }
        Ok::<(), ClipError>(())
    };
    let steps = n.div_ceil(R);
    let step_end = |k: usize| ((k + 1) * R).min(n);
    norms_par(0, step_end(0), &mut out, &mut chunks)?;
    let mut sq = vec![0f64; R * ng];
    for k in 0..steps {
        let (lo, hi) = (k * R, step_end(k));
        let next_hi = if k + 1 < steps { step_end(k + 1) } else { hi };
        let factors = &*out.factors;
        if hi - lo == R && next_hi - hi == R {
            // One chunk's sweep: accumulate records lo..hi, norms of records hi..hi + R.
            let sweep_chunk = |(kk, c0, p): &mut ColChunk<'_>| {
                let (kk, c0, len) = (*kk, *c0, p.len());
                let g = segs[kk].group;
                let a: [f32; R] = std::array::from_fn(|r| factors[(lo + r) * ng + g] as f32);
                let cur: [&[f32]; R] = std::array::from_fn(|r| piece(kk, c0, len, lo + r));
                let next: [&[f32]; R] = std::array::from_fn(|r| piece(kk, c0, len, hi + r));
                sweep::<R>(p, &a, &cur, &next, true)
            };
            let parts = on_owners(&mut chunks, &owners, k % 2 == 0, sweep_chunk);
            sq.iter_mut().for_each(|v| *v = 0.0);
            for ((k, _, _), v) in chunks.iter().zip(&parts) {
                for r in 0..R {
                    sq[r * ng + segs[*k].group] += v[r];
                }
            }
            for r in 0..R {
                ctx.finish(hi + r, &sq[r * ng..(r + 1) * ng], &mut out)?;
            }
        } else {
            par_items(
                chunks.iter_mut().collect(),
                |_, (k, c0, p): &mut ColChunk<'_>| {
                    let g = segs[*k].group;
                    for li in lo..hi {
                        let f = factors[li * ng + g];
                        if f != 0.0 {
                            let row = piece(*k, *c0, p.len(), li);
                            axpy(p, f as f32, row);
                        }
                    }
                },
            );
            if next_hi > hi {
                norms_par(hi, next_hi, &mut out, &mut chunks)?;
            }
        }
    }
    drop(chunks);
    Ok(sums)
}

/// libtorch's schedule on slices: all squared norms first (records split over the pool, each
/// record's rows in one go), then `sums = Gᵀ f` block by block as a column-blocked
/// matrix–vector product: the output is cut into column chunks that stay in L2 (about four per
/// thread), and each chunk runs over all records in order, eight at a time by fused
/// multiply-adds (`axpy8`), then four, then one (records with factor 0 skipped there); the
/// order of the additions into an output entry does not depend on the chunks. Reads every
/// entry from memory twice, writes each output entry once.
fn two_pass(
    ctx: &RangeCtx<'_, '_>,
    out: Out<'_>,
    threads: usize,
) -> Result<Vec<Vec<f32>>, ClipError> {
    let n = out.totals.len();
    let ng = ctx.ng;
    // Pass 1: norms and factors, several record ranges per thread for balance.
    let per = n.div_ceil(threads * 4).max(1);
    let ranges: Vec<_> = out
        .norms
        .chunks_mut(per * ng)
        .zip(out.factors.chunks_mut(per * ng))
        .zip(out.totals.chunks_mut(per))
        .collect();
    par_items(ranges, |t, ((norm_c, fac_c), tot_c)| {
        let sub = RangeCtx {
            segs: ctx.segs,
            start: ctx.start + t * per,
            ng,
            mode: ctx.mode,
            weights: ctx.weights,
        };
        let len = tot_c.len();
        let mut o = Out {
            norms: norm_c,
            factors: fac_c,
            totals: tot_c,
        };
        sub.norms_plain(0, len, &mut o)
    })
    .into_iter()
    .collect::<Result<(), ClipError>>()?;
    // Pass 2: Gᵀ f per block over column chunks: at most the L2-sized chunk, and small enough
    // that every thread gets about four chunks (a record of 10⁴ entries is one L2 chunk).
    let factors: &[f64] = out.factors;
    let width: usize = ctx.segs.iter().map(|s| s.width).sum();
    let chunk = Budgets::here()
        .col_chunk
        .min(width.div_ceil(4 * threads.max(1)).next_multiple_of(64))
        .max(1024);
    let mut sums: Vec<Vec<f32>> = ctx.segs.iter().map(|s| vec![0f32; s.width]).collect();
    let mut chunks: Vec<ColChunk<'_>> = Vec::new();
    for (k, s) in sums.iter_mut().enumerate() {
        for (c, p) in s.chunks_mut(chunk).enumerate() {
            chunks.push((k, c * chunk, p));
        }
    }
    par_items(
        chunks.iter_mut().collect(),
        |_, (k, c0, p): &mut ColChunk<'_>| {
            let s = &ctx.segs[*k];
            let (c0, len) = (*c0, p.len());
            let piece = |li: usize| {
                let i = ctx.start + li;
                &s.data[i * s.width + c0..i * s.width + c0 + len]
            };
            let f = |li: usize| factors[li * ng + s.group] as f32;
            let mut li = 0;
            while li + 8 <= n {
                let a: [f32; 8] = std::array::from_fn(|r| f(li + r));
                axpy8(p, a, std::array::from_fn(|r| piece(li + r)));
                li += 8;
            }
            while li + 4 <= n {
                let a = [f(li), f(li + 1), f(li + 2), f(li + 3)];
                axpy4(p, a, piece(li), piece(li + 1), piece(li + 2), piece(li + 3));
                li += 4;
            }
            for l in li..n {
                let a = f(l);
                if a != 0.0 {
                    axpy(p, a, piece(l));
                }
            }
        },
    );
    drop(chunks);
    Ok(sums)
}

/// Partial-sum buffers of the row pipeline kept between calls (at most [`SCRATCH_MAX_BYTES`]).
/// Why: a fresh buffer of a few MB is fresh pages from the kernel, and the first touch of each
/// 4 KiB page is a page fault — tens of µs each on a virtual machine, so two 4 MB partials cost
/// as much as the whole clip of 256 MB (measured: 51 ms instead of 15 ms per call at B64 P1e6,
/// whenever the allocator had returned the previous call's buffers to the system).
static SCRATCH: std::sync::Mutex<Vec<Vec<f32>>> = std::sync::Mutex::new(Vec::new());

/// Most bytes [`SCRATCH`] keeps (a bound on the memory a process holds on to, not a tuning).
const SCRATCH_MAX_BYTES: usize = 256 << 20;

fn scratch() -> std::sync::MutexGuard<'static, Vec<Vec<f32>>> {
    match SCRATCH.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// A zeroed buffer of `len` entries, reusing a kept one when one is large enough.
fn scratch_zeroed(len: usize) -> Vec<f32> {
    let reused = {
        let mut pool = scratch();
        let best = pool
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        best.map(|i| pool.swap_remove(i))
    };
    match reused {
        Some(mut v) => {
            v.clear();
            v.resize(len, 0.0);
            v
        }
        None => vec![0f32; len],
    }
}

/// Keep `v` for a later [`scratch_zeroed`] (dropped when the pool is full).
fn scratch_return(v: Vec<f32>) {
    let bytes = v.capacity() * 4;
    if bytes < 1 << 16 {
        return; // small buffers come from the allocator's own free lists
    }
    let mut pool = scratch();
    let held: usize = pool.iter().map(|b| b.capacity() * 4).sum();
    if held + bytes <= SCRATCH_MAX_BYTES {
        pool.push(v);
    }
}

/// Do parallel parts run on raptor-plan's team (called from outside any rayon pool, team
/// enabled) rather than as rayon tasks of the current pool?
fn on_team() -> bool {
    rayon::current_thread_index().is_none() && raptor_plan::team::enabled()
}

/// `f(i, items[i])` for every item in parallel, results in item order: on raptor-plan's
/// spinning [`team`](raptor_plan::team) when called from outside a rayon pool (team size: the
/// global pool's thread count; `RAPTOR_TEAM=off` turns this off), else as rayon tasks of the
/// current pool. The items, and what each computes, are the same either way: only the thread
/// that runs an item differs, so results are bitwise the same. Why a team: a call from outside
/// the pool wakes sleeping pool threads (tens of µs on a VM), as long as a whole cache-resident
/// clip-and-sum; the team's workers spin between calls, as OpenMP's do.
fn par_items<I, T, F>(items: Vec<I>, f: F) -> Vec<T>
where
    I: Send,
    T: Send,
    F: Fn(usize, I) -> T + Sync + Send,
{
    if on_team() {
        raptor_plan::team::map_items(rayon::current_num_threads().max(1), items, f)
    } else {
        items
            .into_par_iter()
            .enumerate()
            .map(|(i, it)| f(i, it))
            .collect()
    }
}

/// Split `chunks` into `threads` contiguous ranges of about equal entries: returns the range
/// boundaries (`threads + 1` indices, the first 0, the last `chunks.len()`).
fn owner_ranges(chunks: &[ColChunk<'_>], threads: usize) -> Vec<usize> {
    let total: usize = chunks.iter().map(|c| c.2.len()).sum();
    let mut bounds = Vec::with_capacity(threads + 1);
    bounds.push(0);
    let mut seen = 0usize;
    for (j, c) in chunks.iter().enumerate() {
        seen += c.2.len();
        // Close range t once it holds t/threads of the entries (integer arithmetic).
        while bounds.len() < threads && seen.saturating_mul(threads) >= total * bounds.len() {
            bounds.push(j + 1);
        }
    }
    while bounds.len() <= threads {
        bounds.push(chunks.len());
    }
    bounds
}

/// Run `f` on every chunk, thread t (team member or pool thread t) on the chunks
/// `owners[t]..owners[t + 1]` (forward or backward), and return the results in chunk order. A
/// range that no pool thread took (the pool changed size between the split and the call) runs
/// on the calling thread, so every chunk is processed exactly once whatever happens.
fn on_owners<T, F>(chunks: &mut [ColChunk<'_>], owners: &[usize], forward: bool, f: F) -> Vec<T>
where
    T: Send,
    F: Fn(&mut ColChunk<'_>) -> T + Sync,
{
    use std::sync::Mutex;
    let ranges = owners.len().saturating_sub(1);
    let run = |range: &mut [ColChunk<'_>]| -> Vec<T> {
        let mut res: Vec<T> = Vec::with_capacity(range.len());
        if forward {
            res.extend(range.iter_mut().map(&f));
        } else {
            res.extend(range.iter_mut().rev().map(&f));
            res.reverse();
        }
        res
    };
    // One lock per range, each taken by one thread only (no contention).
    let mut slots: Vec<Mutex<Option<&mut [ColChunk<'_>]>>> = Vec::with_capacity(ranges);
    let mut rest = chunks;
    for t in 0..ranges {
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(owners[t + 1] - owners[t]);
        slots.push(Mutex::new(Some(mine)));
        rest = tail;
    }
    let take = |t: usize| -> Option<&mut [ColChunk<'_>]> {
        let slot = slots.get(t)?;
        let mut guard = match slot.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        guard.take()
    };
    let mut done: Vec<Option<Vec<T>>> = if on_team() {
        // Member t of the persistent team (the same OS thread every call) takes range t.
        raptor_plan::team::map_parts(ranges, ranges, |t| take(t).map(run))
    } else {
        rayon::broadcast(|bc| take(bc.index()).map(run))
    };
    done.truncate(ranges);
    while done.len() < ranges {
        done.push(None);
    }
    let mut out = Vec::with_capacity(owners.last().copied().unwrap_or(0));
    for (t, d) in done.into_iter().enumerate() {
        match d {
            Some(v) => out.extend(v),
            None => out.extend(take(t).map(run).unwrap_or_default()),
        }
    }
    out
}

/// One pipeline sweep: `p += Σ_r a[r] · cur[r]` (f32) and returns `‖next[r]‖²` for each r,
/// accumulated in f64 (each f32 entry is widened, so its square is exact). All rows have
/// `p.len()` entries. `cur_nta`: prefetch the `cur` rows (read for the last time) with the
/// non-temporal hint, so that on eviction they do not displace the rows streamed in for the
/// next sweep and the partial sums from the L3 (a gain for the column pipeline's multi-MB
/// records; a loss where the rows are in L2).
#[inline]
fn sweep<const R: usize>(
    p: &mut [f32],
    a: &[f32; R],
    cur: &[&[f32]; R],
    next: &[&[f32]; R],
    cur_nta: bool,
) -> [f64; R] {
    let n = p.len();
    assert!(cur.iter().chain(next.iter()).all(|r| r.len() == n));
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU supports AVX-512F (checked just above); all rows have p.len()
        // entries (asserted above).
        return unsafe { sweep_avx512::<R>(p, a, cur, next, cur_nta) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above); all rows have p.len()
        // entries (asserted above).
        return unsafe { sweep_avx2::<R>(p, a, cur, next, cur_nta) };
    }
    let _ = cur_nta; // a hint only
    sweep_portable::<R>(p, a, cur, next)
}

/// Portable version of [`sweep`] (8 f64 lanes per row).
fn sweep_portable<const R: usize>(
    p: &mut [f32],
    a: &[f32; R],
    cur: &[&[f32]; R],
    next: &[&[f32]; R],
) -> [f64; R] {
    let n = p.len();
    let mut acc = [[0f64; 8]; R];
    let full = n - n % 8;
    let mut k = 0;
    while k < full {
        for j in 0..8 {
            let mut v = p[k + j];
            for r in 0..R {
                v += a[r] * cur[r][k + j];
            }
            p[k + j] = v;
        }
        for r in 0..R {
            for j in 0..8 {
                let x = f64::from(next[r][k + j]);
                acc[r][j] += x * x;
            }
        }
        k += 8;
    }
    let mut res = [0f64; R];
    for r in 0..R {
        let c = &acc[r];
        res[r] = ((c[0] + c[4]) + (c[1] + c[5])) + ((c[2] + c[6]) + (c[3] + c[7]));
    }
    sweep_tail(p, a, cur, next, full, &mut res);
    res
}

/// Scalar tail `k0..n` of a sweep (f64 norms).
#[inline]
fn sweep_tail<const R: usize>(
    p: &mut [f32],
    a: &[f32; R],
    cur: &[&[f32]; R],
    next: &[&[f32]; R],
    k0: usize,
    res: &mut [f64; R],
) {
    for k in k0..p.len() {
        let mut v = p[k];
        for r in 0..R {
            v += a[r] * cur[r][k];
        }
        p[k] = v;
        for r in 0..R {
            let x = f64::from(next[r][k]);
            res[r] += x * x;
        }
    }
}

/// Prefetch the two cache lines `dist` bytes ([`Budgets::prefetch`]) ahead of entry `k` of every streamed row
/// (`next`), and with `cur_nta` of every accumulated row (`cur`) with the non-temporal hint.
/// Addresses are computed with wrapping arithmetic; prefetches never fault.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_ahead<const R: usize>(
    next: &[*const f32; R],
    cur: &[*const f32; R],
    k: usize,
    cur_nta: bool,
    dist: usize,
) {
    use std::arch::x86_64::*;
    let ahead = |row: *const f32| row.wrapping_add(k).cast::<i8>().wrapping_add(dist);
    for &row in next {
        let a = ahead(row);
        // SAFETY: prefetch is a hint; it never faults, whatever the address.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(a);
            _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add(64));
        }
    }
    if cur_nta {
        for &row in cur {
            let a = ahead(row);
            // SAFETY: as above.
            unsafe {
                _mm_prefetch::<_MM_HINT_NTA>(a);
                _mm_prefetch::<_MM_HINT_NTA>(a.wrapping_add(64));
            }
        }
    }
}

/// AVX2 + FMA version of [`sweep`]: 32 entries (two cache lines) per row per iteration, entries
/// of the streamed rows widened to f64 and their squares accumulated by FMA in up to four f64
/// vectors per row; software prefetch of the streamed rows (and, with `cur_nta`, non-temporal
/// prefetch of the accumulated rows).
///
/// # Safety
/// The CPU must support AVX2 and FMA; every row must have `p.len()` entries.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sweep_avx2<const R: usize>(
    p: &mut [f32],
    a: &[f32; R],
    cur: &[&[f32]; R],
    next: &[&[f32]; R],
    cur_nta: bool,
) -> [f64; R] {
    use std::arch::x86_64::*;
    const W: usize = 32;
    let n = p.len();
    let full = n - n % W;
    let dist = Budgets::here().prefetch;
    let pp = p.as_mut_ptr();
    let cp: [*const f32; R] = std::array::from_fn(|r| cur[r].as_ptr());
    let np: [*const f32; R] = std::array::from_fn(|r| next[r].as_ptr());
    let av: [__m256; R] = std::array::from_fn(|r| _mm256_set1_ps(a[r]));
    let mut acc = [[_mm256_setzero_pd(); 4]; R];
    // f64 accumulators in use per streamed row: enough independent FMA chains to hide the
    // latency without spilling registers at large R.
    let lanes = if R <= 2 {
        4
    } else if R <= 4 {
        2
    } else {
        1
    };
    let mut k = 0;
    while k < full {
        // SAFETY (whole block): k + 32 ≤ n and every row has n entries; the prefetch addresses
        // are computed with wrapping arithmetic and prefetches never fault.
        unsafe {
            prefetch_ahead(&np, &cp, k, cur_nta, dist);
            for j in 0..4 {
                let o = k + 8 * j;
                let mut v = _mm256_loadu_ps(pp.add(o));
                for r in 0..R {
                    v = _mm256_fmadd_ps(av[r], _mm256_loadu_ps(cp[r].add(o)), v);
                }
                _mm256_storeu_ps(pp.add(o), v);
            }
            for r in 0..R {
                let x0 = _mm256_loadu_ps(np[r].add(k));
                let x1 = _mm256_loadu_ps(np[r].add(k + 8));
                let x2 = _mm256_loadu_ps(np[r].add(k + 16));
                let x3 = _mm256_loadu_ps(np[r].add(k + 24));
                for (j, x) in [x0, x1, x2, x3].into_iter().enumerate() {
                    // f32 → f64 squares are exact; accumulate in `lanes` f64 vectors.
                    let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
                    let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x));
                    let (u, v) = ((2 * j) % lanes, (2 * j + 1) % lanes);
                    acc[r][u] = _mm256_fmadd_pd(lo, lo, acc[r][u]);
                    acc[r][v] = _mm256_fmadd_pd(hi, hi, acc[r][v]);
                }
            }
        }
        k += W;
    }
    let mut res = [0f64; R];
    for r in 0..R {
        let mut lanes = [0f64; 4];
        let t = _mm256_add_pd(
            _mm256_add_pd(acc[r][0], acc[r][1]),
            _mm256_add_pd(acc[r][2], acc[r][3]),
        );
        // SAFETY: `lanes` holds 4 f64.
        unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), t) };
        res[r] = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
    }
    sweep_tail(p, a, cur, next, full, &mut res);
    res
}

/// AVX-512F version of [`sweep`]: the same sweep as [`sweep_avx2`] with 512-bit registers
/// (two f32 vectors per row for the accumulation, the streamed rows' entries widened to f64
/// eight at a time and squared by FMA into up to four f64 vectors per row), the same
/// prefetches.
///
/// # Safety
/// The CPU must support AVX-512F; every row must have `p.len()` entries.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sweep_avx512<const R: usize>(
    p: &mut [f32],
    a: &[f32; R],
    cur: &[&[f32]; R],
    next: &[&[f32]; R],
    cur_nta: bool,
) -> [f64; R] {
    use std::arch::x86_64::*;
    const W: usize = 32;
    let n = p.len();
    let full = n - n % W;
    let dist = Budgets::here().prefetch;
    let pp = p.as_mut_ptr();
    let cp: [*const f32; R] = std::array::from_fn(|r| cur[r].as_ptr());
    let np: [*const f32; R] = std::array::from_fn(|r| next[r].as_ptr());
    let av: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(a[r]));
    let mut acc = [[_mm512_setzero_pd(); 4]; R];
    let lanes = if R <= 2 {
        4
    } else if R <= 4 {
        2
    } else {
        1
    };
    let mut k = 0;
    while k < full {
        // SAFETY (whole block): k + 32 ≤ n and every row has n entries; the prefetch addresses
        // are computed with wrapping arithmetic and prefetches never fault.
        unsafe {
            prefetch_ahead(&np, &cp, k, cur_nta, dist);
            for j in 0..2 {
                let o = k + 16 * j;
                let mut v = _mm512_loadu_ps(pp.add(o));
                for r in 0..R {
                    v = _mm512_fmadd_ps(av[r], _mm512_loadu_ps(cp[r].add(o)), v);
                }
                _mm512_storeu_ps(pp.add(o), v);
            }
            for r in 0..R {
                for j in 0..4 {
                    // f32 → f64 squares are exact; accumulate in `lanes` f64 vectors.
                    let x = _mm512_cvtps_pd(_mm256_loadu_ps(np[r].add(k + 8 * j)));
                    let u = j % lanes;
                    acc[r][u] = _mm512_fmadd_pd(x, x, acc[r][u]);
                }
            }
        }
        k += W;
    }
    let mut res = [0f64; R];
    for r in 0..R {
        let mut lanes = [0f64; 8];
        let t = _mm512_add_pd(
            _mm512_add_pd(acc[r][0], acc[r][1]),
            _mm512_add_pd(acc[r][2], acc[r][3]),
        );
        // SAFETY: `lanes` holds 8 f64.
        unsafe { _mm512_storeu_pd(lanes.as_mut_ptr(), t) };
        res[r] = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
            + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    }
    sweep_tail(p, a, cur, next, full, &mut res);
    res
}

thread_local! {
    /// Schedule forced on this thread by [`with_schedule`].
    static FORCED: std::cell::Cell<Option<Schedule>> = const { std::cell::Cell::new(None) };
}

/// Run `f` with every clipping call made on this thread using schedule `s` (no planning, no
/// wisdom lookup, nothing remembered). Nested calls restore the outer setting on return.
pub fn with_schedule<T>(s: Schedule, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Schedule>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORCED.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(FORCED.with(|c| c.replace(Some(s))));
    f()
}

/// `round(log2(n))` (0 for n ≤ 1): shapes within a factor of √2 share a class.
fn log2_bucket(n: usize) -> u32 {
    if n <= 1 {
        return 0;
    }
    let fl = usize::BITS - 1 - n.leading_zeros();
    // round up when n ≥ 2^fl · √2, i.e. n² ≥ 2^(2·fl + 1)
    let up = (n as u128) * (n as u128) >= 1u128 << (2 * fl + 1);
    fl + u32::from(up)
}

/// The shape class of a call: records and record entries (each rounded to the nearest power
/// of two), segments, groups and pool threads. Example: `clip b2^8 p2^20 s1 g1 t2`.
pub(crate) fn shape_key(segs: &[Seg<'_>], batch: usize, n_groups: usize, threads: usize) -> String {
    let rec: usize = segs.iter().map(|s| s.width).sum();
    format!(
        "clip b2^{} p2^{} s{} g{} t{threads}",
        log2_bucket(batch),
        log2_bucket(rec),
        segs.len(),
        n_groups
    )
}

/// The schedule a call of this shape would run now without timing anything: the forced one,
/// else the remembered one (this process's wisdom), else `None`.
pub(crate) fn known_schedule(segs: &[Seg<'_>], batch: usize, n_groups: usize) -> Option<Schedule> {
    if let Some(s) = FORCED.with(|c| c.get()) {
        return Some(s);
    }
    let threads = rayon::current_num_threads().max(1);
    raptor_plan::lookup(&shape_key(segs, batch, n_groups, threads)).and_then(|c| c.parse().ok())
}

/// Run the clip-and-sum kernel with the planned schedule. Shapes are assumed validated by the
/// caller.
///
/// Planning: a schedule forced by [`with_schedule`] runs as is. Otherwise the shape class's
/// remembered schedule runs ([`raptor_plan::lookup`]); a class without one is planned on this
/// call: in [`raptor_plan::PlanMode::Estimate`] the cache-model estimate runs (and is not
/// remembered), in `Measure` the [`candidates`] are timed on this call's data within
/// [`raptor_plan::DEFAULT_BUDGET`] runs, the fastest is remembered, and its result returned.
/// The candidates agree within the documented rounding tolerance, so the choice — which
/// depends on timing — changes no result beyond it.
pub(crate) fn fused_clip_sum(
    segs: &[Seg<'_>],
    batch: usize,
    n_groups: usize,
    mode: BoundMode<'_>,
    weights: Option<&[f64]>,
) -> Result<Fused, ClipError> {
    if let Some(s) = known_schedule(segs, batch, n_groups) {
        return fused_with(segs, batch, n_groups, mode, weights, s);
    }
    let threads = rayon::current_num_threads().max(1);
    let rec_floats: usize = segs.iter().map(|s| s.width).sum();
    let budgets = Budgets::here();
    let est = schedule(rec_floats, batch, threads, &budgets);
    if batch == 0 || raptor_plan::mode() == raptor_plan::PlanMode::Estimate {
        return fused_with(segs, batch, n_groups, mode, weights, est);
    }
    let cands = candidates(rec_floats, batch, threads, &budgets);
    if on_team() {
        // Start the team's workers now, so that no timed candidate pays their start-up.
        raptor_plan::team::run(threads, |_, _| {});
    }
    let measured = raptor_plan::measure_within(
        &cands,
        raptor_plan::DEFAULT_BUDGET,
        raptor_plan::DEFAULT_EXTRA_TIME,
        |&s| fused_with(segs, batch, n_groups, mode, weights, s),
    )?;
    match measured {
        Some(m) => {
            let key = shape_key(segs, batch, n_groups, threads);
            raptor_plan::remember(&key, &cands[m.winner].to_string());
            Ok(m.output)
        }
        None => fused_with(segs, batch, n_groups, mode, weights, est),
    }
}

/// [`fused_clip_sum`] with a given schedule.
pub(crate) fn fused_with(
    segs: &[Seg<'_>],
    batch: usize,
    n_groups: usize,
    mode: BoundMode<'_>,
    weights: Option<&[f64]>,
    sched: Schedule,
) -> Result<Fused, ClipError> {
    let threads = rayon::current_num_threads().max(1);
    let mut norms = vec![0f64; batch * n_groups];
    let mut factors = vec![0f64; batch * n_groups];
    let mut total_norms = vec![0f64; batch];
    if batch == 0 {
        return Ok(Fused {
            sums: segs.iter().map(|s| vec![0f32; s.width]).collect(),
            norms,
            total_norms,
            factors,
        });
    }
    let ng = n_groups;
    let sums = match sched {
        Schedule::Rows(r) => {
            // One contiguous range of records per thread, private partial sums.
            let per = batch.div_ceil(threads);
            let ranges: Vec<_> = norms
                .chunks_mut(per * ng)
                .zip(factors.chunks_mut(per * ng))
                .zip(total_norms.chunks_mut(per))
                .collect();
            let partials: Vec<Result<Vec<Vec<f32>>, ClipError>> =
                par_items(ranges, |t, ((norm_c, fac_c), tot_c)| {
                    let ctx = RangeCtx {
                        segs,
                        start: t * per,
                        ng,
                        mode,
                        weights,
                    };
                    let out = Out {
                        norms: norm_c,
                        factors: fac_c,
                        totals: tot_c,
                    };
                    match r {
                        8 => pipeline::<8>(&ctx, out),
                        4 => pipeline::<4>(&ctx, out),
                        2 => pipeline::<2>(&ctx, out),
                        _ => pipeline::<1>(&ctx, out),
                    }
                });
            let partials: Vec<Vec<Vec<f32>>> = partials.into_iter().collect::<Result<_, _>>()?;
            // Reduce over column ranges in parallel.
            const COLS: usize = 1 << 14;
            let mut sums: Vec<Vec<f32>> = Vec::with_capacity(segs.len());
            for (k, s) in segs.iter().enumerate() {
                let mut out = vec![0f32; s.width];
                par_items(out.chunks_mut(COLS).collect(), |c, o: &mut [f32]| {
                    let lo = c * COLS;
                    let len = o.len();
                    for p in &partials {
                        add_into(o, &p[k][lo..lo + len]);
                    }
                });
                sums.push(out);
            }
            partials.into_iter().flatten().for_each(scratch_return);
            sums
        }
        Schedule::Columns(r) => {
            let ctx = RangeCtx {
                segs,
                start: 0,
                ng,
                mode,
                weights,
            };
            let out = Out {
                norms: &mut norms,
                factors: &mut factors,
                totals: &mut total_norms,
            };
            match r {
                4 => column_pipeline::<4>(&ctx, out),
                2 => column_pipeline::<2>(&ctx, out),
                _ => column_pipeline::<1>(&ctx, out),
            }?
        }
        Schedule::TwoPass => {
            let ctx = RangeCtx {
                segs,
                start: 0,
                ng,
                mode,
                weights,
            };
            let out = Out {
                norms: &mut norms,
                factors: &mut factors,
                totals: &mut total_norms,
            };
            two_pass(&ctx, out, threads)?
        }
    };
    // A record with a non-finite entry has factor 0, but 0 · NaN is NaN in the fused sums:
    // recompute the sums without those records (rare; the factors are already known).
    let sums = if total_norms.iter().all(|t| t.is_finite()) {
        sums
    } else {
        sums_skipping_non_finite(segs, batch, ng, &factors, &total_norms)
    };
    Ok(Fused {
        sums,
        norms,
        total_norms,
        factors,
    })
}

/// Σ_i factor(i, group) · row_i per segment over the records whose total norm is finite (the
/// others contribute nothing), accumulated in f32 record by record.
fn sums_skipping_non_finite(
    segs: &[Seg<'_>],
    batch: usize,
    ng: usize,
    factors: &[f64],
    total_norms: &[f64],
) -> Vec<Vec<f32>> {
    segs.iter()
        .map(|s| {
            let mut out = vec![0f32; s.width];
            for (i, row) in s.data.chunks_exact(s.width).take(batch).enumerate() {
                // A non-finite record contributes nothing, whatever factor it was given.
                if !total_norms[i].is_finite() {
                    continue;
                }
                let f = factors[i * ng + s.group];
                // (A factor of 0 would add zeros: skipped to save the pass over the row.)
                if f == 0.0 {
                    continue;
                }
                axpy(&mut out, f as f32, row);
            }
            out
        })
        .collect()
}

/// A STREAM-like read of the same bytes: the parallel sum of all entries (f32 lanes), the
/// physical reference for a kernel that must read every gradient byte once.
pub fn stream_read_sum(data: &[f32]) -> f32 {
    const CH: usize = 1 << 16;
    data.par_chunks(CH).map(lane_sum).sum()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Every schedule the kernel can pick, with every step size.
    const SCHEDULES: [Schedule; 8] = [
        Schedule::TwoPass,
        Schedule::Rows(1),
        Schedule::Rows(2),
        Schedule::Rows(4),
        Schedule::Rows(8),
        Schedule::Columns(1),
        Schedule::Columns(2),
        Schedule::Columns(4),
    ];

    /// Reference result: per-block sums, per-block Σ|terms| (the rounding scale), norms,
    /// factors.
    type RefOut = (Vec<Vec<f64>>, Vec<Vec<f64>>, Vec<f64>, Vec<f64>);

    /// Slow per-record reference in f64.
    fn reference(
        segs: &[Seg<'_>],
        batch: usize,
        ng: usize,
        mode: BoundMode<'_>,
        weights: Option<&[f64]>,
    ) -> RefOut {
        let mut sums: Vec<Vec<f64>> = segs.iter().map(|s| vec![0.0; s.width]).collect();
        let mut abs: Vec<Vec<f64>> = segs.iter().map(|s| vec![0.0; s.width]).collect();
        let mut norms = vec![0.0; batch * ng];
        let mut factors = vec![0.0; batch * ng];
        for i in 0..batch {
            let w = weights.map_or(1.0, |w| w[i]);
            let mut sq = vec![0.0f64; ng];
            for s in segs {
                for &x in &s.data[i * s.width..(i + 1) * s.width] {
                    sq[s.group] += f64::from(x) * f64::from(x);
                }
            }
            let total = w * sq.iter().sum::<f64>().sqrt();
            for g in 0..ng {
                let n = w * sq[g].sqrt();
                norms[i * ng + g] = n;
                let c = match mode {
                    BoundMode::PerGroup(b) => b[g],
                    BoundMode::Joint(c) => c,
                };
                let m = match mode {
                    BoundMode::PerGroup(_) => n,
                    BoundMode::Joint(_) => total,
                };
                factors[i * ng + g] = w * if m > c { c / m } else { 1.0 };
            }
            for (k, s) in segs.iter().enumerate() {
                let f = factors[i * ng + s.group];
                for (j, &x) in s.data[i * s.width..(i + 1) * s.width].iter().enumerate() {
                    sums[k][j] += f * f64::from(x);
                    abs[k][j] += (f * f64::from(x)).abs();
                }
            }
        }
        (sums, abs, norms, factors)
    }

    fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(f)
    }

    /// Kinds of rows: random with spread norms, zeros, tiny entries (their squares would
    /// underflow in f32), huge entries (their squares would overflow in f32).
    fn row(rng: &mut ChaCha8Rng, width: usize, kind: u32) -> Vec<f32> {
        let scale = match kind {
            0 => 0.0,
            1 => 1e-22,
            2 => 1e21,
            _ => 10f64.powf(rng.random_range(-2.0..2.0)) / (width as f64).sqrt(),
        };
        (0..width)
            .map(|_| (rng.random_range(-1.0..1.0) * scale) as f32)
            .collect()
    }

    /// Run every schedule on `widths` (block widths) × `batch`, grouped by `groups`, and check
    /// sums, norms and factors against the reference.
    fn check(widths: &[usize], groups: &[usize], batch: usize, kinds: &[u32], seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let ng = groups.iter().max().map_or(1, |g| g + 1);
        let data: Vec<Vec<f32>> = widths
            .iter()
            .map(|&w| {
                (0..batch)
                    .flat_map(|i| row(&mut rng, w, kinds[i % kinds.len()]))
                    .collect()
            })
            .collect();
        let segs: Vec<Seg<'_>> = data
            .iter()
            .zip(widths)
            .zip(groups)
            .map(|((d, &width), &group)| Seg {
                data: d,
                width,
                group,
            })
            .collect();
        let bounds: Vec<f64> = (0..ng).map(|g| 0.5 + g as f64).collect();
        let weights: Vec<f64> = (0..batch).map(|i| [1.0, 0.0, 0.37][i % 3]).collect();
        let modes = [BoundMode::PerGroup(&bounds), BoundMode::Joint(0.8)];
        for mode in modes {
            for w in [None, Some(&weights[..])] {
                let (sums, abs, norms, factors) = reference(&segs, batch, ng, mode, w);
                for sched in SCHEDULES {
                    for threads in [1, 2, 3] {
                        let got = in_pool(threads, || {
                            fused_with(&segs, batch, ng, mode, w, sched).unwrap()
                        });
                        let ctx = format!(
                            "widths {widths:?} B={batch} kinds {kinds:?} {sched:?} t={threads}"
                        );
                        for (a, b) in got.norms.iter().zip(&norms) {
                            assert!((a - b).abs() <= 1e-6 * b.abs(), "norm {a} vs {b}: {ctx}");
                        }
                        for (a, b) in got.factors.iter().zip(&factors) {
                            assert!((a - b).abs() <= 1e-6 * b.abs(), "factor {a} vs {b}: {ctx}");
                        }
                        for k in 0..segs.len() {
                            let num: f64 = got.sums[k]
                                .iter()
                                .zip(&sums[k])
                                .map(|(&x, &y)| (f64::from(x) - y).powi(2))
                                .sum::<f64>()
                                .sqrt();
                            let den: f64 = abs[k].iter().map(|y| y * y).sum::<f64>().sqrt();
                            assert!(num <= 1e-6 * den, "sum {num} vs scale {den}: {ctx}");
                        }
                    }
                }
            }
        }
    }

    /// The row pipeline's kept partial-sum buffers carry nothing from one call into the next:
    /// a call after a call on other (large) records gives bitwise what it gave before.
    #[test]
    fn kept_partial_sums_carry_nothing_between_calls() {
        let width = 20_000; // 80 KB per partial: large enough to be kept
        let batch = 8;
        let mut rng = ChaCha8Rng::seed_from_u64(77);
        let big: Vec<f32> = (0..batch * width)
            .map(|_| rng.random_range(-1e3..1e3))
            .collect();
        let small: Vec<f32> = (0..batch * width)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let run = |d: &[f32]| {
            let segs = [Seg {
                data: d,
                width,
                group: 0,
            }];
            fused_with(
                &segs,
                batch,
                1,
                BoundMode::PerGroup(&[1e9]),
                None,
                Schedule::Rows(2),
            )
            .unwrap()
        };
        // Other tests of this binary use the pool at the same time: whichever kept buffer a
        // call gets (this test's, another's, or none), the result must be the same.
        let fresh = run(&small);
        for _ in 0..3 {
            let _ = run(&big);
            let after = run(&small);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fresh.sums[0]), bits(&after.sums[0]));
        }
    }

    /// Called from outside any rayon pool, the row and two-pass schedules run their parts on
    /// raptor-plan's spinning team; inside a pool of the same size, as rayon tasks. The parts
    /// are the same, so the results must be bitwise the same (and the rayon path is checked
    /// against the f64 reference by `check`). Also with several segments and groups, ragged
    /// ranges, records wider than one reduction chunk, and non-finite records.
    #[test]
    fn the_team_and_rayon_give_bitwise_the_same_results() {
        let threads = rayon::current_num_threads().max(1);
        let mut rng = ChaCha8Rng::seed_from_u64(41);
        for (widths, groups, batch) in [
            (vec![1000usize], vec![0usize], 64usize),
            (vec![33, 5000, 7], vec![0, 1, 0], 37),
            (vec![20_000], vec![0], 9),
            (vec![40_000], vec![0], 3),
            (vec![64], vec![0], 1),
        ] {
            let ng = groups.iter().max().map_or(1, |g| g + 1);
            let mut data: Vec<Vec<f32>> = widths
                .iter()
                .map(|&w| {
                    (0..batch)
                        .flat_map(|i| row(&mut rng, w, 3 + (i % 2) as u32))
                        .collect()
                })
                .collect();
            if batch > 5 {
                data[0][5 * widths[0]] = f32::NAN;
            }
            let segs: Vec<Seg<'_>> = data
                .iter()
                .zip(&widths)
                .zip(&groups)
                .map(|((d, &width), &group)| Seg {
                    data: d,
                    width,
                    group,
                })
                .collect();
            let bounds: Vec<f64> = (0..ng).map(|g| 0.3 + g as f64).collect();
            for sched in SCHEDULES {
                let team = fused_with(&segs, batch, ng, BoundMode::PerGroup(&bounds), None, sched)
                    .unwrap();
                let pool = in_pool(threads, || {
                    fused_with(&segs, batch, ng, BoundMode::PerGroup(&bounds), None, sched).unwrap()
                });
                let ctx = format!("{sched:?} widths {widths:?} B={batch} t={threads}");
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&team.norms), bits(&pool.norms), "{ctx}");
                assert_eq!(bits(&team.factors), bits(&pool.factors), "{ctx}");
                assert_eq!(bits(&team.total_norms), bits(&pool.total_norms), "{ctx}");
                for (a, b) in team.sums.iter().zip(&pool.sums) {
                    let (a, b): (Vec<u32>, Vec<u32>) = (
                        a.iter().map(|x| x.to_bits()).collect(),
                        b.iter().map(|x| x.to_bits()).collect(),
                    );
                    assert_eq!(a, b, "{ctx}");
                }
            }
        }
    }

    #[test]
    fn every_schedule_matches_reference_on_edge_shapes() {
        // B = 1, B < threads, ragged last steps, widths that are not multiples of the 32-entry
        // vector step (tails), widths below one vector step.
        for (n, &batch) in [1usize, 2, 3, 5, 9, 17].iter().enumerate() {
            for (m, &w) in [1usize, 7, 31, 33, 64, 100].iter().enumerate() {
                check(&[w], &[0], batch, &[3], (n * 10 + m) as u64);
            }
        }
    }

    #[test]
    fn zero_tiny_and_huge_rows() {
        // zero rows, entries whose f32 squares would underflow (1e-22) or overflow (1e21), mixed
        // with ordinary rows in every pipeline position.
        check(&[97], &[0], 11, &[0, 3, 1, 3, 2], 7);
        check(&[40, 3, 65], &[0, 1, 0], 9, &[3, 0, 2, 1], 8);
    }

    #[test]
    fn groups_of_very_different_widths() {
        // a 1-entry expert block beside a block spanning several column chunks
        check(&[1, 70_001, 5, 33], &[1, 0, 2, 1], 5, &[3, 3, 0], 9);
    }

    #[test]
    fn a_single_huge_row() {
        check(&[300_007], &[0], 1, &[3], 10);
    }

    /// A record with a NaN or infinite entry contributes nothing (factor 0 in every group, a
    /// non-finite total) and the step goes on, in every schedule and pipeline position; the
    /// other records' sums are unaffected.
    #[test]
    fn non_finite_records_contribute_zero_in_every_schedule() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for pos in [0usize, 3, 6] {
                let mut d = vec![0.5f32; 7 * 40];
                let e = vec![0.25f32; 7 * 3];
                d[pos * 40 + 17] = bad;
                let segs = [
                    Seg {
                        data: &d,
                        width: 40,
                        group: 0,
                    },
                    Seg {
                        data: &e,
                        width: 3,
                        group: 1,
                    },
                ];
                for mode in [BoundMode::Joint(1.0), BoundMode::PerGroup(&[1.0, 0.1])] {
                    for sched in SCHEDULES {
                        let f = in_pool(2, || fused_with(&segs, 7, 2, mode, None, sched))
                            .unwrap_or_else(|e| panic!("{sched:?}: {e}"));
                        assert!(!f.total_norms[pos].is_finite());
                        assert_eq!(f.factors[pos * 2], 0.0);
                        assert_eq!(f.factors[pos * 2 + 1], 0.0);
                        // reference: the six good records, each clipped
                        for (k, (seg, sum)) in segs.iter().zip(&f.sums).enumerate() {
                            for (c, &v) in sum.iter().enumerate() {
                                let want: f64 = (0..7)
                                    .filter(|&i| i != pos)
                                    .map(|i| {
                                        f.factors[i * 2 + k]
                                            * f64::from(seg.data[i * seg.width + c])
                                    })
                                    .sum();
                                assert!(
                                    (f64::from(v) - want).abs() < 1e-5,
                                    "{sched:?} seg {k} col {c}: {v} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every sweep this CPU can run (portable, AVX2 + FMA, AVX-512F) against f64 loops, every
    /// step size.
    #[test]
    fn every_sweep_matches_reference() {
        fn go<const R: usize>(rng: &mut ChaCha8Rng, n: usize, imp: u8) {
            let rows: Vec<Vec<f32>> = (0..2 * R).map(|_| row(rng, n, 3)).collect();
            let mut p: Vec<f32> = row(rng, n, 3);
            let p0 = p.clone();
            let a: [f32; R] = std::array::from_fn(|r| 0.25 + r as f32);
            let cur: [&[f32]; R] = std::array::from_fn(|r| &rows[r][..]);
            let next: [&[f32]; R] = std::array::from_fn(|r| &rows[R + r][..]);
            let got = match imp {
                0 => sweep_portable::<R>(&mut p, &a, &cur, &next),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: only called when the CPU has AVX2 + FMA (checked by the caller).
                1 => unsafe { sweep_avx2::<R>(&mut p, &a, &cur, &next, n.is_multiple_of(2)) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: only called when the CPU has AVX-512F (checked by the caller).
                _ => unsafe { sweep_avx512::<R>(&mut p, &a, &cur, &next, n.is_multiple_of(2)) },
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!(),
            };
            for r in 0..R {
                let want: f64 = next[r].iter().map(|&x| f64::from(x).powi(2)).sum();
                assert!(
                    (got[r] - want).abs() <= 1e-12 * want,
                    "imp {imp} R={R} n={n}"
                );
            }
            for j in 0..n {
                let want: f64 = f64::from(p0[j])
                    + (0..R)
                        .map(|r| f64::from(a[r]) * f64::from(cur[r][j]))
                        .sum::<f64>();
                let scale: f64 = f64::from(p0[j]).abs()
                    + (0..R)
                        .map(|r| (f64::from(a[r]) * f64::from(cur[r][j])).abs())
                        .sum::<f64>();
                assert!(
                    (f64::from(p[j]) - want).abs() <= 1e-6 * scale,
                    "R={R} n={n} j={j}"
                );
            }
        }
        let mut imps = vec![0u8];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                imps.push(1);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                imps.push(2);
            }
        }
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for &imp in &imps {
            for n in [0usize, 1, 8, 31, 32, 33, 63, 64, 65, 1000] {
                go::<1>(&mut rng, n, imp);
                go::<2>(&mut rng, n, imp);
                go::<4>(&mut rng, n, imp);
                go::<8>(&mut rng, n, imp);
            }
        }
    }

    #[test]
    fn every_sq_norm_matches_an_f64_loop() {
        type Imp = (&'static str, fn(&[f32]) -> f64);
        let mut imps: Vec<Imp> = vec![("portable", sq_norm_portable)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU has AVX2 + FMA (checked just above).
                imps.push(("avx2", |x| unsafe { sq_norm_avx2(x) }));
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F (checked just above).
                imps.push(("avx512", |x| unsafe { sq_norm_avx512(x) }));
            }
            imps.push(("dispatch", sq_norm));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        for (name, f) in imps {
            for n in [
                0usize, 1, 3, 4, 15, 16, 17, 31, 32, 33, 47, 64, 65, 1000, 10_007,
            ] {
                for kind in 0..4 {
                    let x = row(&mut rng, n, kind);
                    let want: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
                    let got = f(&x);
                    assert!(
                        (got - want).abs() <= 1e-12 * want,
                        "{name} n={n} kind={kind}: {got} vs {want}"
                    );
                }
            }
            // every entry counts: one large entry at each position of a short row
            for n in [1usize, 7, 16, 33, 70] {
                for at in 0..n {
                    let mut x = vec![0.5f32; n];
                    x[at] = 1000.0;
                    let want = 1e6 + 0.25 * (n - 1) as f64;
                    assert_eq!(f(&x), want, "{name} n={n} at={at}");
                }
            }
        }
    }

    const COL_CHUNK: usize = 1 << 15;

    #[test]
    fn owner_ranges_cover_the_chunks_in_balanced_contiguous_ranges() {
        let mut buf = vec![0f32; 10 * COL_CHUNK + 5];
        let mut chunks: Vec<ColChunk<'_>> = Vec::new();
        for (c, p) in buf.chunks_mut(COL_CHUNK).enumerate() {
            chunks.push((0, c * COL_CHUNK, p));
        }
        for threads in [1usize, 2, 3, 4, 11, 20] {
            let b = owner_ranges(&chunks, threads);
            assert_eq!(b.len(), threads + 1);
            assert_eq!((b[0], b[threads]), (0, chunks.len()));
            assert!(b.windows(2).all(|w| w[0] <= w[1]), "{b:?}");
            // no range more than one chunk above the even share
            let share = chunks.len().div_ceil(threads);
            assert!(b.windows(2).all(|w| w[1] - w[0] <= share + 1), "{b:?}");
        }
    }

    #[test]
    fn on_owners_runs_every_chunk_once_in_chunk_order_whatever_the_pool() {
        let mut buf = vec![0f32; 7 * COL_CHUNK];
        let mut chunks: Vec<ColChunk<'_>> = Vec::new();
        for (c, p) in buf.chunks_mut(COL_CHUNK).enumerate() {
            chunks.push((0, c * COL_CHUNK, p));
        }
        // split for 1, 2, 3 and 5 owners, run on pools of 1, 2 and 3 threads (more ranges than
        // threads: the rest runs on the caller; more threads than ranges: they idle)
        for split in [1usize, 2, 3, 5] {
            let owners = owner_ranges(&chunks, split);
            for threads in [1usize, 2, 3] {
                for forward in [true, false] {
                    let got = in_pool(threads, || {
                        on_owners(&mut chunks, &owners, forward, |(_, c0, p)| {
                            p[0] += 1.0;
                            *c0
                        })
                    });
                    let want: Vec<usize> = (0..7).map(|c| c * COL_CHUNK).collect();
                    assert_eq!(got, want, "split {split} threads {threads}");
                }
            }
        }
        // 4 splits × 3 pools × 2 directions: each chunk incremented 24 times
        assert!(chunks.iter().all(|(_, _, p)| p[0] == 24.0));
    }

    /// One block of `batch` random records of `width` entries.
    fn random_block(seed: u64, batch: usize, width: usize) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..batch).flat_map(|_| row(&mut rng, width, 3)).collect()
    }

    /// The fused kernel on that block, one bound over all records, schedule `sched`.
    fn joint_clip(data: &[f32], batch: usize, width: usize, sched: Schedule) -> Fused {
        let segs = [Seg {
            data,
            width,
            group: 0,
        }];
        fused_with(&segs, batch, 1, BoundMode::Joint(0.3), None, sched).unwrap()
    }

    #[test]
    fn column_pipeline_result_does_not_depend_on_the_thread_count() {
        // 3 column chunks per row: the static split differs with 1, 2 and 3 threads, the
        // result must not (per-chunk sweeps are identical, norms are combined in chunk order)
        let cc = Budgets::here().col_chunk;
        let (batch, width) = (9usize, 2 * cc + 77);
        let data = random_block(12, batch, width);
        for r in [1, 2, 4] {
            let sched = Schedule::Columns(r);
            let run = |threads| in_pool(threads, || joint_clip(&data, batch, width, sched));
            let one = run(1);
            for threads in [2, 3] {
                let other = run(threads);
                assert_eq!(one.sums, other.sums, "{sched:?} threads {threads}");
                assert_eq!(one.norms, other.norms, "{sched:?} threads {threads}");
            }
        }
    }

    #[test]
    fn column_pipeline_runs_nested_inside_the_pool() {
        // calls from inside rayon jobs (several at once, each broadcasting to the whole pool)
        // must neither deadlock nor change the result
        let cc = Budgets::here().col_chunk;
        let (batch, width) = (6usize, 2 * cc + 5);
        let data = random_block(13, batch, width);
        let run = || joint_clip(&data, batch, width, Schedule::Columns(2)).sums;
        let want = in_pool(1, run);
        for threads in [2, 3] {
            let got: Vec<Vec<Vec<f32>>> =
                in_pool(threads, || (0..8).into_par_iter().map(|_| run()).collect());
            assert!(got.iter().all(|g| *g == want), "threads {threads}");
        }
    }

    #[test]
    fn schedule_choice() {
        // the cache model on a machine with 1 MiB L2 per core and a 32 MiB L3
        let b = Budgets::new(32 << 10, 1 << 20, 32 << 20);
        assert_eq!(
            b,
            Budgets {
                l2: 768 << 10,
                row_l3: 8 << 20,
                row_l3_thread: 4 << 20,
                col_l3: 20 << 20,
                col_chunk: 1 << 15,
                prefetch: 1024,
            }
        );
        let schedule = |p, n, t| schedule(p, n, t, &b);
        // 40 KB records: row pipeline, 8 per step (17 records' working set in L2)
        assert_eq!(schedule(10_000, 256, 2), Schedule::Rows(8));
        // 400 KB records: 4 per step (3.6 MB per thread)
        assert_eq!(schedule(100_000, 1024, 2), Schedule::Rows(4));
        // 4 MB records: column pipeline, 2 per step (20 MB shared)
        assert_eq!(schedule(1_000_000, 256, 2), Schedule::Columns(2));
        // too few records for the row pipeline
        assert_eq!(schedule(1000, 3, 2), Schedule::Columns(1));
        assert_eq!(schedule(1000, 9, 2), Schedule::Rows(2));
        assert_eq!(schedule(1000, 9, 8), Schedule::Columns(4));
        // records too large even for two per step
        assert_eq!(schedule(3_000_000, 64, 2), Schedule::Columns(1));
        // more threads: smaller per-thread share of the L3 budget
        assert_eq!(schedule(100_000, 1024, 8), Schedule::Columns(4));
        assert_eq!(schedule(50_000, 1024, 8), Schedule::Rows(2));
        // a machine with 2 MiB L2 and a 260 MiB L3: the per-thread L3 share (32.5 MiB) holds
        // steps of 8 records of 400 KB, and of 2 records of 4 MB
        let big = Budgets::new(48 << 10, 2 << 20, 260 << 20);
        assert_eq!(super::schedule(100_000, 1024, 2, &big), Schedule::Rows(8));
        assert_eq!(super::schedule(1_000_000, 256, 2, &big), Schedule::Rows(2));
        // tiny caches (the generic fallback): chunks never below 4 Ki entries
        assert_eq!(
            Budgets::new(32 << 10, 64 << 10, 64 << 10).col_chunk,
            4 << 10
        );
        // the prefetch distance follows the L1d: L1d / 32 in whole pairs of lines, 256..4096
        for (l1d, want) in [
            (32usize << 10, 1024usize),
            (48 << 10, 1536),
            (64 << 10, 2048),
            (4 << 10, 256),
            (1 << 20, 4096),
            (40 << 10, 1280),
        ] {
            assert_eq!(
                Budgets::new(l1d, 2 << 20, 32 << 20).prefetch,
                want,
                "L1d {l1d}"
            );
        }
    }

    #[test]
    fn candidates_start_with_the_estimate_and_end_with_two_pass() {
        let b = Budgets::new(32 << 10, 1 << 20, 32 << 20);
        for (p, n, t) in [
            (10_000usize, 256usize, 2usize),
            (100_000, 1024, 2),
            (1_000_000, 256, 2),
            (1000, 3, 2),
            (3_000_000, 64, 2),
            (7, 1, 1),
        ] {
            let c = candidates(p, n, t, &b);
            assert_eq!(c[0], schedule(p, n, t, &b));
            assert_eq!(c.last(), Some(&Schedule::TwoPass));
            assert!(c.len() <= 6);
            let mut d = c.clone();
            d.dedup();
            assert_eq!(d.len(), c.len(), "{c:?}");
        }
        // every row pipeline that fits is timed, not only the estimate's: 40 KB records,
        // 128 per thread, all four fit the L2 budget
        assert_eq!(
            candidates(10_000, 256, 2, &b),
            vec![
                Schedule::Rows(8),
                Schedule::Rows(4),
                Schedule::Rows(2),
                Schedule::Rows(1),
                Schedule::Columns(4),
                Schedule::TwoPass
            ]
        );
        // 9 records on 2 threads (5 per thread): r = 2 and r = 1 only
        assert_eq!(
            candidates(1000, 9, 2, &b),
            vec![
                Schedule::Rows(2),
                Schedule::Rows(1),
                Schedule::Columns(4),
                Schedule::TwoPass
            ]
        );
        // row pipelines only with two steps per thread
        assert!(
            candidates(1000, 3, 2, &b)
                .iter()
                .all(|s| !matches!(s, Schedule::Rows(_)))
        );
    }

    #[test]
    fn schedules_print_and_parse() {
        for s in SCHEDULES {
            assert_eq!(s.to_string().parse::<Schedule>().unwrap(), s);
        }
        for bad in [
            "",
            "rows",
            "rows(3)",
            "columns(8)",
            "rows(8",
            "twopass",
            "rows(-1)",
        ] {
            assert!(bad.parse::<Schedule>().is_err(), "{bad}");
        }
    }

    #[test]
    fn log2_buckets() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 0);
        assert_eq!(log2_bucket(64), 6);
        assert_eq!(log2_bucket(90), 6);
        assert_eq!(log2_bucket(91), 7);
        assert_eq!(log2_bucket(1_000_000), 20);
        assert_eq!(log2_bucket(usize::MAX), 64);
    }
}
