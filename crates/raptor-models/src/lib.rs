//! raptor-models: MoE and dense transformers on libtorch (see the crate README).
//!
//! Models: [`SwitchEncoder`] (Switch-style MoE encoder classifier), [`Decoder`] (Llama-family
//! causal decoders composed from shared blocks: Llama, Mixtral, Qwen2-MoE with a shared expert,
//! OLMoE, see [`DecoderFamily`]), [`OlmoeDecoder`] (the OLMoE configuration of [`Decoder`]),
//! [`Gpt2`] (dense decoder, tied LM head), [`Bert`] (BERT-style encoder classifier);
//! [`factory::build`] builds any of them from a checkpoint or from scratch. Every trainable op
//! records itself in a private [`ForwardCtx`]; [`PerSampleGrads`] then gives exact per-record
//! squared norms by parameter and by caller-named group, and clipped sums, from one backward.

/// Whether this build force-linked libtorch's CUDA libraries (the libtorch in use has
/// `libtorch_cuda.so`). When true, `tch::Cuda::is_available()` reports the GPU at run time.
pub const CUDA_LINKED: bool = cfg!(raptor_cuda_linked);

mod batch;
mod bert;
mod blocks;
pub mod checkpoint;
mod decoder;
mod error;
pub mod factory;
pub mod generate;
pub mod gguf;
pub mod gguf_model;
mod gpt2;
mod grad;
pub mod hf_config;
mod layers;
mod model;
mod moe;
mod olmoe;
pub mod peft;
mod prefix;
pub mod rng;
pub mod roles;
mod switch;
mod tape;
pub mod tokenizer;
pub mod upcycle;

pub use batch::{Batch, Task, per_record_loss};
pub use bert::{Bert, BertConfig, BertMoeConfig, BertPooling};
pub use blocks::RopeScaling;
pub use decoder::{Decoder, DecoderConfig, DecoderFamily, MoeConfig};
pub use error::{ModelError, Result};
pub use gpt2::{Gpt2, Gpt2Config};
pub use grad::{
    ClipOutput, ClipPolicy, EngineLimits, GroupKey, ParamGroups, PerSampleGrads, clip_factors,
};
pub use layers::{Act, Embedding, ForwardCtx, LayerNorm, Linear, Lora, RmsNorm, name_matches};
pub use model::{
    ClippedStep, ClippedStepOutput, FrozenPrefix, LoraConfig, Model, MoeShape, attach_lora,
    freeze_all, set_trainable, trainable_params,
};
pub use moe::{RouterOutput, collect_routing, owner_tensors, owners_per_record};
pub use olmoe::{DecoderHead, OlmoeConfig, OlmoeDecoder};
pub use prefix::{PrefixCache, PrefixPrecision, PrefixStore, precision_error};
pub use switch::{SwitchConfig, SwitchEncoder};
pub use tape::Tape;
