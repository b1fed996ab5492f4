use std::path::{Path, PathBuf};

#[cfg(feature = "planted-faults")]
use super::{AuditOptions, AuditReport, CanaryKind, Tamper, audit_impl};
#[cfg(feature = "planted-faults")]
use crate::error::{AuditError, Result};
#[cfg(feature = "planted-faults")]
use raptor_run::Progress;
use raptor_train::config::{LayerSpec, Method, ModelKind, RunConfig, TokenizerSpec};
#[cfg(feature = "planted-faults")]
pub use raptor_train::trainer::PlantedFault;

/// A white-box audit as [`super::audit`] runs it, with `fault` planted in the trainer: the
/// releases' noise differs from the plan while the ledger charges the planned σ, or the ledger
/// charges one sample's streams as separate samples. White-box canaries only (`opts.kind` None,
/// `Some(Dirac)` or `Some(Paired)`). Under the feature `planted-faults` only.
#[cfg(feature = "planted-faults")]
pub fn audit_with_fault(
    cfg: &RunConfig,
    opts: &AuditOptions,
    runs_dir: &Path,
    progress: Progress<'_>,
    fault: PlantedFault,
) -> Result<AuditReport> {
    if opts
        .kind
        .is_some_and(|k| !matches!(k, CanaryKind::Dirac | CanaryKind::Paired))
    {
        return Err(AuditError::Config(
            "planted bugs are for white-box (dirac, paired) audits".into(),
        ));
    }
    let opts = AuditOptions {
        kind: Some(opts.kind.unwrap_or(CanaryKind::Dirac)),
        ..opts.clone()
    };
    audit_impl(cfg, &opts, runs_dir, progress, Tamper::Fault(fault))
}

/// The toy data of the repository (`examples/toy`).
pub fn toy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/toy")
}

/// The default config on the toy data (`train.csv`, all for training, columns `text` and
/// `label`, 16 byte tokens per record).
pub fn toy_data() -> RunConfig {
    let mut c = RunConfig::default();
    c.data.train = toy_dir().join("train.csv");
    c.data.validation = None;
    c.data.validation_fraction = 0.0;
    c.data.text_column = "text".into();
    c.data.label_column = "label".into();
    c.data.max_length = 16;
    c.model.tokenizer = TokenizerSpec::Bytes;
    c
}

/// The setting of the white-box audit's tests and table: a tiny Switch classifier on the
/// toy sentiment data (600 records; d 64, 2 blocks, the second sparse with 4 experts of
/// d_ff 640), LoRA r = 32 on the attention and on the experts (45,056 coordinates per
/// expert), `steps` updates at q = 0.01 of N = 600 + ⌈m/2⌉ (`m` canaries), δ = 10⁻⁶, target
/// `epsilon`, RAPTOR's ρ = 0.5 on its last layer, seeded by `train.insecure_seed` = 11 (NOT
/// private). Few real records per update (about 6): the canaries need no forward pass, so m
/// is cheap.
pub fn toy_switch(method: Method, epsilon: f64, m: usize, steps: u64) -> RunConfig {
    let mut c = toy_data();
    c.model.kind = ModelKind::Switch;
    c.model.d_model = 64;
    c.model.layers = 2;
    c.model.heads = 2;
    c.model.d_ff = 640;
    c.model.experts = 4;
    c.lora.r = 32;
    c.lora.alpha = 32.0;
    c.method = raptor_train::config::MethodConfig::new(method);
    // RAPTOR's knobs only where they apply (the validator reports them elsewhere).
    if method == Method::Raptor {
        if let Some(e) = c.method.expert_layer_mut() {
            e.layer = LayerSpec::Last;
        }
        c.privacy.rho = 0.5;
    }
    c.privacy.epsilon = epsilon;
    c.privacy.accuracy = 0.01;
    c.privacy.delta = Some(1e-6);
    c.train.batch_size = 0.01 * (600 + m.div_ceil(2)) as f64;
    c.train.micro_batch = 64;
    c.train.steps = Some(steps);
    c.train.lr = 0.01;
    c.train.checkpoint_every = 0;
    c.train.eval_every = 0;
    c.train.insecure_seed = Some(11);
    c
}
