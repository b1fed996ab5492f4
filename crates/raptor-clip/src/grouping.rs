//! Grouped clipping by parameter name: which group each parameter belongs to
//! ([`ParamGroups`]) and how the groups are bounded ([`ClipPolicy`]), with groups identified
//! by a key type of the caller's choosing ([`GroupKey`]: an enum of the caller's roles, a
//! number, or a `String` for ad-hoc use).
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
//! use std::fmt;
//! use raptor_clip::{ClipPolicy, ParamGroups};
//!
//! // The caller's own group key: anything `Ord + Clone + Debug + Display`.
//! #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
//! enum Stream {
//!     Shared,
//!     Expert(usize),
//! }
//! impl fmt::Display for Stream {
//!     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
//!         match self {
//!             Stream::Shared => f.write_str("shared"),
//!             Stream::Expert(e) => write!(f, "expert{e}"),
//!         }
//!     }
//! }
//!
//! let mut groups = ParamGroups::new();
//! groups.assign("attn.lora_a", Stream::Shared);
//! groups.assign("moe.expert0.lora_a", Stream::Expert(0));
//! let policy = ClipPolicy::RoleWise([(Stream::Shared, 1.0), (Stream::Expert(0), 0.5)].into());
//! policy.check(&groups).unwrap();
//! assert_eq!(groups.group_of("moe.expert0.lora_a"), Some(&Stream::Expert(0)));
//! assert_eq!(policy.sensitivity(&[Stream::Expert(0)]).unwrap(), 0.5);
//! let both = policy.sensitivity(&[Stream::Shared, Stream::Expert(0)]).unwrap();
//! assert!((both - 1.25f64.sqrt()).abs() < 1e-15);
//! let global = ClipPolicy::<Stream>::Global(2.0);
//! assert_eq!(global.sensitivity(&[Stream::Shared, Stream::Expert(0)]).unwrap(), 2.0);
//! ```

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::ClipError;
use crate::slice::{Grouping, check_bound};

/// What identifies a clip group: any ordered, cloneable type that can be shown in messages
/// (every such type is one; e.g. an enum of roles, `(usize, usize)` for experts, or `String`).
/// `Display` only names a group in error messages; groups are told apart by `Ord`.
pub trait GroupKey: Ord + Clone + fmt::Debug + fmt::Display {}

impl<K: Ord + Clone + fmt::Debug + fmt::Display> GroupKey for K {}

/// Assignment of parameters (by name) to groups keyed by `K` (e.g. the shared stream, an
/// expert, a matrix).
#[derive(Debug, Clone, PartialEq)]
pub struct ParamGroups<K: GroupKey> {
    map: BTreeMap<String, K>,
    /// The same assignment by group (kept in step with `map`): a release's membership checks
    /// cost its own parameters, not every parameter of the model.
    members: BTreeMap<K, BTreeSet<String>>,
}

impl<K: GroupKey> Default for ParamGroups<K> {
    fn default() -> Self {
        Self {
            map: BTreeMap::new(),
            members: BTreeMap::new(),
        }
    }
}

impl<K: GroupKey> ParamGroups<K> {
    /// Empty assignment.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `param` in `group` (a parameter is in one group: a second call moves it).
    pub fn assign(&mut self, param: impl Into<String>, group: K) {
        let param = param.into();
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
        F: Fn(&str) -> Option<K>,
    {
        let mut g = Self::new();
        for p in params {
            let p: String = p.into();
            if let Some(group) = f(&p) {
                g.assign(p, group);
            }
        }
        g
    }

    /// The group of `param`.
    pub fn group_of(&self, param: &str) -> Option<&K> {
        self.map.get(param)
    }

    /// All (param, group) pairs, by parameter name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &K)> {
        self.map.iter().map(|(a, b)| (a.as_str(), b))
    }

    /// The distinct groups, sorted.
    pub fn groups(&self) -> impl Iterator<Item = &K> {
        self.members.keys()
    }

    /// Whether some parameter belongs to `group`.
    pub fn has_group<Q>(&self, group: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.members.contains_key(group)
    }

    /// The parameters of `group`, sorted.
    pub fn params_of<'a, Q>(&'a self, group: &Q) -> impl Iterator<Item = &'a str> + 'a
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.members
            .get(group)
            .into_iter()
            .flat_map(|m| m.iter().map(String::as_str))
    }

    /// The block-index form of this assignment under `policy` for blocks named `block_names`
    /// (the kernels' [`Grouping`]) and the key of each of its groups: groups in the keys'
    /// order, group `g` holding the indices of its blocks and keyed by `keys[g]`. Every block
    /// must belong to a group, and the policy must pass [`ClipPolicy::check`]; groups none of
    /// the blocks belong to are left out.
    pub fn grouping(
        &self,
        policy: &ClipPolicy<K>,
        block_names: &[&str],
    ) -> Result<(Grouping, Vec<K>), ClipError> {
        policy.check(self)?;
        let mut members: BTreeMap<&K, Vec<usize>> = BTreeMap::new();
        for (i, name) in block_names.iter().enumerate() {
            let g = self
                .group_of(name)
                .ok_or_else(|| ClipError::InvalidGrouping {
                    reason: format!("block {i} ({name}) is in no group"),
                })?;
            members.entry(g).or_default().push(i);
        }
        let keys: Vec<K> = members.keys().map(|&k| k.clone()).collect();
        let groups: Vec<Vec<usize>> = members.into_values().collect();
        let grouping = match policy {
            ClipPolicy::Global(c) => Grouping::GlobalOverGroups { groups, bound: *c },
            ClipPolicy::RoleWise(bounds) => {
                let bounds = keys
                    .iter()
                    .map(|k| policy_bound(bounds, k))
                    .collect::<Result<Vec<f64>, ClipError>>()?;
                Grouping::Grouped { groups, bounds }
            }
        };
        Ok((grouping, keys))
    }
}

/// How per-record gradients are clipped, by group: each group its own bound, or one global
/// bound (see [`ParamGroups`] for how a policy applies to named parameters).
#[derive(Debug, Clone, PartialEq)]
pub enum ClipPolicy<K: GroupKey> {
    /// Each group has its own bound (RAPTOR: the shared stream and each expert stream;
    /// DP-Muon: each matrix).
    RoleWise(BTreeMap<K, f64>),
    /// One bound over the concatenation of all groups (monolithic DP-SGD).
    Global(f64),
}

fn policy_bound<K, Q>(bounds: &BTreeMap<K, f64>, group: &Q) -> Result<f64, ClipError>
where
    K: GroupKey + Borrow<Q>,
    Q: Ord + fmt::Display + ?Sized,
{
    bounds
        .get(group)
        .copied()
        .ok_or_else(|| ClipError::InvalidGrouping {
            reason: format!("no clipping bound for group {group}"),
        })
}

impl<K: GroupKey> ClipPolicy<K> {
    /// Checks the policy whole against `groups`: every bound it holds is finite and > 0, and
    /// (role-wise) every group of `groups` has a bound. Call it before any norm is taken:
    /// whether a batch reaches a group (a routed expert no record chose) depends on private
    /// data, so an error must not wait until a record reaches the group.
    pub fn check(&self, groups: &ParamGroups<K>) -> Result<(), ClipError> {
        match self {
            ClipPolicy::RoleWise(bounds) => {
                for (g, &c) in bounds {
                    check_bound(&g.to_string(), c)?;
                }
                for g in groups.groups() {
                    policy_bound(bounds, g)?;
                }
                Ok(())
            }
            ClipPolicy::Global(c) => check_bound("bound", *c),
        }
    }

    /// The bound of `group` alone: its own (role-wise) or the global one.
    pub fn bound<Q>(&self, group: &Q) -> Result<f64, ClipError>
    where
        K: Borrow<Q>,
        Q: Ord + fmt::Display + ?Sized,
    {
        match self {
            ClipPolicy::RoleWise(bounds) => {
                let c = policy_bound(bounds, group)?;
                check_bound(&group.to_string(), c)?;
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
    pub fn sensitivity<'a, Q>(
        &self,
        groups: impl IntoIterator<Item = &'a Q>,
    ) -> Result<f64, ClipError>
    where
        K: Borrow<Q>,
        Q: Ord + fmt::Display + ?Sized + 'a,
    {
        let groups: BTreeSet<&Q> = groups.into_iter().collect();
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
                // Summed in the order of the groups' names, so that Δ's rounding does not
                // depend on how the key type orders the groups.
                let mut bounds = Vec::with_capacity(groups.len());
                for g in groups {
                    bounds.push((g.to_string(), self.bound(g)?));
                }
                bounds.sort_by(|a, b| a.0.cmp(&b.0));
                let mut sq = 0.0f64;
                for (_, c) in &bounds {
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

    fn groups() -> ParamGroups<&'static str> {
        let mut g = ParamGroups::new();
        g.assign("a", "shared");
        g.assign("b", "shared");
        g.assign("c", "e0");
        g
    }

    #[test]
    fn check_names_the_group_without_a_bound_and_each_bad_bound() {
        let g = groups();
        let missing = ClipPolicy::RoleWise([("shared", 1.0)].into());
        assert_eq!(
            missing.check(&g).unwrap_err().to_string(),
            "invalid grouping: no clipping bound for group e0"
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let p = ClipPolicy::RoleWise([("shared", 1.0), ("e0", bad)].into());
            assert!(
                matches!(p.check(&g), Err(ClipError::InvalidBound { ref name, .. }) if name == "e0"),
                "{bad}"
            );
            assert!(ClipPolicy::Global(bad).check(&g).is_err(), "{bad}");
            assert!(ClipPolicy::<&str>::Global(bad).sensitivity(["e0"]).is_err());
        }
        // A bound for a group no parameter belongs to is checked too.
        let extra = ClipPolicy::RoleWise([("shared", 1.0), ("e0", 1.0), ("x", -2.0)].into());
        assert!(extra.check(&g).is_err());
    }

    #[test]
    fn sensitivity_is_never_a_silent_zero() {
        let p = ClipPolicy::RoleWise([("shared", 3.0), ("e0", 4.0)].into());
        assert_eq!(p.sensitivity(["shared", "e0"]).unwrap(), 5.0);
        assert_eq!(p.sensitivity(["e0", "e0"]).unwrap(), 4.0);
        assert!(p.sensitivity(["shared", "absent"]).is_err());
        assert!(p.sensitivity(std::iter::empty::<&str>()).is_err());
        assert!(
            ClipPolicy::<&str>::Global(1.0)
                .sensitivity(std::iter::empty::<&str>())
                .is_err()
        );
    }

    /// Keys of the caller's own type: Δ is the same whatever order the key type gives the
    /// groups (summed in the order of their names), and messages name groups by `Display`.
    #[test]
    fn typed_keys_give_the_sensitivity_of_their_names() {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        enum Role {
            Shared,
            Expert(u8),
        }
        impl fmt::Display for Role {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    Role::Shared => f.write_str("shared"),
                    Role::Expert(e) => write!(f, "expert{e}"),
                }
            }
        }
        let bounds = [0.1, 0.7, 1.3, 2.9];
        let typed = ClipPolicy::RoleWise(
            [
                (Role::Shared, bounds[0]),
                (Role::Expert(0), bounds[1]),
                (Role::Expert(1), bounds[2]),
                (Role::Expert(2), bounds[3]),
            ]
            .into(),
        );
        let named = ClipPolicy::RoleWise(
            [
                ("shared".to_string(), bounds[0]),
                ("expert0".to_string(), bounds[1]),
                ("expert1".to_string(), bounds[2]),
                ("expert2".to_string(), bounds[3]),
            ]
            .into(),
        );
        let all = [
            Role::Shared,
            Role::Expert(0),
            Role::Expert(1),
            Role::Expert(2),
        ];
        let names: Vec<String> = all.iter().map(ToString::to_string).collect();
        assert_eq!(
            typed.sensitivity(&all).unwrap().to_bits(),
            named
                .sensitivity(names.iter().map(String::as_str))
                .unwrap()
                .to_bits()
        );
        let mut g = ParamGroups::new();
        g.assign("w", Role::Expert(3));
        assert_eq!(
            typed.check(&g).unwrap_err().to_string(),
            "invalid grouping: no clipping bound for group expert3"
        );
        assert_eq!(g.group_of("w"), Some(&Role::Expert(3)));
        assert!(g.has_group(&Role::Expert(3)) && !g.has_group(&Role::Shared));
    }

    #[test]
    fn a_parameter_assigned_again_moves_to_its_new_group() {
        let mut g = groups();
        g.assign("c", "shared");
        assert_eq!(g.group_of("c"), Some(&"shared"));
        assert!(!g.has_group("e0"));
        assert_eq!(g.params_of("shared").collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(g.params_of("e0").count(), 0);
        assert_eq!(g.groups().copied().collect::<Vec<_>>(), ["shared"]);
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
                ClipPolicy::RoleWise([("s", bounds[0]), ("e", bounds[1])].into())
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
            let (grouping, keys) = g.grouping(&policy, &names).unwrap();
            prop_assert_eq!(&keys, &["e", "s"]);
            let out = clip_blocks(&blocks, &grouping, None).unwrap();
            let gi = |name: &str| keys.iter().position(|x| *x == name).unwrap();
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
