//! The one description every method is made of: **phases** of **releases** over **clip groups**.
//!
//! - A [`ClipGroup`] is a set of parameters clipped together per record (one bound; optionally
//!   weighted by a per-record residual weight before clipping).
//! - A [`ReleaseSpec`] is one released quantity: the clipped sums of some groups + Gaussian
//!   noise of std σΔ (Δ = the L2 sensitivity of those sums) ÷ a public denominator, charged to
//!   the ledger before it is applied, as a sequential step or as one member of a named parallel
//!   group (the experts of one RAPTOR layer).
//! - A [`Phase`] draws one Poisson sample, runs one forward/backward over it and makes its
//!   releases. The [`Plan`] repeats a fixed pattern of phases (RAPTOR's alternation) for a fixed
//!   number of updates, decided before training from public quantities only.
//!
//! ```text
//! raptor (alternating) = phase shared  [group shared: attention LoRA + head, C_s] -> release σ_s, ÷B
//!                      + phase experts [group expert[l,e] per e, owner rows, weight w, C_e]
//!                                      -> one release per expert, σ_e, ÷B/E, parallel "experts[layer l]"
//! dp-adam-lora         = one phase, one group (all LoRA + head), one release
//! dp-muon              = one phase, one group per hidden matrix (C_W) + one for the rest,
//!                        one release with Δ = sqrt(Σ C_W²)
//! lora / full          = one phase, not private (mean gradient, no clipping, no noise)
//! ```

use serde::Serialize;

/// Parameters clipped together per record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClipGroup {
    /// Group name (`shared`, `expert[3,5]`, `all`, a matrix name, ...).
    pub name: String,
    /// Parameter names (Hugging Face names).
    pub params: Vec<String>,
    /// Per-record L2 bound of the group's (weighted) gradient.
    pub bound: f64,
    /// Multiply each record's gradient by its residual weight before clipping.
    pub weighted: bool,
    /// False: the group only enters the global clip factor (its sums are not released in this
    /// phase, e.g. the shared stream under RAPTOR's `expert_clip = "global"` ablation).
    pub release: bool,
}

/// How a release is charged to the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Charge {
    /// A sequential step.
    Sequential,
    /// Member `member` of the named parallel group (each record touches exactly one member).
    Parallel {
        /// The group (e.g. `experts[layer 3]`).
        group: String,
        /// This release's member index.
        member: usize,
    },
    /// Not private: nothing is charged (ε = ∞).
    None,
}

/// One released quantity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReleaseSpec {
    /// Release name.
    pub name: String,
    /// The clip groups released together.
    pub groups: Vec<String>,
    /// Noise multiplier σ (0 only for non-private phases and tests).
    pub sigma: f64,
    /// The public denominator (B, or B/E for experts).
    pub denominator: f64,
    /// How it is charged.
    pub charge: Charge,
}

/// Residual weighting of weighted groups (RAPTOR's expert loss).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Residual {
    /// No weighting (w = 1).
    None,
    /// w = 1 − p_shared(y|x) (detached, expert LoRA switched off).
    Prob,
    /// w = 1 if the shared margin p(y) − max_{c≠y} p(c) < 0.2, else 0.
    Margin,
}

/// One sample, one forward/backward, its releases.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    /// Phase name (`shared`, `experts`, `all`).
    pub name: String,
    /// Clip groups (every parameter trained in this phase is in exactly one).
    pub groups: Vec<ClipGroup>,
    /// `Some(C)`: one clip factor per record over all groups together (global clipping).
    pub global_clip: Option<f64>,
    /// Releases (every group is in exactly one).
    pub releases: Vec<ReleaseSpec>,
    /// Owner masks (expert gradients from owned records only), per sparse layer.
    pub owner_layers: Vec<usize>,
    /// Residual weighting of the weighted groups.
    pub residual: Residual,
    /// LoRA modules switched off for the residual's shared-only logits.
    pub residual_disable: Vec<String>,
    /// False: a non-private phase (mean gradient ÷ the public denominator, no clip, no noise).
    pub private: bool,
}

impl Phase {
    /// Every parameter whose gradient the phase computes (released or norm-only).
    pub fn params(&self) -> Vec<String> {
        let mut v: Vec<String> = self.groups.iter().flat_map(|g| g.params.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// The group named `name`.
    pub fn group(&self, name: &str) -> Option<&ClipGroup> {
        self.groups.iter().find(|g| g.name == name)
    }

    /// L2 sensitivity of a release's sums: C under global clipping, else sqrt(Σ bound²) over
    /// its groups.
    pub fn sensitivity(&self, release: &ReleaseSpec) -> f64 {
        match self.global_clip {
            Some(c) => c,
            None => release
                .groups
                .iter()
                .filter_map(|g| self.group(g))
                .map(|g| g.bound * g.bound)
                .sum::<f64>()
                .sqrt(),
        }
    }
}

/// Which optimizer updates a parameter (post-processing of its release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Optim {
    /// AdamW.
    AdamW,
    /// Plain SGD.
    Sgd,
    /// Muon (2-D hidden matrices).
    Muon,
    /// Muon with DP-MuonBC's bias correction.
    MuonBc,
}

/// The whole schedule, fixed before training.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The phases.
    pub phases: Vec<Phase>,
    /// The cyclic pattern of phase indices (e.g. `[0, 1]`: shared then experts).
    pub pattern: Vec<usize>,
    /// Total updates (phase executions).
    pub updates: u64,
    /// Sampling rate q = B/N of every phase.
    pub q: f64,
    /// Expected batch B = qN.
    pub expected_batch: f64,
    /// Optimizer of each trainable parameter.
    pub optim: Vec<(String, Optim)>,
    /// Trainable parameters of routed experts: the only ones that may get no per-sample
    /// gradient from a non-empty micro-batch (no token routed to the expert). Any other
    /// trainable parameter of a phase that a non-empty micro-batch leaves without gradient is
    /// an error, not a noise-only release: its forward pass does not use it.
    pub routed: Vec<String>,
}

impl Plan {
    /// The phase run at update `t` (0-based).
    pub fn phase_at(&self, t: u64) -> usize {
        self.pattern[(t % self.pattern.len() as u64) as usize]
    }

    /// How many times each phase runs in `updates` updates.
    pub fn phase_counts(&self) -> Vec<u64> {
        let mut c = vec![0u64; self.phases.len()];
        let per = self.pattern.len() as u64;
        let (full, rest) = (self.updates / per, self.updates % per);
        for (i, &p) in self.pattern.iter().enumerate() {
            c[p] += full + u64::from((i as u64) < rest);
        }
        c
    }

    /// Every trainable parameter.
    pub fn params(&self) -> Vec<String> {
        let mut v: Vec<String> = self.phases.iter().flat_map(Phase::params).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Checks the plan's invariants: every group in exactly one release, parallel members
    /// numbered 0..n, σ > 0 in private phases, positive denominators and bounds.
    pub fn check(&self) -> Result<(), String> {
        if self.pattern.is_empty() || self.pattern.iter().any(|&p| p >= self.phases.len()) {
            return Err("the phase pattern is empty or names a missing phase".into());
        }
        for ph in &self.phases {
            for g in &ph.groups {
                let n = ph
                    .releases
                    .iter()
                    .filter(|r| r.groups.contains(&g.name))
                    .count();
                if n != usize::from(g.release) {
                    return Err(format!(
                        "group {} is in {n} releases of phase {}",
                        g.name, ph.name
                    ));
                }
                if g.bound.is_nan() || g.bound <= 0.0 {
                    return Err(format!("group {} has bound {}", g.name, g.bound));
                }
            }
            for r in &ph.releases {
                if !(r.denominator.is_finite() && r.denominator > 0.0) {
                    return Err(format!(
                        "release {} has denominator {}",
                        r.name, r.denominator
                    ));
                }
                if ph.private && !(r.sigma.is_finite() && r.sigma >= 0.0) {
                    return Err(format!("release {} has sigma {}", r.name, r.sigma));
                }
            }
        }
        Ok(())
    }
}
