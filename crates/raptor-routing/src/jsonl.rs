//! Reading router outputs from JSON lines (the `raptor routing --input` format).
//!
//! One record per line:
//!
//! ```text
//! {"layers": [{"experts": [[3, 1], [0, 3]], "weights": [[0.7, 0.2], [0.5, 0.4]], "mask": [1, 0]}, ...]}
//! ```
//!
//! - `layers`: one object per candidate sparse layer, in the same order on every line (layer ids
//!   are the positions `0, 1, …`); every line has the same number of layers.
//! - `experts`: per token, the router's top-k expert indices (non-negative integers); `k` is the
//!   same for every token of a layer over the whole file.
//! - `weights`: the matching gate weights (finite, non-negative numbers), same shape.
//! - `mask` (optional, default all valid): one entry per token, `true`/`false` or `1`/`0`;
//!   padding tokens are ignored (their experts/weights are not checked).
//! - Blank lines are skipped; line numbers in errors count them.
//!
//! The number of experts `E` is given by the caller or inferred as the largest expert index that
//! appears anywhere in the file (any layer, valid tokens only) plus one. Inference underestimates
//! `E` when the highest-numbered experts are never chosen, which changes `H/ln E`, χ², CV and
//! the empty-expert count: pass `E` explicitly when you know it.

use std::io::BufRead;

use serde_json::Value;

use crate::{LayerRouting, RoutingError, WeightPrecision};

/// Router outputs read from a JSON-lines file.
#[derive(Debug, Clone)]
pub struct JsonlCorpus {
    /// One [`LayerRouting`] per layer position.
    pub layers: Vec<LayerRouting>,
    /// Number of records (non-blank lines).
    pub num_records: usize,
    /// Number of experts used for every layer.
    pub num_experts: usize,
    /// Whether `num_experts` was inferred (max index + 1) rather than given.
    pub num_experts_inferred: bool,
}

/// One layer's raw buffers while reading.
#[derive(Default)]
struct RawLayer {
    top_k: Option<usize>,
    experts: Vec<u32>,
    weights: Vec<f32>,
    mask: Vec<bool>,
    /// Token count of each record.
    lengths: Vec<usize>,
}

fn perr(line: usize, field: impl Into<String>, message: impl Into<String>) -> RoutingError {
    RoutingError::Parse {
        line,
        field: field.into(),
        message: message.into(),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Read a JSON-lines corpus. `num_experts = None` infers `E` (see the [module docs](self)).
pub fn read_jsonl<R: BufRead>(
    reader: R,
    num_experts: Option<usize>,
    precision: WeightPrecision,
) -> Result<JsonlCorpus, RoutingError> {
    if num_experts == Some(0) {
        return Err(RoutingError::NoExperts(0));
    }
    let mut raw: Vec<RawLayer> = Vec::new();
    let mut num_records = 0usize;
    let mut max_index: Option<u32> = None;
    for (i, line) in reader.lines().enumerate() {
        let ln = i + 1;
        let line = line.map_err(|e| RoutingError::Io(format!("line {ln}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| perr(ln, "<record>", format!("invalid JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| {
            perr(
                ln,
                "<record>",
                format!("expected an object, found {}", kind(&v)),
            )
        })?;
        let layers = obj
            .get("layers")
            .ok_or_else(|| perr(ln, "layers", "missing"))?;
        let layers = layers.as_array().ok_or_else(|| {
            perr(
                ln,
                "layers",
                format!("expected an array, found {}", kind(layers)),
            )
        })?;
        if num_records == 0 {
            if layers.is_empty() {
                return Err(perr(ln, "layers", "expected at least one layer"));
            }
            raw.resize_with(layers.len(), RawLayer::default);
        } else if layers.len() != raw.len() {
            return Err(perr(
                ln,
                "layers",
                format!(
                    "expected {} layers (as on the first record), found {}",
                    raw.len(),
                    layers.len()
                ),
            ));
        }
        for (l, (lv, rl)) in layers.iter().zip(raw.iter_mut()).enumerate() {
            parse_layer(ln, l, lv, rl, num_experts, &mut max_index)?;
        }
        num_records += 1;
    }
    if num_records == 0 {
        return Err(perr(0, "<file>", "no records"));
    }
    let (e, inferred) = match num_experts {
        Some(e) => (e, false),
        None => (max_index.map_or(1, |m| m as usize + 1), true),
    };
    let mut out = Vec::with_capacity(raw.len());
    for (l, rl) in raw.into_iter().enumerate() {
        let k = rl.top_k.unwrap_or(1);
        let mut layer = LayerRouting::with_precision(e, k, precision).map_err(|err| {
            perr(
                0,
                format!("layers[{l}]"),
                format!("{err} (inferred E = {e} from the largest index)"),
            )
        })?;
        let (mut tok, mut val) = (0usize, 0usize);
        for &len in &rl.lengths {
            layer.push_record(
                &rl.experts[val..val + len * k],
                &rl.weights[val..val + len * k],
                &rl.mask[tok..tok + len],
            )?;
            tok += len;
            val += len * k;
        }
        out.push(layer);
    }
    Ok(JsonlCorpus {
        layers: out,
        num_records,
        num_experts: e,
        num_experts_inferred: inferred,
    })
}

fn parse_layer(
    ln: usize,
    l: usize,
    lv: &Value,
    rl: &mut RawLayer,
    num_experts: Option<usize>,
    max_index: &mut Option<u32>,
) -> Result<(), RoutingError> {
    let f = |name: &str| format!("layers[{l}].{name}");
    let obj = lv.as_object().ok_or_else(|| {
        perr(
            ln,
            format!("layers[{l}]"),
            format!("expected an object, found {}", kind(lv)),
        )
    })?;
    let get_arr = |name: &str| -> Result<&Vec<Value>, RoutingError> {
        let v = obj.get(name).ok_or_else(|| perr(ln, f(name), "missing"))?;
        v.as_array()
            .ok_or_else(|| perr(ln, f(name), format!("expected an array, found {}", kind(v))))
    };
    let experts = get_arr("experts")?;
    let weights = get_arr("weights")?;
    let tokens = experts.len();
    if weights.len() != tokens {
        return Err(perr(
            ln,
            f("weights"),
            format!(
                "expected {tokens} tokens (as in experts), found {}",
                weights.len()
            ),
        ));
    }
    let mask: Vec<bool> = match obj.get("mask") {
        None | Some(Value::Null) => vec![true; tokens],
        Some(Value::Array(m)) => {
            if m.len() != tokens {
                return Err(perr(
                    ln,
                    f("mask"),
                    format!(
                        "expected {tokens} entries (one per token), found {}",
                        m.len()
                    ),
                ));
            }
            m.iter()
                .enumerate()
                .map(|(t, x)| match x {
                    Value::Bool(b) => Ok(*b),
                    Value::Number(n) if n.as_f64() == Some(1.0) => Ok(true),
                    Value::Number(n) if n.as_f64() == Some(0.0) => Ok(false),
                    other => Err(perr(
                        ln,
                        format!("layers[{l}].mask[{t}]"),
                        format!("expected true/false or 1/0, found {other}"),
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        Some(other) => {
            return Err(perr(
                ln,
                f("mask"),
                format!("expected an array, found {}", kind(other)),
            ));
        }
    };
    let start = rl.experts.len();
    for t in 0..tokens {
        let fe = || format!("layers[{l}].experts[{t}]");
        let fw = || format!("layers[{l}].weights[{t}]");
        let et = experts[t].as_array().ok_or_else(|| {
            perr(
                ln,
                fe(),
                format!(
                    "expected an array of top-k indices, found {}",
                    kind(&experts[t])
                ),
            )
        })?;
        let wt = weights[t].as_array().ok_or_else(|| {
            perr(
                ln,
                fw(),
                format!(
                    "expected an array of top-k weights, found {}",
                    kind(&weights[t])
                ),
            )
        })?;
        match rl.top_k {
            None if et.is_empty() => return Err(perr(ln, fe(), "top-k list is empty")),
            None => rl.top_k = Some(et.len()),
            Some(k) if k != et.len() => {
                return Err(perr(
                    ln,
                    fe(),
                    format!(
                        "expected top-k = {k} entries (as earlier in this layer), found {}",
                        et.len()
                    ),
                ));
            }
            Some(_) => {}
        }
        if wt.len() != et.len() {
            return Err(perr(
                ln,
                fw(),
                format!(
                    "expected {} weights (as in experts), found {}",
                    et.len(),
                    wt.len()
                ),
            ));
        }
        for (s, (x, w)) in et.iter().zip(wt).enumerate() {
            if !mask[t] {
                rl.experts.push(0);
                rl.weights.push(0.0);
                continue;
            }
            let idx = x
                .as_u64()
                .and_then(|u| u32::try_from(u).ok())
                .ok_or_else(|| {
                    perr(
                        ln,
                        format!("layers[{l}].experts[{t}][{s}]"),
                        format!("expected a non-negative integer expert index, found {x}"),
                    )
                })?;
            if let Some(e) = num_experts
                && idx as usize >= e
            {
                return Err(perr(
                    ln,
                    format!("layers[{l}].experts[{t}][{s}]"),
                    format!("expert index {idx} is out of range (num_experts = {e})"),
                ));
            }
            *max_index = Some(max_index.map_or(idx, |m| m.max(idx)));
            let wf = w
                .as_f64()
                .filter(|v| v.is_finite() && *v >= 0.0 && *v <= f64::from(f32::MAX))
                .ok_or_else(|| {
                    perr(
                        ln,
                        format!("layers[{l}].weights[{t}][{s}]"),
                        format!("expected a finite non-negative number, found {w}"),
                    )
                })?;
            rl.experts.push(idx);
            // In f32 range by the filter above.
            #[allow(clippy::cast_possible_truncation)]
            rl.weights.push(wf as f32);
        }
    }
    debug_assert_eq!(rl.experts.len() - start, tokens * rl.top_k.unwrap_or(0));
    rl.mask.extend_from_slice(&mask);
    rl.lengths.push(tokens);
    Ok(())
}
