//! Newton–Schulz orthogonalization (pure Rust, faer matrix products).
//!
//! `f(M)`: orient `M` so that rows ≤ cols (transpose tall matrices), normalize, apply
//! `X ← (d₀ I + Σ_{j≥1} d_j A^j) X` with `A = X Xᵀ` for `steps` iterations, transpose back.
//! Keller Jordan's quintic has `(d₀, d₁, d₂) = (a, b, c)`; the Taylor family `p_κ` is expanded
//! into powers of `A` (see [`NsPolynomial::coefficients_in_a`]).
//!
//! Speed: `A = X Xᵀ` and every power of `A` are symmetric, so only their lower triangle is
//! computed (faer's triangular `matmul` with a `TriangularLower` destination, which dispatches to
//! a lower-triangle-only GEMM kernel), then mirrored. Per step on an `m × n` wide matrix this
//! costs `m²n + (deg−1)m³ + 2m²n` flops instead of `2m²n + 2(deg−1)m³ + 2m²n`.

use faer::linalg::matmul::triangular::{self, BlockStructure};
use faer::{Accum, Mat, MatMut, MatRef, Par};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{MuonError, check_param};

/// Keller Jordan's quintic coefficients `(a, b, c)` (also `torch.optim.Muon`'s defaults).
pub const KELLER_COEFFICIENTS: (f32, f32, f32) = (3.4445, -4.7750, 2.0315);

/// The `eps` of Keller's / torch's normalization `X / (‖X‖_F + eps)`.
pub const KELLER_EPS: f32 = 1e-7;

/// Largest supported Taylor degree κ (the expansion into powers of `A` loses precision beyond).
pub const MAX_KAPPA: usize = 12;

/// Largest supported number of iterations.
pub const MAX_STEPS: usize = 10_000;

/// The matrix polynomial applied at each Newton–Schulz iteration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NsPolynomial {
    /// `X ← aX + (bA + cA²)X` (Keller Jordan's tuned quintic; does not converge to the polar
    /// factor, it pushes singular values into roughly `[0.7, 1.2]`).
    Keller {
        /// Coefficient of `X`.
        a: f32,
        /// Coefficient of `A X`.
        b: f32,
        /// Coefficient of `A² X`.
        c: f32,
    },
    /// `Y ← p_κ(Y Yᵀ) Y` with `p_κ(λ) = Σ_{s≤κ} (2s)!/(4^s (s!)²) (1−λ)^s`, the degree-κ Taylor
    /// polynomial of `λ^{-1/2}` at 1 (converges to the polar factor for singular values in
    /// `(0, √3)` when κ = 1, and in `(0, 1]` for every κ).
    Taylor {
        /// Degree κ ≥ 1.
        kappa: usize,
    },
}

impl NsPolynomial {
    /// Keller's quintic with the standard coefficients.
    pub fn keller() -> Self {
        let (a, b, c) = KELLER_COEFFICIENTS;
        NsPolynomial::Keller { a, b, c }
    }

    /// Coefficients `d_j` such that one iteration is `X ← Σ_j d_j A^j X` (`A = X Xᵀ`).
    ///
    /// ```
    /// use raptor_muon::NsPolynomial;
    /// // p₂(λ) = (15 − 10λ + 3λ²)/8
    /// let d = NsPolynomial::Taylor { kappa: 2 }.coefficients_in_a();
    /// assert!((d[0] - 15.0 / 8.0).abs() < 1e-12);
    /// assert!((d[1] + 10.0 / 8.0).abs() < 1e-12);
    /// assert!((d[2] - 3.0 / 8.0).abs() < 1e-12);
    /// ```
    pub fn coefficients_in_a(&self) -> Vec<f64> {
        match *self {
            NsPolynomial::Keller { a, b, c } => vec![a as f64, b as f64, c as f64],
            NsPolynomial::Taylor { kappa } => {
                let c = taylor_coefficients(kappa);
                // (1−λ)^s = Σ_j C(s, j) (−λ)^j
                let mut d = vec![0.0f64; kappa + 1];
                for (s, &cs) in c.iter().enumerate() {
                    let mut binom = 1.0f64; // C(s, 0)
                    for (j, dj) in d.iter_mut().enumerate().take(s + 1) {
                        let sign = if j % 2 == 0 { 1.0 } else { -1.0 };
                        *dj += cs * binom * sign;
                        binom = binom * (s - j) as f64 / (j + 1) as f64;
                    }
                }
                d
            }
        }
    }

    /// The scalar map one iteration applies to each singular value: `σ ↦ σ·Σ_j d_j σ^{2j}`.
    pub fn apply_scalar(&self, sigma: f64) -> f64 {
        let d = self.coefficients_in_a();
        let l = sigma * sigma;
        let mut acc = 0.0f64;
        for &dj in d.iter().rev() {
            acc = acc * l + dj;
        }
        sigma * acc
    }
}

/// Taylor coefficients `c_s = (2s)!/(4^s (s!)²)` for `s = 0..=kappa` (1, 1/2, 3/8, 5/16, …).
///
/// ```
/// let c = raptor_muon::ns::taylor_coefficients(3);
/// assert_eq!(c, vec![1.0, 0.5, 0.375, 0.3125]);
/// ```
pub fn taylor_coefficients(kappa: usize) -> Vec<f64> {
    let mut c = Vec::with_capacity(kappa + 1);
    let mut cs = 1.0f64;
    c.push(cs);
    for s in 1..=kappa {
        cs = cs * (2 * s - 1) as f64 / (2 * s) as f64; // exact for small s
        c.push(cs);
    }
    c
}

/// How the (oriented) matrix is scaled before the iterations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Normalization {
    /// `X / (‖X‖_F + eps)` (Keller Jordan; torch.optim.Muon clamps instead, `X / max(‖X‖_F, eps)`,
    /// which differs by at most `eps` in the denominator).
    FrobeniusPlusEps {
        /// The additive epsilon (default [`KELLER_EPS`]).
        eps: f32,
    },
    /// `Y / max(1, ‖Y‖_F)` (the DP-Muon analysis; no rescaling when ‖Y‖_F ≤ 1).
    MaxOneFrobenius,
}

/// A complete Newton–Schulz configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NsConfig {
    /// Polynomial applied at each iteration.
    pub polynomial: NsPolynomial,
    /// Number of iterations (`q`).
    pub steps: usize,
    /// Pre-scaling.
    pub normalization: Normalization,
}

impl Default for NsConfig {
    fn default() -> Self {
        Self::keller()
    }
}

impl NsConfig {
    /// torch.optim.Muon's NS: Keller's quintic, 5 steps, `X / (‖X‖_F + 1e-7)`.
    pub fn keller() -> Self {
        NsConfig {
            polynomial: NsPolynomial::keller(),
            steps: 5,
            normalization: Normalization::FrobeniusPlusEps { eps: KELLER_EPS },
        }
    }

    /// The DP-Muon analysis form: `p_κ`, `q` steps, `Y / max(1, ‖Y‖_F)`.
    pub fn taylor(kappa: usize, q: usize) -> Self {
        NsConfig {
            polynomial: NsPolynomial::Taylor { kappa },
            steps: q,
            normalization: Normalization::MaxOneFrobenius,
        }
    }

    /// Check the hyper-parameters.
    pub fn validate(&self) -> Result<(), MuonError> {
        check_param(
            "steps",
            self.steps as f64,
            self.steps <= MAX_STEPS,
            "number of Newton-Schulz steps must be at most 10000",
        )?;
        match self.polynomial {
            NsPolynomial::Keller { a, b, c } => {
                for (name, v) in [("a", a), ("b", b), ("c", c)] {
                    check_param(name, v as f64, v.is_finite(), "coefficient must be finite")?;
                }
            }
            NsPolynomial::Taylor { kappa } => check_param(
                "kappa",
                kappa as f64,
                (1..=MAX_KAPPA).contains(&kappa),
                "Taylor degree must be in 1..=12",
            )?,
        }
        if let Normalization::FrobeniusPlusEps { eps } = self.normalization {
            check_param(
                "eps",
                eps as f64,
                eps > 0.0,
                "normalization eps must be > 0",
            )?;
        }
        Ok(())
    }

    /// The scale factor applied to a matrix of Frobenius norm `norm`.
    pub fn scale_for_norm(&self, norm: f64) -> f64 {
        match self.normalization {
            Normalization::FrobeniusPlusEps { eps } => 1.0 / (norm + eps as f64),
            Normalization::MaxOneFrobenius => 1.0 / norm.max(1.0),
        }
    }

    /// Flop count of one call on a `rows × cols` matrix with the symmetric (one-triangle)
    /// products this crate uses, and with full products (what libtorch does).
    /// Returns `(ours, full)`.
    pub fn flops(&self, rows: usize, cols: usize) -> (f64, f64) {
        let m = rows.min(cols) as f64;
        let n = rows.max(cols) as f64;
        let deg = (self.polynomial.coefficients_in_a().len() - 1) as f64;
        let q = self.steps as f64;
        let ours = q * (m * m * n + (deg - 1.0) * m * m * m + 2.0 * m * m * n);
        let full = q * (2.0 * m * m * n + 2.0 * (deg - 1.0) * m * m * m + 2.0 * m * m * n);
        (ours, full)
    }
}

/// Frobenius norm of a column-major matrix, accumulated in f64.
pub(crate) fn frobenius(x: MatRef<'_, f32>) -> f64 {
    let mut s = 0.0f64;
    for j in 0..x.ncols() {
        for i in 0..x.nrows() {
            let v = x[(i, j)] as f64;
            s += v * v;
        }
    }
    s.sqrt()
}

fn check_finite_mat(what: &'static str, x: MatRef<'_, f32>) -> Result<(), MuonError> {
    for j in 0..x.ncols() {
        for i in 0..x.nrows() {
            let v = x[(i, j)];
            if !v.is_finite() {
                return Err(MuonError::NonFinite {
                    what,
                    index: j * x.nrows() + i,
                    value: v,
                });
            }
        }
    }
    Ok(())
}

/// Copy the lower triangle onto the upper one.
fn mirror_lower(mut a: MatMut<'_, f32>) {
    let m = a.nrows();
    for j in 0..m {
        for i in 0..j {
            a[(i, j)] = a[(j, i)];
        }
    }
}

/// `dst ← lhs · rhs` for a product known to be symmetric: with [`NsProducts::Symmetric`] only
/// the lower triangle is computed, then mirrored; with [`NsProducts::Full`] a plain GEMM.
fn sym_product(
    dst: &mut Mat<f32>,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    products: NsProducts,
    par: Par,
) {
    if products == NsProducts::Full {
        faer::linalg::matmul::matmul(dst.as_mut(), Accum::Replace, lhs, rhs, 1.0f32, par);
        return;
    }
    triangular::matmul(
        dst.as_mut(),
        BlockStructure::TriangularLower,
        Accum::Replace,
        lhs,
        BlockStructure::Rectangular,
        rhs,
        BlockStructure::Rectangular,
        1.0f32,
        par,
    );
    mirror_lower(dst.as_mut());
}

/// Reusable buffers for [`newton_schulz_with`] on a fixed oriented shape `m × n` (`m ≤ n`).
#[derive(Debug, Clone)]
pub struct NsWorkspace {
    a: Mat<f32>,
    t: Mat<f32>,
    u: Mat<f32>,
    y: Mat<f32>,
    /// The accumulated polynomial of the Gram-space iteration (allocated on its first use).
    g: Mat<f32>,
}

impl NsWorkspace {
    /// Buffers for matrices of shape `rows × cols` (either orientation).
    pub fn new(rows: usize, cols: usize) -> Self {
        let m = rows.min(cols);
        let n = rows.max(cols);
        NsWorkspace {
            a: Mat::zeros(m, m),
            t: Mat::zeros(m, m),
            u: Mat::zeros(m, m),
            y: Mat::zeros(m, n),
            g: Mat::new(),
        }
    }

    fn fit(&mut self, m: usize, n: usize) {
        if self.a.nrows() != m || self.y.ncols() != n {
            *self = NsWorkspace::new(m, n);
        }
    }
}

/// `t ← Σ_j d_j A^j` by Horner (`t = d_deg A + d_{deg−1} I`, then `t ← A t + d_j I`), with
/// `u` as scratch.
fn polynomial_of(
    t: &mut Mat<f32>,
    u: &mut Mat<f32>,
    a: &Mat<f32>,
    d: &[f32],
    products: NsProducts,
    par: Par,
) {
    let m = a.nrows();
    let deg = d.len() - 1;
    for jj in 0..m {
        for ii in 0..m {
            t[(ii, jj)] = d[deg] * a[(ii, jj)];
        }
        t[(jj, jj)] += d[deg - 1];
    }
    for j in (0..deg.saturating_sub(1)).rev() {
        sym_product(u, a.as_ref(), t.as_ref(), products, par);
        std::mem::swap(t, u);
        for jj in 0..m {
            t[(jj, jj)] += d[j];
        }
    }
}

/// The coefficients `d_j` of one iteration's polynomial in `A`, in f32.
fn coefficients_f32(cfg: &NsConfig) -> Vec<f32> {
    cfg.polynomial
        .coefficients_in_a()
        .iter()
        .map(|&v| v as f32)
        .collect()
}

/// Run the iterations in place on a wide (`m ≤ n`), already normalized `x`.
fn iterate_wide(x: &mut Mat<f32>, cfg: &NsConfig, ws: &mut NsWorkspace, plan: NsSchedule) {
    let (m, n) = (x.nrows(), x.ncols());
    ws.fit(m, n);
    let par = if plan.parallel {
        Par::rayon(0)
    } else {
        Par::Seq
    };
    if plan.products == NsProducts::Gram {
        iterate_gram(x, cfg, ws, par);
        return;
    }
    let threads = rayon::current_num_threads().min(m);
    if plan.products == NsProducts::Team && plan.parallel && threads > 1 {
        iterate_team(x, cfg, ws, threads);
        return;
    }
    let products = match plan.products {
        NsProducts::Team => NsProducts::Full,
        p => p,
    };
    let d = coefficients_f32(cfg);
    let NsWorkspace { a, t, u, y, .. } = ws;
    for _ in 0..cfg.steps {
        // A = X Xᵀ (lower triangle only, then mirrored).
        sym_product(a, x.as_ref(), x.transpose(), products, par);
        // T = Σ_{j≥0} d_j A^j.
        polynomial_of(t, u, a, &d, products, par);
        // X ← T X.
        faer::linalg::matmul::matmul(
            y.as_mut(),
            Accum::Replace,
            t.as_ref(),
            x.as_ref(),
            1.0f32,
            par,
        );
        std::mem::swap(x, y);
    }
}

/// A barrier for a team of threads that spins (then yields, so that an oversubscribed
/// machine still makes progress) instead of sleeping: waking a sleeping thread costs tens of
/// microseconds, a product of a small Newton–Schulz call not much more.
struct SpinBarrier {
    size: AtomicUsize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    fn new(size: usize) -> Self {
        SpinBarrier {
            size: AtomicUsize::new(size),
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    /// Wait until all `size` threads have called `wait` (the writes each made before it are
    /// visible to all after it).
    fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.size.load(Ordering::Relaxed) {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if spins < raptor_plan::team::PURE_SPINS {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// A column-major f32 buffer shared by a team: each phase writes disjoint column ranges and
/// reads only what the previous phases (before a barrier) wrote.
#[derive(Clone, Copy)]
struct Shared {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    col_stride: isize,
}

// SAFETY: the pointer is only dereferenced through `read` / `cols_mut` inside `iterate_team`,
// whose phases are separated by barriers: within a phase no column is written by two threads,
// and no column that is read is written (see the comments there).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    fn of(m: &mut Mat<f32>) -> Self {
        Shared {
            ptr: m.as_ptr_mut(),
            rows: m.nrows(),
            cols: m.ncols(),
            col_stride: m.col_stride(),
        }
    }

    /// The whole matrix, read-only.
    ///
    /// # Safety
    /// No thread may write it during the phase.
    unsafe fn read<'a>(self) -> MatRef<'a, f32> {
        // SAFETY: the buffer outlives the team (it is borrowed by `iterate_team`'s caller) and
        // the caller guarantees no concurrent writes.
        unsafe { MatRef::from_raw_parts(self.ptr, self.rows, self.cols, 1, self.col_stride) }
    }

    /// Columns `c0..c1`, writable.
    ///
    /// # Safety
    /// No other thread may read or write these columns during the phase.
    unsafe fn cols_mut<'a>(self, c0: usize, c1: usize) -> MatMut<'a, f32> {
        // SAFETY: `c0 ≤ c1 ≤ cols`, so the view stays inside the buffer; exclusivity is the
        // caller's guarantee.
        unsafe {
            MatMut::from_raw_parts_mut(
                self.ptr.offset(c0 as isize * self.col_stride),
                self.rows,
                c1 - c0,
                1,
                self.col_stride,
            )
        }
    }
}

/// Columns of thread `tid`'s share of `n` columns split over `size` threads.
fn share(n: usize, tid: usize, size: usize) -> (usize, usize) {
    (n * tid / size, n * (tid + 1) / size)
}

/// The column blocks of an `m × m` lower triangle that thread `tid` of `size` computes: the
/// columns are cut into `4·size` blocks of (nearly) equal width and dealt out in a serpentine
/// (0, 1, …, size − 1, size − 1, …, 1, 0, 0, 1, …): block k, computed from row `b0` down,
/// costs `(m − b0)·width`, which falls linearly with k, so each thread gets about the same
/// area (a contiguous split of the triangle's columns leaves the last thread a square block
/// whose upper half is wasted work: 1.7× the first thread's at 2 threads).
fn lower_blocks(m: usize, tid: usize, size: usize) -> Vec<(usize, usize)> {
    let size = size.max(1);
    let nb = (4 * size).min(m.max(1));
    (0..nb)
        .filter(|&k| {
            let r = k % (2 * size);
            let owner = if r < size { r } else { 2 * size - 1 - r };
            owner == tid
        })
        .map(|k| (m * k / nb, m * (k + 1) / nb))
        .filter(|(b0, b1)| b1 > b0)
        .collect()
}

/// The lower part of a symmetric product by column blocks: `OUT[b0.., B] = L[b0.., :] ·
/// R[:, B]` for each block `B = b0..b1` of `blocks` (the entries above the diagonal inside
/// `B` come out too; the rest of the upper part is left for a mirror). `R` has `m` columns
/// (`Xᵀ`, `n × m`, or `T`, `m × m`).
///
/// # Safety
/// No other thread may read or write `OUT`'s columns of `blocks` during the call, and nobody
/// may write `L` or `R`.
unsafe fn lower_part(
    out: Shared,
    m: usize,
    blocks: &[(usize, usize)],
    l: MatRef<'_, f32>,
    r: MatRef<'_, f32>,
) {
    for &(b0, b1) in blocks {
        // SAFETY: the caller's guarantee.
        let mut o = unsafe { out.cols_mut(b0, b1) };
        faer::linalg::matmul::matmul(
            o.as_mut().subrows_mut(b0, m - b0),
            Accum::Replace,
            l.subrows(b0, m - b0),
            r.subcols(b0, b1 - b0),
            1.0f32,
            Par::Seq,
        );
    }
}

/// The iterations with products split by output columns over `threads` threads
/// ([`NsProducts::Team`]). Per step: the lower triangle of `A = X Xᵀ` by column shares of
/// equal area; barrier; its upper part mirrored; barrier; `T = p(A)` by Horner steps, each
/// `T ← A T + d_j I` computed as the lower triangle of the same shares (A T is symmetric:
/// T is a polynomial in A), barrier, mirrored, barrier; `Y[:, C'] = T · X[:, C']`; barrier.
/// So the products cost `m²n/2 + (deg − 1)·m³/2 + m²n` multiply-adds per step instead of
/// `(deg − 1)·m³` for the plain Horner steps. Each thread's products run on its own thread
/// (`Par::Seq`): deterministic for a given team size.
fn iterate_team(x: &mut Mat<f32>, cfg: &NsConfig, ws: &mut NsWorkspace, threads: usize) {
    let (m, n) = (x.nrows(), x.ncols());
    let d = coefficients_f32(cfg);
    let deg = d.len() - 1;
    let steps = cfg.steps;
    let NsWorkspace { a, t, u, y, .. } = ws;
    let (sa, st0, su0, sx0, sy0) = (
        Shared::of(a),
        Shared::of(t),
        Shared::of(u),
        Shared::of(x),
        Shared::of(y),
    );
    let barrier = SpinBarrier::new(threads);
    let work = |tid: usize, size: usize| {
        let (mut x, mut y) = (sx0, sy0);
        let (mut t, mut u) = (st0, su0);
        let (e0, e1) = share(n, tid, size);
        let blocks = lower_blocks(m, tid, size);
        // SAFETY (every phase of this closure): this thread writes only its own columns of
        // the output (its blocks, or its share of Y's columns); what it reads is not written
        // in the phase (the barriers order the phases; see the comments of each).
        let lower = |out: Shared, l: MatRef<'_, f32>, r: MatRef<'_, f32>| {
            // SAFETY: see above.
            unsafe { lower_part(out, m, &blocks, l, r) }
        };
        // The upper part of this thread's blocks from the lower parts: M[i, j] = M[j, i] for
        // i < b0 ≤ j (column i's owner wrote rows from its block start, which is ≤ i < j, and
        // writes only rows above that start in this phase).
        let mirror = |mm: Shared| {
            for &(b0, b1) in &blocks {
                let mut c = unsafe { mm.cols_mut(b0, b1) };
                let whole = unsafe { mm.read() };
                for jj in 0..b1 - b0 {
                    for i in 0..b0 {
                        c[(i, jj)] = whole[(b0 + jj, i)];
                    }
                }
            }
        };
        for _ in 0..steps {
            // The lower part of A = X Xᵀ.
            let xr = unsafe { x.read() };
            lower(sa, xr, xr.transpose());
            barrier.wait();
            mirror(sa);
            barrier.wait();
            // T[:, B] = d_deg A[:, B] + d_{deg−1} I[:, B] on the own blocks (A is whole now).
            {
                let ar = unsafe { sa.read() };
                for &(b0, b1) in &blocks {
                    let mut tc = unsafe { t.cols_mut(b0, b1) };
                    for jj in 0..b1 - b0 {
                        for ii in 0..m {
                            tc[(ii, jj)] = d[deg] * ar[(ii, b0 + jj)];
                        }
                        tc[(b0 + jj, jj)] += d[deg - 1];
                    }
                }
            }
            for j in (0..deg.saturating_sub(1)).rev() {
                // T ← A T + d_j I. Every T is a polynomial in A, so A T is symmetric: only its
                // lower part is computed (half the flops of the plain product), then mirrored.
                // This thread reads only its own blocks' columns of T, which are whole.
                let ar = unsafe { sa.read() };
                let tr = unsafe { t.read() };
                lower(u, ar, tr);
                for &(b0, b1) in &blocks {
                    let mut uc = unsafe { u.cols_mut(b0, b1) };
                    for jj in 0..b1 - b0 {
                        uc[(b0 + jj, jj)] += d[j];
                    }
                }
                barrier.wait();
                mirror(u);
                barrier.wait();
                std::mem::swap(&mut t, &mut u);
            }
            if deg < 2 {
                // No Horner product: T's columns were written by their owners only.
                barrier.wait();
            }
            // Y[:, C'] = T X[:, C'] (T whole).
            {
                let xr = unsafe { x.read() };
                faer::linalg::matmul::matmul(
                    unsafe { y.cols_mut(e0, e1) },
                    Accum::Replace,
                    unsafe { t.read() },
                    xr.subcols(e0, e1 - e0),
                    1.0f32,
                    Par::Seq,
                );
            }
            barrier.wait();
            std::mem::swap(&mut x, &mut y);
        }
    };
    // The caller and `threads − 1` workers of raptor-plan's persistent team (started once per
    // process, spinning between calls, so a call pays no thread start or wake-up when calls
    // come back to back). The team may be smaller (busy with another call, or a worker could
    // not be started): every member then sets the barrier to the size it was given — the same
    // value for all — before its first wait, so the barrier counts only the members that run.
    raptor_plan::team::run(threads, |tid, size| {
        barrier.size.store(size, Ordering::Relaxed);
        work(tid, size);
    });
    // The Horner loop swaps T and U an even or odd number of times per step, the same in
    // every thread; the result is in X after an even number of steps, in Y after an odd one.
    if steps % 2 == 1 {
        std::mem::swap(x, y);
    }
}

/// The same iterations in Gram space (for wide matrices, `n` well above `m`): every iterate is
/// `X_k = Q_k X_0` with `Q_k` a polynomial in `A_0 = X_0 X_0ᵀ`, so `A_k = X_k X_kᵀ = Q_k A_0 Q_k`,
/// and with `T_k = p(A_k)`: `Q_{k+1} = T_k Q_k`, `A_{k+1} = T_k A_k T_k`. Only `m × m` products
/// (all of commuting symmetric matrices, so symmetric: one triangle each) until the last,
/// `X_q = Q_q X_0`: `3m²n + (deg + 2)·q·m³` flops instead of `q·(3m²n + (deg − 1)·m³)`.
/// In exact arithmetic the result is the same; in f32 the error of `Q_q` is amplified by its
/// norm (at most `max|p|^q`, see [`NsSchedule::gram_allowed`]).
fn iterate_gram(x: &mut Mat<f32>, cfg: &NsConfig, ws: &mut NsWorkspace, par: Par) {
    let m = x.nrows();
    let products = NsProducts::Symmetric;
    let d = coefficients_f32(cfg);
    let NsWorkspace { a, t, u, y, g } = ws;
    if g.nrows() != m || g.ncols() != m {
        *g = Mat::zeros(m, m);
    }
    sym_product(a, x.as_ref(), x.transpose(), products, par);
    for k in 0..cfg.steps {
        polynomial_of(t, u, a, &d, products, par);
        if k == 0 {
            g.copy_from(t.as_ref());
        } else {
            sym_product(u, t.as_ref(), g.as_ref(), products, par);
            std::mem::swap(g, u);
        }
        if k + 1 < cfg.steps {
            // A ← T A T (T and A commute).
            sym_product(u, t.as_ref(), a.as_ref(), products, par);
            sym_product(a, u.as_ref(), t.as_ref(), products, par);
        }
    }
    if cfg.steps > 0 {
        faer::linalg::matmul::matmul(
            y.as_mut(),
            Accum::Replace,
            g.as_ref(),
            x.as_ref(),
            1.0f32,
            par,
        );
        std::mem::swap(x, y);
    }
}

/// Newton–Schulz orthogonalization of a faer matrix (any orientation). Returns `f(M)`.
///
/// ```
/// use faer::Mat;
/// use raptor_muon::{NsConfig, newton_schulz};
/// let m = Mat::<f32>::from_fn(3, 5, |i, j| (i as f32 + 1.0) * 0.1 + if i == j { 1.0 } else { 0.0 });
/// let o = newton_schulz(m.as_ref(), &NsConfig::taylor(2, 30)).unwrap();
/// // O Oᵀ ≈ I (the polar factor of M)
/// let g = &o * o.transpose();
/// for i in 0..3 { for j in 0..3 {
///     let want = if i == j { 1.0 } else { 0.0 };
///     assert!((g[(i, j)] - want).abs() < 1e-4);
/// }}
/// ```
pub fn newton_schulz(m: MatRef<'_, f32>, cfg: &NsConfig) -> Result<Mat<f32>, MuonError> {
    let mut ws = NsWorkspace::new(m.nrows(), m.ncols());
    newton_schulz_with(m, cfg, &mut ws)
}

/// [`newton_schulz`] with caller-provided buffers (no `m × m` allocations per call).
///
/// The schedule (symmetric or plain products, parallel or sequential) is planned per shape
/// class, see [`NsSchedule`].
pub fn newton_schulz_with(
    m: MatRef<'_, f32>,
    cfg: &NsConfig,
    ws: &mut NsWorkspace,
) -> Result<Mat<f32>, MuonError> {
    let (x, tall) = prepare(m, cfg)?;
    let (mm, nn) = (x.nrows(), x.ncols());
    let threads = rayon::current_num_threads().max(1);
    if let Some(plan) = known_ns_schedule(mm, nn, cfg, threads) {
        return Ok(finish(run_plan(x, cfg, ws, plan), tall));
    }
    let key = ns_key(mm, nn, cfg, threads);
    if raptor_plan::mode() == raptor_plan::PlanMode::Estimate {
        let plan = NsSchedule::estimate(mm, nn, threads);
        return Ok(finish(run_plan(x, cfg, ws, plan), tall));
    }
    let cands = NsSchedule::candidates(mm, nn, threads, cfg);
    if cands.iter().any(|c| c.products == NsProducts::Team) {
        // Start the team's workers now, so that no timed call pays their start-up.
        raptor_plan::team::run(threads, |_, _| {});
    }
    // Two interleaved rounds at least (the first run of a candidate may pay for cold caches),
    // six runs in all at least: 2 to 4 candidates → 6 to 8 calls; more whole rounds while
    // planning has taken less than `DEFAULT_EXTRA_TIME` (small matrices: a few ms per call).
    let measured = raptor_plan::measure_within(
        &cands,
        (2 * cands.len()).max(6),
        raptor_plan::DEFAULT_EXTRA_TIME,
        |&plan| Ok::<_, MuonError>(run_plan(x.clone(), cfg, ws, plan)),
    )?;
    let out = match measured {
        Some(mres) => {
            raptor_plan::remember(&key, &cands[mres.winner].to_string());
            mres.output
        }
        None => run_plan(x, cfg, ws, NsSchedule::estimate(mm, nn, threads)),
    };
    Ok(finish(out, tall))
}

/// Validate, orient wide (transpose a tall matrix) and normalize: returns `(x, tall)`.
fn prepare(m: MatRef<'_, f32>, cfg: &NsConfig) -> Result<(Mat<f32>, bool), MuonError> {
    cfg.validate()?;
    let (r, c) = (m.nrows(), m.ncols());
    if r == 0 || c == 0 {
        return Err(MuonError::EmptyMatrix { rows: r, cols: c });
    }
    check_finite_mat("newton_schulz input", m)?;
    let tall = r > c;
    let mut x: Mat<f32> = if tall {
        m.transpose().to_owned()
    } else {
        m.to_owned()
    };
    let scale = cfg.scale_for_norm(frobenius(x.as_ref())) as f32;
    for j in 0..x.ncols() {
        for v in x.col_as_slice_mut(j) {
            *v *= scale;
        }
    }
    Ok((x, tall))
}

fn run_plan(mut x: Mat<f32>, cfg: &NsConfig, ws: &mut NsWorkspace, plan: NsSchedule) -> Mat<f32> {
    iterate_wide(&mut x, cfg, ws, plan);
    x
}

fn finish(x: Mat<f32>, tall: bool) -> Mat<f32> {
    if tall { x.transpose().to_owned() } else { x }
}

/// How the products of a Newton–Schulz call are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NsProducts {
    /// The symmetric products (`A = X Xᵀ`, powers of `A`) by faer's lower-triangle kernel,
    /// then mirrored: fewer flops, best on large matrices.
    Symmetric,
    /// Plain GEMMs for every product: more flops but faer's fastest kernel, often better on
    /// small matrices.
    Full,
    /// The iterations in Gram space: `m × m` symmetric products only, then one `m × m` by
    /// `m × n` product at the end (fewer flops when `n` is well above `m`, e.g. half at
    /// 768×3072 with Keller's 5 steps). Agrees with the others within a looser f32 tolerance
    /// (see [`NsSchedule`]), and is only a candidate where [`NsSchedule::gram_allowed`].
    Gram,
    /// Plain GEMMs split by output columns over a team of threads (the caller and
    /// `threads − 1` workers of [`raptor_plan::team`], started once per process and spinning
    /// between calls) that wait for each other by spinning between products: no thread
    /// start-up and, for calls back to back, no wake-up, instead of one pool wake-up per
    /// product, which pays on small matrices (15 products of a 256×256 Keller call take
    /// ~0.2 ms each). The column split follows the team size the call gets (the requested
    /// threads, or 1 when the team is busy with another call), and the result is
    /// deterministic for a given size. Only
    /// with `parallel` (sequentially it is [`NsProducts::Full`]); a candidate with two or
    /// more threads while the matrix takes at most a quarter of the last-level cache.
    Team,
}

/// A Newton–Schulz schedule: the kind of products and whether each product runs on the rayon
/// pool (faer `Par::rayon`) or on the calling thread.
///
/// Planned like the clip kernels ([`raptor_plan`]): per shape class (oriented `m × n`, each
/// rounded to the nearest power of two, polynomial degree, steps, pool threads) the
/// [`candidates`](NsSchedule::candidates) are timed on the first call's data and the fastest
/// is remembered (and saved with `RAPTOR_WISDOM`); `RAPTOR_PLAN=estimate` takes
/// [`estimate`](NsSchedule::estimate) without timing; [`with_ns_schedule`] forces one.
///
/// Results: the `sym` and `full` schedules agree within f32 rounding of the products
/// (symmetric products are exactly symmetric, plain GEMMs up to rounding; measured differences
/// ≲ 1e-5 relative to the result's largest entry after 5 Keller steps, tested below 1e-4).
/// The Gram-space schedule (`gram`) computes the same polynomial of the input in another order,
/// whose f32 error grows with the iteration's gain on small singular values: measured up to
/// 2e-4 of the largest entry on ill-conditioned inputs (a 10⁶ spread of singular values, a
/// rank-8 matrix plus 10⁻⁴ noise), tested below 1e-3 against an f64 reference (the others:
/// below 1e-4); it is offered only where that gain is bounded ([`NsSchedule::gram_allowed`]).
/// A given schedule is deterministic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NsSchedule {
    /// Kind of products.
    pub products: NsProducts,
    /// Products on the rayon pool (`true`) or on the calling thread.
    pub parallel: bool,
}

impl std::fmt::Display for NsSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = match self.products {
            NsProducts::Symmetric => "sym",
            NsProducts::Full => "full",
            NsProducts::Gram => "gram",
            NsProducts::Team => "team",
        };
        let q = if self.parallel { "par" } else { "seq" };
        write!(f, "{p}/{q}")
    }
}

impl std::str::FromStr for NsSchedule {
    type Err = MuonError;

    /// Parse the `Display` form: `sym/par`, `sym/seq`, `full/par`, `full/seq`, `gram/par`,
    /// `gram/seq`, `team/par` (`team/seq` is read too and runs as `full/seq`).
    fn from_str(s: &str) -> Result<Self, MuonError> {
        let (p, q) = s
            .split_once('/')
            .ok_or_else(|| MuonError::InvalidSchedule {
                value: s.to_string(),
            })?;
        let products = match p {
            "sym" => NsProducts::Symmetric,
            "full" => NsProducts::Full,
            "gram" => NsProducts::Gram,
            "team" => NsProducts::Team,
            _ => {
                return Err(MuonError::InvalidSchedule {
                    value: s.to_string(),
                });
            }
        };
        let parallel = match q {
            "par" => true,
            "seq" => false,
            _ => {
                return Err(MuonError::InvalidSchedule {
                    value: s.to_string(),
                });
            }
        };
        Ok(NsSchedule { products, parallel })
    }
}

impl NsSchedule {
    /// The cache-model estimate: symmetric products; on the pool when one product's operands
    /// (`m·n` f32) exceed one core's L2 and there is more than one thread.
    pub fn estimate(m: usize, n: usize, threads: usize) -> Self {
        let l2 = raptor_plan::machine().l2_bytes;
        NsSchedule {
            products: NsProducts::Symmetric,
            parallel: threads > 1 && m.saturating_mul(n).saturating_mul(4) > l2,
        }
    }

    /// The schedules worth timing for an oriented `m × n` matrix under `cfg`, the estimate
    /// first: both kinds of products, parallel; sequential too while the matrix takes at most
    /// a quarter of the last-level cache (beyond, one core is not faster than all of them);
    /// and the Gram-space iteration the same way where [`Self::gram_allowed`].
    pub fn candidates(m: usize, n: usize, threads: usize, cfg: &NsConfig) -> Vec<Self> {
        let est = Self::estimate(m, n, threads);
        let mut v = vec![est];
        let l3 = raptor_plan::machine().l3_bytes;
        let seq_ok = threads <= 1 || m.saturating_mul(n).saturating_mul(4) <= l3 / 4;
        let mut kinds = vec![NsProducts::Symmetric, NsProducts::Full];
        if Self::gram_allowed(m, n, cfg) {
            kinds.push(NsProducts::Gram);
        }
        if threads > 1 && seq_ok {
            v.push(NsSchedule {
                products: NsProducts::Team,
                parallel: true,
            });
        }
        for products in kinds {
            for parallel in [true, false] {
                let s = NsSchedule { products, parallel };
                if ((parallel && threads > 1) || (!parallel && seq_ok)) && !v.contains(&s) {
                    v.push(s);
                }
            }
        }
        v
    }

    /// Whether the Gram-space iteration is worth offering for an oriented `m × n` matrix
    /// (`m ≤ n`) under `cfg`: its flop count is at most 85 % of the symmetric products' (which
    /// needs `n` about 1.5 `m` or more), there are at most 8 steps (the round-off of the
    /// propagated `A_k` compounds from step to step), and the iteration's gain on small
    /// singular values, bounded by `max |p(λ)|^q` over `λ ∈ [0, 1.5]` (the squared singular
    /// values the normalized iterates reach), is at most 2⁹, so that f32 round-off in the
    /// accumulated polynomial stays near 2⁹·2⁻²⁴ ≈ 3e-5 (Keller's 5 steps: 3.44⁵ ≈ 487;
    /// 6 steps are refused; so is a long Taylor iteration, whose gain on a singular value σ
    /// grows like 1/σ).
    pub fn gram_allowed(m: usize, n: usize, cfg: &NsConfig) -> bool {
        let (m, n) = (m.min(n), m.max(n));
        if m == 0 || cfg.steps == 0 || cfg.steps > 8 {
            return false;
        }
        let d = cfg.polynomial.coefficients_in_a();
        let deg = (d.len() - 1) as f64;
        let q = cfg.steps as f64;
        let (mf, nf) = (m as f64, n as f64);
        let (sym, _) = cfg.flops(m, n);
        let gram = 3.0 * mf * mf * nf + ((deg - 1.0) * q + 3.0 * (q - 1.0)) * mf * mf * mf;
        if gram > 0.85 * sym {
            return false;
        }
        let mut max_p = 0.0f64;
        for i in 0..=150 {
            let l = i as f64 / 100.0;
            let p = d.iter().rev().fold(0.0f64, |acc, &dj| acc * l + dj);
            max_p = max_p.max(p.abs());
        }
        max_p.powf(q) <= 512.0
    }
}

thread_local! {
    static NS_FORCED: std::cell::Cell<Option<NsSchedule>> = const { std::cell::Cell::new(None) };
}

/// Run `f` with every Newton–Schulz call on this thread (and the per-matrix calls of
/// [`newton_schulz_batch`] it makes) using schedule `s`: no planning, nothing remembered.
pub fn with_ns_schedule<T>(s: NsSchedule, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<NsSchedule>);
    impl Drop for Restore {
        fn drop(&mut self) {
            NS_FORCED.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(NS_FORCED.with(|c| c.replace(Some(s))));
    f()
}

/// `round(log2(n))`.
fn log2_bucket(n: usize) -> u32 {
    if n <= 1 {
        return 0;
    }
    let fl = usize::BITS - 1 - n.leading_zeros();
    fl + u32::from((n as u128) * (n as u128) >= 1u128 << (2 * fl + 1))
}

/// The wisdom key of an oriented `m × n` call.
fn ns_key(m: usize, n: usize, cfg: &NsConfig, threads: usize) -> String {
    let deg = cfg.polynomial.coefficients_in_a().len() - 1;
    format!(
        "ns m2^{} n2^{} d{deg} q{} t{threads}",
        log2_bucket(m),
        log2_bucket(n),
        cfg.steps
    )
}

fn known_ns_schedule(m: usize, n: usize, cfg: &NsConfig, threads: usize) -> Option<NsSchedule> {
    if let Some(s) = NS_FORCED.with(|c| c.get()) {
        return Some(s);
    }
    raptor_plan::lookup(&ns_key(m, n, cfg, threads)).and_then(|c| c.parse().ok())
}

/// The schedule a call on a `rows × cols` matrix would run now without timing (the forced
/// one, else the remembered one), or `None` (the next call plans).
pub fn planned_ns_schedule(rows: usize, cols: usize, cfg: &NsConfig) -> Option<NsSchedule> {
    let threads = rayon::current_num_threads().max(1);
    known_ns_schedule(rows.min(cols), rows.max(cols), cfg, threads)
}

/// Newton–Schulz of many matrices (e.g. a Muon step over the layers), sharing the work across
/// the rayon pool: when there are at least as many matrices as threads, each thread
/// orthogonalizes whole matrices with sequential products (no synchronization inside a
/// product); otherwise they run one by one ([`newton_schulz`], planned). In the first case the
/// kind of products is planned for one thread (the first call of a shape class times both
/// kinds on the first matrix, sequentially).
///
/// The result equals one-by-one [`newton_schulz`] calls with the same schedule bitwise
/// (tested); with planned schedules, within the tolerance of [`NsSchedule`].
///
/// ```
/// use faer::Mat;
/// use raptor_muon::{NsConfig, newton_schulz_batch};
/// let a = Mat::<f32>::from_fn(4, 6, |i, j| ((i * 7 + j * 3) % 5) as f32 - 2.0);
/// let b = Mat::<f32>::from_fn(6, 4, |i, j| ((i + 2 * j) % 3) as f32 - 1.0);
/// let out = newton_schulz_batch(&[a.as_ref(), b.as_ref()], &NsConfig::keller())?;
/// assert_eq!((out[1].nrows(), out[1].ncols()), (6, 4));
/// # Ok::<(), raptor_muon::MuonError>(())
/// ```
pub fn newton_schulz_batch(
    mats: &[MatRef<'_, f32>],
    cfg: &NsConfig,
) -> Result<Vec<Mat<f32>>, MuonError> {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads().max(1);
    if mats.len() < 2 || threads < 2 || mats.len() < threads {
        return mats.iter().map(|m| newton_schulz(*m, cfg)).collect();
    }
    let forced = NS_FORCED.with(|c| c.get());
    if forced.is_none() && raptor_plan::mode() == raptor_plan::PlanMode::Measure {
        // Plan the sequential products of the first matrix's shape class if not known yet.
        let (x, _) = prepare(mats[0], cfg)?;
        let (mm, nn) = (x.nrows(), x.ncols());
        let key = ns_key(mm, nn, cfg, 1);
        if raptor_plan::lookup(&key).is_none() {
            let mut kinds = vec![NsProducts::Symmetric, NsProducts::Full];
            if NsSchedule::gram_allowed(mm, nn, cfg) {
                kinds.push(NsProducts::Gram);
            }
            let cands: Vec<NsSchedule> = kinds
                .into_iter()
                .map(|products| NsSchedule {
                    products,
                    parallel: false,
                })
                .collect();
            let mut ws = NsWorkspace::new(mm, nn);
            let measured = raptor_plan::measure(&cands, 2 * cands.len(), |&plan| {
                Ok::<_, MuonError>(run_plan(x.clone(), cfg, &mut ws, plan))
            })?;
            if let Some(mres) = measured {
                raptor_plan::remember(&key, &cands[mres.winner].to_string());
            }
        }
    }
    mats.par_iter()
        .map(|m| {
            let (x, tall) = prepare(*m, cfg)?;
            let (mm, nn) = (x.nrows(), x.ncols());
            let products = match forced {
                Some(s) => s.products,
                None => raptor_plan::lookup(&ns_key(mm, nn, cfg, 1))
                    .and_then(|c| c.parse::<NsSchedule>().ok())
                    .map_or(NsProducts::Symmetric, |s| s.products),
            };
            let plan = NsSchedule {
                products,
                parallel: false,
            };
            let mut ws = NsWorkspace::new(mm, nn);
            Ok(finish(run_plan(x, cfg, &mut ws, plan), tall))
        })
        .collect()
}

/// Newton–Schulz on a row-major `rows × cols` slice. Returns `f(M)` row-major.
///
/// ```
/// use raptor_muon::{NsConfig, newton_schulz_slice};
/// let m = vec![2.0f32, 0.0, 0.0, 0.5]; // diag(2, 0.5)
/// let o = newton_schulz_slice(&m, 2, 2, &NsConfig::taylor(2, 40)).unwrap();
/// assert!((o[0] - 1.0).abs() < 1e-5 && (o[3] - 1.0).abs() < 1e-5);
/// ```
pub fn newton_schulz_slice(
    data: &[f32],
    rows: usize,
    cols: usize,
    cfg: &NsConfig,
) -> Result<Vec<f32>, MuonError> {
    crate::error::check_shape("newton_schulz input", data.len(), rows, cols)?;
    // A row-major rows×cols buffer is the column-major cols×rows matrix Mᵀ, and
    // f(Mᵀ) = f(M)ᵀ, so the column-major result is f(M) in row-major order.
    let mt = MatRef::from_column_major_slice(data, cols, rows);
    let o = newton_schulz(mt, cfg)?;
    Ok(to_col_major_vec(o.as_ref()))
}

/// Column-major contents of a matrix.
pub(crate) fn to_col_major_vec(x: MatRef<'_, f32>) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.nrows() * x.ncols());
    for j in 0..x.ncols() {
        for i in 0..x.nrows() {
            out.push(x[(i, j)]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lower-part column blocks of every thread cover 0..m exactly once, and the rows
    /// each thread computes (block from its start down) are balanced: within 30 % of an even
    /// split wherever every thread has at least 4 blocks of 8 or more columns, and never above
    /// the contiguous split's worst share (what the blocks replaced). Plain column shares
    /// cover 0..n without gaps.
    #[test]
    fn lower_blocks_cover_the_columns_once_and_balance_the_work() {
        for m in [1usize, 2, 7, 64, 255, 256, 768, 1000] {
            for size in [1usize, 2, 3, 5, 8] {
                let mut seen = vec![0u32; m];
                let mut work = Vec::new();
                for tid in 0..size {
                    let mut w = 0usize;
                    for (b0, b1) in lower_blocks(m, tid, size) {
                        assert!(b0 < b1 && b1 <= m, "m {m} size {size}: {b0}..{b1}");
                        for c in &mut seen[b0..b1] {
                            *c += 1;
                        }
                        w += (m - b0) * (b1 - b0);
                    }
                    work.push(w as f64);
                }
                assert!(seen.iter().all(|&c| c == 1), "m {m} size {size}: {seen:?}");
                let total: f64 = work.iter().sum();
                let max = work.iter().cloned().fold(0.0, f64::max);
                if m >= 32 * size {
                    assert!(
                        max <= 1.3 * total / size as f64,
                        "m {m} size {size}: {work:?}"
                    );
                }
                // The contiguous equal-area split's largest share of computed rows.
                let mut contiguous = 0f64;
                let (mut c, mut area) = (0usize, 0f64);
                let half = (m * (m + 1) / 2) as f64;
                let mut starts = vec![0usize];
                for k in 1..size {
                    while c < m && area < half * k as f64 / size as f64 {
                        area += (m - c) as f64;
                        c += 1;
                    }
                    starts.push(c);
                }
                starts.push(m);
                for k in 0..size {
                    let (s0, s1) = (starts[k], starts[k + 1]);
                    contiguous = contiguous.max(((m - s0) * (s1 - s0)) as f64);
                }
                assert!(max <= contiguous.max(1.0) + m as f64, "m {m} size {size}");
                assert_eq!(share(m, 0, size).0, 0);
                assert_eq!(share(m, size - 1, size).1, m);
                for k in 1..size {
                    assert_eq!(share(m, k, size).0, share(m, k - 1, size).1);
                }
            }
        }
    }
}
