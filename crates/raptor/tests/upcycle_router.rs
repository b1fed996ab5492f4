//! `raptor upcycle --router-data`: the routers of an upcycled MoE-BERT trained briefly on public
//! text (non-privately, Switch load-balancing loss) spread the public tokens over the experts
//! more evenly than the random routers of the same seed, measured here independently of what
//! the command reports; and private training afterwards leaves them frozen (no router tensor is
//! trainable or checkpointed, and the model still computes the same routing).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use raptor_models::checkpoint::{LoadOptions, load_bert, save_pretrained};
use raptor_models::upcycle::{bert_router_inputs, bert_router_loads};
use raptor_models::{Batch, Bert, BertConfig, BertPooling};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn upcycle(dense: &Path, out: &Path, router: bool) -> serde_json::Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_raptor"));
    cmd.args(["upcycle", "--model"])
        .arg(dense)
        .arg("--out")
        .arg(out)
        .args(["--experts", "4", "--top-k", "1", "--seed", "5", "--json"]);
    if router {
        cmd.arg("--router-data")
            .arg(root().join("examples/toy/public.csv"))
            .args([
                "--router-tokenizer",
                "bytes",
                "--router-max-length",
                "24",
                "--router-steps",
                "150",
                "--router-lr",
                "0.05",
            ]);
    }
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The public records as byte-tokenized batches (what the trained router saw).
fn public_batches() -> Vec<Batch> {
    let spec = raptor_data::TableSpec::new("text", None);
    let ds = raptor_data::read_table(&root().join("examples/toy/public.csv"), &spec).unwrap();
    let ids: Vec<Vec<i64>> = ds
        .records
        .iter()
        .map(|r| r.text.bytes().take(24).map(|b| i64::from(b) + 3).collect())
        .collect();
    ids.chunks(64)
        .map(|c| Batch::from_records(c, 0, None, tch::Device::Cpu).unwrap())
        .collect()
}

fn load(dir: &Path) -> Bert {
    load_bert(
        dir,
        2,
        BertPooling::Mean,
        tch::Device::Cpu,
        &LoadOptions::strict(),
    )
    .unwrap()
    .model
}

#[test]
fn trained_routers_balance_the_public_load_and_stay_frozen() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = BertConfig::tiny(2);
    cfg.vocab_size = 260;
    let dense = raptor_models::rng::seeded(21, || Bert::new(cfg, tch::Device::Cpu)).unwrap();
    save_pretrained(&dense, tmp.path().join("dense")).unwrap();
    let random = upcycle(&tmp.path().join("dense"), &tmp.path().join("random"), false);
    assert!(random.get("router_training").is_none());
    let trained = upcycle(&tmp.path().join("dense"), &tmp.path().join("trained"), true);
    let rt = &trained["router_training"];
    assert!(rt["public_records"].as_u64().unwrap() > 50, "{rt}");

    // Measured here on the public tokens, independently of the report.
    let batches = public_batches();
    let (m_random, m_trained) = (
        load(&tmp.path().join("random")),
        load(&tmp.path().join("trained")),
    );
    let inputs = bert_router_inputs(&m_random, &batches).unwrap();
    let before = bert_router_loads(&m_random, &inputs).unwrap();
    let after = bert_router_loads(&m_trained, &inputs).unwrap();
    assert_eq!(before.len(), 2);
    for (b, a) in before.iter().zip(&after) {
        println!(
            "layer {}: load CV {:.3} -> {:.3}, loads {:?} -> {:?}",
            b.layer, b.load_cv, a.load_cv, b.load, a.load
        );
        assert!(
            a.load_cv < 0.8 * b.load_cv,
            "layer {}: trained router not more balanced: CV {} -> {}",
            b.layer,
            b.load_cv,
            a.load_cv
        );
        assert!(a.balance_loss < b.balance_loss, "{b:?} -> {a:?}");
        // The report says the same as the measurement (same tokens, same routers).
        let reported = &rt["after"][b.layer]["load_cv"];
        assert!(
            (reported.as_f64().unwrap() - a.load_cv).abs() < 1e-4,
            "{reported}"
        );
    }
    // The random routers of the same seed are what training started from.
    for (r, b) in rt["before"].as_array().unwrap().iter().zip(&before) {
        assert!((r["load_cv"].as_f64().unwrap() - b.load_cv).abs() < 1e-4);
    }

    // Private training afterwards: RAPTOR on the trained-router model; no router tensor is
    // trainable, and none is in the checkpoint of trainable tensors.
    let toy = root().join("examples/toy");
    let run_cfg = format!(
        r#"[data]
train = "{}"
validation = "{}"
public = "{}"
max_length = 24
[model]
kind = "moe-bert"
path = "{}"
tokenizer = "bytes"
[method]
name = "raptor"
[privacy]
epsilon = 8.0
[lora]
r = 2
[train]
batch_size = 32.0
steps = 3
lr = 0.02
micro_batch = 32
checkpoint_every = 3
insecure_seed = 4
"#,
        toy.join("train.csv").display(),
        toy.join("valid.csv").display(),
        toy.join("public.csv").display(),
        tmp.path().join("trained").display()
    );
    std::fs::write(tmp.path().join("run.toml"), run_cfg).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_raptor"))
        .args(["train", "--config"])
        .arg(tmp.path().join("run.toml"))
        .arg("--runs-dir")
        .arg(tmp.path().join("runs"))
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rec: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let eps = rec["epsilon"]["upper"].as_f64().unwrap();
    assert!(eps > 0.0 && eps <= 8.0, "{eps}");
    let trainable = rec["trainable_parameters"].as_object().unwrap();
    assert!(!trainable.is_empty());
    assert!(
        trainable.keys().all(|k| !k.contains("moe.gate")),
        "a router is trainable: {:?}",
        trainable.keys().collect::<Vec<_>>()
    );
    let run = std::fs::read_dir(tmp.path().join("runs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let ckpt: Vec<PathBuf> = std::fs::read_dir(run.join("checkpoint"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("trainable-"))
        })
        .collect();
    assert!(!ckpt.is_empty());
    for f in ckpt {
        let names: Vec<String> = tch::Tensor::read_safetensors(&f)
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert!(!names.is_empty());
        assert!(names.iter().all(|n| !n.contains("moe.gate")), "{names:?}");
    }
}
