//! Unit tests of the engine's internals (chunking, padding, the norm forms and the cache);
//! whole models against single-record loops are in the crate's integration tests.

use super::clip::{ClipOutput, ClipPolicy, ParamGroups, clip_factors};
use super::site::{GradSite, compute_kind, pad_rows, prep, with_cpu_slice};
use super::{EngineLimits, PerSampleGrads};
use crate::error::{ModelError, Result};
use crate::tape::{Part, Rows};
use raptor_clip::routed::ragged_cost;
use std::cell::RefCell;
use std::collections::BTreeMap;
use tch::{Kind, Tensor};

fn site(g: Tensor, offsets: Option<Vec<i64>>) -> GradSite {
    GradSite {
        rows: Rows::Dense,
        parts: vec![],
        g,
        offsets,
    }
}

/// Tokens per record (which sizes the record chunks of the norm pass, so bounds its
/// temporaries): T of a dense `[B, T, out]` gradient, 1 for `[B, out]`, the largest
/// record's row count of a routed site (at least 1).
#[test]
fn tokens_per_record_of_dense_and_routed_sites() -> Result<()> {
    let z = |sz: &[i64]| Tensor::f_zeros(sz, (Kind::Float, tch::Device::Cpu));
    assert_eq!(site(z(&[3, 5, 7])?, None).tokens(), 5);
    assert_eq!(site(z(&[4, 6, 2, 7])?, None).tokens(), 12);
    assert_eq!(site(z(&[3, 7])?, None).tokens(), 1);
    assert_eq!(site(z(&[0, 5, 7])?, None).tokens(), 1);
    assert_eq!(site(z(&[3, 5, 7])?, None).out_dim(), 7);
    // routed: records own rows 0..2, 2..2 (none), 2..6
    let routed = site(z(&[6, 7])?, Some(vec![0, 2, 2, 6]));
    assert_eq!(routed.tokens(), 4);
    assert_eq!(site(z(&[0, 7])?, Some(vec![0, 0, 0])).tokens(), 1);
    assert_eq!(site(z(&[0, 7])?, Some(vec![0])).tokens(), 1);
    Ok(())
}

/// `chunk` of a routed site: each record's rows zero-padded to the chunk's largest count,
/// the same from the CPU copy (f32, f64) and from libtorch's generic path (other dtypes,
/// and every dtype off the CPU), for chunks that start past record 0 and empty ones.
#[test]
fn routed_chunks_are_padded_alike_on_both_paths() -> Result<()> {
    // records own rows 0..2, 2..2 (none), 2..5, 5..6 of a [6, 2] row block
    let offsets = vec![0i64, 2, 2, 5, 6];
    let vals: Vec<f32> = (1..=12).map(|v| v as f32).collect();
    let x32 = Tensor::from_slice(&vals).reshape([6, 2]);
    let s = site(x32.shallow_clone(), Some(offsets));
    // the expected padded values, by hand: (r0, n) -> [n, tmax, 2]
    let want = |r0: i64, n: i64| -> Vec<f32> {
        let rows: [&[f32]; 4] = [&vals[0..4], &[], &vals[4..10], &vals[10..12]];
        let tmax = (r0..r0 + n)
            .map(|r| rows[r as usize].len() / 2)
            .max()
            .unwrap_or(1)
            .max(1);
        let mut v = Vec::new();
        for r in r0..r0 + n {
            let row = rows[r as usize];
            v.extend_from_slice(row);
            v.extend(std::iter::repeat_n(0.0, 2 * tmax - row.len()));
        }
        v
    };
    for (r0, n) in [(0i64, 4i64), (1, 3), (2, 2), (1, 1), (3, 1), (0, 2)] {
        for kind in [Kind::Float, Kind::Double, Kind::Half, Kind::BFloat16] {
            let x = x32.f_to_kind(kind)?;
            let got = s.chunk(&x, r0, n)?;
            assert_eq!(got.kind(), kind);
            let sz = got.size();
            assert_eq!((sz[0], sz[2]), (n, 2), "{kind:?} {r0} {n}");
            let got: Vec<f32> = Vec::try_from(got.f_to_kind(Kind::Float)?.f_flatten(0, -1)?)?;
            assert_eq!(got, want(r0, n), "{kind:?} records {r0}..{}", r0 + n);
        }
    }
    Ok(())
}

/// `routed_sq_norms` takes a routed site only in its fast form (f32 engine, 2-D f32 CPU
/// rows and gradients) and declines (`None`: the generic path runs) anything else, each
/// condition on its own; where it runs, its norms are those of the per-record loop, for a
/// chunk from record 0 and one further in, and it materializes (keeping the gradients in
/// the cache) exactly when `ragged_cost` says that is less work and the cache admits them.
#[test]
fn routed_norms_take_the_fast_form_only_and_choose_by_cost() -> Result<()> {
    let f = Kind::Float;
    // records own rows 0..1, none, 1..3, 3..4 (wide: ghost) or 0..9, none, 9..20, 20..30
    // (narrow: materialize)
    let (w_off, n_off) = ([0i64, 1, 1, 3, 4], [0i64, 9, 9, 20, 30]);
    let (wa, wg) = (randn(&[4, 40], f), randn(&[4, 48], f));
    let (na, ng) = (randn(&[30, 3], f), randn(&[30, 2], f));
    let wide = routed_site(&w_off, &wa, &wg, "wide");
    let narrow = routed_site(&n_off, &na, &ng, "narrow");
    // "mid": 5 rows for three of four records of a 4 → 4 weight, a ghost case that counting
    // rows from the offsets themselves (rather than their differences) would turn into a
    // materializing one.
    let m_off = [0i64, 5, 5, 10, 15];
    let (ma, mg) = (randn(&[15, 4], f), randn(&[15, 4], f));
    let mid = routed_site(&m_off, &ma, &mg, "mid");
    let (g_true, m_true) = ragged_cost(&[5, 0, 5, 5], 4, 4);
    let (g_cum, m_cum) = ragged_cost(&[5, 10, 15, 25], 4, 4);
    assert!(
        g_true < m_true && m_cum < g_cum,
        "precondition: mid sits between the two"
    );
    let a_of = |s: &GradSite| match &s.parts[0] {
        Part::Weight { a, .. } => a.shallow_clone(),
        _ => Tensor::new(),
    };
    // ‖Σ_{rows of r} g aᵀ‖² per record in f64, records r0..r0+n.
    let slow = |s: &GradSite, r0: usize, n: usize| -> Result<Vec<f64>> {
        let off = s.offsets.clone().unwrap_or_default();
        per_record_grads(&a_of(s), &s.g, &off)?[r0..r0 + n]
            .iter()
            .map(|t| Ok(t.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?))
            .collect()
    };
    let cached = |e: &PerSampleGrads, p: &str| {
        e.cache
            .borrow()
            .as_ref()
            .is_some_and(|c| c.grads.contains_key(p))
    };
    let e = engine(
        4,
        vec![
            routed_site(&w_off, &wa, &wg, "wide"),
            routed_site(&n_off, &na, &ng, "narrow"),
            routed_site(&m_off, &ma, &mg, "mid"),
        ],
        1 << 20,
    );
    e.start_cache();
    for (s, p, materialized) in [
        (&wide, "wide", false),
        (&narrow, "narrow", true),
        (&mid, "mid", false),
    ] {
        for (r0, n) in [(0usize, 4usize), (2, 2)] {
            let got = e
                .routed_sq_norms(p, s, &a_of(s), r0 as i64, n as i64)?
                .ok_or_else(|| ModelError::InvalidConfig(format!("{p}: declined")))?;
            let got: Vec<f64> = Vec::try_from(got.f_to_kind(Kind::Double)?)?;
            let want = slow(s, r0, n)?;
            assert_eq!(got.len(), n);
            for (x, y) in got.iter().zip(&want) {
                assert!(
                    (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                    "{p} {r0}+{n}: {got:?} vs {want:?}"
                );
            }
        }
        assert_eq!(cached(&e, p), materialized, "{p}");
    }
    // Without a cache, or without room for the chunk's 4·3·2 = 24 gradient entries,
    // nothing is materialized: the ghost kernel runs.
    e.end_cache();
    let n0 = e.routed_sq_norms("narrow", &narrow, &a_of(&narrow), 0, 4)?;
    assert!(n0.is_some() && !cached(&e, "narrow"));
    for (room, fits) in [(23i64, false), (24, true)] {
        let e = engine(4, vec![routed_site(&n_off, &na, &ng, "narrow")], 1 << 20).with_limits(
            EngineLimits {
                chunk_elems: 1 << 20,
                cache_elems: Some(room),
            },
        )?;
        e.start_cache();
        assert!(e.routed_sq_norms("narrow", &narrow, &na, 0, 4)?.is_some());
        assert_eq!(cached(&e, "narrow"), fits, "cache room {room}");
    }
    // Declined, one condition at a time.
    let none = |e: &PerSampleGrads, s: &GradSite, a: &Tensor| -> Result<bool> {
        Ok(e.routed_sq_norms("wide", s, a, 0, 4)?.is_none())
    };
    let mut e64 = engine(4, vec![routed_site(&w_off, &wa, &wg, "wide")], 1 << 20);
    e64.kind = Kind::Double;
    assert!(none(&e64, &wide, &wa)?, "an f64 engine");
    assert!(none(&e, &wide, &wa.f_to_kind(Kind::Double)?)?, "f64 rows");
    let g64 = routed_site(&w_off, &wa, &wg.f_to_kind(Kind::Double)?, "wide");
    assert!(none(&e, &g64, &wa)?, "f64 output gradients");
    assert!(none(&e, &wide, &wa.f_unsqueeze(1)?)?, "3-D rows");
    let g3 = routed_site(&w_off, &wa, &wg.f_unsqueeze(1)?, "wide");
    assert!(none(&e, &g3, &wa)?, "3-D output gradients");
    let mut dense_site = routed_site(&w_off, &wa, &wg, "wide");
    dense_site.offsets = None;
    assert!(none(&e, &dense_site, &wa)?, "a dense site");
    Ok(())
}

/// The clipping policy is checked whole, whatever the batch reaches: a group whose
/// parameters got no gradient in this pass (a routed expert no record chose; here a
/// parameter that is never used) still needs a finite positive bound, and record weights
/// for it are checked and then unused; weights for a group no parameter belongs to are an
/// error. (Before, these checks ran only for the groups the batch reached, so whether a bad
/// bound was noticed depended on the records' routing.)
#[test]
fn the_policy_is_checked_whole_whatever_the_batch_reaches() -> Result<()> {
    let f = Kind::Float;
    let b = 3i64;
    let e = {
        engine(
            b,
            vec![dense(
                randn(&[b, 2, 4], f),
                vec![weight("w", &randn(&[b, 2, 5], f))],
            )],
            1 << 20,
        )
    };
    let mut groups: ParamGroups<String> = ParamGroups::new();
    groups.assign("w", "used".into());
    groups.assign("never.used", "absent".into());
    let role = |absent: Option<f64>| {
        let mut m = BTreeMap::from([("used".to_string(), 1.0)]);
        if let Some(c) = absent {
            m.insert("absent".to_string(), c);
        }
        ClipPolicy::RoleWise(m)
    };
    let none = BTreeMap::new();
    let msg = |r: Result<ClipOutput<String>>| match r {
        Err(ModelError::InvalidClip(m)) => m,
        other => format!("not an InvalidClip error: {other:?}"),
    };
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let m = msg(e.clip(&groups, &role(Some(bad)), &none));
        assert!(m.contains("must be finite and > 0"), "bound {bad}: {m}");
    }
    let m = msg(e.clip(&groups, &role(None), &none));
    assert_eq!(m, "no clipping bound for group absent");
    let out = e.clip(&groups, &role(Some(2.0)), &none)?;
    assert_eq!(out.group_sq_norms.keys().collect::<Vec<_>>(), ["used"]);
    // Weights of the unreached group: checked ([0, 1]) and unused.
    let half = BTreeMap::from([("absent".to_string(), Tensor::from_slice(&[0.5f32; 3]))]);
    let with = e.clip(&groups, &role(Some(2.0)), &half)?;
    let without: Vec<f64> = Vec::try_from(&out.group_sq_norms["used"])?;
    let got: Vec<f64> = Vec::try_from(&with.group_sq_norms["used"])?;
    assert_eq!(got, without);
    let over = BTreeMap::from([(
        "absent".to_string(),
        Tensor::from_slice(&[0.5f32, 2.0, 0.5]),
    )]);
    let m = msg(e.clip(&groups, &role(Some(2.0)), &over));
    assert!(m.contains("record 1") && m.contains("absent"), "{m}");
    let stray = BTreeMap::from([("nobody".to_string(), Tensor::from_slice(&[0.5f32; 3]))]);
    let m = msg(e.clip(&groups, &role(Some(2.0)), &stray));
    assert!(
        m.contains("nobody") && m.contains("no parameter belongs to"),
        "{m}"
    );
    Ok(())
}

/// The cache's budget: a parameter whose next chunk does not fit is dropped whole (its
/// kept chunks freed, its later chunks refused), and the room it freed serves the others
/// up to the budget exactly.
#[test]
fn the_cache_frees_a_dropped_parameter_for_the_others() -> Result<()> {
    let f = Kind::Float;
    let sites = vec![dense(
        randn(&[2, 1, 1], f),
        vec![weight("w", &randn(&[2, 1, 1], f))],
    )];
    let e = engine(2, sites, 1 << 20).with_limits(EngineLimits {
        chunk_elems: 1 << 20,
        cache_elems: Some(30),
    })?;
    let zeros = |n: i64| Tensor::zeros([n], (f, tch::Device::Cpu));
    assert!(!e.cache_admits("a", 1), "no cache before start_cache");
    e.start_cache();
    assert!(e.cache_admits("a", 24));
    e.cache_keep("a", zeros(24));
    assert!(!e.cache_admits("a", 24), "48 > 30: a is dropped");
    assert!(!e.cache_admits("a", 1), "and stays dropped");
    assert!(e.cache_admits("b", 30), "a's 24 were freed");
    e.cache_keep("b", zeros(30));
    assert!(!e.cache_admits("c", 1), "the budget is spent");
    Ok(())
}

/// The engine's accessors report what it was built with: the batch size, the parameters
/// that received gradient (sorted, each once) and the memory limits, before and after
/// `with_limits`. `with_cpu_slice` lends only a CPU tensor of the asked element type.
#[test]
fn accessors_report_the_batch_parameters_and_limits() -> Result<()> {
    let f = Kind::Float;
    let sites = vec![
        dense(
            randn(&[3, 2, 4], f),
            vec![weight("w2", &randn(&[3, 2, 5], f))],
        ),
        dense(
            randn(&[3, 2, 4], f),
            vec![
                weight("w1", &randn(&[3, 2, 4], f)),
                Part::Bias { param: "b".into() },
            ],
        ),
        dense(
            randn(&[3, 1, 5], f),
            vec![weight("w2", &randn(&[3, 1, 4], f))],
        ),
    ];
    let e = engine(3, sites, 1000);
    assert_eq!(e.batch_size(), 3);
    assert_eq!(e.params(), vec!["b", "w1", "w2"]);
    assert_eq!(e.limits().chunk_elems, 1000);
    assert_eq!(e.limits().cache_elems, None);
    let e = e.with_limits(EngineLimits {
        chunk_elems: 17,
        cache_elems: Some(5),
    })?;
    assert_eq!(
        (e.limits().chunk_elems, e.limits().cache_elems),
        (17, Some(5))
    );
    let v = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
    assert_eq!(
        with_cpu_slice(&v, |s: &[f32]| s.to_vec())?,
        vec![1.0, 2.0, 3.0]
    );
    assert!(with_cpu_slice(&v.f_to_kind(Kind::Double)?, |s: &[f32]| s.len()).is_err());
    assert_eq!(
        with_cpu_slice(&v.f_to_kind(Kind::Double)?, |s: &[f64]| s.len())?,
        3
    );
    Ok(())
}

/// `pad_rows` checks its layout before it writes into a fresh tensor: row counts that do
/// not add up to the rows asked for, rows outside `x`, negative or too large counts, a
/// negative width or an `x` that is not `[rows, d]` are errors, each on its own (every
/// other argument valid), with the message of its check; zero-width rows are a valid
/// (empty) layout.
#[test]
fn pad_rows_checks_each_condition_of_its_layout() -> Result<()> {
    let x = Tensor::from_slice(&(0..18).map(|v| v as f32).collect::<Vec<_>>()).reshape([6, 3]);
    let ok = pad_rows::<f32>(&x, 1, 5, &[1, 3], 3, 3)?;
    assert_eq!(ok.size(), [2, 3, 3]);
    let got: Vec<f32> = Vec::try_from(ok.f_flatten(0, -1)?)?;
    let mut want = vec![3.0, 4.0, 5.0];
    want.extend([0.0; 6]);
    want.extend((6..15).map(|v| v as f32));
    assert_eq!(got, want);
    let empty = Tensor::zeros([6, 0], (Kind::Float, tch::Device::Cpu));
    assert_eq!(
        pad_rows::<f32>(&empty, 1, 5, &[1, 3], 3, 0)?.size(),
        [2, 3, 0]
    );
    let counts_msg = "routed row counts do not match the rows";
    let layout_msg = "routed rows do not fit the padded layout";
    let cube = x.reshape([6, 3, 1]);
    // (x, lo, hi, counts, tmax, d, the message)
    type Case<'a> = (&'a Tensor, i64, i64, &'a [i64], i64, i64, &'a str);
    let cases: [Case<'_>; 8] = [
        (&x, 1, 5, &[1, 2], 3, 3, counts_msg), // counts sum to 3, not 4
        (&x, -1, 3, &[1, 3], 3, 3, counts_msg), // starts before row 0
        (&x, 3, 2, &[-1], 3, 3, counts_msg),   // ends before it starts
        (&x, 3, 8, &[2, 3], 3, 3, counts_msg), // past the 6 rows of x
        (&x, 1, 5, &[-1, 5], 5, 3, layout_msg), // a negative count
        (&x, 1, 5, &[1, 3], 2, 3, layout_msg), // a count above tmax
        (&x, 1, 5, &[1, 3], 3, -1, layout_msg), // a negative width
        (&cube, 1, 5, &[1, 3], 3, 3, layout_msg), // x is not [rows, d]
    ];
    for (i, (x, lo, hi, counts, tmax, d, msg)) in cases.into_iter().enumerate() {
        match pad_rows::<f32>(x, lo, hi, counts, tmax, d) {
            Err(ModelError::InvalidConfig(m)) => assert!(m.ends_with(msg), "case {i}: {m}"),
            other => panic!("case {i}: expected an error, got {other:?}"),
        }
    }
    Ok(())
}

/// Coefficients and contractions in f64 for f64 models, f32 for every other dtype (never
/// a half-precision coefficient that could round up past the bound).
#[test]
fn compute_kind_is_f64_for_f64_and_f32_otherwise() {
    assert_eq!(compute_kind(Kind::Double), Kind::Double);
    for k in [Kind::Float, Kind::Half, Kind::BFloat16] {
        assert_eq!(compute_kind(k), Kind::Float, "{k:?}");
    }
}

/// `prep` converts floating tensors to the compute dtype, leaves integer ones alone, and
/// zeroes non-finite entries only when asked.
#[test]
fn prep_converts_floats_only_and_sanitizes_on_request() -> Result<()> {
    let x = Tensor::from_slice(&[1.5f32, f32::NAN, f32::INFINITY]);
    let p = prep(&x, Kind::Double, true)?;
    assert_eq!(p.kind(), Kind::Double);
    assert_eq!(Vec::<f64>::try_from(&p)?, vec![1.5, 0.0, 0.0]);
    let kept = prep(&x, Kind::Float, false)?;
    assert_eq!(kept.f_isnan()?.f_sum(Kind::Int64)?.int64_value(&[]), 1);
    let ids = Tensor::from_slice(&[3i64, 4]);
    let p = prep(&ids, Kind::Float, true)?;
    assert_eq!(p.kind(), Kind::Int64);
    assert_eq!(Vec::<i64>::try_from(&p)?, vec![3, 4]);
    Ok(())
}

/// An engine built by hand from sites (parameter uses in site order), B records.
fn engine(b: i64, sites: Vec<GradSite>, chunk_elems: i64) -> PerSampleGrads {
    let mut uses: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
    for (i, s) in sites.iter().enumerate() {
        for (j, p) in s.parts.iter().enumerate() {
            uses.entry(p.param().to_string()).or_default().push((i, j));
        }
    }
    PerSampleGrads {
        batch_size: b,
        kind: Kind::Float,
        device: tch::Device::Cpu,
        sites,
        uses,
        cache: RefCell::new(None),
        limits: EngineLimits {
            chunk_elems,
            cache_elems: None,
        },
    }
}

/// A routed site of one weight `param` with input rows `a` and output gradient rows `g`,
/// record r owning rows `off[r]..off[r + 1]`.
fn routed_site(off: &[i64], a: &Tensor, g: &Tensor, param: &str) -> GradSite {
    let rec: Vec<i64> = off
        .windows(2)
        .enumerate()
        .flat_map(|(r, w)| std::iter::repeat_n(r as i64, (w[1] - w[0]) as usize))
        .collect();
    GradSite {
        rows: Rows::Routed {
            rec: Tensor::from_slice(&rec),
        },
        parts: vec![weight(param, a)],
        g: g.shallow_clone(),
        offsets: Some(off.to_vec()),
    }
}

/// The per-record loop in f64: `G_r = Σ_{rows of r} g aᵀ` for each record of `off`.
fn per_record_grads(a: &Tensor, g: &Tensor, off: &[i64]) -> Result<Vec<Tensor>> {
    let (a, g) = (a.f_to_kind(Kind::Double)?, g.f_to_kind(Kind::Double)?);
    off.windows(2)
        .map(|w| {
            let (ar, gr) = (
                a.f_narrow(0, w[0], w[1] - w[0])?,
                g.f_narrow(0, w[0], w[1] - w[0])?,
            );
            Ok(gr.f_transpose(0, 1)?.f_matmul(&ar)?)
        })
        .collect()
}

fn dense(g: Tensor, parts: Vec<Part>) -> GradSite {
    GradSite {
        rows: Rows::Dense,
        parts,
        g,
        offsets: None,
    }
}

fn weight(param: &str, a: &Tensor) -> Part {
    Part::Weight {
        param: param.into(),
        a: a.shallow_clone(),
    }
}

/// Draws under the process-wide generator lock: unlocked draws would land inside another
/// test's seeded section (`rng::tests` checks that sections are not interleaved).
fn randn(sz: &[i64], kind: Kind) -> Tensor {
    let _rng = crate::rng::global_rng();
    Tensor::randn(sz, (kind, tch::Device::Cpu))
}

/// The chunk memory model, written out per parameter kind: a record's temporaries are
/// three T×T Grams (3T²), plus its padded rows T·(in+out) on a routed site, plus its
/// materialized `in·out` gradient where that is smaller than its rows; the T5 bucket table
/// two copies of a record's `H·Tq·Tk` gradient. A chunk holds ⌊chunk_elems / cost⌋ records
/// of the most expensive use, at least 1 and at most B.
#[test]
fn records_per_chunk_follow_the_memory_model() -> Result<()> {
    let b = 7i64;
    let f = Kind::Float;
    // dense weight, T 4, in 3, out 5: 3·16 + 15 (15 < 4·8) = 63
    let a1 = randn(&[b, 4, 3], f);
    // dense weight, T 2, in 8, out 8: 3·4 = 12 (64 ≥ 2·16: nothing materialized)
    let a2 = randn(&[b, 2, 8], f);
    // routed weight, largest record 3 rows, in 2, out 4: 27 + 3·6 + 8 = 53
    let off = vec![0i64, 1, 4, 4, 6, 7, 7, 9];
    let rec: Vec<i64> = (0..b)
        .flat_map(|r| std::iter::repeat_n(r, (off[r as usize + 1] - off[r as usize]) as usize))
        .collect();
    let a3 = randn(&[9, 2], f);
    let g3 = randn(&[9, 4], f);
    let (gw1, gw2, grel) = (
        randn(&[b, 4, 5], f),
        randn(&[b, 2, 8], f),
        randn(&[b, 2, 3, 3], f),
    );
    let (gw2b, aw2b) = (randn(&[b, 3, 2], f), randn(&[b, 3, 8], f));
    let (gtie, atie) = (randn(&[b, 2, 4], f), randn(&[b, 2, 4], f));
    // bias on [B, 4, 5]: in = out = 5: 48 + 25 (25 < 4·10) = 73
    // buckets on [B, 2, 3, 3]: 2·18 = 36
    // a second use of w2 on a site of T 3 (in 8, out 2): 27 + 16 (16 < 3·10) = 43
    let mk = || {
        vec![
            dense(
                gw1.shallow_clone(),
                vec![
                    weight("w1", &a1),
                    Part::Bias {
                        param: "bias".into(),
                    },
                ],
            ),
            dense(gw2.shallow_clone(), vec![weight("w2", &a2)]),
            GradSite {
                rows: Rows::Routed {
                    rec: Tensor::from_slice(&rec),
                },
                parts: vec![weight("routed", &a3)],
                g: g3.shallow_clone(),
                offsets: Some(off.clone()),
            },
            dense(
                grel.shallow_clone(),
                vec![Part::Buckets {
                    param: "rel".into(),
                    buckets: Tensor::zeros([3, 3], (Kind::Int64, tch::Device::Cpu)),
                    num_buckets: 4,
                }],
            ),
            dense(gw2b.shallow_clone(), vec![weight("w2", &aw2b)]),
            // T 2, in 4, out 4: the gradient (16) is as large as the rows (2·8): not
            // counted, 3·4 = 12
            dense(gtie.shallow_clone(), vec![weight("tie", &atie)]),
        ]
    };
    let cost = [
        ("w1", 63i64),
        ("w2", 43),
        ("routed", 53),
        ("bias", 73),
        ("rel", 36),
        ("tie", 12),
    ];
    for chunk_elems in [
        1i64, 12, 35, 36, 62, 63, 64, 106, 125, 126, 159, 200, 300, 440, 441, 10_000,
    ] {
        let e = engine(b, mk(), chunk_elems);
        for (p, c) in cost {
            let want = (chunk_elems / c).clamp(1, b);
            assert_eq!(
                e.chunk_records(e.uses_of(p)?),
                want,
                "{p} at chunk_elems {chunk_elems}"
            );
        }
    }
    // an empty batch still has chunks of one record
    let e = engine(
        0,
        vec![dense(
            randn(&[0, 4, 5], f),
            vec![weight("w", &randn(&[0, 4, 3], f))],
        )],
        1 << 20,
    );
    assert_eq!(e.chunk_records(e.uses_of("w")?), 1);
    Ok(())
}

/// Per-record squared norm of `Σ_t g_t a_tᵀ`, one record at a time, in f64.
fn slow_sq_norms(a: &Tensor, g: &Tensor) -> Result<Vec<f64>> {
    let (a, g) = (a.f_to_kind(Kind::Double)?, g.f_to_kind(Kind::Double)?);
    (0..a.size()[0])
        .map(|r| {
            let gr = g.f_get(r)?.f_transpose(0, 1)?.f_matmul(&a.f_get(r)?)?;
            Ok(gr.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?)
        })
        .collect()
}

/// Linear weights reading one same activation (q, k, v) get their norms from one shared
/// activation Gram per chunk, equal to each weight's own per-record norm; weights that
/// read another activation, are used twice, sit on routed rows or are cheaper to
/// materialize are left to the per-parameter pass. Every chunk size gives the same norms,
/// in f64 for an f64 activation.
#[test]
fn weights_sharing_an_input_share_its_gram() -> Result<()> {
    let b = 5i64;
    for kind in [Kind::Float, Kind::Double] {
        // T 2, in 6, out 6: ghost (2·2·12 = 48) is cheaper than materializing (2·36 = 72)
        let x = randn(&[b, 2, 6], kind);
        let other = randn(&[b, 2, 6], kind);
        // T 4, in 2, out 2: materializing (16) is cheaper than ghost (64)
        let small = randn(&[b, 4, 2], kind);
        let gs: Vec<Tensor> = (0..6).map(|_| randn(&[b, 2, 6], kind)).collect();
        let gsmall = randn(&[b, 4, 2], kind);
        let gneg = gsmall.f_neg()?;
        // T 3, in 6, out 6: materializing and ghost cost the same (3·36 = 9·12): ghost, as
        // in the per-parameter pass
        let tie = randn(&[b, 3, 6], kind);
        let (gt1, gt2) = (randn(&[b, 3, 6], kind), randn(&[b, 3, 6], kind));
        // two routed sites reading one row block (records own rows 0..2, 2..3, 3..3, 3..6, 6..6)
        let off = vec![0i64, 2, 3, 3, 6, 6];
        let rec = Tensor::from_slice(&[0i64, 0, 1, 3, 3, 3]);
        let xr = randn(&[6, 6], kind);
        let (gr1, gr2) = (randn(&[6, 6], kind), randn(&[6, 6], kind));
        let routed = |g: &Tensor, p: &str| GradSite {
            rows: Rows::Routed {
                rec: rec.shallow_clone(),
            },
            parts: vec![weight(p, &xr)],
            g: g.shallow_clone(),
            offsets: Some(off.clone()),
        };
        let mk = || {
            vec![
                dense(gs[0].shallow_clone(), vec![weight("q", &x)]),
                dense(gs[1].shallow_clone(), vec![weight("k", &x)]),
                dense(gs[2].shallow_clone(), vec![weight("v", &x)]),
                dense(gs[3].shallow_clone(), vec![weight("o", &other)]),
                dense(gs[4].shallow_clone(), vec![weight("twice", &x)]),
                dense(gs[5].shallow_clone(), vec![weight("twice", &x)]),
                dense(gsmall.shallow_clone(), vec![weight("s1", &small)]),
                dense(gneg.shallow_clone(), vec![weight("s2", &small)]),
                routed(&gr1, "r1"),
                routed(&gr2, "r2"),
                dense(gt1.shallow_clone(), vec![weight("t1", &tie)]),
                dense(gt2.shallow_clone(), vec![weight("t2", &tie)]),
            ]
        };
        for chunk_elems in [1i64, 40, 100, 1 << 20] {
            let e = engine(b, mk(), chunk_elems);
            let shared = e.shared_input_norms()?;
            assert_eq!(
                shared.keys().map(String::as_str).collect::<Vec<_>>(),
                vec!["k", "q", "t1", "t2", "v"],
                "{kind:?} chunk_elems {chunk_elems}"
            );
            for (p, a, g) in [
                ("q", &x, &gs[0]),
                ("k", &x, &gs[1]),
                ("v", &x, &gs[2]),
                ("t1", &tie, &gt1),
                ("t2", &tie, &gt2),
            ] {
                let got = &shared[p];
                assert_eq!(got.kind(), kind, "{p}");
                assert_eq!(got.size(), vec![b], "{p}");
                let got: Vec<f64> = Vec::try_from(got.f_to_kind(Kind::Double)?)?;
                let want = slow_sq_norms(a, g)?;
                for (r, (u, v)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (u - v).abs() <= 1e-4 * v.max(1.0),
                        "{p} record {r}: {u} vs {v}"
                    );
                }
                // and the same as the parameter's own pass
                let own: Vec<f64> = Vec::try_from(e.sq_norms(p)?.f_to_kind(Kind::Double)?)?;
                for (u, v) in got.iter().zip(&own) {
                    assert!((u - v).abs() <= 1e-4 * v.max(1.0), "{p}: {u} vs {v}");
                }
            }
        }
    }
    Ok(())
}

/// Parameters with several uses of other kinds than attention's linear weights: a bias
/// added at two sites (its per-record gradient is the sum of both sites' row sums, so it
/// takes the factored path), and a table used as a linear weight first and as an
/// embedding after (a tied head recorded before its embedding: the cross term of a dense
/// and a one-hot factor). Norms against per-record gradients built by hand in f64, under
/// several chunk sizes.
#[test]
fn norms_of_multi_use_biases_and_tied_tables_match_a_slow_reference() -> Result<()> {
    let (b, d, v) = (4i64, 3i64, 5i64);
    let f = Kind::Double;
    let g1 = randn(&[b, 2, d], f);
    let g2 = randn(&[b, 3, d], f);
    let gw = randn(&[b, 2, v], f); // head output gradient [B, T, V]
    let aw = randn(&[b, 2, d], f); // head input [B, T, d]
    let ge = randn(&[b, 3, d], f); // embedding output gradient [B, T, d]
    let ids = Tensor::from_slice(&[0i64, 4, 4, 1, 2, 2, 3, 0, 1, 4, 4, 4]).reshape([b, 3]);
    let mk = || {
        vec![
            dense(
                g1.shallow_clone(),
                vec![Part::Bias {
                    param: "bias".into(),
                }],
            ),
            dense(gw.shallow_clone(), vec![weight("table", &aw)]),
            dense(
                g2.shallow_clone(),
                vec![Part::Bias {
                    param: "bias".into(),
                }],
            ),
            dense(
                ge.shallow_clone(),
                vec![Part::Embedding {
                    param: "table".into(),
                    ids: ids.shallow_clone(),
                    vocab: v,
                }],
            ),
        ]
    };
    // per-record gradients by hand
    let mut want_bias = Vec::new();
    let mut want_table = Vec::new();
    for r in 0..b {
        let gb = g1
            .f_get(r)?
            .f_sum_dim_intlist(0, false, None::<Kind>)?
            .f_add(&g2.f_get(r)?.f_sum_dim_intlist(0, false, None::<Kind>)?)?;
        want_bias.push(gb.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?);
        // head: Σ_t g_t a_tᵀ  [V, d]; embedding: Σ_t e_{id_t} g_tᵀ  [V, d]
        let mut gt = gw.f_get(r)?.f_transpose(0, 1)?.f_matmul(&aw.f_get(r)?)?;
        for t in 0..3 {
            let id = ids.f_int64_value(&[r, t])?;
            let row = gt.f_get(id)?.f_add(&ge.f_get(r)?.f_get(t)?)?;
            gt = gt.f_index_copy(0, &Tensor::from_slice(&[id]), &row.f_unsqueeze(0)?)?;
        }
        want_table.push(gt.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?);
    }
    for chunk_elems in [1i64, 50, 1 << 20] {
        let mut e = engine(b, mk(), chunk_elems);
        e.kind = Kind::Double;
        for (p, want) in [("bias", &want_bias), ("table", &want_table)] {
            let got: Vec<f64> = Vec::try_from(e.sq_norms(p)?)?;
            assert_eq!(got.len(), want.len(), "{p}");
            for (r, (u, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (u - w).abs() <= 1e-9 * w.max(1.0),
                    "{p} record {r}: {u} vs {w}"
                );
            }
        }
    }
    Ok(())
}

/// Weighted sums `Σ_b c_b · grad_b` of biases and norm gains on dense sites with several
/// tokens per record and on routed rows (a record with no row included), against loops
/// over records and rows.
#[test]
fn bias_and_gain_sums_over_dense_and_routed_rows_match_loops() -> Result<()> {
    let f = Kind::Double;
    let (b, t, out) = (3i64, 4i64, 5i64);
    let c = Tensor::from_slice(&[0.5f64, -1.0, 2.0]);
    let cv = [0.5f64, -1.0, 2.0];
    let g = randn(&[b, t, out], f);
    let n = randn(&[b, t, out], f);
    let rec_v = [0i64, 0, 2, 2, 2];
    let gr = randn(&[5, out], f);
    let nr = randn(&[5, out], f);
    let bias = Part::Bias {
        param: "bias".into(),
    };
    let gain = |n: &Tensor| Part::Gain {
        param: "gain".into(),
        n: n.shallow_clone(),
    };
    let dense_site = dense(g.shallow_clone(), vec![]);
    let routed_site = GradSite {
        rows: Rows::Routed {
            rec: Tensor::from_slice(&rec_v),
        },
        parts: vec![],
        g: gr.shallow_clone(),
        offsets: Some(vec![0, 2, 2, 5]),
    };
    let e = engine(b, vec![], 1 << 20);
    let close = |got: &Tensor, want: &Tensor, what: &str| -> Result<()> {
        assert_eq!(got.size(), want.size(), "{what}");
        let d = got.f_sub(want)?.f_abs()?.f_max()?.f_double_value(&[])?;
        assert!(d < 1e-12, "{what}: {d}");
        Ok(())
    };
    // dense: Σ_b c_b Σ_t g[b, t] (⊙ n[b, t])
    let mut want_b = Tensor::zeros([out], (f, tch::Device::Cpu));
    let mut want_g = Tensor::zeros([out], (f, tch::Device::Cpu));
    for r in 0..b {
        for k in 0..t {
            let gk = g.f_get(r)?.f_get(k)?;
            want_b = want_b.f_add(&gk.f_mul_scalar(cv[r as usize])?)?;
            want_g = want_g.f_add(
                &gk.f_mul(&n.f_get(r)?.f_get(k)?)?
                    .f_mul_scalar(cv[r as usize])?,
            )?;
        }
    }
    close(&e.part_sum(&dense_site, &bias, &c)?, &want_b, "dense bias")?;
    close(
        &e.part_sum(&dense_site, &gain(&n), &c)?,
        &want_g,
        "dense gain",
    )?;
    // routed: Σ_rows c[rec[row]] g[row] (⊙ n[row])
    let mut want_b = Tensor::zeros([out], (f, tch::Device::Cpu));
    let mut want_g = Tensor::zeros([out], (f, tch::Device::Cpu));
    for (row, &r) in rec_v.iter().enumerate() {
        let gk = gr.f_get(row as i64)?;
        want_b = want_b.f_add(&gk.f_mul_scalar(cv[r as usize])?)?;
        want_g = want_g.f_add(
            &gk.f_mul(&nr.f_get(row as i64)?)?
                .f_mul_scalar(cv[r as usize])?,
        )?;
    }
    close(
        &e.part_sum(&routed_site, &bias, &c)?,
        &want_b,
        "routed bias",
    )?;
    close(
        &e.part_sum(&routed_site, &gain(&nr), &c)?,
        &want_g,
        "routed gain",
    )?;
    Ok(())
}

/// Routed linear weights in f32 on the CPU take raptor-clip's ragged kernels over each
/// record's own rows: the ghost identity where records have few rows and the weight is wide
/// (sums then by one row contraction), materializing where records have many rows of a
/// narrow weight (kept for the sums). Both give the per-record norms and the clipped sums of
/// the obvious per-record loop in f64, records without rows included; with the cache off the
/// norms come from the ghost kernel and are the same.
#[test]
fn routed_weights_take_the_cheaper_ragged_kernel_and_match_loops() -> Result<()> {
    let f = Kind::Float;
    let b = 4i64;
    let routed =
        |offsets: Vec<i64>, din: i64, dout: i64, param: &str| -> (GradSite, Tensor, Tensor) {
            let rows = offsets[offsets.len() - 1];
            let a = randn(&[rows, din], f);
            let g = randn(&[rows, dout], f);
            (routed_site(&offsets, &a, &g, param), a, g)
        };
    // "wide": ≤ 2 rows per record of a 40 → 48 weight (ghost is less work);
    // "narrow": 9–11 rows per record of a 3 → 2 weight (materializing is).
    let (wide, wa, wg) = routed(vec![0, 1, 1, 3, 4], 40, 48, "wide");
    let (narrow, na, ng) = routed(vec![0, 9, 9, 20, 30], 3, 2, "narrow");
    let wide_off = [0i64, 1, 1, 3, 4];
    let narrow_off = [0i64, 9, 9, 20, 30];
    let (gw, mw) = ragged_cost(&[1, 0, 2, 1], 40, 48);
    assert!(gw < mw, "the wide weight is a ghost case");
    let (gn, mn) = ragged_cost(&[9, 0, 11, 10], 3, 2);
    assert!(mn < gn, "the narrow weight is a materializing case");
    let per_w = per_record_grads(&wa, &wg, &wide_off)?;
    let per_n = per_record_grads(&na, &ng, &narrow_off)?;
    let sq = |v: &[Tensor]| -> Result<Vec<f64>> {
        v.iter()
            .map(|t| Ok(t.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?))
            .collect()
    };
    let (sq_w, sq_n) = (sq(&per_w)?, sq(&per_n)?);
    assert_eq!((sq_w[1], sq_n[1]), (0.0, 0.0), "record 1 owns no rows");
    let close = |got: f64, want: f64, what: &str| {
        assert!(
            (got - want).abs() <= 1e-4 * want.abs().max(1e-3),
            "{what}: {got} vs {want}"
        );
    };
    let e = engine(b, vec![wide, narrow], 1 << 20);
    // Norms with the cache off: the ghost kernel for both.
    for (p, want) in [("wide", &sq_w), ("narrow", &sq_n)] {
        let got: Vec<f64> = Vec::try_from(e.sq_norms(p)?.f_to_kind(Kind::Double)?)?;
        for r in 0..b as usize {
            close(got[r], want[r], &format!("{p} record {r}, cache off"));
        }
    }
    // One group each, bound 1.5: norms, factors, sums against the loop.
    let mut groups: ParamGroups<String> = ParamGroups::new();
    groups.assign("wide", "gw".into());
    groups.assign("narrow", "gn".into());
    let bound = 1.5;
    let policy = ClipPolicy::RoleWise(
        [("gw".to_string(), bound), ("gn".to_string(), bound)]
            .into_iter()
            .collect(),
    );
    let out = e.clip(&groups, &policy, &BTreeMap::new())?;
    assert!(out.from_cache.contains("narrow"), "materialized and kept");
    assert!(
        !out.from_cache.contains("wide"),
        "ghost norms, row-contraction sums"
    );
    for (p, grp, per, want_sq) in [
        ("wide", "gw", &per_w, &sq_w),
        ("narrow", "gn", &per_n, &sq_n),
    ] {
        let got: Vec<f64> = Vec::try_from(out.group_sq_norms[grp].f_to_kind(Kind::Double)?)?;
        let mut want_sum = per[0].f_zeros_like()?;
        for r in 0..b as usize {
            close(got[r], want_sq[r], &format!("{p} record {r}"));
            let c = (bound / want_sq[r].sqrt()).min(1.0);
            want_sum = want_sum.f_add(&per[r].f_mul_scalar(c)?)?;
        }
        let d = out.sums[p]
            .f_to_kind(Kind::Double)?
            .f_sub(&want_sum)?
            .f_abs()?
            .f_max()?
            .f_double_value(&[])?;
        let scale = want_sum.f_abs()?.f_max()?.f_double_value(&[])?;
        assert!(
            d <= 1e-4 * scale.max(1e-3),
            "{p} sum: max error {d} of {scale}"
        );
    }
    Ok(())
}

/// `prepared` leaves a site alone only when it is already in the compute dtype and nothing
/// is to be sanitized; a bf16 site is widened (its tensors in f32), and sanitizing zeroes
/// non-finite entries.
#[test]
fn sites_are_prepared_in_the_compute_dtype() -> Result<()> {
    let g = Tensor::from_slice(&[1.0f32, f32::NAN, 2.0, 3.0]).reshape([2, 2]);
    let a = randn(&[2, 3], Kind::Float);
    let mk = |g: &Tensor, a: &Tensor| dense(g.shallow_clone(), vec![weight("w", a)]);
    assert!(mk(&g, &a).prepared(Kind::Float, false)?.is_none());
    let half = mk(&g.f_to_kind(Kind::BFloat16)?, &a.f_to_kind(Kind::BFloat16)?);
    let p = half
        .prepared(Kind::Float, false)?
        .ok_or_else(|| ModelError::InvalidConfig("bf16 site kept as is".into()))?;
    assert_eq!(p.g.kind(), Kind::Float);
    let Part::Weight { a: pa, .. } = &p.parts[0] else {
        return Err(ModelError::InvalidConfig("part changed kind".into()));
    };
    assert_eq!(pa.kind(), Kind::Float);
    assert_eq!(p.g.f_isnan()?.f_sum(Kind::Int64)?.int64_value(&[]), 1);
    let s = mk(&g, &a)
        .prepared(Kind::Float, true)?
        .ok_or_else(|| ModelError::InvalidConfig("sanitize did nothing".into()))?;
    assert_eq!(
        Vec::<f32>::try_from(s.g.f_flatten(0, -1)?)?,
        vec![1.0, 0.0, 2.0, 3.0]
    );
    Ok(())
}

/// `clip_factors` turns squared norms into `min(1, C / ‖g‖)` in the norms' dtype.
#[test]
fn clip_factors_are_min_one_bound_over_norm() -> Result<()> {
    let sq = Tensor::from_slice(&[4.0f32, 0.25, 0.0, 1.0]);
    let f = clip_factors(&sq, 1.0)?;
    assert_eq!(f.kind(), Kind::Float);
    let v: Vec<f32> = Vec::try_from(&f)?;
    assert!((v[0] - 0.5).abs() < 1e-6, "{v:?}");
    assert_eq!(&v[1..], &[1.0, 1.0, 1.0]);
    Ok(())
}
