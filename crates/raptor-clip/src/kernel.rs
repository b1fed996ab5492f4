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

/// `y += a · x`.
#[inline]
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
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
        let partials: Vec<Result<Vec<Vec<f32>>, ClipError>> = norms
            .par_chunks_mut(per * ng)
            .zip(factors.par_chunks_mut(per * ng))
            .zip(total_norms.par_chunks_mut(per))
            .enumerate()
            .map(|(t, ((norm_c, fac_c), tot_c))| {
                let start = t * per;
                let mut part: Vec<Vec<f32>> = segs.iter().map(|s| vec![0f32; s.width]).collect();
                let mut sq = vec![0f64; ng];
                for (li, tot) in tot_c.iter_mut().enumerate() {
                    let i = start + li;
                    sq.iter_mut().for_each(|v| *v = 0.0);
                    for s in segs {
                        sq[s.group] += sq_norm(&s.data[i * s.width..(i + 1) * s.width]);
                    }
                    let w = weights.map_or(1.0, |w| w[i]);
                    *tot = factors_for_record(
                        i,
                        &sq,
                        w,
                        mode,
                        group_names,
                        &mut norm_c[li * ng..(li + 1) * ng],
                        &mut fac_c[li * ng..(li + 1) * ng],
                    )?;
                    for (s, p) in segs.iter().zip(part.iter_mut()) {
                        let f = fac_c[li * ng + s.group];
                        if f != 0.0 {
                            axpy(p, f as f32, &s.data[i * s.width..(i + 1) * s.width]);
                        }
                    }
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
                    for (ov, &pv) in o.iter_mut().zip(&p[k][lo..lo + len]) {
                        *ov += pv;
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
    data.par_chunks(CH)
        .map(|c| {
            let mut acc = [0f32; 16];
            let chunks = c.chunks_exact(16);
            let rem = chunks.remainder();
            for x in chunks {
                for j in 0..16 {
                    acc[j] += x[j];
                }
            }
            acc.iter().sum::<f32>() + rem.iter().sum::<f32>()
        })
        .sum()
}
