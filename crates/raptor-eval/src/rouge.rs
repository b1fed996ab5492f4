//! ROUGE-L F-measure, compatible with Google's `rouge-score` package
//! (`RougeScorer(['rougeL'], use_stemmer=False)`).
//!
//! - Tokenizer (rouge-score's default, **no stemming**): lower-case the text (Unicode lower
//!   case), replace every run of characters outside `[a-z0-9]` by a space, split on whitespace,
//!   drop empty tokens.
//! - Per (reference, hypothesis): LCS length `l` of the token sequences; precision `l/|hyp|`,
//!   recall `l/|ref|`, F = 2PR/(P+R) (0 when P+R = 0, and all zero when either side has no
//!   tokens).
//! - Several references: the score of the reference with the highest F (the first one on ties),
//!   as `score_multi` does. Corpus value: the mean F over hypotheses.

use serde::{Deserialize, Serialize};

use crate::EvalError;

/// Tokenize as rouge-score's default tokenizer without stemming.
///
/// ```
/// assert_eq!(raptor_eval::tokenize_rouge("The café's 2nd-best—ÉCLAIR!"), ["the", "caf", "s", "2nd", "best", "clair"]);
/// ```
pub fn tokenize_rouge(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    lower
        .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

/// Length of the longest common subsequence (O(|a|·|b|) time, O(|b|) memory).
pub fn lcs_len<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    let mut prev = vec![0usize; b.len() + 1];
    let mut cur = vec![0usize; b.len() + 1];
    for x in a {
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = if x == y {
                prev[j] + 1
            } else {
                cur[j].max(prev[j + 1])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// Precision, recall and F-measure of one ROUGE-L comparison.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct RougeScore {
    /// LCS / hypothesis length.
    pub precision: f64,
    /// LCS / reference length.
    pub recall: f64,
    /// Harmonic mean of precision and recall.
    pub fmeasure: f64,
}

/// ROUGE-L of one hypothesis against one reference.
pub fn rouge_l(reference: &str, hypothesis: &str) -> RougeScore {
    let r = tokenize_rouge(reference);
    let h = tokenize_rouge(hypothesis);
    if r.is_empty() || h.is_empty() {
        return RougeScore::default();
    }
    let l = lcs_len(&r, &h) as f64;
    let precision = l / h.len() as f64;
    let recall = l / r.len() as f64;
    let fmeasure = if precision + recall > 0.0 {
        2.0 * precision * recall / (precision + recall)
    } else {
        0.0
    };
    RougeScore {
        precision,
        recall,
        fmeasure,
    }
}

/// ROUGE-L of one hypothesis against several references: the best by F-measure (first on ties).
pub fn rouge_l_multi<S: AsRef<str>>(
    index: usize,
    references: &[S],
    hypothesis: &str,
) -> Result<RougeScore, EvalError> {
    let mut best: Option<RougeScore> = None;
    for r in references {
        let s = rouge_l(r.as_ref(), hypothesis);
        if best.is_none_or(|b| s.fmeasure > b.fmeasure) {
            best = Some(s);
        }
    }
    best.ok_or(EvalError::NoReference { index })
}

/// Corpus ROUGE-L: the mean over hypotheses of the best F-measure against their references.
///
/// ```
/// let hyps = ["the cat sat", "a dog"];
/// let refs = [vec!["the cat sat down"], vec!["the dog barked", "a dog"]];
/// let r = raptor_eval::corpus_rouge_l(&hyps, &refs)?;
/// assert!((r - (6.0 / 7.0 + 1.0) / 2.0).abs() < 1e-12);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn corpus_rouge_l<H: AsRef<str>, R: AsRef<[S]>, S: AsRef<str>>(
    hypotheses: &[H],
    references: &[R],
) -> Result<f64, EvalError> {
    crate::error::check_corpus(hypotheses.len(), references.len())?;
    let mut sum = 0.0;
    for (i, (h, r)) in hypotheses.iter().zip(references).enumerate() {
        sum += rouge_l_multi(i, r.as_ref(), h.as_ref())?.fmeasure;
    }
    Ok(sum / hypotheses.len() as f64)
}
