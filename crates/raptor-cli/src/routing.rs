//! `routing`: per-layer owner statistics and the selected layer for router outputs read
//! from a JSON-lines file (format: `raptor_routing::jsonl`, documented in
//! `crates/raptor-routing/README.md`).

use std::fmt::Write as _;
use std::io::BufReader;
use std::path::PathBuf;

use raptor_routing::jsonl::read_jsonl;
use raptor_routing::stats::stats_table;
use raptor_routing::{OwnerRule, PublicCorpus, SelectionConfig, WeightPrecision, select_layer};
use serde::Serialize;

use crate::{CliError, Result, print_json, print_text};

/// Owner rule (command-line spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuleArg {
    /// Gate-weighted plurality over the top-k choices of valid tokens (default).
    GateWeighted,
    /// Count of valid tokens whose top-1 choice is the expert (the public code's Switch rule).
    TokenCount,
}

impl From<RuleArg> for OwnerRule {
    fn from(r: RuleArg) -> Self {
        match r {
            RuleArg::GateWeighted => OwnerRule::GateWeighted,
            RuleArg::TokenCount => OwnerRule::TokenCount,
        }
    }
}

/// Routing statistics and public-corpus layer selection.
///
/// The input is treated as a PUBLIC corpus: you supplied it as your layer-selection corpus, so
/// its statistics are printed freely. Do not run this on router outputs of your private training
/// records: their owner statistics are private and printing them is a release that no privacy
/// accountant covers.
#[derive(Debug, Clone, clap::Args)]
#[command(
    long_about = "Per-layer owner statistics (entropy H in nats, H/ln E, deficit, chi^2 = \
E*sum q^2 - 1, load CV, min/max q, empty experts) and the selected layer (highest H; margin to the \
runner-up; warnings below 0.05 nats or under 1000 records) for router outputs in a JSON-lines \
file, one record per line:\n\n  {\"layers\": [{\"experts\": [[top-k indices] per token], \
\"weights\": [[top-k gate weights] per token], \"mask\": [1 or 0 per token, optional]}, ...]}\n\n\
Layer ids are the positions in \"layers\". The file is treated as a PUBLIC corpus (the one you \
choose the layer on), so its statistics are printed; never pass router outputs of private \
training records."
)]
pub struct RoutingArgs {
    /// JSON-lines file of router outputs on a public corpus.
    #[arg(long)]
    pub input: PathBuf,
    /// Number of experts E. Default: inferred as the largest expert index in the file plus one
    /// (underestimates E when the top experts are never chosen).
    #[arg(long)]
    pub num_experts: Option<usize>,
    /// Owner rule.
    #[arg(long, value_enum, default_value = "gate-weighted")]
    pub rule: RuleArg,
    /// Warn when the entropy margin to the runner-up is below this many nats.
    #[arg(long, default_value_t = 0.05)]
    pub min_margin: f64,
    /// Warn when the corpus has fewer records than this.
    #[arg(long, default_value_t = 1000)]
    pub min_records: usize,
    /// Choose the last layer when the argmax does not beat it by more than --min-margin.
    #[arg(long)]
    pub prefer_last_within_margin: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    input: String,
    corpus: &'static str,
    num_records: usize,
    num_layers: usize,
    num_experts: usize,
    num_experts_inferred: bool,
    top_k: Vec<usize>,
    config: SelectionConfig,
    selection: &'a raptor_routing::LayerSelection,
}

/// Run `routing`: the statistics table (or JSON) and the selected layer.
pub fn run(args: RoutingArgs) -> Result<()> {
    if !(args.min_margin.is_finite() && args.min_margin >= 0.0) {
        return Err(CliError::InvalidArgument(format!(
            "--min-margin must be a finite non-negative number, got {}",
            args.min_margin
        )));
    }
    let path = args.input.display().to_string();
    let file = std::fs::File::open(&args.input).map_err(|error| CliError::Open {
        path: path.clone(),
        error,
    })?;
    let data = read_jsonl(BufReader::new(file), args.num_experts, WeightPrecision::F32).map_err(
        |error| CliError::Routing {
            context: format!("reading {path}"),
            error,
        },
    )?;
    let top_k: Vec<usize> = data.layers.iter().map(|l| l.top_k()).collect();
    let (num_records, num_layers) = (data.num_records, data.layers.len());
    let selection_error = |error| CliError::Routing {
        context: format!("layer selection on {path}"),
        error,
    };
    let corpus = PublicCorpus::from_layers(data.layers).map_err(selection_error)?;
    let config = SelectionConfig {
        rule: args.rule.into(),
        min_margin_nats: args.min_margin,
        min_records: args.min_records,
        prefer_last_within_margin: args.prefer_last_within_margin,
    };
    let sel = select_layer(&corpus, &config).map_err(selection_error)?;
    if args.json {
        return print_json(&Report {
            input: path,
            corpus: "public",
            num_records,
            num_layers,
            num_experts: data.num_experts,
            num_experts_inferred: data.num_experts_inferred,
            top_k,
            config,
            selection: &sel,
        });
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: public corpus, {num_records} records, {num_layers} candidate layers, E = {}{}, top-k {:?}, rule {:?}",
        path,
        data.num_experts,
        if data.num_experts_inferred {
            " (inferred: max index + 1)"
        } else {
            ""
        },
        top_k,
        config.rule,
    );
    let _ = writeln!(s);
    s.push_str(&stats_table(&sel.stats));
    let _ = writeln!(s);
    let margin = sel
        .margin_nats
        .map_or("n/a".to_string(), |m| format!("{m:.4} nats"));
    let runner = sel.runner_up.map_or("none".to_string(), |r| r.to_string());
    let _ = writeln!(
        s,
        "selected layer: {} ({:?}); runner-up: {runner}; margin: {margin}",
        sel.layer, sel.reason
    );
    for w in &sel.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    print_text(&s)
}
