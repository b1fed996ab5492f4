//! Bag-of-words baselines: does a backbone learn more than counting words?
//!
//! A text becomes word counts ([`words`]: lower-cased runs of at least two word characters,
//! scikit-learn's `CountVectorizer` default), over the vocabulary of the training texts (a
//! word seen only at test time is ignored). Two classifiers read the counts:
//!
//! - [`NaiveBayes`]: multinomial naive Bayes with additive smoothing α (scikit-learn's
//!   `MultinomialNB`: class priors from the training labels, `P(w | c) = (n_wc + α) / (n_c +
//!   α·V)`);
//! - [`LogisticRegression`]: multinomial logistic regression with an L2 penalty on the word
//!   weights (not the intercepts), minimizing `C·Σ_i CE_i + ½‖W‖²` (scikit-learn's
//!   `LogisticRegression(C)` objective) by L-BFGS with a backtracking line search until the
//!   gradient's largest entry is below a tolerance.
//!
//! [`baselines`] scores both and the majority class on a test set.
//!
//! ```
//! use raptor_eval::bow::baselines;
//! let train = [("a great film", 1), ("great fun", 1), ("a dull film", 0), ("dull and long", 0)];
//! let test = [("great", 1), ("dull", 0)];
//! let r = baselines(&train, &test, 2)?;
//! assert_eq!((r.naive_bayes, r.logistic_regression), (1.0, 1.0));
//! assert_eq!(r.majority, 0.5);
//! # Ok::<(), raptor_eval::EvalError>(())
//! ```

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::EvalError;

/// The words of `text`: lower-cased maximal runs of Unicode word characters, those of at least
/// two characters (scikit-learn's default `token_pattern` `(?u)\b\w\w+\b` after lower-casing).
pub fn words(text: &str) -> Vec<String> {
    static RE: OnceLock<Option<regex::Regex>> = OnceLock::new();
    let lower = text.to_lowercase();
    match RE.get_or_init(|| regex::Regex::new(r"\w\w+").ok()) {
        Some(re) => re
            .find_iter(&lower)
            .map(|m| m.as_str().to_string())
            .collect(),
        None => Vec::new(),
    }
}

/// Word ids of the training texts (sorted words, so the ids do not depend on text order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocabulary {
    ids: BTreeMap<String, usize>,
}

/// One text as (word id, count) pairs, ids increasing.
pub type Counts = Vec<(usize, f64)>;

impl Vocabulary {
    /// The words of `texts`.
    pub fn fit<S: AsRef<str>>(texts: &[S]) -> Self {
        let mut all: Vec<String> = texts.iter().flat_map(|t| words(t.as_ref())).collect();
        all.sort();
        all.dedup();
        Self {
            ids: all.into_iter().enumerate().map(|(i, w)| (w, i)).collect(),
        }
    }

    /// Number of words.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there is no word.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The counts of the vocabulary's words in `text` (other words are ignored).
    pub fn counts(&self, text: &str) -> Counts {
        let mut c: BTreeMap<usize, f64> = BTreeMap::new();
        for w in words(text) {
            if let Some(&i) = self.ids.get(&w) {
                *c.entry(i).or_insert(0.0) += 1.0;
            }
        }
        c.into_iter().collect()
    }
}

fn check_labels(labels: &[usize], classes: usize, docs: usize) -> Result<(), EvalError> {
    if docs == 0 {
        return Err(EvalError::Empty {
            what: "training texts",
        });
    }
    if labels.len() != docs {
        return Err(EvalError::LengthMismatch {
            what: "texts vs labels",
            left: docs,
            right: labels.len(),
        });
    }
    if classes < 2 {
        return Err(EvalError::OutOfRange {
            what: "classes",
            value: classes as f64,
            expected: "at least 2",
        });
    }
    if let Some((i, &l)) = labels.iter().enumerate().find(|(_, l)| **l >= classes) {
        return Err(EvalError::InvalidValue {
            what: "label",
            index: i,
            value: l as f64,
        });
    }
    Ok(())
}

fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

/// Multinomial naive Bayes on word counts (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct NaiveBayes {
    /// log P(c).
    log_prior: Vec<f64>,
    /// log P(w | c), classes × words.
    log_word: Vec<Vec<f64>>,
}

impl NaiveBayes {
    /// Fits class priors and smoothed word probabilities (`alpha` > 0) on `docs` over a
    /// vocabulary of `vocab` words.
    ///
    /// # Errors
    /// No document, labels of another length or outside `classes`, fewer than two classes, or
    /// `alpha` not positive and finite.
    pub fn fit(
        docs: &[Counts],
        labels: &[usize],
        classes: usize,
        vocab: usize,
        alpha: f64,
    ) -> Result<Self, EvalError> {
        check_labels(labels, classes, docs.len())?;
        if !(alpha.is_finite() && alpha > 0.0) {
            return Err(EvalError::OutOfRange {
                what: "alpha",
                value: alpha,
                expected: "finite and > 0",
            });
        }
        let mut per = vec![0.0f64; classes];
        let mut words = vec![vec![0.0f64; vocab]; classes];
        for (d, &c) in docs.iter().zip(labels) {
            per[c] += 1.0;
            for &(w, n) in d {
                if let Some(x) = words[c].get_mut(w) {
                    *x += n;
                }
            }
        }
        let n = docs.len() as f64;
        let log_prior = per.iter().map(|&k| (k / n).ln()).collect();
        let log_word = words
            .iter()
            .map(|row| {
                let total: f64 = row.iter().sum::<f64>() + alpha * vocab as f64;
                row.iter().map(|&k| ((k + alpha) / total).ln()).collect()
            })
            .collect();
        Ok(Self {
            log_prior,
            log_word,
        })
    }

    /// Joint log-likelihood `log P(c) + Σ_w n_w log P(w | c)` per class.
    pub fn scores(&self, doc: &Counts) -> Vec<f64> {
        self.log_prior
            .iter()
            .zip(&self.log_word)
            .map(|(p, lw)| {
                p + doc
                    .iter()
                    .map(|&(w, n)| n * lw.get(w).copied().unwrap_or(0.0))
                    .sum::<f64>()
            })
            .collect()
    }

    /// The most likely class (ties: the smaller class index).
    pub fn predict(&self, doc: &Counts) -> usize {
        argmax(&self.scores(doc))
    }
}

/// Multinomial logistic regression on word counts with an L2 penalty (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct LogisticRegression {
    /// Weights, classes × words (row-major), then one intercept per class.
    params: Vec<f64>,
    classes: usize,
    vocab: usize,
    /// L-BFGS iterations taken.
    pub iterations: usize,
    /// The largest absolute entry of the objective's gradient at the solution.
    pub gradient_max: f64,
}

/// The objective `C·Σ_i CE_i + ½‖W‖²` and its gradient at `p` (weights then intercepts).
fn objective(
    p: &[f64],
    docs: &[Counts],
    labels: &[usize],
    classes: usize,
    vocab: usize,
    c: f64,
) -> (f64, Vec<f64>) {
    let mut g = vec![0.0; p.len()];
    let mut f = 0.0;
    let bias = classes * vocab;
    let mut z = vec![0.0; classes];
    for (d, &y) in docs.iter().zip(labels) {
        for (k, zk) in z.iter_mut().enumerate() {
            *zk = p[bias + k] + d.iter().map(|&(w, n)| n * p[k * vocab + w]).sum::<f64>();
        }
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        f += c * (lse - z[y]);
        for (k, &zk) in z.iter().enumerate() {
            let r = c * ((zk - lse).exp() - if k == y { 1.0 } else { 0.0 });
            g[bias + k] += r;
            for &(w, n) in d {
                g[k * vocab + w] += r * n;
            }
        }
    }
    for i in 0..bias {
        f += 0.5 * p[i] * p[i];
        g[i] += p[i];
    }
    (f, g)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

impl LogisticRegression {
    /// Fits the weights by L-BFGS (memory 10) from zero until the gradient's largest entry is
    /// below `tol` or `max_iter` iterations; `c` > 0 is the inverse penalty strength.
    ///
    /// # Errors
    /// No document, labels of another length or outside `classes`, fewer than two classes, or
    /// `c` or `tol` not positive and finite.
    pub fn fit(
        docs: &[Counts],
        labels: &[usize],
        classes: usize,
        vocab: usize,
        c: f64,
        max_iter: usize,
        tol: f64,
    ) -> Result<Self, EvalError> {
        check_labels(labels, classes, docs.len())?;
        for (what, v) in [("C", c), ("tol", tol)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(EvalError::OutOfRange {
                    what,
                    value: v,
                    expected: "finite and > 0",
                });
            }
        }
        if let Some((i, &(w, n))) = docs
            .iter()
            .flatten()
            .enumerate()
            .find(|(_, (w, n))| *w >= vocab || !n.is_finite())
        {
            return Err(EvalError::InvalidValue {
                what: "word id or count",
                index: i,
                value: if w >= vocab { w as f64 } else { n },
            });
        }
        let dim = classes * (vocab + 1);
        let f_at = |p: &[f64]| objective(p, docs, labels, classes, vocab, c);
        let mut x = vec![0.0; dim];
        let (mut fx, mut gx) = f_at(&x);
        let mut hist: Vec<(Vec<f64>, Vec<f64>, f64)> = Vec::new();
        let mut it = 0;
        while it < max_iter && max_abs(&gx) > tol {
            it += 1;
            // Two-loop recursion: d = −H·g.
            let mut q = gx.clone();
            let mut alphas = Vec::with_capacity(hist.len());
            for (s, y, rho) in hist.iter().rev() {
                let a = rho * dot(s, &q);
                for (qi, yi) in q.iter_mut().zip(y) {
                    *qi -= a * yi;
                }
                alphas.push(a);
            }
            let gamma = hist
                .last()
                .map_or(1.0 / max_abs(&gx).max(1.0), |(s, y, _)| {
                    dot(s, y) / dot(y, y)
                });
            for v in q.iter_mut() {
                *v *= gamma;
            }
            for ((s, y, rho), a) in hist.iter().zip(alphas.iter().rev()) {
                let b = rho * dot(y, &q);
                for (qi, si) in q.iter_mut().zip(s) {
                    *qi += (a - b) * si;
                }
            }
            let mut d: Vec<f64> = q.iter().map(|v| -v).collect();
            let mut slope = dot(&gx, &d);
            if slope >= 0.0 {
                // Not a descent direction: restart from the steepest descent.
                hist.clear();
                d = gx.iter().map(|v| -v).collect();
                slope = dot(&gx, &d);
            }
            // Backtracking (Armijo) line search.
            let mut t = 1.0;
            let (xn, fnew, gnew) = loop {
                let xn: Vec<f64> = x.iter().zip(&d).map(|(a, b)| a + t * b).collect();
                let (fnew, gnew) = f_at(&xn);
                if fnew <= fx + 1e-4 * t * slope || t < 1e-12 {
                    break (xn, fnew, gnew);
                }
                t *= 0.5;
            };
            let s: Vec<f64> = xn.iter().zip(&x).map(|(a, b)| a - b).collect();
            let y: Vec<f64> = gnew.iter().zip(&gx).map(|(a, b)| a - b).collect();
            let sy = dot(&s, &y);
            if sy > 1e-12 {
                hist.push((s, y, 1.0 / sy));
                if hist.len() > 10 {
                    hist.remove(0);
                }
            }
            if fnew >= fx && t < 1e-12 {
                break;
            }
            x = xn;
            fx = fnew;
            gx = gnew;
        }
        Ok(Self {
            params: x,
            classes,
            vocab,
            iterations: it,
            gradient_max: max_abs(&gx),
        })
    }

    /// Class scores (logits) of a document.
    pub fn scores(&self, doc: &Counts) -> Vec<f64> {
        let bias = self.classes * self.vocab;
        (0..self.classes)
            .map(|k| {
                self.params[bias + k]
                    + doc
                        .iter()
                        .filter(|(w, _)| *w < self.vocab)
                        .map(|&(w, n)| n * self.params[k * self.vocab + w])
                        .sum::<f64>()
            })
            .collect()
    }

    /// The class with the highest score (ties: the smaller class index).
    pub fn predict(&self, doc: &Counts) -> usize {
        argmax(&self.scores(doc))
    }
}

/// Test accuracy of the three baselines.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BowReport {
    /// Predicting the most frequent training label (ties: the smaller class index).
    pub majority: f64,
    /// Multinomial naive Bayes, α = 1.
    pub naive_bayes: f64,
    /// Logistic regression, C = 1.
    pub logistic_regression: f64,
    /// Words in the training vocabulary.
    pub vocabulary: usize,
}

impl BowReport {
    /// The best of naive Bayes and logistic regression.
    pub fn best_bag_of_words(&self) -> f64 {
        self.naive_bayes.max(self.logistic_regression)
    }
}

/// Fits the baselines on `train` (text, class index < `classes`) and scores them on `test`:
/// the majority class, naive Bayes (α = 1) and logistic regression (C = 1, at most 1,000
/// L-BFGS iterations, gradient tolerance 10⁻⁴).
///
/// # Errors
/// An empty training or test set, or a class index outside `classes`.
pub fn baselines<S: AsRef<str>>(
    train: &[(S, usize)],
    test: &[(S, usize)],
    classes: usize,
) -> Result<BowReport, EvalError> {
    if test.is_empty() {
        return Err(EvalError::Empty { what: "test texts" });
    }
    let texts: Vec<&str> = train.iter().map(|(t, _)| t.as_ref()).collect();
    let vocab = Vocabulary::fit(&texts);
    let docs: Vec<Counts> = texts.iter().map(|t| vocab.counts(t)).collect();
    let labels: Vec<usize> = train.iter().map(|(_, l)| *l).collect();
    check_labels(&labels, classes, docs.len())?;
    let tlabels: Vec<usize> = test.iter().map(|(_, l)| *l).collect();
    check_labels(&tlabels, classes, test.len())?;
    let tdocs: Vec<Counts> = test.iter().map(|(t, _)| vocab.counts(t.as_ref())).collect();
    let nb = NaiveBayes::fit(&docs, &labels, classes, vocab.len(), 1.0)?;
    let lr = LogisticRegression::fit(&docs, &labels, classes, vocab.len(), 1.0, 1000, 1e-4)?;
    let mut freq = vec![0usize; classes];
    for &l in &labels {
        freq[l] += 1;
    }
    let majority_class = argmax(&freq.iter().map(|&k| k as f64).collect::<Vec<_>>());
    let acc = |f: &dyn Fn(&Counts) -> usize| {
        tdocs
            .iter()
            .zip(&tlabels)
            .filter(|(d, l)| f(d) == **l)
            .count() as f64
            / test.len() as f64
    };
    Ok(BowReport {
        majority: acc(&|_| majority_class),
        naive_bayes: acc(&|d| nb.predict(d)),
        logistic_regression: acc(&|d| lr.predict(d)),
        vocabulary: vocab.len(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn words_follow_the_count_vectorizer_default() {
        assert_eq!(
            words("A great-film, I'd say: GREAT! x 42"),
            vec!["great", "film", "say", "great", "42"]
        );
        assert_eq!(words("Ça été"), vec!["ça", "été"]);
        let v = Vocabulary::fit(&["b a_b aa", "aa cc"]);
        assert_eq!(v.len(), 3); // a_b, aa, cc: "b" is too short
        assert_eq!(v.counts("aa aa zz cc"), vec![(1, 2.0), (2, 1.0)]);
    }

    /// The slow obvious naive Bayes: per class, count every word occurrence with a map, then
    /// add the logs word occurrence by word occurrence.
    fn reference_nb(train: &[(&str, usize)], text: &str, classes: usize) -> Vec<f64> {
        use std::collections::HashMap;
        let mut vocab: Vec<String> = train.iter().flat_map(|(t, _)| words(t)).collect();
        vocab.sort();
        vocab.dedup();
        (0..classes)
            .map(|c| {
                let docs: Vec<&&str> = train
                    .iter()
                    .filter(|(_, l)| *l == c)
                    .map(|(t, _)| t)
                    .collect();
                let mut n: HashMap<String, f64> = HashMap::new();
                let mut total = 0.0;
                for d in &docs {
                    for w in words(d) {
                        *n.entry(w).or_insert(0.0) += 1.0;
                        total += 1.0;
                    }
                }
                let mut s = (docs.len() as f64 / train.len() as f64).ln();
                for w in words(text) {
                    if vocab.contains(&w) {
                        let k = n.get(&w).copied().unwrap_or(0.0);
                        s += ((k + 1.0) / (total + vocab.len() as f64)).ln();
                    }
                }
                s
            })
            .collect()
    }

    const TRAIN: [(&str, usize); 7] = [
        ("great fun film", 2),
        ("a great great cast", 2),
        ("dull plot, dull cast", 0),
        ("long and dull", 0),
        ("it was fine", 1),
        ("fine but long", 1),
        ("great film", 2),
    ];

    #[test]
    fn naive_bayes_matches_the_slow_reference() {
        let texts: Vec<&str> = TRAIN.iter().map(|(t, _)| *t).collect();
        let v = Vocabulary::fit(&texts);
        let docs: Vec<Counts> = texts.iter().map(|t| v.counts(t)).collect();
        let labels: Vec<usize> = TRAIN.iter().map(|(_, l)| *l).collect();
        let nb = NaiveBayes::fit(&docs, &labels, 3, v.len(), 1.0).unwrap();
        for probe in [
            "great cast",
            "dull dull film",
            "unseen words only",
            "fine fine great",
        ] {
            let got = nb.scores(&v.counts(probe));
            let want = reference_nb(&TRAIN, probe, 3);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-12, "{probe}: {got:?} vs {want:?}");
            }
        }
        assert_eq!(nb.predict(&v.counts("dull")), 0);
        assert_eq!(nb.predict(&v.counts("great")), 2);
    }

    fn toy() -> (Vec<Counts>, Vec<usize>, usize) {
        let texts: Vec<&str> = TRAIN.iter().map(|(t, _)| *t).collect();
        let v = Vocabulary::fit(&texts);
        (
            texts.iter().map(|t| v.counts(t)).collect(),
            TRAIN.iter().map(|(_, l)| *l).collect(),
            v.len(),
        )
    }

    /// The objective's gradient against central finite differences of the objective itself.
    #[test]
    fn the_logistic_gradient_matches_finite_differences() {
        let (docs, labels, vocab) = toy();
        let dim = 3 * (vocab + 1);
        let p: Vec<f64> = (0..dim)
            .map(|i| ((i * 37 % 11) as f64 - 5.0) / 10.0)
            .collect();
        let (_, g) = objective(&p, &docs, &labels, 3, vocab, 0.7);
        for i in (0..dim).step_by(3) {
            let h = 1e-6;
            let mut a = p.clone();
            a[i] += h;
            let mut b = p.clone();
            b[i] -= h;
            let fd = (objective(&a, &docs, &labels, 3, vocab, 0.7).0
                - objective(&b, &docs, &labels, 3, vocab, 0.7).0)
                / (2.0 * h);
            assert!((fd - g[i]).abs() < 1e-5, "coordinate {i}: {fd} vs {}", g[i]);
        }
    }

    /// L-BFGS reaches the optimum: the gradient vanishes there, and the slow obvious method
    /// (plain gradient descent for many steps) lands on the same objective value.
    #[test]
    fn logistic_regression_reaches_the_optimum_that_gradient_descent_finds() {
        let (docs, labels, vocab) = toy();
        let lr = LogisticRegression::fit(&docs, &labels, 3, vocab, 1.0, 500, 1e-8).unwrap();
        assert!(lr.gradient_max < 1e-8, "{}", lr.gradient_max);
        let mut p = vec![0.0; 3 * (vocab + 1)];
        for _ in 0..20_000 {
            let (_, g) = objective(&p, &docs, &labels, 3, vocab, 1.0);
            for (x, gi) in p.iter_mut().zip(&g) {
                *x -= 0.05 * gi;
            }
        }
        let slow = objective(&p, &docs, &labels, 3, vocab, 1.0).0;
        let fast = objective(&lr.params, &docs, &labels, 3, vocab, 1.0).0;
        assert!((slow - fast).abs() < 1e-7, "{slow} vs {fast}");
        assert_eq!(lr.predict(&docs[2]), 0);
    }

    #[test]
    fn baselines_score_and_bad_input_is_an_error() {
        let test = [
            ("dull dull", 0usize),
            ("great", 2),
            ("fine", 1),
            ("long", 0),
        ];
        let r = baselines(&TRAIN, &test, 3).unwrap();
        // Majority: class 2 (3 of 7) is right on 1 of 4.
        assert_eq!(r.majority, 0.25);
        assert!(
            r.naive_bayes >= 0.75 && r.logistic_regression >= 0.75,
            "{r:?}"
        );
        assert_eq!(
            r.best_bag_of_words(),
            r.naive_bayes.max(r.logistic_regression)
        );
        assert!(baselines(&TRAIN, &[], 3).is_err());
        assert!(baselines::<&str>(&[], &test, 3).is_err());
        assert!(baselines(&TRAIN, &test, 2).is_err());
        assert!(baselines(&[("a b", 0usize)], &[("ab", 0)], 1).is_err());
        let (docs, labels, vocab) = toy();
        assert!(NaiveBayes::fit(&docs, &labels, 3, vocab, 0.0).is_err());
        assert!(LogisticRegression::fit(&docs, &labels, 3, vocab, -1.0, 10, 1e-4).is_err());
        assert!(LogisticRegression::fit(&docs, &labels, 3, vocab - 1, 1.0, 10, 1e-4).is_err());
    }

    proptest! {
        /// Any corpus: naive Bayes' class probabilities of a text sum to 1 after normalizing
        /// its joint log-likelihoods, and logistic regression ends with a small gradient.
        #[test]
        fn fits_are_well_formed(
            raw in prop::collection::vec((prop::collection::vec(0usize..6, 1..6), 0usize..2), 2..12),
        ) {
            let vocab_words = ["aa", "bb", "cc", "dd", "ee", "ff"];
            let train: Vec<(String, usize)> = raw
                .iter()
                .map(|(ws, l)| (ws.iter().map(|&w| vocab_words[w]).collect::<Vec<_>>().join(" "), *l))
                .collect();
            let texts: Vec<&str> = train.iter().map(|(t, _)| t.as_str()).collect();
            let v = Vocabulary::fit(&texts);
            let docs: Vec<Counts> = texts.iter().map(|t| v.counts(t)).collect();
            let labels: Vec<usize> = train.iter().map(|(_, l)| *l).collect();
            let nb = NaiveBayes::fit(&docs, &labels, 2, v.len(), 1.0).unwrap();
            for d in &docs {
                let s = nb.scores(d);
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                prop_assert!(z.is_finite() && z >= 1.0);
            }
            let lr = LogisticRegression::fit(&docs, &labels, 2, v.len(), 1.0, 2000, 1e-6).unwrap();
            prop_assert!(lr.gradient_max < 1e-6, "{}", lr.gradient_max);
        }
    }
}
