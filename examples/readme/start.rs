use kvarn::{AttentionParams, Cache, CacheOptions, Config, Context};

fn main() -> kvarn::Result<()> {
    let ctx = Context::cpu()?; // RAII handles; every failure is a kvarn::Error
    let config = Config::from_preset("k4v2_g128", 128)?; // 4-bit K, 2-bit V, 128-token tiles
    let mut options = CacheOptions::new(config, 2, 2); // 2 layers, 2 KV heads
    options.max_tokens = 4096;
    options.max_sequences = 1;
    let mut cache = Cache::new(&ctx, &options)?;
    println!("cache: {} bytes reserved", cache.stats()?.bytes_capacity);

    // Model data, here a fixed pattern in [-1, 1]
    let data = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (i * 7919 % 2001) as f32 / 1e3 - 1.0)
            .collect()
    };
    cache.add_sequence(42)?;
    for layer in 0..2 {
        // K, V: [4000][Hk][D] as the model produced them (unrotated)
        cache.append(42, layer, &data(4000 * 2 * 128), &data(4000 * 2 * 128))?;
    }
    let q = data(8 * 128); // decode: one token, 8 query heads (GQA 4)
    let mut out = vec![0f32; 8 * 128];
    cache.attention(0, &[42], &AttentionParams::decode(8), &q, &mut out, None)?;

    let s = cache.stats()?;
    println!(
        "{} tokens: {} bytes used, {} as fp16: {:.2}x smaller",
        s.tokens, s.bytes_used, s.fp16_bytes, s.compression_ratio
    );
    Ok(())
}
