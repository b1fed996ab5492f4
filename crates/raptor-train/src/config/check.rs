//! The one validator of a run config: every value that can be checked without the data, and
//! every knob set (to a value other than its default) for a method that does not use it. All
//! problems are collected and reported together, each with its setting.

use std::fmt;

use super::{Choice, Method, MethodFamily, ModelConfig, NsPolynomial, RunConfig, Scope};
use crate::error::{ConfigIssue, ConfigIssues, Result, TrainError};

/// Collects the problems of one config.
struct Issues(Vec<ConfigIssue>);

impl Issues {
    fn add(&mut self, setting: &str, reason: impl Into<String>) {
        self.0.push(ConfigIssue {
            setting: setting.into(),
            reason: reason.into(),
        });
    }

    /// `setting` set to `value` (not its default) for a method that does not use it.
    fn unused(&mut self, setting: &str, value: impl fmt::Display, cfg: &RunConfig, users: &str) {
        self.add(
            setting,
            format!(
                "set to {value}, but {} does not use it (it applies to {users})",
                cfg.method.name.name()
            ),
        );
    }
}

/// For each field `f` of `[fields]` set away from its default (`cur.f != def.f`), reports
/// `"<table>.f"` as set for a method that does not use it (`users` are the methods it applies
/// to): one line per table instead of one block per setting, and the setting's name cannot
/// drift from the field's.
macro_rules! unused {
    ($out:expr, $cfg:expr, $users:expr, $table:literal, $cur:expr, $def:expr, [$($f:ident),+ $(,)?]) => {
        $(
            if $cur.$f != $def.$f {
                $out.unused(concat!($table, ".", stringify!($f)), $cur.$f, $cfg, $users);
            }
        )+
    };
}

/// Whether the method trains routed expert parameters of the configured model (where
/// `train.expert_lr` applies): RAPTOR's expert streams and matched-scope, the monolithic
/// methods that adapt or train the experts, and a full scope of the other methods, on an MoE
/// model only.
fn trains_routed_experts(cfg: &RunConfig) -> bool {
    if !cfg.model.kind.is_moe() {
        return false;
    }
    match cfg.method.name {
        Method::Raptor | Method::ExpertOnly | Method::MatchedScope => true,
        Method::SharedOnly => false,
        Method::DpAdamLora | Method::Lora => cfg.lora.experts,
        Method::DpAdamFull | Method::Full => true,
        Method::DpSgd
        | Method::DpAdam
        | Method::DpMuon
        | Method::DpMuonbc
        | Method::Muon
        | Method::Adam => cfg.method.scope == Scope::Full,
    }
}

impl RunConfig {
    /// Checks every value that does not need the data (the rest is checked when the data is
    /// read: B ≤ N, labels, δ, the layer index against the model's sparse layers), and that no
    /// knob is set away from its default for a method that does not use it. Every problem is
    /// reported at once ([`TrainError::Invalid`], a list of [`ConfigIssue`]s).
    pub fn validate(&self) -> Result<()> {
        let issues = self.issues();
        if issues.is_empty() {
            Ok(())
        } else {
            Err(TrainError::Invalid(ConfigIssues(issues)))
        }
    }

    /// Every problem [`RunConfig::validate`] reports (empty: the config is valid).
    pub fn issues(&self) -> Vec<ConfigIssue> {
        let mut out = Issues(Vec::new());
        self.check_values(&mut out);
        self.check_unused(&mut out);
        out.0
    }

    /// Settings this run ignores, one sentence each (warnings, not errors: the run is still
    /// what the rest of the config says). The `[model]` sizes (`d_model`, `layers`, `heads`,
    /// `d_ff`, `experts`) are those of a from-scratch model: with `model.path` the checkpoint's
    /// own config sets them, so a size set away from its default says something the run will not
    /// do.
    pub fn ignored_settings(&self) -> Vec<String> {
        let Some(path) = &self.model.path else {
            return Vec::new();
        };
        let (m, d) = (&self.model, ModelConfig::default());
        [
            ("d_model", m.d_model, d.d_model),
            ("layers", m.layers, d.layers),
            ("heads", m.heads, d.heads),
            ("d_ff", m.d_ff, d.d_ff),
            ("experts", m.experts, d.experts),
        ]
        .into_iter()
        .filter(|(_, set, default)| set != default)
        .map(|(name, set, _)| {
            format!(
                "model.{name} = {set} is ignored: model.path ({}) names a checkpoint, whose own \
                 config sets the sizes (the [model] sizes are those of a from-scratch model)",
                path.display()
            )
        })
        .collect()
    }

    /// Ranges and combinations of values.
    fn check_values(&self, out: &mut Issues) {
        let d = &self.data;
        if !(d.validation_fraction >= 0.0 && d.validation_fraction < 1.0) {
            out.add(
                "data.validation_fraction",
                format!("{} must be in [0, 1)", d.validation_fraction),
            );
        }
        if d.validation_public && d.validation.is_none() {
            out.add(
                "data.validation_public",
                "true without data.validation: records held out of the private training file are private; name a public validation file or drop the key",
            );
        }
        if d.format.is_data_to_text() && !self.model.kind.is_language_model() {
            out.add(
                "data.format",
                format!(
                    "{}: data-to-text needs a language model (model.kind = \"gpt2\" or \"llama\")",
                    d.format
                ),
            );
        }
        if d.max_length < 2 {
            out.add("data.max_length", "must be >= 2");
        }
        if self.model.tokenizer == super::TokenizerSpec::Model && self.model.path.is_none() {
            out.add(
                "model.tokenizer",
                "\"model\" reads <model.path>/tokenizer.json: set model.path",
            );
        }
        let m = &self.method;
        if m.name.needs_experts() && !self.model.kind.is_moe() {
            out.add(
                "method.name",
                format!(
                    "{} needs an MoE model (switch, olmoe, mixtral, qwen2-moe or moe-bert), not {}",
                    m.name, self.model.kind
                ),
            );
        }
        if m.alternate && (m.shared_steps == 0 || m.expert_steps == 0) {
            out.add(
                "method.shared_steps / expert_steps",
                "must be >= 1 when alternating",
            );
        }
        if let Err(e) = m.ns_config().validate() {
            out.add("method.ns_steps / ns_kappa", e.to_string());
        }
        let p = &self.privacy;
        if m.name.is_private() && !(p.epsilon.is_finite() && p.epsilon > 0.0) {
            out.add(
                "privacy.epsilon",
                format!("{} must be finite and > 0", p.epsilon),
            );
        }
        if let Some(delta) = p.delta
            && !(delta > 0.0 && delta < 1.0)
        {
            out.add("privacy.delta", format!("{delta} must be in (0, 1)"));
        }
        if !(p.rho > 0.0 && p.rho < 1.0) {
            out.add("privacy.rho", format!("{} must be in (0, 1)", p.rho));
        }
        let t = &self.train;
        if !(t.batch_size.is_finite() && t.batch_size >= 1.0) {
            out.add("train.batch_size", format!("{} must be >= 1", t.batch_size));
        }
        if t.steps == Some(0) || (t.steps.is_none() && !(t.epochs > 0.0 && t.epochs.is_finite())) {
            out.add(
                "train.steps / train.epochs",
                "must give at least one update",
            );
        }
        for (f, v) in [
            ("train.lr", t.lr),
            ("train.clip", t.clip),
            ("train.clip_expert", t.clip_expert),
        ] {
            if !(v.is_finite() && v > 0.0) {
                out.add(f, format!("{v} must be finite and > 0"));
            }
        }
        if let Some(v) = t.expert_lr
            && !(v.is_finite() && v > 0.0)
        {
            out.add("train.expert_lr", format!("{v} must be finite and > 0"));
        }
        if t.clip_from_public.is_none() && t.clip_public_records != 0 {
            out.add(
                "train.clip_public_records",
                "set, but train.clip_from_public is not (it caps the records that calibration reads)",
            );
        }
        if let Some(q) = t.clip_from_public {
            if !(q.is_finite() && q > 0.0 && q < 1.0) {
                out.add("train.clip_from_public", format!("{q} must be in (0, 1)"));
            }
            if self.data.public.is_none() {
                out.add(
                    "train.clip_from_public",
                    "needs data.public (labelled public records)",
                );
            }
        }
        if !(t.momentum.is_finite() && (0.0..1.0).contains(&t.momentum)) {
            out.add(
                "train.momentum",
                format!("{} must be in [0, 1)", t.momentum),
            );
        }
        if t.micro_batch == 0 {
            out.add("train.micro_batch", "must be >= 1");
        }
        if !(0.0..1.0).contains(&self.lora.dropout) {
            out.add(
                "lora.dropout",
                format!("{} must be in [0, 1)", self.lora.dropout),
            );
        }
        if self.lora.r <= 0 {
            out.add("lora.r", format!("{} must be >= 1", self.lora.r));
        }
        if self.eval.beams == 0 {
            out.add("eval.beams", "must be >= 1");
        }
    }

    /// Knobs set away from their defaults for a method (or model) that does not use them.
    fn check_unused(&self, out: &mut Issues) {
        let def = RunConfig::default();
        let (m, dm) = (&self.method, &def.method);
        let name = m.name;
        if self.model.pooling != def.model.pooling && !self.model.kind.is_bert() {
            out.add(
                "model.pooling",
                format!(
                    "set to {}, but a {} model has no pooling (it applies to bert and moe-bert)",
                    self.model.pooling, self.model.kind
                ),
            );
        }
        const LAYER_USERS: &str = "raptor, matched-scope, shared-only and expert-only";
        if !name.needs_experts() {
            unused!(out, self, LAYER_USERS, "method", m, dm, [layer, owner_rule]);
        }
        if name != Method::Raptor {
            const USERS: &str = "raptor";
            unused!(
                out,
                self,
                USERS,
                "method",
                m,
                dm,
                [alternate, shared_steps, expert_steps]
            );
            let (p, dp) = (&self.privacy, &def.privacy);
            unused!(out, self, USERS, "privacy", p, dp, [split, rho]);
            if self.train.budget != def.train.budget {
                out.unused("train.budget", self.train.budget, self, USERS);
            }
        }
        let (t, dt) = (&self.train, &def.train);
        if !name.has_expert_streams() {
            const USERS: &str = "raptor and expert-only";
            unused!(
                out,
                self,
                USERS,
                "method",
                m,
                dm,
                [expert_denominator, expert_clip, residual]
            );
            unused!(
                out,
                self,
                USERS,
                "train",
                t,
                dt,
                [clip_expert, expert_optimizer]
            );
        }
        if !name.has_shared_stream() && t.shared_optimizer != dt.shared_optimizer {
            out.unused(
                "train.shared_optimizer",
                t.shared_optimizer,
                self,
                "raptor and shared-only",
            );
        }
        if let Some(lr) = t.expert_lr
            && !trains_routed_experts(self)
        {
            out.add(
                "train.expert_lr",
                format!(
                    "set to {lr}, but {} on a {} model trains no routed expert (it applies to \
                     raptor, expert-only, matched-scope, and to the methods that train the \
                     experts of an MoE model)",
                    name, self.model.kind
                ),
            );
        }
        if name.family() != MethodFamily::Scoped && m.scope != dm.scope {
            out.unused(
                "method.scope",
                m.scope,
                self,
                "dp-sgd, dp-adam, dp-muon, dp-muonbc, muon and adam",
            );
        }
        if !name.uses_muon() {
            const USERS: &str = "dp-muon, dp-muonbc and muon";
            unused!(
                out,
                self,
                USERS,
                "method",
                m,
                dm,
                [
                    muon_beta,
                    muon_momentum,
                    ns_polynomial,
                    ns_steps,
                    ns_kappa,
                    muon_lr
                ]
            );
        } else if m.ns_polynomial != NsPolynomial::Taylor && m.ns_kappa != dm.ns_kappa {
            out.add(
                "method.ns_kappa",
                format!(
                    "set to {}, but the {} polynomial has no degree (it applies to \
                     ns_polynomial = \"taylor\")",
                    m.ns_kappa, m.ns_polynomial
                ),
            );
        }
        if name != Method::DpMuonbc && m.bc_probe_pairs != dm.bc_probe_pairs {
            out.unused("method.bc_probe_pairs", m.bc_probe_pairs, self, "dp-muonbc");
        }
        if !self.lora_scope() && self.lora.attention != def.lora.attention {
            out.unused(
                "lora.attention",
                self.lora.attention,
                self,
                "the LoRA-scope methods",
            );
        }
        if !self.lora.attention && !self.lora.attention_targets.is_empty() {
            out.add(
                "lora.attention_targets",
                "set, but lora.attention = false leaves every attention projection frozen",
            );
        }
        if !matches!(name, Method::DpAdamLora | Method::Lora)
            && self.lora.experts != def.lora.experts
        {
            out.unused(
                "lora.experts",
                self.lora.experts,
                self,
                "dp-adam-lora and lora",
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::{
        BudgetSplit, ExpertDenominator, ModelKind, MuonMomentum, ResidualWeight, TokenizerSpec,
    };

    fn settings(c: &RunConfig) -> Vec<String> {
        c.issues().into_iter().map(|i| i.setting).collect()
    }

    /// A config of `m` on a model it can run on, every other knob at its default.
    fn plain(m: Method) -> RunConfig {
        let mut c = RunConfig::default();
        c.method.name = m;
        if !m.needs_experts() {
            c.model.kind = ModelKind::Gpt2;
        }
        c
    }

    #[test]
    fn model_sizes_beside_a_checkpoint_are_said_to_be_ignored() {
        let mut c = RunConfig::default();
        c.model.d_model = 128;
        c.model.experts = 8;
        // From scratch: the sizes are the model's.
        assert!(c.ignored_settings().is_empty());
        c.model.path = Some("ckpt".into());
        let w = c.ignored_settings();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].starts_with("model.d_model = 128 is ignored"), "{w:?}");
        assert!(w[1].starts_with("model.experts = 8 is ignored"), "{w:?}");
        // Defaults beside a path say nothing; the config stays valid either way.
        let mut p = RunConfig::default();
        p.model.path = Some("ckpt".into());
        assert!(p.ignored_settings().is_empty());
        assert!(c.issues().is_empty(), "{:?}", c.issues());
    }

    #[test]
    fn every_problem_is_listed_at_once() {
        let mut c = RunConfig::default();
        c.privacy.epsilon = 0.0;
        c.train.batch_size = 0.0;
        c.lora.r = 0;
        c.data.max_length = 1;
        c.method.ns_steps = 20_000;
        c.model.tokenizer = TokenizerSpec::Model;
        let found = settings(&c);
        for s in [
            "privacy.epsilon",
            "train.batch_size",
            "lora.r",
            "data.max_length",
            "method.ns_steps / ns_kappa",
            "model.tokenizer",
        ] {
            assert!(found.iter().any(|f| f == s), "{s} not in {found:?}");
        }
        let e = c.validate().unwrap_err();
        let TrainError::Invalid(issues) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(issues.0.len(), found.len());
        assert!(issues.mentions("lora.r"));
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("config: {} problems:", found.len())),
            "{text}"
        );
        for s in &found {
            assert!(text.contains(&format!("\n  - {s}: ")), "{s}: {text}");
        }
        // One problem reads as one line.
        let mut c = RunConfig::default();
        c.privacy.rho = 1.5;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "config: privacy.rho: 1.5 must be in (0, 1)"
        );
    }

    #[test]
    fn every_method_validates_with_the_defaults() {
        for &m in <Method as crate::config::Choice>::ALL {
            assert_eq!(plain(m).issues(), Vec::new(), "{m}");
        }
    }

    /// A knob of one family set on a method of another is reported, naming the knob, its
    /// value and the methods it applies to.
    #[test]
    fn a_knob_the_method_does_not_use_is_reported() {
        let mut c = plain(Method::DpMuon);
        c.train.expert_lr = Some(1e-4);
        c.method.expert_denominator = ExpertDenominator::Batch;
        c.method.alternate = false;
        c.method.residual = ResidualWeight::None;
        c.privacy.split = BudgetSplit::Additive;
        c.method.layer = crate::config::LayerSpec::First;
        let found = settings(&c);
        assert_eq!(
            found,
            [
                "method.layer",
                "method.alternate",
                "privacy.split",
                "method.expert_denominator",
                "method.residual",
                "train.expert_lr"
            ]
        );
        let text = c.validate().unwrap_err().to_string();
        assert!(
            text.contains(
                "method.alternate: set to false, but dp-muon does not use it (it applies to raptor)"
            ),
            "{text}"
        );
        let mut c = plain(Method::Raptor);
        c.method.muon_momentum = MuonMomentum::HeavyBall;
        c.method.scope = crate::config::Scope::Lora;
        c.method.bc_probe_pairs = 4;
        assert_eq!(
            settings(&c),
            [
                "method.scope",
                "method.muon_momentum",
                "method.bc_probe_pairs"
            ]
        );
        // Expert knobs on shared-only, the shared stream's optimizer on expert-only.
        let mut c = plain(Method::SharedOnly);
        c.train.expert_optimizer = crate::config::StreamOptimizer::Sgd;
        c.train.clip_expert = 0.5;
        assert_eq!(
            settings(&c),
            ["train.clip_expert", "train.expert_optimizer"]
        );
        let mut c = plain(Method::ExpertOnly);
        c.train.shared_optimizer = crate::config::StreamOptimizer::Sgd;
        assert_eq!(settings(&c), ["train.shared_optimizer"]);
        // The Taylor degree with Keller's polynomial; pooling on a model without it.
        let mut c = plain(Method::DpMuon);
        c.method.ns_kappa = 3;
        c.model.pooling = crate::config::Pooling::Pooler;
        assert_eq!(settings(&c), ["model.pooling", "method.ns_kappa"]);
        // expert_lr on a full-scope dense method of a model without experts, or with the
        // experts not adapted.
        let mut c = plain(Method::DpAdamLora);
        c.model.kind = ModelKind::Switch;
        c.lora.experts = false;
        c.train.expert_lr = Some(1e-3);
        assert_eq!(settings(&c), ["train.expert_lr"]);
        // Frozen attention on a full-scope method; targets with attention frozen.
        let mut c = plain(Method::DpAdamFull);
        c.lora.attention = false;
        assert_eq!(settings(&c), ["lora.attention"]);
        let mut c = plain(Method::Raptor);
        c.lora.attention = false;
        c.lora.attention_targets = vec!["query".into()];
        assert_eq!(settings(&c), ["lora.attention_targets"]);
    }

    /// The same knobs on the methods that use them are fine.
    #[test]
    fn a_knob_the_method_uses_is_not_reported() {
        let mut c = plain(Method::Raptor);
        c.train.expert_lr = Some(1e-4);
        c.method.expert_denominator = ExpertDenominator::Batch;
        c.method.alternate = false;
        c.method.residual = ResidualWeight::None;
        c.privacy.split = BudgetSplit::Additive;
        c.privacy.rho = 0.5;
        c.train.budget = crate::config::Budget::StreamUpdates;
        c.train.shared_optimizer = crate::config::StreamOptimizer::Sgd;
        c.train.expert_optimizer = crate::config::StreamOptimizer::Sgd;
        c.train.clip_expert = 0.5;
        c.method.layer = crate::config::LayerSpec::Last;
        c.lora.attention = false;
        assert_eq!(c.issues(), Vec::new());
        let mut c = plain(Method::DpMuonbc);
        c.method.muon_momentum = MuonMomentum::Ema;
        c.method.ns_polynomial = NsPolynomial::Taylor;
        c.method.ns_kappa = 3;
        c.method.bc_probe_pairs = 2;
        c.method.muon_lr = 0.05;
        c.method.scope = Scope::Lora;
        assert_eq!(c.issues(), Vec::new());
        let mut c = plain(Method::DpAdam);
        c.model.kind = ModelKind::Mixtral;
        c.train.expert_lr = Some(1e-4);
        assert_eq!(
            c.issues(),
            Vec::new(),
            "full scope on a MoE model trains experts"
        );
        c.method.scope = Scope::Lora;
        assert_eq!(settings(&c), ["train.expert_lr"]);
        let mut c = plain(Method::Lora);
        c.model.kind = ModelKind::Switch;
        c.lora.experts = false;
        c.model.kind = ModelKind::Bert;
        c.model.pooling = crate::config::Pooling::Pooler;
        assert_eq!(c.issues(), Vec::new());
    }
}
