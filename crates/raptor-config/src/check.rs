//! The one validator of a run config: every value that can be checked without the data, and
//! every setting outside `[method]` set (to a value other than its default) for a method that
//! does not use it (`[method]` holds only its method's knobs: a knob of another method is
//! reported when the TOML is read). All problems are collected and reported together, each with
//! its setting.

use std::fmt;

use super::{Choice, Method, ModelConfig, MuonKnobs, NsPolynomial, RunConfig, Scope};
use crate::error::{ConfigError, ConfigIssue, ConfigIssues, Result};

/// Collects the problems of one config.
struct Issues(Vec<ConfigIssue>);

impl Issues {
    fn add(&mut self, setting: &str, reason: impl Into<String>) {
        self.0.push(ConfigIssue {
            setting: setting.into(),
            reason: reason.into(),
        });
    }

    /// `setting` set to `value` (not its default) for a method that does not use it; `uses`
    /// tells which methods do.
    fn unused(
        &mut self,
        setting: &str,
        value: impl fmt::Display,
        cfg: &RunConfig,
        uses: impl Fn(Method) -> bool,
    ) {
        let users: Vec<&str> = Method::ALL
            .iter()
            .copied()
            .filter(|&m| uses(m))
            .map(Choice::name)
            .collect();
        self.add(
            setting,
            format!(
                "set to {value}, but {} does not use it; used by {}",
                cfg.method.name(),
                users.join(", ")
            ),
        );
    }
}

/// Whether the method trains routed expert parameters of the configured model (where
/// `train.expert_lr` applies): RAPTOR's expert streams and matched-scope, the monolithic
/// methods that adapt or train the experts, and a full scope of the other methods, on an MoE
/// model only.
fn trains_routed_experts(cfg: &RunConfig) -> bool {
    if !cfg.model.kind.is_moe() {
        return false;
    }
    match cfg.method.name() {
        Method::Raptor | Method::ExpertOnly | Method::MatchedScope => true,
        Method::SharedOnly => false,
        Method::DpAdamLora | Method::Lora => cfg.lora.experts,
        Method::DpAdamFull | Method::Full => true,
        Method::DpSgd
        | Method::DpAdam
        | Method::DpMuon
        | Method::DpMuonbc
        | Method::Muon
        | Method::Adam => cfg.method.scope() == Some(Scope::Full),
    }
}

impl RunConfig {
    /// Checks every value that does not need the data (the rest is checked when the data is
    /// read: B ≤ N, labels, δ, the layer index against the model's sparse layers), and that no
    /// knob is set away from its default for a method that does not use it. Every problem is
    /// reported at once ([`ConfigError::Invalid`], a list of [`ConfigIssue`]s).
    pub fn validate(&self) -> Result<()> {
        let issues = self.issues();
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(ConfigIssues(issues)))
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
        if m.name().needs_experts() && !self.model.kind.is_moe() {
            out.add(
                "method.name",
                format!(
                    "{} needs an MoE model (switch, olmoe, mixtral, qwen2-moe or moe-bert), not {}",
                    m.name(),
                    self.model.kind
                ),
            );
        }
        if let Some(a) = m.alternation()
            && a.alternate
            && (a.shared_steps == 0 || a.expert_steps == 0)
        {
            out.add(
                "method.shared_steps / expert_steps",
                "must be >= 1 when alternating",
            );
        }
        if let Some(muon) = m.muon()
            && let Err(e) = muon.ns_config().validate()
        {
            out.add("method.ns_steps / ns_kappa", e.to_string());
        }
        let p = &self.privacy;
        if m.name().is_private() && !(p.epsilon.is_finite() && p.epsilon > 0.0) {
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

    /// Settings outside `[method]` set away from their defaults for a method (or model) that
    /// does not use them, and the Taylor degree beside Keller's polynomial.
    fn check_unused(&self, out: &mut Issues) {
        let def = RunConfig::default();
        let name = self.method.name();
        if self.model.pooling != def.model.pooling && !self.model.kind.is_bert() {
            out.add(
                "model.pooling",
                format!(
                    "set to {}, but a {} model has no pooling (it applies to bert and moe-bert)",
                    self.model.pooling, self.model.kind
                ),
            );
        }
        let raptor = |m: Method| m == Method::Raptor;
        let (p, dp) = (&self.privacy, &def.privacy);
        let (t, dt) = (&self.train, &def.train);
        if name != Method::Raptor {
            if p.split != dp.split {
                out.unused("privacy.split", p.split, self, raptor);
            }
            if p.rho != dp.rho {
                out.unused("privacy.rho", p.rho, self, raptor);
            }
            if t.budget != dt.budget {
                out.unused("train.budget", t.budget, self, raptor);
            }
        }
        if !name.has_expert_streams() {
            if t.clip_expert != dt.clip_expert {
                out.unused(
                    "train.clip_expert",
                    t.clip_expert,
                    self,
                    Method::has_expert_streams,
                );
            }
            if t.expert_optimizer != dt.expert_optimizer {
                let o = t.expert_optimizer;
                out.unused(
                    "train.expert_optimizer",
                    o,
                    self,
                    Method::has_expert_streams,
                );
            }
        }
        if !name.has_shared_stream() && t.shared_optimizer != dt.shared_optimizer {
            let o = t.shared_optimizer;
            out.unused("train.shared_optimizer", o, self, Method::has_shared_stream);
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
        if let Some(m) = self.method.muon()
            && m.ns_polynomial != NsPolynomial::Taylor
            && m.ns_kappa != MuonKnobs::default().ns_kappa
        {
            out.add(
                "method.ns_kappa",
                format!(
                    "set to {}, but the {} polynomial has no degree (it applies to \
                     ns_polynomial = \"taylor\")",
                    m.ns_kappa, m.ns_polynomial
                ),
            );
        }
        if !self.method.lora_scope() && self.lora.attention != def.lora.attention {
            out.add(
                "lora.attention",
                format!(
                    "set to {}, but {name} does not use it; used by the LoRA-scope methods",
                    self.lora.attention
                ),
            );
        }
        if !self.lora.attention && !self.lora.attention_targets.is_empty() {
            out.add(
                "lora.attention_targets",
                "set, but lora.attention = false leaves every attention projection frozen",
            );
        }
        let lora_experts = |m: Method| matches!(m, Method::DpAdamLora | Method::Lora);
        if !lora_experts(name) && self.lora.experts != def.lora.experts {
            out.unused("lora.experts", self.lora.experts, self, lora_experts);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{BudgetSplit, MethodConfig, ModelKind, MuonMomentum, TokenizerSpec};

    fn settings(c: &RunConfig) -> Vec<String> {
        c.issues().into_iter().map(|i| i.setting).collect()
    }

    /// A config of `m` on a model it can run on, every other knob at its default.
    fn plain(m: Method) -> RunConfig {
        let mut c = RunConfig {
            method: MethodConfig::new(m),
            ..RunConfig::default()
        };
        if !m.needs_experts() {
            c.model.kind = ModelKind::Gpt2;
        }
        c
    }

    /// The settings of the problems `text` is refused for, sorted.
    fn refused(text: &str) -> Vec<String> {
        let e = RunConfig::from_toml(text).unwrap_err();
        let ConfigError::Invalid(issues) = &e else {
            panic!("{e:?}")
        };
        let mut s: Vec<String> = issues.0.iter().map(|i| i.setting.clone()).collect();
        s.sort();
        s
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
        let mut c = plain(Method::DpMuon);
        c.privacy.epsilon = 0.0;
        c.train.batch_size = 0.0;
        c.lora.r = 0;
        c.data.max_length = 1;
        c.method.muon_mut().unwrap().ns_steps = 20_000;
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
        let ConfigError::Invalid(issues) = &e else {
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
        for &m in Method::ALL {
            assert_eq!(plain(m).issues(), Vec::new(), "{m}");
        }
    }

    /// A setting outside `[method]` that belongs to another family, set on a method that does
    /// not use it, is reported, naming the setting, its value and the methods it applies to.
    #[test]
    fn a_setting_the_method_does_not_use_is_reported() {
        let mut c = plain(Method::DpMuon);
        c.train.expert_lr = Some(1e-4);
        c.privacy.split = BudgetSplit::Additive;
        assert_eq!(settings(&c), ["privacy.split", "train.expert_lr"]);
        let text = c.validate().unwrap_err().to_string();
        assert!(
            text.contains(
                "privacy.split: set to additive, but dp-muon does not use it; used by raptor"
            ),
            "{text}"
        );
        // Expert knobs on shared-only, the shared stream's optimizer on expert-only.
        let mut c = plain(Method::SharedOnly);
        c.train.expert_optimizer = crate::StreamOptimizer::Sgd;
        c.train.clip_expert = 0.5;
        assert_eq!(
            settings(&c),
            ["train.clip_expert", "train.expert_optimizer"]
        );
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("used by raptor, expert-only")
        );
        let mut c = plain(Method::ExpertOnly);
        c.train.shared_optimizer = crate::StreamOptimizer::Sgd;
        assert_eq!(settings(&c), ["train.shared_optimizer"]);
        // The Taylor degree with Keller's polynomial; pooling on a model without it.
        let mut c = plain(Method::DpMuon);
        c.method.muon_mut().unwrap().ns_kappa = 3;
        c.model.pooling = crate::Pooling::Pooler;
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

    /// A knob of another method in `[method]` is refused with the methods that take it, even
    /// at its default value, and with every other problem of the config at once.
    #[test]
    fn a_knob_of_another_method_is_refused_with_its_users() {
        let e = RunConfig::from_toml("[method]\nname = \"dp-adam-lora\"\nmuon_beta = 0.95\n")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "config: method.muon_beta: dp-adam-lora does not use it; used by dp-muon, dp-muonbc, muon (line 3)"
        );
        assert!(matches!(&e, ConfigError::Invalid(i) if i.mentions("method.muon_beta")));
        let text = "[model]\nkind = \"gpt2\"\n\n[method]\nname = \"dp-muon\"\n\
                    expert_denominator = \"expected-owner\"\nalternate = false\n\
                    residual = \"none\"\nlayer = \"first\"\nbc_probe_pairs = 2\n\
                    ns_steps = \"five\"\n\n[privacy]\nsplit = \"additive\"\nepsilon = 0.0\n";
        assert_eq!(
            refused(text),
            [
                "method.alternate",
                "method.bc_probe_pairs",
                "method.expert_denominator",
                "method.layer",
                "method.ns_steps",
                "method.residual",
                "privacy.epsilon",
                "privacy.split",
            ]
        );
        let e = RunConfig::from_toml(text).unwrap_err().to_string();
        for line in [
            "method.alternate: dp-muon does not use it; used by raptor (line 7)",
            "method.layer: dp-muon does not use it; used by raptor, matched-scope, shared-only, expert-only (line 9)",
            "method.bc_probe_pairs: dp-muon does not use it; used by dp-muonbc (line 10)",
            "method.expert_denominator: dp-muon does not use it; used by raptor, expert-only (line 6)",
            "privacy.epsilon: 0 must be finite and > 0",
        ] {
            assert!(e.contains(line), "{line} not in {e}");
        }
        assert!(
            e.contains("method.ns_steps: invalid type") && e.contains("(line 11)"),
            "{e}"
        );
        // A key no method takes; a method without knobs; the default method.
        let e = RunConfig::from_toml("[method]\nname = \"dp-adam\"\nscopes = \"lora\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("method.scopes: unknown field `scopes` (dp-adam takes scope)"),
            "{e}"
        );
        let e = RunConfig::from_toml("[method]\nname = \"lora\"\nscope = \"lora\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("method.scope: lora does not use it; used by dp-sgd, dp-adam, dp-muon, dp-muonbc, muon, adam"), "{e}");
        assert_eq!(
            refused("[method]\nmuon_lr = 0.02\n"),
            ["method.muon_lr"],
            "no name is raptor"
        );
    }

    /// Each method reads its own knobs, at values other than their defaults, from the flat
    /// `[method]` table; the written config holds them and reads back the same.
    #[test]
    fn every_method_reads_its_own_knobs() {
        let text = |name: &str, knobs: &str| format!("[method]\nname = \"{name}\"\n{knobs}\n");
        let read = |name: &str, knobs: &str| RunConfig::from_toml(&text(name, knobs)).unwrap();
        let expert = "layer = 3\nowner_rule = \"token-count\"\n";
        let streams =
            "expert_denominator = \"batch\"\nexpert_clip = \"global\"\nresidual = \"margin\"\n";
        let muon = "scope = \"lora\"\nmuon_beta = 0.9\nmuon_momentum = \"ema\"\n\
                    ns_polynomial = \"taylor\"\nns_steps = 7\nns_kappa = 3\nmuon_lr = 0.05\n";
        let c = read(
            "raptor",
            &format!("{expert}{streams}alternate = false\nshared_steps = 2\nexpert_steps = 3"),
        );
        let l = c.method.expert_layer().unwrap();
        assert_eq!(
            (l.layer, l.owner_rule),
            (crate::LayerSpec::Block(3), crate::OwnerRule::TokenCount)
        );
        assert_eq!(
            c.method.alternation(),
            Some(&crate::Alternation {
                alternate: false,
                shared_steps: 2,
                expert_steps: 3
            })
        );
        let s = c.method.expert_streams().unwrap();
        assert_eq!(
            (s.expert_denominator, s.expert_clip, s.residual),
            (
                crate::ExpertDenominator::Batch,
                crate::ExpertClip::Global,
                crate::ResidualWeight::Margin
            )
        );
        let c = read("expert-only", &format!("{expert}{streams}"));
        assert_eq!(c.method.expert_streams(), Some(s));
        assert_eq!(c.method.layer(), Some(crate::LayerSpec::Block(3)));
        for m in ["matched-scope", "shared-only"] {
            let c = read(m, expert);
            assert_eq!(c.method.owner_rule(), Some(crate::OwnerRule::TokenCount));
        }
        for m in ["dp-sgd", "dp-adam", "adam"] {
            assert_eq!(
                read(m, "scope = \"lora\"").method.scope(),
                Some(Scope::Lora)
            );
        }
        for m in ["dp-muon", "muon", "dp-muonbc"] {
            let c = read(m, muon);
            let k = c.method.muon().unwrap();
            assert_eq!(c.method.scope(), Some(Scope::Lora));
            assert_eq!(
                (
                    k.muon_beta,
                    k.muon_momentum,
                    k.ns_polynomial,
                    k.ns_steps,
                    k.ns_kappa,
                    k.muon_lr
                ),
                (0.9, MuonMomentum::Ema, NsPolynomial::Taylor, 7, 3, 0.05)
            );
        }
        let c = read("dp-muonbc", "bc_probe_pairs = 4");
        assert_eq!(c.method.bias_correction().unwrap().bc_probe_pairs, 4);
        for m in ["dp-adam-lora", "dp-adam-full", "lora", "full"] {
            assert_eq!(read(m, "").method.name().name(), m);
        }
        // Written and read back: only the method's own knobs are written.
        for &m in Method::ALL {
            let mut c = plain(m);
            c.method = read(m.name(), "").method;
            let t = c.to_toml().unwrap();
            assert_eq!(RunConfig::from_toml(&t).unwrap(), c, "{m}");
            let table: toml::Table = toml::from_str(&t).unwrap();
            let keys: Vec<&String> = table["method"].as_table().unwrap().keys().collect();
            assert_eq!(keys.len(), crate::method::knobs(m).len() + 1, "{m}: {t}");
        }
    }

    /// The same settings on the methods that use them are fine.
    #[test]
    fn a_setting_the_method_uses_is_not_reported() {
        let mut c = plain(Method::Raptor);
        c.train.expert_lr = Some(1e-4);
        c.privacy.split = BudgetSplit::Additive;
        c.privacy.rho = 0.5;
        c.train.budget = crate::Budget::StreamUpdates;
        c.train.shared_optimizer = crate::StreamOptimizer::Sgd;
        c.train.expert_optimizer = crate::StreamOptimizer::Sgd;
        c.train.clip_expert = 0.5;
        c.lora.attention = false;
        assert_eq!(c.issues(), Vec::new());
        let mut c = plain(Method::DpMuonbc);
        let k = c.method.muon_mut().unwrap();
        k.muon_momentum = MuonMomentum::Ema;
        k.ns_polynomial = NsPolynomial::Taylor;
        k.ns_kappa = 3;
        k.muon_lr = 0.05;
        c.method.bias_correction_mut().unwrap().bc_probe_pairs = 2;
        *c.method.scope_mut().unwrap() = Scope::Lora;
        assert_eq!(c.issues(), Vec::new());
        let mut c = plain(Method::DpAdam);
        c.model.kind = ModelKind::Mixtral;
        c.train.expert_lr = Some(1e-4);
        assert_eq!(
            c.issues(),
            Vec::new(),
            "full scope on a MoE model trains experts"
        );
        *c.method.scope_mut().unwrap() = Scope::Lora;
        assert_eq!(settings(&c), ["train.expert_lr"]);
        let mut c = plain(Method::Lora);
        c.model.kind = ModelKind::Switch;
        c.lora.experts = false;
        c.model.kind = ModelKind::Bert;
        c.model.pooling = crate::Pooling::Pooler;
        assert_eq!(c.issues(), Vec::new());
    }
}
