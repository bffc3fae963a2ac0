//! The codec (layer 1), dtypes, configs, backends and threads, with random inputs.

mod common;

use common::Rng;
use kvarn::{Backend, Baseline, Bf16, Config, Context, Frame, RecordField, Status, F16};

fn rel_rms(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn round_trip_error_per_preset_is_bounded_and_beats_per_token_rtn_on_k() {
    let ctx = Context::cpu().unwrap();
    // upper bounds of the relative RMS error on these inputs (k, v); measured values are printed
    let cases = [
        ("k8v8_g128", 0.01, 0.01),
        ("k4v4_g128", 0.12, 0.12),
        ("k4v4_g64", 0.12, 0.12),
        ("k4v2_g128", 0.12, 0.6),
        ("k4v2_g64", 0.12, 0.6),
        ("k2v2_g128", 0.6, 0.6),
    ];
    for (preset, k_bound, v_bound) in cases {
        for d in [64usize, 128] {
            let config = Config::from_preset(preset, d as i32).unwrap();
            let g = config.tile_tokens as usize;
            let mut rng = Rng::new(d as u64 + g as u64);
            let k = rng.tensor(2 * g * d, d);
            let v = rng.tensor(2 * g * d, d);
            let records = ctx.quantize(&config, &k, &v).unwrap();
            assert_eq!(records.len(), 2 * config.record_bytes().unwrap());
            let (k2, v2) = ctx.dequantize(&config, &records).unwrap();
            let (ek, ev) = (rel_rms(&k, &k2), rel_rms(&v, &v2));
            eprintln!("{preset} D{d}: relative RMS error K {ek:.4} V {ev:.4}");
            assert!(ek < k_bound && ev < v_bound, "{preset} D{d}: K {ek} V {ev}");
            assert!(ek > 0.0 && ev > 0.0);

            // per-token RTN at the same key bits on the same keys, for comparison
            let mut rtn = vec![0f32; k.len()];
            kvarn::baseline_roundtrip(Baseline::PerTokenRtn, config.key_bits, d, &k, &mut rtn)
                .unwrap();
            let e_rtn = rel_rms(&k, &rtn);
            assert!(
                ek < e_rtn,
                "{preset} D{d}: KVarN K error {ek} not below per-token RTN {e_rtn}"
            );
        }
    }
}

#[test]
fn codec_is_deterministic_and_equal_across_input_dtypes_and_thread_counts() {
    let config = Config::from_preset("k4v2_g64", 128).unwrap();
    let mut rng = Rng::new(4);
    let n = 3 * 64 * 128;
    let k = rng.tensor(n, 128);
    let v = rng.tensor(n, 128);
    let one = Context::with_options(&kvarn::ContextOptions {
        backend: Backend::Cpu,
        num_threads: 1,
        ..Default::default()
    })
    .unwrap();
    let base = one.quantize(&config, &k, &v).unwrap();
    // other threads, each with its own context (a Context is Send, not Sync)
    let results: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = [2, 3]
            .iter()
            .map(|&t| {
                let (k, v) = (&k, &v);
                s.spawn(move || {
                    let ctx = Context::with_options(&kvarn::ContextOptions {
                        backend: Backend::Cpu,
                        num_threads: t,
                        ..Default::default()
                    })
                    .unwrap();
                    ctx.quantize(&config, k, v).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        assert!(r == &base, "records depend on the thread count");
    }
    // a context moved to another thread
    let moved = std::thread::spawn(move || one.num_threads().unwrap())
        .join()
        .unwrap();
    assert_eq!(moved, 1);

    // fp16 and bf16 inputs holding the same values as f32 give the same records
    let ctx = Context::cpu().unwrap();
    let k16: Vec<F16> = k.iter().map(|&x| F16::from_f32(x)).collect();
    let v16: Vec<F16> = v.iter().map(|&x| F16::from_f32(x)).collect();
    let k16f: Vec<f32> = k16.iter().map(|h| h.to_f32()).collect();
    let v16f: Vec<f32> = v16.iter().map(|h| h.to_f32()).collect();
    assert!(
        ctx.quantize(&config, &k16, &v16).unwrap() == ctx.quantize(&config, &k16f, &v16f).unwrap()
    );
    let kb: Vec<Bf16> = k.iter().map(|&x| Bf16::from_f32(x)).collect();
    let vb: Vec<Bf16> = v.iter().map(|&x| Bf16::from_f32(x)).collect();
    let kbf: Vec<f32> = kb.iter().map(|h| h.to_f32()).collect();
    let vbf: Vec<f32> = vb.iter().map(|h| h.to_f32()).collect();
    assert!(ctx.quantize(&config, &kb, &vb).unwrap() == ctx.quantize(&config, &kbf, &vbf).unwrap());
}

#[test]
fn strided_records_cache_frame_and_output_dtypes() {
    let ctx = Context::cpu().unwrap();
    let config = Config::from_preset("k4v4_g64", 64).unwrap();
    let rb = config.record_bytes().unwrap();
    assert_eq!(rb, 64 * 64 * 8 / 8 + 6 * 64 + 6 * 64);
    // the fields tile the record in storage order
    let fields = [
        RecordField::KCodes,
        RecordField::KScale,
        RecordField::KZero,
        RecordField::KTokenScale,
        RecordField::VCodes,
        RecordField::VChannelScale,
        RecordField::VScale,
        RecordField::VZero,
    ];
    let mut end = 0;
    for f in fields {
        let (off, len) = config.record_field(f).unwrap();
        assert_eq!(off, end, "{f:?}");
        end = off + len;
    }
    assert_eq!(end, rb);

    let mut rng = Rng::new(12);
    let n = 2 * 64 * 64;
    let k = rng.tensor(n, 64);
    let v = rng.tensor(n, 64);
    let packed = ctx.quantize(&config, &k, &v).unwrap();
    // stride rb + 32: same records, padding untouched
    let stride = rb + 32;
    let mut strided = vec![0xa5u8; 2 * stride];
    assert_eq!(
        ctx.quantize_into(&config, &k, &v, Frame::Model, &mut strided, stride)
            .unwrap(),
        2
    );
    assert!(strided[..rb] == packed[..rb] && strided[stride..stride + rb] == packed[rb..]);
    assert!(strided[rb..stride]
        .iter()
        .chain(&strided[stride + rb..])
        .all(|&b| b == 0xa5));

    // dequantize from the strided records, into fp16, and in the cache frame
    let (k2, v2) = ctx.dequantize(&config, &packed).unwrap();
    let mut k16 = vec![F16::default(); n];
    ctx.dequantize_into(
        &config,
        &strided,
        stride,
        Frame::Model,
        Some(&mut k16),
        None,
    )
    .unwrap();
    let k16f: Vec<f32> = k16.iter().map(|h| h.to_f32()).collect();
    assert!(rel_rms(&k2, &k16f) < 1e-3);
    let mut v_rot = vec![0f32; n];
    ctx.dequantize_into(&config, &packed, rb, Frame::Cache, None, Some(&mut v_rot))
        .unwrap();
    let mut v_back = vec![0f32; n];
    ctx.rotate(64, &v_rot, &mut v_back).unwrap();
    assert!(rel_rms(&v2, &v_back) < 1e-5);
    ctx.rotate_in_place(64, &mut v_rot).unwrap();
    assert_eq!(v_rot, v_back);

    // quantizing cache-frame values (rotated, fp16) gives the same records as the model frame
    let mut k_rot = vec![F16::default(); n];
    let mut v_rot16 = vec![F16::default(); n];
    ctx.rotate(64, &k, &mut k_rot).unwrap();
    ctx.rotate(64, &v, &mut v_rot16).unwrap();
    let mut frame_records = vec![0u8; 2 * rb];
    ctx.quantize_into(
        &config,
        &k_rot,
        &v_rot16,
        Frame::Cache,
        &mut frame_records,
        rb,
    )
    .unwrap();
    assert!(frame_records == packed);
}

#[test]
fn codec_errors_are_statuses_not_panics() {
    let ctx = Context::cpu().unwrap();
    let config = Config::from_preset("k4v2_g64", 64).unwrap();
    let tile = 64 * 64;
    let mut rng = Rng::new(2);
    let k = rng.tensor(tile, 64);
    let st = |r: kvarn::Result<Vec<u8>>| r.unwrap_err().status();
    assert_eq!(
        st(ctx.quantize(&config, &k[..tile - 1], &k[..tile - 1])),
        Status::InvalidArgument
    );
    assert_eq!(
        st(ctx.quantize(&config, &k, &k[..tile / 2])),
        Status::InvalidArgument
    );
    let mut nan = k.clone();
    nan[17] = f32::INFINITY;
    assert_eq!(st(ctx.quantize(&config, &nan, &k)), Status::NonFinite);
    let huge: Vec<f32> = k.iter().map(|x| x * 1e6).collect();
    assert_eq!(st(ctx.quantize(&config, &k, &huge)), Status::Overflow);
    let bad = Config {
        head_dim: 100,
        ..config
    };
    let k100 = rng.tensor(100 * 64, 100);
    let e = ctx.quantize(&bad, &k100, &k100).unwrap_err();
    assert!(
        matches!(e.status(), Status::Unsupported | Status::InvalidArgument),
        "{e}"
    );
    let neg = Config {
        tile_tokens: -64,
        ..config
    };
    assert_eq!(st(ctx.quantize(&neg, &k, &k)), Status::InvalidArgument);

    let rb = config.record_bytes().unwrap();
    let mut small = vec![0u8; rb - 1];
    let e = ctx
        .quantize_into(&config, &k, &k, Frame::Model, &mut small, rb)
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    let mut out = vec![0u8; rb];
    assert_eq!(
        ctx.quantize_into(&config, &k, &k, Frame::Model, &mut out, rb - 2)
            .unwrap_err()
            .status(),
        Status::InvalidArgument
    );
    assert_eq!(
        ctx.dequantize(&config, &out[..rb - 1])
            .unwrap_err()
            .status(),
        Status::InvalidArgument
    );
    let mut k_out = vec![0f32; tile];
    let mut v_out = vec![0f32; 2 * tile];
    let e = ctx.dequantize_into(
        &config,
        &out,
        rb,
        Frame::Model,
        Some(&mut k_out),
        Some(&mut v_out),
    );
    assert_eq!(e.unwrap_err().status(), Status::InvalidArgument);
    let e = ctx.dequantize_into::<f32>(&config, &out, rb, Frame::Model, None, None);
    assert_eq!(e.unwrap_err().status(), Status::InvalidArgument);
    let mut y = vec![0f32; 10];
    assert_eq!(
        ctx.rotate(64, &k[..10], &mut y).unwrap_err().status(),
        Status::InvalidArgument
    );
    assert_eq!(
        ctx.rotate(0, &k[..64], &mut y).unwrap_err().status(),
        Status::InvalidArgument
    );
    let mut y = vec![0f32; 100];
    assert_eq!(
        ctx.rotate(100, &k[..100], &mut y).unwrap_err().status(),
        Status::Unsupported
    );
    assert_eq!(
        kvarn::baseline_roundtrip(Baseline::Fp8E4m3, 8, 64, &k[..64], &mut y[..63])
            .unwrap_err()
            .status(),
        Status::InvalidArgument
    );
}

#[test]
fn configs_presets_versions_backends() {
    assert_eq!(
        Config::default(),
        Config::from_preset("k4v2_g128", 128).unwrap()
    );
    assert_eq!(Config::default().record_bytes().unwrap(), 13_824);
    let names = kvarn::presets();
    for p in [
        "k4v2_g128",
        "k4v2_g64",
        "k4v4_g128",
        "k4v4_g64",
        "k2v2_g128",
        "k8v8_g128",
    ] {
        assert!(names.contains(&p), "{p} missing from {names:?}");
        Config::from_preset(p, 256).unwrap().validate().unwrap();
    }
    let e = Config::from_preset("k5v2_g128", 128).unwrap_err();
    assert_eq!(e.status(), Status::NotFound);
    assert!(e.to_string().starts_with("kvarn: "), "{e}");
    assert_eq!(
        Config::from_preset("k4v2\0", 128).unwrap_err().status(),
        Status::InvalidArgument
    );
    let e = Config::from_preset("k4v2_g128", 100).unwrap_err();
    assert!(matches!(
        e.status(),
        Status::Unsupported | Status::InvalidArgument
    ));
    let e = Config {
        iterations: 33,
        ..Config::default()
    }
    .validate()
    .unwrap_err();
    assert!(
        matches!(e.status(), Status::Unsupported | Status::InvalidArgument),
        "{e}"
    );

    assert_eq!(
        kvarn::version_number(),
        kvarn::VERSION_MAJOR * 10000 + kvarn::VERSION_MINOR * 100 + kvarn::VERSION_PATCH
    );
    assert_eq!(Status::CorruptData.code(), 10);
    assert_eq!(Status::Unknown(99).description(), "unknown status");
    assert!(!Status::NotFound.description().is_empty());
    assert!(!kvarn::cpu_features().unwrap().is_empty() || cfg!(not(target_arch = "x86_64")));
    assert_eq!(kvarn::Dtype::F16.size(), 2);
    assert_eq!(kvarn::Dtype::F32.size(), 4);

    let list = kvarn::backends().unwrap();
    assert!(list
        .iter()
        .any(|b| b.backend == Backend::Cpu && b.available));
    for b in &list {
        assert_eq!(b.name, b.backend.name());
        if !b.available {
            assert!(!b.reason.is_empty(), "{b:?}");
            let e = Context::new(b.backend).unwrap_err();
            assert_eq!(e.status(), Status::BackendUnavailable, "{e}");
        }
    }
    let ctx = Context::cpu().unwrap();
    assert_eq!(ctx.device().unwrap(), 0);
    assert_ne!(ctx.cpu_isa().unwrap(), kvarn::CpuIsa::None);
    assert!(!kvarn::CpuIsa::best().name().is_empty());
}

#[test]
fn f16_and_bf16_conversions_round_trip_every_value() {
    for bits in 0..=u16::MAX {
        let h = F16(bits);
        let x = h.to_f32();
        if x.is_nan() {
            assert!(F16::from_f32(x).to_f32().is_nan());
        } else {
            assert_eq!(F16::from_f32(x), h, "{bits:#06x}");
        }
        let b = Bf16(bits);
        let y = b.to_f32();
        if y.is_nan() {
            assert!(Bf16::from_f32(y).to_f32().is_nan());
        } else {
            assert_eq!(Bf16::from_f32(y), b, "{bits:#06x}");
        }
    }
    // rounding of random f32 values agrees with the library's rotate-to-fp16 (fp32 math, then
    // rounded to nearest even)
    let ctx = Context::cpu().unwrap();
    let mut rng = Rng::new(31);
    let x: Vec<f32> = (0..64 * 256)
        .map(|i| rng.normal() * [1e-6f32, 1e-3, 1.0, 3e3][i % 4])
        .collect();
    let mut y32 = vec![0f32; x.len()];
    let mut y16 = vec![F16::default(); x.len()];
    let mut yb = vec![Bf16::default(); x.len()];
    ctx.rotate(64, &x, &mut y32).unwrap();
    ctx.rotate(64, &x, &mut y16).unwrap();
    ctx.rotate(64, &x, &mut yb).unwrap();
    for i in 0..x.len() {
        assert_eq!(F16::from_f32(y32[i]), y16[i], "fp16 rounding of {}", y32[i]);
        assert_eq!(Bf16::from_f32(y32[i]), yb[i], "bf16 rounding of {}", y32[i]);
    }
}

#[test]
fn records_are_identical_with_the_isa_capped_to_scalar() {
    use kvarn::CpuIsa;
    let config = Config::from_preset("k4v2_g128", 128).unwrap();
    let mut rng = Rng::new(77);
    let k = rng.tensor(2 * 128 * 128, 128);
    let v = rng.tensor(2 * 128 * 128, 128);
    let best = CpuIsa::best();
    let fast = Context::cpu().unwrap();
    // process-wide cap for contexts created afterwards (other tests only get slower)
    CpuIsa::set_max(CpuIsa::Scalar).unwrap();
    let scalar = Context::cpu().unwrap();
    CpuIsa::set_max(best).unwrap();
    assert_eq!(scalar.cpu_isa().unwrap(), CpuIsa::Scalar);
    assert_eq!(fast.cpu_isa().unwrap(), best);
    let a = fast.quantize(&config, &k, &v).unwrap();
    let b = scalar.quantize(&config, &k, &v).unwrap();
    assert!(a == b, "records differ between {} and scalar", best.name());
}
