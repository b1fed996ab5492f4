//! Per-example gradient norms and clipped sums for linear layers without materializing
//! per-example gradients (feature `tch`).
//!
//! For a linear layer y = W x (+ b) applied to tokens t = 1..T of record i with activations
//! a_it ∈ R^in and output gradients g_it ∈ R^out, the per-example weight gradient is
//! G_i = Σ_t g_itᵀ a_it ∈ R^{out×in}. Its squared Frobenius norm is, by the ghost identity,
//! ‖G_i‖² = Σ_{t,t'} (a_it·a_it')(g_it·g_it'), which costs ~ B·T²·(in+out) multiply-adds
//! instead of the ~ B·T·in·out of materializing G_i. [`linear_per_example_sq_norms`] picks the
//! cheaper of the two ([`NormMethod::Auto`]). The clipped sum Σ_i c_i G_i is one contraction
//! over the scaled output gradients ("book-keeping"): [`linear_weighted_grad_sum`].
//!
//! Token masks (`[B, T]`, bool or 0/1 float) select the tokens that count: masked tokens
//! contribute nothing (their activations and gradients are replaced by exact zeros, so even
//! non-finite values at padded positions are ignored).
//!
//! Inputs may also be 2-D (`[B, in]`, `[B, out]`): then T = 1.
//!
//! All computation runs on the device of the inputs, in f32 (f64 if either input is f64;
//! half-precision inputs are promoted to f32).

use tch::{Kind, Tensor};

use crate::ClipError;
use crate::tensor::{check_finite_rows, check_weights_tensor};

/// How [`linear_per_example_sq_norms_with`] computes the norms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormMethod {
    /// The cheaper of the two by [`ghost_cost`] vs [`materialized_cost`].
    Auto,
    /// Ghost identity Σ_{t,t'} (a_t·a_t')(g_t·g_t').
    Ghost,
    /// Materialize G_i = Σ_t g_tᵀ a_t and take its Frobenius norm.
    Materialized,
}

/// Multiply-adds of the ghost norm: B·T²·(in+out).
pub fn ghost_cost(batch: i64, tokens: i64, d_in: i64, d_out: i64) -> f64 {
    batch as f64 * (tokens as f64).powi(2) * (d_in + d_out) as f64
}

/// Multiply-adds of materializing per-example gradients: B·T·in·out.
pub fn materialized_cost(batch: i64, tokens: i64, d_in: i64, d_out: i64) -> f64 {
    batch as f64 * tokens as f64 * d_in as f64 * d_out as f64
}

fn shape_err(what: &str, expected: String, got: &[i64]) -> ClipError {
    ClipError::ShapeMismatch {
        what: what.into(),
        expected,
        got: format!("{got:?}"),
    }
}

fn compute_kind(a: Kind, b: Kind) -> Kind {
    if a == Kind::Double || b == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    }
}

/// Bring `x` to 3-D `[B, T, d]`.
fn as_3d(x: &Tensor, what: &str) -> Result<Tensor, ClipError> {
    match x.dim() {
        3 => Ok(x.shallow_clone()),
        2 => Ok(x.f_unsqueeze(1)?),
        _ => Err(shape_err(what, "[B, T, d] or [B, d]".into(), &x.size())),
    }
}

/// Boolean keep-mask `[B, T, 1]` from an optional bool or 0/1 float mask `[B, T]`.
fn keep_mask(mask: Option<&Tensor>, b: i64, t: i64) -> Result<Option<Tensor>, ClipError> {
    let Some(m) = mask else { return Ok(None) };
    let m = if m.dim() == 1 && t == 1 {
        m.f_unsqueeze(1)?
    } else {
        m.shallow_clone()
    };
    if m.size() != [b, t] {
        return Err(shape_err("token_mask", format!("[{b}, {t}]"), &m.size()));
    }
    let keep = if m.kind() == Kind::Bool {
        m
    } else {
        let md = m.f_to_kind(Kind::Double)?;
        let bad = md.f_ne(0.0)?.f_logical_and(&md.f_ne(1.0)?)?;
        if m.numel() > 0 && bad.f_any()?.f_int64_value(&[])? != 0 {
            let nz = bad.f_nonzero()?;
            let value =
                md.f_double_value(&[nz.f_int64_value(&[0, 0])?, nz.f_int64_value(&[0, 1])?])?;
            return Err(ClipError::InvalidMask { value });
        }
        md.f_ne(0.0)?
    };
    Ok(Some(keep.f_unsqueeze(2)?))
}

/// Validate a pair (a, g) and return them as `[B, T, in]`, `[B, T, out]` in the compute kind,
/// with masked tokens zeroed.
fn prepare(
    a: &Tensor,
    g: &Tensor,
    token_mask: Option<&Tensor>,
) -> Result<(Tensor, Tensor), ClipError> {
    let a3 = as_3d(a, "a")?;
    let g3 = as_3d(g, "g")?;
    let (sa, sg) = (a3.size(), g3.size());
    if sa[0] != sg[0] || sa[1] != sg[1] {
        return Err(shape_err(
            "g (leading [B, T] must match a)",
            format!("[{}, {}, out]", sa[0], sa[1]),
            &g.size(),
        ));
    }
    if a.device() != g.device() {
        return Err(ClipError::ShapeMismatch {
            what: "device of g".into(),
            expected: format!("{:?}", a.device()),
            got: format!("{:?}", g.device()),
        });
    }
    let kind = compute_kind(a.kind(), g.kind());
    let mut a3 = a3.f_to_kind(kind)?;
    let mut g3 = g3.f_to_kind(kind)?;
    if let Some(keep) = keep_mask(token_mask, sa[0], sa[1])? {
        let keep = keep.f_to_device(a.device())?;
        let drop = keep.f_logical_not()?;
        a3 = a3.f_masked_fill(&drop, 0.0)?;
        g3 = g3.f_masked_fill(&drop, 0.0)?;
    }
    Ok((a3, g3))
}

fn check_coef(coef: &Tensor, b: i64, kind: Kind) -> Result<Tensor, ClipError> {
    if coef.size() != [b] {
        return Err(shape_err("coef", format!("[{b}]"), &coef.size()));
    }
    let c = coef.f_to_kind(kind)?;
    check_finite_rows(&c, "coef")?;
    Ok(c)
}

/// Per-example squared Frobenius norms of G_i = Σ_t g_itᵀ a_it, shape `[B]`, choosing ghost vs
/// materialized by cost ([`NormMethod::Auto`]).
///
/// `a`: `[B, T, in]`, `g`: `[B, T, out]`, `token_mask`: optional `[B, T]`. Output f32 (f64 if an
/// input is f64). A record with a NaN or infinite entry gets a non-finite squared norm (no
/// error: which record it is is private); [`clip_coefficients`] gives it coefficient 0 and the
/// weighted sums then leave it out.
pub fn linear_per_example_sq_norms(
    a: &Tensor,
    g: &Tensor,
    token_mask: Option<&Tensor>,
) -> Result<Tensor, ClipError> {
    linear_per_example_sq_norms_with(a, g, token_mask, NormMethod::Auto)
}

/// [`linear_per_example_sq_norms`] with an explicit [`NormMethod`].
pub fn linear_per_example_sq_norms_with(
    a: &Tensor,
    g: &Tensor,
    token_mask: Option<&Tensor>,
    method: NormMethod,
) -> Result<Tensor, ClipError> {
    let (a3, g3) = prepare(a, g, token_mask)?;
    let s = a3.size();
    let (b, t, d_in) = (s[0], s[1], s[2]);
    let d_out = g3.size()[2];
    let ghost = match method {
        NormMethod::Ghost => true,
        NormMethod::Materialized => false,
        NormMethod::Auto => ghost_cost(b, t, d_in, d_out) < materialized_cost(b, t, d_in, d_out),
    };
    let sq = if b == 0 {
        Tensor::f_zeros([0], (a3.kind(), a3.device()))?
    } else if ghost {
        let aa = a3.f_bmm(&a3.f_transpose(1, 2)?)?; // [B, T, T]
        let gg = g3.f_bmm(&g3.f_transpose(1, 2)?)?;
        aa.f_mul(&gg)?
            .f_sum_dim_intlist([1i64, 2].as_slice(), false, None::<Kind>)?
            .f_clamp_min(0.0)?
    } else {
        let gi = g3.f_transpose(1, 2)?.f_bmm(&a3)?; // [B, out, in]
        per_record_sq_sums(&gi)?
    };
    Ok(sq)
}

/// Per-record sums of squares: `x` `[B, ...]` → `[B]`, `Σ x²` over all but the first
/// dimension, as the squared 2-norm of each record's entries (one reduction pass, no temporary
/// the size of `x`). A record holding NaN gives NaN, one holding ±inf (and no NaN) +inf.
pub fn per_record_sq_sums(x: &Tensor) -> Result<Tensor, ClipError> {
    let b = x.size().first().copied().unwrap_or(0);
    if b == 0 || x.numel() == 0 {
        return Ok(Tensor::f_zeros([b], (x.kind(), x.device()))?);
    }
    Ok(x.f_reshape([b, -1])?
        .f_linalg_norm(2.0, [1i64].as_slice(), false, None::<Kind>)?
        .f_square()?)
}

/// Σ_i coef_i · G_i as one contraction (einsum "b,bto,bti->oi"), shape `[out, in]`.
///
/// `coef`: `[B]` (typically [`clip_coefficients`]). Masked tokens contribute nothing.
pub fn linear_weighted_grad_sum(
    a: &Tensor,
    g: &Tensor,
    coef: &Tensor,
    token_mask: Option<&Tensor>,
) -> Result<Tensor, ClipError> {
    let (a3, g3) = prepare(a, g, token_mask)?;
    let s = a3.size();
    let d_out = g3.size()[2];
    let c = check_coef(coef, s[0], a3.kind())?.f_to_device(a3.device())?;
    let contract = |a3: &Tensor, g3: &Tensor| -> Result<Tensor, ClipError> {
        let gs = g3.f_mul(&c.f_reshape([-1, 1, 1])?)?;
        Ok(gs
            .f_reshape([-1, d_out])?
            .f_transpose(0, 1)?
            .f_mm(&a3.f_reshape([-1, s[2]])?)?)
    };
    let out = contract(&a3, &g3)?;
    if all_finite(&out)? {
        return Ok(out);
    }
    // 0 · NaN is NaN: leave out the records of coefficient 0 (non-finite records) explicitly.
    contract(&zero_records(&a3, &c)?, &zero_records(&g3, &c)?)
}

/// Whether every entry of `t` is finite.
fn all_finite(t: &Tensor) -> Result<bool, ClipError> {
    Ok(t.numel() == 0 || t.f_isfinite()?.f_all()?.f_int64_value(&[])? != 0)
}

/// `x` (`[B, …]`) with the records whose coefficient in `c` (`[B]`) is 0 set to zero.
fn zero_records(x: &Tensor, c: &Tensor) -> Result<Tensor, ClipError> {
    let mut shape = vec![-1i64];
    shape.extend(std::iter::repeat_n(1, x.dim().saturating_sub(1)));
    let keep = c.f_ne(0.0)?.f_reshape(shape.as_slice())?;
    let zero = Tensor::f_zeros([1], (x.kind(), x.device()))?;
    Ok(x.f_where_self(&keep, &zero)?)
}

fn prepare_bias(g: &Tensor, token_mask: Option<&Tensor>) -> Result<Tensor, ClipError> {
    let g3 = as_3d(g, "g")?;
    let s = g3.size();
    let kind = compute_kind(g.kind(), g.kind());
    let mut g3 = g3.f_to_kind(kind)?;
    if let Some(keep) = keep_mask(token_mask, s[0], s[1])? {
        g3 = g3.f_masked_fill(&keep.f_to_device(g.device())?.f_logical_not()?, 0.0)?;
    }
    Ok(g3)
}

/// Per-example squared norms of the bias gradients Σ_t g_it, shape `[B]`.
pub fn bias_per_example_sq_norms(
    g: &Tensor,
    token_mask: Option<&Tensor>,
) -> Result<Tensor, ClipError> {
    let g3 = prepare_bias(g, token_mask)?;
    let sq = g3
        .f_sum_dim_intlist([1i64].as_slice(), false, None::<Kind>)?
        .f_square()?
        .f_sum_dim_intlist([1i64].as_slice(), false, None::<Kind>)?;
    Ok(sq)
}

/// Σ_i coef_i Σ_t g_it, shape `[out]`.
pub fn bias_weighted_grad_sum(
    g: &Tensor,
    coef: &Tensor,
    token_mask: Option<&Tensor>,
) -> Result<Tensor, ClipError> {
    let g3 = prepare_bias(g, token_mask)?;
    let b = g3.size()[0];
    let c = check_coef(coef, b, g3.kind())?.f_to_device(g3.device())?;
    let contract = |g3: &Tensor| -> Result<Tensor, ClipError> {
        Ok(g3.f_mul(&c.f_reshape([-1, 1, 1])?)?.f_sum_dim_intlist(
            [0i64, 1].as_slice(),
            false,
            None::<Kind>,
        )?)
    };
    let out = contract(&g3)?;
    if all_finite(&out)? {
        return Ok(out);
    }
    contract(&zero_records(&g3, &c)?)
}

/// Clip coefficients from per-example squared norms n_i (`[B]`):
/// c_i = min(1, C / (sqrt(n_i) + tiny)) with tiny = 1e-12, or with weights w_i ∈ [0, 1]
/// (weight-then-clip: the norm of w_i g_i is w_i ‖g_i‖) c_i = w_i · min(1, C / (w_i sqrt(n_i) + tiny)),
/// so that record i contributes c_i · g_i. Computed in f32 (f64 for f64 input; bf16 and f16
/// norms are widened first), on the device of `sq_norms`; the output has that compute dtype, so
/// a coefficient is never rounded up in a short mantissa. A non-finite squared norm (a record
/// with a NaN or infinite gradient entry) gives coefficient 0: the record contributes nothing,
/// which is within any bound, and no error names it.
pub fn clip_coefficients(
    sq_norms: &Tensor,
    bound: f64,
    weights: Option<&Tensor>,
) -> Result<Tensor, ClipError> {
    crate::slice::check_bound("bound", bound)?;
    if sq_norms.dim() != 1 {
        return Err(shape_err("sq_norms", "[B]".into(), &sq_norms.size()));
    }
    let b = sq_norms.size()[0];
    let kind = match sq_norms.kind() {
        Kind::Double => Kind::Double,
        _ => Kind::Float,
    };
    let sq = sq_norms.f_to_kind(kind)?;
    let finite = sq.f_isfinite()?;
    let n = sq.f_clamp_min(0.0)?.f_sqrt()?;
    let f = match weights {
        None => n
            .f_add_scalar(1e-12)?
            .f_reciprocal()?
            .f_mul_scalar(bound)?
            .f_clamp_max(1.0)?,
        Some(w) => {
            let w = check_weights_tensor(w, b, kind)?.f_to_device(sq_norms.device())?;
            let f = n
                .f_mul(&w)?
                .f_add_scalar(1e-12)?
                .f_reciprocal()?
                .f_mul_scalar(bound)?
                .f_clamp_max(1.0)?;
            f.f_mul(&w)?
        }
    };
    // Non-finite records: coefficient 0 (selected, so NaN · w cannot leak through).
    let zero = Tensor::f_zeros([1], (kind, sq_norms.device()))?;
    Ok(f.f_where_self(&finite, &zero)?)
}
