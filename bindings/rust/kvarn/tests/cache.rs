//! The managed cache against a plain Rust reference: attention over what the cache should hold
//! (fp16 sink and tail pages, records for committed tiles), speculative append + truncate,
//! commit, fork, export/import, and the statuses of failing calls.

mod common;

use common::{attention, attention_window, reconstruct, rel_l2, Rng};
use kvarn::{AttentionMode, AttentionParams, Cache, CacheOptions, Config, Context, Status, F16};

const D: usize = 64;
const HK: usize = 2;
const HQ: usize = 8; // GQA 4
const LAYERS: usize = 2;

/// The tokens appended to each layer of one sequence, in the model frame.
#[derive(Clone)]
struct Mirror {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    committed: usize,
}

impl Mirror {
    fn new() -> Mirror {
        Mirror {
            k: vec![Vec::new(); LAYERS],
            v: vec![Vec::new(); LAYERS],
            committed: 0,
        }
    }
    fn tokens(&self, layer: usize) -> usize {
        self.k[layer].len() / (HK * D)
    }
    fn truncate(&mut self, n: usize) {
        for l in 0..LAYERS {
            self.k[l].truncate(n * HK * D);
            self.v[l].truncate(n * HK * D);
        }
        self.committed = self.committed.min(n);
    }
}

fn setup(preset: &str) -> (Context, Config) {
    let ctx = Context::with_options(&kvarn::ContextOptions {
        backend: kvarn::Backend::Cpu,
        num_threads: 2,
        ..Default::default()
    })
    .unwrap();
    let config = Config::from_preset(preset, D as i32).unwrap();
    (ctx, config)
}

fn options(config: Config) -> CacheOptions {
    CacheOptions {
        max_tokens: 4096,
        max_sequences: 8,
        ..CacheOptions::new(config, LAYERS as i32, HK as i32)
    }
}

/// Appends n random tokens to every layer (committed unless speculative) and mirrors them.
fn append(cache: &mut Cache, rng: &mut Rng, seq: i64, m: &mut Mirror, n: usize, speculative: bool) {
    for l in 0..LAYERS {
        let k = rng.tensor(n * HK * D, D);
        let v = rng.tensor(n * HK * D, D);
        if speculative {
            cache.append_speculative(seq, l as i32, &k, &v).unwrap();
        } else {
            cache.append(seq, l as i32, &k, &v).unwrap();
        }
        m.k[l].extend_from_slice(&k);
        m.v[l].extend_from_slice(&v);
    }
    if !speculative {
        m.committed = m.tokens(0);
    }
}

/// Decode attention of one random query per layer against the reference; returns the largest
/// relative L2 error and the outputs.
fn check_decode(
    ctx: &Context,
    config: &Config,
    cache: &Cache,
    rng: &mut Rng,
    seq: i64,
    m: &Mirror,
) -> (f64, Vec<Vec<f32>>) {
    let mut worst = 0f64;
    let mut outs = Vec::new();
    for l in 0..LAYERS {
        let q = rng.tensor(HQ * D, D);
        let mut out = vec![0f32; HQ * D];
        let mut lse = vec![0f32; HQ];
        cache
            .attention(
                l as i32,
                &[seq],
                &AttentionParams::decode(HQ as i32),
                &q,
                &mut out,
                Some(&mut lse),
            )
            .unwrap();
        let (k2, v2) = reconstruct(ctx, config, HK, &m.k[l], &m.v[l], m.committed);
        let (want, want_lse) = attention(&q, &k2, &v2, HQ, HK, D);
        let err = rel_l2(&out, &want);
        assert!(
            err < 1e-4,
            "layer {l}: relative L2 error {err} against the reference"
        );
        for (g, w) in lse.iter().zip(&want_lse) {
            assert!((*g as f64 - w).abs() < 1e-3, "lse {g} vs {w}");
        }
        worst = worst.max(err);
        outs.push(out);
    }
    (worst, outs)
}

#[test]
fn decode_loop_matches_fp32_attention_over_the_dequantized_cache() {
    for preset in ["k4v2_g64", "k2v2_g128", "k8v8_g128"] {
        let (ctx, config) = setup(preset);
        let mut cache = Cache::new(&ctx, &options(config)).unwrap();
        let mut rng = Rng::new(11);
        let mut m = Mirror::new();
        cache.add_sequence(3).unwrap();
        // prefill in uneven chunks: sink tile, record tiles, a partial tail
        for n in [37usize, 100, 163] {
            append(&mut cache, &mut rng, 3, &mut m, n, false);
        }
        let mut worst = 0f64;
        for _step in 0..6 {
            append(&mut cache, &mut rng, 3, &mut m, 1, false);
            worst = worst.max(check_decode(&ctx, &config, &cache, &mut rng, 3, &m).0);
        }
        assert_eq!(cache.sequence_length(3, 1).unwrap().tokens, 306);
        let stats = cache.stats().unwrap();
        assert_eq!(stats.tokens, (306 * LAYERS) as i64);
        // complete tiles past the sink tile are records, one per KV head and layer
        let record_tiles = 306 / config.tile_tokens as usize - 1;
        assert_eq!(
            stats.records,
            (record_tiles * HK * LAYERS) as i64,
            "{stats:?}"
        );
        assert!(
            stats.bytes_used > 0 && stats.fp16_bytes == (306 * LAYERS * HK * D * 4) as i64,
            "{stats:?}"
        );
        eprintln!(
            "{preset}: worst relative L2 error {worst:.2e}, compression {:.2}x",
            stats.compression_ratio
        );
    }
}

#[test]
fn extend_two_sequences_with_causal_queries() {
    let (ctx, config) = setup("k4v2_g64");
    let mut cache = Cache::new(&ctx, &options(config)).unwrap();
    let mut rng = Rng::new(5);
    let mut ms = [Mirror::new(), Mirror::new()];
    for (i, n) in [(0usize, 190usize), (1, 75)] {
        cache.add_sequence(100 + i as i64).unwrap();
        append(&mut cache, &mut rng, 100 + i as i64, &mut ms[i], n, false);
    }
    let indptr = [0i32, 3, 8]; // 3 query tokens for the first sequence, 5 for the second
    for l in 0..LAYERS {
        let q = rng.tensor(8 * HQ * D, D);
        let mut out = vec![F16::default(); 8 * HQ * D]; // fp16 output
        let mut lse = vec![0f32; 8 * HQ];
        cache
            .attention(
                l as i32,
                &[100, 101],
                &AttentionParams::extend(HQ as i32, &indptr),
                &q,
                &mut out,
                Some(&mut lse),
            )
            .unwrap();
        for (b, m) in ms.iter().enumerate() {
            let (lo, hi) = (indptr[b] as usize * HQ * D, indptr[b + 1] as usize * HQ * D);
            let (k2, v2) = reconstruct(&ctx, &config, HK, &m.k[l], &m.v[l], m.committed);
            let (want, want_lse) = attention(&q[lo..hi], &k2, &v2, HQ, HK, D);
            let got: Vec<f32> = out[lo..hi].iter().map(|h| h.to_f32()).collect();
            let err = rel_l2(&got, &want);
            assert!(
                err < 2e-3,
                "sequence {b} layer {l}: fp16 output error {err}"
            ); // fp16 rounding
            let lse_got = &lse[lo / D..hi / D];
            for (g, w) in lse_got.iter().zip(&want_lse) {
                assert!((*g as f64 - w).abs() < 1e-3);
            }
        }
    }
}

#[test]
fn speculative_tokens_are_seen_then_committed_or_rolled_back() {
    let (ctx, config) = setup("k4v2_g64");
    let mut cache = Cache::new(&ctx, &options(config)).unwrap();
    let mut rng = Rng::new(21);
    let mut m = Mirror::new();
    cache.add_sequence(1).unwrap();
    append(&mut cache, &mut rng, 1, &mut m, 120, false);
    let before = m.clone();

    // a draft of 20 tokens crossing the tile boundary at 128: seen by attention, not quantized
    append(&mut cache, &mut rng, 1, &mut m, 20, true);
    let len = cache.sequence_length(1, 0).unwrap();
    assert_eq!((len.tokens, len.committed), (140, 120));
    check_decode(&ctx, &config, &cache, &mut rng, 1, &m);
    // a committed append while speculative tokens are pending is refused, and changes nothing
    let k = rng.tensor(HK * D, D);
    assert_eq!(
        cache.append(1, 0, &k, &k).unwrap_err().status(),
        Status::InvalidState
    );
    assert_eq!(cache.sequence_length(1, 0).unwrap().tokens, 140);

    // rejected draft: truncate back; attention equals the one before the draft, bit for bit
    let mut rng_a = Rng::new(99);
    let mut rng_b = Rng::new(99);
    cache.truncate(1, 120).unwrap();
    m = before.clone();
    let (_, after_rollback) = check_decode(&ctx, &config, &cache, &mut rng_a, 1, &m);
    let mut fresh = Cache::new(&ctx, &options(config)).unwrap();
    fresh.add_sequence(1).unwrap();
    for l in 0..LAYERS {
        fresh
            .append(1, l as i32, &before.k[l], &before.v[l])
            .unwrap();
    }
    let (_, untouched) = check_decode(&ctx, &config, &fresh, &mut rng_b, 1, &before);
    assert_eq!(
        after_rollback, untouched,
        "a truncated draft must leave no trace"
    );

    // accepted draft: commit 12 of 20 speculative tokens; tile 1 (tokens 64..127) becomes a record
    append(&mut cache, &mut rng, 1, &mut m, 20, true);
    let records_before = cache.stats().unwrap().records;
    cache.commit(1, 132).unwrap();
    m.committed = 132;
    assert!(cache.stats().unwrap().records > records_before);
    let len = cache.sequence_length(1, 1).unwrap();
    assert_eq!((len.tokens, len.committed), (140, 132));
    check_decode(&ctx, &config, &cache, &mut rng, 1, &m);
}

#[test]
fn fork_and_export_import_reproduce_attention_exactly() {
    let (ctx, config) = setup("k4v2_g64");
    let mut cache = Cache::new(&ctx, &options(config)).unwrap();
    let mut rng = Rng::new(8);
    let mut m = Mirror::new();
    cache.add_sequence(10).unwrap();
    append(&mut cache, &mut rng, 10, &mut m, 200, false);

    // fork the first 128 tokens (a tile boundary) and all of them
    cache.fork(10, 11, Some(128)).unwrap();
    cache.fork(10, 12, None).unwrap();
    assert_eq!(cache.sequence_length(11, 0).unwrap().tokens, 128);
    assert_eq!(cache.sequence_length(12, 1).unwrap().tokens, 200);
    let mut short = m.clone();
    short.truncate(128);
    let seed = 77;
    let (_, out10) = check_decode(&ctx, &config, &cache, &mut Rng::new(seed), 10, &m);
    let (_, out12) = check_decode(&ctx, &config, &cache, &mut Rng::new(seed), 12, &m);
    assert_eq!(out10, out12);
    check_decode(&ctx, &config, &cache, &mut Rng::new(seed), 11, &short);
    // a fork cutting a record tile is refused
    assert_eq!(
        cache.fork(10, 13, Some(100)).unwrap_err().status(),
        Status::InvalidState
    );

    // export/import into a second cache gives the same attention, bit for bit
    let blob = cache.export_sequence(10).unwrap();
    let mut other = Cache::new(&ctx, &options(config)).unwrap();
    other.import_sequence(10, &blob).unwrap();
    let (_, imported) = check_decode(&ctx, &config, &other, &mut Rng::new(seed), 10, &m);
    assert_eq!(imported, out10);
    assert_eq!(other.export_sequence(10).unwrap(), blob);

    // damaged blobs: CorruptData, and nothing is added
    let mut flipped = blob.clone();
    let at = (rng.next_u64() as usize) % flipped.len();
    flipped[at] ^= 0x10;
    assert_eq!(
        other.import_sequence(20, &flipped).unwrap_err().status(),
        Status::CorruptData
    );
    assert_eq!(
        other
            .import_sequence(21, &blob[..blob.len() / 2])
            .unwrap_err()
            .status(),
        Status::CorruptData
    );
    assert_eq!(
        other.import_sequence(22, &[]).unwrap_err().status(),
        Status::CorruptData
    );
    assert_eq!(
        other.sequence_length(20, 0).unwrap_err().status(),
        Status::NotFound
    );
    assert_eq!(other.stats().unwrap().sequences, 1);
    // a cache of another config refuses the blob
    let g128 = Config::from_preset("k4v2_g128", D as i32).unwrap();
    let mut foreign = Cache::new(&ctx, &options(g128)).unwrap();
    assert_eq!(
        foreign.import_sequence(1, &blob).unwrap_err().status(),
        Status::CorruptData
    );

    cache.remove_sequence(11).unwrap();
    assert_eq!(
        cache.sequence_length(11, 0).unwrap_err().status(),
        Status::NotFound
    );
}

#[test]
fn failing_calls_return_their_status_and_change_nothing() {
    let (ctx, config) = setup("k4v2_g64");
    let mut cache = Cache::new(
        &ctx,
        &CacheOptions {
            max_tokens: 256,
            max_sequences: 2,
            ..CacheOptions::new(config, LAYERS as i32, HK as i32)
        },
    )
    .unwrap();
    let mut rng = Rng::new(3);
    let mut m = Mirror::new();
    cache.add_sequence(1).unwrap();
    assert_eq!(
        cache.add_sequence(1).unwrap_err().status(),
        Status::AlreadyExists
    );
    append(&mut cache, &mut rng, 1, &mut m, 150, false);

    let tok = rng.tensor(HK * D, D);
    // slice length checks: Err, not a panic
    let e = cache
        .append(1, 0, &tok[..HK * D - 1], &tok[..HK * D - 1])
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("not a multiple"), "{e}");
    assert_eq!(
        cache.append(1, 0, &tok, &tok[..D]).unwrap_err().status(),
        Status::InvalidArgument
    );
    // library checks
    assert_eq!(
        cache.append(9, 0, &tok, &tok).unwrap_err().status(),
        Status::NotFound
    );
    assert_eq!(
        cache
            .append(1, LAYERS as i32, &tok, &tok)
            .unwrap_err()
            .status(),
        Status::InvalidArgument
    );
    let mut bad = tok.clone();
    bad[5] = f32::NAN;
    assert_eq!(
        cache.append(1, 0, &bad, &tok).unwrap_err().status(),
        Status::NonFinite
    );
    bad[5] = 1e6;
    assert_eq!(
        cache.append(1, 0, &tok, &bad).unwrap_err().status(),
        Status::Overflow
    );
    assert_eq!(
        cache.truncate(1, 100).unwrap_err().status(),
        Status::InvalidState
    ); // inside a record tile
    assert_eq!(
        cache.commit(1, 151).unwrap_err().status(),
        Status::InvalidArgument
    );
    let len = cache.sequence_length(1, 0).unwrap();
    assert_eq!(
        (len.tokens, len.committed),
        (150, 150),
        "failed calls changed the cache"
    );
    check_decode(&ctx, &config, &cache, &mut rng, 1, &m);

    // capacity: the record pool of a layer holds max_tokens = 256 tokens (4 tiles), one in use
    let big = rng.tensor(400 * HK * D, D);
    cache.add_sequence(2).unwrap();
    assert_eq!(
        cache.append(2, 0, &big, &big).unwrap_err().status(),
        Status::Capacity
    );
    assert_eq!(cache.sequence_length(2, 0).unwrap().tokens, 0);
    assert_eq!(
        cache.add_sequence(3).unwrap_err().status(),
        Status::Capacity
    ); // max_sequences 2

    // attention argument checks
    let q = rng.tensor(HQ * D, D);
    let mut out = vec![0f32; HQ * D];
    let e = cache.attention(
        0,
        &[1],
        &AttentionParams::decode(3),
        &q[..3 * D],
        &mut out[..3 * D],
        None,
    );
    assert_eq!(e.unwrap_err().status(), Status::InvalidArgument); // Hq not a multiple of Hk
    let e = cache.attention(
        0,
        &[1],
        &AttentionParams::decode(HQ as i32),
        &q,
        &mut out[..D],
        None,
    );
    assert_eq!(e.unwrap_err().status(), Status::InvalidArgument);
    let mut lse = vec![0f32; 1];
    let e = cache.attention(
        0,
        &[1],
        &AttentionParams::decode(HQ as i32),
        &q,
        &mut out,
        Some(&mut lse),
    );
    assert_eq!(e.unwrap_err().status(), Status::InvalidArgument);
    for indptr in [&[0i32][..], &[1, 1][..], &[0, 2][..]] {
        let e = cache.attention(
            0,
            &[1],
            &AttentionParams::extend(HQ as i32, indptr),
            &q,
            &mut out,
            None,
        );
        assert_eq!(
            e.unwrap_err().status(),
            Status::InvalidArgument,
            "indptr {indptr:?}"
        );
    }
    let e = cache.attention(
        0,
        &[42],
        &AttentionParams::decode(HQ as i32),
        &q,
        &mut out,
        None,
    );
    assert_eq!(e.unwrap_err().status(), Status::NotFound);
    assert_eq!(
        cache.export_sequence(42).unwrap_err().status(),
        Status::NotFound
    );

    // bad options
    let mut o = CacheOptions::new(config, 0, HK as i32);
    assert_eq!(
        Cache::new(&ctx, &o).unwrap_err().status(),
        Status::InvalidArgument
    );
    o = CacheOptions::new(
        Config {
            key_bits: 3,
            ..config
        },
        1,
        HK as i32,
    );
    assert!(matches!(
        Cache::new(&ctx, &o).unwrap_err().status(),
        Status::Unsupported | Status::InvalidArgument
    ));
}

#[test]
fn fp16_and_bf16_appends_store_the_same_as_f32_of_the_same_values() {
    use kvarn::Bf16;
    let (ctx, config) = setup("k4v2_g64");
    let mut rng = Rng::new(17);
    let n = 150 * HK * D;
    let k = rng.tensor(n, D);
    let v = rng.tensor(n, D);
    let k16: Vec<F16> = k.iter().map(|&x| F16::from_f32(x)).collect();
    let v16: Vec<F16> = v.iter().map(|&x| F16::from_f32(x)).collect();
    let kb: Vec<Bf16> = k.iter().map(|&x| Bf16::from_f32(x)).collect();
    let vb: Vec<Bf16> = v.iter().map(|&x| Bf16::from_f32(x)).collect();
    let widen16 = |x: &[F16]| x.iter().map(|h| h.to_f32()).collect::<Vec<f32>>();
    let widenb = |x: &[Bf16]| x.iter().map(|h| h.to_f32()).collect::<Vec<f32>>();
    let mut cache = Cache::new(&ctx, &options(config)).unwrap();
    for id in 1..=4 {
        cache.add_sequence(id).unwrap();
    }
    for l in 0..LAYERS as i32 {
        cache.append(1, l, &k16, &v16).unwrap();
        cache.append(2, l, &widen16(&k16), &widen16(&v16)).unwrap();
        cache.append(3, l, &kb, &vb).unwrap();
        cache.append(4, l, &widenb(&kb), &widenb(&vb)).unwrap();
    }
    assert!(cache.export_sequence(1).unwrap() == cache.export_sequence(2).unwrap());
    assert!(cache.export_sequence(3).unwrap() == cache.export_sequence(4).unwrap());
    assert!(cache.export_sequence(1).unwrap() != cache.export_sequence(3).unwrap());
}

#[test]
fn model_variants_sliding_window_and_sinks() {
    let (ctx, config) = setup("k4v2_g64");
    let mut cache = Cache::new(&ctx, &options(config)).unwrap();
    let mut rng = Rng::new(17);
    let mut m = Mirror::new();
    cache.add_sequence(9).unwrap();
    append(&mut cache, &mut rng, 9, &mut m, 300, false);
    let q = rng.tensor(HQ * D, D);
    let (k2, v2) = reconstruct(&ctx, &config, HK, &m.k[0], &m.v[0], m.committed);
    // A 100-token window (Mistral / gpt-oss style) against the reference over those keys.
    let mut windowed = AttentionParams::decode(HQ as i32);
    windowed.sliding_window = 100;
    let mut out = vec![0f32; HQ * D];
    cache
        .attention(0, &[9], &windowed, &q, &mut out, None)
        .unwrap();
    let (want, _) = attention_window(&q, &k2, &v2, HQ, HK, D, 100);
    let err = rel_l2(&out, &want);
    assert!(err < 1e-4, "window: relative L2 error {err}");
    let (full, _) = attention(&q, &k2, &v2, HQ, HK, D);
    assert!(rel_l2(&out, &full) > 1e-3, "the window changed nothing");
    // Learned sinks: each joins its head's denominator, so out = plain / (1 + e^(sink - lse)).
    let sinks: Vec<f32> = (0..HQ).map(|h| 0.5 * h as f32 - 1.0).collect();
    let mut with_sinks = AttentionParams::decode(HQ as i32);
    with_sinks.sinks = Some(&sinks);
    let (mut plain, mut plain_lse) = (vec![0f32; HQ * D], vec![0f32; HQ]);
    let plain_params = AttentionParams::decode(HQ as i32);
    cache
        .attention(0, &[9], &plain_params, &q, &mut plain, Some(&mut plain_lse))
        .unwrap();
    let (mut sunk, mut sunk_lse) = (vec![0f32; HQ * D], vec![0f32; HQ]);
    cache
        .attention(0, &[9], &with_sinks, &q, &mut sunk, Some(&mut sunk_lse))
        .unwrap();
    for h in 0..HQ {
        let (l, s) = (plain_lse[h] as f64, sinks[h] as f64);
        let keep = 1.0 / (1.0 + (s - l).exp());
        for c in 0..D {
            let want = plain[h * D + c] as f64 * keep;
            assert!((sunk[h * D + c] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()));
        }
        let want_lse = l.max(s) + (1.0 + (-(l - s).abs()).exp()).ln();
        assert!(
            (sunk_lse[h] as f64 - want_lse).abs() < 1e-5,
            "lse {} vs {want_lse}",
            sunk_lse[h]
        );
    }
    // Prefix mode: a decode query after the cache sees every key, as the causal last token does.
    let mut prefix = AttentionParams::decode(HQ as i32);
    prefix.mode = AttentionMode::Prefix;
    let mut out_prefix = vec![0f32; HQ * D];
    cache
        .attention(0, &[9], &prefix, &q, &mut out_prefix, None)
        .unwrap();
    assert_eq!(out_prefix, plain);
    // One sink per query head, or an error before anything is read.
    with_sinks.sinks = Some(&sinks[..3]);
    let e = cache
        .attention(0, &[9], &with_sinks, &q, &mut out, None)
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    windowed.sliding_window = -1;
    let e = cache
        .attention(0, &[9], &windowed, &q, &mut out, None)
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
}
