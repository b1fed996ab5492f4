//! safetensors checkpoints in Hugging Face layouts, to and from a [`VarStore`] or named tensors.
//!
//! Variable names in this crate equal Hugging Face tensor names
//! (`encoder.block.0.layer.0.SelfAttention.q.weight`,
//! `model.layers.0.mlp.experts.0.gate_proj.weight`, `transformer.h.0.attn.c_attn.weight`), so a
//! checkpoint maps onto a [`VarStore`] by name. An [`HfLayout`] says what differs between the
//! file and the variables:
//!
//! - **transposed** weights: GPT-2's `Conv1D` stores `[in, out]`, our linear weights are
//!   `[out, in]`; transposed on load and on save;
//! - **tied** weights, stored once: GPT-2's `lm_head.weight` is `transformer.wte.weight`,
//!   Switch's `encoder.embed_tokens.weight` is `shared.weight`. A variable named like the alias
//!   is loaded from the source when the file lacks it, and is not written when it equals the
//!   source;
//! - **optional prefixes**: old GPT-2 checkpoints name `h.0.…` what `GPT2LMHeadModel` names
//!   `transformer.h.0.…`;
//! - tensors to **ignore** (the decoder of a full Switch checkpoint when loading the encoder,
//!   GPT-2's causal-mask buffers).
//!
//! Floating-point tensors (f16, bf16, f32, f64, fp8) are converted to each variable's kind and
//! device. Loading is all-or-nothing: every tensor is read, checked (shape, dtype) and converted
//! before any variable is written. [`LoadMode::Strict`] fails on a missing or unexpected tensor;
//! [`LoadMode::Lenient`] reports them in the [`LoadReport`]. Sharded checkpoints
//! (`model.safetensors.index.json`) load one shard at a time.
//!
//! ```
//! use raptor_models::checkpoint::{HfLayout, LoadOptions, load_var_store, save_var_store, SaveOptions};
//! use tch::{nn::VarStore, Device, Kind, Tensor};
//!
//! # fn main() -> raptor_models::Result<()> {
//! let dir = std::env::temp_dir().join(format!("raptor-ckpt-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).map_err(|e| raptor_models::ModelError::Io { path: dir.display().to_string(), source: e })?;
//! let path = dir.join("model.safetensors");
//!
//! // A GPT-2-like store: the Conv1D weight is [out, in] = [6, 4] in memory, [4, 6] on disk.
//! let vs = VarStore::new(Device::Cpu);
//! let w = vs.root().sub("transformer").sub("h").sub("0").sub("mlp").sub("c_fc")
//!     .f_var("weight", &[6, 4], tch::nn::Init::Randn { mean: 0.0, stdev: 1.0 })?;
//! save_var_store(&vs, &path, &HfLayout::gpt2(), &SaveOptions::default())?;
//! let on_disk = raptor_models::checkpoint::SafetensorsFile::open(&path)?;
//! assert_eq!(on_disk.shape("transformer.h.0.mlp.c_fc.weight"), Some(vec![4, 6]));
//!
//! let vs2 = VarStore::new(Device::Cpu);
//! let w2 = vs2.root().sub("transformer").sub("h").sub("0").sub("mlp").sub("c_fc")
//!     .f_var("weight", &[6, 4], tch::nn::Init::Const(0.0))?;
//! let report = load_var_store(&vs2, &path, &HfLayout::gpt2(), &LoadOptions::strict())?;
//! assert_eq!(report.transposed, vec!["transformer.h.0.mlp.c_fc.weight".to_string()]);
//! assert!(w2.equal(&w));
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(())
//! # }
//! ```

use crate::error::{ModelError, Result};
pub use crate::hf_config::HfLayout;
use crate::layers::any_match;
pub use crate::layers::glob_match;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use safetensors::{SafeTensors, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

/// File name of a single-file Hugging Face checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of a sharded Hugging Face checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

fn io_err(path: &Path, source: std::io::Error) -> ModelError {
    ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn corrupt(path: &Path, why: impl std::fmt::Display) -> ModelError {
    ModelError::CorruptCheckpoint {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

/// The libtorch kind of a safetensors dtype (None: no libtorch equivalent).
pub fn dtype_to_kind(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::BOOL => Kind::Bool,
        Dtype::U8 => Kind::Uint8,
        Dtype::I8 => Kind::Int8,
        Dtype::I16 => Kind::Int16,
        Dtype::I32 => Kind::Int,
        Dtype::I64 => Kind::Int64,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        Dtype::F8_E5M2 => Kind::Float8e5m2,
        Dtype::F8_E4M3 => Kind::Float8e4m3fn,
        _ => return None,
    })
}

/// The safetensors dtype of a libtorch kind (None: not representable).
pub fn kind_to_dtype(kind: Kind) -> Option<Dtype> {
    Some(match kind {
        Kind::Bool => Dtype::BOOL,
        Kind::Uint8 => Dtype::U8,
        Kind::Int8 => Dtype::I8,
        Kind::Int16 => Dtype::I16,
        Kind::Int => Dtype::I32,
        Kind::Int64 => Dtype::I64,
        Kind::Half => Dtype::F16,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        Kind::Float8e5m2 => Dtype::F8_E5M2,
        Kind::Float8e4m3fn => Dtype::F8_E4M3,
        _ => return None,
    })
}

fn is_float_kind(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Half
            | Kind::BFloat16
            | Kind::Float
            | Kind::Double
            | Kind::Float8e5m2
            | Kind::Float8e4m3fn
            | Kind::Float8e5m2fnuz
            | Kind::Float8e4m3fnuz
    )
}

/// One safetensors file, read into memory and validated (header, offsets, sizes).
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    bytes: Vec<u8>,
    data_start: usize,
    metadata: Metadata,
}

impl SafetensorsFile {
    /// Reads and validates `path`. A truncated or otherwise malformed file is a
    /// [`ModelError::CorruptCheckpoint`]; an unreadable one a [`ModelError::Io`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
        Self::from_bytes(bytes, path)
    }

    /// Validates safetensors bytes; `path` only labels errors.
    pub fn from_bytes(bytes: Vec<u8>, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let (n, metadata) = SafeTensors::read_metadata(&bytes).map_err(|e| corrupt(&path, e))?;
        Ok(Self {
            path,
            bytes,
            data_start: 8 + n,
            metadata,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.metadata.tensors().into_keys().collect();
        v.sort();
        v
    }

    /// Whether the file holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.metadata.info(name).is_some()
    }

    /// The free-form `__metadata__` of the header.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.metadata().as_ref()
    }

    /// Shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Option<Vec<i64>> {
        self.metadata
            .info(name)
            .map(|i| i.shape.iter().map(|&d| d as i64).collect())
    }

    /// Dtype of tensor `name`.
    pub fn dtype(&self, name: &str) -> Option<Dtype> {
        self.metadata.info(name).map(|i| i.dtype)
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.metadata
            .info(name)
            .ok_or_else(|| ModelError::MissingTensors {
                path: self.path.display().to_string(),
                names: vec![name.to_string()],
            })
    }

    /// Tensor `name` on the CPU, in the file's dtype.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let (data, shape, kind) = self.checked(name)?;
        Ok(Tensor::f_from_data_size(data, &shape, kind)?)
    }

    /// Tensor `name`'s bytes, shape and kind, checked against its header entry (a dtype libtorch
    /// supports, data offsets inside the file, as many bytes as the shape needs), without
    /// making a tensor.
    fn checked(&self, name: &str) -> Result<(&[u8], Vec<i64>, Kind)> {
        let info = self.info(name)?;
        let kind = dtype_to_kind(info.dtype).ok_or_else(|| ModelError::TensorDtype {
            name: name.to_string(),
            expected: "a dtype libtorch supports".into(),
            found: format!("{:?}", info.dtype),
        })?;
        let (a, b) = info.data_offsets;
        let data = self
            .bytes
            .get(self.data_start + a..self.data_start + b)
            .ok_or_else(|| {
                corrupt(
                    &self.path,
                    format!("tensor {name}: data offsets out of range"),
                )
            })?;
        let shape: Vec<i64> = info.shape.iter().map(|&d| d as i64).collect();
        let numel: usize = info.shape.iter().product();
        if data.len() != numel * kind.elt_size_in_bytes() {
            return Err(corrupt(
                &self.path,
                format!(
                    "tensor {name}: {} bytes for shape {shape:?} of {:?}",
                    data.len(),
                    info.dtype
                ),
            ));
        }
        Ok((data, shape, kind))
    }

    /// All tensors on the CPU, in the file's dtypes, sorted by name.
    pub fn tensors(&self) -> Result<Vec<(String, Tensor)>> {
        self.names()
            .into_iter()
            .map(|n| {
                let t = self.tensor(&n)?;
                Ok((n, t))
            })
            .collect()
    }
}

/// Reads every tensor of a safetensors file (CPU, file dtypes, sorted by name).
pub fn read_safetensors(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>> {
    SafetensorsFile::open(path)?.tensors()
}

struct OwnedView {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &OwnedView {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn to_view(name: &str, t: &Tensor) -> Result<OwnedView> {
    let t = t.f_detach()?.f_to_device(Device::Cpu)?.f_contiguous()?;
    let kind = t.f_kind()?;
    let dtype = kind_to_dtype(kind).ok_or_else(|| ModelError::TensorDtype {
        name: name.to_string(),
        expected: "a kind safetensors supports".into(),
        found: format!("{kind:?}"),
    })?;
    let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
    let numel: usize = shape.iter().product();
    let mut data = vec![0u8; numel * kind.elt_size_in_bytes()];
    if numel > 0 {
        t.f_copy_data_u8(&mut data, numel)?;
    }
    Ok(OwnedView { dtype, shape, data })
}

/// Writes named tensors (any device; contiguous copies are made) to a safetensors file.
/// Duplicate names are an error. `metadata` goes into the header's `__metadata__`.
pub fn write_safetensors(
    path: impl AsRef<Path>,
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let path = path.as_ref();
    let mut views: BTreeMap<String, OwnedView> = BTreeMap::new();
    for (name, t) in tensors {
        if views.insert(name.clone(), to_view(name, t)?).is_some() {
            return Err(ModelError::InvalidConfig(format!(
                "tensor name {name} appears twice in what is to be written to {}",
                path.display()
            )));
        }
    }
    safetensors::serialize_to_file(views.iter().map(|(k, v)| (k.as_str(), v)), metadata, path)
        .map_err(|e| match e {
            safetensors::SafeTensorError::IoError(io) => io_err(path, io),
            other => corrupt(path, other),
        })
}

/// Strict or lenient loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadMode {
    /// Every variable must be found (except `allow_missing` ones) and every checkpoint tensor
    /// used (except the layout's ignored ones); otherwise nothing is loaded and the error names
    /// the tensors.
    Strict,
    /// Variables not in the checkpoint keep their values; unused checkpoint tensors are
    /// skipped. Both are listed in the [`LoadReport`].
    Lenient,
}

/// Options of [`load_var_store`] / [`load_named`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// Strict or lenient.
    pub mode: LoadMode,
    /// Variables that may be absent even in strict mode (patterns): heads and adapters that a
    /// pretrained checkpoint does not have.
    pub allow_missing: Vec<String>,
}

impl LoadOptions {
    /// Strict, with the adapters and task heads of this crate allowed to be missing
    /// (`*.lora_A.weight`, `*.lora_B.weight`, `classifier.*`, `score.*`).
    pub fn strict() -> Self {
        Self {
            mode: LoadMode::Strict,
            allow_missing: [
                "*.lora_A.weight",
                "*.lora_B.weight",
                "classifier.*",
                "score.*",
            ]
            .map(String::from)
            .to_vec(),
        }
    }

    /// Strict with nothing allowed to be missing.
    pub fn exact() -> Self {
        Self {
            mode: LoadMode::Strict,
            allow_missing: vec![],
        }
    }

    /// Lenient.
    pub fn lenient() -> Self {
        Self {
            mode: LoadMode::Lenient,
            allow_missing: vec![],
        }
    }

    /// Adds a pattern of variables allowed to be missing.
    pub fn allow_missing(mut self, pattern: &str) -> Self {
        self.allow_missing.push(pattern.to_string());
        self
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self::strict()
    }
}

/// What a load did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Variables loaded (variable names), sorted.
    pub loaded: Vec<String>,
    /// Variables not found in the checkpoint (kept their values), sorted.
    pub missing: Vec<String>,
    /// Checkpoint tensors not used (and not ignored by the layout), sorted.
    pub unexpected: Vec<String>,
    /// Variables loaded through a tie: `(variable, checkpoint tensor)`.
    pub tied: Vec<(String, String)>,
    /// Variables loaded under another checkpoint name (a stripped prefix): `(variable, tensor)`.
    pub renamed: Vec<(String, String)>,
    /// Variables transposed on load.
    pub transposed: Vec<String>,
    /// Variables whose checkpoint dtype differed from their kind: `(variable, dtype)`.
    pub converted: Vec<(String, String)>,
    /// What the `config.json` said that was read as transformers reads it rather than as
    /// written (e.g. [`crate::hf_config::HfSwitchConfig::warnings`]): show these to the user.
    pub config_warnings: Vec<String>,
}

/// Where a checkpoint's tensors are: one file, or shards with their name → file map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointFiles {
    /// What was given (a file, an index, or a directory): labels errors.
    pub source: PathBuf,
    /// The safetensors files.
    pub files: Vec<PathBuf>,
    /// For sharded checkpoints: tensor name → index into `files`.
    pub weight_map: Option<BTreeMap<String, usize>>,
}

/// Finds a checkpoint: a `.safetensors` file, a `model.safetensors.index.json`, or a directory
/// holding either (`model.safetensors` preferred).
pub fn resolve_checkpoint(path: impl AsRef<Path>) -> Result<CheckpointFiles> {
    let path = path.as_ref();
    let meta = std::fs::metadata(path).map_err(|e| io_err(path, e))?;
    if meta.is_dir() {
        let single = path.join(SINGLE_FILE);
        if single.is_file() {
            return resolve_checkpoint(single);
        }
        let index = path.join(INDEX_FILE);
        if index.is_file() {
            return resolve_checkpoint(index);
        }
        return Err(io_err(
            path,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no {SINGLE_FILE} or {INDEX_FILE} in this directory"),
            ),
        ));
    }
    let is_index = path.to_string_lossy().ends_with(".json");
    if !is_index {
        return Ok(CheckpointFiles {
            source: path.to_path_buf(),
            files: vec![path.to_path_buf()],
            weight_map: None,
        });
    }
    let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| corrupt(path, format!("index is not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| corrupt(path, "index has no \"weight_map\" object"))?;
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    let mut by_file: BTreeMap<String, usize> = BTreeMap::new();
    let mut weight_map = BTreeMap::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| {
            corrupt(
                path,
                format!("weight_map entry of {name} is not a file name"),
            )
        })?;
        if file.contains('/') || file.contains('\\') || file.starts_with('.') {
            return Err(corrupt(
                path,
                format!("weight_map entry of {name} ({file:?}) is not a plain file name"),
            ));
        }
        let idx = match by_file.get(file) {
            Some(&i) => i,
            None => {
                files.push(dir.join(file));
                by_file.insert(file.to_string(), files.len() - 1);
                files.len() - 1
            }
        };
        weight_map.insert(name.clone(), idx);
    }
    Ok(CheckpointFiles {
        source: path.to_path_buf(),
        files,
        weight_map: Some(weight_map),
    })
}

struct Planned {
    var: String,
    file_name: String,
    transposed: bool,
}

/// Loads a checkpoint into a [`VarStore`] (see the module docs). Nothing is written unless every
/// tensor checks out.
pub fn load_var_store(
    vs: &VarStore,
    source: impl AsRef<Path>,
    layout: &HfLayout,
    opts: &LoadOptions,
) -> Result<LoadReport> {
    load_named(&vs.variables(), source, layout, opts)
}

/// Loads a checkpoint into named tensors (copied in place, so tensors that share storage with a
/// [`VarStore`]'s variables update it).
pub fn load_named(
    vars: &HashMap<String, Tensor>,
    source: impl AsRef<Path>,
    layout: &HfLayout,
    opts: &LoadOptions,
) -> Result<LoadReport> {
    let ckpt = resolve_checkpoint(source)?;
    let label = ckpt.source.display().to_string();

    // Open single files now; shards one at a time below.
    let single = match &ckpt.weight_map {
        None => Some(SafetensorsFile::open(&ckpt.files[0])?),
        Some(_) => None,
    };
    let available: BTreeSet<String> = match (&single, &ckpt.weight_map) {
        (Some(f), _) => f.names().into_iter().collect(),
        (None, Some(m)) => m.keys().cloned().collect(),
        (None, None) => BTreeSet::new(),
    };

    let mut report = LoadReport::default();
    let mut plan: Vec<Planned> = Vec::new();
    let mut missing_fatal = Vec::new();
    let mut var_names: Vec<&String> = vars.keys().collect();
    var_names.sort();
    for var in var_names {
        let found = layout
            .candidates(var)
            .into_iter()
            .find(|(n, _)| available.contains(n));
        match found {
            Some((file_name, via_tie)) => {
                if via_tie {
                    report.tied.push((var.clone(), file_name.clone()));
                } else if &file_name != var {
                    report.renamed.push((var.clone(), file_name.clone()));
                }
                plan.push(Planned {
                    var: var.clone(),
                    transposed: layout.is_transposed(var),
                    file_name,
                });
            }
            None => {
                report.missing.push(var.clone());
                if opts.mode == LoadMode::Strict && !any_match(&opts.allow_missing, var) {
                    missing_fatal.push(var.clone());
                }
            }
        }
    }
    let used: BTreeSet<&str> = plan.iter().map(|p| p.file_name.as_str()).collect();
    // Unused tensors: ignored by the layout, stored copies of a tied weight (checked equal to
    // their source below), or unexpected.
    let mut alias_checks: Vec<(String, String)> = Vec::new();
    for n in available.iter().filter(|n| !used.contains(n.as_str())) {
        if any_match(&layout.ignore_unexpected, n) {
            continue;
        }
        match layout.tied_source_in(n, &available) {
            Some(src) => alias_checks.push((n.clone(), src)),
            None => report.unexpected.push(n.clone()),
        }
    }
    if !missing_fatal.is_empty() {
        return Err(ModelError::MissingTensors {
            path: label,
            names: missing_fatal,
        });
    }
    if opts.mode == LoadMode::Strict && !report.unexpected.is_empty() {
        return Err(ModelError::UnexpectedTensors {
            path: label,
            names: report.unexpected,
        });
    }

    let read_one = |name: &str| -> Result<Tensor> {
        match (&single, &ckpt.weight_map) {
            (Some(f), _) => f.tensor(name),
            (None, Some(map)) => {
                let fi = map.get(name).copied().unwrap_or(0);
                SafetensorsFile::open(&ckpt.files[fi])?.tensor(name)
            }
            (None, None) => Err(ModelError::MissingTensors {
                path: label.clone(),
                names: vec![name.to_string()],
            }),
        }
    };
    for (alias, src) in alias_checks {
        let (a, b) = (read_one(&alias)?, read_one(&src)?);
        let same = a.size() == b.size()
            && a.f_to_kind(Kind::Double)?
                .f_equal(&b.f_to_kind(Kind::Double)?)
                .unwrap_or(false);
        if !same {
            if opts.mode == LoadMode::Strict {
                return Err(ModelError::UnexpectedTensors {
                    path: label,
                    names: vec![format!(
                        "{alias} (differs from {src}, to which this layout ties it)"
                    )],
                });
            }
            report.unexpected.push(alias);
        }
    }

    // Check everything before writing anything. A single file stays open, so its tensors are
    // made and copied one at a time after the checks (the model's weights are then held once
    // more than the file, not twice: 0.3 GB less at the peak for MiniLM upcycled to 8 experts);
    // a sharded checkpoint's tensors are made shard by shard and copied after the last.
    let mut staged: Vec<(usize, Tensor)> = Vec::with_capacity(plan.len());
    let mut checked: Vec<usize> = Vec::with_capacity(plan.len());
    let mut stage_from = |file: &SafetensorsFile,
                          which: &[usize],
                          report: &mut LoadReport,
                          make: bool|
     -> Result<()> {
        for &i in which {
            let p = &plan[i];
            let var = &vars[&p.var];
            let var_kind = var.f_kind()?;
            let dtype = file.dtype(&p.file_name).ok_or_else(|| {
                corrupt(
                    file.path(),
                    format!(
                        "the index places {} in this shard but it is not there",
                        p.file_name
                    ),
                )
            })?;
            let file_kind = dtype_to_kind(dtype);
            let compatible = match file_kind {
                Some(k) if k == var_kind => true,
                Some(k) => is_float_kind(k) && is_float_kind(var_kind),
                None => false,
            };
            if !compatible {
                return Err(ModelError::TensorDtype {
                    name: p.file_name.clone(),
                    expected: format!("{var_kind:?}"),
                    found: format!("{dtype:?}"),
                });
            }
            let var_shape = var.size();
            let file_shape = file.shape(&p.file_name).unwrap_or_default();
            let expected: Vec<i64> = if p.transposed {
                if var_shape.len() != 2 {
                    return Err(ModelError::InvalidConfig(format!(
                        "variable {} is marked transposed but is not a matrix (shape {var_shape:?})",
                        p.var
                    )));
                }
                vec![var_shape[1], var_shape[0]]
            } else {
                var_shape.clone()
            };
            if file_shape != expected {
                return Err(ModelError::ShapeMismatch {
                    what: format!("checkpoint tensor {} (for variable {})", p.file_name, p.var),
                    expected,
                    got: file_shape,
                });
            }
            file.checked(&p.file_name)?;
            if p.transposed {
                report.transposed.push(p.var.clone());
            }
            if Some(var_kind) != file_kind {
                report.converted.push((p.var.clone(), format!("{dtype:?}")));
            }
            if make {
                staged.push((i, converted(file, p, var)?));
            } else {
                checked.push(i);
            }
        }
        Ok(())
    };
    match (&single, &ckpt.weight_map) {
        (Some(f), _) => {
            let all: Vec<usize> = (0..plan.len()).collect();
            stage_from(f, &all, &mut report, false)?;
        }
        (None, Some(map)) => {
            for (fi, path) in ckpt.files.iter().enumerate() {
                let which: Vec<usize> = (0..plan.len())
                    .filter(|&i| map.get(&plan[i].file_name) == Some(&fi))
                    .collect();
                if which.is_empty() {
                    continue;
                }
                let f = SafetensorsFile::open(path)?;
                stage_from(&f, &which, &mut report, true)?;
            }
        }
        (None, None) => {}
    }

    tch::no_grad(|| -> Result<()> {
        if let Some(f) = &single {
            for &i in &checked {
                let mut var = vars[&plan[i].var].shallow_clone();
                let t = converted(f, &plan[i], &var)?;
                var.f_copy_(&t)?;
            }
        }
        for (i, t) in &staged {
            let mut var = vars[&plan[*i].var].shallow_clone();
            var.f_copy_(t)?;
        }
        Ok(())
    })?;
    report.loaded = plan.into_iter().map(|p| p.var).collect();
    report.transposed.sort();
    report.converted.sort();
    Ok(report)
}

/// Planned tensor `p` of `file` as its variable `var` takes it: transposed where the layout
/// says, in the variable's kind, on its device.
fn converted(file: &SafetensorsFile, p: &Planned, var: &Tensor) -> Result<Tensor> {
    let mut t = file.tensor(&p.file_name)?;
    if p.transposed {
        t = t.f_t_copy()?;
    }
    let kind = var.f_kind()?;
    if t.kind() != kind {
        t = t.f_to_kind(kind)?;
    }
    Ok(t.f_to_device(var.device())?)
}

/// Options of [`save_var_store`] / [`save_named`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SaveOptions {
    /// Convert floating-point tensors to this kind (e.g. `Kind::BFloat16`); None keeps kinds.
    pub kind: Option<Kind>,
    /// Header `__metadata__` (`format: pt` is added, as Hugging Face loaders expect it).
    pub metadata: HashMap<String, String>,
    /// Variables not to write (patterns), e.g. `*.lora_A.weight` to save only the base model.
    pub skip: Vec<String>,
}

/// Saves a [`VarStore`] as one safetensors file in the layout's Hugging Face form. Returns the
/// checkpoint names written.
pub fn save_var_store(
    vs: &VarStore,
    path: impl AsRef<Path>,
    layout: &HfLayout,
    opts: &SaveOptions,
) -> Result<Vec<String>> {
    save_named(&vs.variables(), path, layout, opts)
}

/// Saves named tensors as one safetensors file in the layout's Hugging Face form: transposed
/// weights written `[in, out]`, a tied alias left out when it equals its source.
pub fn save_named(
    vars: &HashMap<String, Tensor>,
    path: impl AsRef<Path>,
    layout: &HfLayout,
    opts: &SaveOptions,
) -> Result<Vec<String>> {
    let mut out: Vec<(String, Tensor)> = Vec::new();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    for name in names {
        if any_match(&opts.skip, name) {
            continue;
        }
        let t = &vars[name];
        let tied_dup = layout.tied.iter().any(|(alias, source)| {
            alias == name
                && vars
                    .get(source)
                    .is_some_and(|s| s.size() == t.size() && s.f_equal(t).unwrap_or(false))
        });
        if tied_dup {
            continue;
        }
        let mut t = t.f_detach()?;
        if layout.is_transposed(name) {
            if t.dim() != 2 {
                return Err(ModelError::InvalidConfig(format!(
                    "variable {name} is marked transposed but is not a matrix (shape {:?})",
                    t.size()
                )));
            }
            t = t.f_t_copy()?;
        }
        if let Some(k) = opts.kind
            && is_float_kind(t.f_kind()?)
        {
            t = t.f_to_kind(k)?;
        }
        out.push((name.clone(), t));
    }
    let mut meta = opts.metadata.clone();
    meta.entry("format".into()).or_insert_with(|| "pt".into());
    write_safetensors(path, &out, Some(meta))?;
    Ok(out.into_iter().map(|(n, _)| n).collect())
}

/// Writes `model` as a Hugging Face folder: `config.json` (from [`crate::Model::hf_config_json`])
/// and `model.safetensors` in the family's layout, LoRA adapters left out. The folder loads back
/// with [`load_switch_encoder`] / [`load_gpt2`]. Both files are written to temporary names and
/// renamed, so an interrupted export leaves no half-written checkpoint under the final names.
pub fn save_pretrained<M: crate::Model + ?Sized>(model: &M, dir: impl AsRef<Path>) -> Result<()> {
    save_pretrained_without(model, dir, &[])
}

/// [`save_pretrained`] leaving out the variables that match `skip` (patterns, e.g.
/// `classifier.*` for a head the source checkpoint did not have).
pub fn save_pretrained_without<M: crate::Model + ?Sized>(
    model: &M,
    dir: impl AsRef<Path>,
    skip: &[&str],
) -> Result<()> {
    let dir = dir.as_ref();
    let config = model.hf_config_json().ok_or_else(|| {
        ModelError::InvalidConfig(
            "this model family (or its sparse-layer layout) cannot be exported as a Hugging Face folder"
                .into(),
        )
    })?;
    let model_type = config
        .get("model_type")
        .and_then(|v| v.as_str())
        .ok_or_else(|| ModelError::InvalidConfig("exported config lacks model_type".into()))?
        .to_string();
    let layout = HfLayout::for_model_type(&model_type)?;
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let mut opts = SaveOptions {
        skip: vec!["*.lora_A.weight".into(), "*.lora_B.weight".into()],
        ..SaveOptions::default()
    };
    opts.skip.extend(skip.iter().map(|p| p.to_string()));
    let tmp = dir.join(format!("{SINGLE_FILE}.tmp"));
    save_var_store(model.var_store(), &tmp, &layout, &opts)?;
    let text = serde_json::to_string_pretty(&config)
        .map_err(|e| ModelError::InvalidConfig(format!("config.json: {e}")))?;
    let ctmp = dir.join("config.json.tmp");
    std::fs::write(&ctmp, text).map_err(|e| io_err(&ctmp, e))?;
    let single = dir.join(SINGLE_FILE);
    std::fs::rename(&tmp, &single).map_err(|e| io_err(&single, e))?;
    let cfg = dir.join("config.json");
    std::fs::rename(&ctmp, &cfg).map_err(|e| io_err(&cfg, e))?;
    Ok(())
}

/// A pretrained model read from a Hugging Face directory (`config.json` + safetensors).
#[derive(Debug)]
pub struct Pretrained<M> {
    /// The model, weights loaded.
    pub model: M,
    /// The parsed `config.json`.
    pub config: crate::hf_config::HfConfig,
    /// What the load did (missing heads and adapters, ties, transpositions, conversions).
    pub report: LoadReport,
}

fn load_into<M: crate::Model>(
    model: M,
    dir: &Path,
    config: crate::hf_config::HfConfig,
    opts: &LoadOptions,
) -> Result<Pretrained<M>> {
    let mut report = load_var_store(model.var_store(), dir, &config.layout(), opts)?;
    if let crate::hf_config::HfConfig::Switch(c) = &config {
        report.config_warnings.extend(c.warnings.iter().cloned());
    }
    Ok(Pretrained {
        model,
        config,
        report,
    })
}

fn expect_type(dir: &Path, config: &crate::hf_config::HfConfig, want: &str) -> Result<()> {
    if config.model_type() == want {
        Ok(())
    } else {
        Err(ModelError::HfConfig {
            path: dir.join("config.json").display().to_string(),
            field: "model_type".into(),
            why: format!("expected {want:?}, found {:?}", config.model_type()),
        })
    }
}

/// Builds a [`crate::SwitchEncoder`] (with a new `num_labels`-way head, capacity off) from a
/// Hugging Face SwitchTransformers directory and loads its encoder weights.
pub fn load_switch_encoder(
    dir: impl AsRef<Path>,
    num_labels: i64,
    device: Device,
    opts: &LoadOptions,
) -> Result<Pretrained<crate::SwitchEncoder>> {
    let dir = dir.as_ref();
    let config = crate::hf_config::HfConfig::from_file(dir)?;
    expect_type(dir, &config, "switch_transformers")?;
    let crate::hf_config::HfConfig::Switch(c) = &config else {
        return Err(ModelError::InvalidConfig("not a Switch config".into()));
    };
    let model = crate::SwitchEncoder::new(c.to_model_config(num_labels)?, device)?;
    load_into(model, dir, config, opts)
}

/// Builds a [`crate::OlmoeDecoder`] with `head` from a Hugging Face OLMoE directory and loads
/// its weights.
pub fn load_olmoe(
    dir: impl AsRef<Path>,
    head: crate::DecoderHead,
    device: Device,
    opts: &LoadOptions,
) -> Result<Pretrained<crate::OlmoeDecoder>> {
    let dir = dir.as_ref();
    let config = crate::hf_config::HfConfig::from_file(dir)?;
    expect_type(dir, &config, "olmoe")?;
    let crate::hf_config::HfConfig::Olmoe(c) = &config else {
        return Err(ModelError::InvalidConfig("not an OLMoE config".into()));
    };
    let model = crate::OlmoeDecoder::new(c.to_model_config(head)?, device)?;
    load_into(model, dir, config, opts)
}

/// Builds a [`crate::Gpt2`] with `head` from a Hugging Face GPT-2 directory and loads its
/// weights.
pub fn load_gpt2(
    dir: impl AsRef<Path>,
    head: crate::DecoderHead,
    device: Device,
    opts: &LoadOptions,
) -> Result<Pretrained<crate::Gpt2>> {
    let dir = dir.as_ref();
    let config = crate::hf_config::HfConfig::from_file(dir)?;
    expect_type(dir, &config, "gpt2")?;
    let crate::hf_config::HfConfig::Gpt2(c) = &config else {
        return Err(ModelError::InvalidConfig("not a GPT-2 config".into()));
    };
    let model = crate::Gpt2::new(c.to_model_config(head)?, device)?;
    load_into(model, dir, config, opts)
}

/// Builds a [`crate::Decoder`] with `head` from a Hugging Face Llama, Mixtral or Qwen2-MoE
/// directory (dispatching on `config.json`'s `model_type`) and loads its weights.
pub fn load_decoder(
    dir: impl AsRef<Path>,
    head: crate::DecoderHead,
    device: Device,
    opts: &LoadOptions,
) -> Result<Pretrained<crate::Decoder>> {
    let dir = dir.as_ref();
    let config = crate::hf_config::HfConfig::from_file(dir)?;
    let crate::hf_config::HfConfig::Decoder(c) = &config else {
        return Err(ModelError::HfConfig {
            path: dir.join("config.json").display().to_string(),
            field: "model_type".into(),
            why: format!(
                "expected llama, mixtral or qwen2_moe, found {:?}",
                config.model_type()
            ),
        });
    };
    let model = crate::Decoder::new(c.to_model_config(head)?, device)?;
    load_into(model, dir, config, opts)
}

/// Builds a [`crate::Bert`] classifier (`num_labels` classes, `pooling`) from a Hugging Face
/// BERT directory (`BertModel` or `BertForSequenceClassification`) and loads its weights (a
/// `BertModel` lacks `classifier.*`, which [`LoadOptions::strict`] allows).
pub fn load_bert(
    dir: impl AsRef<Path>,
    num_labels: i64,
    pooling: crate::BertPooling,
    device: Device,
    opts: &LoadOptions,
) -> Result<Pretrained<crate::Bert>> {
    let dir = dir.as_ref();
    let config = crate::hf_config::HfConfig::from_file(dir)?;
    expect_type(dir, &config, "bert")?;
    let crate::hf_config::HfConfig::Bert(c) = &config else {
        return Err(ModelError::InvalidConfig("not a BERT config".into()));
    };
    let model = crate::Bert::new(c.to_model_config(num_labels, pooling)?, device)?;
    load_into(model, dir, config, opts)
}
