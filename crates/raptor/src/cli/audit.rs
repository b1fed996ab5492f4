//! `raptor audit`: the one-run canary audit of a run config (an empirical ε lower bound beside
//! the certified upper bound; see crate [`raptor_audit`]).

use std::path::PathBuf;

use raptor_audit::{AuditOptions, CanaryKind, audit};

/// Audit a run config empirically: train once with secret canaries and bound ε from below.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// The run configuration (TOML), as for `raptor train`.
    #[arg(long)]
    pub config: PathBuf,
    /// Number of canaries (default: 1,000 white-box canaries; 200 loss canaries, at most N/4
    /// of the N training records).
    #[arg(long)]
    pub canaries: Option<usize>,
    /// Canary kind (default: dirac for private methods; else mislabel for classifiers, random
    /// for language models).
    #[arg(long, value_enum)]
    pub kind: Option<CanaryKind>,
    /// Per-expert audit (dirac): every canary in routed expert E of RAPTOR's layer; reports
    /// the ε of that expert stream alone beside the run's.
    #[arg(long, value_name = "E")]
    pub expert: Option<usize>,
    /// Confidence of the lower bound.
    #[arg(long, default_value_t = raptor_eval::audit::DEFAULT_CONFIDENCE)]
    pub confidence: f64,
    /// Seed of the canary design (which records, labels, tokens; public). The inclusion coins
    /// come from the OS CSPRNG (or from `train.insecure_seed` when it is set).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Folder under which the run folder `audit-<method>-<time>-<pid>` is created.
    #[arg(long, default_value = "runs")]
    pub runs_dir: PathBuf,
    /// Print the audit report as one JSON object (no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// Runs `raptor audit`.
pub fn run_audit(args: AuditArgs) -> anyhow::Result<()> {
    let cfg = super::train::load_config(&args.config, args.json)?;
    let opts = AuditOptions {
        canaries: args.canaries,
        kind: args.kind,
        expert: args.expert,
        confidence: args.confidence,
        design_seed: args.seed,
    };
    let bar = super::update_bar(args.json);
    let mut progress =
        |done: u64, total: u64, m: &raptor_train::trainer::UpdateMetrics, _: Option<f64>| {
            bar.set_length(total);
            bar.set_position(done);
            bar.set_message(format!(
                "private batch loss {:.4} (not private: no noise)",
                m.loss
            ));
        };
    let result = audit(&cfg, &opts, &args.runs_dir, &mut progress);
    bar.finish_and_clear();
    let r = result?;
    if args.json {
        return super::print_json(&r);
    }
    println!(
        "run folder: {}  ({}: the secret coins and the scores, not differentially private)",
        r.run.display(),
        raptor_audit::AUDIT_FILE
    );
    println!(
        "canaries: {} ({}), {} included by secret coins; trained on N = {} records ({} real), q = {:.4}",
        r.canaries,
        r.kind.name(),
        r.included,
        r.train_records,
        r.real_records,
        r.sampling_rate
    );
    println!(
        "epsilon_lower = {:.4}  at {}% confidence (k+ = {}, k- = {}: {} of {} guesses correct; {} (k+, k-) pairs searched)",
        r.epsilon_lower,
        100.0 * r.confidence,
        r.search.k_plus,
        r.search.k_minus,
        r.search.correct,
        r.search.guesses,
        r.search.pairs_tried
    );
    match r.epsilon_upper {
        Some(u) => println!(
            "epsilon_upper = {u:.4}  certified by the ledger (target {}), delta = {:e}",
            r.epsilon_target, r.delta
        ),
        None => println!(
            "epsilon_upper = infinity  (no certified bound; target {}), delta = {:e}",
            r.epsilon_target, r.delta
        ),
    }
    if let Some(d) = &r.dirac {
        println!(
            "white-box canaries in {} parameters; plan made for N = {} (q = B/N, before the coins); bound from the {} statistic",
            d.params.len(),
            d.plan_records,
            d.statistic
        );
    }
    if let Some(x) = &r.expert {
        match x.epsilon_stream {
            Some(e) => println!(
                "expert {} of layer {}: epsilon of its stream alone = {e:.4} ({} updates, sigma {:.4}); the canaries test this claim",
                x.expert, x.layer, x.stream_updates, x.sigma
            ),
            None => println!(
                "expert {} of layer {}: its stream has no noise to account ({} updates)",
                x.expert, x.layer, x.stream_updates
            ),
        }
    }
    if let Some(m) = &r.mia {
        let how = if r.dirac.is_some() {
            "released coordinates"
        } else {
            "loss difference"
        };
        println!(
            "canary MIA ({how}): AUC {:.4}  TPR@1%FPR {:.4}  TPR@0.1%FPR {:.4}  ({} members, {} non-members)",
            m.auc, m.tpr_at_1pct_fpr, m.tpr_at_0_1pct_fpr, m.members, m.non_members
        );
    }
    for n in &r.notes {
        println!("note: {n}");
    }
    Ok(())
}
