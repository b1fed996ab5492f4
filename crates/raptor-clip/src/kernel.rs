//! The fused single-pass clip-and-sum kernel on slices.
//!
//! Layout: a record (example) i consists of one row of each block (block k is a row-major
//! `batch × width_k` matrix). Each block belongs to one group; the squared norm of record i in
//! group g is the sum of the squared norms of its rows in the group's blocks.
//!
//! Schedule (B ≥ 2 × threads, the usual case): the records are split into one contiguous range
//! per rayon thread; each thread keeps a private partial sum per block and, for each record in
//! its range, (1) computes the squared norms of the record's rows (f64 accumulation, 8
//! independent lanes), which brings the rows into cache, then (2) adds factor × row into its
//! partial sums while the rows are still in L2 (or in the 32 MiB L3 for rows of millions of
//! entries). Every gradient byte is read from memory once. The partials are then reduced in
//! parallel over column ranges. With fewer records than 2 × threads, the kernel instead runs
//! two passes parallel over columns (norms, then accumulation), which keeps all threads busy.

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
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
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

multiversion! {
    /// Squared L2 norm with f64 accumulation (8 lanes; LLVM vectorizes it).
    #[inline]
    pub(crate) fn sq_norm(x: &[f32]) -> f64 {
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

/// The clip factor of a (weighted) norm: min(1, C / n), 1 for n = 0.
#[inline]
pub(crate) fn clip_factor(norm: f64, bound: f64) -> f64 {
    if norm > bound { bound / norm } else { 1.0 }
}

/// Per record: from raw per-group squared norms, fill norms / total / factors and check
/// finiteness. `sq` holds the raw (unweighted) squared norms per group.
fn factors_for_record(
    record: usize,
    sq: &[f64],
    weight: f64,
    mode: BoundMode<'_>,
    group_names: &dyn Fn(usize) -> String,
    norms_out: &mut [f64],
    factors_out: &mut [f64],
) -> Result<f64, ClipError> {
    let mut total_sq = 0f64;
    for (g, &s) in sq.iter().enumerate() {
        if !s.is_finite() {
            return Err(ClipError::NonFinite {
                record,
                part: group_names(g),
                value: s,
            });
        }
        total_sq += s;
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

/// Run the fused kernel. Shapes are assumed validated by the caller.
pub(crate) fn fused_clip_sum(
    segs: &[Seg<'_>],
    batch: usize,
    n_groups: usize,
    mode: BoundMode<'_>,
    weights: Option<&[f64]>,
    group_names: &(dyn Fn(usize) -> String + Sync),
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
    if batch >= 2 * threads {
        // Row partition: one contiguous range of records per thread, private partial sums.
        let per = batch.div_ceil(threads);
        let rec_floats: usize = segs.iter().map(|s| s.width).sum();
        let partials: Vec<Result<Vec<Vec<f32>>, ClipError>> = norms
            .par_chunks_mut(per * ng)
            .zip(factors.par_chunks_mut(per * ng))
            .zip(total_norms.par_chunks_mut(per))
            .enumerate()
            .map(|(t, ((norm_c, fac_c), tot_c))| {
                let start = t * per;
                let mut part: Vec<Vec<f32>> = segs.iter().map(|s| vec![0f32; s.width]).collect();
                let mut sq = vec![0f64; ng];
                // Small records: accumulate four at a time (one pass over the partial sum
                // for four rows that are all still in L2).
                let group_rows = if 16 * rec_floats <= (128 << 10) { 4 } else { 1 };
                let n_local = tot_c.len();
                let mut li0 = 0;
                while li0 < n_local {
                    let li1 = (li0 + group_rows).min(n_local);
                    for li in li0..li1 {
                        let i = start + li;
                        sq.iter_mut().for_each(|v| *v = 0.0);
                        for s in segs {
                            sq[s.group] += sq_norm(&s.data[i * s.width..(i + 1) * s.width]);
                        }
                        let w = weights.map_or(1.0, |w| w[i]);
                        tot_c[li] = factors_for_record(
                            i,
                            &sq,
                            w,
                            mode,
                            group_names,
                            &mut norm_c[li * ng..(li + 1) * ng],
                            &mut fac_c[li * ng..(li + 1) * ng],
                        )?;
                    }
                    for (s, p) in segs.iter().zip(part.iter_mut()) {
                        let row = |li: usize| {
                            let i = start + li;
                            &s.data[i * s.width..(i + 1) * s.width]
                        };
                        if li1 - li0 == 4 {
                            let f = |li: usize| fac_c[li * ng + s.group] as f32;
                            let a = [f(li0), f(li0 + 1), f(li0 + 2), f(li0 + 3)];
                            axpy4(p, a, row(li0), row(li0 + 1), row(li0 + 2), row(li0 + 3));
                        } else {
                            for li in li0..li1 {
                                let f = fac_c[li * ng + s.group];
                                if f != 0.0 {
                                    axpy(p, f as f32, row(li));
                                }
                            }
                        }
                    }
                    li0 = li1;
                }
                Ok(part)
            })
            .collect();
        let partials: Vec<Vec<Vec<f32>>> = partials.into_iter().collect::<Result<_, _>>()?;
        // Reduce over column ranges in parallel.
        const COLS: usize = 1 << 14;
        let mut sums: Vec<Vec<f32>> = Vec::with_capacity(segs.len());
        for (k, s) in segs.iter().enumerate() {
            let mut out = vec![0f32; s.width];
            out.par_chunks_mut(COLS).enumerate().for_each(|(c, o)| {
                let lo = c * COLS;
                let len = o.len();
                for p in &partials {
                    add_into(o, &p[k][lo..lo + len]);
                }
            });
            sums.push(out);
        }
        Ok(Fused {
            sums,
            norms,
            total_norms,
            factors,
        })
    } else {
        // Few records: norms parallel over column chunks, then accumulation parallel over
        // column chunks.
        const COLS: usize = 1 << 15;
        let mut sq_all = vec![0f64; batch * ng];
        for i in 0..batch {
            for s in segs {
                let row = &s.data[i * s.width..(i + 1) * s.width];
                let v: f64 = row.par_chunks(COLS).map(sq_norm).sum();
                sq_all[i * ng + s.group] += v;
            }
        }
        for i in 0..batch {
            let w = weights.map_or(1.0, |w| w[i]);
            total_norms[i] = factors_for_record(
                i,
                &sq_all[i * ng..(i + 1) * ng],
                w,
                mode,
                group_names,
                &mut norms[i * ng..(i + 1) * ng],
                &mut factors[i * ng..(i + 1) * ng],
            )?;
        }
        let mut sums: Vec<Vec<f32>> = Vec::with_capacity(segs.len());
        for s in segs {
            let mut out = vec![0f32; s.width];
            out.par_chunks_mut(COLS).enumerate().for_each(|(c, o)| {
                let lo = c * COLS;
                let len = o.len();
                for i in 0..batch {
                    let f = factors[i * ng + s.group];
                    if f != 0.0 {
                        let row = &s.data[i * s.width + lo..i * s.width + lo + len];
                        axpy(o, f as f32, row);
                    }
                }
            });
            sums.push(out);
        }
        Ok(Fused {
            sums,
            norms,
            total_norms,
            factors,
        })
    }
}

/// A STREAM-like read of the same bytes: the parallel sum of all entries (f32 lanes), the
/// physical reference for a kernel that must read every gradient byte once.
pub fn stream_read_sum(data: &[f32]) -> f32 {
    const CH: usize = 1 << 16;
    data.par_chunks(CH).map(lane_sum).sum()
}
