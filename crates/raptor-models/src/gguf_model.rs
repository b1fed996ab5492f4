//! Llama-architecture GGUF files as a [`Decoder`]: configuration from the `llama.*` metadata,
//! weights dequantized to f32 under their Hugging Face names (llama.cpp's q/k row permutation
//! undone), and the byte-level BPE tokenizer from the `tokenizer.ggml.*` metadata.
//!
//! | GGUF | Hugging Face (`LlamaForCausalLM`) |
//! |---|---|
//! | `token_embd.weight` | `model.embed_tokens.weight` |
//! | `blk.{i}.attn_norm.weight` | `model.layers.{i}.input_layernorm.weight` |
//! | `blk.{i}.attn_{q,k,v}.{weight,bias}` | `model.layers.{i}.self_attn.{q,k,v}_proj.*` (q, k: rows un-permuted) |
//! | `blk.{i}.attn_output.{weight,bias}` | `model.layers.{i}.self_attn.o_proj.*` |
//! | `blk.{i}.ffn_norm.weight` | `model.layers.{i}.post_attention_layernorm.weight` |
//! | `blk.{i}.ffn_{gate,up,down}.{weight,bias}` | `model.layers.{i}.mlp.{gate,up,down}_proj.*` |
//! | `output_norm.weight` | `model.norm.weight` |
//! | `output.weight` (absent: tied to the embedding) | `lm_head.weight` |
//!
//! | metadata | [`DecoderConfig`] field |
//! |---|---|
//! | `llama.embedding_length` | `hidden_size` |
//! | `llama.feed_forward_length` | `intermediate_size` |
//! | `llama.block_count` | `num_hidden_layers` |
//! | `llama.attention.head_count` / `head_count_kv` (default: head_count) | `num_attention_heads` / `num_key_value_heads` |
//! | `llama.attention.key_length` (default: hidden / heads) | `head_dim` |
//! | `llama.rope.freq_base` (default 10000) | `rope_theta` |
//! | `llama.rope.scaling.type` = `linear`, `llama.rope.scaling.factor` | `rope_scaling` |
//! | `llama.attention.layer_norm_rms_epsilon` | `rms_norm_eps` |
//! | `llama.vocab_size` (default: the token list's length) | `vocab_size` |
//! | `llama.context_length` | [`GgufLlama::context_length`] |
//!
//! **The q/k permutation.** llama.cpp's converter reorders the rows of `attn_q` (per query head)
//! and `attn_k` (per key/value head) so that its rotary embedding can rotate adjacent pairs:
//! within each head of size `d`, Hugging Face row `half·d/2 + s` (`half` ∈ {0, 1},
//! `s < d/2`) is stored as row `2s + half`. [`unpermute_qk_rows`] undoes it,
//! [`permute_qk_rows`] applies it. Quantization blocks run along the rows (the input
//! dimension), so the row reordering commutes with dequantization.
//!
//! **Tokenizer.** `tokenizer.ggml.model` must be `gpt2` (byte-level BPE). The tokens are already
//! in the byte-to-unicode alphabet, the merges are `"left right"` pairs, and tokens of type 3
//! (control, e.g. `<|im_start|>`) become special added tokens, matched whole. The text is split
//! with GPT-2's regex (no prefix space), as transformers' GGUF tokenizer does for the
//! `tokenizer.ggml.pre` values read here (`default`, `gpt2`, `smollm`); other split rules are
//! [`ModelError::GgufUnsupported`].

use crate::RopeScaling;
use crate::decoder::{Decoder, DecoderConfig, DecoderFamily};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, GgufValue};
use crate::layers::Act;
use crate::model::Model;
use crate::olmoe::DecoderHead;
use crate::tokenizer::CorpusTokenizer;
use std::path::Path;
use tch::Device;

/// Applies llama.cpp's q/k row permutation to a `[heads·head_dim, cols]` row-major matrix (or a
/// bias, `cols = 1`): within each head, row `half·d/2 + s` moves to row `2s + half`.
pub fn permute_qk_rows(values: &[f32], rows: usize, cols: usize, heads: usize) -> Result<Vec<f32>> {
    reorder_qk_rows(values, rows, cols, heads, true)
}

/// Undoes [`permute_qk_rows`]: GGUF row order back to Hugging Face's.
pub fn unpermute_qk_rows(
    values: &[f32],
    rows: usize,
    cols: usize,
    heads: usize,
) -> Result<Vec<f32>> {
    reorder_qk_rows(values, rows, cols, heads, false)
}

fn reorder_qk_rows(
    values: &[f32],
    rows: usize,
    cols: usize,
    heads: usize,
    forward: bool,
) -> Result<Vec<f32>> {
    let size_ok = rows.checked_mul(cols) == Some(values.len());
    if heads == 0 || !size_ok || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(ModelError::ShapeMismatch {
            what: format!("q/k rows to reorder over {heads} heads (even head size)"),
            expected: vec![rows as i64, cols as i64],
            got: vec![values.len() as i64],
        });
    }
    let d = rows / heads;
    let half_d = d / 2;
    let mut out = vec![0f32; values.len()];
    for h in 0..heads {
        for half in 0..2 {
            for s in 0..half_d {
                let hf = h * d + half * half_d + s;
                let gg = h * d + 2 * s + half;
                let (from, to) = if forward { (hf, gg) } else { (gg, hf) };
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&values[from * cols..(from + 1) * cols]);
            }
        }
    }
    Ok(out)
}

fn meta_err(f: &GgufFile, key: &str, why: impl Into<String>) -> ModelError {
    ModelError::GgufMetadata {
        path: f.path().display().to_string(),
        key: key.into(),
        why: why.into(),
    }
}

fn meta_u64(f: &GgufFile, key: &str) -> Result<Option<u64>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            meta_err(
                f,
                key,
                format!("expected a non-negative integer, found {v:?}"),
            )
        }),
    }
}

fn meta_size(f: &GgufFile, key: &str) -> Result<i64> {
    let v = meta_u64(f, key)?.ok_or_else(|| meta_err(f, key, "missing"))?;
    i64::try_from(v)
        .ok()
        .filter(|&v| (1..=1 << 24).contains(&v))
        .ok_or_else(|| meta_err(f, key, format!("{v} is outside [1, 2^24]")))
}

fn meta_f64(f: &GgufFile, key: &str) -> Result<Option<f64>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| meta_err(f, key, format!("expected a finite number, found {v:?}"))),
    }
}

fn meta_str<'a>(f: &'a GgufFile, key: &str) -> Result<Option<&'a str>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| meta_err(f, key, format!("expected a string, found {v:?}"))),
    }
}

fn meta_strings<'a>(f: &'a GgufFile, key: &str) -> Result<Vec<&'a str>> {
    let arr = f
        .get(key)
        .ok_or_else(|| meta_err(f, key, "missing"))?
        .as_array()
        .ok_or_else(|| meta_err(f, key, "expected an array"))?;
    arr.iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| meta_err(f, key, format!("expected strings, found {v:?}")))
        })
        .collect()
}

/// A Llama [`Decoder`] read from a GGUF file.
#[derive(Debug)]
pub struct GgufLlama {
    /// The model, weights dequantized to f32.
    pub model: Decoder,
    /// `llama.context_length` (positions the model was trained for), when given.
    pub context_length: Option<u64>,
    /// `general.name`, when given.
    pub name: Option<String>,
    /// The storage type of each tensor read (GGUF name, ggml type name).
    pub tensor_types: Vec<(String, &'static str)>,
}

/// The [`DecoderConfig`] of a Llama-architecture GGUF file (see the module docs for the keys).
pub fn llama_config(f: &GgufFile, head: DecoderHead) -> Result<DecoderConfig> {
    let arch = meta_str(f, "general.architecture")?
        .ok_or_else(|| meta_err(f, "general.architecture", "missing"))?;
    if arch != "llama" {
        return Err(ModelError::GgufUnsupported {
            path: f.path().display().to_string(),
            what: format!("general.architecture {arch:?} (only llama is read)"),
        });
    }
    let hidden = meta_size(f, "llama.embedding_length")?;
    let heads = meta_size(f, "llama.attention.head_count")?;
    let kv_heads = match f.get("llama.attention.head_count_kv") {
        None => heads,
        Some(_) => meta_size(f, "llama.attention.head_count_kv")?,
    };
    let head_dim = match f.get("llama.attention.key_length") {
        None => hidden / heads,
        Some(_) => meta_size(f, "llama.attention.key_length")?,
    };
    if let Some(rot) = meta_u64(f, "llama.rope.dimension_count")?
        && rot != head_dim as u64
    {
        return Err(ModelError::GgufUnsupported {
            path: f.path().display().to_string(),
            what: format!(
                "partial rotary embedding: llama.rope.dimension_count {rot} < head size {head_dim}"
            ),
        });
    }
    let vocab = match f.get("llama.vocab_size") {
        Some(_) => meta_size(f, "llama.vocab_size")?,
        None => match f.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array) {
            Some(t) => t.len() as i64,
            None => f
                .tensor_info("token_embd.weight")
                .and_then(|t| t.ne.get(1).copied())
                .map(|v| v as i64)
                .ok_or_else(|| meta_err(f, "llama.vocab_size", "missing, and no token list"))?,
        },
    };
    let rope_scaling = match meta_str(f, "llama.rope.scaling.type")? {
        None | Some("none") => RopeScaling::None,
        Some("linear") => {
            let factor = meta_f64(f, "llama.rope.scaling.factor")?
                .ok_or_else(|| meta_err(f, "llama.rope.scaling.factor", "missing"))?;
            RopeScaling::Linear { factor }
        }
        Some(other) => {
            return Err(ModelError::GgufUnsupported {
                path: f.path().display().to_string(),
                what: format!("llama.rope.scaling.type {other:?} (none and linear are read)"),
            });
        }
    };
    if f.tensor_info("rope_freqs.weight").is_some() {
        return Err(ModelError::GgufUnsupported {
            path: f.path().display().to_string(),
            what: "rope_freqs.weight (Llama 3.1-style RoPE frequencies)".into(),
        });
    }
    let has = |n: &str| f.tensor_info(n).is_some();
    Ok(DecoderConfig {
        family: DecoderFamily::Llama,
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: meta_size(f, "llama.feed_forward_length")?,
        num_hidden_layers: meta_size(f, "llama.block_count")?,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        hidden_act: Act::Silu,
        rms_norm_eps: meta_f64(f, "llama.attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| meta_err(f, "llama.attention.layer_norm_rms_epsilon", "missing"))?,
        rope_theta: meta_f64(f, "llama.rope.freq_base")?.unwrap_or(10000.0),
        rope_scaling,
        qkv_bias: has("blk.0.attn_q.bias"),
        o_bias: has("blk.0.attn_output.bias"),
        mlp_bias: has("blk.0.ffn_up.bias"),
        qk_norm: false,
        clip_qkv: None,
        moe: None,
        tie_word_embeddings: !has("output.weight"),
        head,
    })
}

/// The GGUF tensor name of a Hugging Face Llama variable, and whether its rows carry the q/k
/// permutation (None: not stored in GGUF files, e.g. a classification `score` head).
pub fn gguf_name(hf: &str) -> Option<(String, bool)> {
    match hf {
        "model.embed_tokens.weight" => return Some(("token_embd.weight".into(), false)),
        "model.norm.weight" => return Some(("output_norm.weight".into(), false)),
        "lm_head.weight" => return Some(("output.weight".into(), false)),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (i, rest) = rest.split_once('.')?;
    let i: usize = i.parse().ok()?;
    let (module, param) = rest.rsplit_once('.')?;
    let (g, permuted) = match module {
        "input_layernorm" => ("attn_norm", false),
        "post_attention_layernorm" => ("ffn_norm", false),
        "self_attn.q_proj" => ("attn_q", true),
        "self_attn.k_proj" => ("attn_k", true),
        "self_attn.v_proj" => ("attn_v", false),
        "self_attn.o_proj" => ("attn_output", false),
        "mlp.gate_proj" => ("ffn_gate", false),
        "mlp.up_proj" => ("ffn_up", false),
        "mlp.down_proj" => ("ffn_down", false),
        _ => return None,
    };
    Some((format!("blk.{i}.{g}.{param}"), permuted))
}

/// Builds a Llama [`Decoder`] with `head` from a GGUF file and loads its weights (dequantized to
/// f32). Every GGUF tensor must be used and every model variable found, except a
/// classification head's `score.weight` (left at its random initialization).
pub fn load_gguf_llama(
    path: impl AsRef<Path>,
    head: DecoderHead,
    device: Device,
) -> Result<GgufLlama> {
    let f = GgufFile::open(path)?;
    load_gguf_llama_from(&f, head, device)
}

/// [`load_gguf_llama`] on a file already read.
pub fn load_gguf_llama_from(f: &GgufFile, head: DecoderHead, device: Device) -> Result<GgufLlama> {
    let cfg = llama_config(f, head)?;
    let (heads, kv_heads) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let model = Decoder::new(cfg, device)?;
    let label = f.path().display().to_string();
    let vars = model.var_store().variables();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    let mut used = std::collections::BTreeSet::new();
    let mut missing = Vec::new();
    let mut loads = Vec::new();
    for var in names {
        let Some((g, permuted)) = gguf_name(var) else {
            if var.starts_with("score.") {
                continue;
            }
            missing.push(var.clone());
            continue;
        };
        if f.tensor_info(&g).is_none() {
            missing.push(var.clone());
            continue;
        }
        used.insert(g.clone());
        loads.push((var.clone(), g, permuted));
    }
    if !missing.is_empty() {
        return Err(ModelError::MissingTensors {
            path: label,
            names: missing,
        });
    }
    let unexpected: Vec<String> = f
        .tensors()
        .iter()
        .filter(|t| !used.contains(&t.name))
        .map(|t| t.name.clone())
        .collect();
    if !unexpected.is_empty() {
        return Err(ModelError::UnexpectedTensors {
            path: label,
            names: unexpected,
        });
    }
    let mut tensor_types = Vec::with_capacity(loads.len());
    tch::no_grad(|| -> Result<()> {
        for (var, g, permuted) in &loads {
            let Some(dst) = vars.get(var) else { continue };
            let (shape, mut values) = f.tensor_f32(g)?;
            let want = dst.size();
            if shape != want {
                return Err(ModelError::ShapeMismatch {
                    what: format!("{label}: {g} for {var}"),
                    expected: want,
                    got: shape,
                });
            }
            if *permuted {
                let h = if var.contains("q_proj") {
                    heads
                } else {
                    kv_heads
                };
                let rows = shape.first().copied().unwrap_or(0) as usize;
                let cols = shape.get(1).copied().unwrap_or(1) as usize;
                values = unpermute_qk_rows(&values, rows, cols, h as usize)?;
            }
            let src = tch::Tensor::f_from_slice(&values)?
                .f_reshape(&shape)?
                .f_to_kind(dst.kind())?
                .f_to_device(dst.device())?;
            let mut dst = dst.shallow_clone();
            dst.f_copy_(&src)?;
            if let Some(t) = f.tensor_info(g) {
                tensor_types.push((g.clone(), t.ggml_type.name()));
            }
        }
        Ok(())
    })?;
    Ok(GgufLlama {
        model,
        context_length: meta_u64(f, "llama.context_length")?,
        name: meta_str(f, "general.name")?.map(str::to_string),
        tensor_types,
    })
}

/// Special token ids of a GGUF tokenizer (`tokenizer.ggml.*_token_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GgufSpecialIds {
    /// `bos_token_id`.
    pub bos: Option<u32>,
    /// `eos_token_id`.
    pub eos: Option<u32>,
    /// `padding_token_id`.
    pub pad: Option<u32>,
    /// `unknown_token_id`.
    pub unk: Option<u32>,
}

/// The special token ids of a GGUF file's tokenizer (each checked against the token list).
pub fn gguf_special_ids(f: &GgufFile) -> Result<GgufSpecialIds> {
    let n = f
        .get("tokenizer.ggml.tokens")
        .and_then(GgufValue::as_array)
        .map_or(0, <[GgufValue]>::len) as u64;
    let id = |k: &str| -> Result<Option<u32>> {
        let key = format!("tokenizer.ggml.{k}_token_id");
        match meta_u64(f, &key)? {
            None => Ok(None),
            Some(v) if v < n => Ok(Some(v as u32)),
            Some(v) => Err(meta_err(f, &key, format!("{v} is outside the {n} tokens"))),
        }
    };
    Ok(GgufSpecialIds {
        bos: id("bos")?,
        eos: id("eos")?,
        pad: id("padding")?,
        unk: id("unknown")?,
    })
}

/// The byte-level BPE tokenizer of a GGUF file (`tokenizer.ggml.model = gpt2`; see the module
/// docs), wrapped as a [`CorpusTokenizer`].
pub fn gguf_tokenizer(f: &GgufFile) -> Result<CorpusTokenizer> {
    use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, Tokenizer};

    let unsupported = |what: String| ModelError::GgufUnsupported {
        path: f.path().display().to_string(),
        what,
    };
    match meta_str(f, "tokenizer.ggml.model")? {
        Some("gpt2") => {}
        other => {
            return Err(unsupported(format!(
                "tokenizer.ggml.model {other:?} (only gpt2, byte-level BPE, is read)"
            )));
        }
    }
    match meta_str(f, "tokenizer.ggml.pre")? {
        None | Some("default" | "gpt2" | "smollm") => {}
        Some(other) => {
            return Err(unsupported(format!(
                "tokenizer.ggml.pre {other:?} (a split rule other than GPT-2's; default, gpt2 and \
                 smollm are read)"
            )));
        }
    }
    let tokens = meta_strings(f, "tokenizer.ggml.tokens")?;
    let merges = meta_strings(f, "tokenizer.ggml.merges")?;
    let types: Vec<u64> = match f.get("tokenizer.ggml.token_type") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .ok_or_else(|| meta_err(f, "tokenizer.ggml.token_type", "expected an array"))?
            .iter()
            .map(|t| t.as_u64().unwrap_or(0))
            .collect(),
    };
    let mut vocab = tokenizers::models::bpe::Vocab::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if vocab.insert((*t).to_string(), i as u32).is_some() {
            return Err(meta_err(
                f,
                "tokenizer.ggml.tokens",
                format!("token {t:?} appears twice"),
            ));
        }
    }
    let mut pairs = Vec::with_capacity(merges.len());
    for m in &merges {
        let (a, b) = m.split_once(' ').ok_or_else(|| {
            meta_err(
                f,
                "tokenizer.ggml.merges",
                format!("merge {m:?} is not \"left right\""),
            )
        })?;
        pairs.push((a.to_string(), b.to_string()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .continuing_subword_prefix(String::new())
        .end_of_word_suffix(String::new())
        .build()
        .map_err(|e| meta_err(f, "tokenizer.ggml.merges", e.to_string()))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    let control: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, ty)| **ty == 3)
        .map(|(t, _)| AddedToken::from((*t).to_string(), true).normalized(false))
        .collect();
    tok.add_special_tokens(&control);
    Ok(CorpusTokenizer::from_tokenizer(tok))
}
