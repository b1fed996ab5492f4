//! `raptor upcycle`: a dense Llama folder becomes a Mixtral folder with the same logits
//! (identical experts); a non-Llama folder is a clean error (exit code 2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use raptor_models::checkpoint::{LoadOptions, load_decoder, save_pretrained};
use raptor_models::{Batch, Decoder, DecoderConfig, DecoderFamily, DecoderHead, ForwardCtx, Model};
use std::process::Command;
use tch::Device;

#[test]
fn upcycle_cli_writes_a_mixtral_folder_with_the_dense_logits() {
    let dir = std::env::temp_dir().join(format!("raptor-cli-upcycle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dense = raptor_models::rng::seeded(3, || {
        Decoder::new(
            DecoderConfig::tiny(DecoderFamily::Llama, DecoderHead::LanguageModel),
            Device::Cpu,
        )
    })
    .unwrap();
    save_pretrained(&dense, dir.join("dense")).unwrap();
    std::fs::write(dir.join("dense/tokenizer.json"), "{}").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_raptor"))
        .args(["upcycle", "--model"])
        .arg(dir.join("dense"))
        .arg("--out")
        .arg(dir.join("moe"))
        .args([
            "--experts",
            "4",
            "--top-k",
            "2",
            "--seed",
            "7",
            "--router-std",
            "1.0",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.join("moe/tokenizer.json").is_file());
    let moe = load_decoder(
        dir.join("moe"),
        DecoderHead::LanguageModel,
        Device::Cpu,
        &LoadOptions::exact(),
    )
    .unwrap()
    .model;
    assert_eq!(moe.config().family, DecoderFamily::Mixtral);
    assert_eq!((moe.num_experts(), moe.top_k()), (4, 2));
    let b = Batch::from_records(&[vec![1, 5, 9, 3], vec![2, 4]], 0, None, Device::Cpu).unwrap();
    let (a, c) = tch::no_grad(|| {
        (
            dense.forward(&b, &mut ForwardCtx::new(false)).unwrap(),
            moe.forward(&b, &mut ForwardCtx::new(false)).unwrap(),
        )
    });
    assert!((a - c).abs().max().double_value(&[]) < 1e-5);
    // Upcycling the MoE folder again: a clean error.
    let bad = Command::new(env!("CARGO_BIN_EXE_raptor"))
        .args(["upcycle", "--model"])
        .arg(dir.join("moe"))
        .arg("--out")
        .arg(dir.join("again"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("dense llama"));
    std::fs::remove_dir_all(&dir).ok();
}
