//! The frozen-prefix cache: each record's hidden states after a model's frozen prefix
//! ([`crate::Model::frozen_prefix`]), computed the first time the record is asked for and kept
//! for the rest of the run, so that later passes over it start at the first trained block
//! ([`crate::ForwardCtx::prefix`]) instead of recomputing the embeddings and the frozen blocks.
//!
//! A record's rows are stored without padding (`[len, d]`, its valid tokens only), in memory or
//! in a file, in f32 or a reduced precision ([`PrefixPrecision`]). [`PrefixCache::hidden`]
//! assembles a batch's `[B, T, d]` f32 tensor, zero past each record's length: an encoder with a
//! key-padding mask never lets those rows reach a valid token (their attention weight is exactly
//! 0), so the valid rows and every per-record gradient equal the full forward pass's up to float
//! round-off (the prefix was computed in another batch shape).
//!
//! The hidden states are computed from the records: when the records are private, so is the
//! cache. A file cache belongs in a folder only the data owner reads (raptor's runs put it in
//! their `private/` folder); it is created readable by its owner only and deleted when the
//! cache is dropped. It is a file read and written by offset rather than a memory map: the OS
//! page cache keeps the hot part in memory all the same, and no `unsafe` mapping can be changed
//! under the process by another writer.

use crate::batch::Batch;
use crate::error::{ModelError, Result};
use crate::model::Model;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// How a [`PrefixCache`] stores hidden states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PrefixPrecision {
    /// 4 bytes per value: the hidden states exactly as computed.
    F32,
    /// 2 bytes per value (IEEE half: 11 significant bits, values up to 65,504).
    F16,
    /// 2 bytes per value (bfloat16: 8 significant bits, f32's range).
    Bf16,
}

impl PrefixPrecision {
    /// Bytes per stored value.
    pub fn bytes(self) -> u64 {
        match self {
            PrefixPrecision::F32 => 4,
            PrefixPrecision::F16 | PrefixPrecision::Bf16 => 2,
        }
    }

    fn kind(self) -> Kind {
        match self {
            PrefixPrecision::F32 => Kind::Float,
            PrefixPrecision::F16 => Kind::Half,
            PrefixPrecision::Bf16 => Kind::BFloat16,
        }
    }
}

/// Where a [`PrefixCache`] keeps its records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixStore {
    /// In memory (CPU).
    Memory,
    /// In a file at this path (created, truncated, readable by its owner only; deleted when the
    /// cache is dropped).
    File(PathBuf),
}

/// Where one record's rows are.
#[derive(Debug)]
enum Entry {
    Memory(Tensor),
    File { offset: u64, rows: i64 },
}

#[derive(Debug)]
enum Backing {
    Memory,
    File { file: File, path: PathBuf, end: u64 },
}

/// Each record's hidden states after a model's frozen prefix, computed once (see the module
/// docs).
///
/// ```
/// use raptor_models::{Bert, BertConfig, Model, PrefixCache, PrefixPrecision, PrefixStore};
/// let model = Bert::new(BertConfig::tiny(2), tch::Device::Cpu).unwrap();
/// raptor_models::freeze_all(&model).unwrap();
/// // Nothing trains but the head: both blocks are a frozen prefix.
/// let p = model.frozen_prefix(&["classifier.weight".to_string()]).unwrap();
/// let mut cache = PrefixCache::new(p.layers, p.width, 3, PrefixPrecision::F32, PrefixStore::Memory).unwrap();
/// let (a, b) = (vec![2i64, 5, 7], vec![3i64]);
/// let h = cache.hidden(&model, &[0, 2], &[&a, &b], 0, tch::Device::Cpu).unwrap();
/// assert_eq!(h.size(), [2, 3, 16]);
/// assert_eq!(cache.stored_records(), 2);
/// ```
#[derive(Debug)]
pub struct PrefixCache {
    layers: usize,
    width: i64,
    precision: PrefixPrecision,
    entries: Vec<Option<Entry>>,
    backing: Backing,
    stored_bytes: u64,
}

impl PrefixCache {
    /// An empty cache of the hidden states after `layers` blocks (width `width`) for records
    /// `0..records`.
    ///
    /// # Errors
    /// `layers` 0, `width` < 1, or a file that cannot be created.
    pub fn new(
        layers: usize,
        width: i64,
        records: usize,
        precision: PrefixPrecision,
        store: PrefixStore,
    ) -> Result<Self> {
        if layers == 0 || width < 1 {
            return Err(ModelError::InvalidConfig(format!(
                "a prefix cache needs at least one block and a positive width (got {layers} blocks, width {width})"
            )));
        }
        let backing = match store {
            PrefixStore::Memory => Backing::Memory,
            PrefixStore::File(path) => {
                let mut opts = std::fs::OpenOptions::new();
                opts.read(true).write(true).create(true).truncate(true);
                #[cfg(unix)]
                {
                    use std::os::unix::fs::OpenOptionsExt;
                    opts.mode(0o600);
                }
                let file = opts.open(&path).map_err(|e| {
                    ModelError::InvalidConfig(format!(
                        "cannot create the prefix cache file {}: {e}",
                        path.display()
                    ))
                })?;
                Backing::File { file, path, end: 0 }
            }
        };
        Ok(Self {
            layers,
            width,
            precision,
            entries: (0..records).map(|_| None).collect(),
            backing,
            stored_bytes: 0,
        })
    }

    /// The most bytes a cache of `records` records of at most `max_tokens` tokens each, width
    /// `width`, can hold: a bound from public sizes only (the bytes actually stored follow the
    /// records' lengths).
    pub fn bound_bytes(
        records: usize,
        max_tokens: usize,
        width: i64,
        precision: PrefixPrecision,
    ) -> u64 {
        (records as u64)
            .saturating_mul(max_tokens as u64)
            .saturating_mul(width.max(0) as u64)
            .saturating_mul(precision.bytes())
    }

    /// Blocks of the prefix the cached states follow.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// The storage precision.
    pub fn precision(&self) -> PrefixPrecision {
        self.precision
    }

    /// The file the cache is kept in (None in memory).
    pub fn path(&self) -> Option<&Path> {
        match &self.backing {
            Backing::File { path, .. } => Some(path),
            Backing::Memory => None,
        }
    }

    /// Records of the set the cache covers (cached or not).
    pub fn records(&self) -> usize {
        self.entries.len()
    }

    /// Records cached so far.
    pub fn stored_records(&self) -> usize {
        self.entries.iter().filter(|e| e.is_some()).count()
    }

    /// Bytes cached so far. They follow the cached records' lengths: computed from the records,
    /// not a public number when the records are private.
    pub fn stored_bytes(&self) -> u64 {
        self.stored_bytes
    }

    /// The batch's hidden states `[B, T, d]` (f32, on `device`; T the longest of `tokens`,
    /// zero past each record's length) for records `idx` (positions in the cache's record set)
    /// whose token ids are `tokens`. Records not cached yet are computed first (one batch of
    /// them, with `model.prefix_hidden`) and stored. `model` must be the model (and frozen
    /// prefix) the cache was made for.
    ///
    /// # Errors
    /// Mismatched `idx` and `tokens`, an index past the record set, an empty record, a record
    /// cached with another length, or what the model and the store report.
    pub fn hidden(
        &mut self,
        model: &dyn Model,
        idx: &[usize],
        tokens: &[&[i64]],
        pad_id: i64,
        device: Device,
    ) -> Result<Tensor> {
        if idx.len() != tokens.len() || idx.is_empty() {
            return Err(ModelError::ShapeMismatch {
                what: "prefix cache request (one token record per index, at least one)".into(),
                expected: vec![idx.len() as i64],
                got: vec![tokens.len() as i64],
            });
        }
        if let Some(&i) = idx.iter().find(|&&i| i >= self.entries.len()) {
            return Err(ModelError::InvalidConfig(format!(
                "record {i} is outside the prefix cache's {} records",
                self.entries.len()
            )));
        }
        let mut missing: Vec<usize> = Vec::new();
        for (j, &i) in idx.iter().enumerate() {
            if self.entries[i].is_none() && !missing.iter().any(|&m| idx[m] == i) {
                missing.push(j);
            }
        }
        if !missing.is_empty() {
            let recs: Vec<Vec<i64>> = missing.iter().map(|&j| tokens[j].to_vec()).collect();
            let batch = Batch::from_records(&recs, pad_id, None, device)?;
            let h = model.prefix_hidden(&batch, self.layers)?;
            let size = h.size();
            if size.len() != 3 || size[2] != self.width {
                return Err(ModelError::ShapeMismatch {
                    what: format!("hidden states after {} blocks", self.layers),
                    expected: vec![recs.len() as i64, batch.seq_len(), self.width],
                    got: size,
                });
            }
            let h = h.f_to_kind(self.precision.kind())?.f_to(Device::Cpu)?;
            for (r, &j) in missing.iter().enumerate() {
                let rows = tokens[j].len() as i64;
                let e = h
                    .f_select(0, r as i64)?
                    .f_narrow(0, 0, rows)?
                    .f_contiguous()?;
                self.store(idx[j], e)?;
            }
        }
        let mut parts: Vec<Tensor> = Vec::with_capacity(idx.len());
        for (j, &i) in idx.iter().enumerate() {
            let e = self.load(i)?;
            let rows = tokens[j].len() as i64;
            if e.size().first().copied() != Some(rows) || rows == 0 {
                return Err(ModelError::ShapeMismatch {
                    what: format!("cached hidden states of record {i} (one row per token)"),
                    expected: vec![rows, self.width],
                    got: e.size(),
                });
            }
            parts.push(e);
        }
        Ok(Tensor::f_pad_sequence(&parts, true, 0.0, "right")?
            .f_to_kind(Kind::Float)?
            .f_to(device)?)
    }

    fn store(&mut self, i: usize, e: Tensor) -> Result<()> {
        let rows = e.size().first().copied().unwrap_or(0);
        let numel = e.numel();
        let bytes = numel as u64 * self.precision.bytes();
        let entry = match &mut self.backing {
            Backing::Memory => Entry::Memory(e),
            Backing::File { file, path, end } => {
                let mut buf = vec![0u8; bytes as usize];
                e.f_copy_data_u8(&mut buf, numel)?;
                let io = |err: std::io::Error| {
                    ModelError::InvalidConfig(format!(
                        "writing the prefix cache file {}: {err}",
                        path.display()
                    ))
                };
                file.seek(SeekFrom::Start(*end)).map_err(io)?;
                file.write_all(&buf).map_err(io)?;
                let offset = *end;
                *end += bytes;
                Entry::File { offset, rows }
            }
        };
        self.entries[i] = Some(entry);
        self.stored_bytes += bytes;
        Ok(())
    }

    fn load(&mut self, i: usize) -> Result<Tensor> {
        let kind = self.precision.kind();
        let width = self.width;
        let bytes_per = self.precision.bytes();
        match (&self.entries[i], &mut self.backing) {
            (Some(Entry::Memory(t)), _) => Ok(t.shallow_clone()),
            (Some(Entry::File { offset, rows }), Backing::File { file, path, .. }) => {
                let mut buf = vec![0u8; (*rows as u64 * width as u64 * bytes_per) as usize];
                let io = |err: std::io::Error| {
                    ModelError::InvalidConfig(format!(
                        "reading the prefix cache file {}: {err}",
                        path.display()
                    ))
                };
                file.seek(SeekFrom::Start(*offset)).map_err(io)?;
                file.read_exact(&mut buf).map_err(io)?;
                Ok(Tensor::f_from_data_size(&buf, &[*rows, width], kind)?)
            }
            _ => Err(ModelError::InvalidConfig(format!(
                "record {i} is not in the prefix cache"
            ))),
        }
    }
}

impl Drop for PrefixCache {
    fn drop(&mut self) {
        if let Backing::File { path, .. } = &self.backing {
            // The states are computed from the records: never leave them behind.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// How far the logits of a forward pass started from hidden states stored in `precision`
/// move from those started from the f32 states, on `batch`: the largest absolute difference
/// over the largest absolute logit. A measured check of a reduced precision on records the
/// caller chooses (public or synthetic ones: the result decides how a cache stores private
/// records, so it must not come from them).
///
/// # Errors
/// What the model reports.
pub fn precision_error(
    model: &dyn Model,
    batch: &Batch,
    layers: usize,
    precision: PrefixPrecision,
) -> Result<f64> {
    let h = model.prefix_hidden(batch, layers)?;
    let logits = |hidden: Tensor| -> Result<Tensor> {
        let mut ctx = crate::ForwardCtx::new(false);
        ctx.prefix = Some((layers, hidden));
        tch::no_grad(|| model.forward(batch, &mut ctx))
    };
    let exact = logits(h.shallow_clone())?;
    let rounded = logits(h.f_to_kind(precision.kind())?.f_to_kind(h.kind())?)?;
    let diff = exact
        .f_sub(&rounded)?
        .f_abs()?
        .f_max()?
        .f_double_value(&[])?;
    let scale = exact
        .f_abs()?
        .f_max()?
        .f_double_value(&[])?
        .max(f64::MIN_POSITIVE);
    Ok(diff / scale)
}
