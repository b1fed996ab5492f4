//! The settings of a run config that take one of a fixed set of values, as enums: serde's
//! `rename_all` and strum's `serialize_all` (both kebab-case) give each value its name in the
//! TOML, and parsing, printing and the list of accepted names all come from the derives (a test
//! checks that the two agree for every value). A name that is not accepted is an error that gives
//! the bad value and every accepted name ([`RunConfig::from_toml`](super::RunConfig::from_toml)
//! adds the setting). Settings that also take a free form (a block index, a file path, a CUDA
//! device number) are enums with a data variant and hand-written (de)serialization.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use strum::{Display, IntoStaticStr, VariantArray};

use crate::error::{ConfigError, Result};

/// A setting that takes one of a fixed set of names: every enum that derives strum's
/// `VariantArray` and `IntoStaticStr`.
pub trait Choice: Copy + VariantArray + Into<&'static str> {
    /// Every value, in declaration order.
    const ALL: &'static [Self] = Self::VARIANTS;

    /// The value's name in configs and tables.
    fn name(self) -> &'static str {
        self.into()
    }

    /// The value named `s`, if any (names are matched exactly).
    fn from_name(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == s)
    }

    /// The accepted names, comma separated.
    fn accepted() -> String {
        Self::ALL
            .iter()
            .map(|v| v.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl<T: Copy + VariantArray + Into<&'static str>> Choice for T {}

/// Parses a name of `T`; the error gives the bad value and the accepted names (`unknown value
/// "x"; accepted: a, b, c`).
pub fn parse_choice<T: Choice>(s: &str) -> Result<T> {
    T::from_name(s).ok_or_else(|| {
        ConfigError::Value(format!("unknown value {s:?}; accepted: {}", T::accepted()))
    })
}

/// `data.format`: how the data files are read.
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DataFormat {
    /// A classification table (CSV/TSV/JSONL with text and label columns).
    Table,
    /// E2E-style data-to-text CSV (`mr`, `ref`).
    E2e,
    /// DART data-to-text (JSON, or WebNLG-style XML by extension).
    Dart,
}

impl DataFormat {
    /// Whether the data is data-to-text (`e2e` or `dart`).
    pub fn is_data_to_text(self) -> bool {
        match self {
            DataFormat::Table => false,
            DataFormat::E2e | DataFormat::Dart => true,
        }
    }
}

/// Supported architectures (`model.kind`).
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ModelKind {
    /// Switch-Transformers-style MoE encoder with a classification head.
    Switch,
    /// OLMoE-style MoE decoder (classification head on the last token).
    Olmoe,
    /// GPT-2 dense decoder (language modelling head).
    Gpt2,
    /// Llama-style dense decoder (language modelling head; tied or untied).
    Llama,
    /// Mixtral-style MoE decoder (classification head on the last token).
    Mixtral,
    /// Qwen2-MoE-style decoder, routed experts plus a shared expert in the shared stream
    /// (classification head on the last token).
    Qwen2Moe,
    /// BERT-style encoder classifier (mean pooling over the valid tokens).
    Bert,
    /// MoE-BERT classifier (raptor's layout: routed experts in place of chosen layers'
    /// FFNs, e.g. from `raptor upcycle` on a BERT folder).
    MoeBert,
}

impl ModelKind {
    /// Whether the model is a language model (trained on the text column; data-to-text).
    pub fn is_language_model(self) -> bool {
        matches!(self, ModelKind::Gpt2 | ModelKind::Llama)
    }

    /// Whether the model has routed experts.
    pub fn is_moe(self) -> bool {
        matches!(
            self,
            ModelKind::Switch
                | ModelKind::Olmoe
                | ModelKind::Mixtral
                | ModelKind::Qwen2Moe
                | ModelKind::MoeBert
        )
    }

    /// Whether the model is a BERT encoder (`bert`, `moe-bert`: `model.pooling` applies).
    pub fn is_bert(self) -> bool {
        matches!(self, ModelKind::Bert | ModelKind::MoeBert)
    }
}

/// `model.pooling`: how a `bert` / `moe-bert` classifier pools its tokens.
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pooling {
    /// Mean over the valid tokens (as sentence-transformers).
    Mean,
    /// `tanh(pooler.dense(h[CLS]))`, the checkpoint's pooler.
    Pooler,
}

impl Pooling {
    /// Whether this is the default, mean pooling (left out of a written config).
    pub fn is_mean(&self) -> bool {
        *self == Pooling::Mean
    }
}

/// The training methods (`method.name`).
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Method {
    /// RAPTOR: shared + per-expert streams.
    Raptor,
    /// Monolithic DP-Adam over all LoRA adapters and the head.
    DpAdamLora,
    /// Monolithic DP-Adam over all parameters except routers.
    DpAdamFull,
    /// RAPTOR's scope, one global clip and one σ (Baseline A).
    MatchedScope,
    /// RAPTOR's shared stream alone.
    SharedOnly,
    /// RAPTOR's expert streams alone.
    ExpertOnly,
    /// Non-private LoRA.
    Lora,
    /// Non-private full fine-tuning.
    Full,
    /// DP-SGD (flat clip, plain SGD).
    DpSgd,
    /// DP-Adam (flat clip, AdamW).
    DpAdam,
    /// DP-Muon (per-matrix clip, Muon on hidden matrices, AdamW on the rest).
    DpMuon,
    /// DP-Muon with the antithetic bias correction.
    DpMuonbc,
    /// Non-private Muon.
    Muon,
    /// Non-private AdamW.
    Adam,
}

/// The families of methods, by how the plan is built from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodFamily {
    /// RAPTOR and its one-stream ablations (`raptor`, `shared-only`, `expert-only`): a shared
    /// stream and per-expert streams of one sparse layer, each with its own clip bound,
    /// optimizer and σ.
    Streams,
    /// One release over RAPTOR's scope (`matched-scope`): the layer choice of RAPTOR, one clip
    /// and one σ.
    MatchedScope,
    /// One release over a fixed LoRA or full scope of a MoE classifier (`dp-adam-lora`,
    /// `dp-adam-full`, `lora`, `full`).
    Monolithic,
    /// One release over `method.scope` (`dp-sgd`, `dp-adam`, `dp-muon`, `dp-muonbc`, `muon`,
    /// `adam`), per-matrix clipping and Muon for the DP-Muon ones.
    Scoped,
}

impl Method {
    /// Whether the method is differentially private.
    pub fn is_private(self) -> bool {
        match self {
            Method::Lora | Method::Full | Method::Muon | Method::Adam => false,
            Method::Raptor
            | Method::DpAdamLora
            | Method::DpAdamFull
            | Method::MatchedScope
            | Method::SharedOnly
            | Method::ExpertOnly
            | Method::DpSgd
            | Method::DpAdam
            | Method::DpMuon
            | Method::DpMuonbc => true,
        }
    }

    /// The method's family.
    pub fn family(self) -> MethodFamily {
        match self {
            Method::Raptor | Method::SharedOnly | Method::ExpertOnly => MethodFamily::Streams,
            Method::MatchedScope => MethodFamily::MatchedScope,
            Method::DpAdamLora | Method::DpAdamFull | Method::Lora | Method::Full => {
                MethodFamily::Monolithic
            }
            Method::DpSgd
            | Method::DpAdam
            | Method::DpMuon
            | Method::DpMuonbc
            | Method::Muon
            | Method::Adam => MethodFamily::Scoped,
        }
    }

    /// Methods that need an MoE model (owner maps, expert streams).
    pub fn needs_experts(self) -> bool {
        match self.family() {
            MethodFamily::Streams | MethodFamily::MatchedScope => true,
            MethodFamily::Monolithic | MethodFamily::Scoped => false,
        }
    }

    /// Whether the method releases per-expert streams (`raptor`, `expert-only`).
    pub fn has_expert_streams(self) -> bool {
        matches!(self, Method::Raptor | Method::ExpertOnly)
    }

    /// Whether the method releases a shared stream of its own (`raptor`, `shared-only`).
    pub fn has_shared_stream(self) -> bool {
        matches!(self, Method::Raptor | Method::SharedOnly)
    }

    /// Whether the method updates hidden matrices with Muon (`dp-muon`, `dp-muonbc`, `muon`).
    pub fn uses_muon(self) -> bool {
        matches!(self, Method::DpMuon | Method::DpMuonbc | Method::Muon)
    }
}

/// `train.prefix_cache`: the frozen-prefix cache (each record's hidden states after the
/// frozen blocks, computed once; see `trainer::prefix`).
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum PrefixCacheMode {
    /// Where it applies: in memory when it fits the budget, else in a file of the run's
    /// private folder.
    #[default]
    Auto,
    /// Where it applies, in memory whatever its size.
    Memory,
    /// Where it applies, in a file of the run's private folder.
    File,
    /// Never: every update computes the frozen blocks.
    Off,
}

impl PrefixCacheMode {
    /// Whether this is the default (`auto`: left out of a written config).
    pub fn is_auto(&self) -> bool {
        *self == PrefixCacheMode::Auto
    }
}

/// `method.owner_rule`: which expert owns a record.
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnerRule {
    /// The expert with the largest summed gate weight over the record's tokens.
    GateWeighted,
    /// The expert routed the most tokens of the record (plurality).
    TokenCount,
}

impl From<OwnerRule> for raptor_routing::OwnerRule {
    fn from(r: OwnerRule) -> Self {
        match r {
            OwnerRule::GateWeighted => raptor_routing::OwnerRule::GateWeighted,
            OwnerRule::TokenCount => raptor_routing::OwnerRule::TokenCount,
        }
    }
}

/// `method.expert_denominator`: the public denominator of RAPTOR's expert releases.
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExpertDenominator {
    /// D_e = B/E, the expected records per expert.
    ExpectedOwner,
    /// D_e = B, the expected batch.
    Batch,
}

/// `method.expert_clip`: how RAPTOR clips the expert streams.
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExpertClip {
    /// Each stream its own bound (`train.clip`, `train.clip_expert`).
    Role,
    /// One factor per record over the shared and expert gradients together (`train.clip`).
    Global,
}

/// `method.residual`: the weight of a record in RAPTOR's expert loss.
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResidualWeight {
    /// w = 1 − p_shared(y|x).
    Prob,
    /// w = 1 if the shared margin p(y) − max_{c≠y} p(c) < 0.2, else 0.
    Margin,
    /// No weighting (w = 1).
    None,
}

/// `method.scope`: the trainable scope of the dense-decoder methods.
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Scope {
    /// Every parameter but the routers (the default).
    #[default]
    Full,
    /// LoRA on the attention projections, and the head.
    Lora,
}

/// `method.muon_momentum`: the momentum form of Muon.
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MuonMomentum {
    /// Heavy-ball: m ← βm + g, direction m.
    HeavyBall,
    /// Exponential moving average: m ← βm + (1 − β)g, direction m.
    Ema,
    /// Nesterov: m ← βm + g, direction g + βm.
    Nesterov,
}

impl From<MuonMomentum> for raptor_muon::MomentumForm {
    fn from(m: MuonMomentum) -> Self {
        match m {
            MuonMomentum::HeavyBall => raptor_muon::MomentumForm::HeavyBall,
            MuonMomentum::Ema => raptor_muon::MomentumForm::Ema,
            MuonMomentum::Nesterov => raptor_muon::MomentumForm::Nesterov,
        }
    }
}

/// `method.ns_polynomial`: the Newton–Schulz polynomial.
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NsPolynomial {
    /// Keller Jordan's quintic.
    Keller,
    /// The Taylor polynomial p_κ of degree `method.ns_kappa`.
    Taylor,
}

/// `privacy.split`: how RAPTOR's budget is split between its streams.
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BudgetSplit {
    /// Both σ's calibrated together on the one composed PRV (spends the whole ε).
    Joint,
    /// Each stream calibrated alone on its share ρ / 1 − ρ (the paper's; leaves part of ε
    /// unspent).
    Additive,
}

/// The optimizer of one RAPTOR stream (`train.shared_optimizer`, `train.expert_optimizer`).
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StreamOptimizer {
    /// AdamW (scale-invariant per coordinate).
    Adamw,
    /// SGD, with `train.momentum` (steps proportional to the release).
    Sgd,
}

/// What a run's update budget counts (`train.budget`).
#[derive(Serialize, Deserialize, Display, IntoStaticStr, VariantArray)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Budget {
    /// Updates (phase executions).
    Updates,
    /// Updates per stream (alternating plans run one cycle per `shared_steps` of them).
    StreamUpdates,
}

/// Deserializes `T` from a string through its `FromStr` (for the enums with a free form).
struct ParseVisitor<T>(&'static str, std::marker::PhantomData<T>);

impl<T: FromStr<Err = ConfigError>> Visitor<'_> for ParseVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<T, E> {
        v.parse().map_err(|e: ConfigError| match e {
            ConfigError::Value(m) => E::custom(m),
            other => E::custom(other),
        })
    }
}

/// `method.layer`: the sparse layer RAPTOR (and matched-scope) train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerSpec {
    /// The sparse layer of highest public-corpus routing entropy (the last sparse layer
    /// without a public file).
    Entropy,
    /// The first sparse layer.
    First,
    /// The last sparse layer.
    Last,
    /// This block (it must be a sparse layer of the model); written as the index, as a string
    /// (`"3"`) or an integer (`3`).
    Block(usize),
}

impl fmt::Display for LayerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayerSpec::Entropy => f.write_str("entropy"),
            LayerSpec::First => f.write_str("first"),
            LayerSpec::Last => f.write_str("last"),
            LayerSpec::Block(l) => write!(f, "{l}"),
        }
    }
}

impl FromStr for LayerSpec {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "entropy" => Ok(LayerSpec::Entropy),
            "first" => Ok(LayerSpec::First),
            "last" => Ok(LayerSpec::Last),
            _ => s.parse().map(LayerSpec::Block).map_err(|_| {
                ConfigError::Value(format!("unknown value {s:?}; accepted: {LAYER_ACCEPTED}"))
            }),
        }
    }
}

impl Serialize for LayerSpec {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Reads a [`LayerSpec`] from a name, an index as a string, or an integer.
struct LayerVisitor;

impl Visitor<'_> for LayerVisitor {
    type Value = LayerSpec;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("entropy, first, last or a block index")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<LayerSpec, E> {
        ParseVisitor(LAYER_ACCEPTED, std::marker::PhantomData).visit_str(v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<LayerSpec, E> {
        usize::try_from(v)
            .map(LayerSpec::Block)
            .map_err(|_| E::custom(format!("block index {v} is too large")))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<LayerSpec, E> {
        u64::try_from(v)
            .map_err(|_| E::custom(format!("unknown value {v}; accepted: {LAYER_ACCEPTED}")))
            .and_then(|u| self.visit_u64(u))
    }
}

const LAYER_ACCEPTED: &str = "entropy, first, last or a block index";

impl<'de> Deserialize<'de> for LayerSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(LayerVisitor)
    }
}

/// `model.tokenizer`: which tokenizer reads the records.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TokenizerSpec {
    /// UTF-8 bytes (data-independent).
    Bytes,
    /// GPT-2's byte-level BPE.
    Gpt2,
    /// The tokenizer stored in the GGUF file of `model.path`.
    Gguf,
    /// `<model.path>/tokenizer.json`.
    Model,
    /// A `tokenizer.json` file (any other value; `cache:` paths allowed).
    File(PathBuf),
}

impl TokenizerSpec {
    /// The tokenizer's name in configs: the keyword, or the file's path.
    pub fn name(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for TokenizerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerSpec::Bytes => f.write_str("bytes"),
            TokenizerSpec::Gpt2 => f.write_str("gpt2"),
            TokenizerSpec::Gguf => f.write_str("gguf"),
            TokenizerSpec::Model => f.write_str("model"),
            TokenizerSpec::File(p) => write!(f, "{}", p.display()),
        }
    }
}

impl FromStr for TokenizerSpec {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "bytes" => TokenizerSpec::Bytes,
            "gpt2" => TokenizerSpec::Gpt2,
            "gguf" => TokenizerSpec::Gguf,
            "model" => TokenizerSpec::Model,
            "" => {
                return Err(ConfigError::Value(
                    "empty; accepted: bytes, gpt2, gguf, model or the path of a tokenizer.json"
                        .into(),
                ));
            }
            path => TokenizerSpec::File(PathBuf::from(path)),
        })
    }
}

impl From<&std::path::Path> for TokenizerSpec {
    /// A `tokenizer.json` file.
    fn from(p: &std::path::Path) -> Self {
        TokenizerSpec::File(p.to_path_buf())
    }
}

impl From<PathBuf> for TokenizerSpec {
    /// A `tokenizer.json` file.
    fn from(p: PathBuf) -> Self {
        TokenizerSpec::File(p)
    }
}

impl Serialize for TokenizerSpec {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TokenizerSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_str(ParseVisitor(
            "bytes, gpt2, gguf, model or the path of a tokenizer.json",
            std::marker::PhantomData,
        ))
    }
}

/// `train.device`: where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceSpec {
    /// The CPU.
    #[default]
    Cpu,
    /// A CUDA device: `cuda` (None: device 0) or `cuda:N`.
    Cuda(Option<usize>),
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(None) => f.write_str("cuda"),
            DeviceSpec::Cuda(Some(i)) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(None)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(|i| DeviceSpec::Cuda(Some(i)))
                .ok_or_else(|| {
                    ConfigError::Value(format!("unknown value {s:?}; accepted: cpu, cuda, cuda:N"))
                }),
        }
    }
}

impl Serialize for DeviceSpec {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_str(ParseVisitor(
            "cpu, cuda or cuda:N",
            std::marker::PhantomData,
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{MethodConfig, RunConfig};

    /// A default config whose method is `m` (at its defaults).
    fn with_method(c: &mut RunConfig, m: Method) {
        c.method = MethodConfig::new(m);
    }

    /// Every value of `T` written into a config through `set` comes back from its TOML, which
    /// holds `key = "<name>"`.
    fn round_trip<T: Choice + PartialEq + fmt::Debug>(
        key: &str,
        set: impl Fn(&mut RunConfig, T),
        get: impl Fn(&RunConfig) -> T,
    ) {
        for &v in T::ALL {
            let mut c = RunConfig::default();
            set(&mut c, v);
            let text = c.to_toml().unwrap();
            assert!(
                text.contains(&format!("{key} = \"{}\"", v.name())),
                "{key}: {v:?} in\n{text}"
            );
            let back = RunConfig::from_toml(&text).unwrap();
            assert_eq!(get(&back), v, "{key}");
            assert_eq!(back, c, "{key}: {v:?}");
            assert_eq!(v.name().parse::<ChoiceOf<T>>().unwrap().0, v);
        }
    }

    /// `FromStr` through [`parse_choice`], for any [`Choice`].
    struct ChoiceOf<T>(T);

    impl<T: Choice> FromStr for ChoiceOf<T> {
        type Err = ConfigError;
        fn from_str(s: &str) -> Result<Self> {
            parse_choice(s).map(ChoiceOf)
        }
    }

    #[test]
    fn every_accepted_name_round_trips_through_the_toml() {
        round_trip("format", |c, v| c.data.format = v, |c| c.data.format);
        round_trip("kind", |c, v| c.model.kind = v, |c| c.model.kind);
        round_trip("name", with_method, |c| c.method.name());
        // The knobs of `[method]`, each on a method that takes it.
        round_trip(
            "owner_rule",
            |c, v| c.method.expert_layer_mut().unwrap().owner_rule = v,
            |c| c.method.owner_rule().unwrap(),
        );
        round_trip(
            "expert_denominator",
            |c, v| c.method.expert_streams_mut().unwrap().expert_denominator = v,
            |c| c.method.expert_streams().unwrap().expert_denominator,
        );
        round_trip(
            "expert_clip",
            |c, v| c.method.expert_streams_mut().unwrap().expert_clip = v,
            |c| c.method.expert_streams().unwrap().expert_clip,
        );
        round_trip(
            "residual",
            |c, v| c.method.expert_streams_mut().unwrap().residual = v,
            |c| c.method.expert_streams().unwrap().residual,
        );
        round_trip(
            "scope",
            |c, v| {
                with_method(c, Method::DpAdam);
                *c.method.scope_mut().unwrap() = v;
            },
            |c| c.method.scope().unwrap(),
        );
        round_trip(
            "muon_momentum",
            |c, v| {
                with_method(c, Method::DpMuon);
                c.method.muon_mut().unwrap().muon_momentum = v;
            },
            |c| c.method.muon().unwrap().muon_momentum,
        );
        round_trip(
            "ns_polynomial",
            |c, v| {
                with_method(c, Method::Muon);
                c.method.muon_mut().unwrap().ns_polynomial = v;
            },
            |c| c.method.muon().unwrap().ns_polynomial,
        );
        round_trip("split", |c, v| c.privacy.split = v, |c| c.privacy.split);
        round_trip(
            "shared_optimizer",
            |c, v| c.train.shared_optimizer = v,
            |c| c.train.shared_optimizer,
        );
        round_trip(
            "expert_optimizer",
            |c, v| c.train.expert_optimizer = v,
            |c| c.train.expert_optimizer,
        );
        round_trip("budget", |c, v| c.train.budget = v, |c| c.train.budget);
        // The default pooling is left out of a written config; the other is written.
        let mut c = RunConfig::default();
        c.model.pooling = Pooling::Pooler;
        let text = c.to_toml().unwrap();
        assert!(text.contains("pooling = \"pooler\""), "{text}");
        assert_eq!(RunConfig::from_toml(&text).unwrap(), c);
        let text = RunConfig::default().to_toml().unwrap();
        assert!(!text.contains("pooling"), "{text}");
        assert_eq!(
            RunConfig::from_toml("[model]\npooling = \"mean\"\n")
                .unwrap()
                .model
                .pooling,
            Pooling::Mean
        );
    }

    /// The names are the ones configs used when these settings were strings: every existing
    /// config file still parses.
    #[test]
    fn the_names_are_the_ones_configs_always_used() {
        fn names<T: Choice>() -> Vec<&'static str> {
            T::ALL.iter().map(|v| v.name()).collect()
        }
        assert_eq!(names::<DataFormat>(), ["table", "e2e", "dart"]);
        assert_eq!(names::<Pooling>(), ["mean", "pooler"]);
        assert_eq!(names::<OwnerRule>(), ["gate-weighted", "token-count"]);
        assert_eq!(names::<ExpertDenominator>(), ["expected-owner", "batch"]);
        assert_eq!(names::<ExpertClip>(), ["role", "global"]);
        assert_eq!(names::<ResidualWeight>(), ["prob", "margin", "none"]);
        assert_eq!(names::<Scope>(), ["full", "lora"]);
        assert_eq!(names::<MuonMomentum>(), ["heavy-ball", "ema", "nesterov"]);
        assert_eq!(names::<NsPolynomial>(), ["keller", "taylor"]);
        assert_eq!(names::<BudgetSplit>(), ["joint", "additive"]);
        assert_eq!(names::<StreamOptimizer>(), ["adamw", "sgd"]);
        assert_eq!(names::<Budget>(), ["updates", "stream-updates"]);
        assert_eq!(
            names::<PrefixCacheMode>(),
            ["auto", "memory", "file", "off"]
        );
        assert_eq!(
            names::<ModelKind>(),
            [
                "switch",
                "olmoe",
                "gpt2",
                "llama",
                "mixtral",
                "qwen2-moe",
                "bert",
                "moe-bert"
            ]
        );
        assert_eq!(
            names::<Method>(),
            [
                "raptor",
                "dp-adam-lora",
                "dp-adam-full",
                "matched-scope",
                "shared-only",
                "expert-only",
                "lora",
                "full",
                "dp-sgd",
                "dp-adam",
                "dp-muon",
                "dp-muonbc",
                "muon",
                "adam"
            ]
        );
    }

    /// serde (the TOML) and strum (`name`, `Display`) derive the names separately: they agree
    /// for every value of every choice, and each name reads back as its value.
    #[test]
    fn serde_and_strum_give_every_value_the_same_name() {
        fn agree<T>()
        where
            T: Choice
                + Serialize
                + serde::de::DeserializeOwned
                + fmt::Display
                + PartialEq
                + fmt::Debug,
        {
            for &v in T::ALL {
                let serde_name = serde_json::to_value(v).unwrap();
                assert_eq!(serde_name, serde_json::Value::from(v.name()), "{v:?}");
                assert_eq!(v.to_string(), v.name(), "{v:?}");
                assert_eq!(serde_json::from_value::<T>(serde_name).unwrap(), v);
                assert_eq!(parse_choice::<T>(v.name()).unwrap(), v);
            }
        }
        agree::<DataFormat>();
        agree::<ModelKind>();
        agree::<Pooling>();
        agree::<Method>();
        agree::<PrefixCacheMode>();
        agree::<OwnerRule>();
        agree::<ExpertDenominator>();
        agree::<ExpertClip>();
        agree::<ResidualWeight>();
        agree::<Scope>();
        agree::<MuonMomentum>();
        agree::<NsPolynomial>();
        agree::<BudgetSplit>();
        agree::<StreamOptimizer>();
        agree::<Budget>();
    }

    #[test]
    fn free_form_settings_round_trip() {
        for (text, layer) in [
            ("entropy", LayerSpec::Entropy),
            ("first", LayerSpec::First),
            ("last", LayerSpec::Last),
            ("3", LayerSpec::Block(3)),
        ] {
            let c = RunConfig::from_toml(&format!("[method]\nlayer = \"{text}\"\n")).unwrap();
            assert_eq!(c.method.layer(), Some(layer));
            let out = c.to_toml().unwrap();
            assert!(out.contains(&format!("layer = \"{text}\"")), "{out}");
            assert_eq!(RunConfig::from_toml(&out).unwrap(), c);
        }
        // An integer block index is accepted too (and written back as a string).
        let c = RunConfig::from_toml("[method]\nlayer = 2\n").unwrap();
        assert_eq!(c.method.layer(), Some(LayerSpec::Block(2)));
        for (text, tok) in [
            ("bytes", TokenizerSpec::Bytes),
            ("gpt2", TokenizerSpec::Gpt2),
            ("gguf", TokenizerSpec::Gguf),
            ("model", TokenizerSpec::Model),
            (
                "/tmp/tok/tokenizer.json",
                TokenizerSpec::File("/tmp/tok/tokenizer.json".into()),
            ),
        ] {
            let c = RunConfig::from_toml(&format!("[model]\ntokenizer = \"{text}\"\n")).unwrap();
            assert_eq!(c.model.tokenizer, tok);
            let out = c.to_toml().unwrap();
            assert!(out.contains(&format!("tokenizer = \"{text}\"")), "{out}");
            assert_eq!(RunConfig::from_toml(&out).unwrap(), c);
        }
        for (text, dev) in [
            ("cpu", DeviceSpec::Cpu),
            ("cuda", DeviceSpec::Cuda(None)),
            ("cuda:2", DeviceSpec::Cuda(Some(2))),
        ] {
            let c = RunConfig::from_toml(&format!("[train]\ndevice = \"{text}\"\n")).unwrap();
            assert_eq!(c.train.device, dev);
            let out = c.to_toml().unwrap();
            assert!(out.contains(&format!("device = \"{text}\"")), "{out}");
            assert_eq!(RunConfig::from_toml(&out).unwrap(), c);
        }
    }

    /// A value a setting does not accept is an error naming the setting (`section.field`), the
    /// bad value and the accepted values, however the TOML writes the key.
    #[test]
    fn an_unknown_value_names_the_setting_the_value_and_the_accepted_ones() {
        let cases = [
            (
                "[method]\nresidual = \"probability\"\n",
                "method.residual",
                "probability",
                "prob margin none",
            ),
            (
                "method.residual = \"probability\"\n",
                "method.residual",
                "probability",
                "prob margin none",
            ),
            (
                "method = { name = \"raptor\", residual = \"probability\" }\n",
                "method.residual",
                "probability",
                "prob margin none",
            ),
            (
                "[data]\nformat = \"csv\"\n",
                "data.format",
                "csv",
                "table e2e dart",
            ),
            (
                "[model]\nkind = \"gpt3\"\n",
                "model.kind",
                "gpt3",
                "switch olmoe gpt2 llama mixtral qwen2-moe bert moe-bert",
            ),
            (
                "[model]\npooling = \"max\"\n",
                "model.pooling",
                "max",
                "mean pooler",
            ),
            (
                "[model]\ntokenizer = \"\"\n",
                "model.tokenizer",
                "empty",
                "bytes gpt2 gguf model tokenizer.json",
            ),
            (
                "[method]\nname = \"dp-adam-lorax\"\n",
                "method.name",
                "dp-adam-lorax",
                "raptor dp-adam-lora dp-adam-full matched-scope shared-only expert-only lora full dp-sgd dp-adam dp-muon dp-muonbc muon adam",
            ),
            (
                "[method]\nlayer = \"middle\"\n",
                "method.layer",
                "middle",
                "entropy first last block",
            ),
            (
                "[method]\nlayer = -1\n",
                "method.layer",
                "-1",
                "entropy first last block",
            ),
            (
                "[method]\nowner_rule = \"gate\"\n",
                "method.owner_rule",
                "gate",
                "gate-weighted token-count",
            ),
            (
                "[method]\nexpert_denominator = \"b\"\n",
                "method.expert_denominator",
                "b",
                "expected-owner batch",
            ),
            (
                "[method]\nexpert_clip = \"per-role\"\n",
                "method.expert_clip",
                "per-role",
                "role global",
            ),
            (
                "[method]\nname = \"dp-adam\"\nscope = \"adapters\"\n",
                "method.scope",
                "adapters",
                "full lora",
            ),
            (
                "[method]\nname = \"dp-muon\"\nmuon_momentum = \"nesterov2\"\n",
                "method.muon_momentum",
                "nesterov2",
                "heavy-ball ema nesterov",
            ),
            (
                "[method]\nname = \"muon\"\nns_polynomial = \"quintic\"\n",
                "method.ns_polynomial",
                "quintic",
                "keller taylor",
            ),
            (
                "[privacy]\nsplit = \"equal\"\n",
                "privacy.split",
                "equal",
                "joint additive",
            ),
            (
                "[train]\nshared_optimizer = \"adam\"\n",
                "train.shared_optimizer",
                "adam",
                "adamw sgd",
            ),
            (
                "[train]\nexpert_optimizer = \"adam\"\n",
                "train.expert_optimizer",
                "adam",
                "adamw sgd",
            ),
            (
                "[train]\nbudget = \"samples\"\n",
                "train.budget",
                "samples",
                "updates stream-updates",
            ),
            (
                "[train]\ndevice = \"gpu\"\n",
                "train.device",
                "gpu",
                "cpu cuda cuda:N",
            ),
        ];
        for (toml, setting, bad, accepted) in cases {
            let e = RunConfig::from_toml(toml).unwrap_err().to_string();
            assert!(e.contains(&format!("{setting}: ")), "{toml}: {e}");
            assert!(e.contains(bad), "{toml}: {e}");
            for name in accepted.split_whitespace() {
                assert!(e.contains(name), "{toml}: {name} not in {e}");
            }
        }
        // The line is given too.
        let e = RunConfig::from_toml("[data]\nformat = \"table\"\n\n[method]\nresidual = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("method.residual: ") && e.contains("(line 5)"),
            "{e}"
        );
        // A value of the wrong type, and an unknown field, are named the same way.
        let e = RunConfig::from_toml("[method]\nresidual = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("method.residual: "), "{e}");
        let e = RunConfig::from_toml("[train]\nbatchsize = 3\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.batchsize: ") && e.contains("batch_size"),
            "{e}"
        );
    }

    #[test]
    fn from_str_gives_the_accepted_values() {
        let e = parse_choice::<ResidualWeight>("probability").unwrap_err();
        assert_eq!(
            e.to_string(),
            "config: unknown value \"probability\"; accepted: prob, margin, none"
        );
        assert_eq!(
            "cuda:1".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Cuda(Some(1))
        );
        assert!("cuda:x".parse::<DeviceSpec>().is_err());
        assert_eq!("7".parse::<LayerSpec>().unwrap(), LayerSpec::Block(7));
        assert_eq!(
            raptor_routing::OwnerRule::from(OwnerRule::TokenCount),
            raptor_routing::OwnerRule::TokenCount
        );
        assert_eq!(
            raptor_muon::MomentumForm::from(MuonMomentum::Ema),
            raptor_muon::MomentumForm::Ema
        );
    }
}
