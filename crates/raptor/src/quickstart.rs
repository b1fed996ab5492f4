//! A run config from the data alone: `raptor train --data train.csv` and `raptor init --data
//! train.csv`.
//!
//! [`resolve`] detects the text and label columns (`raptor_data::detect`), counts the records
//! and fills in the rest from documented defaults:
//!
//! | what | default | why |
//! |---|---|---|
//! | backbone | `all-minilm-l6-v2` (BERT, 6 layers, hidden 384; fetched into the cache on first use), mean pooling, a new linear head | a pretrained encoder learns from a few thousand records; a random one does not |
//! | method | `dp-adam` over LoRA (r 8, α 16) on the attention projections + the head | the private method that learned best on the measured sets |
//! | RAPTOR and its baselines (`--method raptor`, …) | the backbone upcycled to a MoE-BERT ([`MOE_BACKBONE`]: E = 8 experts, top-1, in every layer), routers trained on public text (the Rotten Tomatoes public split) with the load-balancing loss, then frozen; layer chosen by public routing entropy | the method needs routed experts |
//! | LoRA placement | the attention projections of the upper half of the layers (MiniLM: layers 3–5) | backpropagation stops at the lowest adapted layer: a third less compute per update than adapters in every layer |
//! | `data.max_length` | 128 tokens (`[CLS]`/`[SEP]` included), capped at the model's position embeddings | |
//! | expected batch B | `clamp(round(N / 8), 32, 256)`, at most N | DP noise per update is σ·C/B: a larger batch drowns it; past 256 the cost grows faster than the gain |
//! | updates T | `clamp(ceil(6 · N / B), 20, 100)` (about 6 epochs) | chosen on public splits only (2,000 Rotten Tomatoes and 2,000 CrowdFlower public records, validation on their validation splits; one run each at ε = 8): against 3 epochs, 6 epochs gained 4.4 and 3.6 points, a batch of N/4 over 6 epochs 3.8 and 1.8, lr 0.02 3.4 and 0.4, lr 0.005 −5.2 (Rotten Tomatoes); the rule written first: the variant with the largest mean gain if above 2 points. Cost on 2 free cores (measured): 10.2 minutes for 2,000 Reuters stories of 128 tokens (5.3 at 3 epochs); at ε = 8 and q ≈ 1/8, σ ≈ 0.9 |
//! | learning rate | by the method ([`default_lr`]), constant: 0.01 for the private methods over LoRA (AdamW, weight decay 0.01; DP-Muon's hidden matrices at `method.muon_lr` 0.02); 0.001 for the non-private references over LoRA (`adam`, `lora`, `muon`); DP-SGD [`DP_SGD_LR`] with heavy-ball momentum [`DP_SGD_MOMENTUM`]; full fine-tuning (`dp-adam-full`, `full`) [`FULL_LR`] | 0.01 was chosen for noisy private updates; without the noise it is too large (see [`default_lr`], which says what was measured and what was not) |
//! | clipping bound | 1.0 | |
//! | validation | the `--validation` file, else 10 % of the training file held out | |
//! | ε | 8 (`--epsilon`) | |
//! | δ | left unset: the privacy work's default for N records | |
//!
//! N, the number of training records, is treated as public, as everywhere in raptor (q = B/N);
//! the label set is read from the training file and so is revealed by the run.

use std::path::PathBuf;

use raptor_data::detect::detect_columns;

use raptor_train::config::{Method, MethodConfig, ModelKind, RunConfig, Scope, TokenizerSpec};
use raptor_train::error::{Result, TrainError};

/// The pretrained backbone of a run with no model given (a model of
/// `raptor_data::pretrained::MODELS`).
pub const BACKBONE: &str = "all-minilm-l6-v2";

/// The cache folder of [`BACKBONE`] upcycled for RAPTOR and its baselines
/// ([`crate::provision::ensure_moe_backbone`]).
pub const MOE_BACKBONE: &str = "all-minilm-l6-v2-moe8";

/// Tokens per record of a one-command run.
pub const MAX_LENGTH: usize = 128;

/// What the user gave.
#[derive(Debug, Clone, PartialEq)]
pub struct QuickStart {
    /// The training file (CSV, TSV or JSONL).
    pub train: PathBuf,
    /// A validation file (same columns); else 10 % of the training file is held out.
    pub validation: Option<PathBuf>,
    /// The method; None: DP-Adam over LoRA on the dense backbone.
    pub method: Option<Method>,
    /// Target ε.
    pub epsilon: f64,
    /// The text column; None: detected.
    pub text_column: Option<String>,
    /// The label column; None: detected.
    pub label_column: Option<String>,
    /// A randomly initialized Switch encoder (bytes tokenizer) instead of the pretrained
    /// backbone.
    pub random_init: bool,
}

/// What [`resolve`] decided.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The config (data paths as given; the model as a name of the cache).
    pub config: RunConfig,
    /// Records in the training file (before any validation hold-out).
    pub records: usize,
    /// What was assumed or chosen and why, one sentence each (columns, backbone, B, T, lr).
    pub notes: Vec<String>,
}

/// The expected batch of the default rule for `n` training records:
/// `clamp(round(n / 8), 32, 256)`, at most `n`.
/// (2,000 records: 250; 100: 32; 10: 10; a million: 256.)
pub fn default_batch(n: usize) -> f64 {
    let b = ((n as f64) / 8.0).round().clamp(32.0, 256.0);
    b.min(n.max(1) as f64)
}

/// The updates of the default rule: `clamp(ceil(EPOCHS · n / b), 20, 100)`.
/// (2,000 records at B 250: 48; 100 at 32: 20; a million at 256: 100.)
pub fn default_updates(n: usize, b: f64) -> u64 {
    ((EPOCHS * n as f64 / b.max(1.0)).ceil() as u64).clamp(20, 100)
}

/// Passes over the training records of the default rule.
pub const EPOCHS: f64 = 6.0;

/// What the rule needs to know of the backbone's checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backbone {
    /// Encoder layers (`num_hidden_layers`); LoRA goes on the upper half. None: every layer.
    pub layers: Option<usize>,
    /// Position embeddings (`max_position_embeddings`): caps `data.max_length`.
    pub max_positions: Option<usize>,
}

/// LoRA targets on the attention projections of the upper half of `layers` BERT layers
/// (`layer.<i>.attention`, which matches `attention.self.{query,key,value}` and
/// `attention.output.dense` of layer i).
/// (6 layers: `layer.3`, `layer.4`, `layer.5`; 1 layer: `layer.0`.)
pub fn upper_half_targets(layers: usize) -> Vec<String> {
    (layers / 2..layers.max(1))
        .map(|i| format!("layer.{i}.attention"))
        .collect()
}

/// Records per micro-batch of the default rule (`train.micro_batch`) on the dense backbone.
pub const MICRO_BATCH: usize = 64;

/// Records per micro-batch of the default rule for the methods on the upcycled backbone (8
/// experts per layer). Measured on a 9-class set of 2,000 records (expected batch 250): with 64
/// the MoE run peaked at 845 MiB, 1.55× the dense run's 543 MiB; with 32 at 745 MiB (1.37×, the
/// checkpoint's load being the peak), same accuracy within the noise (49.2 % and 50.0 %).
pub const MOE_MICRO_BATCH: usize = 32;

/// Learning rate of the default rule for the private methods over LoRA (r 8 + head, AdamW).
pub const DEFAULT_LR: f64 = 0.01;

/// Learning rate of the default rule for the non-private references over LoRA (`adam`, `lora`,
/// `muon`'s AdamW part).
pub const NON_PRIVATE_LR: f64 = 0.001;

/// Learning rate of the default rule for DP-SGD (SGD with [`DP_SGD_MOMENTUM`] over LoRA + head).
pub const DP_SGD_LR: f64 = 0.1;

/// Heavy-ball momentum of the default rule for DP-SGD (`train.momentum`). Momentum is
/// post-processing of the released gradients: it costs no privacy, and it averages the noise of
/// about 1/(1 − β) updates into each step while the signal adds up, which plain SGD at the same
/// effective rate does not (measured: see [`default_lr`]).
pub const DP_SGD_MOMENTUM: f64 = 0.9;

/// Learning rate of the default rule for full fine-tuning (`dp-adam-full`, `full`: every weight
/// of the pretrained backbone but the routers, AdamW).
pub const FULL_LR: f64 = 1e-4;

/// The learning rate of the default rule for `method`.
///
/// AdamW moves every coordinate by about the rate at each update, in the direction of
/// m/√v. In private training m and v are dominated by the noise, so that direction is mostly
/// noise and averages out; 0.01 was chosen for that (on public splits, against 0.02 and 0.005).
/// Without the noise m/√v keeps its sign from update to update and the same rate moves every
/// adapter coordinate by 0.01 per update in one direction: the non-private MoE reference
/// (`lora`: adapters on every expert, 1.55 M parameters) diverged at 0.01 (Rotten Tomatoes,
/// 1,000 records: batch loss 1.61 → 0.97 → 2.37, then chance), so the non-private references
/// train at a tenth of it. SGD's step is the rate times the clipped, noised mean gradient
/// (norm at most the clip bound plus the noise), not a per-coordinate one, so DP-SGD needs a
/// far larger rate; full fine-tuning moves the pretrained weights themselves (BERT's are about
/// 0.04 in size), so it takes a far smaller one. Measured on 1,000 public Rotten Tomatoes
/// records (one run each, docs/results/one-command.md): dp-adam at 0.01 and adam at 0.001
/// learn (70.2 % and 75.0 % against a 61.0 % majority). Plain DP-SGD learned at none of 0.3,
/// 1 and 3 (62.0 %, 64.0 %, 61.0 %); with momentum 0.9 it learned at 0.1 (71.5 %) and at none
/// of 0.03, 0.3 and 1 (61.0 %, 65.8 %, 53.5 %), so DP-SGD takes 0.1 with momentum
/// [`DP_SGD_MOMENTUM`]; on two check sets that share no record with those (1,000 Rotten
/// Tomatoes and 1,000 CrowdFlower training records) it learned too (73.0 % against a 63.5 %
/// majority, 65.2 % against 45.7 %). Full fine-tuning's 1e-4 is the usual rate for every
/// weight of a BERT-sized encoder, not measured here.
pub fn default_lr(method: Method) -> f64 {
    lr_rule(method).0
}

/// The rate of [`default_lr`] for `method`, and why, in a few words (for the start notes).
fn lr_rule(method: Method) -> (f64, &'static str) {
    match method {
        Method::DpSgd => (DP_SGD_LR, "SGD with momentum 0.9"),
        Method::DpAdamFull | Method::Full => {
            (FULL_LR, "full fine-tuning of the pretrained weights")
        }
        Method::Adam | Method::Lora | Method::Muon => (
            NON_PRIVATE_LR,
            "a non-private reference: no noise, a tenth of the private rate",
        ),
        Method::Raptor
        | Method::DpAdamLora
        | Method::MatchedScope
        | Method::SharedOnly
        | Method::ExpertOnly
        | Method::DpAdam
        | Method::DpMuon
        | Method::DpMuonbc => (DEFAULT_LR, "private, over LoRA"),
    }
}

/// Why the one command does not offer `expert-only`: the ablation trains RAPTOR's expert
/// streams alone, and the new classification head of a one-command run belongs to the shared
/// stream, so it would stay at its random start and the run could not learn (measured on a
/// 9-class set: 16.8 % against a 14.6 % majority class, where `shared-only` reached 51.8 %).
pub const EXPERT_ONLY_REFUSED: &str = "--method expert-only trains the expert streams alone, and a one-command run's new \
     classification head is in the shared stream: it would stay at its random start and the \
     run could not learn. It is an ablation for a config whose head is already trained \
     (`raptor train --config`); here use --method raptor or shared-only";

/// Fraction of the training file held out for validation without a `--validation` file.
pub const VALIDATION_FRACTION: f64 = 0.1;

/// The config of a one-command run: columns detected, the rest from the default rule of the
/// module docs.
///
/// # Errors
/// An unreadable training file, columns that cannot be detected, a validation file without
/// the detected columns, a non-finite / non-positive ε, or `expert-only` (see
/// [`EXPERT_ONLY_REFUSED`]).
pub fn resolve(q: &QuickStart, backbone: Backbone) -> Result<Resolved> {
    if !(q.epsilon.is_finite() && q.epsilon > 0.0) {
        return Err(TrainError::Config(format!(
            "--epsilon {} must be finite and > 0",
            q.epsilon
        )));
    }
    if q.method == Some(Method::ExpertOnly) {
        return Err(TrainError::Config(EXPERT_ONLY_REFUSED.into()));
    }
    let data_err = |e: raptor_data::DataError| TrainError::Data(e.to_string());
    let detection = detect_columns(
        &q.train,
        q.text_column.as_deref(),
        q.label_column.as_deref(),
    )
    .map_err(data_err)?;
    if let Some(v) = &q.validation {
        // The validation file must hold the same columns.
        let spec = raptor_data::TableSpec::new(&detection.text, Some(&detection.label));
        raptor_data::read_table(v, &spec).map_err(data_err)?;
    }
    let n = detection.rows;
    let n_train = if q.validation.is_some() {
        n
    } else {
        n - raptor_data::held_out_size(n, VALIDATION_FRACTION)
    };
    let mut notes: Vec<String> = detection.assumptions.clone();
    notes.push(format!(
        "{} labels in the training file: {}",
        detection.labels.len(),
        detection.labels.join(", ")
    ));
    let mut notes_early: Vec<String> = Vec::new();
    let mut cfg = RunConfig::default();
    cfg.data.train = q.train.clone();
    cfg.data.validation = q.validation.clone();
    cfg.data.validation_fraction = VALIDATION_FRACTION;
    cfg.data.text_column = detection.text.clone();
    cfg.data.label_column = detection.label.clone();
    cfg.data.max_length = match backbone.max_positions {
        Some(p) if p < MAX_LENGTH => {
            notes_early.push(format!(
                "data.max_length: {p} tokens, the model's position embeddings"
            ));
            p
        }
        _ => MAX_LENGTH,
    };
    let method = q.method.unwrap_or(Method::DpAdam);
    cfg.method = MethodConfig::new(method);
    let moe = method.needs_experts()
        || matches!(
            method,
            Method::DpAdamLora | Method::DpAdamFull | Method::Lora | Method::Full
        );
    if q.random_init {
        cfg.model.kind = if moe {
            ModelKind::Switch
        } else {
            ModelKind::Bert
        };
        cfg.model.path = None;
        cfg.model.tokenizer = TokenizerSpec::Bytes;
        cfg.data.max_length = 64;
        notes.push(
            "model: initialized at random (--random-init), bytes tokenizer, 64 bytes per record"
                .into(),
        );
    } else if moe {
        cfg.model.kind = ModelKind::MoeBert;
        cfg.model.path = Some(PathBuf::from(MOE_BACKBONE));
        cfg.model.tokenizer = TokenizerSpec::Model;
        cfg.data.public = Some(PathBuf::from(format!(
            "cache:data/{}/public.tsv",
            raptor_data::cache::ROTTEN_TOMATOES.name
        )));
        notes.push(format!(
            "model: {BACKBONE} upcycled to a MoE-BERT ({MOE_BACKBONE}: 8 experts, top-1, routers trained on public text and frozen), because {} needs routed experts; public text for the layer choice: the Rotten Tomatoes public split",
            method
        ));
    } else {
        cfg.model.kind = ModelKind::Bert;
        cfg.model.path = Some(PathBuf::from(BACKBONE));
        cfg.model.tokenizer = TokenizerSpec::Model;
        notes.push(format!(
            "model: {BACKBONE} (pretrained BERT, mean pooling, new linear head)"
        ));
    }
    if !moe && let Some(scope) = cfg.method.scope_mut() {
        *scope = Scope::Lora;
    }
    if let (Some(l), false) = (backbone.layers, q.random_init) {
        cfg.lora.attention_targets = upper_half_targets(l);
        notes.push(format!(
            "LoRA (r 8) on the attention of layers {}..{} of {l} (the upper half) and the head",
            l / 2,
            l.max(1) - 1
        ));
    }
    cfg.privacy.epsilon = q.epsilon;
    let b = default_batch(n_train);
    let t = default_updates(n_train, b);
    cfg.train.batch_size = b;
    cfg.train.steps = Some(t);
    let lr = default_lr(method);
    cfg.train.lr = lr;
    if method == Method::DpSgd {
        cfg.train.momentum = DP_SGD_MOMENTUM;
    }
    cfg.train.clip = 1.0;
    cfg.train.clip_expert = 1.0;
    cfg.train.micro_batch = if moe { MOE_MICRO_BATCH } else { MICRO_BATCH };
    cfg.train.checkpoint_every = (t / 4).max(10);
    notes.push(format!(
        "schedule: {n_train} training records -> expected batch {b:.0} (N/8 within [32, 256]), {t} updates ({EPOCHS} epochs within [20, 100]), lr {lr} ({}), clip 1.0",
        lr_rule(method).1
    ));
    notes.extend(notes_early);
    Ok(Resolved {
        config: cfg,
        records: n,
        notes,
    })
}

/// The config as commented TOML for editing (`raptor init`): a header that says where it came
/// from and what was assumed, then every field.
///
/// # Errors
/// A config that does not serialize (never for a config [`resolve`] made).
pub fn commented_toml(r: &Resolved) -> Result<String> {
    let mut out = String::new();
    out.push_str("# raptor run configuration, written by `raptor init` from the training data.\n");
    out.push_str("# Train with: raptor train --config <this file>\n");
    out.push_str("# Relative paths are resolved against the folder of this file; a bare model\n");
    out.push_str("# name is a model of the per-user cache (fetched on first use).\n#\n");
    out.push_str("# What was detected or assumed:\n");
    for n in &r.notes {
        out.push_str(&format!("#   - {n}\n"));
    }
    out.push_str(
        "#\n# Every field of `raptor train --print-default-config` may be added; [method]\n",
    );
    out.push_str(
        "# takes the knobs of the method it names (another method's knob is an error).\n\n",
    );
    out.push_str(&r.config.to_toml()?);
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The rule's batch, updates and LoRA targets at the documented points.
    #[test]
    fn the_default_rule_at_documented_points() {
        assert_eq!(default_batch(2000), 250.0);
        assert_eq!(default_batch(100), 32.0);
        assert_eq!(default_batch(10), 10.0);
        assert_eq!(default_batch(1_000_000), 256.0);
        assert_eq!(default_updates(2000, 250.0), 48);
        assert_eq!(default_updates(100, 32.0), 20);
        assert_eq!(default_updates(135, 32.0), 26);
        assert_eq!(default_updates(1_000_000, 256.0), 100);
        assert_eq!(
            upper_half_targets(6),
            [
                "layer.3.attention",
                "layer.4.attention",
                "layer.5.attention"
            ]
        );
        assert_eq!(upper_half_targets(1), ["layer.0.attention"]);
    }

    /// Every method the one command offers gets a rate by its kind: private over LoRA 0.01,
    /// the non-private references a tenth of it, DP-SGD (with momentum) and full fine-tuning
    /// their own; the resolved config carries it.
    #[test]
    fn the_learning_rate_follows_the_method() {
        use raptor_train::config::Choice;
        for &m in <Method as Choice>::ALL {
            if m == Method::ExpertOnly {
                continue; // refused by the one command (tested below)
            }
            let lr = default_lr(m);
            let want = match m {
                Method::DpSgd => DP_SGD_LR,
                Method::DpAdamFull | Method::Full => FULL_LR,
                _ if !m.is_private() => DEFAULT_LR / 10.0,
                _ => DEFAULT_LR,
            };
            assert_eq!(lr, want, "{m:?}");
            let mut x = q(table(200, 2));
            x.method = Some(m);
            let r = resolve(&x, Backbone::default()).unwrap();
            assert_eq!(r.config.train.lr, lr, "{m:?}");
            // DP-SGD's momentum comes with its rate; every other method keeps plain steps.
            let momentum = if m == Method::DpSgd {
                DP_SGD_MOMENTUM
            } else {
                0.0
            };
            assert_eq!(r.config.train.momentum, momentum, "{m:?}");
            assert!(
                r.notes.iter().any(|n| n.contains(&format!("lr {lr} ("))),
                "{m:?}: {:?}",
                r.notes
            );
        }
    }

    fn table(rows: usize, classes: usize) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "raptor-quickstart-{}-{rows}-{classes}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("train.csv");
        let mut s = String::from("stars,review text\n");
        for i in 0..rows {
            s.push_str(&format!(
                "{},\"a review, number {i}, of some length\"\n",
                i % classes
            ));
        }
        std::fs::write(&p, s).unwrap();
        p
    }

    fn q(train: PathBuf) -> QuickStart {
        QuickStart {
            train,
            validation: None,
            method: None,
            epsilon: 8.0,
            text_column: None,
            label_column: None,
            random_init: false,
        }
    }

    #[test]
    fn the_default_rule_is_applied_to_the_detected_data() {
        let six = Backbone {
            layers: Some(6),
            max_positions: Some(512),
        };
        let r = resolve(&q(table(2000, 5)), six).unwrap();
        let c = &r.config;
        assert_eq!(
            (c.data.text_column.as_str(), c.data.label_column.as_str()),
            ("review text", "stars")
        );
        assert_eq!(r.records, 2000);
        // 10 % held out: 1800 training records -> B 225, T = ceil(6 · 1800 / 225) = 48.
        assert_eq!(c.train.batch_size, 225.0);
        assert_eq!(c.train.steps, Some(48));
        assert_eq!(c.lora.attention_targets.len(), 3);
        assert_eq!(c.data.max_length, MAX_LENGTH);
        assert_eq!(
            (c.model.kind, c.method.name()),
            (ModelKind::Bert, Method::DpAdam)
        );
        assert_eq!(c.method.scope(), Some(Scope::Lora));
        assert_eq!(c.model.path.as_deref(), Some(Path::new(BACKBONE)));
        assert_eq!(c.privacy.delta, None, "δ is left to the privacy default");
        c.validate().unwrap();
        assert!(r.notes.iter().any(|n| n.contains("5 labels")));
        let text = commented_toml(&r).unwrap();
        let back = RunConfig::from_toml(&text).unwrap();
        assert_eq!(&back, c, "the commented config parses to the same config");
    }

    #[test]
    fn expert_methods_get_the_upcycled_backbone_and_bad_input_is_an_error() {
        let mut x = q(table(300, 2));
        x.method = Some(Method::Raptor);
        let small = Backbone {
            layers: Some(2),
            max_positions: Some(32),
        };
        let r = resolve(&x, small).unwrap();
        assert_eq!(r.config.data.max_length, 32);
        assert_eq!(r.config.lora.attention_targets, ["layer.1.attention"]);
        assert_eq!(r.config.model.kind, ModelKind::MoeBert);
        assert_eq!(r.config.train.micro_batch, MOE_MICRO_BATCH);
        assert_eq!(
            r.config.model.path.as_deref(),
            Some(Path::new(MOE_BACKBONE))
        );
        assert!(r.config.data.public.is_some());
        r.config.validate().unwrap();
        // expert-only would leave the new head untrained: refused, saying why and what to use.
        x.method = Some(Method::ExpertOnly);
        let e = resolve(&x, small).unwrap_err().to_string();
        assert!(e.contains("head") && e.contains("shared-only"), "{e}");
        x.method = Some(Method::Raptor);
        x.epsilon = f64::NAN;
        assert!(
            resolve(&x, small)
                .unwrap_err()
                .to_string()
                .contains("--epsilon")
        );
        let mut y = q(table(50, 2));
        y.label_column = Some("absent".into());
        assert!(
            resolve(&y, Backbone::default())
                .unwrap_err()
                .to_string()
                .contains("absent")
        );
        y.label_column = None;
        y.random_init = true;
        let r = resolve(&y, Backbone::default()).unwrap();
        assert_eq!(r.config.model.path, None);
        assert_eq!(r.config.train.batch_size, 32.0);
        assert_eq!(r.config.train.micro_batch, MICRO_BATCH);
    }
}
