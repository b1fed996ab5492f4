//! Parity with Hugging Face transformers 5.23.0: the tiny random SwitchTransformers encoder,
//! OLMoE, GPT-2, Llama, Mixtral and Qwen2-MoE checkpoints in `fixtures/models/` (built by `fixtures/models/generate.py`)
//! load into our models and reproduce transformers' outputs on fixed inputs to 1e-4, router
//! decisions included; and the fixtures' `config.json` files parse, with typed errors for bad
//! configs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use raptor_models::checkpoint::{
    LoadOptions, Pretrained, SafetensorsFile, SaveOptions, load_bert, load_decoder, load_gpt2,
    load_olmoe, load_switch_encoder, read_safetensors, save_pretrained, save_var_store,
};
use raptor_models::hf_config::{
    HfConfig, HfDecoderConfig, HfGpt2Config, HfOlmoeConfig, HfSwitchConfig,
};
use raptor_models::{
    Batch, BertPooling, DecoderFamily, DecoderHead, ForwardCtx, Model, ModelError, RopeScaling,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

const TOL: f64 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models")
        .join(name)
}

fn read_map(path: PathBuf) -> HashMap<String, Tensor> {
    read_safetensors(path).unwrap().into_iter().collect()
}

/// Inputs and reference outputs of a fixture.
fn io(name: &str) -> (Batch, HashMap<String, Tensor>) {
    let dir = fixture(name);
    let mut inputs = read_map(dir.join("inputs.safetensors"));
    let batch = Batch {
        input_ids: inputs.remove("input_ids").unwrap(),
        attention_mask: inputs.remove("attention_mask").unwrap(),
        labels: None,
        loss_mask: None,
    };
    (batch, read_map(dir.join("outputs.safetensors")))
}

/// Largest |a − b| over valid positions (`mask` `[B, T]`; `a`, `b` `[B, T, ...]`).
fn max_diff_valid(a: &Tensor, b: &Tensor, mask: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    let d = (a.to_kind(Kind::Double) - b.to_kind(Kind::Double)).abs();
    let d = d.flatten(2, -1).amax([2i64].as_slice(), false); // [B, T]
    (d * mask.to_kind(Kind::Double)).max().double_value(&[])
}

fn exact_load() -> LoadOptions {
    LoadOptions::strict()
}

#[test]
fn fixture_configs_parse() {
    let HfConfig::Switch(s) = HfConfig::from_file(fixture("switch_encoder")).unwrap() else {
        panic!("not switch")
    };
    // The generator's config (see fixtures/models/generate.py).
    assert_eq!(
        (
            s.vocab_size,
            s.d_model,
            s.d_kv,
            s.d_ff,
            s.num_layers,
            s.num_heads,
            s.num_experts
        ),
        (128, 32, 8, 64, 4, 4, 4)
    );
    assert_eq!(
        (
            s.num_sparse_encoder_layers,
            s.encoder_sparse_step,
            s.expert_capacity
        ),
        (2, 2, 8)
    );
    assert_eq!(
        (
            s.relative_attention_num_buckets,
            s.relative_attention_max_distance
        ),
        (8, 16)
    );
    assert_eq!(s.dense_act_fn, "relu");
    assert_eq!(
        (0..4).filter(|&i| s.is_sparse(i)).collect::<Vec<_>>(),
        vec![1, 3]
    );

    let HfConfig::Olmoe(o) = HfConfig::from_file(fixture("olmoe")).unwrap() else {
        panic!("not olmoe")
    };
    assert_eq!(
        (
            o.hidden_size,
            o.intermediate_size,
            o.num_hidden_layers,
            o.num_attention_heads,
            o.num_key_value_heads
        ),
        (32, 16, 2, 4, 2)
    );
    assert_eq!(
        (o.num_experts, o.num_experts_per_tok, o.norm_topk_prob),
        (4, 2, false)
    );
    assert_eq!(
        (o.rope_theta, o.rms_norm_eps, o.qk_norm),
        (10000.0, 1e-5, true)
    );

    let HfConfig::Gpt2(g) = HfConfig::from_file(fixture("gpt2")).unwrap() else {
        panic!("not gpt2")
    };
    assert_eq!(
        (
            g.vocab_size,
            g.n_embd,
            g.n_layer,
            g.n_head,
            g.n_positions,
            g.n_inner
        ),
        (128, 32, 2, 4, 32, 128)
    );
    assert_eq!(g.activation_function, "gelu_new");
    assert!(g.tie_word_embeddings);
}

#[test]
fn older_config_forms_and_defaults() {
    // Pre-transformers-5 OLMoE config: top-level rope_theta, no rope_parameters.
    let o = HfOlmoeConfig::from_json_str(
        r#"{"model_type": "olmoe", "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 1024,
            "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
            "num_experts": 64, "num_experts_per_tok": 8, "rope_theta": 10000.0, "rope_scaling": null,
            "clip_qkv": null, "norm_topk_prob": false, "rms_norm_eps": 1e-05}"#,
        "<olmoe-1b-7b>",
    )
    .unwrap();
    assert_eq!(
        (o.rope_theta, o.head_dim(), o.clip_qkv),
        (10000.0, 128, None)
    );
    // switch-base-8's encoder settings, with encoder_sparse_step absent (computed).
    let s = HfSwitchConfig::from_json_str(
        r#"{"vocab_size": 32128, "d_model": 768, "d_kv": 64, "d_ff": 3072, "num_layers": 12,
            "num_heads": 12, "num_experts": 8, "num_sparse_encoder_layers": 6, "expert_capacity": 64}"#,
        "<switch-base-8>",
    )
    .unwrap();
    assert_eq!(s.encoder_sparse_step, 2);
    assert_eq!((0..12).filter(|&i| s.is_sparse(i)).count(), 6);
    assert_eq!(
        (s.layer_norm_epsilon, s.relative_attention_num_buckets),
        (1e-6, 32)
    );
    // GPT-2 with n_inner null.
    let g = HfGpt2Config::from_json_str(
        r#"{"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": null}"#,
        "<gpt2>",
    )
    .unwrap();
    assert_eq!(g.n_inner, 3072);
}

fn config_err(r: Result<impl std::fmt::Debug, ModelError>) -> (String, String) {
    match r {
        Err(ModelError::HfConfig { field, why, .. }) => (field, why),
        other => panic!("expected HfConfig error, got {other:?}"),
    }
}

#[test]
fn bad_configs_are_typed_errors_naming_the_field() {
    let gpt2 = |extra: &str| {
        format!(
            r#"{{"vocab_size": 100, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 4{extra}}}"#
        )
    };
    assert!(HfGpt2Config::from_json_str(&gpt2(""), "t").is_ok());
    let (f, _) = config_err(HfGpt2Config::from_json_str(
        r#"{"vocab_size": 100, "n_positions": 16, "n_layer": 2, "n_head": 4}"#,
        "t",
    ));
    assert_eq!(f, "n_embd");
    let (f, why) = config_err(HfGpt2Config::from_json_str(
        &gpt2(r#", "n_head": 5"#).replace(r#""n_head": 4, "#, ""),
        "t",
    ));
    assert_eq!(f, "n_head", "{why}");
    let (f, _) = config_err(HfGpt2Config::from_json_str(
        &gpt2(r#", "layer_norm_epsilon": -1"#),
        "t",
    ));
    assert_eq!(f, "layer_norm_epsilon");
    let (f, _) = config_err(HfGpt2Config::from_json_str(
        &gpt2(r#", "activation_function": "mish""#),
        "t",
    ));
    assert_eq!(f, "activation_function");
    let (f, _) = config_err(HfGpt2Config::from_json_str(
        &gpt2(r#", "model_type": "olmoe""#),
        "t",
    ));
    assert_eq!(f, "model_type");
    let (f, _) = config_err(HfGpt2Config::from_json_str(
        r#"{"vocab_size": "many", "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 4}"#,
        "t",
    ));
    assert_eq!(f, "vocab_size");
    let (f, _) = config_err(HfGpt2Config::from_json_str("[1, 2]", "t"));
    assert_eq!(f, "(file)");
    let (f, _) = config_err(HfGpt2Config::from_json_str("{ nope", "t"));
    assert_eq!(f, "(file)");

    let olmoe = |extra: &str| {
        format!(
            r#"{{"vocab_size": 100, "hidden_size": 32, "intermediate_size": 16, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_experts": 4, "num_experts_per_tok": 2{extra}}}"#
        )
    };
    assert!(HfOlmoeConfig::from_json_str(&olmoe(""), "t").is_ok());
    let (f, _) = config_err(HfOlmoeConfig::from_json_str(
        &olmoe(r#", "num_key_value_heads": 3"#),
        "t",
    ));
    assert_eq!(f, "num_key_value_heads");
    let (f, _) = config_err(HfOlmoeConfig::from_json_str(
        &olmoe("").replace(r#""num_experts_per_tok": 2"#, r#""num_experts_per_tok": 5"#),
        "t",
    ));
    assert_eq!(f, "num_experts_per_tok");
    let (f, _) = config_err(HfOlmoeConfig::from_json_str(
        &olmoe(r#", "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0}"#),
        "t",
    ));
    assert_eq!(f, "rope_parameters.rope_type");
    let (f, _) = config_err(HfOlmoeConfig::from_json_str(
        &olmoe(r#", "rope_scaling": {"type": "linear", "factor": 2.0}"#),
        "t",
    ));
    assert_eq!(f, "rope_scaling");

    // What transformers refuses stays refused: a step that is not an integer.
    let (f, _) = config_err(HfSwitchConfig::from_json_str(
        r#"{"vocab_size": 100, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 4, "num_heads": 4,
            "num_experts": 4, "num_sparse_encoder_layers": 2, "encoder_sparse_step": "3"}"#,
        "t",
    ));
    assert_eq!(f, "encoder_sparse_step");
    let (f, _) = config_err(HfSwitchConfig::from_json_str(
        r#"{"vocab_size": 100, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 4, "num_heads": 4,
            "num_experts": 0}"#,
        "t",
    ));
    assert_eq!(f, "num_experts");
    let (f, _) = config_err(HfConfig::from_json_str(r#"{"model_type": "falcon"}"#, "t"));
    assert_eq!(f, "model_type");
    assert!(matches!(
        HfConfig::from_file(fixture("absent-dir")),
        Err(ModelError::Io { .. })
    ));
}

fn load_switch() -> Pretrained<raptor_models::SwitchEncoder> {
    let HfConfig::Switch(c) = HfConfig::from_file(fixture("switch_encoder")).unwrap() else {
        panic!()
    };
    // A d_model-way head; set to the identity below, so the logits are the pooled hidden state.
    let p = load_switch_encoder(
        fixture("switch_encoder"),
        c.d_model,
        Device::Cpu,
        &exact_load(),
    )
    .unwrap();
    assert!(p.report.unexpected.is_empty());
    assert_eq!(
        p.report.missing,
        vec![
            "classifier.bias".to_string(),
            "classifier.weight".to_string()
        ]
    );
    let vars = p.model.var_store().variables();
    tch::no_grad(|| {
        let d = c.d_model;
        vars["classifier.weight"]
            .shallow_clone()
            .copy_(&Tensor::eye(d, (Kind::Float, Device::Cpu)));
        let _ = vars["classifier.bias"].shallow_clone().zero_();
    });
    p
}

#[test]
fn switch_encoder_matches_transformers() {
    let p = load_switch();
    let (batch, reference) = io("switch_encoder");
    let mut ctx = ForwardCtx::new(false);
    ctx.collect_routing = true;
    let pooled = tch::no_grad(|| p.model.forward(&batch, &mut ctx)).unwrap();
    let expect = &reference["pooled_mean"];
    assert_eq!(pooled.size(), expect.size());
    let diff = (pooled - expect).abs().max().double_value(&[]);
    assert!(
        diff < TOL,
        "pooled last hidden state differs from transformers by {diff}"
    );

    // Per token: the last hidden state at every valid position.
    let hidden = tch::no_grad(|| p.model.encode(&batch, &mut ForwardCtx::new(false))).unwrap();
    let diff = max_diff_valid(
        &hidden,
        &reference["last_hidden_state"],
        &batch.attention_mask,
    );
    assert!(
        diff < TOL,
        "last hidden state differs from transformers by {diff} at some valid token"
    );

    // Router decisions: our top-1 expert = argmax of transformers' router logits.
    assert_eq!(ctx.routing.len(), 2);
    for (i, r) in ctx.routing.iter().enumerate() {
        let logits = &reference[&format!("router_logits.{i}")]; // [B, T, E]
        let want = logits.argmax(-1, false);
        let got = r.indices.select(-1, 0);
        let valid = batch.attention_mask.to_kind(Kind::Bool);
        assert!(
            want.masked_select(&valid).equal(&got.masked_select(&valid)),
            "layer {i}: experts differ"
        );
        let probs = logits
            .softmax(-1, Kind::Float)
            .amax([-1i64].as_slice(), false);
        let gd = (r.weights.select(-1, 0) - probs)
            .abs()
            .masked_select(&valid)
            .max()
            .double_value(&[]);
        assert!(gd < TOL, "layer {i}: gate weights differ by {gd}");
    }
}

#[test]
fn olmoe_matches_transformers() {
    let p = load_olmoe(
        fixture("olmoe"),
        DecoderHead::LanguageModel,
        Device::Cpu,
        &exact_load(),
    )
    .unwrap();
    assert!(p.report.missing.is_empty() && p.report.unexpected.is_empty());
    let (batch, reference) = io("olmoe");
    let mut ctx = ForwardCtx::new(false);
    ctx.collect_routing = true;
    let logits = tch::no_grad(|| p.model.forward(&batch, &mut ctx)).unwrap();
    let diff = max_diff_valid(&logits, &reference["logits"], &batch.attention_mask);
    assert!(diff < TOL, "logits differ from transformers by {diff}");

    // Top-2 expert sets and gate weights (softmax probabilities, not renormalized).
    assert_eq!(ctx.routing.len(), 2);
    let (b, t) = (batch.input_ids.size()[0], batch.input_ids.size()[1]);
    for (i, r) in ctx.routing.iter().enumerate() {
        let logits = reference[&format!("router_logits.{i}")].reshape([b, t, -1]);
        let (vals, idx) = logits.softmax(-1, Kind::Float).topk(2, -1, true, true);
        let valid = batch
            .attention_mask
            .to_kind(Kind::Bool)
            .unsqueeze(-1)
            .expand([b, t, 2], false);
        let (got_idx, _) = r.indices.sort(-1, false);
        let (want_idx, order) = idx.sort(-1, false);
        assert!(
            got_idx
                .masked_select(&valid)
                .equal(&want_idx.masked_select(&valid)),
            "layer {i}: expert sets differ"
        );
        let want_w = vals.gather(-1, &order, false);
        let got_w = r.weights.gather(-1, &r.indices.sort(-1, false).1, false);
        let gd = (got_w - want_w)
            .abs()
            .masked_select(&valid)
            .max()
            .double_value(&[]);
        assert!(gd < TOL, "layer {i}: gate weights differ by {gd}");
    }
}

#[test]
fn gpt2_matches_transformers() {
    let p = load_gpt2(
        fixture("gpt2"),
        DecoderHead::LanguageModel,
        Device::Cpu,
        &exact_load(),
    )
    .unwrap();
    assert!(p.report.missing.is_empty() && p.report.unexpected.is_empty());
    assert_eq!(p.report.transposed.len(), 8);
    let (batch, reference) = io("gpt2");
    let mut ctx = ForwardCtx::new(false);
    let logits = tch::no_grad(|| p.model.forward(&batch, &mut ctx)).unwrap();
    let diff = max_diff_valid(&logits, &reference["logits"], &batch.attention_mask);
    assert!(diff < TOL, "logits differ from transformers by {diff}");
}

#[test]
fn wrong_model_type_directory_is_a_config_error() {
    match load_gpt2(
        fixture("olmoe"),
        DecoderHead::LanguageModel,
        Device::Cpu,
        &exact_load(),
    ) {
        Err(ModelError::HfConfig { field, .. }) => assert_eq!(field, "model_type"),
        other => panic!("expected a config error, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn saving_loaded_models_gives_back_the_hf_files() {
    // Load each transformers checkpoint into our model and save it again in its HF layout: the
    // same tensor names, shapes, dtypes and bytes as the file transformers wrote (GPT-2's
    // Conv1D weights transposed back, no tied duplicates; our classification head skipped).
    let dir = std::env::temp_dir().join(format!("raptor-hf-resave-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let skip_head = SaveOptions {
        skip: vec!["classifier.*".into()],
        ..SaveOptions::default()
    };
    let switch = load_switch();
    let olmoe = load_olmoe(
        fixture("olmoe"),
        DecoderHead::LanguageModel,
        Device::Cpu,
        &exact_load(),
    )
    .unwrap();
    let gpt2 = load_gpt2(
        fixture("gpt2"),
        DecoderHead::LanguageModel,
        Device::Cpu,
        &exact_load(),
    )
    .unwrap();
    let cases: [(&str, &dyn Model, &raptor_models::hf_config::HfConfig); 3] = [
        ("switch_encoder", &switch.model, &switch.config),
        ("olmoe", &olmoe.model, &olmoe.config),
        ("gpt2", &gpt2.model, &gpt2.config),
    ];
    for (name, model, config) in cases {
        let out = dir.join(format!("{name}.safetensors"));
        save_var_store(model.var_store(), &out, &config.layout(), &skip_head).unwrap();
        let (orig, again) = (
            SafetensorsFile::open(fixture(name).join("model.safetensors")).unwrap(),
            SafetensorsFile::open(&out).unwrap(),
        );
        assert_eq!(orig.names(), again.names(), "{name}");
        for n in orig.names() {
            assert_eq!(orig.dtype(&n), again.dtype(&n), "{name}: {n}");
            assert!(
                orig.tensor(&n).unwrap().equal(&again.tensor(&n).unwrap()),
                "{name}: {n}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Loads a Llama-family fixture strictly (nothing missing, nothing unexpected).
fn load_family(name: &str) -> Pretrained<raptor_models::Decoder> {
    let p = load_decoder(
        fixture(name),
        DecoderHead::LanguageModel,
        Device::Cpu,
        &exact_load(),
    )
    .unwrap();
    assert!(
        p.report.missing.is_empty() && p.report.unexpected.is_empty(),
        "{name}: {:?}",
        p.report
    );
    p
}

/// Logits and final hidden states against transformers at valid positions; returns the router
/// outputs.
fn check_family_logits(
    name: &str,
    model: &raptor_models::Decoder,
) -> Vec<raptor_models::RouterOutput> {
    let (batch, reference) = io(name);
    let mut ctx = ForwardCtx::new(false);
    ctx.collect_routing = true;
    let logits = tch::no_grad(|| model.forward(&batch, &mut ctx)).unwrap();
    let diff = max_diff_valid(&logits, &reference["logits"], &batch.attention_mask);
    assert!(
        diff < TOL,
        "{name}: logits differ from transformers by {diff}"
    );
    let layers = model.config().num_hidden_layers;
    let h = tch::no_grad(|| model.hidden_states(&batch, &mut ForwardCtx::new(false))).unwrap();
    let diff = max_diff_valid(
        &h,
        &reference[&format!("hidden_states.{layers}")],
        &batch.attention_mask,
    );
    assert!(diff < TOL, "{name}: final hidden states differ by {diff}");
    ctx.routing
}

/// Our top-k expert sets and gate weights equal transformers' (from its router logits:
/// softmax, top-k, renormalized when `norm`).
fn check_routing(name: &str, routing: &[raptor_models::RouterOutput], k: i64, norm: bool) {
    let (batch, reference) = io(name);
    let (b, t) = (batch.input_ids.size()[0], batch.input_ids.size()[1]);
    for (i, r) in routing.iter().enumerate() {
        let logits = reference[&format!("router_logits.{i}")].reshape([b, t, -1]);
        let (mut vals, idx) = logits.softmax(-1, Kind::Float).topk(k, -1, true, true);
        if norm {
            vals = &vals / vals.sum_dim_intlist(-1, true, Kind::Float);
        }
        let valid = batch
            .attention_mask
            .to_kind(Kind::Bool)
            .unsqueeze(-1)
            .expand([b, t, k], false);
        let (got_idx, got_order) = r.indices.sort(-1, false);
        let (want_idx, order) = idx.sort(-1, false);
        assert!(
            got_idx
                .masked_select(&valid)
                .equal(&want_idx.masked_select(&valid)),
            "{name} router {i}: expert sets differ"
        );
        let gd = (r.weights.gather(-1, &got_order, false) - vals.gather(-1, &order, false))
            .abs()
            .masked_select(&valid)
            .max()
            .double_value(&[]);
        assert!(gd < TOL, "{name} router {i}: gate weights differ by {gd}");
    }
}

#[test]
fn llama_family_configs_parse() {
    let HfConfig::Decoder(l) = HfConfig::from_file(fixture("llama")).unwrap() else {
        panic!("not a decoder")
    };
    assert_eq!(l.family, DecoderFamily::Llama);
    assert_eq!(
        (
            l.hidden_size,
            l.num_attention_heads,
            l.num_key_value_heads,
            l.head_dim
        ),
        (32, 4, 2, 8)
    );
    assert_eq!(l.rope_theta, 5000.0);
    assert_eq!(l.rope_scaling, RopeScaling::Linear { factor: 2.0 });
    assert!(l.tie_word_embeddings && l.sparse_layers.is_empty());
    let HfConfig::Decoder(m) = HfConfig::from_file(fixture("mixtral")).unwrap() else {
        panic!("not a decoder")
    };
    assert_eq!(m.family, DecoderFamily::Mixtral);
    assert_eq!(
        (
            m.num_experts,
            m.num_experts_per_tok,
            m.expert_intermediate_size,
            m.norm_topk_prob
        ),
        (4, 2, 16, true)
    );
    assert_eq!(m.sparse_layers, vec![0, 1]);
    let HfConfig::Decoder(q) = HfConfig::from_file(fixture("qwen2_moe")).unwrap() else {
        panic!("not a decoder")
    };
    assert_eq!(q.family, DecoderFamily::Qwen2Moe);
    assert_eq!(q.sparse_layers, vec![0, 2]);
    assert_eq!(
        (
            q.expert_intermediate_size,
            q.shared_expert_intermediate_size,
            q.intermediate_size
        ),
        (16, Some(24), 40)
    );
    assert!(q.qkv_bias && !q.o_bias && !q.norm_topk_prob);
    // Older forms: top-level rope_theta with rope_scaling {type: linear}.
    let old = HfDecoderConfig::from_json_str(
        r#"{"model_type": "llama", "vocab_size": 32000, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "rope_theta": 500000.0,
            "rope_scaling": {"type": "linear", "factor": 4.0}}"#,
        "<old llama>",
    )
    .unwrap();
    assert_eq!(
        (
            old.rope_theta,
            old.rope_scaling,
            old.num_key_value_heads,
            old.head_dim
        ),
        (500000.0, RopeScaling::Linear { factor: 4.0 }, 4, 16)
    );
    // Unsupported RoPE kinds and sliding windows are errors naming the field.
    let llama = |extra: &str| {
        format!(
            r#"{{"model_type": "llama", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 16,
                "num_hidden_layers": 2, "num_attention_heads": 4{extra}}}"#
        )
    };
    let (f, _) = config_err(HfDecoderConfig::from_json_str(
        &llama(
            r#", "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}"#,
        ),
        "t",
    ));
    assert_eq!(f, "rope_parameters.rope_type");
    let (f, _) = config_err(HfDecoderConfig::from_json_str(
        &llama(r#", "rope_scaling": {"type": "dynamic", "factor": 2.0}"#),
        "t",
    ));
    assert_eq!(f, "rope_scaling.rope_type");
    let (f, _) = config_err(HfDecoderConfig::from_json_str(
        &llama(r#", "rope_scaling": {"type": "linear"}"#),
        "t",
    ));
    assert_eq!(f, "rope_scaling.factor");
    let (f, _) = config_err(HfDecoderConfig::from_json_str(
        &llama(r#", "num_key_value_heads": 3"#),
        "t",
    ));
    assert_eq!(f, "num_key_value_heads");
    let (f, _) = config_err(HfDecoderConfig::from_json_str(
        &llama("")
            .replace("llama", "mixtral")
            .replace("}", r#", "sliding_window": 4096}"#),
        "t",
    ));
    assert_eq!(f, "sliding_window");
    let (f, _) = config_err(HfDecoderConfig::from_json_str(
        &llama("")
            .replace("llama", "qwen2_moe")
            .replace("}", r#", "num_experts": 2, "num_experts_per_tok": 3}"#),
        "t",
    ));
    assert_eq!(f, "num_experts_per_tok");
}

#[test]
fn llama_matches_transformers() {
    let p = load_family("llama");
    // Tied head: no lm_head variable; GQA 4/2; linear RoPE scaling with θ 5000.
    assert!(
        !p.model
            .var_store()
            .variables()
            .contains_key("lm_head.weight")
    );
    let routing = check_family_logits("llama", &p.model);
    assert!(routing.is_empty());
    assert!(p.model.sparse_layers().is_empty() && p.model.router_params().is_empty());
}

#[test]
fn mixtral_matches_transformers() {
    let p = load_family("mixtral");
    let routing = check_family_logits("mixtral", &p.model);
    assert_eq!(routing.len(), 2);
    check_routing("mixtral", &routing, 2, true);
    assert_eq!(
        p.model.router_params(),
        vec![
            "model.layers.0.block_sparse_moe.gate.weight".to_string(),
            "model.layers.1.block_sparse_moe.gate.weight".to_string()
        ]
    );
}

#[test]
fn qwen2_moe_matches_transformers() {
    let p = load_family("qwen2_moe");
    let routing = check_family_logits("qwen2_moe", &p.model);
    // Layers 0 and 2 are sparse (layer 1 is in mlp_only_layers); transformers numbers its
    // router logits over the sparse layers only.
    assert_eq!(
        routing.iter().map(|r| r.layer).collect::<Vec<_>>(),
        vec![0, 2]
    );
    assert_eq!(p.model.sparse_layers(), vec![0, 2]);
    check_routing("qwen2_moe", &routing, 2, false);
    // The shared expert's gate is not a router: it stays trainable (shared stream).
    assert!(
        p.model
            .router_params()
            .iter()
            .all(|n| !n.contains("shared_expert"))
    );
}

#[test]
fn llama_family_resave_and_save_pretrained_round_trip() {
    let dir = std::env::temp_dir().join(format!("raptor-family-resave-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["llama", "mixtral", "qwen2_moe"] {
        let p = load_family(name);
        // The same tensors, bytes included, as the file transformers wrote.
        let out = dir.join(format!("{name}.safetensors"));
        save_var_store(
            p.model.var_store(),
            &out,
            &p.config.layout(),
            &SaveOptions::default(),
        )
        .unwrap();
        let (orig, again) = (
            SafetensorsFile::open(fixture(name).join("model.safetensors")).unwrap(),
            SafetensorsFile::open(&out).unwrap(),
        );
        assert_eq!(orig.names(), again.names(), "{name}");
        for n in orig.names() {
            assert!(
                orig.tensor(&n).unwrap().equal(&again.tensor(&n).unwrap()),
                "{name}: {n}"
            );
        }
        // save_pretrained writes a config.json that parses back to the same model config.
        let folder = dir.join(name);
        save_pretrained(&p.model, &folder).unwrap();
        let back = load_family_from(&folder);
        assert_eq!(back.model.config(), p.model.config(), "{name}");
        check_family_logits(name, &back.model);
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn load_family_from(dir: &Path) -> Pretrained<raptor_models::Decoder> {
    load_decoder(dir, DecoderHead::LanguageModel, Device::Cpu, &exact_load()).unwrap()
}

#[test]
fn bert_matches_transformers_with_token_types() {
    let HfConfig::Bert(c) = HfConfig::from_file(fixture("bert")).unwrap() else {
        panic!("not bert")
    };
    assert_eq!(
        (
            c.hidden_size,
            c.num_hidden_layers,
            c.type_vocab_size,
            c.num_labels
        ),
        (32, 2, 2, Some(3))
    );
    let p = load_bert(
        fixture("bert"),
        3,
        BertPooling::Pooler,
        Device::Cpu,
        &LoadOptions::exact(),
    )
    .unwrap();
    assert!(p.report.missing.is_empty() && p.report.unexpected.is_empty());
    let (batch, reference) = io("bert");
    let inputs = read_map(fixture("bert").join("inputs.safetensors"));
    let types = &inputs["token_type_ids"];
    assert!(types.max().int64_value(&[]) == 1);
    let m = &p.model;
    let logits = tch::no_grad(|| {
        m.forward_with_token_types(&batch, Some(types), &mut ForwardCtx::new(false))
    })
    .unwrap();
    let diff = (&logits - &reference["logits"])
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < TOL, "logits differ from transformers by {diff}");
    let h = tch::no_grad(|| m.encode(&batch, Some(types), &mut ForwardCtx::new(false))).unwrap();
    let diff = max_diff_valid(&h, &reference["hidden_states.2"], &batch.attention_mask);
    assert!(diff < TOL, "last hidden state differs by {diff}");
    let pooled =
        tch::no_grad(|| m.pool(&h, &batch.attention_mask, &mut ForwardCtx::new(false))).unwrap();
    let diff = (&pooled - &reference["pooler_output"])
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < TOL, "pooler output differs by {diff}");
    // Token types matter (the fixture uses both segments).
    let plain = tch::no_grad(|| m.forward(&batch, &mut ForwardCtx::new(false))).unwrap();
    assert!((&plain - &logits).abs().max().double_value(&[]) > 1e-3);
    // Bad token types are typed errors.
    assert!(
        m.forward_with_token_types(&batch, Some(&(types + 5)), &mut ForwardCtx::new(false))
            .is_err()
    );
    // Mean pooling: the checkpoint's pooler is ignored, the classifier may be missing.
    let mean = load_bert(
        fixture("bert"),
        2,
        BertPooling::Mean,
        Device::Cpu,
        &LoadOptions::strict().allow_missing("classifier.*"),
    );
    assert!(
        mean.is_err(),
        "classifier shape [3, 32] must not load into a 2-way head"
    );
    let mean = load_bert(
        fixture("bert"),
        3,
        BertPooling::Mean,
        Device::Cpu,
        &LoadOptions::strict(),
    )
    .unwrap();
    assert!(mean.report.unexpected.is_empty());
    // Re-saving gives back the transformers file (the pooler included).
    let dir = std::env::temp_dir().join(format!("raptor-bert-resave-{}", std::process::id()));
    save_pretrained(m, &dir).unwrap();
    let (orig, again) = (
        SafetensorsFile::open(fixture("bert").join("model.safetensors")).unwrap(),
        SafetensorsFile::open(dir.join("model.safetensors")).unwrap(),
    );
    assert_eq!(orig.names(), again.names());
    for n in orig.names() {
        assert!(
            orig.tensor(&n).unwrap().equal(&again.tensor(&n).unwrap()),
            "{n}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A saved `encoder_sparse_step` that disagrees with `num_layers / num_sparse_encoder_layers`
/// (a file whose `num_layers` was edited) is loaded as transformers loads it: the saved step
/// wins (`SwitchTransformersConfig` sets saved attributes after computing its own), with a
/// warning naming both values and the sparse blocks used. An out-of-range sparse count is read
/// as transformers reads it too.
#[test]
fn switch_step_disagreement_loads_as_transformers_with_a_warning() {
    let cfg = |extra: &str| {
        format!(
            r#"{{"vocab_size": 100, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 4,
                "num_heads": 4, "num_experts": 4{extra}}}"#
        )
    };
    let s = HfSwitchConfig::from_json_str(
        &cfg(r#", "num_sparse_encoder_layers": 2, "encoder_sparse_step": 3"#),
        "t",
    )
    .unwrap();
    assert_eq!(s.encoder_sparse_step, 3);
    assert_eq!((0..4).filter(|&i| s.is_sparse(i)).collect::<Vec<_>>(), [1]);
    assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
    let w = &s.warnings[0];
    for part in [
        "encoder_sparse_step = 3",
        "4 / 2 = 2",
        "saved step 3",
        "sparse blocks: 1",
    ] {
        assert!(w.contains(part), "{part:?} missing from {w}");
    }
    // Agreeing and absent steps: no warning.
    for extra in [
        r#", "num_sparse_encoder_layers": 2, "encoder_sparse_step": 2"#,
        r#", "num_sparse_encoder_layers": 2"#,
    ] {
        let s = HfSwitchConfig::from_json_str(&cfg(extra), "t").unwrap();
        assert_eq!((s.encoder_sparse_step, s.warnings.len()), (2, 0), "{extra}");
    }
    // A step of 0 (or below) makes no block sparse in transformers; so here.
    let s = HfSwitchConfig::from_json_str(
        &cfg(r#", "num_sparse_encoder_layers": 2, "encoder_sparse_step": 0"#),
        "t",
    )
    .unwrap();
    assert_eq!((0..4).filter(|&i| s.is_sparse(i)).count(), 0);
    assert!(
        s.warnings[0].contains("sparse blocks: none"),
        "{:?}",
        s.warnings
    );
    // More sparse layers than layers: transformers computes 4 // 5 = 0 (no sparse block).
    let s =
        HfSwitchConfig::from_json_str(&cfg(r#", "num_sparse_encoder_layers": 5"#), "t").unwrap();
    assert_eq!(s.encoder_sparse_step, 0);
    assert!(
        s.warnings[0].contains("outside [0, num_layers = 4]"),
        "{:?}",
        s.warnings
    );
}
