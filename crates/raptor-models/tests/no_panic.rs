//! Arbitrary bytes never make the model-side parsers panic, hang or allocate without bound: HF
//! `config.json`, safetensors headers and `tokenizer.json` files (a stable proptest fuzz
//! harness, as in `raptor-data`; long runs in `docs/fuzzing.md`). Brief by default;
//! `RAPTOR_FUZZ_CASES=N` for a long run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use raptor_models::checkpoint::SafetensorsFile;
use raptor_models::hf_config::HfConfig;
use raptor_models::tokenizer::CorpusTokenizer;
use raptor_testkit::{bad_inputs, fuzz};

/// Bytes after a valid-looking prefix, mostly JSON structure and digits.
fn bytes_like(prefix: &'static str) -> impl Strategy<Value = Vec<u8>> {
    fuzz::bytes_after(
        prefix,
        b"{}[]:,\" \n0123456789-.eE+truefalsnmodel_typegpt2olmoeswitch\\\xff\xc3",
        0..300,
    )
}

/// A safetensors file: 8-byte little-endian header length, then `header`, then `tail`.
fn safetensors(len: u64, header: &[u8], tail: &[u8]) -> Vec<u8> {
    let mut b = len.to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.extend_from_slice(tail);
    b
}

proptest! {
    #![proptest_config(fuzz::config(2000))]

    #[test]
    fn hf_config_json(
        a in bytes_like("{\"model_type\": \"gpt2\", \"n_embd\": "),
        b in bytes_like("{\"model_type\": \"olmoe\", \"num_experts\": "),
        c in bytes_like("{\"model_type\": \"switch_transformers\", \"d_model\": "),
        raw in fuzz::arbitrary_bytes(0..300),
    ) {
        for input in [&a, &b, &c, &raw] {
            let text = String::from_utf8_lossy(input);
            if let Ok(cfg) = HfConfig::from_json_str(&text, "fuzz") {
                // A config that parses has a usable vocabulary size.
                prop_assert!(cfg.vocab_size() > 0);
            }
        }
    }

    #[test]
    fn safetensors_header(
        header in bytes_like("{\"w\": {\"dtype\": \"F32\", \"shape\": ["),
        tail in fuzz::arbitrary_bytes(0..64),
        len in prop_oneof![Just(None), any::<u64>().prop_map(Some), (0u64..400).prop_map(Some)],
        raw in fuzz::arbitrary_bytes(0..300),
    ) {
        // The header length as written, or any claimed length (up to 2^64 - 1: it must never be
        // allocated, only checked against the bytes present).
        let n = len.unwrap_or(header.len() as u64);
        for bytes in [safetensors(n, &header, &tail), raw.clone()] {
            if let Ok(f) = SafetensorsFile::from_bytes(bytes, "fuzz.safetensors") {
                for name in f.names() {
                    // Reading a tensor of a validated file is a typed error or a tensor.
                    let _ = f.tensor(&name);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(fuzz::config(2000))]

    /// In memory (what `from_file` calls after reading the file), so a long run reaches 10^6
    /// inputs; `tokenizer_file` below covers the path through the filesystem.
    #[test]
    fn tokenizer_json(
        a in bytes_like("{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\", \"vocab\": {"),
        b in bytes_like("{\"version\": \"1.0\", \"truncation\": null, \"padding\": {\"pad_id\": "),
        c in bytes_like("{\"version\": \"1.0\", \"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"vocab\": {"),
        raw in fuzz::arbitrary_bytes(0..300),
    ) {
        for input in [&a, &b, &c, &raw] {
            if let Ok(t) = CorpusTokenizer::from_json_bytes(input, "fuzz") {
                let _ = t.token_to_id("a");
            }
        }
    }
}

proptest! {
    // 200 cases by default: each goes through the filesystem; at most 2,000 in a long run.
    #![proptest_config(ProptestConfig { cases: fuzz::fuzz_cases(200).min(2000), ..ProptestConfig::default() })]

    #[test]
    fn tokenizer_file(
        a in bytes_like("{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\", \"vocab\": {"),
        raw in fuzz::arbitrary_bytes(0..300),
    ) {
        let dir = std::env::temp_dir().join(format!("raptor-fuzz-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokenizer.json");
        for input in [&a, &raw] {
            std::fs::write(&path, input).unwrap();
            let from_file = CorpusTokenizer::from_file(&path).map(|t| t.token_to_id("a"));
            let from_bytes = CorpusTokenizer::from_json_bytes(input, "fuzz").map(|t| t.token_to_id("a"));
            // The file path and the in-memory path agree.
            prop_assert_eq!(from_file.ok(), from_bytes.ok());
        }
    }
}

/// The corpus of nasty inputs under `fixtures/bad-inputs/raptor-models/`: each gives a typed
/// error whose message contains the text in `expected.tsv` (a 2 GB or 2^64 "length" in a
/// safetensors header is checked against the bytes present, never allocated); every file of the
/// folder is listed there.
#[test]
fn every_bad_input_gives_its_error() {
    bad_inputs::check("raptor-models", |input| {
        let path = &input.path;
        match input.setting.as_str() {
            "safetensors" => SafetensorsFile::open(path)
                .and_then(|f| f.tensors())
                .map(|_| ()),
            "hf_config" => HfConfig::from_file(path).map(|_| ()),
            "tokenizer" => CorpusTokenizer::from_file(path).map(|_| ()),
            other => panic!("unknown reader {other}"),
        }
    });
}
