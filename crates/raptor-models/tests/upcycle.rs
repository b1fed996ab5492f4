//! Sparse upcycling: a dense Llama-style decoder turned into a Mixtral-style MoE decoder whose
//! experts are copies of the dense MLPs computes the same logits (to 1e-5) whatever the router,
//! E and k; the result exports as a Mixtral checkpoint that loads back with the same logits;
//! changing one expert changes the output (the experts are really used).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use raptor_models::checkpoint::{LoadOptions, load_decoder, save_pretrained};
use raptor_models::upcycle::{UpcycleOptions, upcycle_llama};
use raptor_models::{Batch, Decoder, DecoderConfig, DecoderFamily, DecoderHead, ForwardCtx, Model};
use tch::{Device, Tensor};

fn dense(tied: bool) -> Decoder {
    tch::manual_seed(21);
    let mut cfg = DecoderConfig::tiny(DecoderFamily::Llama, DecoderHead::LanguageModel);
    cfg.tie_word_embeddings = tied;
    let m = Decoder::new(cfg, Device::Cpu).unwrap();
    // Widen the weights so that attention, routing and the MLPs all move the logits.
    // In name order: `variables()` is a HashMap, whose order (and so which tensor gets which
    // draw) changes from process to process.
    let vars: std::collections::BTreeMap<String, Tensor> =
        m.var_store().variables().into_iter().collect();
    tch::no_grad(|| {
        for (_, t) in vars {
            let mut t = t;
            let n = t.randn_like() * 0.3;
            let _ = t.f_add_(&n).unwrap();
        }
    });
    m
}

fn batch() -> Batch {
    Batch::from_records(
        &[vec![3, 7, 11, 2, 39, 5], vec![1, 2, 3], vec![20, 21]],
        0,
        None,
        Device::Cpu,
    )
    .unwrap()
}

fn logits<M: Model>(m: &M) -> Tensor {
    tch::no_grad(|| m.forward(&batch(), &mut ForwardCtx::new(false))).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn identical_experts_give_the_dense_logits() {
    for (tied, e, k, seed) in [
        (false, 4, 2, 0u64),
        (true, 8, 2, 1),
        (false, 3, 1, 2),
        (true, 2, 2, 3),
    ] {
        let d = dense(tied);
        let mut opts = UpcycleOptions::new(e, k);
        opts.seed = seed;
        opts.router_std = 1.0; // a far-from-uniform router: the experts still agree
        let m = upcycle_llama(&d, &opts).unwrap();
        assert_eq!(m.sparse_layers(), vec![0, 1]);
        assert_eq!(m.router_params().len(), 2);
        let diff = max_diff(&logits(&m), &logits(&d));
        assert!(diff < 1e-5, "E={e} k={k}: upcycled logits differ by {diff}");
        // Routing is not trivial: several experts are selected over the batch.
        let mut ctx = ForwardCtx::new(false);
        ctx.collect_routing = true;
        let _ = tch::no_grad(|| m.forward(&batch(), &mut ctx)).unwrap();
        let used = ctx.routing[0]
            .indices
            .flatten(0, -1)
            .unique_dim(0, false, false, false)
            .0;
        assert!(used.size()[0] > 1.min(e), "E={e}: one expert only");
    }
}

#[test]
fn partial_upcycling_and_a_changed_expert() {
    let d = dense(false);
    let mut opts = UpcycleOptions::new(4, 2);
    opts.layers = Some(vec![1]);
    let m = upcycle_llama(&d, &opts).unwrap();
    assert_eq!(m.sparse_layers(), vec![1]);
    assert!(max_diff(&logits(&m), &logits(&d)) < 1e-5);
    // A Mixtral checkpoint needs every layer sparse: this one cannot be exported.
    assert!(m.hf_config_json().is_none());
    // Perturb the experts of layer 1 (every one: which of the 4 the top-2 router picks for
    // these 11 tokens depends on the draws): the logits move.
    let vars = m.var_store().variables();
    tch::no_grad(|| {
        for e in 0..4 {
            let name = format!("model.layers.1.block_sparse_moe.experts.{e}.w2.weight");
            let mut w = vars[&name].shallow_clone();
            let n = w.randn_like();
            let _ = w.f_add_(&n).unwrap();
        }
    });
    assert!(max_diff(&logits(&m), &logits(&d)) > 1e-3);
}

#[test]
fn upcycled_model_exports_as_mixtral_and_loads_back() {
    let d = dense(true);
    let m = upcycle_llama(&d, &UpcycleOptions::new(4, 2)).unwrap();
    let dir = std::env::temp_dir().join(format!("raptor-upcycle-{}", std::process::id()));
    save_pretrained(&m, &dir).unwrap();
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert!(text.contains("\"mixtral\"") && text.contains("\"num_local_experts\": 4"));
    let back = load_decoder(
        &dir,
        DecoderHead::LanguageModel,
        Device::Cpu,
        &LoadOptions::exact(),
    )
    .unwrap();
    assert_eq!(back.model.config(), m.config());
    assert!(max_diff(&logits(&back.model), &logits(&d)) < 1e-5);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn upcycling_rejects_what_mixtral_cannot_hold() {
    let d = dense(false);
    assert!(upcycle_llama(&d, &UpcycleOptions::new(2, 3)).is_err());
    let mut o = UpcycleOptions::new(4, 2);
    o.layers = Some(vec![7]);
    assert!(upcycle_llama(&d, &o).is_err());
    let mut cfg = DecoderConfig::tiny(DecoderFamily::Llama, DecoderHead::LanguageModel);
    cfg.mlp_bias = true;
    let b = Decoder::new(cfg, Device::Cpu).unwrap();
    assert!(upcycle_llama(&b, &UpcycleOptions::new(4, 2)).is_err());
    let moe = Decoder::new(
        DecoderConfig::tiny(DecoderFamily::Mixtral, DecoderHead::LanguageModel),
        Device::Cpu,
    )
    .unwrap();
    assert!(upcycle_llama(&moe, &UpcycleOptions::new(4, 2)).is_err());
}
