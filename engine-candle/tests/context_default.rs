//! ENG-CTX-1: with no context configured an engine takes the model's trained context (the
//! default SmolLM2's 8192) when its key/value cache fits the memory allowed, cuts it to fit
//! when it does not, and refuses a load where not even 256 tokens a slot fit.

mod common;

use engine_candle::{CandleEngine, EngineError};

fn load(slots: usize, ctx: usize, kv_mib: usize) -> Result<CandleEngine, EngineError> {
    let mut opts = common::test_options();
    opts.slots = slots;
    opts.ctx = ctx;
    opts.settings.kv_cache_max_bytes = kv_mib << 20;
    CandleEngine::load(opts)
}

#[test]
fn the_trained_context_is_the_default_as_far_as_memory_allows() {
    let full = load(4, 0, 2048).expect("loads");
    assert_eq!(full.info().ctx_train, 8192);
    assert_eq!(full.info().ctx, 8192, "4 slots of 8192 fit 2 GiB");
    assert!(full.info().kv_cache_bytes <= 2 << 30);
    // a smaller allowance: the context is cut to a multiple of 256 that fits every slot
    let cut = load(4, 0, 256).expect("loads");
    let ctx = cut.info().ctx;
    assert!(ctx < 8192 && ctx.is_multiple_of(256), "ctx {ctx}");
    assert!(cut.info().kv_cache_bytes <= 256 << 20);
    let per_token = cut.info().kv_cache_bytes / ctx;
    assert!(
        (ctx + 256) * per_token > 256 << 20,
        "the largest step that fits"
    );
    // an explicit context is taken as given, a too-long one refused
    assert_eq!(load(1, 1024, 1).expect("loads").info().ctx, 1024);
    assert!(matches!(
        load(1, 16_384, 2048),
        Err(EngineError::InvalidParams(_))
    ));
    match load(64, 0, 1) {
        Err(EngineError::InvalidParams(m)) => assert!(m.contains("kv_cache_mib"), "{m}"),
        other => panic!("expected a refusal, got {:?}", other.map(|e| e.info().ctx)),
    }
}

/// ENG-KV16-1: an f16 cache takes half the bytes, so the same allowance holds twice the
/// context.
#[test]
fn an_f16_cache_holds_twice_the_context_in_the_same_memory() {
    let load_kv = |kv_type| {
        let mut opts = common::test_options();
        opts.slots = 8;
        opts.ctx = 0;
        opts.settings.kv_cache_max_bytes = 1 << 30;
        opts.settings.kv_type = kv_type;
        CandleEngine::load(opts).expect("loads")
    };
    let f32_cache = load_kv(engine_candle::KvType::F32);
    let f16_cache = load_kv(engine_candle::KvType::F16);
    // 8 slots × 8192 × 46 KB = 3 GiB in f32: cut to fit 1 GiB; f16 holds twice as many
    assert_eq!(f32_cache.info().ctx, 2816);
    assert_eq!(f16_cache.info().ctx, 5632);
    let per_token = |e: &CandleEngine| e.info().kv_cache_bytes / e.info().ctx;
    assert_eq!(per_token(&f16_cache) * 2, per_token(&f32_cache));
}
