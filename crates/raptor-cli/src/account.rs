//! `account`, `calibrate` and `plan`: privacy accounting from the command line
//! (raptor-accountant's PRV accountant with the RDP cross-check).

use std::fmt::Write as _;

use clap::Args;
use raptor_accountant::{
    Accuracy, Composition, DEFAULT_RELATIVE_EPS_ERROR, Method, PlanRequest, PrvAccountant,
    RELATIVE_FLOOR, RdpAccountant, Stream, StreamSampling, SubsampledGaussian, calibrate_sigma,
    plan_budget,
};
use serde::Serialize;

use crate::{CliError, Result, print_json, print_text};

/// One mechanism given as `Q,SIGMA,STEPS`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MechSpec {
    /// Sampling rate.
    pub q: f64,
    /// Noise multiplier.
    pub sigma: f64,
    /// Steps.
    pub steps: u64,
}

/// Parse `Q,SIGMA,STEPS` (the `--mech` argument).
pub fn parse_mech(s: &str) -> std::result::Result<MechSpec, String> {
    let v: Vec<&str> = s.split(',').map(str::trim).collect();
    let [q, sigma, steps] = v[..] else {
        return Err(format!("expected Q,SIGMA,STEPS (got {s:?})"));
    };
    Ok(MechSpec {
        q: q.parse().map_err(|e| format!("q {q:?}: {e}"))?,
        sigma: sigma.parse().map_err(|e| format!("sigma {sigma:?}: {e}"))?,
        steps: steps.parse().map_err(|e| format!("steps {steps:?}: {e}"))?,
    })
}

/// Parse `Q,STEPS` (the `--shared` and `--expert` arguments).
pub fn parse_stream(s: &str) -> std::result::Result<Stream, String> {
    let v: Vec<&str> = s.split(',').map(str::trim).collect();
    let [q, steps] = v[..] else {
        return Err(format!("expected Q,STEPS (got {s:?})"));
    };
    Ok(Stream {
        q: q.parse().map_err(|e| format!("q {q:?}: {e}"))?,
        steps: steps.parse().map_err(|e| format!("steps {steps:?}: {e}"))?,
    })
}

fn accountant(eps_error: f64) -> Result<PrvAccountant> {
    PrvAccountant::new(Accuracy::relative(eps_error)).map_err(CliError::accountant("--eps-error"))
}

/// Arguments of `account`.
#[derive(Debug, Clone, Args)]
pub struct AccountArgs {
    /// Sampling rate of the first mechanism.
    #[arg(long)]
    pub q: Option<f64>,
    /// Noise multiplier of the first mechanism.
    #[arg(long)]
    pub sigma: Option<f64>,
    /// Steps of the first mechanism.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Further mechanisms composed with it, as Q,SIGMA,STEPS (repeatable).
    #[arg(long = "mech", value_parser = parse_mech)]
    pub mech: Vec<MechSpec>,
    /// δ.
    #[arg(long)]
    pub delta: f64,
    /// Relative ε accuracy of the PRV bounds (the certified upper bound is expected within this
    /// × ε of the truth; the library's default).
    #[arg(long, default_value_t = DEFAULT_RELATIVE_EPS_ERROR)]
    pub eps_error: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct AccountOut {
    mechanisms: Vec<MechSpec>,
    delta: f64,
    epsilon: raptor_accountant::EpsilonBounds,
    rdp: raptor_accountant::RdpEpsilon,
    eps_error_rel: f64,
}

/// Run `account`: the PRV bounds on ε (and the RDP ε) of the composition of the mechanisms.
pub fn run_account(args: AccountArgs) -> Result<()> {
    let mut mechs = Vec::new();
    match (args.q, args.sigma, args.steps) {
        (Some(q), Some(sigma), Some(steps)) => mechs.push(MechSpec { q, sigma, steps }),
        (None, None, None) => {}
        _ => {
            return Err(CliError::InvalidArgument(
                "--q, --sigma and --steps go together".into(),
            ));
        }
    }
    mechs.extend(args.mech.iter().copied());
    if mechs.is_empty() {
        return Err(CliError::InvalidArgument(
            "no mechanism: give --q/--sigma/--steps or --mech Q,SIGMA,STEPS".into(),
        ));
    }
    let mut comp = Composition::new();
    for m in &mechs {
        let mech =
            SubsampledGaussian::new(m.q, m.sigma).map_err(CliError::accountant("mechanism"))?;
        comp.push(mech, m.steps)
            .map_err(CliError::accountant("mechanism"))?;
    }
    let eps = accountant(args.eps_error)?
        .epsilon(&comp, args.delta)
        .map_err(CliError::accountant("PRV accountant"))?;
    let rdp = RdpAccountant::default()
        .epsilon(&comp, args.delta)
        .map_err(CliError::accountant("RDP accountant"))?;
    if args.json {
        return print_json(&AccountOut {
            mechanisms: mechs,
            delta: args.delta,
            epsilon: eps,
            rdp,
            eps_error_rel: args.eps_error,
        });
    }
    let mut s = String::new();
    for m in &mechs {
        let _ = writeln!(
            s,
            "mechanism: q = {}, sigma = {}, steps = {}",
            m.q, m.sigma, m.steps
        );
    }
    let _ = writeln!(s, "delta: {:e}", args.delta);
    let _ = writeln!(
        s,
        "epsilon (PRV): upper {:.6}  estimate {:.6}  lower {:.6}   [remove {:.6}, add {:.6}]",
        eps.upper, eps.estimate, eps.lower, eps.upper_remove, eps.upper_add
    );
    let _ = writeln!(s, "epsilon (RDP): {:.6} (order {})", rdp.epsilon, rdp.order);
    match eps.method {
        // The grid that answered was coarser than --eps-error asked (the grid limit).
        Method::Prv { eps_error }
            if eps_error > args.eps_error * eps.upper.max(RELATIVE_FLOOR) * 1.01 =>
        {
            let _ = writeln!(
                s,
                "note: the grid for --eps-error {} would exceed the grid limit; the certified upper bound comes from the finest grid that fits (expected within {:.1e} of the truth, relative {:.1e})",
                args.eps_error,
                eps_error,
                eps_error / eps.upper.max(RELATIVE_FLOOR)
            );
        }
        Method::Rdp { order } => {
            let _ = writeln!(
                s,
                "note: no PRV grid fits the grid limit here; the certified upper bound is the RDP bound (order {order})"
            );
        }
        Method::Prv { .. } => {}
    }
    print_text(&s)
}

/// Arguments of `calibrate`.
#[derive(Debug, Clone, Args)]
pub struct CalibrateArgs {
    /// Target ε (> 0; met by the certified PRV upper bound).
    #[arg(long)]
    pub epsilon: f64,
    /// δ.
    #[arg(long)]
    pub delta: f64,
    /// Sampling rate.
    #[arg(long)]
    pub q: f64,
    /// Steps.
    #[arg(long)]
    pub steps: u64,
    /// Relative ε accuracy of the PRV bounds.
    #[arg(long, default_value_t = DEFAULT_RELATIVE_EPS_ERROR)]
    pub eps_error: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `calibrate`: the smallest σ (to the bisection's tolerance) whose certified ε upper bound
/// meets the target.
pub fn run_calibrate(args: CalibrateArgs) -> Result<()> {
    let c = calibrate_sigma(
        args.epsilon,
        args.delta,
        args.q,
        args.steps,
        &accountant(args.eps_error)?,
    )
    .map_err(CliError::accountant("calibration"))?;
    if args.json {
        return print_json(&c);
    }
    let mut s = String::new();
    let _ = writeln!(s, "sigma: {:.6}", c.sigma);
    let _ = writeln!(
        s,
        "epsilon at sigma (PRV): upper {:.6} <= target {}  (estimate {:.6}, lower {:.6})",
        c.epsilon.upper, args.epsilon, c.epsilon.estimate, c.epsilon.lower
    );
    let _ = writeln!(
        s,
        "bisection: relative bracket {:.2e}, {} evaluations",
        c.relative_bracket, c.evaluations
    );
    print_text(&s)
}

/// Arguments of `plan`.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Total ε (> 0).
    #[arg(long)]
    pub epsilon: f64,
    /// Total δ.
    #[arg(long)]
    pub delta: f64,
    /// Share ρ of the budget for the shared stream.
    #[arg(long, default_value_t = 0.9)]
    pub rho: f64,
    /// Shared stream as Q,STEPS.
    #[arg(long, value_parser = parse_stream)]
    pub shared: Stream,
    /// Expert updates as Q,STEPS (each draws one sample and releases every trained layer's
    /// experts from it).
    #[arg(long, value_parser = parse_stream)]
    pub expert: Stream,
    /// Number of trained sparse layers.
    #[arg(long, default_value_t = 1)]
    pub layers: u64,
    /// Both streams release from one sample per update (no alternation): the streams need the
    /// same Q,STEPS, and each update is charged as one mechanism (1/σ_eff² = 1/σ_s² + L/σ_e²).
    #[arg(long)]
    pub simultaneous: bool,
    /// Relative ε accuracy of the PRV bounds.
    #[arg(long, default_value_t = DEFAULT_RELATIVE_EPS_ERROR)]
    pub eps_error: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `plan`: RAPTOR's additive (paper) and joint budget splits.
pub fn run_plan(args: PlanArgs) -> Result<()> {
    let req = PlanRequest {
        epsilon: args.epsilon,
        delta: args.delta,
        rho: args.rho,
        shared: args.shared,
        expert: args.expert,
        layers: args.layers,
        sampling: if args.simultaneous {
            StreamSampling::Simultaneous
        } else {
            StreamSampling::Alternating
        },
    };
    let p = plan_budget(&req, &accountant(args.eps_error)?)
        .map_err(CliError::accountant("budget plan"))?;
    if args.json {
        return print_json(&p);
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "budget: epsilon = {}, delta = {:e}, rho = {}, layers = {}; shared q = {}, T = {}; expert q = {}, T = {}",
        req.epsilon,
        req.delta,
        req.rho,
        req.layers,
        req.shared.q,
        req.shared.steps,
        req.expert.q,
        req.expert.steps
    );
    let a = &p.additive;
    let _ = writeln!(
        s,
        "(i) additive split (paper): each stream calibrated alone"
    );
    let _ = writeln!(
        s,
        "    shared: sigma {:.4} for (eps {:.4}, delta {:.3e}) -> spends {:.4}",
        a.shared.sigma, a.shared.epsilon_target, a.shared.delta_target, a.shared.epsilon_alone
    );
    let _ = writeln!(
        s,
        "    expert: sigma {:.4} per layer for (eps {:.4}, delta {:.3e}) of the expert updates (one sample for every layer) -> spends {:.4}",
        a.expert.sigma, a.expert.epsilon_target, a.expert.delta_target, a.expert.epsilon_alone
    );
    let _ = writeln!(
        s,
        "    claimed epsilon (sum) {:.4}; composed in one PRV: {:.4} (upper)",
        a.epsilon_claimed, a.epsilon_composed.upper
    );
    let j = &p.joint;
    let _ = writeln!(
        s,
        "(ii) joint split: sigma_e^2 / sigma_s^2 = {:.4} fixed by rho, composed PRV meets the budget",
        p.variance_ratio
    );
    let _ = writeln!(s, "    shared: sigma {:.4}", j.shared.sigma);
    let _ = writeln!(s, "    expert: sigma {:.4}", j.expert.sigma);
    let _ = writeln!(
        s,
        "    composed epsilon: upper {:.4} (estimate {:.4}, lower {:.4})",
        j.epsilon_composed.upper, j.epsilon_composed.estimate, j.epsilon_composed.lower
    );
    print_text(&s)
}
