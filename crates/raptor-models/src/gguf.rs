//! GGUF files (the llama.cpp model format, versions 2 and 3): header, metadata, tensor
//! directory, and dequantization of `F32`, `F16`, `BF16`, `Q4_0`, `Q4_1` and `Q8_0` tensors to
//! f32.
//!
//! Layout of a (little-endian) GGUF file:
//!
//! ```text
//! "GGUF"  u32 version  u64 tensor_count  u64 metadata_count
//! metadata_count × (string key, u32 value type, value)
//! tensor_count   × (string name, u32 n_dims, n_dims × u64 ne, u32 ggml type, u64 offset)
//! padding to `general.alignment` (default 32)
//! tensor data: each tensor at data_start + offset
//! ```
//!
//! A string is a u64 byte length then UTF-8 bytes; an array is a u32 element type, a u64 count,
//! then the elements. `ne[0]` is the fastest-varying dimension, so a tensor's libtorch shape is
//! `ne` reversed (`token_embd.weight` with `ne = [576, 49152]` is `[49152, 576]`).
//!
//! Reading never panics on bad input and never allocates more than a small multiple of the
//! file's size: every count and length read from the file is checked against the bytes left
//! before anything is reserved for it, so a header claiming 2⁶⁴ − 1 tensors is
//! [`ModelError::CorruptGguf`], not an allocation. Tensor extents are checked against the file
//! when it is opened.
//!
//! Quantized blocks (32 values each; `d`, `m` are little-endian f16 read exactly):
//!
//! | type | block bytes | value `j` |
//! |---|---|---|
//! | `Q4_0` | `d`, 16 bytes of nibbles | `(nibble_j − 8)·d` |
//! | `Q4_1` | `d`, `m`, 16 bytes of nibbles | `nibble_j·d + m` |
//! | `Q8_0` | `d`, 32 × i8 | `q_j·d` |
//!
//! where nibble `j < 16` is the low half of byte `j` and nibble `j ≥ 16` the high half of byte
//! `j − 16`. The products and sums are single f32 operations, as in the reference dequantizers,
//! so the values are bit-exact.
//!
//! ```no_run
//! use raptor_models::gguf::GgufFile;
//! let f = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! println!("{:?}", f.get("general.architecture"));
//! let (shape, values) = f.tensor_f32("token_embd.weight")?;
//! assert_eq!(values.len() as i64, shape.iter().product::<i64>());
//! # Ok::<(), raptor_models::ModelError>(())
//! ```

use crate::error::{ModelError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The magic bytes at the start of every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of the tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7 (one byte, 0 or 1).
    Bool(bool),
    /// Type 8.
    String(String),
    /// Type 9: elements of one type.
    Array(Vec<GgufValue>),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, when it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A ggml tensor type (the ids GGUF stores).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 4-bit, 32 per block, scale only.
    Q4_0,
    /// 4-bit, 32 per block, scale and minimum.
    Q4_1,
    /// 5-bit, 32 per block (not dequantized here).
    Q5_0,
    /// 5-bit with minimum (not dequantized here).
    Q5_1,
    /// 8-bit, 32 per block, scale only.
    Q8_0,
    /// 8-bit with sum (not dequantized here).
    Q8_1,
    /// k-quant 2-bit (not dequantized here).
    Q2K,
    /// k-quant 3-bit (not dequantized here).
    Q3K,
    /// k-quant 4-bit (not dequantized here).
    Q4K,
    /// k-quant 5-bit (not dequantized here).
    Q5K,
    /// k-quant 6-bit (not dequantized here).
    Q6K,
    /// k-quant 8-bit (not dequantized here).
    Q8K,
    /// 8-bit integer.
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 64-bit float.
    F64,
}

impl GgmlType {
    /// The type of a GGUF type id, None for ids this reader does not know.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            15 => Self::Q8K,
            24 => Self::I8,
            25 => Self::I16,
            26 => Self::I32,
            27 => Self::I64,
            28 => Self::F64,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2K => 10,
            Self::Q3K => 11,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::Q8K => 15,
            Self::I8 => 24,
            Self::I16 => 25,
            Self::I32 => 26,
            Self::I64 => 27,
            Self::F64 => 28,
            Self::BF16 => 30,
        }
    }

    /// (values per block, bytes per block).
    pub fn block(self) -> (u64, u64) {
        match self {
            Self::F32 | Self::I32 => (1, 4),
            Self::F16 | Self::BF16 | Self::I16 => (1, 2),
            Self::I8 => (1, 1),
            Self::I64 | Self::F64 => (1, 8),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q8_1 => (32, 36),
            Self::Q2K => (256, 84),
            Self::Q3K => (256, 110),
            Self::Q4K => (256, 144),
            Self::Q5K => (256, 176),
            Self::Q6K => (256, 210),
            Self::Q8K => (256, 292),
        }
    }

    /// Whether [`dequantize`] reads this type.
    pub fn dequantizable(self) -> bool {
        matches!(
            self,
            Self::F32 | Self::F16 | Self::BF16 | Self::Q4_0 | Self::Q4_1 | Self::Q8_0
        )
    }

    /// The name llama.cpp uses (`Q4_1`, `F16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q8K => "Q8_K",
            Self::I8 => "I8",
            Self::I16 => "I16",
            Self::I32 => "I32",
            Self::I64 => "I64",
            Self::F64 => "F64",
        }
    }
}

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// Tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in ggml order (`ne[0]` fastest).
    pub ne: Vec<u64>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Bytes of the tensor's data.
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// Number of values.
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// The libtorch shape (`ne` reversed).
    pub fn shape(&self) -> Vec<i64> {
        self.ne.iter().rev().map(|&d| d as i64).collect()
    }
}

/// A GGUF file read into memory (metadata parsed, tensor extents checked).
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    alignment: u64,
    data_start: u64,
    bytes: Vec<u8>,
}

/// A bounds-checked little-endian cursor.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, why: impl Into<String>) -> ModelError {
        ModelError::CorruptGguf {
            path: self.path.display().to_string(),
            offset: self.pos as u64,
            why: why.into(),
        }
    }

    fn left(&self) -> u64 {
        (self.b.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(self.err(format!(
                "{what}: needs {n} bytes, only {} left in the file",
                self.left()
            )));
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        let at = self.pos;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|e| ModelError::CorruptGguf {
            path: self.path.display().to_string(),
            offset: at as u64,
            why: format!("{what}: not UTF-8 ({e})"),
        })
    }

    /// Fails unless `count` items of at least `min_bytes` each fit in the bytes left.
    fn check_count(&self, count: u64, min_bytes: u64, what: &str) -> Result<usize> {
        match count.checked_mul(min_bytes) {
            Some(n) if n <= self.left() => usize::try_from(count).map_err(|_| self.err(what)),
            _ => Err(self.err(format!(
                "{what}: count {count} cannot fit in the {} bytes left",
                self.left()
            ))),
        }
    }

    fn value(&mut self, ty: u32, depth: u32, what: &str) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(u8::from_le_bytes(self.arr(what)?)),
            1 => GgufValue::I8(i8::from_le_bytes(self.arr(what)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.arr(what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.arr(what)?)),
            4 => GgufValue::U32(self.u32(what)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.arr(what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.arr(what)?)),
            7 => match self.arr::<1>(what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.err(format!("{what}: bool byte {b} is neither 0 nor 1"))),
            },
            8 => GgufValue::String(self.string(what)?),
            9 => {
                if depth >= 4 {
                    return Err(self.err(format!("{what}: arrays nested deeper than 4")));
                }
                let ety = self.u32(what)?;
                let count = self.u64(what)?;
                let min = min_value_bytes(ety)
                    .ok_or_else(|| self.err(format!("{what}: unknown array element type {ety}")))?;
                let n = self.check_count(count, min, what)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(ety, depth + 1, what)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::U64(self.u64(what)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.arr(what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.arr(what)?)),
            t => return Err(self.err(format!("{what}: unknown value type {t}"))),
        })
    }
}

/// The fewest bytes a value of type `ty` occupies (None for unknown types).
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

impl GgufFile {
    /// Reads and parses a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(bytes, path)
    }

    /// Parses GGUF bytes (`path` names them in errors).
    pub fn from_bytes(bytes: Vec<u8>, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let (version, metadata, tensors, alignment, data_start) = {
            let mut c = Cursor {
                b: &bytes,
                pos: 0,
                path: &path,
            };
            let magic = c.arr::<4>("magic")?;
            if magic != GGUF_MAGIC {
                return Err(c.err(format!("magic {magic:?} is not \"GGUF\"")));
            }
            let version = c.u32("version")?;
            if version != 2 && version != 3 {
                return Err(ModelError::GgufUnsupported {
                    path: path.display().to_string(),
                    what: format!(
                        "version {version} (versions 2 and 3 are read; a big-endian file shows a \
                         byte-swapped version)"
                    ),
                });
            }
            let n_tensors = c.u64("tensor count")?;
            let n_kv = c.u64("metadata count")?;
            // A key/value pair is at least 8 (key length) + 4 (type) + 1 bytes.
            let n_kv = c.check_count(n_kv, 13, "metadata count")?;
            let mut metadata = BTreeMap::new();
            for _ in 0..n_kv {
                let key = c.string("metadata key")?;
                let ty = c.u32(&format!("type of {key}"))?;
                let v = c.value(ty, 0, &key)?;
                if metadata.insert(key.clone(), v).is_some() {
                    return Err(c.err(format!("metadata key {key} appears twice")));
                }
            }
            // A tensor info is at least 8 (name length) + 4 + 4 + 8 bytes.
            let n_tensors = c.check_count(n_tensors, 24, "tensor count")?;
            let mut raw = Vec::with_capacity(n_tensors);
            for _ in 0..n_tensors {
                let name = c.string("tensor name")?;
                let n_dims = c.u32(&format!("{name}: n_dims"))?;
                if n_dims > 8 {
                    return Err(c.err(format!("{name}: {n_dims} dimensions (at most 8)")));
                }
                let mut ne = Vec::with_capacity(n_dims as usize);
                for _ in 0..n_dims {
                    ne.push(c.u64(&format!("{name}: dimension"))?);
                }
                let ty = c.u32(&format!("{name}: type"))?;
                let offset = c.u64(&format!("{name}: offset"))?;
                raw.push((name, ne, ty, offset));
            }
            let alignment = match metadata.get("general.alignment") {
                None => DEFAULT_ALIGNMENT,
                Some(v) => match v.as_u64() {
                    Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
                    _ => {
                        return Err(c.err(format!(
                            "general.alignment {v:?} is not a power of two up to 2^20"
                        )));
                    }
                },
            };
            let end_of_header = c.pos as u64;
            let data_start = end_of_header.div_ceil(alignment) * alignment;
            let file_len = bytes.len() as u64;
            let mut tensors = Vec::with_capacity(raw.len());
            let mut seen = std::collections::HashSet::new();
            for (name, ne, ty, offset) in raw {
                let bad = |why: String| ModelError::CorruptGguf {
                    path: path.display().to_string(),
                    offset: end_of_header,
                    why: format!("tensor {name}: {why}"),
                };
                if !seen.insert(name.clone()) {
                    return Err(bad("appears twice".into()));
                }
                let ggml_type =
                    GgmlType::from_id(ty).ok_or_else(|| ModelError::GgufUnsupported {
                        path: path.display().to_string(),
                        what: format!("tensor {name}: ggml type id {ty}"),
                    })?;
                let (per_block, block_bytes) = ggml_type.block();
                let n = ne
                    .iter()
                    .try_fold(1u64, |a, &d| a.checked_mul(d))
                    .filter(|&n| n <= i64::MAX as u64)
                    .ok_or_else(|| bad(format!("dimensions {ne:?} overflow")))?;
                if ne.first().is_some_and(|&d0| !d0.is_multiple_of(per_block)) {
                    return Err(bad(format!(
                        "first dimension {} is not a multiple of the {} block size {per_block}",
                        ne[0],
                        ggml_type.name()
                    )));
                }
                let n_bytes = (n / per_block)
                    .checked_mul(block_bytes)
                    .ok_or_else(|| bad("byte size overflows".into()))?;
                if !offset.is_multiple_of(alignment) {
                    return Err(bad(format!(
                        "offset {offset} is not a multiple of the alignment {alignment}"
                    )));
                }
                let end = data_start
                    .checked_add(offset)
                    .and_then(|s| s.checked_add(n_bytes));
                if end.is_none_or(|e| e > file_len) {
                    return Err(bad(format!(
                        "data [{offset}, +{n_bytes}) after the data start {data_start} runs past \
                         the end of the {file_len}-byte file"
                    )));
                }
                tensors.push(GgufTensorInfo {
                    name,
                    ne,
                    ggml_type,
                    offset,
                    n_bytes,
                });
            }
            (version, metadata, tensors, alignment, data_start)
        };
        Ok(Self {
            path,
            version,
            metadata,
            tensors,
            alignment,
            data_start,
            bytes,
        })
    }

    /// The file path given when opening.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata key/value.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// A tensor's directory entry.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Offset of the data section in the file.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// The raw bytes of a tensor.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let t = self.tensor_info(name).ok_or_else(|| self.missing(name))?;
        // In bounds: checked when the file was parsed.
        let start = (self.data_start + t.offset) as usize;
        self.bytes
            .get(start..start + t.n_bytes as usize)
            .ok_or_else(|| ModelError::CorruptGguf {
                path: self.path.display().to_string(),
                offset: start as u64,
                why: format!("tensor {name} runs past the end of the file"),
            })
    }

    fn missing(&self, name: &str) -> ModelError {
        ModelError::MissingTensors {
            path: self.path.display().to_string(),
            names: vec![name.to_string()],
        }
    }

    /// A tensor dequantized to f32: (libtorch shape, values in row-major order).
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<i64>, Vec<f32>)> {
        let t = self.tensor_info(name).ok_or_else(|| self.missing(name))?;
        let bytes = self.tensor_bytes(name)?;
        let values = dequantize(t.ggml_type, bytes, t.n_elements()).map_err(|e| match e {
            ModelError::GgufUnsupported { what, .. } => ModelError::GgufUnsupported {
                path: self.path.display().to_string(),
                what: format!("tensor {name}: {what}"),
            },
            other => other,
        })?;
        Ok((t.shape(), values))
    }

    /// A tensor dequantized to an f32 libtorch tensor on the CPU.
    pub fn tensor(&self, name: &str) -> Result<tch::Tensor> {
        let (shape, values) = self.tensor_f32(name)?;
        Ok(tch::Tensor::f_from_slice(&values)?.f_reshape(&shape)?)
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes `n` values of type `ty` from `bytes` (which must hold exactly their blocks).
/// Types other than `F32`, `F16`, `BF16`, `Q4_0`, `Q4_1` and `Q8_0` are
/// [`ModelError::GgufUnsupported`].
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: u64) -> Result<Vec<f32>> {
    let unsupported = |what: String| ModelError::GgufUnsupported {
        path: "<bytes>".into(),
        what,
    };
    if !ty.dequantizable() {
        return Err(unsupported(format!(
            "ggml type {} is not dequantized by raptor (F32, F16, BF16, Q4_0, Q4_1, Q8_0 are)",
            ty.name()
        )));
    }
    let (per_block, block_bytes) = ty.block();
    let expected = n
        .is_multiple_of(per_block)
        .then(|| (n / per_block).checked_mul(block_bytes))
        .flatten();
    if expected != Some(bytes.len() as u64) {
        return Err(ModelError::CorruptGguf {
            path: "<bytes>".into(),
            offset: 0,
            why: format!(
                "{n} values of {} need {expected:?} bytes, got {}",
                ty.name(),
                bytes.len()
            ),
        });
    }
    let n = n as usize;
    let mut out = Vec::with_capacity(n);
    match ty {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        GgmlType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        GgmlType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        GgmlType::Q4_0 => {
            for blk in bytes.chunks_exact(18) {
                let d = f16_at(blk, 0);
                let qs = &blk[2..18];
                out.extend(qs.iter().map(|&q| ((q & 0x0f) as i32 - 8) as f32 * d));
                out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
            }
        }
        GgmlType::Q4_1 => {
            for blk in bytes.chunks_exact(20) {
                let d = f16_at(blk, 0);
                let m = f16_at(blk, 2);
                let qs = &blk[4..20];
                out.extend(qs.iter().map(|&q| (q & 0x0f) as f32 * d + m));
                out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
            }
        }
        GgmlType::Q8_0 => {
            for blk in bytes.chunks_exact(34) {
                let d = f16_at(blk, 0);
                out.extend(blk[2..34].iter().map(|&q| q as i8 as f32 * d));
            }
        }
        _ => return Err(unsupported(ty.name().into())),
    }
    Ok(out)
}
