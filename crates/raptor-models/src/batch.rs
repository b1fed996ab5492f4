//! Batches of token records and the per-record losses.

use crate::error::{ModelError, Result};
use tch::{Device, Kind, Tensor};

/// A right-padded batch of token records.
///
/// `input_ids` is `[B, T]` (i64) and `attention_mask` is `[B, T]` (i64, 1 for a valid token,
/// 0 for padding). `labels` (`[B]`, i64) is needed for classification only.
#[derive(Debug)]
pub struct Batch {
    /// Token ids `[B, T]`.
    pub input_ids: Tensor,
    /// Attention mask `[B, T]` (1 valid, 0 padding).
    pub attention_mask: Tensor,
    /// Class labels `[B]` for classification.
    pub labels: Option<Tensor>,
    /// Language modelling: `[B, T]` (i64, 0/1) marks the positions whose token is a training
    /// target (e.g. the reference of a data-to-text record, not its prompt); `None`: every
    /// valid position after the first. Position 0 is never a target.
    pub loss_mask: Option<Tensor>,
}

impl Batch {
    /// Builds a right-padded batch from token records (each must be non-empty).
    ///
    /// ```
    /// use raptor_models::Batch;
    /// let b = Batch::from_records(&[vec![5, 6, 7], vec![8]], 0, None, tch::Device::Cpu).unwrap();
    /// assert_eq!(b.input_ids.size(), vec![2, 3]);
    /// assert!(Batch::from_records(&[vec![5], vec![]], 0, None, tch::Device::Cpu).is_err());
    /// ```
    pub fn from_records(
        records: &[Vec<i64>],
        pad_id: i64,
        labels: Option<&[i64]>,
        device: Device,
    ) -> Result<Self> {
        let b = records.len();
        if b == 0 {
            return Err(ModelError::ShapeMismatch {
                what: "batch (number of records)".into(),
                expected: vec![-1],
                got: vec![0],
            });
        }
        if let Some(l) = labels
            && l.len() != b
        {
            return Err(ModelError::ShapeMismatch {
                what: "labels".into(),
                expected: vec![b as i64],
                got: vec![l.len() as i64],
            });
        }
        let t = records.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = vec![pad_id; b * t];
        let mut mask = vec![0i64; b * t];
        for (r, rec) in records.iter().enumerate() {
            if rec.is_empty() {
                return Err(ModelError::EmptyRecord {
                    record: r,
                    why: "it has no token".into(),
                });
            }
            for (p, &id) in rec.iter().enumerate() {
                ids[r * t + p] = id;
                mask[r * t + p] = 1;
            }
        }
        let shape = [b as i64, t as i64];
        Ok(Self {
            input_ids: Tensor::f_from_slice(&ids)?.f_reshape(shape)?.f_to(device)?,
            attention_mask: Tensor::f_from_slice(&mask)?
                .f_reshape(shape)?
                .f_to(device)?,
            labels: match labels {
                Some(l) => Some(Tensor::f_from_slice(l)?.f_to(device)?),
                None => None,
            },
            loss_mask: None,
        })
    }

    /// Language modelling: only positions `p >= prompt_lens[r]` of record `r` are targets (the
    /// loss of a data-to-text record is on its reference, not on its prompt). A record whose
    /// prompt covers all its valid tokens is an error naming it.
    pub fn with_prompt_lengths(mut self, prompt_lens: &[usize]) -> Result<Self> {
        let (b, t) = (self.batch_size(), self.seq_len());
        if prompt_lens.len() as i64 != b {
            return Err(ModelError::ShapeMismatch {
                what: "prompt lengths".into(),
                expected: vec![b],
                got: vec![prompt_lens.len() as i64],
            });
        }
        let mask: Vec<i64> = Vec::try_from(
            self.attention_mask
                .f_to_kind(Kind::Int64)?
                .f_to(Device::Cpu)?
                .f_flatten(0, -1)?,
        )?;
        let mut lm = vec![0i64; mask.len()];
        for (r, &pl) in prompt_lens.iter().enumerate() {
            let mut any = false;
            for p in pl.max(1)..t as usize {
                let i = r * t as usize + p;
                lm[i] = mask[i];
                any |= mask[i] == 1;
            }
            if !any {
                return Err(ModelError::EmptyRecord {
                    record: r,
                    why: format!("its prompt ({pl} tokens) leaves no target token"),
                });
            }
        }
        self.loss_mask = Some(
            Tensor::f_from_slice(&lm)?
                .f_reshape([b, t])?
                .f_to(self.input_ids.device())?,
        );
        Ok(self)
    }

    /// Number of records B.
    pub fn batch_size(&self) -> i64 {
        self.input_ids.size().first().copied().unwrap_or(0)
    }

    /// Sequence length T.
    pub fn seq_len(&self) -> i64 {
        self.input_ids.size().get(1).copied().unwrap_or(0)
    }

    /// Records `start..start+len` as a new batch (shares no autograd state).
    pub fn narrow(&self, start: i64, len: i64) -> Result<Self> {
        Ok(Self {
            input_ids: self.input_ids.f_narrow(0, start, len)?,
            attention_mask: self.attention_mask.f_narrow(0, start, len)?,
            labels: match &self.labels {
                Some(l) => Some(l.f_narrow(0, start, len)?),
                None => None,
            },
            loss_mask: match &self.loss_mask {
                Some(m) => Some(m.f_narrow(0, start, len)?),
                None => None,
            },
        })
    }

    /// Errors when the records are longer than the `max` learned positions of a model (`field`
    /// names the config field that sets `max`, e.g. `n_positions`).
    pub(crate) fn check_positions(&self, max: i64, field: &str) -> Result<()> {
        let (b, t) = (self.batch_size(), self.seq_len());
        if t > max {
            return Err(ModelError::ShapeMismatch {
                what: format!("sequence length (at most {field} = {max})"),
                expected: vec![b, max],
                got: vec![b, t],
            });
        }
        Ok(())
    }

    /// Checks shapes, token ids, mask values, empty records and labels; errors name the record.
    pub fn validate(&self, vocab_size: i64, num_labels: Option<i64>) -> Result<()> {
        let ids_shape = self.input_ids.size();
        if ids_shape.len() != 2 || ids_shape[0] == 0 || ids_shape[1] == 0 {
            return Err(ModelError::ShapeMismatch {
                what: "input_ids".into(),
                expected: vec![-1, -1],
                got: ids_shape,
            });
        }
        if self.attention_mask.size() != ids_shape {
            return Err(ModelError::ShapeMismatch {
                what: "attention_mask".into(),
                expected: ids_shape,
                got: self.attention_mask.size(),
            });
        }
        let (b, t) = (ids_shape[0] as usize, ids_shape[1] as usize);
        let ids: Vec<i64> = Vec::try_from(
            self.input_ids
                .f_to_kind(Kind::Int64)?
                .f_to(Device::Cpu)?
                .f_flatten(0, -1)?,
        )?;
        let mask: Vec<i64> = Vec::try_from(
            self.attention_mask
                .f_to_kind(Kind::Int64)?
                .f_to(Device::Cpu)?
                .f_flatten(0, -1)?,
        )?;
        for r in 0..b {
            let mut valid = 0usize;
            for p in 0..t {
                let (id, m) = (ids[r * t + p], mask[r * t + p]);
                if m != 0 && m != 1 {
                    return Err(ModelError::InvalidMask {
                        record: r,
                        why: format!("value {m} at position {p} (must be 0 or 1)"),
                    });
                }
                if m == 1 && valid != p {
                    return Err(ModelError::InvalidMask {
                        record: r,
                        why: format!(
                            "valid token at position {p} after padding (records must be right-padded)"
                        ),
                    });
                }
                if id < 0 || id >= vocab_size {
                    return Err(ModelError::TokenOutOfRange {
                        record: r,
                        position: p,
                        id,
                        vocab_size,
                    });
                }
                valid += m as usize;
            }
            if valid == 0 {
                return Err(ModelError::EmptyRecord {
                    record: r,
                    why: "its attention mask is all zero".into(),
                });
            }
        }
        if let Some(n) = num_labels {
            let labels = self.labels.as_ref().ok_or_else(|| {
                ModelError::InvalidConfig("classification needs labels in the batch".into())
            })?;
            if labels.size() != [b as i64] {
                return Err(ModelError::ShapeMismatch {
                    what: "labels".into(),
                    expected: vec![b as i64],
                    got: labels.size(),
                });
            }
            let l: Vec<i64> = Vec::try_from(labels.f_to_kind(Kind::Int64)?.f_to(Device::Cpu)?)?;
            for (r, &y) in l.iter().enumerate() {
                if y < 0 || y >= n {
                    return Err(ModelError::LabelOutOfRange {
                        record: r,
                        label: y,
                        num_labels: n,
                    });
                }
            }
        }
        Ok(())
    }
}

/// What the model is trained for; decides the per-record loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// One label per record; loss is the record's cross-entropy.
    Classification,
    /// Next-token prediction; a record's loss is the mean over its valid targets.
    LanguageModel,
}

/// Per-record losses `[B]`: classification cross-entropy of `logits [B, C]`, or the mean
/// next-token cross-entropy over each record's valid targets for `logits [B, T, V]`.
/// The training loss is their plain sum (never a batch-normalized quantity).
pub fn per_record_loss(logits: &Tensor, batch: &Batch, task: Task) -> Result<Tensor> {
    match task {
        Task::Classification => {
            let labels = batch.labels.as_ref().ok_or_else(|| {
                ModelError::InvalidConfig("classification needs labels in the batch".into())
            })?;
            let lp = logits.f_log_softmax(-1, None::<Kind>)?;
            Ok(lp
                .f_gather(1, &labels.f_unsqueeze(1)?, false)?
                .f_squeeze_dim(1)?
                .f_neg()?)
        }
        Task::LanguageModel => {
            let t = batch.seq_len();
            if t < 2 {
                return Err(ModelError::EmptyRecord {
                    record: 0,
                    why: "language modelling needs at least two tokens per record".into(),
                });
            }
            let lp = logits
                .f_narrow(1, 0, t - 1)?
                .f_log_softmax(-1, None::<Kind>)?;
            let targets = batch.input_ids.f_narrow(1, 1, t - 1)?;
            let mut valid = batch
                .attention_mask
                .f_narrow(1, 1, t - 1)?
                .f_to_kind(lp.kind())?;
            if let Some(m) = &batch.loss_mask {
                valid = valid.f_mul(&m.f_narrow(1, 1, t - 1)?.f_to_kind(lp.kind())?)?;
            }
            let counts: Vec<f64> = Vec::try_from(
                valid
                    .f_sum_dim_intlist(1, false, Kind::Double)?
                    .f_to(Device::Cpu)?,
            )?;
            if let Some(r) = counts.iter().position(|&c| c == 0.0) {
                return Err(ModelError::EmptyRecord {
                    record: r,
                    why: "it has no next-token target (a single valid token, or a prompt that covers it)".into(),
                });
            }
            let nll = lp
                .f_gather(2, &targets.f_unsqueeze(2)?, false)?
                .f_squeeze_dim(2)?
                .f_neg()?;
            let sum = nll
                .f_mul(&valid)?
                .f_sum_dim_intlist(1, false, None::<Kind>)?;
            Ok(sum.f_div(&valid.f_sum_dim_intlist(1, false, None::<Kind>)?)?)
        }
    }
}
