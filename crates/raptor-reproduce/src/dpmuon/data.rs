//! The corpora of the DP-Muon experiment: for each target task a private training set, a scored
//! test set and a public corpus from the *other* task (same record-to-text format, another
//! domain), split by source into pretraining, a public proxy of the private run (for choosing
//! learning rates) and the proxy's validation part.
//!
//! DART v1.1.1 contains E2E: its entries whose every triple has an E2E attribute as relation
//! (`name`, `eatType`, `food`, `priceRange`, `customer rating`, `area`, `familyFriendly`,
//! `near`) are E2E's own dev and test references (4,290 of DART dev's 6,980 references, 4,690 of
//! its test's 12,552, each identical to an E2E-cleaned reference). They are dropped everywhere
//! here: from the public corpus of the E2E experiment (it would hold the private and test
//! references) and from the private and test sets of the DART experiment (its public corpus is
//! E2E). Any public pair whose reference text equals a private or test reference is dropped too;
//! the count is reported (0 on the shared data).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sha2::{Digest, Sha256};

use crate::paper::{D2tTask, read_d2t, runs::file_hash, write_e2e_csv};

/// The relations of E2E's meaning representations.
const E2E_ATTRIBUTES: [&str; 8] = [
    "name",
    "eatType",
    "food",
    "priceRange",
    "customer rating",
    "area",
    "familyFriendly",
    "near",
];

/// Whether a linearized DART source (`s : p : o | …`, `raptor_data::linearize`) is an E2E
/// meaning representation: every triple's relation is an E2E attribute.
pub fn is_e2e_derived(source: &str) -> bool {
    source.split(" | ").all(|t| {
        let mut parts = t.splitn(3, " : ");
        let (_, p) = (parts.next(), parts.next());
        p.is_some_and(|p| E2E_ATTRIBUTES.contains(&p.trim()))
    })
}

/// Sizes of the derived files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Test sources scored (an evenly strided subset; 0: all).
    pub test_sources: usize,
    /// Private training pairs (an evenly strided subset of sources; 0: all).
    pub max_private: usize,
    /// Sources of the public proxy's validation part.
    pub proxy_val_sources: usize,
}

/// The derived files of one target task (E2E-style CSVs in the cache).
#[derive(Debug, Clone)]
pub struct Corpora {
    /// The target task (`e2e`, `dart`).
    pub task: String,
    /// Public pretraining pairs.
    pub pretrain: PathBuf,
    /// Public proxy of the private training set (as many pairs as the private set).
    pub proxy_train: PathBuf,
    /// Public proxy validation (scored by the learning-rate choice).
    pub proxy_val: PathBuf,
    /// Private training pairs.
    pub train: PathBuf,
    /// Scored test pairs.
    pub test: PathBuf,
    /// Lines of the pretraining pairs (for the tokenizer).
    pub pretrain_lines: Vec<String>,
    /// SHA-256 of the pretraining file (cache keys).
    pub pretrain_hash: String,
    /// Private training pairs N.
    pub private_pairs: usize,
    /// Public proxy training pairs (= N when the public corpus is large enough).
    pub proxy_pairs: usize,
    /// A sentence saying what went where.
    pub note: String,
}

type Pairs = Vec<(String, String)>;

fn groups(pairs: &Pairs) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for (s, t) in pairs {
        let i = *index.entry(s.clone()).or_insert_with(|| {
            out.push((s.clone(), Vec::new()));
            out.len() - 1
        });
        if let Some(g) = out.get_mut(i) {
            g.1.push(t.clone());
        }
    }
    out
}

fn flatten(gs: &[(String, Vec<String>)]) -> Pairs {
    gs.iter()
        .flat_map(|(s, ts)| ts.iter().map(move |t| (s.clone(), t.clone())))
        .collect()
}

/// Every `n`-th group so that `take` of them remain, in order (all when `take` is 0 or larger).
fn strided<T: Clone>(v: &[T], take: usize) -> Vec<T> {
    if take == 0 || take >= v.len() {
        return v.to_vec();
    }
    (0..take)
        .filter_map(|i| v.get(i * v.len() / take).cloned())
        .collect()
}

fn read_pairs(task: &D2tTask, test: bool, drop_e2e: bool) -> anyhow::Result<Pairs> {
    let path = if test { &task.test } else { &task.dev };
    let ds = read_d2t(&task.format, path)?;
    Ok(ds
        .records
        .into_iter()
        .filter(|r| !(drop_e2e && is_e2e_derived(&r.source)))
        .map(|r| (r.source, r.target))
        .collect())
}

/// Builds (or reuses) the files of the experiment whose private task is `target` and whose
/// public corpus is `other` (both dev and test files of it).
pub fn build(
    target: &D2tTask,
    other: &D2tTask,
    sizes: Sizes,
    cache: &Path,
) -> anyhow::Result<Corpora> {
    let drop_target = target.format == "dart";
    let drop_other = other.format == "dart";
    let key_src = format!(
        "v1|{}|{}|{}|{}|{sizes:?}",
        file_hash(&target.dev)?,
        file_hash(&target.test)?,
        file_hash(&other.dev)?,
        file_hash(&other.test)?,
    );
    let key: String = Sha256::digest(key_src.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = cache
        .join("reproduce")
        .join("dpmuon")
        .join(format!("{}-{key}", target.name));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;

    let private_groups = strided(&groups(&read_pairs(target, false, drop_target)?), 0);
    let mut private = flatten(&private_groups);
    if sizes.max_private > 0 && private.len() > sizes.max_private {
        let gs = strided(
            &private_groups,
            private_groups.len() * sizes.max_private / private.len(),
        );
        private = flatten(&gs);
    }
    let test = flatten(&strided(
        &groups(&read_pairs(target, true, drop_target)?),
        sizes.test_sources,
    ));
    let mut public = read_pairs(other, false, drop_other)?;
    public.extend(read_pairs(other, true, drop_other)?);
    let seen: HashSet<&str> = private.iter().chain(&test).map(|(_, t)| t.trim()).collect();
    let before = public.len();
    public.retain(|(_, t)| !seen.contains(t.trim()));
    let overlap = before - public.len();
    // Public sources in a fixed order that does not depend on the files' order.
    let mut pg = groups(&public);
    pg.sort_by_cached_key(|(s, _)| Sha256::digest(s.as_bytes()).to_vec());
    let n = private.len();
    let mut it = pg.into_iter();
    let mut proxy_train: Pairs = Vec::new();
    let mut proxy_sources = 0;
    // At most half of the public corpus goes to the proxy, so pretraining keeps the rest.
    let cap = public.len() / 2;
    while proxy_train.len() < n.min(cap) {
        let Some((s, ts)) = it.next() else { break };
        proxy_sources += 1;
        proxy_train.extend(ts.into_iter().map(|t| (s.clone(), t)));
    }
    proxy_train.truncate(n.min(cap));
    let val: Vec<(String, Vec<String>)> = it.by_ref().take(sizes.proxy_val_sources).collect();
    let proxy_val = flatten(&val);
    let rest: Vec<(String, Vec<String>)> = it.collect();
    let pretrain = flatten(&rest);
    anyhow::ensure!(
        !pretrain.is_empty() && !proxy_train.is_empty() && !proxy_val.is_empty(),
        "{}: the public corpus ({} pairs) is too small for pretraining, proxy and proxy validation",
        target.name,
        public.len()
    );
    let files = [
        ("pretrain", &pretrain),
        ("proxy-train", &proxy_train),
        ("proxy-val", &proxy_val),
        ("train", &private),
        ("test", &test),
    ];
    let mut paths = Vec::new();
    for (name, pairs) in files {
        let p = dir.join(format!("{name}.csv"));
        if !p.exists() {
            write_e2e_csv(&p, pairs)?;
        }
        paths.push(p);
    }
    let [pretrain_p, proxy_train_p, proxy_val_p, train_p, test_p]: [PathBuf; 5] = paths
        .try_into()
        .map_err(|_| anyhow::anyhow!("five derived files expected"))?;
    let note = format!(
        "{t}: private fine-tuning on {np} {t} dev pairs ({ns} sources{drop}), scored on {tp} {t} test references ({ts} sources); public corpus: {other} dev + test{odrop} ({pub_n} pairs after dropping {overlap} whose reference equals a private or test one): {pre} pairs pretrain the tokenizer and the model, {px} pairs ({proxy_sources} sources) are the public proxy of the private run, {pv} pairs ({vs} sources) its validation.",
        t = target.name,
        np = private.len(),
        ns = groups(&private).len(),
        drop = if drop_target {
            ", DART's E2E-derived entries dropped"
        } else {
            ""
        },
        tp = test.len(),
        ts = groups(&test).len(),
        other = other.name,
        odrop = if drop_other {
            " without its E2E-derived entries"
        } else {
            ""
        },
        pub_n = public.len(),
        pre = pretrain.len(),
        px = proxy_train.len(),
        pv = proxy_val.len(),
        vs = val.len(),
    );
    Ok(Corpora {
        task: target.name.clone(),
        pretrain_hash: file_hash(&pretrain_p)?,
        pretrain: pretrain_p,
        proxy_train: proxy_train_p,
        proxy_val: proxy_val_p,
        train: train_p,
        test: test_p,
        pretrain_lines: pretrain.iter().map(|(a, b)| format!("{a} {b}")).collect(),
        private_pairs: private.len(),
        proxy_pairs: proxy_train.len(),
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2e_meaning_representations_are_recognized_in_dart_form() {
        assert!(is_e2e_derived(
            "Alimentum : area : city centre | Alimentum : familyFriendly : no"
        ));
        assert!(is_e2e_derived("The Mill : customer rating : 5 out of 5"));
        assert!(!is_e2e_derived(
            "Alimentum : area : city centre | Mars Hill College : JOINED : 1973"
        ));
        assert!(!is_e2e_derived("Newberry College : NICKNAME : Wolves"));
        assert!(!is_e2e_derived("no triple here"));
    }

    #[test]
    fn strided_subsets_keep_order_and_size() {
        let v: Vec<usize> = (0..10).collect();
        assert_eq!(strided(&v, 0), v);
        assert_eq!(strided(&v, 20), v);
        assert_eq!(strided(&v, 5), vec![0, 2, 4, 6, 8]);
    }
}
