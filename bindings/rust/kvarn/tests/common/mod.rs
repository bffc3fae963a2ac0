//! Shared helpers of the integration tests: a xorshift RNG and a plain f32/f64 reference of what
//! the managed cache holds and computes.

#![allow(dead_code)]

use kvarn::{Config, Context, F16};

/// xorshift64* with a fixed seed: reproducible, never all zeros.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Roughly normal (sum of 4 uniforms, unit variance).
    pub fn normal(&mut self) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.866
    }

    /// n values: normal noise times a per-channel scale (channels = the last axis of `width`),
    /// like real keys with a few loud channels.
    pub fn tensor(&mut self, n: usize, width: usize) -> Vec<f32> {
        let scales: Vec<f32> = (0..width)
            .map(|_| 0.5 + 1.5 * (self.uniform() + 1.0))
            .collect();
        (0..n).map(|i| self.normal() * scales[i % width]).collect()
    }
}

/// Relative L2 error of `got` against `want`.
pub fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

/// What one layer of one sequence holds, in the model frame, as the library would reconstruct
/// it: `[n_tokens][Hk][D]` f32 K' and V'.
///
/// Tile t (G tokens) is a record when it is past the sink and all its tokens are committed: its
/// values are dequantize(quantize(tile)) of the codec, which writes the same records as the cache.
/// Every other tile is an fp16 page: round_f16(x H) H, through the library's own rotation.
pub fn reconstruct(
    ctx: &Context,
    config: &Config,
    hk: usize,
    k: &[f32],
    v: &[f32],
    committed: usize,
) -> (Vec<f32>, Vec<f32>) {
    let d = config.head_dim as usize;
    let g = config.tile_tokens as usize;
    let n = k.len() / (hk * d);
    let mut k2 = vec![0f32; k.len()];
    let mut v2 = vec![0f32; v.len()];
    let mut t = 0;
    while t * g < n {
        let lo = t * g;
        let hi = (lo + g).min(n);
        let is_record = t >= config.sink_tiles as usize && hi - lo == g && hi <= committed;
        for h in 0..hk {
            // gather this head's tokens of the tile: [tokens][D]
            let gather = |x: &[f32]| -> Vec<f32> {
                let mut out = Vec::with_capacity((hi - lo) * d);
                for tok in lo..hi {
                    let base = (tok * hk + h) * d;
                    out.extend_from_slice(&x[base..base + d]);
                }
                out
            };
            let (kt, vt) = (gather(k), gather(v));
            let (kr, vr) = if is_record {
                let rec = ctx.quantize(config, &kt, &vt).expect("quantize");
                ctx.dequantize(config, &rec).expect("dequantize")
            } else {
                (
                    fp16_page(ctx, config, &kt, config.key_flags),
                    fp16_page(ctx, config, &vt, config.value_flags),
                )
            };
            for (i, tok) in (lo..hi).enumerate() {
                let base = (tok * hk + h) * d;
                k2[base..base + d].copy_from_slice(&kr[i * d..(i + 1) * d]);
                v2[base..base + d].copy_from_slice(&vr[i * d..(i + 1) * d]);
            }
        }
        t += 1;
    }
    (k2, v2)
}

/// An fp16 page round trip: rotate (unless ablated), round to fp16, rotate back.
fn fp16_page(ctx: &Context, config: &Config, x: &[f32], flags: u32) -> Vec<f32> {
    let d = config.head_dim;
    if flags & Config::NO_ROTATION != 0 {
        return x.iter().map(|&a| F16::from_f32(a).to_f32()).collect();
    }
    let mut half = vec![F16::default(); x.len()];
    ctx.rotate(d, x, &mut half).expect("rotate");
    let mut back = vec![0f32; x.len()];
    ctx.rotate(d, &half, &mut back).expect("rotate back");
    back
}

/// Plain attention of queries `q` `[n_q][Hq][D]` over `[n][Hk][D]` K and V (f64 accumulation):
/// query i of n_q sees keys [0, n - n_q + i] (decode: n_q = 1 sees all). Returns out
/// `[n_q][Hq][D]` and lse `[n_q][Hq]` (natural log of the softmax denominator of scaled scores).
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    hq: usize,
    hk: usize,
    d: usize,
) -> (Vec<f64>, Vec<f64>) {
    attention_window(q, k, v, hq, hk, d, 0)
}

/// `attention` under a sliding window: query p sees the `window` most recent keys (0 = all).
pub fn attention_window(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    hq: usize,
    hk: usize,
    d: usize,
    window: usize,
) -> (Vec<f64>, Vec<f64>) {
    let n = k.len() / (hk * d);
    let n_q = q.len() / (hq * d);
    let scale = 1.0 / (d as f64).sqrt();
    let group = hq / hk;
    let mut out = vec![0f64; q.len()];
    let mut lse = vec![0f64; n_q * hq];
    for i in 0..n_q {
        let visible = n - n_q + i + 1;
        let first = if window > 0 {
            visible.saturating_sub(window)
        } else {
            0
        };
        for h in 0..hq {
            let kv = h / group;
            let qrow = &q[(i * hq + h) * d..(i * hq + h + 1) * d];
            let scores: Vec<f64> = (first..visible)
                .map(|j| {
                    let krow = &k[(j * hk + kv) * d..(j * hk + kv + 1) * d];
                    scale
                        * qrow
                            .iter()
                            .zip(krow)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = w.iter().sum();
            lse[i * hq + h] = m + z.ln();
            let o = &mut out[(i * hq + h) * d..(i * hq + h + 1) * d];
            for (j, wj) in (first..visible).zip(w.iter()) {
                let vrow = &v[(j * hk + kv) * d..(j * hk + kv + 1) * d];
                for c in 0..d {
                    o[c] += wj / z * vrow[c] as f64;
                }
            }
        }
    }
    (out, lse)
}
