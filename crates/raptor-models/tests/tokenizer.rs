//! Tokenizers: GPT-2 BPE (tiktoken-rs `r50k_base`) against ids computed by Hugging Face
//! `tokenizers` from GPT-2's original vocabulary files, corpus-trained WordPiece and byte-level
//! BPE tokenizers (round trips, `tokenizer.json` save/load), and the typed errors of record
//! encoding (empty record, id out of range, bad files).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use raptor_models::ModelError;
use raptor_models::tokenizer::{
    CorpusModel, CorpusTokenizer, CorpusTokenizerConfig, GPT2_EOS, GPT2_VOCAB_SIZE, Gpt2Tokenizer,
    TextTokenizer, check_token_ids, encode_records,
};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn gpt2() -> &'static Gpt2Tokenizer {
    static TOK: OnceLock<Gpt2Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Gpt2Tokenizer::new().unwrap())
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("raptor-tok-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn gpt2_matches_hf_tokenizers_golden_ids() {
    let doc = raptor_testkit::golden::json("models/gpt2_tokenizer/golden.json");
    assert_eq!(doc["vocab_size"].as_u64(), Some(GPT2_VOCAB_SIZE as u64));
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expect: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let ids = gpt2().encode(text).unwrap();
        assert_eq!(ids, expect, "{text:?}");
        assert_eq!(gpt2().decode(&ids).unwrap(), text);
    }
}

#[test]
fn gpt2_special_token_handling() {
    let t = gpt2();
    assert_eq!(
        t.encode_with_special_tokens("<|endoftext|>"),
        vec![GPT2_EOS]
    );
    let plain = t.encode("<|endoftext|>").unwrap();
    assert!(plain.len() > 1 && !plain.contains(&GPT2_EOS));
    assert_eq!(t.decode(&[GPT2_EOS]).unwrap(), "<|endoftext|>");
    assert_eq!(t.vocab_size(), GPT2_VOCAB_SIZE);
    assert_eq!(t.pad_id(), GPT2_EOS);
    match t.decode(&[15496, GPT2_VOCAB_SIZE as u32]) {
        Err(ModelError::Tokenizer(msg)) => assert!(msg.contains("50257"), "{msg}"),
        other => panic!("expected a tokenizer error, got {other:?}"),
    }
}

const CORPUS: &[&str] = &[
    "the cat sat on the mat",
    "the dog sat on the log",
    "a private model learns from many records",
    "each record is clipped before the noise is added",
    "the experts of a mixture are routed by a gate",
    "the gate sends each token to one expert",
    "differential privacy bounds what one record can change",
    "the cat and the dog are friends",
    "many experts and many tokens",
    "noise is added to the clipped sum of gradients",
];

fn corpus_lines() -> Vec<String> {
    // Repeat so that min_frequency 2 merges happen.
    (0..3)
        .flat_map(|_| CORPUS.iter().map(|s| s.to_string()))
        .collect()
}

#[test]
fn wordpiece_trained_on_a_corpus_round_trips_and_saves() {
    let cfg = CorpusTokenizerConfig {
        model: CorpusModel::WordPiece,
        vocab_size: 200,
        min_frequency: 2,
        lowercase: true,
    };
    let tok = CorpusTokenizer::train(corpus_lines(), &cfg).unwrap();
    assert!(
        tok.vocab_size() <= 200 && tok.vocab_size() > 30,
        "{}",
        tok.vocab_size()
    );
    for (i, s) in CorpusTokenizer::SPECIAL_TOKENS.iter().enumerate() {
        assert_eq!(tok.token_to_id(s), Some(i as u32), "{s}");
    }
    assert_eq!(tok.pad_id(), 0);
    for line in CORPUS {
        let ids = tok.encode(line).unwrap();
        assert!(!ids.is_empty());
        assert!(!ids.contains(&1), "[UNK] in {line:?}");
        assert_eq!(tok.decode(&ids).unwrap(), *line);
    }
    // Lowercasing; an unseen character becomes [UNK].
    assert_eq!(
        tok.encode("The CAT").unwrap(),
        tok.encode("the cat").unwrap()
    );
    assert!(tok.encode("ζ").unwrap().contains(&1));

    let dir = tmpdir("wp");
    let path = dir.join("tokenizer.json");
    tok.save(&path).unwrap();
    let back = CorpusTokenizer::from_file(&path).unwrap();
    assert_eq!(back.vocab_size(), tok.vocab_size());
    assert_eq!(back.pad_id(), 0);
    for line in CORPUS
        .iter()
        .chain(["unseen words here", "the Cat, sat!"].iter())
    {
        assert_eq!(
            back.encode(line).unwrap(),
            tok.encode(line).unwrap(),
            "{line:?}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn bpe() -> &'static CorpusTokenizer {
    static TOK: OnceLock<CorpusTokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let cfg = CorpusTokenizerConfig {
            model: CorpusModel::ByteLevelBpe,
            vocab_size: 400,
            min_frequency: 2,
            lowercase: false,
        };
        CorpusTokenizer::train(corpus_lines(), &cfg).unwrap()
    })
}

#[test]
fn byte_level_bpe_is_lossless_and_learns_merges() {
    let tok = bpe();
    assert_eq!(tok.token_to_id("[PAD]"), Some(0));
    // 4 specials + 256 bytes + merges.
    assert!(
        tok.vocab_size() > 260 && tok.vocab_size() <= 400,
        "{}",
        tok.vocab_size()
    );
    // Frequent words become single tokens, so corpus lines take fewer tokens than bytes.
    let line = CORPUS[4];
    assert!(tok.encode(line).unwrap().len() * 2 < line.len());
    for s in [
        "Unicode: café, 東京 🙂",
        "  spaces\tand\nnewlines ",
        "The Cat",
    ] {
        let ids = tok.encode(s).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), s);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn byte_level_tokenizers_round_trip_any_text(s in "\\PC{0,40}") {
        let ids = gpt2().encode(&s).unwrap();
        prop_assert_eq!(gpt2().decode(&ids).unwrap(), s.clone());
        let ids = bpe().encode(&s).unwrap();
        prop_assert_eq!(bpe().decode(&ids).unwrap(), s);
    }
}

#[test]
fn encode_records_errors_name_the_record() {
    let tok = gpt2();
    let recs = encode_records(
        tok,
        &["Hello world", "a b c d e f g h"],
        4,
        Some(GPT2_VOCAB_SIZE as i64),
    )
    .unwrap();
    assert_eq!(recs[0], vec![15496, 995]);
    assert_eq!(recs[1].len(), 4, "truncated to max_len");
    match encode_records(tok, &["fine", "", "also fine"], 8, None) {
        Err(ModelError::EmptyRecord { record, .. }) => assert_eq!(record, 1),
        other => panic!("expected EmptyRecord, got {other:?}"),
    }
    // WordPiece drops whitespace: a blank record is empty.
    let wp = CorpusTokenizer::train(
        corpus_lines(),
        &CorpusTokenizerConfig {
            vocab_size: 100,
            ..CorpusTokenizerConfig::default()
        },
    )
    .unwrap();
    match encode_records(&wp, &["the cat", "   \t "], 8, None) {
        Err(ModelError::EmptyRecord { record, why }) => {
            assert_eq!(record, 1);
            assert!(why.contains("empty"), "{why}");
        }
        other => panic!("expected EmptyRecord, got {other:?}"),
    }
    // A model vocabulary smaller than the tokenizer's: the first offending id is named.
    match encode_records(tok, &["a", "Hello world"], 8, Some(1000)) {
        Err(ModelError::TokenOutOfRange {
            record,
            position,
            id,
            vocab_size,
        }) => {
            assert_eq!((record, position, id, vocab_size), (1, 0, 15496, 1000));
        }
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
    assert!(matches!(
        check_token_ids(&[vec![0, 3], vec![-1]], 5),
        Err(ModelError::TokenOutOfRange {
            record: 1,
            position: 0,
            id: -1,
            ..
        })
    ));
    assert!(check_token_ids(&[vec![0, 4]], 5).is_ok());
    assert!(matches!(
        encode_records(tok, &["x"], 0, None),
        Err(ModelError::InvalidConfig(_))
    ));
}

#[test]
fn bad_tokenizer_files_and_settings_are_typed_errors() {
    let dir = tmpdir("bad");
    assert!(matches!(
        CorpusTokenizer::from_file(dir.join("absent.json")),
        Err(ModelError::Io { .. })
    ));
    let p = dir.join("tokenizer.json");
    std::fs::write(&p, "{ this is not a tokenizer").unwrap();
    match CorpusTokenizer::from_file(&p) {
        Err(ModelError::Tokenizer(msg)) => assert!(msg.contains("tokenizer.json"), "{msg}"),
        other => panic!("expected a tokenizer error, got {other:?}"),
    }
    let cfg = CorpusTokenizerConfig {
        vocab_size: 4,
        ..CorpusTokenizerConfig::default()
    };
    assert!(matches!(
        CorpusTokenizer::train(corpus_lines(), &cfg),
        Err(ModelError::Tokenizer(_))
    ));
    let wp = bpe();
    assert!(matches!(
        wp.decode(&[100_000]),
        Err(ModelError::Tokenizer(_))
    ));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bert_wordpiece_tokenizer_json_matches_hf_with_padding_and_truncation_off() {
    // A WordPiece tokenizer.json saved (like all-MiniLM-L6-v2's) with padding and truncation to
    // 128 on; golden ids by Python `tokenizers` with both off, [CLS] … [SEP] added.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/bert_tokenizer");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let padded = CorpusTokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let tok = CorpusTokenizer::from_file_unpadded(dir.join("tokenizer.json")).unwrap();
    assert_eq!(tok.vocab_size() as u64, doc["vocab_size"].as_u64().unwrap());
    assert_eq!((tok.pad_id(), tok.token_to_id("[CLS]")), (0, Some(2)));
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expect: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            tok.encode_with_special_tokens(text).unwrap(),
            expect,
            "{text:?}"
        );
        // Without special tokens: the same ids less [CLS] and [SEP].
        assert_eq!(
            tok.encode(text).unwrap(),
            expect[1..expect.len() - 1].to_vec(),
            "{text:?}"
        );
        // The file as saved pads to 128.
        assert_eq!(padded.encode_with_special_tokens(text).unwrap().len(), 128);
    }
    // Truncation is off too: a long input keeps every token.
    let long = "the ".repeat(300);
    assert_eq!(tok.encode_with_special_tokens(&long).unwrap().len(), 302);
}

/// The same corpus trains the same WordPiece tokenizer, ids and vocabulary, every time. The
/// trainer would add the `##`-continuation pieces in a hash map's order (another in every
/// instance and process), and break ties between equally frequent merges by those ids: with
/// many distinct characters and a vocabulary cut among tied merges, as here, two trainings
/// then differ almost surely (in ids and in which merges make the cut). `train` registers the
/// pieces first, in character order.
#[test]
fn a_corpus_trains_the_same_wordpiece_ids_every_time() {
    let words: Vec<String> = (0..400)
        .map(|i| {
            let a = char::from(b'a' + (i % 26) as u8);
            let b = char::from(b'a' + (i * 7 % 26) as u8);
            let c = char::from_u32(0x3b1 + (i % 20) as u32).unwrap(); // α, β, …
            let d = char::from(b'0' + (i % 10) as u8);
            format!("{a}{b}{c}{d}{a} {b}{a}{d}{c}")
        })
        .collect();
    let cfg = CorpusTokenizerConfig {
        vocab_size: 300,
        ..CorpusTokenizerConfig::default()
    };
    let train = || CorpusTokenizer::train(words.iter().map(String::as_str), &cfg).unwrap();
    let json = |t: &CorpusTokenizer| t.inner().to_string(false).unwrap();
    let first = train();
    for _ in 0..4 {
        assert_eq!(json(&train()), json(&first));
    }
    for (i, s) in CorpusTokenizer::SPECIAL_TOKENS.iter().enumerate() {
        assert_eq!(first.token_to_id(s), Some(i as u32));
    }
    let text = "abα0a zqβ9 hello";
    assert_eq!(first.encode(text).unwrap(), train().encode(text).unwrap());
    // The continuation pieces are ordinary vocabulary again: only the four specials are added
    // tokens, and `##a` inside a word is the piece.
    assert_eq!(first.inner().get_added_tokens_decoder().len(), 4);
    assert!(first.token_to_id("##a").is_some() && first.token_to_id("a").is_some());
}
