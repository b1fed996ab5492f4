//! `[method]`: the training method and its knobs, an enum tagged by `name` whose variants carry
//! only their own knobs, in small groups that several methods share ([`ExpertLayer`],
//! [`ExpertStreams`], [`Alternation`], [`MuonKnobs`], [`BiasCorrection`], `scope`). The TOML
//! keeps its flat shape (`[method]`, `name = "raptor"`, `layer = "entropy"`); a knob of another
//! method cannot be held by the type, and [`RunConfig::from_toml`](super::RunConfig::from_toml)
//! reports it with the methods that take it, from the parsed table. Which method takes which knob
//! is read from the TOML of each method's defaults ([`knobs`]), never listed by hand.

use serde::{Deserialize, Deserializer, Serialize};

use super::{
    Choice, ExpertClip, ExpertDenominator, LayerSpec, Method, MuonMomentum, NsPolynomial,
    OwnerRule, ResidualWeight, Scope,
};

/// The sparse layer and owner rule of the methods that train one sparse layer's experts
/// (`raptor`, `matched-scope`, `shared-only`, `expert-only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExpertLayer {
    /// Sparse layer RAPTOR trains: `entropy` (public-corpus routing entropy; the last sparse
    /// layer without a public file), `first`, `last`, or a block index.
    pub layer: LayerSpec,
    /// Owner rule: `gate-weighted` (default) or `token-count` plurality.
    pub owner_rule: OwnerRule,
}

impl Default for ExpertLayer {
    fn default() -> Self {
        Self {
            layer: LayerSpec::Entropy,
            owner_rule: OwnerRule::GateWeighted,
        }
    }
}

/// RAPTOR's schedule of its two streams (`raptor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Alternation {
    /// Alternate shared and expert updates; false: both streams from one sample per update,
    /// charged as one mechanism (1/σ_eff² = 1/σ_s² + 1/σ_e²) and calibrated on it.
    pub alternate: bool,
    /// Shared updates per cycle (alternating schedule).
    pub shared_steps: u64,
    /// Expert updates per cycle (alternating schedule).
    pub expert_steps: u64,
}

impl Default for Alternation {
    fn default() -> Self {
        Self {
            alternate: true,
            shared_steps: 1,
            expert_steps: 1,
        }
    }
}

/// How RAPTOR's expert streams are released (`raptor`, `expert-only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExpertStreams {
    /// Expert denominator: `expected-owner` (D_e = B/E) or `batch` (B).
    pub expert_denominator: ExpertDenominator,
    /// Expert clipping: `role` (each stream its own bound) or `global` (one factor).
    pub expert_clip: ExpertClip,
    /// Residual weight of the expert loss: `prob` (1 − p_shared(y|x)), `margin`, `none`.
    pub residual: ResidualWeight,
}

impl Default for ExpertStreams {
    fn default() -> Self {
        Self {
            expert_denominator: ExpertDenominator::ExpectedOwner,
            expert_clip: ExpertClip::Role,
            residual: ResidualWeight::Prob,
        }
    }
}

/// Muon's knobs (`dp-muon`, `dp-muonbc`, `muon`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MuonKnobs {
    /// Muon momentum β.
    pub muon_beta: f64,
    /// Muon momentum form: `heavy-ball`, `ema`, `nesterov`.
    pub muon_momentum: MuonMomentum,
    /// Newton–Schulz polynomial: `keller` (quintic) or `taylor`.
    pub ns_polynomial: NsPolynomial,
    /// Newton–Schulz steps.
    pub ns_steps: usize,
    /// Taylor degree κ (for `taylor`).
    pub ns_kappa: usize,
    /// Learning rate of the Muon-updated matrices (the other parameters use `train.lr`).
    pub muon_lr: f64,
}

impl Default for MuonKnobs {
    fn default() -> Self {
        Self {
            muon_beta: 0.95,
            muon_momentum: MuonMomentum::Nesterov,
            ns_polynomial: NsPolynomial::Keller,
            ns_steps: 5,
            ns_kappa: 2,
            muon_lr: 0.02,
        }
    }
}

impl MuonKnobs {
    /// The Newton–Schulz iteration: `ns_polynomial` with `ns_steps` steps (and degree
    /// `ns_kappa` for `taylor`).
    pub fn ns_config(&self) -> raptor_muon::NsConfig {
        match self.ns_polynomial {
            NsPolynomial::Taylor => raptor_muon::NsConfig::taylor(self.ns_kappa, self.ns_steps),
            NsPolynomial::Keller => {
                let mut c = raptor_muon::NsConfig::keller();
                c.steps = self.ns_steps;
                c
            }
        }
    }
}

/// DP-MuonBC's bias correction (`dp-muonbc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BiasCorrection {
    /// Antithetic probe pairs K.
    pub bc_probe_pairs: usize,
}

impl Default for BiasCorrection {
    fn default() -> Self {
        Self { bc_probe_pairs: 1 }
    }
}

/// The method (`[method]`): its `name` and its own knobs. `raptor`, `dp-adam-lora`,
/// `dp-adam-full`, `matched-scope`, `shared-only`, `expert-only`, `lora`, `full` are for MoE
/// classifiers; `dp-sgd`, `dp-adam`, `dp-muon`, `dp-muonbc`, `muon`, `adam` for decoders and
/// any model. A config that leaves `name` out means `raptor`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "kebab-case", deny_unknown_fields)]
pub enum MethodConfig {
    /// RAPTOR: shared + per-expert streams.
    Raptor {
        /// Its sparse layer and owner rule.
        #[serde(flatten)]
        experts: ExpertLayer,
        /// The schedule of its two streams.
        #[serde(flatten)]
        schedule: Alternation,
        /// Its expert streams' releases.
        #[serde(flatten)]
        streams: ExpertStreams,
    },
    /// Monolithic DP-Adam over all LoRA adapters and the head.
    DpAdamLora,
    /// Monolithic DP-Adam over all parameters except routers.
    DpAdamFull,
    /// RAPTOR's scope, one global clip and one σ (Baseline A).
    MatchedScope {
        /// RAPTOR's sparse layer and owner rule.
        #[serde(flatten)]
        experts: ExpertLayer,
    },
    /// RAPTOR's shared stream alone.
    SharedOnly {
        /// RAPTOR's sparse layer and owner rule.
        #[serde(flatten)]
        experts: ExpertLayer,
    },
    /// RAPTOR's expert streams alone.
    ExpertOnly {
        /// RAPTOR's sparse layer and owner rule.
        #[serde(flatten)]
        experts: ExpertLayer,
        /// The expert streams' releases.
        #[serde(flatten)]
        streams: ExpertStreams,
    },
    /// Non-private LoRA.
    Lora,
    /// Non-private full fine-tuning.
    Full,
    /// DP-SGD (flat clip, plain SGD).
    DpSgd {
        /// The trainable scope.
        #[serde(default)]
        scope: Scope,
    },
    /// DP-Adam (flat clip, AdamW).
    DpAdam {
        /// The trainable scope.
        #[serde(default)]
        scope: Scope,
    },
    /// DP-Muon (per-matrix clip, Muon on hidden matrices, AdamW on the rest).
    DpMuon {
        /// The trainable scope.
        #[serde(default)]
        scope: Scope,
        /// Muon's knobs.
        #[serde(flatten)]
        muon: MuonKnobs,
    },
    /// DP-Muon with the antithetic bias correction.
    DpMuonbc {
        /// The trainable scope.
        #[serde(default)]
        scope: Scope,
        /// Muon's knobs.
        #[serde(flatten)]
        muon: MuonKnobs,
        /// The bias correction's probes.
        #[serde(flatten)]
        bc: BiasCorrection,
    },
    /// Non-private Muon.
    Muon {
        /// The trainable scope.
        #[serde(default)]
        scope: Scope,
        /// Muon's knobs.
        #[serde(flatten)]
        muon: MuonKnobs,
    },
    /// Non-private AdamW.
    Adam {
        /// The trainable scope.
        #[serde(default)]
        scope: Scope,
    },
}

impl Default for MethodConfig {
    /// RAPTOR at its defaults.
    fn default() -> Self {
        Self::new(Method::Raptor)
    }
}

impl MethodConfig {
    /// Method `m` with every knob at its default.
    pub fn new(m: Method) -> Self {
        let scope = Scope::default();
        let (experts, streams, muon) = (
            ExpertLayer::default(),
            ExpertStreams::default(),
            MuonKnobs::default(),
        );
        match m {
            Method::Raptor => Self::Raptor {
                experts,
                schedule: Alternation::default(),
                streams,
            },
            Method::DpAdamLora => Self::DpAdamLora,
            Method::DpAdamFull => Self::DpAdamFull,
            Method::MatchedScope => Self::MatchedScope { experts },
            Method::SharedOnly => Self::SharedOnly { experts },
            Method::ExpertOnly => Self::ExpertOnly { experts, streams },
            Method::Lora => Self::Lora,
            Method::Full => Self::Full,
            Method::DpSgd => Self::DpSgd { scope },
            Method::DpAdam => Self::DpAdam { scope },
            Method::DpMuon => Self::DpMuon { scope, muon },
            Method::DpMuonbc => Self::DpMuonbc {
                scope,
                muon,
                bc: BiasCorrection::default(),
            },
            Method::Muon => Self::Muon { scope, muon },
            Method::Adam => Self::Adam { scope },
        }
    }

    /// Method `m` with the knobs of `self` that `m` also takes (the others at their
    /// defaults): the same config with another method.
    pub fn switched_to(&self, m: Method) -> Self {
        let mut out = Self::new(m);
        if let (Some(from), Some(to)) = (self.expert_layer(), out.expert_layer_mut()) {
            *to = *from;
        }
        if let (Some(from), Some(to)) = (self.alternation(), out.alternation_mut()) {
            *to = *from;
        }
        if let (Some(from), Some(to)) = (self.expert_streams(), out.expert_streams_mut()) {
            *to = *from;
        }
        if let (Some(from), Some(to)) = (self.scope(), out.scope_mut()) {
            *to = from;
        }
        if let (Some(from), Some(to)) = (self.muon(), out.muon_mut()) {
            *to = *from;
        }
        if let (Some(from), Some(to)) = (self.bias_correction(), out.bias_correction_mut()) {
            *to = *from;
        }
        out
    }

    /// The method.
    pub fn name(&self) -> Method {
        match self {
            Self::Raptor { .. } => Method::Raptor,
            Self::DpAdamLora => Method::DpAdamLora,
            Self::DpAdamFull => Method::DpAdamFull,
            Self::MatchedScope { .. } => Method::MatchedScope,
            Self::SharedOnly { .. } => Method::SharedOnly,
            Self::ExpertOnly { .. } => Method::ExpertOnly,
            Self::Lora => Method::Lora,
            Self::Full => Method::Full,
            Self::DpSgd { .. } => Method::DpSgd,
            Self::DpAdam { .. } => Method::DpAdam,
            Self::DpMuon { .. } => Method::DpMuon,
            Self::DpMuonbc { .. } => Method::DpMuonbc,
            Self::Muon { .. } => Method::Muon,
            Self::Adam { .. } => Method::Adam,
        }
    }

    /// The sparse layer and owner rule (`raptor`, `matched-scope`, `shared-only`,
    /// `expert-only`).
    pub fn expert_layer(&self) -> Option<&ExpertLayer> {
        match self {
            Self::Raptor { experts, .. }
            | Self::MatchedScope { experts }
            | Self::SharedOnly { experts }
            | Self::ExpertOnly { experts, .. } => Some(experts),
            _ => None,
        }
    }

    /// See [`MethodConfig::expert_layer`].
    pub fn expert_layer_mut(&mut self) -> Option<&mut ExpertLayer> {
        match self {
            Self::Raptor { experts, .. }
            | Self::MatchedScope { experts }
            | Self::SharedOnly { experts }
            | Self::ExpertOnly { experts, .. } => Some(experts),
            _ => None,
        }
    }

    /// `method.layer`, for the methods that take it.
    pub fn layer(&self) -> Option<LayerSpec> {
        self.expert_layer().map(|e| e.layer)
    }

    /// `method.owner_rule`, for the methods that take it.
    pub fn owner_rule(&self) -> Option<OwnerRule> {
        self.expert_layer().map(|e| e.owner_rule)
    }

    /// RAPTOR's schedule (`raptor`).
    pub fn alternation(&self) -> Option<&Alternation> {
        match self {
            Self::Raptor { schedule, .. } => Some(schedule),
            _ => None,
        }
    }

    /// See [`MethodConfig::alternation`].
    pub fn alternation_mut(&mut self) -> Option<&mut Alternation> {
        match self {
            Self::Raptor { schedule, .. } => Some(schedule),
            _ => None,
        }
    }

    /// The expert streams' releases (`raptor`, `expert-only`).
    pub fn expert_streams(&self) -> Option<&ExpertStreams> {
        match self {
            Self::Raptor { streams, .. } | Self::ExpertOnly { streams, .. } => Some(streams),
            _ => None,
        }
    }

    /// See [`MethodConfig::expert_streams`].
    pub fn expert_streams_mut(&mut self) -> Option<&mut ExpertStreams> {
        match self {
            Self::Raptor { streams, .. } | Self::ExpertOnly { streams, .. } => Some(streams),
            _ => None,
        }
    }

    /// The trainable scope (`dp-sgd`, `dp-adam`, `dp-muon`, `dp-muonbc`, `muon`, `adam`).
    pub fn scope(&self) -> Option<Scope> {
        match self {
            Self::DpSgd { scope }
            | Self::DpAdam { scope }
            | Self::DpMuon { scope, .. }
            | Self::DpMuonbc { scope, .. }
            | Self::Muon { scope, .. }
            | Self::Adam { scope } => Some(*scope),
            _ => None,
        }
    }

    /// Whether the method trains LoRA adapters (with the head) rather than full weights:
    /// RAPTOR and its ablations, the LoRA methods, and the others at `scope = "lora"`.
    pub fn lora_scope(&self) -> bool {
        match self {
            Self::Raptor { .. }
            | Self::MatchedScope { .. }
            | Self::SharedOnly { .. }
            | Self::ExpertOnly { .. }
            | Self::DpAdamLora
            | Self::Lora => true,
            Self::DpAdamFull | Self::Full => false,
            Self::DpSgd { scope }
            | Self::DpAdam { scope }
            | Self::DpMuon { scope, .. }
            | Self::DpMuonbc { scope, .. }
            | Self::Muon { scope, .. }
            | Self::Adam { scope } => *scope == Scope::Lora,
        }
    }

    /// See [`MethodConfig::scope`].
    pub fn scope_mut(&mut self) -> Option<&mut Scope> {
        match self {
            Self::DpSgd { scope }
            | Self::DpAdam { scope }
            | Self::DpMuon { scope, .. }
            | Self::DpMuonbc { scope, .. }
            | Self::Muon { scope, .. }
            | Self::Adam { scope } => Some(scope),
            _ => None,
        }
    }

    /// Muon's knobs (`dp-muon`, `dp-muonbc`, `muon`).
    pub fn muon(&self) -> Option<&MuonKnobs> {
        match self {
            Self::DpMuon { muon, .. } | Self::DpMuonbc { muon, .. } | Self::Muon { muon, .. } => {
                Some(muon)
            }
            _ => None,
        }
    }

    /// See [`MethodConfig::muon`].
    pub fn muon_mut(&mut self) -> Option<&mut MuonKnobs> {
        match self {
            Self::DpMuon { muon, .. } | Self::DpMuonbc { muon, .. } | Self::Muon { muon, .. } => {
                Some(muon)
            }
            _ => None,
        }
    }

    /// DP-MuonBC's bias correction (`dp-muonbc`).
    pub fn bias_correction(&self) -> Option<&BiasCorrection> {
        match self {
            Self::DpMuonbc { bc, .. } => Some(bc),
            _ => None,
        }
    }

    /// See [`MethodConfig::bias_correction`].
    pub fn bias_correction_mut(&mut self) -> Option<&mut BiasCorrection> {
        match self {
            Self::DpMuonbc { bc, .. } => Some(bc),
            _ => None,
        }
    }
}

/// The knobs (`[method]` keys other than `name`) that `m` takes, in the order a config writes
/// them: the keys of the TOML of `m`'s defaults.
pub fn knobs(m: Method) -> Vec<String> {
    match toml::Table::try_from(MethodConfig::new(m)) {
        Ok(t) => t.keys().filter(|k| *k != "name").cloned().collect(),
        // Never for these types; no knob is then accepted, so nothing passes in silence.
        Err(_) => Vec::new(),
    }
}

/// The methods that take knob `key`.
pub fn users(key: &str) -> Vec<Method> {
    Method::ALL
        .iter()
        .copied()
        .filter(|&m| knobs(m).iter().any(|k| k == key))
        .collect()
}

/// One problem of a `[method]` table: the key and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyIssue {
    /// The key (`muon_beta`).
    pub key: String,
    /// Why it is rejected.
    pub reason: String,
}

/// The method a `[method]` table names (`raptor` when it names none), or the problem of its
/// `name`.
pub(crate) fn named(table: &toml::Table) -> Result<Method, KeyIssue> {
    match table.get("name") {
        None => Ok(Method::Raptor),
        Some(v) => Method::deserialize(v.clone()).map_err(|e| KeyIssue {
            key: "name".into(),
            reason: e.message().trim_end().to_string(),
        }),
    }
}

/// The problems of the knobs of a `[method]` table that names method `m`: each knob `m` does
/// not take (with the methods that do), and each value a knob of `m` does not accept (every
/// knob is read alone, so that all are reported).
pub(crate) fn table_issues(m: Method, table: &toml::Table) -> Vec<KeyIssue> {
    let own = knobs(m);
    let mut out = Vec::new();
    for (key, value) in table.iter().filter(|(k, _)| *k != "name") {
        if !own.contains(key) {
            let by = users(key);
            let reason = if by.is_empty() {
                let takes = if own.is_empty() {
                    "no knob".to_string()
                } else {
                    own.join(", ")
                };
                format!("unknown field `{key}` ({m} takes {takes})")
            } else {
                let by: Vec<&str> = by.iter().map(|u| u.name()).collect();
                format!("{m} does not use it; used by {}", by.join(", "))
            };
            out.push(KeyIssue {
                key: key.clone(),
                reason,
            });
            continue;
        }
        let mut alone = toml::Table::new();
        alone.insert("name".into(), m.name().into());
        alone.insert(key.clone(), value.clone());
        if let Err(e) = MethodConfig::deserialize(toml::Value::Table(alone)) {
            out.push(KeyIssue {
                key: key.clone(),
                reason: e.message().trim_end().to_string(),
            });
        }
    }
    out
}

/// Removes from a `[method]` table that names `m` each knob `m` does not take that holds the
/// default of the methods that take it (as every config written before `[method]` was a tagged
/// enum does); returns how many were removed.
pub(crate) fn drop_foreign_defaults(m: Method, table: &mut toml::Table) -> usize {
    let own = knobs(m);
    let default_of = |u: Method, key: &str| {
        toml::Table::try_from(MethodConfig::new(u))
            .ok()
            .and_then(|mut t| t.remove(key))
    };
    let before = table.len();
    table.retain(|key, value| {
        key == "name"
            || own.iter().any(|k| k == key)
            || !users(key)
                .into_iter()
                .any(|u| default_of(u, key).as_ref() == Some(&*value))
    });
    before - table.len()
}

/// Deserializes `[method]` as a table, `name = "raptor"` when it has none (the default method
/// of every config written before the method was a tagged enum).
pub(crate) fn deserialize_or_raptor<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<MethodConfig, D::Error> {
    let mut table = toml::Table::deserialize(d)?;
    table
        .entry("name")
        .or_insert_with(|| Method::Raptor.name().into());
    MethodConfig::deserialize(toml::Value::Table(table)).map_err(serde::de::Error::custom)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_method_names_itself_and_takes_its_own_knobs() {
        for &m in Method::ALL {
            let c = MethodConfig::new(m);
            assert_eq!(c.name(), m);
            let t = toml::Table::try_from(&c).unwrap();
            assert_eq!(t.get("name").and_then(|v| v.as_str()), Some(m.name()));
            assert_eq!(c.layer().is_some(), m.needs_experts(), "{m}");
            assert_eq!(c.expert_streams().is_some(), m.has_expert_streams(), "{m}");
            assert_eq!(c.muon().is_some(), m.uses_muon(), "{m}");
            assert_eq!(
                c.scope().is_some(),
                m.family() == super::super::MethodFamily::Scoped,
                "{m}"
            );
            assert_eq!(c.alternation().is_some(), m == Method::Raptor, "{m}");
            assert_eq!(c.bias_correction().is_some(), m == Method::DpMuonbc, "{m}");
        }
        // The keys' order is the TOML table's (sorted, or as written): compared as sets.
        type Keys = std::collections::BTreeSet<String>;
        let k = |m| knobs(m).into_iter().collect::<Keys>();
        let set = |s: &str| -> Keys { s.split_whitespace().map(String::from).collect() };
        assert_eq!(
            k(Method::Raptor),
            set(
                "layer owner_rule alternate shared_steps expert_steps expert_denominator expert_clip residual"
            )
        );
        assert_eq!(
            k(Method::ExpertOnly),
            set("layer owner_rule expert_denominator expert_clip residual")
        );
        assert_eq!(k(Method::SharedOnly), set("layer owner_rule"));
        assert_eq!(k(Method::MatchedScope), set("layer owner_rule"));
        for m in [
            Method::DpAdamLora,
            Method::DpAdamFull,
            Method::Lora,
            Method::Full,
        ] {
            assert_eq!(k(m), set(""), "{m}");
        }
        for m in [Method::DpSgd, Method::DpAdam, Method::Adam] {
            assert_eq!(k(m), set("scope"), "{m}");
        }
        let muon = "scope muon_beta muon_momentum ns_polynomial ns_steps ns_kappa muon_lr";
        assert_eq!(k(Method::DpMuon), set(muon));
        assert_eq!(k(Method::Muon), set(muon));
        assert_eq!(k(Method::DpMuonbc), set(&format!("{muon} bc_probe_pairs")));
        assert_eq!(
            users("muon_beta"),
            [Method::DpMuon, Method::DpMuonbc, Method::Muon]
        );
        assert!(users("nothing").is_empty());
    }

    /// Switching the method keeps the knobs the new one takes, and only those.
    #[test]
    fn switching_keeps_the_shared_knobs() {
        let mut c = MethodConfig::new(Method::DpMuonbc);
        *c.scope_mut().unwrap() = Scope::Lora;
        c.muon_mut().unwrap().muon_lr = 0.5;
        c.bias_correction_mut().unwrap().bc_probe_pairs = 3;
        let d = c.switched_to(Method::DpAdam);
        assert_eq!(d, MethodConfig::DpAdam { scope: Scope::Lora });
        let e = c.switched_to(Method::Muon);
        assert_eq!(e.muon().unwrap().muon_lr, 0.5);
        assert_eq!(
            e.switched_to(Method::DpMuonbc).bias_correction(),
            Some(&BiasCorrection::default())
        );
        let mut r = MethodConfig::new(Method::Raptor);
        r.expert_layer_mut().unwrap().layer = LayerSpec::Block(2);
        r.expert_streams_mut().unwrap().residual = ResidualWeight::None;
        r.alternation_mut().unwrap().alternate = false;
        let x = r.switched_to(Method::ExpertOnly);
        assert_eq!(x.layer(), Some(LayerSpec::Block(2)));
        assert_eq!(x.expert_streams().unwrap().residual, ResidualWeight::None);
        assert_eq!(
            x.switched_to(Method::Raptor).alternation(),
            Some(&Alternation::default())
        );
        assert_eq!(r.switched_to(Method::Lora), MethodConfig::Lora);
    }
}
