//! Corpus BLEU, compatible with sacrebleu's default `corpus_bleu` (sacrebleu 2.x: `13a`
//! tokenization, case-sensitive, 4-gram, brevity penalty against the closest reference length,
//! `exp` smoothing, no effective order).
//!
//! No maintained Rust crate reproduces sacrebleu exactly, so this module follows its definition:
//!
//! - Each segment is right-stripped (Python whitespace), then tokenized by `13a`: remove
//!   `<skipped>`, join `-\n`, turn `\n` into spaces, unescape `&quot; &amp; &lt; &gt;`, then the
//!   four mteval-v13a regular expressions (split off the ASCII punctuation and symbol ranges
//!   `{-~`, `[-\``, ` -&`, `(-+`, `:-@`, `/`; periods and commas not next to a digit; a dash after
//!   a digit), then split on whitespace.
//! - Per hypothesis: clipped n-gram matches against the maximum count over its references, the
//!   hypothesis length, and the closest reference length (ties to the shorter).
//!   Hypotheses may have different numbers of references (sacrebleu's `None` padding); an empty
//!   reference string is a reference of length 0, as in sacrebleu; a hypothesis without any
//!   reference is an error.
//! - Corpus: sums of the statistics; no match at all gives 0; otherwise precision
//!   `100·correct/total` per order, a zero-match order gets `100/(2^k · total)` (the k-th such
//!   order, `exp` smoothing), an order with no n-grams stops the product (its log counts as
//!   −9999999999, as sacrebleu does); BLEU = BP · exp(mean log precision), BP = exp(1 − r/c) when
//!   c < r (0 when c = 0).

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::EvalError;

const MAX_ORDER: usize = 4;

/// The part of sacrebleu's signature that [`corpus_bleu`] reproduces (print it beside scores;
/// sacrebleu adds `nrefs:<n or var>` and `version:<its version>`).
pub const SACREBLEU_SIGNATURE: &str = "case:mixed|eff:no|tok:13a|smooth:exp";

struct Rules {
    punct: Regex,
    period_comma_before: Regex,
    period_comma_after: Regex,
    dash: Regex,
}

static RULES: LazyLock<Option<Rules>> = LazyLock::new(|| {
    Some(Rules {
        punct: Regex::new(r"([\{-~\[-` -&\(-\+:-@/])").ok()?,
        period_comma_before: Regex::new(r"([^0-9])([\.,])").ok()?,
        period_comma_after: Regex::new(r"([\.,])([^0-9])").ok()?,
        dash: Regex::new(r"([0-9])(-)").ok()?,
    })
});

/// Python's `str.isspace` set (used by `str.split()` and `str.rstrip()`): Rust's Unicode
/// White_Space plus the ASCII separators U+001C..U+001F.
pub(crate) fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn py_split(s: &str) -> Vec<&str> {
    s.split(is_py_space).filter(|t| !t.is_empty()).collect()
}

/// Tokenize one segment as sacrebleu's `13a` tokenizer does (after its `rstrip`), returning the
/// tokens.
///
/// ```
/// assert_eq!(
///     raptor_eval::tokenize_13a("Hello, world! It's 3.5 km-long &amp; \"fine\"."),
///     ["Hello", ",", "world", "!", "It's", "3.5", "km-long", "&", "\"", "fine", "\"", "."]
/// );
/// ```
pub fn tokenize_13a(segment: &str) -> Vec<String> {
    let line = segment.trim_end_matches(is_py_space);
    let mut line = line
        .replace("<skipped>", "")
        .replace("-\n", "")
        .replace('\n', " ");
    if line.contains('&') {
        line = line
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">");
    }
    let mut line = format!(" {line} ");
    if let Some(r) = RULES.as_ref() {
        line = r.punct.replace_all(&line, " $1 ").into_owned();
        line = r
            .period_comma_before
            .replace_all(&line, "$1 $2 ")
            .into_owned();
        line = r
            .period_comma_after
            .replace_all(&line, " $1 $2")
            .into_owned();
        line = r.dash.replace_all(&line, "$1 $2 ").into_owned();
    }
    py_split(&line).into_iter().map(str::to_string).collect()
}

/// Sufficient statistics of BLEU (summable over segments).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BleuStats {
    /// Clipped n-gram matches, n = 1..4.
    pub correct: [u64; MAX_ORDER],
    /// Hypothesis n-grams, n = 1..4.
    pub total: [u64; MAX_ORDER],
    /// Hypothesis length in tokens.
    pub sys_len: u64,
    /// Closest reference length.
    pub ref_len: u64,
}

impl std::ops::AddAssign for BleuStats {
    fn add_assign(&mut self, o: Self) {
        for n in 0..MAX_ORDER {
            self.correct[n] += o.correct[n];
            self.total[n] += o.total[n];
        }
        self.sys_len += o.sys_len;
        self.ref_len += o.ref_len;
    }
}

/// A BLEU score with its statistics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bleu {
    /// BLEU in [0, 100].
    pub score: f64,
    /// n-gram precisions in percent (after smoothing), n = 1..4.
    pub precisions: [f64; MAX_ORDER],
    /// Brevity penalty.
    pub brevity_penalty: f64,
    /// The summed statistics.
    pub stats: BleuStats,
}

fn ngrams(tokens: &[String]) -> HashMap<&[String], u64> {
    let mut m = HashMap::new();
    for n in 1..=MAX_ORDER {
        for w in tokens.windows(n) {
            *m.entry(w).or_insert(0) += 1;
        }
    }
    m
}

/// BLEU statistics of one hypothesis against its references.
pub fn segment_stats<S: AsRef<str>>(
    index: usize,
    hypothesis: &str,
    references: &[S],
) -> Result<BleuStats, EvalError> {
    let refs: Vec<Vec<String>> = references
        .iter()
        .map(|r| tokenize_13a(r.as_ref()))
        .collect();
    if refs.is_empty() {
        return Err(EvalError::NoReference { index });
    }
    let hyp = tokenize_13a(hypothesis);
    let hyp_len = hyp.len() as u64;
    // Closest reference length, ties to the shorter.
    let mut closest: Option<(u64, u64)> = None; // (diff, len)
    for r in &refs {
        let len = r.len() as u64;
        let diff = len.abs_diff(hyp_len);
        closest = match closest {
            Some((d, l)) if d < diff || (d == diff && l <= len) => Some((d, l)),
            _ => Some((diff, len)),
        };
    }
    let mut max_ref: HashMap<&[String], u64> = HashMap::new();
    for r in &refs {
        for (g, c) in ngrams(r) {
            let e = max_ref.entry(g).or_insert(0);
            *e = (*e).max(c);
        }
    }
    let mut s = BleuStats {
        sys_len: hyp_len,
        ref_len: closest.map(|c| c.1).unwrap_or(0),
        ..BleuStats::default()
    };
    for (n, total) in s.total.iter_mut().enumerate() {
        *total = hyp_len.saturating_sub(n as u64);
    }
    for (g, c) in ngrams(&hyp) {
        let m = max_ref.get(g).copied().unwrap_or(0);
        s.correct[g.len() - 1] += c.min(m);
    }
    Ok(s)
}

/// BLEU from summed statistics (sacrebleu's `compute_bleu` with `exp` smoothing).
pub fn bleu_from_stats(stats: &BleuStats) -> Bleu {
    let (sys, r) = (stats.sys_len as f64, stats.ref_len as f64);
    let bp = if stats.sys_len < stats.ref_len {
        if stats.sys_len > 0 {
            (1.0 - r / sys).exp()
        } else {
            0.0
        }
    } else {
        1.0
    };
    let mut precisions = [0.0; MAX_ORDER];
    if stats.correct.iter().all(|&c| c == 0) {
        return Bleu {
            score: 0.0,
            precisions,
            brevity_penalty: bp,
            stats: *stats,
        };
    }
    let mut smooth = 1.0;
    for ((p, &correct), &total) in precisions.iter_mut().zip(&stats.correct).zip(&stats.total) {
        if total == 0 {
            break;
        }
        *p = if correct == 0 {
            smooth *= 2.0;
            100.0 / (smooth * total as f64)
        } else {
            100.0 * correct as f64 / total as f64
        };
    }
    let log_sum: f64 = precisions
        .iter()
        .map(|&p| if p == 0.0 { -9_999_999_999.0 } else { p.ln() })
        .sum();
    Bleu {
        score: bp * (log_sum / MAX_ORDER as f64).exp(),
        precisions,
        brevity_penalty: bp,
        stats: *stats,
    }
}

/// Corpus BLEU of `hypotheses`, each with its own list of references (any number ≥ 1).
///
/// ```
/// use raptor_eval::corpus_bleu;
/// let hyps = ["the cat sat on the mat", "hello there"];
/// let refs = [vec!["the cat sat on the mat"], vec!["hello there general kenobi", "hello there !"]];
/// let b = corpus_bleu(&hyps, &refs)?;
/// assert!(b.score > 0.0 && b.score <= 100.0);
/// # Ok::<(), raptor_eval::EvalError>(())
/// ```
pub fn corpus_bleu<H: AsRef<str>, R: AsRef<[S]>, S: AsRef<str>>(
    hypotheses: &[H],
    references: &[R],
) -> Result<Bleu, EvalError> {
    crate::error::check_corpus(hypotheses.len(), references.len())?;
    let mut total = BleuStats::default();
    for (i, (h, r)) in hypotheses.iter().zip(references).enumerate() {
        total += segment_stats(i, h.as_ref(), r.as_ref())?;
    }
    Ok(bleu_from_stats(&total))
}
