//! `raptor account`, `raptor calibrate` and `raptor plan`: privacy accounting from the command
//! line (raptor-accountant's PRV accountant with the RDP cross-check).

use anyhow::Context;
use clap::Args;
use raptor_accountant::{
    Accuracy, Composition, PlanRequest, PrvAccountant, RdpAccountant, Stream, SubsampledGaussian,
    calibrate_sigma, plan_budget,
};
use serde::Serialize;

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

fn parse_mech(s: &str) -> Result<MechSpec, String> {
    let v: Vec<&str> = s.split(',').map(str::trim).collect();
    if v.len() != 3 {
        return Err(format!("expected Q,SIGMA,STEPS (got {s:?})"));
    }
    Ok(MechSpec {
        q: v[0].parse().map_err(|e| format!("q {:?}: {e}", v[0]))?,
        sigma: v[1].parse().map_err(|e| format!("sigma {:?}: {e}", v[1]))?,
        steps: v[2].parse().map_err(|e| format!("steps {:?}: {e}", v[2]))?,
    })
}

fn parse_stream(s: &str) -> Result<Stream, String> {
    let v: Vec<&str> = s.split(',').map(str::trim).collect();
    if v.len() != 2 {
        return Err(format!("expected Q,STEPS (got {s:?})"));
    }
    Ok(Stream {
        q: v[0].parse().map_err(|e| format!("q {:?}: {e}", v[0]))?,
        steps: v[1].parse().map_err(|e| format!("steps {:?}: {e}", v[1]))?,
    })
}

fn accountant(eps_error: f64) -> anyhow::Result<PrvAccountant> {
    Ok(PrvAccountant::new(Accuracy::relative(eps_error))?)
}

/// Arguments of `raptor account`.
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
    /// Relative ε accuracy of the PRV bounds (upper − estimate ≈ this × ε).
    #[arg(long, default_value_t = 0.01)]
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

/// Run `raptor account`.
pub fn run_account(args: AccountArgs) -> anyhow::Result<()> {
    let mut mechs = Vec::new();
    match (args.q, args.sigma, args.steps) {
        (Some(q), Some(sigma), Some(steps)) => mechs.push(MechSpec { q, sigma, steps }),
        (None, None, None) => {}
        _ => anyhow::bail!("--q, --sigma and --steps go together"),
    }
    mechs.extend(args.mech.iter().copied());
    if mechs.is_empty() {
        anyhow::bail!("no mechanism: give --q/--sigma/--steps or --mech Q,SIGMA,STEPS");
    }
    let mut comp = Composition::new();
    for m in &mechs {
        comp.push(SubsampledGaussian::new(m.q, m.sigma)?, m.steps)?;
    }
    let eps = accountant(args.eps_error)?
        .epsilon(&comp, args.delta)
        .context("PRV accountant")?;
    let rdp = RdpAccountant::default()
        .epsilon(&comp, args.delta)
        .context("RDP accountant")?;
    if args.json {
        return super::print_json(&AccountOut {
            mechanisms: mechs,
            delta: args.delta,
            epsilon: eps,
            rdp,
            eps_error_rel: args.eps_error,
        });
    }
    for m in &mechs {
        println!(
            "mechanism: q = {}, sigma = {}, steps = {}",
            m.q, m.sigma, m.steps
        );
    }
    println!("delta: {:e}", args.delta);
    println!(
        "epsilon (PRV): upper {:.6}  estimate {:.6}  lower {:.6}   [remove {:.6}, add {:.6}]",
        eps.upper, eps.estimate, eps.lower, eps.upper_remove, eps.upper_add
    );
    println!("epsilon (RDP): {:.6} (order {})", rdp.epsilon, rdp.order);
    Ok(())
}

/// Arguments of `raptor calibrate`.
#[derive(Debug, Clone, Args)]
pub struct CalibrateArgs {
    /// Target ε (met by the certified PRV upper bound).
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
    #[arg(long, default_value_t = 0.01)]
    pub eps_error: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `raptor calibrate`.
pub fn run_calibrate(args: CalibrateArgs) -> anyhow::Result<()> {
    let c = calibrate_sigma(
        args.epsilon,
        args.delta,
        args.q,
        args.steps,
        &accountant(args.eps_error)?,
    )?;
    if args.json {
        return super::print_json(&c);
    }
    println!("sigma: {:.6}", c.sigma);
    println!(
        "epsilon at sigma (PRV): upper {:.6} <= target {}  (estimate {:.6}, lower {:.6})",
        c.epsilon.upper, args.epsilon, c.epsilon.estimate, c.epsilon.lower
    );
    println!(
        "bisection: relative bracket {:.2e}, {} evaluations",
        c.relative_bracket, c.evaluations
    );
    Ok(())
}

/// Arguments of `raptor plan`.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Total ε.
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
    /// Expert stream (per trained layer) as Q,STEPS.
    #[arg(long, value_parser = parse_stream)]
    pub expert: Stream,
    /// Number of trained sparse layers.
    #[arg(long, default_value_t = 1)]
    pub layers: u64,
    /// Relative ε accuracy of the PRV bounds.
    #[arg(long, default_value_t = 0.01)]
    pub eps_error: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `raptor plan`.
pub fn run_plan(args: PlanArgs) -> anyhow::Result<()> {
    let req = PlanRequest {
        epsilon: args.epsilon,
        delta: args.delta,
        rho: args.rho,
        shared: args.shared,
        expert: args.expert,
        layers: args.layers,
    };
    let p = plan_budget(&req, &accountant(args.eps_error)?)?;
    if args.json {
        return super::print_json(&p);
    }
    println!(
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
    println!("(i) additive split (paper): each stream calibrated alone");
    println!(
        "    shared: sigma {:.4} for (eps {:.4}, delta {:.3e}) -> spends {:.4}",
        a.shared.sigma, a.shared.epsilon_target, a.shared.delta_target, a.shared.epsilon_alone
    );
    println!(
        "    expert: sigma {:.4} for (eps {:.4}, delta {:.3e}) per layer -> spends {:.4}",
        a.expert.sigma, a.expert.epsilon_target, a.expert.delta_target, a.expert.epsilon_alone
    );
    println!(
        "    claimed epsilon (sum) {:.4}; composed in one PRV: {:.4} (upper)",
        a.epsilon_claimed, a.epsilon_composed.upper
    );
    let j = &p.joint;
    println!(
        "(ii) joint split: sigma_e^2 / sigma_s^2 = {:.4} fixed by rho, composed PRV meets the budget",
        p.variance_ratio
    );
    println!("    shared: sigma {:.4}", j.shared.sigma);
    println!("    expert: sigma {:.4}", j.expert.sigma);
    println!(
        "    composed epsilon: upper {:.4} (estimate {:.4}, lower {:.4})",
        j.epsilon_composed.upper, j.epsilon_composed.estimate, j.epsilon_composed.lower
    );
    Ok(())
}
