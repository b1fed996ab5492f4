#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Snapshot of a small table of rounded ε bounds (upper / estimate / lower) at δ = 1e-5 with the
//! default accuracy, guarding against silent numerical drift. The rounding (3 decimals) is far
//! coarser than FFT round-off; the bounds are checked to be ordered before being snapshotted
//! (their correctness is checked against references in `analytic.rs` and `golden.rs`).

use raptor_accountant::{Composition, PrvAccountant, SubsampledGaussian};

fn mech(q: f64, s: f64) -> SubsampledGaussian {
    SubsampledGaussian::new(q, s).unwrap()
}

#[test]
fn epsilon_table() {
    let acc = PrvAccountant::default();
    let cases: Vec<(&str, Composition)> = vec![
        (
            "q=1 s=5 T=10",
            Composition::single(mech(1.0, 5.0), 10).unwrap(),
        ),
        (
            "q=0.1 s=2 T=100",
            Composition::single(mech(0.1, 2.0), 100).unwrap(),
        ),
        (
            "q=0.01 s=1 T=1000",
            Composition::single(mech(0.01, 1.0), 1000).unwrap(),
        ),
        (
            "q=0.05 s=0.8 T=200",
            Composition::single(mech(0.05, 0.8), 200).unwrap(),
        ),
        (
            "(0.01,1,1000)+(0.05,2,1000)",
            Composition::single(mech(0.01, 1.0), 1000)
                .unwrap()
                .with(mech(0.05, 2.0), 1000)
                .unwrap(),
        ),
    ];
    let mut table = String::from("case | upper | estimate | lower\n");
    for (name, c) in &cases {
        let e = acc.epsilon(c, 1e-5).unwrap();
        assert!(
            e.lower <= e.estimate && e.estimate <= e.upper,
            "{name}: {e:?}"
        );
        table.push_str(&format!(
            "{name} | {:.3} | {:.3} | {:.3}\n",
            e.upper, e.estimate, e.lower
        ));
    }
    insta::assert_snapshot!(table);
}
