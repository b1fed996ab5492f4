//! Grouped clipping by parameter name: which group each parameter belongs to
//! ([`ParamGroups`]) and how the groups are bounded ([`ClipPolicy`]).
//!
//! This is the one definition of grouped clipping in the workspace. The per-sample engine of
//! the model adapters clips named parameters with it; the slice and tensor kernels of this
//! crate take the block-index form [`Grouping`], which [`ParamGroups::grouping`] builds from
//! it for a list of block names; the privatizer's tensor path takes the sensitivity of a
//! release from it ([`ClipPolicy::sensitivity`]), so the noise is calibrated to the bounds the
//! records were clipped to, not to a number restated elsewhere.
//!
//! Two policies cover every method:
//!
//! - [`ClipPolicy::RoleWise`]: each group has its own bound C_g (RAPTOR's shared stream and each
//!   expert stream; DP-Muon's per-matrix bounds, one group per matrix). Releasing the sums of a
//!   set S of groups together has L2 sensitivity √(Σ_{g∈S} C_g²): one record moves each group's
//!   sum by at most C_g, in orthogonal coordinates.
//! - [`ClipPolicy::Global`]: one factor from the norm over every group, bound C (the monolithic
//!   baselines); any release of any subset of the groups has sensitivity C.
//!
//! ```
//! use raptor_clip::{ClipPolicy, ParamGroups};
//! let mut groups = ParamGroups::new();
//! groups.assign("attn.lora_a", "shared");
//! groups.assign("moe.expert0.lora_a", "expert0");
//! let policy = ClipPolicy::RoleWise([("shared".into(), 1.0), ("expert0".into(), 0.5)].into());
//! policy.check(&groups).unwrap();
//! assert_eq!(policy.sensitivity(["expert0"]).unwrap(), 0.5);
//! assert!((policy.sensitivity(["shared", "expert0"]).unwrap() - 1.25f64.sqrt()).abs() < 1e-15);
//! assert_eq!(ClipPolicy::Global(2.0).sensitivity(["shared", "expert0"]).unwrap(), 2.0);
//! ```

use std::collections::{BTreeMap, BTreeSet};

use crate::ClipError;
use crate::slice::{Group, Grouping, check_bound};

/// Assignment of parameters to caller-named groups (e.g. `shared`, `expert[3,5]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamGroups {
    map: BTreeMap<String, String>,
    /// The same assignment by group (kept in step with `map`): a release's membership checks
    /// cost its own parameters, not every parameter of the model.
    members: BTreeMap<String, BTreeSet<String>>,
}

impl ParamGroups {
    /// Empty assignment.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `param` in `group` (a parameter is in one group: a second call moves it).
    pub fn assign(&mut self, param: impl Into<String>, group: impl Into<String>) {
        let (param, group) = (param.into(), group.into());
        if let Some(old) = self.map.insert(param.clone(), group.clone())
            && let Some(m) = self.members.get_mut(&old)
        {
            m.remove(&param);
            if m.is_empty() {
                self.members.remove(&old);
            }
        }
        self.members.entry(group).or_default().insert(param);
    }

    /// Groups every name in `params` by `f` (names for which `f` is None stay unassigned).
    pub fn from_fn<I, S, F>(params: I, f: F) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
        F: Fn(&str) -> Option<String>,
    {
        let mut g = Self::new();
        for p in params {
            let p: String = p.into();
            if let Some(name) = f(&p) {
                g.assign(p, name);
            }
        }
        g
    }

    /// The group of `param`.
    pub fn group_of(&self, param: &str) -> Option<&str> {
        self.map.get(param).map(String::as_str)
    }

    /// All (param, group) pairs, by parameter name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(a, b)| (a.as_str(), b.as_str()))
    }

    /// The distinct group names, sorted.
    pub fn group_names(&self) -> BTreeSet<&str> {
        self.members.keys().map(String::as_str).collect()
    }

    /// Whether some parameter belongs to `group`.
    pub fn has_group(&self, group: &str) -> bool {
        self.members.contains_key(group)
    }

    /// The parameters of `group`, sorted.
    pub fn params_of<'a>(&'a self, group: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.members
            .get(group)
            .into_iter()
            .flat_map(|m| m.iter().map(String::as_str))
    }

    /// The block-index form of this assignment under `policy` for blocks named `block_names`
    /// (the kernels' [`Grouping`]): groups in sorted order, each holding the indices of its
    /// blocks. Every block must belong to a group, and the policy must pass
    /// [`ClipPolicy::check`]; groups none of the blocks belong to are left out.
    pub fn grouping(
        &self,
        policy: &ClipPolicy,
        block_names: &[&str],
    ) -> Result<Grouping, ClipError> {
        policy.check(self)?;
        let mut members: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, name) in block_names.iter().enumerate() {
            let g = self
                .group_of(name)
                .ok_or_else(|| ClipError::InvalidGrouping {
                    reason: format!("block {i} ({name}) is in no group"),
                })?;
            members.entry(g).or_default().push(i);
        }
        let groups: Vec<Group> = members
            .iter()
            .map(|(g, blocks)| Group::new(*g, blocks.clone()))
            .collect();
        Ok(match policy {
            ClipPolicy::Global(c) => Grouping::GlobalOverGroups { groups, bound: *c },
            ClipPolicy::RoleWise(bounds) => {
                let bounds = groups
                    .iter()
                    .map(|g| policy_bound(bounds, &g.name))
                    .collect::<Result<Vec<f64>, ClipError>>()?;
                Grouping::Grouped { groups, bounds }
            }
        })
    }
}

/// How per-record gradients are clipped, by group: each group its own bound, or one global
/// bound (see [`ParamGroups`] for how a policy applies to named parameters).
#[derive(Debug, Clone, PartialEq)]
pub enum ClipPolicy {
    /// Each group has its own bound (RAPTOR: `shared` and each expert stream; DP-Muon: each
    /// matrix).
    RoleWise(BTreeMap<String, f64>),
    /// One bound over the concatenation of all groups (monolithic DP-SGD).
    Global(f64),
}

fn policy_bound(bounds: &BTreeMap<String, f64>, group: &str) -> Result<f64, ClipError> {
    bounds
        .get(group)
        .copied()
        .ok_or_else(|| ClipError::InvalidGrouping {
            reason: format!("no clipping bound for group {group}"),
        })
}

impl ClipPolicy {
    /// Checks the policy whole against `groups`: every bound it holds is finite and > 0, and
    /// (role-wise) every group of `groups` has a bound. Call it before any norm is taken:
    /// whether a batch reaches a group (a routed expert no record chose) depends on private
    /// data, so an error must not wait until a record reaches the group.
    pub fn check(&self, groups: &ParamGroups) -> Result<(), ClipError> {
        match self {
            ClipPolicy::RoleWise(bounds) => {
                for (g, &c) in bounds {
                    check_bound(g, c)?;
                }
                for g in groups.group_names() {
                    policy_bound(bounds, g)?;
                }
                Ok(())
            }
            ClipPolicy::Global(c) => check_bound("bound", *c),
        }
    }

    /// The bound of `group` alone: its own (role-wise) or the global one.
    pub fn bound(&self, group: &str) -> Result<f64, ClipError> {
        match self {
            ClipPolicy::RoleWise(bounds) => {
                let c = policy_bound(bounds, group)?;
                check_bound(group, c)?;
                Ok(c)
            }
            ClipPolicy::Global(c) => {
                check_bound("bound", *c)?;
                Ok(*c)
            }
        }
    }

    /// The L2 sensitivity of releasing the clipped sums of `groups` together: √(Σ C_g²)
    /// role-wise, C under a global bound. A group named twice counts once; an empty list, or a
    /// group without a bound, is an error (never a silent 0).
    pub fn sensitivity<'a>(
        &self,
        groups: impl IntoIterator<Item = &'a str>,
    ) -> Result<f64, ClipError> {
        let groups: BTreeSet<&str> = groups.into_iter().collect();
        if groups.is_empty() {
            return Err(ClipError::InvalidGrouping {
                reason: "a release of no group has no sensitivity".into(),
            });
        }
        match self {
            ClipPolicy::Global(c) => {
                check_bound("bound", *c)?;
                Ok(*c)
            }
            ClipPolicy::RoleWise(_) => {
                let mut sq = 0.0f64;
                for g in groups {
                    let c = self.bound(g)?;
                    sq += c * c;
                }
                Ok(sq.sqrt())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Block, clip_blocks};
    use proptest::prelude::*;

    fn groups() -> ParamGroups {
        let mut g = ParamGroups::new();
        g.assign("a", "shared");
        g.assign("b", "shared");
        g.assign("c", "e0");
        g
    }

    #[test]
    fn check_names_the_group_without_a_bound_and_each_bad_bound() {
        let g = groups();
        let missing = ClipPolicy::RoleWise([("shared".into(), 1.0)].into());
        assert_eq!(
            missing.check(&g).unwrap_err().to_string(),
            "invalid grouping: no clipping bound for group e0"
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let p = ClipPolicy::RoleWise([("shared".into(), 1.0), ("e0".into(), bad)].into());
            assert!(
                matches!(p.check(&g), Err(ClipError::InvalidBound { ref name, .. }) if name == "e0"),
                "{bad}"
            );
            assert!(ClipPolicy::Global(bad).check(&g).is_err(), "{bad}");
            assert!(ClipPolicy::Global(bad).sensitivity(["e0"]).is_err());
        }
        // A bound for a group no parameter belongs to is checked too.
        let extra = ClipPolicy::RoleWise(
            [
                ("shared".into(), 1.0),
                ("e0".into(), 1.0),
                ("x".into(), -2.0),
            ]
            .into(),
        );
        assert!(extra.check(&g).is_err());
    }

    #[test]
    fn sensitivity_is_never_a_silent_zero() {
        let p = ClipPolicy::RoleWise([("shared".into(), 3.0), ("e0".into(), 4.0)].into());
        assert_eq!(p.sensitivity(["shared", "e0"]).unwrap(), 5.0);
        assert_eq!(p.sensitivity(["e0", "e0"]).unwrap(), 4.0);
        assert!(p.sensitivity(["shared", "absent"]).is_err());
        assert!(p.sensitivity(std::iter::empty()).is_err());
        assert!(
            ClipPolicy::Global(1.0)
                .sensitivity(std::iter::empty())
                .is_err()
        );
    }

    #[test]
    fn a_parameter_assigned_again_moves_to_its_new_group() {
        let mut g = groups();
        g.assign("c", "shared");
        assert_eq!(g.group_of("c"), Some("shared"));
        assert!(!g.has_group("e0"));
        assert_eq!(g.params_of("shared").collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(g.params_of("e0").count(), 0);
        assert_eq!(g.group_names().into_iter().collect::<Vec<_>>(), ["shared"]);
        let mut direct = ParamGroups::new();
        for p in ["a", "b", "c"] {
            direct.assign(p, "shared");
        }
        assert_eq!(g, direct);
    }

    #[test]
    fn the_block_form_names_unassigned_blocks() {
        let p = ClipPolicy::Global(1.0);
        let e = groups().grouping(&p, &["a", "zz"]).unwrap_err();
        assert!(e.to_string().contains("block 1 (zz) is in no group"), "{e}");
    }

    proptest! {
        /// The block form clips exactly as the name form says: each record's factor in a group
        /// is min(1, C_g/‖g‖) over that group's blocks (role-wise) or one factor from the norm
        /// over all blocks (global), and the output's sensitivity is the policy's.
        #[test]
        fn the_block_form_clips_as_the_policy_says(
            rows in prop::collection::vec(prop::collection::vec(-3.0f32..3.0, 3), 1..5),
            bounds in prop::collection::vec(0.1f64..4.0, 2),
            global in any::<bool>(),
        ) {
            let mut g = ParamGroups::new();
            g.assign("p0", "s");
            g.assign("p1", "s");
            g.assign("p2", "e");
            let policy = if global {
                ClipPolicy::Global(bounds[0])
            } else {
                ClipPolicy::RoleWise([("s".into(), bounds[0]), ("e".into(), bounds[1])].into())
            };
            // Blocks in an order that is not the groups' order.
            let names = ["p2", "p0", "p1"];
            // Block "p{j}" holds column j of `rows`.
            let cols: Vec<Vec<f32>> = [2, 0, 1]
                .iter()
                .map(|&j| rows.iter().map(|r| r[j]).collect())
                .collect();
            let blocks: Vec<Block<'_>> =
                names.iter().zip(&cols).map(|(n, c)| Block::new(n, c, 1)).collect();
            let grouping = g.grouping(&policy, &names).unwrap();
            let out = clip_blocks(&blocks, &grouping, None).unwrap();
            let gi = |name: &str| out.group_names().iter().position(|x| x == name).unwrap();
            for (i, r) in rows.iter().enumerate() {
                let sq = |idx: &[usize]| idx.iter().map(|&j| f64::from(r[j]).powi(2)).sum::<f64>();
                // column j of `rows` is parameter p{j}; p0, p1 in s; p2 in e.
                let (ns, ne) = (sq(&[0, 1]).sqrt(), sq(&[2]).sqrt());
                let f = |n: f64, c: f64| if n > c { c / n } else { 1.0 };
                let (fs, fe) = if global {
                    let t = (ns * ns + ne * ne).sqrt();
                    (f(t, bounds[0]), f(t, bounds[0]))
                } else {
                    (f(ns, bounds[0]), f(ne, bounds[1]))
                };
                prop_assert!((out.factor(i, gi("s")).unwrap() - fs).abs() < 1e-6);
                prop_assert!((out.factor(i, gi("e")).unwrap() - fe).abs() < 1e-6);
            }
            let want = policy.sensitivity(["s", "e"]).unwrap();
            prop_assert!((out.sensitivity() - want).abs() < 1e-12);
        }
    }
}
