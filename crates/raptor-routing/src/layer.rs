//! [`LayerRouting`]: compact owned storage of one sparse layer's router outputs over many records.

use half::f16;

use crate::RoutingError;

/// Storage precision of the gate weights of a [`LayerRouting`].
///
/// `F32` (the default of [`LayerRouting::new`]) stores the router's weights exactly. `F16` halves
/// the weight storage; owners are then computed from the rounded weights (relative error
/// ≤ 2⁻¹¹), which can only change the owner of a record whose two best experts are within that
/// relative distance of each other. The owner map stays deterministic either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightPrecision {
    /// 4 bytes per weight, exact.
    #[default]
    F32,
    /// 2 bytes per weight (IEEE half precision, round to nearest).
    F16,
}

/// Expert indices, stored in the narrowest unsigned type that holds `num_experts - 1`.
#[derive(Debug, Clone)]
pub(crate) enum ExpertIds {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
}

impl ExpertIds {
    fn for_experts(num_experts: usize) -> Self {
        if num_experts <= 1 << 8 {
            ExpertIds::U8(Vec::new())
        } else if num_experts <= 1 << 16 {
            ExpertIds::U16(Vec::new())
        } else {
            ExpertIds::U32(Vec::new())
        }
    }

    fn reserve(&mut self, n: usize) {
        match self {
            ExpertIds::U8(v) => v.reserve(n),
            ExpertIds::U16(v) => v.reserve(n),
            ExpertIds::U32(v) => v.reserve(n),
        }
    }

    /// Append one index; the caller has checked `e < num_experts`, so the casts are lossless.
    #[allow(clippy::cast_possible_truncation)]
    fn push(&mut self, e: u32) {
        match self {
            ExpertIds::U8(v) => v.push(e as u8),
            ExpertIds::U16(v) => v.push(e as u16),
            ExpertIds::U32(v) => v.push(e),
        }
    }

    fn get(&self, i: usize) -> u32 {
        match self {
            ExpertIds::U8(v) => u32::from(v[i]),
            ExpertIds::U16(v) => u32::from(v[i]),
            ExpertIds::U32(v) => v[i],
        }
    }

    fn elem_bytes(&self) -> usize {
        match self {
            ExpertIds::U8(_) => 1,
            ExpertIds::U16(_) => 2,
            ExpertIds::U32(_) => 4,
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            ExpertIds::U8(v) => v.capacity(),
            ExpertIds::U16(v) => v.capacity() * 2,
            ExpertIds::U32(v) => v.capacity() * 4,
        }
    }
}

/// Gate weights in the chosen [`WeightPrecision`].
#[derive(Debug, Clone)]
pub(crate) enum GateWeights {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl GateWeights {
    fn reserve(&mut self, n: usize) {
        match self {
            GateWeights::F32(v) => v.reserve(n),
            GateWeights::F16(v) => v.reserve(n),
        }
    }

    fn push(&mut self, w: f32) {
        match self {
            GateWeights::F32(v) => v.push(w),
            GateWeights::F16(v) => v.push(f16::from_f32(w)),
        }
    }

    fn get(&self, i: usize) -> f32 {
        match self {
            GateWeights::F32(v) => v[i],
            GateWeights::F16(v) => v[i].to_f32(),
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            GateWeights::F32(v) => v.capacity() * 4,
            GateWeights::F16(v) => v.capacity() * 2,
        }
    }
}

/// Router outputs of **one** sparse layer over many records, stored compactly.
///
/// Layout (CSR-style, no per-token or per-record allocation):
/// - `offsets[r]..offsets[r + 1]` is the token range of record `r` (records may have different
///   lengths);
/// - expert indices, flat, `top_k` per token, in `u8` when `num_experts ≤ 256`, `u16` when
///   `≤ 65 536`, else `u32`;
/// - gate weights, flat, `top_k` per token, `f32` (or `f16`, see [`WeightPrecision`]);
/// - one validity bit per token (padding = 0). Padding tokens are stored as expert 0 with weight
///   0 and are never read by the owner rules, so garbage router output at padded positions is
///   accepted.
///
/// Bytes per token: `top_k · (id bytes + weight bytes) + 1/8`. For top-8, E ≤ 256: 40.1 B (f32)
/// or 24.1 B (f16); 100k records × 128 tokens × 16 layers is then 8.2 GB (f32) or 4.9 GB (f16),
/// versus ≈ 23 GB as nested `Vec<Vec<(i64, f32)>>` without the per-Vec headers. When only the
/// owners are needed, [`crate::record_owner`] computes them per record with no storage at all.
///
/// ```
/// use raptor_routing::{owner_map, LayerRouting, OwnerRule};
/// let mut layer = LayerRouting::new(4, 2)?;
/// // 3 tokens, top-2: token t uses experts[2t..2t+2] with weights[2t..2t+2]; the last is padding.
/// layer.push_record(&[1, 2, 1, 0, 3, 3], &[0.6, 0.3, 0.5, 0.4, 0.9, 0.1], &[true, true, false])?;
/// let map = owner_map(&layer, OwnerRule::GateWeighted);
/// assert_eq!(map.owners(), &[1]); // expert 1: 0.6 + 0.5 = 1.1 beats 2: 0.3 and 0: 0.4
/// # Ok::<(), raptor_routing::RoutingError>(())
/// ```
#[derive(Debug, Clone)]
pub struct LayerRouting {
    num_experts: usize,
    top_k: usize,
    pub(crate) offsets: Vec<usize>,
    pub(crate) experts: ExpertIds,
    pub(crate) weights: GateWeights,
    pub(crate) mask: Vec<u64>,
    num_valid: usize,
}

impl LayerRouting {
    /// An empty layer with `num_experts` routed experts and `top_k` choices per token, gate
    /// weights stored as `f32`.
    ///
    /// Errors: `num_experts == 0`, `num_experts > u32::MAX`, or `top_k ∉ 1..=num_experts`.
    pub fn new(num_experts: usize, top_k: usize) -> Result<Self, RoutingError> {
        Self::with_precision(num_experts, top_k, WeightPrecision::F32)
    }

    /// Like [`LayerRouting::new`] with a chosen weight precision.
    pub fn with_precision(
        num_experts: usize,
        top_k: usize,
        precision: WeightPrecision,
    ) -> Result<Self, RoutingError> {
        if num_experts == 0 {
            return Err(RoutingError::NoExperts(num_experts));
        }
        if u32::try_from(num_experts).is_err() {
            return Err(RoutingError::TooManyExperts(num_experts));
        }
        if top_k == 0 || top_k > num_experts {
            return Err(RoutingError::InvalidTopK { top_k, num_experts });
        }
        Ok(Self {
            num_experts,
            top_k,
            offsets: vec![0],
            experts: ExpertIds::for_experts(num_experts),
            weights: match precision {
                WeightPrecision::F32 => GateWeights::F32(Vec::new()),
                WeightPrecision::F16 => GateWeights::F16(Vec::new()),
            },
            mask: Vec::new(),
            num_valid: 0,
        })
    }

    /// Reserve room for `records` more records of `tokens_per_record` tokens each.
    pub fn reserve(&mut self, records: usize, tokens_per_record: usize) {
        let tokens = records.saturating_mul(tokens_per_record);
        self.offsets.reserve(records);
        self.experts.reserve(tokens.saturating_mul(self.top_k));
        self.weights.reserve(tokens.saturating_mul(self.top_k));
        self.mask.reserve(tokens / 64 + 1);
    }

    /// Append one record.
    ///
    /// `experts` and `weights` hold `tokens × top_k` values, row-major (token `t` uses
    /// `[t·k, (t+1)·k)`); `mask` holds one bool per token (`false` = padding). A record may
    /// have zero tokens or only padding (its owner is then expert 0).
    ///
    /// Errors (the layer is left unchanged): lengths that do not match, an expert index
    /// `≥ num_experts` or a weight that is negative, NaN or infinite at a **valid** token.
    pub fn push_record(
        &mut self,
        experts: &[u32],
        weights: &[f32],
        mask: &[bool],
    ) -> Result<(), RoutingError> {
        let k = self.top_k;
        let tokens = mask.len();
        check_len("experts", experts.len(), tokens, k)?;
        check_len("weights", weights.len(), tokens, k)?;
        self.push_validated(
            tokens,
            |t| mask[t],
            |i| i64::from(experts[i]),
            |i| weights[i],
        )
    }

    /// Validate everything first, then append (so that an error leaves `self` unchanged).
    pub(crate) fn push_validated(
        &mut self,
        tokens: usize,
        valid: impl Fn(usize) -> bool,
        expert: impl Fn(usize) -> i64,
        weight: impl Fn(usize) -> f32,
    ) -> Result<(), RoutingError> {
        let k = self.top_k;
        for t in (0..tokens).filter(|&t| valid(t)) {
            for slot in 0..k {
                let i = t * k + slot;
                let e = expert(i);
                if e < 0 || e as u64 >= self.num_experts as u64 {
                    return Err(RoutingError::ExpertOutOfRange {
                        token: t,
                        slot,
                        index: e,
                        num_experts: self.num_experts,
                    });
                }
                let w = weight(i);
                if !(w.is_finite() && w >= 0.0) {
                    return Err(RoutingError::InvalidWeight {
                        token: t,
                        slot,
                        weight: w,
                    });
                }
            }
        }
        let start = self.num_tokens();
        let end = start
            .checked_add(tokens)
            .ok_or(RoutingError::TooManyTokens(start))?;
        if end.checked_mul(k).is_none() {
            return Err(RoutingError::TooManyTokens(end));
        }
        self.experts.reserve(tokens * k);
        self.weights.reserve(tokens * k);
        self.mask.resize(end.div_ceil(64), 0);
        for t in 0..tokens {
            let ok = valid(t);
            if ok {
                let pos = start + t;
                self.mask[pos / 64] |= 1u64 << (pos % 64);
                self.num_valid += 1;
            }
            for slot in 0..k {
                let i = t * k + slot;
                if ok {
                    // In range by the check above.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    self.experts.push(expert(i) as u32);
                    self.weights.push(weight(i));
                } else {
                    self.experts.push(0);
                    self.weights.push(0.0);
                }
            }
        }
        self.offsets.push(end);
        Ok(())
    }

    /// Append `B` records from libtorch tensors (any device; copied to the CPU).
    ///
    /// `experts`: `[B, T, k]` integer (the router's top-k indices, e.g. int64 from
    /// `torch.topk`); `weights`: `[B, T, k]` floating; `mask`: `[B, T]` bool, integer or
    /// floating with values 0/1 (the attention mask). `k` must equal [`LayerRouting::top_k`].
    /// Validation as in [`LayerRouting::push_record`]; on error nothing of the batch is appended.
    #[cfg(feature = "tch")]
    pub fn push_tensors(
        &mut self,
        experts: &tch::Tensor,
        weights: &tch::Tensor,
        mask: &tch::Tensor,
    ) -> Result<(), RoutingError> {
        use tch::{Device, Kind};
        let shape = |t: &tch::Tensor| format!("{:?}", t.size());
        let (b, t, k) = experts.size3().map_err(|_| RoutingError::ShapeMismatch {
            what: "experts",
            expected: "[B, T, k]".into(),
            actual: shape(experts),
        })?;
        if k as usize != self.top_k {
            return Err(RoutingError::ShapeMismatch {
                what: "experts",
                expected: format!("[B, T, {}]", self.top_k),
                actual: shape(experts),
            });
        }
        if weights.size() != [b, t, k] {
            return Err(RoutingError::ShapeMismatch {
                what: "weights",
                expected: format!("[{b}, {t}, {k}]"),
                actual: shape(weights),
            });
        }
        if mask.size() != [b, t] {
            return Err(RoutingError::ShapeMismatch {
                what: "mask",
                expected: format!("[{b}, {t}]"),
                actual: shape(mask),
            });
        }
        let flat = |x: &tch::Tensor, kind: Kind| -> Result<tch::Tensor, RoutingError> {
            Ok(x.f_to_device(Device::Cpu)?
                .f_to_kind(kind)?
                .f_contiguous()?
                .f_reshape([-1])?)
        };
        let e: Vec<i64> = Vec::try_from(&flat(experts, Kind::Int64)?)?;
        let w: Vec<f32> = Vec::try_from(&flat(weights, Kind::Float)?)?;
        let m: Vec<f64> = Vec::try_from(&flat(mask, Kind::Double)?)?;
        let (b, t, k) = (b as usize, t as usize, k as usize);
        if let Some((i, &v)) = m.iter().enumerate().find(|&(_, &v)| v != 0.0 && v != 1.0) {
            return Err(RoutingError::InvalidMask {
                token: i % t.max(1),
                value: v,
            });
        }
        // Validate the whole batch on a scratch copy, then commit.
        let mut scratch = self.clone_empty();
        for r in 0..b {
            let (tok, ex, wt) = (r * t, r * t * k, r * t * k);
            scratch.push_validated(t, |j| m[tok + j] != 0.0, |i| e[ex + i], |i| w[wt + i])?;
        }
        self.append(&scratch)
    }

    /// An empty layer with the same shape parameters and storage types.
    #[cfg(feature = "tch")]
    fn clone_empty(&self) -> Self {
        Self {
            num_experts: self.num_experts,
            top_k: self.top_k,
            offsets: vec![0],
            experts: ExpertIds::for_experts(self.num_experts),
            weights: match self.weights {
                GateWeights::F32(_) => GateWeights::F32(Vec::new()),
                GateWeights::F16(_) => GateWeights::F16(Vec::new()),
            },
            mask: Vec::new(),
            num_valid: 0,
        }
    }

    /// Append all records of `other` (same `num_experts` and `top_k`).
    pub fn append(&mut self, other: &LayerRouting) -> Result<(), RoutingError> {
        if other.num_experts != self.num_experts {
            return Err(RoutingError::Mismatch {
                what: "num_experts",
                left: self.num_experts,
                right: other.num_experts,
            });
        }
        if other.top_k != self.top_k {
            return Err(RoutingError::Mismatch {
                what: "top_k",
                left: self.top_k,
                right: other.top_k,
            });
        }
        for r in 0..other.num_records() {
            let range = other.offsets[r]..other.offsets[r + 1];
            let base = range.start * self.top_k;
            self.push_validated(
                range.len(),
                |t| other.is_valid(range.start + t),
                |i| i64::from(other.experts.get(base + i)),
                |i| other.weights.get(base + i),
            )?;
        }
        Ok(())
    }

    /// Number of records pushed so far.
    pub fn num_records(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Number of routed experts `E`.
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    /// Number of router choices per token `k`.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Total number of tokens (valid and padding) over all records.
    pub fn num_tokens(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// Number of valid (non-padding) tokens over all records.
    pub fn num_valid_tokens(&self) -> usize {
        self.num_valid
    }

    /// Weight storage precision.
    pub fn precision(&self) -> WeightPrecision {
        match self.weights {
            GateWeights::F32(_) => WeightPrecision::F32,
            GateWeights::F16(_) => WeightPrecision::F16,
        }
    }

    /// Bytes used per expert index (1, 2 or 4).
    pub fn expert_index_bytes(&self) -> usize {
        self.experts.elem_bytes()
    }

    /// Heap memory held by this layer, in bytes (capacities, not lengths).
    pub fn heap_bytes(&self) -> usize {
        self.offsets.capacity() * std::mem::size_of::<usize>()
            + self.experts.heap_bytes()
            + self.weights.heap_bytes()
            + self.mask.capacity() * 8
    }

    /// Whether global token `pos` is valid.
    #[inline]
    pub(crate) fn is_valid(&self, pos: usize) -> bool {
        (self.mask[pos / 64] >> (pos % 64)) & 1 == 1
    }

    /// A read-only view of record `r`, or `None` when out of range.
    pub fn record(&self, r: usize) -> Option<RecordView<'_>> {
        (r < self.num_records()).then(|| RecordView {
            layer: self,
            start: self.offsets[r],
            end: self.offsets[r + 1],
        })
    }
}

fn check_len(what: &'static str, len: usize, tokens: usize, k: usize) -> Result<(), RoutingError> {
    if Some(len) != tokens.checked_mul(k) {
        return Err(RoutingError::ShapeMismatch {
            what,
            expected: format!(
                "{tokens} tokens × top_k {k} = {} values",
                tokens.saturating_mul(k)
            ),
            actual: format!("{len} values"),
        });
    }
    Ok(())
}

/// Read-only view of one record of a [`LayerRouting`].
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    layer: &'a LayerRouting,
    start: usize,
    end: usize,
}

impl RecordView<'_> {
    /// Number of tokens (valid and padding).
    pub fn num_tokens(&self) -> usize {
        self.end - self.start
    }

    /// Whether token `t` is valid (not padding). `false` when `t` is out of range.
    pub fn is_valid(&self, t: usize) -> bool {
        t < self.num_tokens() && self.layer.is_valid(self.start + t)
    }

    /// Expert index and gate weight of slot `slot` of token `t` (`None` when out of range).
    /// Padding tokens read as `(0, 0.0)`.
    pub fn choice(&self, t: usize, slot: usize) -> Option<(u32, f32)> {
        let k = self.layer.top_k;
        (t < self.num_tokens() && slot < k).then(|| {
            let i = (self.start + t) * k + slot;
            (self.layer.experts.get(i), self.layer.weights.get(i))
        })
    }
}
