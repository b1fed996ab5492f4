//! GGUF: the reader against files written here, dequantization against slow obvious references
//! on hand-built blocks, arbitrary bytes never panic, llama.cpp's q/k permutation round trip on
//! a tiny synthetic Llama, and (when the model is in the cache) SmolLM2-135M-Instruct's logits
//! against transformers' (`fixtures/smollm2/golden.json`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use raptor_models::gguf::{GgmlType, GgufFile, GgufValue, dequantize};
use raptor_models::gguf_model::{
    gguf_special_ids, gguf_tokenizer, load_gguf_llama, permute_qk_rows, unpermute_qk_rows,
};
use raptor_models::tokenizer::TextTokenizer;
use raptor_models::{Batch, DecoderConfig, DecoderFamily, DecoderHead, ForwardCtx, Model};
use std::path::PathBuf;
use tch::{Device, Kind, Tensor};

// ---------------------------------------------------------------- a small GGUF writer (tests only)

/// A metadata value to write.
enum Meta {
    U32(u32),
    F32(f32),
    Str(String),
    Bool(bool),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

/// A version-3 GGUF file: metadata, then tensors (name, ne, type, raw bytes) at `alignment`.
fn write_gguf(meta: &[(&str, Meta)], tensors: &[(String, Vec<u64>, GgmlType, Vec<u8>)]) -> Vec<u8> {
    let alignment = meta
        .iter()
        .find_map(|(k, v)| match (k, v) {
            (&"general.alignment", Meta::U32(a)) => Some(u64::from(*a)),
            _ => None,
        })
        .unwrap_or(32);
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut b, k);
        match v {
            Meta::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Meta::F32(x) => {
                b.extend(6u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Meta::Bool(x) => {
                b.extend(7u32.to_le_bytes());
                b.push(u8::from(*x));
            }
            Meta::Str(s) => {
                b.extend(8u32.to_le_bytes());
                put_str(&mut b, s);
            }
            Meta::Strs(v) => {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((v.len() as u64).to_le_bytes());
                for s in v {
                    put_str(&mut b, s);
                }
            }
            Meta::I32s(v) => {
                b.extend(9u32.to_le_bytes());
                b.extend(5u32.to_le_bytes());
                b.extend((v.len() as u64).to_le_bytes());
                for x in v {
                    b.extend(x.to_le_bytes());
                }
            }
        }
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for (name, ne, ty, data) in tensors {
        put_str(&mut b, name);
        b.extend((ne.len() as u32).to_le_bytes());
        for d in ne {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.id().to_le_bytes());
        b.extend(offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + data.len() as u64).div_ceil(alignment) * alignment;
    }
    let start = (b.len() as u64).div_ceil(alignment) * alignment;
    b.resize(start as usize, 0);
    for ((_, _, _, data), off) in tensors.iter().zip(offsets) {
        b.resize((start + off) as usize, 0);
        b.extend(data);
    }
    b
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

// ---------------------------------------------------------------- slow obvious references

fn f16_bits_to_f32(bits: u16) -> f32 {
    // Exact: sign · 2^(e−15) · (1 + m/1024), subnormals 2^(−14) · m/1024.
    let sign = if bits & 0x8000 != 0 { -1.0f64 } else { 1.0 };
    let e = i32::from((bits >> 10) & 0x1f);
    let m = f64::from(bits & 0x3ff);
    let v = match e {
        0 => m / 1024.0 * 2f64.powi(-14),
        31 if m == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        _ => (1.0 + m / 1024.0) * 2f64.powi(e - 15),
    };
    (sign * v) as f32
}

fn reference(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let h = |i: usize| f16_bits_to_f32(u16::from_le_bytes([bytes[i], bytes[i + 1]]));
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 => {
            for i in (0..bytes.len()).step_by(4) {
                out.push(f32::from_bits(u32::from_le_bytes([
                    bytes[i],
                    bytes[i + 1],
                    bytes[i + 2],
                    bytes[i + 3],
                ])));
            }
        }
        GgmlType::F16 => {
            for i in (0..bytes.len()).step_by(2) {
                out.push(h(i));
            }
        }
        GgmlType::BF16 => {
            for i in (0..bytes.len()).step_by(2) {
                let hi = u32::from(u16::from_le_bytes([bytes[i], bytes[i + 1]]));
                out.push(f32::from_bits(hi << 16));
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let bs = if ty == GgmlType::Q4_0 { 18 } else { 20 };
            for b0 in (0..bytes.len()).step_by(bs) {
                let d = h(b0);
                let (m, qs) = if ty == GgmlType::Q4_0 {
                    (0.0, b0 + 2)
                } else {
                    (h(b0 + 2), b0 + 4)
                };
                for j in 0..32 {
                    let byte = bytes[qs + j % 16];
                    let nib = if j < 16 { byte & 15 } else { byte >> 4 };
                    out.push(if ty == GgmlType::Q4_0 {
                        (f32::from(nib) - 8.0) * d
                    } else {
                        f32::from(nib) * d + m
                    });
                }
            }
        }
        GgmlType::Q8_0 => {
            for b0 in (0..bytes.len()).step_by(34) {
                let d = h(b0);
                for j in 0..32 {
                    out.push(f32::from(bytes[b0 + 2 + j] as i8) * d);
                }
            }
        }
        _ => unreachable!(),
    }
    out
}

/// Random bytes for `blocks` blocks of `ty`, with finite f16 scales.
fn random_blocks(ty: GgmlType, blocks: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (_, bb) = ty.block();
    let mut out = Vec::new();
    for _ in 0..blocks {
        let mut blk: Vec<u8> = (0..bb).map(|_| next() as u8).collect();
        let scales = match ty {
            GgmlType::Q4_1 => 2,
            GgmlType::Q4_0 | GgmlType::Q8_0 => 1,
            _ => 0,
        };
        for k in 0..scales {
            // An f16 in ±[2^-10, 2^3): exponent field 5..17.
            let e = 5 + (next() % 13) as u16;
            let bits = ((next() as u16) & 0x8000) | (e << 10) | ((next() as u16) & 0x3ff);
            blk[2 * k..2 * k + 2].copy_from_slice(&bits.to_le_bytes());
        }
        if matches!(ty, GgmlType::F16) {
            // Keep halves finite (no exponent 31).
            for c in blk.chunks_mut(2) {
                c[1] &= 0xbb;
            }
        }
        out.extend(blk);
    }
    out
}

#[test]
fn every_type_dequantizes_bit_exactly_like_the_reference() {
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
    ] {
        let (per, _) = ty.block();
        for (blocks, seed) in [(1usize, 1u64), (3, 2), (64, 3)] {
            let bytes = random_blocks(ty, blocks, seed);
            let n = blocks as u64 * per;
            let got = dequantize(ty, &bytes, n).unwrap();
            let want = reference(ty, &bytes);
            assert_eq!(got.len(), want.len(), "{}", ty.name());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{} value {i}: {a} vs reference {b}",
                    ty.name()
                );
            }
        }
    }
}

#[test]
fn hand_built_blocks_give_the_documented_values() {
    // Q4_1: d = 0.5, m = -1, nibbles j (low) and 15 - j (high) → j·0.5 − 1 and (15 − j)·0.5 − 1.
    let mut blk = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    blk.extend(half::f16::from_f32(-1.0).to_le_bytes());
    blk.extend((0u8..16).map(|j| j | ((15 - j) << 4)));
    let v = dequantize(GgmlType::Q4_1, &blk, 32).unwrap();
    for j in 0..16 {
        assert_eq!(v[j], j as f32 * 0.5 - 1.0);
        assert_eq!(v[16 + j], (15 - j) as f32 * 0.5 - 1.0);
    }
    // Q8_0: d = 0.25, q_j = j − 16.
    let mut blk = half::f16::from_f32(0.25).to_le_bytes().to_vec();
    blk.extend((0..32).map(|j| (j as i8 - 16) as u8));
    let v = dequantize(GgmlType::Q8_0, &blk, 32).unwrap();
    for (j, x) in v.iter().enumerate() {
        assert_eq!(*x, (j as f32 - 16.0) * 0.25);
    }
    // Q4_0: d = 2, nibble 8 is zero, 0 is −16, 15 is 14.
    let mut blk = half::f16::from_f32(2.0).to_le_bytes().to_vec();
    blk.extend([0x08u8; 14]);
    blk.extend([0xf0u8, 0x0f]);
    let v = dequantize(GgmlType::Q4_0, &blk, 32).unwrap();
    assert_eq!(&v[..14], &[0.0; 14]);
    assert_eq!((v[14], v[15], v[30], v[31]), (-16.0, 14.0, 14.0, -16.0));
    // Wrong lengths and unsupported types are typed errors.
    assert!(dequantize(GgmlType::Q4_1, &blk, 32).is_err());
    assert!(dequantize(GgmlType::Q8_0, &[0; 34], 31).is_err());
    assert!(dequantize(GgmlType::Q4K, &[0; 144], 256).is_err());
}

#[test]
fn the_reader_reads_what_was_written() {
    let w: Vec<f32> = (0..64).map(|i| i as f32 * 0.5 - 3.0).collect();
    let mut q8 = half::f16::from_f32(0.125).to_le_bytes().to_vec();
    q8.extend((0..32).map(|j| j as u8));
    for alignment in [32u32, 64, 1] {
        let bytes = write_gguf(
            &[
                ("general.architecture", Meta::Str("llama".into())),
                ("general.alignment", Meta::U32(alignment)),
                ("x.f", Meta::F32(1.5)),
                ("x.b", Meta::Bool(true)),
                ("x.s", Meta::Strs(vec!["a".into(), "bé".into()])),
                ("x.i", Meta::I32s(vec![-1, 7])),
            ],
            &[
                ("w".into(), vec![16, 4], GgmlType::F32, f32_bytes(&w)),
                ("q".into(), vec![32], GgmlType::Q8_0, q8.clone()),
            ],
        );
        let f = GgufFile::from_bytes(bytes, "t.gguf").unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), u64::from(alignment));
        assert_eq!(f.data_start() % u64::from(alignment), 0);
        assert_eq!(f.get("x.f"), Some(&GgufValue::F32(1.5)));
        assert_eq!(f.get("x.b"), Some(&GgufValue::Bool(true)));
        assert_eq!(
            f.get("x.s").and_then(GgufValue::as_array).unwrap()[1].as_str(),
            Some("bé")
        );
        assert_eq!(
            f.get("x.i"),
            Some(&GgufValue::Array(vec![
                GgufValue::I32(-1),
                GgufValue::I32(7)
            ]))
        );
        let (shape, v) = f.tensor_f32("w").unwrap();
        assert_eq!(shape, vec![4, 16]);
        assert_eq!(v, w);
        let t = f.tensor("q").unwrap();
        assert_eq!(t.size(), vec![32]);
        assert_eq!(t.double_value(&[31]), 31.0 * 0.125);
        assert!(f.tensor("nope").is_err());
    }
}

#[test]
fn bad_headers_are_typed_errors_without_huge_allocations() {
    let good = write_gguf(
        &[("a", Meta::U32(1))],
        &[("w".into(), vec![4], GgmlType::F32, f32_bytes(&[1.0; 4]))],
    );
    assert!(GgufFile::from_bytes(good.clone(), "g").is_ok());
    let with = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        GgufFile::from_bytes(b, "g")
    };
    // Huge tensor and metadata counts, a huge key length: errors, not allocations.
    assert!(with(8, &u64::MAX.to_le_bytes()).is_err());
    assert!(with(16, &u64::MAX.to_le_bytes()).is_err());
    assert!(with(16, &(1u64 << 40).to_le_bytes()).is_err());
    assert!(with(24, &u64::MAX.to_le_bytes()).is_err());
    assert!(with(0, b"GGUG").is_err());
    assert!(with(4, &1u32.to_le_bytes()).is_err());
    assert!(with(4, &(3u32 << 24).to_le_bytes()).is_err());
    // Truncated anywhere: an error.
    for cut in 0..good.len() {
        assert!(
            GgufFile::from_bytes(good[..cut].to_vec(), "g").is_err(),
            "cut {cut}"
        );
    }
    // A tensor past the end, a misaligned offset, a first dimension that splits a block.
    let past = write_gguf(
        &[],
        &[("w".into(), vec![8], GgmlType::F32, f32_bytes(&[1.0; 4]))],
    );
    assert!(GgufFile::from_bytes(past, "g").is_err());
    let split = write_gguf(
        &[],
        &[("q".into(), vec![16, 2], GgmlType::Q8_0, vec![0; 34])],
    );
    assert!(GgufFile::from_bytes(split, "g").is_err());
    let bad_align = write_gguf(&[("general.alignment", Meta::U32(3))], &[]);
    assert!(GgufFile::from_bytes(bad_align, "g").is_err());
}

proptest! {
    #![proptest_config(raptor_testkit::fuzz::config(2000))]

    /// Arbitrary bytes, bytes after a valid prefix, and a valid file with a few bytes
    /// overwritten: a typed error or a file whose every tensor reads (or errors) without panic.
    #[test]
    fn arbitrary_bytes_never_panic(
        raw in proptest::collection::vec(any::<u8>(), 0..400),
        tail in proptest::collection::vec(any::<u8>(), 0..200),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let mut prefixed = b"GGUF\x03\x00\x00\x00".to_vec();
        prefixed.extend(&tail);
        let mut edited = write_gguf(
            &[("general.architecture", Meta::Str("llama".into())),
              ("tokenizer.ggml.tokens", Meta::Strs(vec!["a".into(), "b".into()]))],
            &[("w".into(), vec![32, 2], GgmlType::Q4_1, vec![7; 40]),
              ("v".into(), vec![2], GgmlType::F16, vec![0, 60, 0, 188])],
        );
        let n = edited.len();
        for (at, v) in edits {
            edited[at % n] = v;
        }
        for bytes in [raw.clone(), prefixed, edited] {
            if let Ok(f) = GgufFile::from_bytes(bytes, "fuzz.gguf") {
                for t in f.tensors().to_vec() {
                    let _ = f.tensor_f32(&t.name);
                }
                let _ = gguf_special_ids(&f);
                let _ = raptor_models::gguf_model::llama_config(&f, DecoderHead::LanguageModel);
            }
        }
    }
}

// ---------------------------------------------------------------- q/k permutation

/// llama.cpp's permutation written the way its converter states it (reshape to
/// `[heads, 2, d/2, cols]`, swap the middle axes, reshape back), on tensors.
fn llama_cpp_permute(w: &Tensor, heads: i64) -> Tensor {
    let size = w.size();
    let rows = size[0];
    let mut shape = vec![heads, 2, rows / heads / 2];
    shape.extend(&size[1..]);
    w.reshape(&shape).transpose(1, 2).reshape(&size)
}

fn to_vec(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1).contiguous()).unwrap()
}

#[test]
fn permutation_matches_the_converter_and_round_trips() {
    for (heads, d, cols) in [(1i64, 2i64, 3i64), (3, 4, 5), (9, 64, 7), (2, 8, 1)] {
        let w = Tensor::randn([heads * d, cols], (Kind::Float, Device::Cpu));
        let v = to_vec(&w);
        let p = permute_qk_rows(&v, (heads * d) as usize, cols as usize, heads as usize).unwrap();
        assert_eq!(
            p,
            to_vec(&llama_cpp_permute(&w, heads)),
            "heads {heads} d {d}"
        );
        let back =
            unpermute_qk_rows(&p, (heads * d) as usize, cols as usize, heads as usize).unwrap();
        assert_eq!(back, v);
        if d > 2 {
            assert_ne!(p, v, "the permutation moves rows");
        }
    }
    assert!(
        unpermute_qk_rows(&[0.0; 6], 3, 2, 1).is_err(),
        "odd head size"
    );
    assert!(
        unpermute_qk_rows(&[0.0; 6], 2, 2, 1).is_err(),
        "wrong length"
    );
}

/// Writes a Decoder's weights as llama.cpp would (GGUF names, q/k rows permuted, f32).
fn decoder_to_gguf(m: &raptor_models::Decoder, tokens: &[String]) -> Vec<u8> {
    let c = m.config();
    let vars = m.var_store().variables();
    let mut tensors = Vec::new();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    for name in names {
        let (g, permuted) = raptor_models::gguf_model::gguf_name(name).unwrap();
        let mut t = vars[name].detach();
        if permuted {
            let h = if name.contains("q_proj") {
                c.num_attention_heads
            } else {
                c.num_key_value_heads
            };
            t = llama_cpp_permute(&t, h);
        }
        let ne: Vec<u64> = t.size().iter().rev().map(|&d| d as u64).collect();
        tensors.push((g, ne, GgmlType::F32, f32_bytes(&to_vec(&t))));
    }
    write_gguf(
        &[
            ("general.architecture", Meta::Str("llama".into())),
            ("llama.embedding_length", Meta::U32(c.hidden_size as u32)),
            (
                "llama.feed_forward_length",
                Meta::U32(c.intermediate_size as u32),
            ),
            ("llama.block_count", Meta::U32(c.num_hidden_layers as u32)),
            (
                "llama.attention.head_count",
                Meta::U32(c.num_attention_heads as u32),
            ),
            (
                "llama.attention.head_count_kv",
                Meta::U32(c.num_key_value_heads as u32),
            ),
            ("llama.rope.freq_base", Meta::F32(c.rope_theta as f32)),
            ("llama.rope.dimension_count", Meta::U32(c.head_dim as u32)),
            (
                "llama.attention.layer_norm_rms_epsilon",
                Meta::F32(c.rms_norm_eps as f32),
            ),
            ("llama.context_length", Meta::U32(256)),
            ("tokenizer.ggml.model", Meta::Str("gpt2".into())),
            ("tokenizer.ggml.tokens", Meta::Strs(tokens.to_vec())),
            (
                "tokenizer.ggml.merges",
                Meta::Strs(vec!["a b".into(), "Ġ ab".into()]),
            ),
            (
                "tokenizer.ggml.token_type",
                Meta::I32s(
                    (0..tokens.len() as i32)
                        .map(|i| if i == 0 { 3 } else { 1 })
                        .collect(),
                ),
            ),
            ("tokenizer.ggml.eos_token_id", Meta::U32(0)),
        ],
        &tensors,
    )
}

#[test]
fn a_synthetic_llama_gguf_loads_back_to_the_hf_layout() {
    tch::manual_seed(7);
    for tied in [true, false] {
        let mut c = DecoderConfig::tiny(DecoderFamily::Llama, DecoderHead::LanguageModel);
        c.tie_word_embeddings = tied;
        c.rope_theta = 100000.0;
        c.rms_norm_eps = 1e-5f32 as f64;
        let hf = raptor_models::Decoder::new(c.clone(), Device::Cpu).unwrap();
        // A vocabulary of exactly vocab_size tokens: a control token, bytes, merges.
        let mut tokens: Vec<String> = vec![
            "<|endoftext|>".into(),
            "a".into(),
            "b".into(),
            "Ġ".into(),
            "ab".into(),
            "Ġab".into(),
        ];
        while tokens.len() < c.vocab_size as usize {
            tokens.push(format!("t{}", tokens.len()));
        }
        let dir =
            std::env::temp_dir().join(format!("raptor-gguf-test-{}-{tied}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        std::fs::write(&path, decoder_to_gguf(&hf, &tokens)).unwrap();

        let loaded = load_gguf_llama(&path, DecoderHead::LanguageModel, Device::Cpu).unwrap();
        assert_eq!(loaded.context_length, Some(256));
        let got = loaded.model;
        assert_eq!(got.config(), &c, "config from the metadata");
        let (a, b) = (hf.var_store().variables(), got.var_store().variables());
        assert_eq!(a.len(), b.len());
        for (name, t) in &a {
            assert!(t.equal(&b[name]), "{name} differs after the round trip");
        }
        let batch =
            Batch::from_records(&[vec![1, 4, 5, 2], vec![3, 5]], 0, None, Device::Cpu).unwrap();
        let la = tch::no_grad(|| hf.forward(&batch, &mut ForwardCtx::new(false))).unwrap();
        let lb = tch::no_grad(|| got.forward(&batch, &mut ForwardCtx::new(false))).unwrap();
        assert!(la.equal(&lb));

        // Without the inverse permutation the logits differ: the test can fail.
        let broken = raptor_models::Decoder::new(c.clone(), Device::Cpu).unwrap();
        let bv = broken.var_store().variables();
        tch::no_grad(|| {
            for (name, t) in &b {
                let src = if name.contains("q_proj") {
                    llama_cpp_permute(t, c.num_attention_heads)
                } else {
                    t.shallow_clone()
                };
                bv[name].shallow_clone().copy_(&src);
            }
        });
        let lc = tch::no_grad(|| broken.forward(&batch, &mut ForwardCtx::new(false))).unwrap();
        assert!((&lc - &la).abs().max().double_value(&[]) > 1e-4);

        // The tokenizer: the control token stays whole, merges apply.
        let f = GgufFile::open(&path).unwrap();
        let tok = gguf_tokenizer(&f).unwrap();
        assert_eq!(tok.vocab_size(), c.vocab_size as usize);
        assert_eq!(tok.encode("ab ab").unwrap(), vec![4, 5]);
        assert_eq!(tok.encode("a<|endoftext|>").unwrap(), vec![1, 0]);
        assert_eq!(gguf_special_ids(&f).unwrap().eos, Some(0));
        std::fs::remove_dir_all(&dir).ok();
    }
}

// ---------------------------------------------------------------- SmolLM2-135M-Instruct

fn smollm2_path() -> Option<PathBuf> {
    let cache = match std::env::var_os("RAPTOR_CACHE_DIR") {
        Some(d) => PathBuf::from(d),
        None => match std::env::var_os("XDG_CACHE_HOME") {
            Some(x) => PathBuf::from(x).join("raptor"),
            None => PathBuf::from(std::env::var_os("HOME")?)
                .join(".cache")
                .join("raptor"),
        },
    };
    Some(
        cache
            .join("models")
            .join("smollm2-135m-instruct")
            .join("SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
}

#[test]
fn smollm2_logits_match_transformers() {
    let Some(path) = smollm2_path().filter(|p| p.exists()) else {
        println!(
            "skipped: SmolLM2-135M-Instruct is not in the cache ({}); `cargo xtask setup --models` fetches it",
            smollm2_path()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        return;
    };
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/smollm2/golden.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let f = GgufFile::open(&path).unwrap();
    // The tokenizer agrees with transformers' GGUF tokenizer on every prompt.
    let tok = gguf_tokenizer(&f).unwrap();
    for p in golden["prompts"].as_array().unwrap() {
        let want: Vec<u32> = p["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let text = p["text"].as_str().unwrap();
        assert_eq!(tok.encode(text).unwrap(), want, "token ids of {text:?}");
        assert_eq!(
            tok.decode(&want).unwrap(),
            text.replace("<|im_start|>", "").replace("<|im_end|>", "")
        );
    }
    let ids = gguf_special_ids(&f).unwrap();
    assert_eq!((ids.bos, ids.eos), (Some(1), Some(2)));

    let t0 = std::time::Instant::now();
    let m = raptor_models::gguf_model::load_gguf_llama_from(
        &f,
        DecoderHead::LanguageModel,
        Device::Cpu,
    )
    .unwrap();
    let load_s = t0.elapsed().as_secs_f64();
    let c = m.model.config();
    assert_eq!(
        (
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.vocab_size,
            c.tie_word_embeddings
        ),
        (30, 576, 9, 3, 49152, true)
    );
    // The q/k weights in the HF layout, exactly as transformers dequantized them.
    let vars = m.model.var_store().variables();
    let mut worst_w = 0f64;
    for proj in ["q_proj", "k_proj"] {
        let w = &vars[&format!("model.layers.0.self_attn.{proj}.weight")];
        let g = &golden["weights"][proj];
        for (r, row) in g["rows"]
            .as_array()
            .unwrap()
            .iter()
            .zip(g["values"].as_array().unwrap())
        {
            for (cidx, v) in row.as_array().unwrap().iter().enumerate() {
                let ours = w.double_value(&[r.as_i64().unwrap(), cidx as i64]);
                worst_w = worst_w.max((ours - v.as_f64().unwrap()).abs());
            }
        }
        let sums = w.sum_dim_intlist(1, false, Kind::Double);
        for (r, s) in g["row_sums"].as_array().unwrap().iter().enumerate() {
            let d = (sums.double_value(&[r as i64]) - s.as_f64().unwrap()).abs();
            assert!(
                d < 2e-4,
                "{proj} row {r} sum differs by {d}: q/k rows in the wrong order?"
            );
        }
    }
    assert!(worst_w <= 1e-6, "weights differ by {worst_w}");

    let prompt: Vec<i64> = golden["prompts"][0]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let batch = Batch::from_records(&[prompt], 0, None, Device::Cpu).unwrap();
    let t1 = std::time::Instant::now();
    let logits = tch::no_grad(|| m.model.forward(&batch, &mut ForwardCtx::new(false))).unwrap();
    let fwd_s = t1.elapsed().as_secs_f64();
    let mut worst = 0f64;
    let mut scale = 0f64;
    for row in golden["logits"].as_array().unwrap() {
        let pos = row["position"].as_i64().unwrap();
        let r = logits.get(0).get(pos);
        for (id, v) in row["ids"]
            .as_array()
            .unwrap()
            .iter()
            .zip(row["logits"].as_array().unwrap())
        {
            let ours = r.double_value(&[id.as_i64().unwrap()]);
            worst = worst.max((ours - v.as_f64().unwrap()).abs());
            scale = scale.max(v.as_f64().unwrap().abs());
        }
        let lse = r.logsumexp([0], false).double_value(&[]);
        worst = worst.max((lse - row["logsumexp"].as_f64().unwrap()).abs());
        // The top token agrees.
        assert_eq!(
            r.argmax(0, false).int64_value(&[]),
            row["ids"][0].as_i64().unwrap(),
            "top token at {pos}"
        );
    }
    let rel = worst / scale.max(1.0);
    println!(
        "smollm2: max |logit difference| {worst:.2e} (relative to max |logit| {scale:.1}: {rel:.2e}); load {load_s:.1} s, forward {fwd_s:.2} s"
    );
    assert!(
        rel < 1e-3 && worst < 1e-3,
        "logits differ by {worst} (relative {rel})"
    );
}
