//! safetensors checkpoints: round trips, Hugging Face layouts (GPT-2 Conv1D transposition, tied
//! weights, optional prefixes, shards), dtype conversion, strict/lenient reports, and typed
//! errors for missing, unexpected, wrong-shape, wrong-dtype and corrupt input.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use raptor_models::ModelError;
use raptor_models::checkpoint::{
    HfLayout, LoadMode, LoadOptions, SafetensorsFile, SaveOptions, load_var_store,
    read_safetensors, resolve_checkpoint, save_named, save_var_store, write_safetensors,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::nn::{Init, VarStore};
use tch::{Device, Kind, Tensor};

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("raptor-ckpt-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn var(vs: &VarStore, name: &str, dims: &[i64], init: Init) -> Tensor {
    let comps: Vec<&str> = name.split('.').collect();
    let (last, dirs) = comps.split_last().unwrap();
    let mut p = vs.root();
    for c in dirs {
        p = p.sub(*c);
    }
    p.f_var(last, dims, init).unwrap()
}

fn add(vs: &VarStore, name: &str, dims: &[i64], init: Init) {
    let _ = var(vs, name, dims, init);
}

const RANDN: Init = Init::Randn {
    mean: 0.0,
    stdev: 1.0,
};
const ZERO: Init = Init::Const(0.0);

/// A tiny GPT-2-shaped store (d = 4, inner 6, vocab 5, 3 positions).
fn gpt2_store(init: Init, with_lm_head: bool) -> VarStore {
    let vs = VarStore::new(Device::Cpu);
    add(&vs, "transformer.wte.weight", &[5, 4], init);
    add(&vs, "transformer.wpe.weight", &[3, 4], init);
    add(&vs, "transformer.h.0.attn.c_attn.weight", &[12, 4], init);
    add(&vs, "transformer.h.0.attn.c_attn.bias", &[12], init);
    add(&vs, "transformer.h.0.attn.c_proj.weight", &[4, 4], init);
    add(&vs, "transformer.h.0.mlp.c_fc.weight", &[6, 4], init);
    add(&vs, "transformer.h.0.mlp.c_proj.weight", &[4, 6], init);
    add(&vs, "transformer.ln_f.weight", &[4], init);
    if with_lm_head {
        add(&vs, "lm_head.weight", &[5, 4], init);
    }
    vs
}

fn assert_stores_equal(a: &VarStore, b: &VarStore) {
    let (va, vb) = (a.variables(), b.variables());
    assert_eq!(va.len(), vb.len());
    for (k, t) in &va {
        assert!(t.equal(&vb[k]), "variable {k} differs");
    }
}

#[test]
fn gpt2_round_trip_transposes_conv1d_on_disk() {
    let dir = tmpdir("gpt2rt");
    let path = dir.join("model.safetensors");
    let vs = gpt2_store(RANDN, false);
    let written = save_var_store(&vs, &path, &HfLayout::gpt2(), &SaveOptions::default()).unwrap();
    assert_eq!(written.len(), 8);

    // On disk: Conv1D weights [in, out] and equal to the transpose of the variable.
    let f = SafetensorsFile::open(&path).unwrap();
    assert_eq!(
        f.metadata().unwrap().get("format").map(String::as_str),
        Some("pt")
    );
    let vars = vs.variables();
    for (name, shape) in [
        ("transformer.h.0.attn.c_attn.weight", vec![4, 12]),
        ("transformer.h.0.attn.c_proj.weight", vec![4, 4]),
        ("transformer.h.0.mlp.c_fc.weight", vec![4, 6]),
        ("transformer.h.0.mlp.c_proj.weight", vec![6, 4]),
    ] {
        assert_eq!(f.shape(name), Some(shape), "{name}");
        assert!(
            f.tensor(name).unwrap().equal(&vars[name].tr()),
            "{name} not transposed on disk"
        );
    }
    // Non-Conv1D tensors as they are.
    assert!(
        f.tensor("transformer.wte.weight")
            .unwrap()
            .equal(&vars["transformer.wte.weight"])
    );
    assert!(
        f.tensor("transformer.h.0.attn.c_attn.bias")
            .unwrap()
            .equal(&vars["transformer.h.0.attn.c_attn.bias"])
    );

    let vs2 = gpt2_store(ZERO, false);
    let report = load_var_store(&vs2, &path, &HfLayout::gpt2(), &LoadOptions::exact()).unwrap();
    assert_eq!(report.loaded.len(), 8);
    assert_eq!(report.transposed.len(), 4);
    assert!(
        report.missing.is_empty() && report.unexpected.is_empty() && report.converted.is_empty()
    );
    assert_stores_equal(&vs, &vs2);

    // The directory form finds model.safetensors.
    let vs3 = gpt2_store(ZERO, false);
    load_var_store(&vs3, &dir, &HfLayout::gpt2(), &LoadOptions::exact()).unwrap();
    assert_stores_equal(&vs, &vs3);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn identity_layout_does_not_transpose() {
    let dir = tmpdir("ident");
    let path = dir.join("m.safetensors");
    let vs = gpt2_store(RANDN, false);
    save_var_store(&vs, &path, &HfLayout::identity(), &SaveOptions::default()).unwrap();
    let f = SafetensorsFile::open(&path).unwrap();
    assert_eq!(
        f.shape("transformer.h.0.attn.c_attn.weight"),
        Some(vec![12, 4])
    );
    // Loading an identity-layout file with the GPT-2 layout is a shape error naming the tensor
    // (c_attn is not square), and nothing is written.
    let vs2 = gpt2_store(ZERO, false);
    let err = load_var_store(&vs2, &path, &HfLayout::gpt2(), &LoadOptions::exact()).unwrap_err();
    match err {
        ModelError::ShapeMismatch {
            what,
            expected,
            got,
        } => {
            assert!(
                what.contains("transformer.h.0.attn.c_attn.weight"),
                "{what}"
            );
            assert_eq!(expected, vec![4, 12]);
            assert_eq!(got, vec![12, 4]);
        }
        other => panic!("unexpected error {other}"),
    }
    for (k, t) in vs2.variables() {
        assert_eq!(
            t.abs().sum(Kind::Double).double_value(&[]),
            0.0,
            "{k} was written by a failed load"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tied_lm_head_is_stored_once_and_loaded_from_wte() {
    let dir = tmpdir("tied");
    let path = dir.join("model.safetensors");
    let vs = gpt2_store(RANDN, true);
    {
        let vars = vs.variables();
        tch::no_grad(|| {
            vars["lm_head.weight"]
                .shallow_clone()
                .copy_(&vars["transformer.wte.weight"])
        });
    }
    let written = save_var_store(&vs, &path, &HfLayout::gpt2(), &SaveOptions::default()).unwrap();
    assert!(
        !written.contains(&"lm_head.weight".to_string()),
        "tied alias written"
    );

    let vs2 = gpt2_store(ZERO, true);
    let report = load_var_store(&vs2, &path, &HfLayout::gpt2(), &LoadOptions::exact()).unwrap();
    assert_eq!(
        report.tied,
        vec![(
            "lm_head.weight".to_string(),
            "transformer.wte.weight".to_string()
        )]
    );
    assert_stores_equal(&vs, &vs2);

    // An untied head that differs from wte is written.
    let vs3 = gpt2_store(RANDN, true);
    let written = save_var_store(
        &vs3,
        dir.join("untied.safetensors"),
        &HfLayout::gpt2(),
        &SaveOptions::default(),
    )
    .unwrap();
    assert!(written.contains(&"lm_head.weight".to_string()));
    // A file holding both (old GPT-2 checkpoints) loads strictly into a store without a head
    // when the stored head equals wte ...
    let both = dir.join("both.safetensors");
    let gpt2 = HfLayout::gpt2();
    let named: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(k, t)| {
            let t = if gpt2
                .transposed
                .iter()
                .any(|p| raptor_models::checkpoint::glob_match(p, &k))
            {
                t.tr().contiguous()
            } else {
                t
            };
            (k, t)
        })
        .collect();
    write_safetensors(&both, &named, None).unwrap();
    let vs4 = gpt2_store(ZERO, false);
    let r = load_var_store(&vs4, &both, &gpt2, &LoadOptions::exact()).unwrap();
    assert!(r.unexpected.is_empty());
    // ... but an untied head that differs from wte is not silently dropped.
    let untied = dir.join("untied.safetensors");
    let vs5 = gpt2_store(ZERO, false);
    match load_var_store(&vs5, &untied, &gpt2, &LoadOptions::exact()).unwrap_err() {
        ModelError::UnexpectedTensors { names, .. } => {
            assert!(names[0].starts_with("lm_head.weight"), "{names:?}")
        }
        other => panic!("unexpected error {other}"),
    }
    let r = load_var_store(&vs5, &untied, &gpt2, &LoadOptions::lenient()).unwrap();
    assert_eq!(r.unexpected, vec!["lm_head.weight".to_string()]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn switch_shared_embedding_and_decoder_tensors() {
    let dir = tmpdir("switch");
    let path = dir.join("model.safetensors");
    let w = Tensor::randn([7, 4], (Kind::Float, Device::Cpu));
    let q = Tensor::randn([4, 4], (Kind::Float, Device::Cpu));
    let dec = Tensor::randn([4, 4], (Kind::Float, Device::Cpu));
    // A full seq2seq checkpoint: shared + encoder + decoder.
    write_safetensors(
        &path,
        &[
            ("shared.weight".into(), w.shallow_clone()),
            (
                "encoder.block.0.layer.0.SelfAttention.q.weight".into(),
                q.shallow_clone(),
            ),
            ("decoder.block.0.layer.0.SelfAttention.q.weight".into(), dec),
        ],
        None,
    )
    .unwrap();
    // Our encoder names its embedding `encoder.embed_tokens.weight` here (alias of shared).
    let vs = VarStore::new(Device::Cpu);
    let emb = var(&vs, "encoder.embed_tokens.weight", &[7, 4], ZERO);
    let vq = var(
        &vs,
        "encoder.block.0.layer.0.SelfAttention.q.weight",
        &[4, 4],
        ZERO,
    );
    let r = load_var_store(
        &vs,
        &path,
        &HfLayout::switch_transformers(),
        &LoadOptions::exact(),
    )
    .unwrap();
    assert!(emb.equal(&w) && vq.equal(&q));
    assert_eq!(
        r.tied,
        vec![(
            "encoder.embed_tokens.weight".to_string(),
            "shared.weight".to_string()
        )]
    );
    assert!(
        r.unexpected.is_empty(),
        "decoder tensors are ignored by the Switch layout: {:?}",
        r.unexpected
    );
    // With the identity layout the decoder tensors are unexpected: strict fails naming them,
    // lenient reports them.
    let vs2 = VarStore::new(Device::Cpu);
    add(&vs2, "shared.weight", &[7, 4], ZERO);
    add(
        &vs2,
        "encoder.block.0.layer.0.SelfAttention.q.weight",
        &[4, 4],
        ZERO,
    );
    match load_var_store(&vs2, &path, &HfLayout::identity(), &LoadOptions::exact()).unwrap_err() {
        ModelError::UnexpectedTensors { names, .. } => {
            assert_eq!(
                names,
                vec!["decoder.block.0.layer.0.SelfAttention.q.weight".to_string()]
            )
        }
        other => panic!("unexpected error {other}"),
    }
    let r = load_var_store(&vs2, &path, &HfLayout::identity(), &LoadOptions::lenient()).unwrap();
    assert_eq!(
        r.unexpected,
        vec!["decoder.block.0.layer.0.SelfAttention.q.weight".to_string()]
    );
    assert_eq!(r.loaded.len(), 2);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn optional_prefix_reads_old_gpt2_names() {
    let dir = tmpdir("prefix");
    let path = dir.join("model.safetensors");
    let vs = gpt2_store(RANDN, false);
    // Old hub files: no `transformer.` prefix, and causal-mask buffers.
    let mut named: Vec<(String, Tensor)> = Vec::new();
    for (k, t) in vs.variables() {
        let t = if k.ends_with("c_attn.weight")
            || k.ends_with("c_proj.weight")
            || k.ends_with("c_fc.weight")
        {
            t.tr().contiguous()
        } else {
            t
        };
        named.push((k.strip_prefix("transformer.").unwrap().to_string(), t));
    }
    named.push((
        "h.0.attn.bias".into(),
        Tensor::ones([1, 1, 3, 3], (Kind::Float, Device::Cpu)),
    ));
    write_safetensors(&path, &named, None).unwrap();
    let vs2 = gpt2_store(ZERO, false);
    let r = load_var_store(&vs2, &path, &HfLayout::gpt2(), &LoadOptions::exact()).unwrap();
    assert_eq!(r.renamed.len(), 8);
    assert!(r.unexpected.is_empty());
    assert_stores_equal(&vs, &vs2);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn half_precision_checkpoints_convert_to_the_store_kind() {
    let dir = tmpdir("dtype");
    let vs = gpt2_store(RANDN, false);
    for (kind, tag) in [
        (Kind::Half, "f16"),
        (Kind::BFloat16, "bf16"),
        (Kind::Double, "f64"),
    ] {
        let path = dir.join(format!("{tag}.safetensors"));
        let opts = SaveOptions {
            kind: Some(kind),
            ..SaveOptions::default()
        };
        save_var_store(&vs, &path, &HfLayout::gpt2(), &opts).unwrap();
        let f = SafetensorsFile::open(&path).unwrap();
        for n in f.names() {
            assert_eq!(f.tensor(&n).unwrap().kind(), kind);
        }
        let vs2 = gpt2_store(ZERO, false);
        let r = load_var_store(&vs2, &path, &HfLayout::gpt2(), &LoadOptions::exact()).unwrap();
        assert_eq!(r.converted.len(), 8, "{tag}");
        let (a, b) = (vs.variables(), vs2.variables());
        for (k, t) in &a {
            // Reference: the same rounding done by libtorch directly.
            let expect = t.to_kind(kind).to_kind(Kind::Float);
            assert_eq!(b[k].kind(), Kind::Float);
            assert!(b[k].equal(&expect), "{tag}: {k}");
        }
    }
    // A store in bf16 loads an f32 file (conversion the other way).
    let path = dir.join("f32.safetensors");
    save_var_store(&vs, &path, &HfLayout::gpt2(), &SaveOptions::default()).unwrap();
    let mut vs3 = gpt2_store(ZERO, false);
    vs3.set_kind(Kind::BFloat16);
    load_var_store(&vs3, &path, &HfLayout::gpt2(), &LoadOptions::exact()).unwrap();
    let (a, b) = (vs.variables(), vs3.variables());
    for (k, t) in &a {
        assert_eq!(b[k].kind(), Kind::BFloat16);
        assert!(b[k].equal(&t.to_kind(Kind::BFloat16)), "{k}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn integer_tensor_for_a_float_variable_is_a_dtype_error() {
    let dir = tmpdir("intdtype");
    let path = dir.join("m.safetensors");
    write_safetensors(
        &path,
        &[(
            "w.weight".into(),
            Tensor::arange(6, (Kind::Int64, Device::Cpu)).reshape([2, 3]),
        )],
        None,
    )
    .unwrap();
    let vs = VarStore::new(Device::Cpu);
    add(&vs, "w.weight", &[2, 3], ZERO);
    match load_var_store(&vs, &path, &HfLayout::identity(), &LoadOptions::exact()).unwrap_err() {
        ModelError::TensorDtype { name, found, .. } => {
            assert_eq!(name, "w.weight");
            assert_eq!(found, "I64");
        }
        other => panic!("unexpected error {other}"),
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_tensors_strict_lenient_and_allowed() {
    let dir = tmpdir("missing");
    let path = dir.join("model.safetensors");
    let vs = gpt2_store(RANDN, false);
    save_var_store(&vs, &path, &HfLayout::gpt2(), &SaveOptions::default()).unwrap();

    // A store with a LoRA adapter and a classification head the checkpoint lacks.
    let mk = || {
        let vs2 = gpt2_store(ZERO, false);
        add(
            &vs2,
            "transformer.h.0.attn.c_attn.lora_A.weight",
            &[2, 4],
            Init::Const(0.5),
        );
        add(
            &vs2,
            "transformer.h.0.attn.c_attn.lora_B.weight",
            &[12, 2],
            ZERO,
        );
        add(&vs2, "score.weight", &[3, 4], Init::Const(0.25));
        vs2
    };
    let vs2 = mk();
    match load_var_store(&vs2, &path, &HfLayout::gpt2(), &LoadOptions::exact()).unwrap_err() {
        ModelError::MissingTensors { names, path: p } => {
            assert_eq!(
                names,
                vec![
                    "score.weight".to_string(),
                    "transformer.h.0.attn.c_attn.lora_A.weight".to_string(),
                    "transformer.h.0.attn.c_attn.lora_B.weight".to_string()
                ]
            );
            assert!(p.ends_with("model.safetensors"));
        }
        other => panic!("unexpected error {other}"),
    }
    // Default strict allows adapters and heads to be missing; they keep their values.
    let vs3 = mk();
    let r = load_var_store(&vs3, &path, &HfLayout::gpt2(), &LoadOptions::strict()).unwrap();
    assert_eq!(r.missing.len(), 3);
    assert_eq!(r.loaded.len(), 8);
    let v = vs3.variables();
    assert!(v["score.weight"].equal(&Tensor::full([3, 4], 0.25, (Kind::Float, Device::Cpu))));
    assert!(v["transformer.wte.weight"].equal(&vs.variables()["transformer.wte.weight"]));

    // A base tensor missing from the file: strict names it, lenient reports it.
    let partial = dir.join("partial.safetensors");
    let mut vars = vs.variables();
    vars.remove("transformer.ln_f.weight");
    save_named(&vars, &partial, &HfLayout::gpt2(), &SaveOptions::default()).unwrap();
    let vs4 = gpt2_store(ZERO, false);
    match load_var_store(&vs4, &partial, &HfLayout::gpt2(), &LoadOptions::strict()).unwrap_err() {
        ModelError::MissingTensors { names, .. } => {
            assert_eq!(names, vec!["transformer.ln_f.weight".to_string()])
        }
        other => panic!("unexpected error {other}"),
    }
    let opts = LoadOptions {
        mode: LoadMode::Lenient,
        allow_missing: vec![],
    };
    let r = load_var_store(&vs4, &partial, &HfLayout::gpt2(), &opts).unwrap();
    assert_eq!(r.missing, vec!["transformer.ln_f.weight".to_string()]);
    // The error message names the tensor.
    let msg = load_var_store(
        &gpt2_store(ZERO, false),
        &partial,
        &HfLayout::gpt2(),
        &LoadOptions::exact(),
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("transformer.ln_f.weight"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn corrupt_and_absent_files_are_typed_errors() {
    let dir = tmpdir("corrupt");
    let good = dir.join("good.safetensors");
    let vs = gpt2_store(RANDN, false);
    save_var_store(&vs, &good, &HfLayout::gpt2(), &SaveOptions::default()).unwrap();
    let bytes = std::fs::read(&good).unwrap();

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", bytes[..bytes.len() - 10].to_vec()),
        ("header-only", bytes[..40].to_vec()),
        ("empty", vec![]),
        ("garbage", b"this is not a safetensors file at all".to_vec()),
        ("huge-header-len", {
            let mut b = bytes.clone();
            b[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
            b
        }),
        ("extra-bytes", {
            let mut b = bytes.clone();
            b.extend_from_slice(&[0u8; 16]);
            b
        }),
    ];
    for (tag, data) in cases {
        let p = dir.join(format!("{tag}.safetensors"));
        std::fs::write(&p, &data).unwrap();
        let vs2 = gpt2_store(ZERO, false);
        match load_var_store(&vs2, &p, &HfLayout::gpt2(), &LoadOptions::exact()) {
            Err(ModelError::CorruptCheckpoint { path, .. }) => assert!(path.contains(tag)),
            other => panic!("{tag}: expected CorruptCheckpoint, got {other:?}"),
        }
        assert!(
            matches!(
                read_safetensors(&p),
                Err(ModelError::CorruptCheckpoint { .. })
            ),
            "{tag}"
        );
    }
    match load_var_store(
        &vs,
        dir.join("absent.safetensors"),
        &HfLayout::gpt2(),
        &LoadOptions::exact(),
    ) {
        Err(ModelError::Io { path, .. }) => assert!(path.contains("absent")),
        other => panic!("expected Io, got {other:?}"),
    }
    let empty_dir = dir.join("empty-dir");
    std::fs::create_dir_all(&empty_dir).unwrap();
    assert!(matches!(
        resolve_checkpoint(&empty_dir),
        Err(ModelError::Io { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();
}

fn write_sharded(dir: &Path, vs: &VarStore) {
    // Shard 1: embeddings; shard 2: the rest. Names in HF layout (via save_named).
    let vars = vs.variables();
    let (a, b): (HashMap<String, Tensor>, HashMap<String, Tensor>) = vars
        .into_iter()
        .partition(|(k, _)| k.contains(".wte.") || k.contains(".wpe."));
    let na = save_named(
        &a,
        dir.join("model-00001-of-00002.safetensors"),
        &HfLayout::gpt2(),
        &SaveOptions::default(),
    )
    .unwrap();
    let nb = save_named(
        &b,
        dir.join("model-00002-of-00002.safetensors"),
        &HfLayout::gpt2(),
        &SaveOptions::default(),
    )
    .unwrap();
    let mut map = serde_json::Map::new();
    for n in na {
        map.insert(n, "model-00001-of-00002.safetensors".into());
    }
    for n in nb {
        map.insert(n, "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn sharded_checkpoints_load_through_the_index() {
    let dir = tmpdir("sharded");
    let vs = gpt2_store(RANDN, false);
    write_sharded(&dir, &vs);
    let files = resolve_checkpoint(&dir).unwrap();
    assert_eq!(files.files.len(), 2);
    let vs2 = gpt2_store(ZERO, false);
    let r = load_var_store(&vs2, &dir, &HfLayout::gpt2(), &LoadOptions::exact()).unwrap();
    assert_eq!(r.loaded.len(), 8);
    assert_eq!(r.transposed.len(), 4);
    assert_stores_equal(&vs, &vs2);

    // An index that places a tensor in a shard that lacks it.
    let idx = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&idx).unwrap();
    let bad = text.replace(
        "\"transformer.wte.weight\":\"model-00001-of-00002.safetensors\"",
        "\"transformer.wte.weight\":\"model-00002-of-00002.safetensors\"",
    );
    assert_ne!(bad, text);
    std::fs::write(&idx, bad).unwrap();
    let vs3 = gpt2_store(ZERO, false);
    match load_var_store(&vs3, &dir, &HfLayout::gpt2(), &LoadOptions::exact()).unwrap_err() {
        ModelError::CorruptCheckpoint { why, .. } => {
            assert!(why.contains("transformer.wte.weight"), "{why}")
        }
        other => panic!("unexpected error {other}"),
    }
    // A missing shard file and a non-JSON index.
    std::fs::write(&idx, text).unwrap();
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    assert!(matches!(
        load_var_store(
            &gpt2_store(ZERO, false),
            &dir,
            &HfLayout::gpt2(),
            &LoadOptions::exact()
        ),
        Err(ModelError::Io { .. })
    ));
    std::fs::write(&idx, "{ not json").unwrap();
    assert!(matches!(
        resolve_checkpoint(&idx),
        Err(ModelError::CorruptCheckpoint { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models")
        .join(name)
}

#[test]
fn hf_fixtures_read_with_their_layouts() {
    // The committed transformers checkpoints: headers name the versions; every tensor loads
    // (strictly) into a store built from the HF names with our [out, in] convention.
    for (name, layout) in [
        ("gpt2", HfLayout::gpt2()),
        ("olmoe", HfLayout::olmoe()),
        ("switch_encoder", HfLayout::switch_transformers()),
    ] {
        let path = fixture(name).join("model.safetensors");
        let f = SafetensorsFile::open(&path).unwrap();
        let meta = f.metadata().unwrap();
        assert_eq!(
            meta.get("transformers").map(String::as_str),
            Some("5.23.0"),
            "{name}"
        );
        let vs = VarStore::new(Device::Cpu);
        let mut raw = HashMap::new();
        for n in f.names() {
            let mut shape = f.shape(&n).unwrap();
            if layout
                .transposed
                .iter()
                .any(|p| raptor_models::checkpoint::glob_match(p, &n))
            {
                shape.reverse();
            }
            add(&vs, &n, &shape, ZERO);
            raw.insert(n.clone(), f.tensor(&n).unwrap());
        }
        let r = load_var_store(&vs, &path, &layout, &LoadOptions::exact()).unwrap();
        assert_eq!(r.loaded.len(), raw.len(), "{name}");
        for (n, t) in vs.variables() {
            let expect = if r.transposed.contains(&n) {
                raw[&n].tr()
            } else {
                raw[&n].shallow_clone()
            };
            assert!(t.equal(&expect), "{name}: {n}");
        }
        if name == "gpt2" {
            assert_eq!(r.transposed.len(), 8); // 2 layers × (c_attn, attn.c_proj, c_fc, mlp.c_proj)
            assert!(!f.contains("lm_head.weight"));
        }
    }
}

#[test]
fn gpt2_fixture_embedding_output_matches_transformers() {
    // hidden_states.0 of GPT2LMHeadModel is wte[ids] + wpe[positions]: an independent check
    // that the loaded embedding tables are the ones transformers used.
    let dir = fixture("gpt2");
    let f = SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    let inputs = read_safetensors(dir.join("inputs.safetensors")).unwrap();
    let outputs: HashMap<String, Tensor> = read_safetensors(dir.join("outputs.safetensors"))
        .unwrap()
        .into_iter()
        .collect();
    let ids = &inputs.iter().find(|(n, _)| n == "input_ids").unwrap().1;
    let wte = f.tensor("transformer.wte.weight").unwrap();
    let wpe = f.tensor("transformer.wpe.weight").unwrap();
    let t = ids.size()[1];
    let emb = wte
        .index_select(0, &ids.flatten(0, 1))
        .reshape([ids.size()[0], t, -1])
        + wpe.narrow(0, 0, t).unsqueeze(0);
    let diff = (emb - &outputs["hidden_states.0"])
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < 1e-6, "{diff}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn write_read_round_trip(
        shapes in proptest::collection::vec(proptest::collection::vec(1i64..5, 0..4), 1..5),
        kind_ix in 0usize..5,
        seed in 0i64..1000,
    ) {
        let dir = tmpdir("prop");
        let path = dir.join(format!("p{seed}-{kind_ix}.safetensors"));
        let kind = [Kind::Float, Kind::Half, Kind::BFloat16, Kind::Double, Kind::Int64][kind_ix];
        tch::manual_seed(seed);
        let named: Vec<(String, Tensor)> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let t = Tensor::randn(s.as_slice(), (Kind::Float, Device::Cpu)).multiply_scalar(10.0);
                (format!("t.{i}.weight"), t.to_kind(kind))
            })
            .collect();
        write_safetensors(&path, &named, None).unwrap();
        let back = read_safetensors(&path).unwrap();
        prop_assert_eq!(back.len(), named.len());
        for ((n1, t1), (n2, t2)) in named.iter().zip(back.iter()) {
            prop_assert_eq!(n1, n2);
            prop_assert_eq!(t1.size(), t2.size());
            prop_assert_eq!(t1.kind(), t2.kind());
            prop_assert!(t1.equal(t2));
        }
        std::fs::remove_file(&path).ok();
    }
}

/// `save_pretrained` writes a folder that the Hugging Face loaders read back to the same logits
/// (Switch: every block of a 6-block model with 3 sparse layers; GPT-2: tied head, Conv1D
/// transposition on disk).
#[test]
fn save_pretrained_round_trips_switch_and_gpt2() {
    use raptor_models::checkpoint::{load_gpt2, load_switch_encoder, save_pretrained};
    use raptor_models::{
        Batch, DecoderHead, ForwardCtx, Gpt2, Gpt2Config, Model, SwitchConfig, SwitchEncoder,
    };
    let records = vec![vec![3_i64, 7, 9, 11, 4], vec![5, 6, 2]];
    tch::manual_seed(3);
    let mut c = SwitchConfig::tiny();
    c.num_layers = 6;
    let sw = SwitchEncoder::new(c, Device::Cpu).unwrap();
    let dir = tmpdir("save-pretrained-switch");
    save_pretrained(&sw, &dir).unwrap();
    let back = load_switch_encoder(&dir, 3, Device::Cpu, &LoadOptions::exact()).unwrap();
    assert_eq!(back.model.sparse_layers(), sw.sparse_layers());
    assert_eq!(back.model.sparse_layers().len(), 3);
    let batch = Batch::from_records(&records, 0, Some(&[0, 2]), Device::Cpu).unwrap();
    let a = sw.forward(&batch, &mut ForwardCtx::new(false)).unwrap();
    let b = back
        .model
        .forward(&batch, &mut ForwardCtx::new(false))
        .unwrap();
    assert_eq!(f64::try_from((a - b).abs().max()).unwrap(), 0.0);
    assert!(!dir.join("model.safetensors.tmp").exists());

    let g = Gpt2::new(Gpt2Config::tiny(DecoderHead::LanguageModel), Device::Cpu).unwrap();
    let gdir = tmpdir("save-pretrained-gpt2");
    save_pretrained(&g, &gdir).unwrap();
    let gb = load_gpt2(
        &gdir,
        DecoderHead::LanguageModel,
        Device::Cpu,
        &LoadOptions::exact(),
    )
    .unwrap();
    let batch = Batch::from_records(&records, 0, None, Device::Cpu).unwrap();
    let a = g.forward(&batch, &mut ForwardCtx::new(false)).unwrap();
    let b = gb
        .model
        .forward(&batch, &mut ForwardCtx::new(false))
        .unwrap();
    assert_eq!(f64::try_from((a - b).abs().max()).unwrap(), 0.0);
    // A step that disagrees with num_layers / num_sparse_encoder_layers is exported as it is
    // (transformers keeps the saved step) and loads back to the same blocks, with a warning.
    let mut odd = SwitchConfig::tiny();
    odd.num_layers = 5;
    odd.encoder_sparse_step = 3; // blocks 1, 4: 5 / 2 = 2 ≠ 3
    let sw = SwitchEncoder::new(odd, Device::Cpu).unwrap();
    let odir = tmpdir("save-pretrained-odd");
    save_pretrained(&sw, &odir).unwrap();
    let back = load_switch_encoder(&odir, 3, Device::Cpu, &LoadOptions::exact()).unwrap();
    assert_eq!(back.model.sparse_layers(), [1, 4]);
    assert_eq!(back.report.config_warnings.len(), 1);
    assert!(
        back.report.config_warnings[0].contains("using the saved step 3"),
        "{:?}",
        back.report.config_warnings
    );
    let sbatch = Batch::from_records(&records, 0, Some(&[0, 2]), Device::Cpu).unwrap();
    let b = back
        .model
        .forward(&sbatch, &mut ForwardCtx::new(false))
        .unwrap();
    let a = sw.forward(&sbatch, &mut ForwardCtx::new(false)).unwrap();
    assert_eq!(f64::try_from((a - b).abs().max()).unwrap(), 0.0);
}
