//! What each parameter of a model is for, answered from one index.
//!
//! Private training treats parameters by **role**: RAPTOR releases a routed expert's parameters
//! in that expert's own stream (a parallel member of its layer, clipped on its owner's records
//! only), everything else in the shared stream; DP-Muon orthogonalizes hidden matrices; the
//! head is trainable in every LoRA scope. [`Naming`] holds each model family's Hugging Face
//! name conventions (the only place they are written), and [`RoleIndex`] classifies every
//! parameter name once, so that no caller parses a name (or formats a prefix) to learn which
//! expert owns a parameter.
//!
//! ```
//! use raptor_models::roles::{ExpertId, Naming, Role, RoleIndex};
//!
//! let names = [
//!     "classifier.weight",
//!     "encoder.block.1.layer.0.SelfAttention.q.lora_A.weight",
//!     "encoder.block.1.layer.1.mlp.experts.expert_3.wi.lora_B.weight",
//! ];
//! let index = RoleIndex::new(Naming::Switch, names, &[1], 4, &[]);
//! assert_eq!(index.role(names[0]), Role::Head);
//! assert_eq!(index.role(names[1]), Role::Attention);
//! assert_eq!(index.routed_expert(names[2]), Some(ExpertId { layer: 1, expert: 3 }));
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

/// The parameter-name conventions of a model family (Hugging Face names; raptor's own layout
/// for MoE-BERT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Naming {
    /// Switch Transformers (`encoder.block.{l}.layer.1.mlp.experts.expert_{e}.…`).
    Switch,
    /// OLMoE (`model.layers.{l}.mlp.experts.{e}.…`).
    Olmoe,
    /// GPT-2 (dense).
    Gpt2,
    /// Llama (dense).
    Llama,
    /// Mixtral (`model.layers.{l}.block_sparse_moe.experts.{e}.…`).
    Mixtral,
    /// Qwen2-MoE (routed experts as OLMoE; `mlp.shared_expert.…` is not routed).
    Qwen2Moe,
    /// BERT (dense).
    Bert,
    /// MoE-BERT (`bert.encoder.layer.{l}.moe.experts.{e}.…`).
    MoeBert,
}

impl Naming {
    /// Every family.
    pub const ALL: [Naming; 8] = [
        Naming::Switch,
        Naming::Olmoe,
        Naming::Gpt2,
        Naming::Llama,
        Naming::Mixtral,
        Naming::Qwen2Moe,
        Naming::Bert,
        Naming::MoeBert,
    ];

    /// Attention projections that carry LoRA.
    pub fn attention_targets(self) -> Vec<String> {
        let v: &[&str] = match self {
            Naming::Switch => &[
                "SelfAttention.q",
                "SelfAttention.k",
                "SelfAttention.v",
                "SelfAttention.o",
            ],
            Naming::Olmoe | Naming::Llama | Naming::Mixtral | Naming::Qwen2Moe => &[
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
            ],
            Naming::Gpt2 => &["attn.c_attn", "attn.c_proj"],
            Naming::Bert | Naming::MoeBert => &[
                "attention.self.query",
                "attention.self.key",
                "attention.self.value",
                "attention.output.dense",
            ],
        };
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Name prefix of routed expert `e` of sparse layer `l` (with the trailing dot).
    pub fn expert_prefix(self, l: usize, e: usize) -> String {
        match self {
            Naming::Switch => format!("encoder.block.{l}.layer.1.mlp.experts.expert_{e}."),
            Naming::Mixtral => format!("model.layers.{l}.block_sparse_moe.experts.{e}."),
            Naming::MoeBert => format!("bert.encoder.layer.{l}.moe.experts.{e}."),
            // OLMoE and Qwen2-MoE; the dense models have no expert to name.
            Naming::Olmoe | Naming::Qwen2Moe | Naming::Gpt2 | Naming::Llama | Naming::Bert => {
                format!("model.layers.{l}.mlp.experts.{e}.")
            }
        }
    }

    /// LoRA target patterns of every routed expert of sparse layer `l`.
    pub fn expert_targets(self, l: usize) -> Vec<String> {
        let (stem, leaves): (String, &[&str]) = match self {
            Naming::Switch => (
                format!("encoder.block.{l}.layer.1.mlp.experts.*"),
                &["wi", "wo"],
            ),
            Naming::Mixtral => (
                format!("model.layers.{l}.block_sparse_moe.experts.*"),
                &["w1", "w2", "w3"],
            ),
            Naming::MoeBert => (
                format!("bert.encoder.layer.{l}.moe.experts.*"),
                &["intermediate.dense", "output.dense"],
            ),
            Naming::Olmoe | Naming::Qwen2Moe | Naming::Gpt2 | Naming::Llama | Naming::Bert => (
                format!("model.layers.{l}.mlp.experts.*"),
                &["gate_proj", "up_proj", "down_proj"],
            ),
        };
        leaves.iter().map(|p| format!("{stem}.{p}")).collect()
    }

    /// Pattern matching every expert module of layer `l` (for switching their LoRA off).
    pub fn expert_modules(self, l: usize) -> String {
        match self {
            Naming::Switch => format!("encoder.block.{l}.layer.1.mlp.experts.*"),
            Naming::Mixtral => format!("model.layers.{l}.block_sparse_moe.experts.*"),
            Naming::MoeBert => format!("bert.encoder.layer.{l}.moe.experts.*"),
            Naming::Olmoe | Naming::Qwen2Moe | Naming::Gpt2 | Naming::Llama | Naming::Bert => {
                format!("model.layers.{l}.mlp.experts.*")
            }
        }
    }

    /// Parameter patterns of the task head (trained with the shared stream).
    pub fn head_patterns(self) -> Vec<&'static str> {
        match self {
            Naming::Switch | Naming::Bert | Naming::MoeBert => vec!["classifier"],
            Naming::Olmoe | Naming::Mixtral | Naming::Qwen2Moe | Naming::Gpt2 | Naming::Llama => {
                vec!["score"]
            }
        }
    }

    /// Whether a parameter is a "hidden matrix" (Muon-updated, clipped on its own by the
    /// DP-Muon family): 2-D, not an embedding or head. LoRA factors (`lora_A` `[r, in]`,
    /// `lora_B` `[out, r]`) are hidden matrices: DP-Muon on a LoRA scope orthogonalizes each
    /// factor's released gradient (had they been excluded, a LoRA scope would leave Muon
    /// nothing to update and DP-Muon would be DP-Adam, update for update).
    pub fn is_hidden_matrix(self, name: &str, dims: usize) -> bool {
        dims == 2
            && ![
                "wte",
                "wpe",
                "embed_tokens",
                "_embeddings",
                "shared.weight",
                "relative_attention_bias",
                "lm_head",
                "score",
                "classifier",
            ]
            .iter()
            .any(|p| name.contains(p))
    }
}

/// A routed expert: expert `expert` of sparse layer `layer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ExpertId {
    /// The sparse (MoE) layer.
    pub layer: usize,
    /// The expert within the layer.
    pub expert: usize,
}

impl fmt::Display for ExpertId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expert[{},{}]", self.layer, self.expert)
    }
}

/// What a parameter is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Role {
    /// The task head (classifier / score).
    Head,
    /// An attention projection (or its LoRA factors).
    Attention,
    /// A routed expert's parameter (or its LoRA factors): trained in that expert's stream.
    RoutedExpert(ExpertId),
    /// A router (frozen during private training: owner maps come from it).
    Router,
    /// Anything else (embeddings, norms, dense FFNs, a shared expert, …).
    Other,
}

/// Every parameter's [`Role`], classified once from its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleIndex {
    naming: Naming,
    roles: BTreeMap<String, Role>,
}

impl RoleIndex {
    /// Classifies `names` under `naming`: a name under [`Naming::expert_prefix`] of a sparse
    /// layer in `sparse_layers` and an expert below `experts` is that routed expert's; then
    /// a name in `routers`, one starting with a head pattern, one containing an attention
    /// target; the rest is [`Role::Other`].
    pub fn new<'a>(
        naming: Naming,
        names: impl IntoIterator<Item = &'a str>,
        sparse_layers: &[usize],
        experts: usize,
        routers: &[String],
    ) -> Self {
        let prefixes: Vec<(String, ExpertId)> = sparse_layers
            .iter()
            .flat_map(|&layer| {
                (0..experts).map(move |expert| {
                    (
                        naming.expert_prefix(layer, expert),
                        ExpertId { layer, expert },
                    )
                })
            })
            .collect();
        let heads = naming.head_patterns();
        let attention = naming.attention_targets();
        let roles = names
            .into_iter()
            .map(|name| {
                let role = if let Some((_, id)) = prefixes.iter().find(|(p, _)| name.starts_with(p))
                {
                    Role::RoutedExpert(*id)
                } else if routers.iter().any(|r| r == name) {
                    Role::Router
                } else if heads.iter().any(|h| name.starts_with(h)) {
                    Role::Head
                } else if attention.iter().any(|a| name.contains(a.as_str())) {
                    Role::Attention
                } else {
                    Role::Other
                };
                (name.to_string(), role)
            })
            .collect();
        RoleIndex { naming, roles }
    }

    /// The index of every variable of `model` (its sparse layers, experts and routers).
    pub fn of_model<M: crate::Model + ?Sized>(model: &M, naming: Naming) -> Self {
        let vars = model.var_store().variables();
        let experts = usize::try_from(model.num_experts()).unwrap_or(0);
        RoleIndex::new(
            naming,
            vars.keys().map(String::as_str),
            &model.sparse_layers(),
            experts,
            &model.router_params(),
        )
    }

    /// The naming the index was built with.
    pub fn naming(&self) -> Naming {
        self.naming
    }

    /// The role of `name` ([`Role::Other`] for a name the index does not hold).
    pub fn role(&self, name: &str) -> Role {
        self.roles.get(name).copied().unwrap_or(Role::Other)
    }

    /// The routed expert that owns `name`, if any.
    pub fn routed_expert(&self, name: &str) -> Option<ExpertId> {
        match self.role(name) {
            Role::RoutedExpert(id) => Some(id),
            Role::Head | Role::Attention | Role::Router | Role::Other => None,
        }
    }

    /// The parameters of routed expert `id`, in name order.
    pub fn expert_params(&self, id: ExpertId) -> Vec<String> {
        self.roles
            .iter()
            .filter(|(_, r)| **r == Role::RoutedExpert(id))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Every indexed name with its role, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Role)> {
        self.roles.iter().map(|(n, r)| (n.as_str(), *r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family's expert prefix is found back by the index, for every (layer, expert),
    /// including expert numbers whose decimal text extends another's (expert 1 vs 10).
    #[test]
    fn every_expert_prefix_maps_back_to_its_expert() {
        for naming in Naming::ALL {
            let mut names = Vec::new();
            for layer in [0usize, 1, 11] {
                for expert in 0..12usize {
                    names.push((
                        format!("{}w.lora_A.weight", naming.expert_prefix(layer, expert)),
                        ExpertId { layer, expert },
                    ));
                }
            }
            let idx = RoleIndex::new(
                naming,
                names.iter().map(|(n, _)| n.as_str()),
                &[0, 1, 11],
                12,
                &[],
            );
            for (n, id) in &names {
                assert_eq!(idx.routed_expert(n), Some(*id), "{naming:?} {n}");
            }
            let one = ExpertId {
                layer: 1,
                expert: 1,
            };
            assert_eq!(idx.expert_params(one).len(), 1, "{naming:?}");
        }
    }

    /// A layer that is not sparse, an expert beyond the count, a shared expert, a router, the
    /// head and attention get their own roles.
    #[test]
    fn names_outside_the_routed_experts_get_their_roles() {
        let names = [
            "model.layers.0.mlp.experts.0.gate_proj.weight",
            "model.layers.1.mlp.experts.4.gate_proj.weight",
            "model.layers.1.mlp.shared_expert.gate_proj.weight",
            "model.layers.1.mlp.gate.weight",
            "model.layers.1.self_attn.q_proj.lora_A.weight",
            "score.weight",
            "model.layers.1.mlp.experts.3.down_proj.weight",
        ];
        let idx = RoleIndex::new(
            Naming::Qwen2Moe,
            names,
            &[1],
            4,
            &["model.layers.1.mlp.gate.weight".to_string()],
        );
        let roles: Vec<Role> = names.iter().map(|n| idx.role(n)).collect();
        assert_eq!(
            roles,
            [
                Role::Other,
                Role::Other,
                Role::Other,
                Role::Router,
                Role::Attention,
                Role::Head,
                Role::RoutedExpert(ExpertId {
                    layer: 1,
                    expert: 3
                }),
            ]
        );
        assert_eq!(idx.role("not.a.parameter"), Role::Other);
        assert_eq!(
            ExpertId {
                layer: 1,
                expert: 3
            }
            .to_string(),
            "expert[1,3]"
        );
    }
}
