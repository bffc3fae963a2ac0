//! A managed KVarN cache through a few decode steps, from Rust.
//!
//! A model with 2 layers, 8 KV heads, 32 query heads (GQA 4) and head dim 128 prefills 300
//! tokens (tile 0 stays fp16 as the sink, tile 1 becomes records, the rest is the fp16 tail),
//! then decodes 8 tokens: each step appends the new token's K/V to every layer and runs decode
//! attention. Each output is checked against a plain Rust fp32 attention over the dequantized
//! cache (records through the codec, fp16 pages through the rotation), which is what the library
//! attends over. K/V/Q are pseudo-random (xorshift) with a few loud channels.
//!
//!     KVARN_LIB_DIR=build/cpu LD_LIBRARY_PATH=build/cpu \
//!         cargo run --offline --manifest-path examples/rust/Cargo.toml
//!
//! Exits non-zero when a call fails or an output is off by more than 1e-3 (relative L2).

use kvarn::{AttentionParams, Cache, CacheOptions, Config, Context, F16};

const LAYERS: usize = 2;
const HK: usize = 8;
const HQ: usize = 32;
const D: usize = 128;
const PREFILL: usize = 300;
const STEPS: usize = 8;
const TOLERANCE: f32 = 1e-3;

struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// n values `[..][D]`: noise times a per-channel scale, 4 channels of 8 ten times louder.
    fn activations(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| self.uniform() * if i % D % 32 == 5 { 10.0 } else { 1.0 })
            .collect()
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("decode example failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    println!("libkvarn {} from Rust", kvarn::version());
    let ctx = Context::cpu()?;
    let config = Config::from_preset("k4v2_g128", D as i32)?;
    let options = CacheOptions {
        max_tokens: 4096,
        ..CacheOptions::new(config, LAYERS as i32, HK as i32)
    };
    let mut cache = Cache::new(&ctx, &options)?;
    let seq = 42;
    cache.add_sequence(seq)?;

    // What the engine appended, per layer: [tokens][HK][D], unrotated.
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut keys = vec![Vec::new(); LAYERS];
    let mut values = vec![Vec::new(); LAYERS];
    for layer in 0..LAYERS {
        let (k, v) = (
            rng.activations(PREFILL * HK * D),
            rng.activations(PREFILL * HK * D),
        );
        cache.append(seq, layer as i32, &k, &v)?;
        keys[layer] = k;
        values[layer] = v;
    }

    let mut worst = 0f32;
    for step in 0..STEPS {
        for layer in 0..LAYERS {
            let (k, v) = (rng.activations(HK * D), rng.activations(HK * D));
            cache.append(seq, layer as i32, &k, &v)?;
            keys[layer].extend_from_slice(&k);
            values[layer].extend_from_slice(&v);

            let q = rng.activations(HQ * D);
            let mut out = vec![0f32; HQ * D];
            cache.attention(
                layer as i32,
                &[seq],
                &AttentionParams::decode(HQ as i32),
                &q,
                &mut out,
                None,
            )?;

            let (k2, v2) = dequantized_cache(&ctx, &config, &keys[layer], &values[layer])?;
            let want = fp32_attention(&q, &k2, &v2);
            let err = rel_l2(&out, &want);
            worst = worst.max(err);
            if err.is_nan() || err > TOLERANCE {
                return Err(format!(
                    "step {step} layer {layer}: relative L2 error {err:.3e} > {TOLERANCE:.0e}"
                )
                .into());
            }
        }
        let len = cache.sequence_length(seq, 0)?;
        println!(
            "step {step}: {} tokens, attention matches fp32 over the dequantized cache",
            len.tokens
        );
    }

    let stats = cache.stats()?;
    println!(
        "{} records, {} pages, {} bytes in use ({:.2}x smaller than fp16); worst relative L2 error {:.2e}",
        stats.records, stats.pages, stats.bytes_used, stats.compression_ratio, worst
    );
    println!("OK");
    Ok(())
}

/// What the cache holds for `[n][HK][D]` K/V, as f32 in the model frame: tiles past the sink whose
/// G tokens are all committed are records (the codec writes the same bytes as the cache), the
/// others fp16 pages of rotated values.
fn dequantized_cache(
    ctx: &Context,
    config: &Config,
    k: &[f32],
    v: &[f32],
) -> kvarn::Result<(Vec<f32>, Vec<f32>)> {
    let g = config.tile_tokens as usize;
    let n = k.len() / (HK * D);
    let (mut k2, mut v2) = (vec![0f32; k.len()], vec![0f32; v.len()]);
    for tile_start in (0..n).step_by(g) {
        let tile_end = (tile_start + g).min(n);
        let record = tile_start / g >= config.sink_tiles as usize && tile_end - tile_start == g;
        for h in 0..HK {
            let head = |x: &[f32]| -> Vec<f32> {
                (tile_start..tile_end)
                    .flat_map(|t| x[(t * HK + h) * D..(t * HK + h + 1) * D].iter().copied())
                    .collect()
            };
            let (kt, vt) = (head(k), head(v));
            let (kr, vr) = if record {
                ctx.dequantize(config, &ctx.quantize(config, &kt, &vt)?)?
            } else {
                (fp16_page(ctx, &kt)?, fp16_page(ctx, &vt)?)
            };
            for (i, t) in (tile_start..tile_end).enumerate() {
                let at = (t * HK + h) * D;
                k2[at..at + D].copy_from_slice(&kr[i * D..(i + 1) * D]);
                v2[at..at + D].copy_from_slice(&vr[i * D..(i + 1) * D]);
            }
        }
    }
    Ok((k2, v2))
}

/// Rotated, rounded to fp16 (as a page stores it), rotated back.
fn fp16_page(ctx: &Context, x: &[f32]) -> kvarn::Result<Vec<f32>> {
    let mut page = vec![F16::default(); x.len()];
    ctx.rotate(D as i32, x, &mut page)?;
    let mut back = vec![0f32; x.len()];
    ctx.rotate(D as i32, &page, &mut back)?;
    Ok(back)
}

/// Decode attention in plain fp32: q `[HQ][D]` over k, v `[n][HK][D]`, softmax scale 1/sqrt(D).
fn fp32_attention(q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let n = k.len() / (HK * D);
    let scale = 1.0 / (D as f32).sqrt();
    let mut out = vec![0f32; HQ * D];
    for h in 0..HQ {
        let kv = h / (HQ / HK);
        let qh = &q[h * D..(h + 1) * D];
        let scores: Vec<f32> = (0..n)
            .map(|t| {
                scale
                    * qh.iter()
                        .zip(&k[(t * HK + kv) * D..])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
            })
            .collect();
        let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f32 = weights.iter().sum();
        for (t, w) in weights.iter().enumerate() {
            let vt = &v[(t * HK + kv) * D..(t * HK + kv + 1) * D];
            for (o, x) in out[h * D..(h + 1) * D].iter_mut().zip(vt) {
                *o += w / total * x;
            }
        }
    }
    out
}

fn rel_l2(got: &[f32], want: &[f32]) -> f32 {
    let num: f32 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f32 = want.iter().map(|b| b * b).sum();
    (num / den).sqrt()
}
