//! `raptor upcycle`: sparse upcycling of a dense checkpoint folder (Komatsuzaki et al., 2023).
//!
//! A dense Llama-style folder becomes a Mixtral-style folder, a BERT folder a MoE-BERT folder
//! (raptor's layout, `model.kind = "moe-bert"`): every layer's MLP is copied into E experts
//! under a new router drawn N(0, σ²) from a seeded stream; the router is frozen in training.
//! With `--router-data` (MoE-BERT) the routers are first trained briefly on that **public**
//! text, non-privately, with the Switch load-balancing loss, then frozen like random ones.
//! The work is done by the library's [`raptor_run::upcycle::upcycle_folder`]; this module
//! parses the arguments and prints what was written.

use std::path::{Path, PathBuf};

use clap::Args;
use raptor_models::upcycle::UpcycleOptions;

use raptor_run::upcycle::{RouterData, UpcycledLayout, upcycle_folder};

/// Arguments of `raptor upcycle`.
#[derive(Debug, Args)]
pub struct UpcycleArgs {
    /// The dense Llama or BERT folder (`config.json` + safetensors), or the name of a model
    /// of the cache (e.g. `all-minilm-l6-v2`).
    #[arg(long)]
    pub model: PathBuf,
    /// The folder to write (Mixtral or MoE-BERT layout).
    #[arg(long)]
    pub out: PathBuf,
    /// Experts per layer.
    #[arg(long, default_value_t = 8)]
    pub experts: i64,
    /// Experts per token.
    #[arg(long, default_value_t = 2)]
    pub top_k: i64,
    /// Seed of the router initialization.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Standard deviation of the router initialization.
    #[arg(long, default_value_t = 0.02)]
    pub router_std: f64,
    /// Train the routers (MoE-BERT only) briefly on this **public** text file before writing
    /// them (non-private: never pass private records): Adam on the Switch load-balancing
    /// loss, after which they stay frozen as always. Without it the routers stay random.
    #[arg(long)]
    pub router_data: Option<PathBuf>,
    /// Text column of `--router-data` (CSV, TSV or JSONL).
    #[arg(long, default_value = "text", requires = "router_data")]
    pub router_text_column: String,
    /// Tokenizer of `--router-data`, as `model.tokenizer` (`model`: the folder's
    /// tokenizer.json).
    #[arg(long, default_value = "model", requires = "router_data")]
    pub router_tokenizer: raptor_train::config::TokenizerSpec,
    /// Tokens per public record (special tokens included).
    #[arg(long, default_value_t = 64, requires = "router_data")]
    pub router_max_length: usize,
    /// Public records used at most (an evenly strided subset; 0: all).
    #[arg(long, default_value_t = 2000, requires = "router_data")]
    pub router_records: usize,
    /// Adam steps of router training per layer.
    #[arg(long, default_value_t = 100, requires = "router_data")]
    pub router_steps: usize,
    /// Adam learning rate of router training.
    #[arg(long, default_value_t = 1e-3, requires = "router_data")]
    pub router_lr: f64,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `raptor upcycle`: resolves a bare model name against the cache, upcycles, prints what
/// was written.
///
/// # Errors
/// As [`raptor_run::upcycle::upcycle_folder`].
pub fn run_upcycle(a: UpcycleArgs) -> anyhow::Result<()> {
    // A bare name is a model of the cache (`cargo xtask setup --models`), as in configs.
    let cache = raptor_data::cache::default_cache_dir();
    let model =
        raptor_train::config::resolve_model_path(&a.model, Path::new("."), cache.as_deref());
    let mut opts = UpcycleOptions::new(a.experts, a.top_k);
    opts.seed = a.seed;
    opts.router_std = a.router_std;
    let router = a.router_data.as_ref().map(|file| RouterData {
        file: file.clone(),
        text_column: a.router_text_column.clone(),
        tokenizer: a.router_tokenizer.clone(),
        max_length: a.router_max_length,
        max_records: a.router_records,
        training: raptor_models::upcycle::RouterTraining {
            steps: a.router_steps,
            lr: a.router_lr,
        },
    });
    let report = upcycle_folder(&model, &a.out, &opts, router.as_ref())?;
    let layout = report.layout;
    if a.json {
        let mut v = serde_json::json!({
            "model": model.display().to_string(),
            "out": a.out.display().to_string(),
            "model_type": layout.name(),
            "experts": a.experts,
            "top_k": a.top_k,
            "seed": a.seed,
            "router_std": a.router_std,
        });
        if let (Some((before, after)), Some(obj)) = (&report.router_loads, v.as_object_mut()) {
            obj.insert(
                "router_training".into(),
                serde_json::json!({
                    "public_file": a.router_data.as_ref().map(|p| p.display().to_string()),
                    "public_records": report.router_records,
                    "steps": a.router_steps,
                    "lr": a.router_lr,
                    "before": before,
                    "after": after,
                }),
            );
        }
        return super::print_json(&v);
    }
    if let Some((before, after)) = &report.router_loads {
        for (b, t) in before.iter().zip(after) {
            println!(
                "layer {}: router load CV {:.3} (random) -> {:.3} (trained on {} public records), balance loss {:.4} -> {:.4}",
                b.layer,
                b.load_cv,
                t.load_cv,
                report.router_records,
                b.balance_loss,
                t.balance_loss
            );
        }
    }
    println!(
        "upcycled {} into {} ({} experts, top-{}, {} layout)",
        model.display(),
        a.out.display(),
        a.experts,
        a.top_k,
        match layout {
            UpcycledLayout::MoeBert => "MoE-BERT",
            UpcycledLayout::Mixtral => "Mixtral",
        }
    );
    Ok(())
}
