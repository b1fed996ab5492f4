//! # raptor-eval
//!
//! Metrics for private fine-tuning, without tensors or libtorch:
//!
//! - [`accuracy`], [`mean_ci`] (mean ± Student-t interval over seeds; n = 1 gives an undefined
//!   half-width, NaN, never a made-up number), [`wilson_interval`] for one accuracy;
//! - [`nll_perplexity`] from token-level sums and counts;
//! - [`corpus_bleu`] (sacrebleu's default `corpus_bleu`: 13a, exp smoothing, several references)
//!   and [`corpus_rouge_l`] (rouge-score's `rougeL` F-measure, no stemming, best reference);
//! - [`audit`]: the one-run canary ε lower bound of Steinke, Nasr & Jagielski (2023), with a
//!   Bonferroni-corrected search over abstention thresholds;
//! - [`mia`]: membership-inference ROC AUC and TPR at low FPR (ties handled);
//! - [`bow`]: bag-of-words baselines (majority class, multinomial naive Bayes, L2 logistic
//!   regression on word counts): what a backbone must beat to be said to learn a task;
//! - [`moe`]: RAPTOR's diagnostics of a private MoE run from per-record numbers (role mismatch,
//!   per-stream SNR and its CV, clip suppression, dilution).
//!
//! Golden files made by `fixtures/eval/generate.py` with sacrebleu, rouge-score and scipy check
//! these against independent implementations.
//!
//! ```
//! use raptor_eval::{accuracy, corpus_bleu, corpus_rouge_l, mean_ci};
//! let acc = [accuracy(&[1, 0, 1], &[1, 1, 1])?, 0.70, 0.72];
//! println!("accuracy {}", mean_ci(&acc, 0.95)?);
//! let hyps = ["Aromi is a coffee shop."];
//! let refs = [vec!["Aromi is a coffee shop.", "There is a coffee shop called Aromi."]];
//! assert!((corpus_bleu(&hyps, &refs)?.score - 100.0).abs() < 1e-9);
//! assert_eq!(corpus_rouge_l(&hyps, &refs)?, 1.0);
//! # Ok::<(), raptor_eval::EvalError>(())
//! ```

pub mod audit;
mod bleu;
pub mod bow;
mod error;
pub mod mia;
pub mod moe;
mod rouge;
mod stats;

pub use bleu::{
    Bleu, BleuStats, SACREBLEU_SIGNATURE, bleu_from_stats, corpus_bleu, segment_stats, tokenize_13a,
};
pub use error::EvalError;
pub use rouge::{RougeScore, corpus_rouge_l, lcs_len, rouge_l, rouge_l_multi, tokenize_rouge};
pub use stats::{
    MeanCi, Nll, ProportionCi, accuracy, mean_ci, min_detectable_effect, nll_perplexity,
    wilson_interval,
};

/// The README's examples, compiled (and run where not `no_run`) as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
