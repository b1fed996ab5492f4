//! # raptor-routing
//!
//! Routing diagnostics for RAPTOR-style private training of Mixture-of-Experts models
//! (the RAPTOR paper, "RAPTOR: Role-Aware Private Training for Mixture-of-Experts", arXiv
//! 2609.05770, §4.3 and §5.1–§5.2): **owner maps** (one owning expert per record, from the frozen router's top-k
//! choices), **statistics** of the owner distribution (entropy, χ² to uniform, load CV, …),
//! **public-corpus layer selection** (the sparse layer of highest owner entropy) and
//! **ownership stability** between two owner maps.
//!
//! Pure Rust by default; the optional `tch` feature adds [`LayerRouting::push_tensors`] to take
//! router outputs as libtorch tensors.
//!
//! ```
//! use raptor_routing::{owner_map, LayerRouting, OwnerRule, PublicCorpus, select_layer, SelectionConfig};
//!
//! // Two candidate layers, E = 3 experts, top-1, two records of two tokens.
//! let mut l0 = LayerRouting::new(3, 1)?;
//! l0.push_record(&[0, 0], &[0.9, 0.8], &[true, true])?;
//! l0.push_record(&[0, 1], &[0.9, 0.8], &[true, true])?;
//! let mut l1 = LayerRouting::new(3, 1)?;
//! l1.push_record(&[2, 2], &[0.9, 0.8], &[true, true])?;
//! l1.push_record(&[1, 1], &[0.9, 0.8], &[true, false])?;
//! assert_eq!(owner_map(&l0, OwnerRule::GateWeighted).owners(), &[0, 0]);
//! assert_eq!(owner_map(&l1, OwnerRule::GateWeighted).owners(), &[2, 1]);
//!
//! // On a public corpus, pick the layer whose owners are most evenly spread.
//! let corpus = PublicCorpus::from_layers(vec![l0, l1])?;
//! let sel = select_layer(&corpus, &SelectionConfig::default())?;
//! assert_eq!(sel.layer, 1);
//! # Ok::<(), raptor_routing::RoutingError>(())
//! ```
//!
//! **Privacy.** Owner maps and statistics of *private* records are private: see [`stats`] for
//! the [`Private`]/[`Public`] markers that keep them from being printed or serialized by
//! accident.

mod error;
pub mod jsonl;
mod layer;
mod owner;
mod select;
pub mod stats;
pub mod synth;

pub use error::RoutingError;
pub use layer::{LayerRouting, RecordView, WeightPrecision};
pub use owner::{OwnerMap, OwnerRule, owner_map, record_owner};
pub use select::{
    LayerSelection, PublicCorpus, SelectionConfig, SelectionReason, SelectionWarning,
    default_layer, select_layer,
};
pub use stats::{Private, Provenance, Public, RoutingStats, Stability, private_stats, stability};
