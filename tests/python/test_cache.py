"""The managed cache through the package: attention against a float64 reference over the
stored cache, speculative append/commit/truncate, fork, export/import, statistics, dtypes."""

from __future__ import annotations

import numpy as np
import pytest

import kvarn
from conftest import attention_reference, rel_l2

ml_dtypes = pytest.importorskip("ml_dtypes")

D = 128
HK = 2


def stored_cache(ctx, config, k, v, committed=None):
    """The cache frame of a sequence's tokens as the managed cache stores them: record tiles
    (complete, committed, past the sink) through the codec, everything else as rotated fp16."""
    g, sink = config.tile_tokens, config.sink_tiles
    n = k.shape[0]
    committed = n if committed is None else committed
    k_cf = ctx.rotate(k, out_dtype="f16").astype(np.float64)
    v_cf = ctx.rotate(v, out_dtype="f16").astype(np.float64)
    for tile in range(sink, committed // g):
        sl = slice(tile * g, (tile + 1) * g)
        kt = np.ascontiguousarray(k[sl].transpose(1, 0, 2))  # [Hk, G, D]
        vt = np.ascontiguousarray(v[sl].transpose(1, 0, 2))
        kd, vd = ctx.dequantize(ctx.quantize(kt, vt, config), config, cache_frame=True)
        k_cf[sl] = kd.transpose(1, 0, 2)
        v_cf[sl] = vd.transpose(1, 0, 2)
    return k_cf, v_cf


def tokens(rng, n):
    k = rng.standard_normal((n, HK, D))
    k[..., [3, 77]] *= 10
    return k.astype(np.float32), rng.standard_normal((n, HK, D)).astype(np.float32)


@pytest.mark.parametrize("num_q_heads", [2, 8, 14])
def test_decode_and_extend_match_float64_attention_over_the_stored_cache(ctx, rng, num_q_heads):
    config = kvarn.Config()
    lens = [3 * 128 + 17, 128 + 1, 40]
    cache = kvarn.Cache(config, num_layers=2, num_kv_heads=HK, max_tokens=4096, ctx=ctx)
    data = {}
    for seq, n in zip((10, 11, 12), lens):
        cache.add_sequence(seq)
        data[seq] = tokens(rng, n)
        cut = n // 3
        for layer in range(2):
            cache.append(seq, layer, data[seq][0][:cut], data[seq][1][:cut])
            cache.append(seq, layer, data[seq][0][cut:], data[seq][1][cut:])
    stored = {seq: stored_cache(ctx, config, *data[seq]) for seq in data}
    q = rng.standard_normal((3, num_q_heads, D)).astype(np.float32)
    out, lse = cache.attention(1, [10, 11, 12], q, return_lse=True)
    assert out.shape == q.shape and out.dtype == np.float32 and lse.shape == (3, num_q_heads)
    for b, seq in enumerate((10, 11, 12)):
        ref, ref_lse = attention_reference(q[b : b + 1], *stored[seq], 1, D)
        assert rel_l2(out[b : b + 1], ref) < 1e-3
        np.testing.assert_allclose(lse[b], ref_lse[0], rtol=1e-4, atol=1e-4)
    # Extend: 5 query tokens for sequence 10, 2 for 12 (causal, aligned to the end).
    qe = rng.standard_normal((7, num_q_heads, D)).astype(np.float32)
    oe = cache.attention(0, [10, 12], qe, q_indptr=[0, 5, 7])
    assert rel_l2(oe[:5], attention_reference(qe[:5], *stored[10], 5, D)[0]) < 1e-3
    assert rel_l2(oe[5:], attention_reference(qe[5:], *stored[12], 2, D)[0]) < 1e-3
    # Splits and output dtypes do not change the result beyond rounding.
    split = cache.attention(1, [10, 11, 12], q, num_splits=4)
    assert rel_l2(split, out) < 1e-5
    for out_dtype, np_dtype in (("f16", np.float16), ("bf16", ml_dtypes.bfloat16)):
        o = cache.attention(1, [10, 11, 12], q, out_dtype=out_dtype)
        assert o.dtype == np_dtype
        assert rel_l2(o.astype(np.float32), out) < 1e-2
    scaled = cache.attention(1, [10], q[:1], scale=0.5 / np.sqrt(D))
    assert rel_l2(scaled, out[:1]) > 1e-3


def test_input_dtypes_give_the_same_cache(ctx, rng):
    config = kvarn.Config.from_preset("k4v4_g64", D)
    k, v = tokens(rng, 200)
    k = k.astype(ml_dtypes.bfloat16).astype(np.float32)
    v = v.astype(ml_dtypes.bfloat16).astype(np.float32)
    cache = kvarn.Cache(config, num_kv_heads=HK, max_tokens=2048, ctx=ctx)
    variants = [
        (k, v, None),
        (k.astype(np.float16), v.astype(np.float16), None),
        (k.astype(ml_dtypes.bfloat16), v.astype(ml_dtypes.bfloat16), None),
        (
            k.astype(ml_dtypes.bfloat16).view(np.uint16),
            v.astype(ml_dtypes.bfloat16).view(np.uint16),
            "bf16",
        ),
    ]
    for seq, (kk, vv, dtype) in enumerate(variants):
        cache.add_sequence(seq)
        cache.append(seq, 0, kk, vv, dtype=dtype)
    blobs = {cache.export_sequence(seq) for seq in range(len(variants))}
    assert len(blobs) == 1
    q = rng.standard_normal((1, 4, D)).astype(np.float16)
    outs = [cache.attention(0, [seq], q) for seq in range(len(variants))]
    assert outs[0].dtype == np.float16
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_speculative_tokens_are_seen_then_committed_or_rolled_back(ctx, rng):
    config = kvarn.Config()
    cache = kvarn.Cache(config, num_layers=1, num_kv_heads=HK, max_tokens=2048, ctx=ctx)
    cache.add_sequence(5)
    k, v = tokens(rng, 300)
    cache.append(5, 0, k[:250], v[:250])
    q = rng.standard_normal((1, 4, D)).astype(np.float32)
    before = cache.attention(0, [5], q)
    stats_before = cache.stats()
    cache.append(5, 0, k[250:], v[250:], speculative=True)  # completes tile 1, uncommitted
    assert cache.sequence_length(5) == (300, 250)
    seen = cache.attention(0, [5], q)
    ref = attention_reference(q, *stored_cache(ctx, config, k, v, committed=250), 1, D)[0]
    assert rel_l2(seen, ref) < 1e-3
    assert cache.stats().records == stats_before.records  # nothing quantized yet
    cache.truncate(5, 250)  # a rejected draft leaves no trace
    assert cache.sequence_length(5) == (250, 250)
    np.testing.assert_array_equal(cache.attention(0, [5], q), before)
    assert cache.stats() == stats_before
    cache.append(5, 0, k[250:], v[250:], speculative=True)
    cache.commit(5, 290)
    assert cache.sequence_length(5) == (300, 290)
    assert cache.stats().records == stats_before.records + HK  # tile 1 quantized on commit
    committed = cache.attention(0, [5], q)
    ref = attention_reference(q, *stored_cache(ctx, config, k, v), 1, D)[0]
    assert rel_l2(committed, ref) < 1e-3


def test_fork_shares_records_and_export_import_round_trips(ctx, rng):
    config = kvarn.Config.from_preset("k4v2_g64", D)
    cache = kvarn.Cache(config, num_layers=2, num_kv_heads=HK, max_tokens=4096, ctx=ctx)
    cache.add_sequence(1)
    k, v = tokens(rng, 5 * 64 + 9)
    for layer in range(2):
        cache.append(1, layer, k, v)
    records = cache.stats().records
    assert records == 2 * HK * 4  # 5 complete tiles, one of them the sink
    cache.fork(1, 2, 3 * 64)
    stats = cache.stats()
    assert stats.records == records and stats.sequences == 2
    assert cache.sequence_length(2, 1) == (192, 192)
    q = rng.standard_normal((1, 4, D)).astype(np.float32)
    forked = cache.attention(1, [2], q)
    ref = attention_reference(q, *stored_cache(ctx, config, k[:192], v[:192]), 1, D)[0]
    assert rel_l2(forked, ref) < 1e-3
    with pytest.raises(kvarn.InvalidStateError):
        cache.fork(1, 3, 100)  # inside a record tile
    blob = cache.export_sequence(1)
    cache.import_sequence(7, blob)
    both = cache.attention(0, [1, 7], np.concatenate([q, q]))
    np.testing.assert_array_equal(both[0], both[1])
    assert cache.export_sequence(7) == blob
    cache.remove_sequence(1)
    assert cache.stats().sequences == 2
    with pytest.raises(kvarn.NotFoundError):
        cache.attention(0, [1], q)
    np.testing.assert_array_equal(cache.attention(0, [7], q)[0], both[0])


def test_stats_count_tokens_bytes_and_compression(ctx, rng):
    config = kvarn.Config()
    with kvarn.Cache(config, num_layers=3, num_kv_heads=HK, max_tokens=8192, ctx=ctx) as cache:
        empty = cache.stats()
        assert empty.sequences == 0 and empty.tokens == 0 and empty.compression_ratio == 0
        assert empty.bytes_capacity > 0
        cache.add_sequence(0)
        k, v = tokens(rng, 16 * 128)
        for layer in range(3):
            cache.append(0, layer, k, v)
        s = cache.stats()
        assert s.tokens == s.committed_tokens == 3 * 16 * 128
        assert s.records == 3 * HK * 15 and s.fp16_bytes == s.tokens * HK * D * 2 * 2
        assert s.compression_ratio == pytest.approx(s.fp16_bytes / s.bytes_used)
        assert 3.5 < s.compression_ratio < 4.74
        assert "k4v2_g128" in repr(cache)


@pytest.mark.parametrize(
    "variant",
    [
        {"sinks": True, "sliding_window": 128},  # gpt-oss
        {"sliding_window": 300, "logit_softcap": 5.0},  # Gemma 2, a softcap that bends scores
        {"mode": "prefix", "sinks": True, "sliding_window": 200},
    ],
)
def test_model_variants_match_float64_attention(ctx, rng, variant):
    config = kvarn.Config()
    hq = 8
    variant = dict(variant)
    if variant.get("sinks"):
        variant["sinks"] = (1.5 * rng.standard_normal(hq) + 1.0).astype(np.float32)
    cache = kvarn.Cache(config, num_layers=1, num_kv_heads=HK, max_tokens=4096, ctx=ctx)
    lens = {20: 5 * 128 + 3, 21: 200}
    stored = {}
    for seq, n in lens.items():
        cache.add_sequence(seq)
        k, v = tokens(rng, n)
        cache.append(seq, 0, k, v)
        stored[seq] = stored_cache(ctx, config, k, v)
    q = rng.standard_normal((9, hq, D)).astype(np.float32)
    out, lse = cache.attention(0, [20, 21], q, q_indptr=[0, 6, 9], return_lse=True, **variant)
    plain = cache.attention(0, [20, 21], q, q_indptr=[0, 6, 9], mode=variant.get("mode", "causal"))
    for seq, rows in ((20, slice(0, 6)), (21, slice(6, 9))):
        n = rows.stop - rows.start
        ref, ref_lse = attention_reference(q[rows], *stored[seq], n, D, **variant)
        assert rel_l2(out[rows], ref) < 1e-3
        np.testing.assert_allclose(lse[rows], ref_lse, rtol=1e-4, atol=1e-4)
    assert rel_l2(out, plain) > 1e-3  # the variant reached the kernel


def test_model_variant_arguments_are_checked(ctx, rng):
    cache = kvarn.Cache(kvarn.Config(), num_layers=1, num_kv_heads=HK, max_tokens=1024, ctx=ctx)
    cache.add_sequence(1)
    cache.append(1, 0, *tokens(rng, 50))
    q = rng.standard_normal((1, 4, D)).astype(np.float32)
    with pytest.raises(kvarn.InvalidArgumentError, match="mode"):
        cache.attention(0, [1], q, mode="bidirectional")
    with pytest.raises(kvarn.InvalidArgumentError, match="sliding_window"):
        cache.attention(0, [1], q, sliding_window=-1)
    with pytest.raises(kvarn.ShapeError, match="sinks"):
        cache.attention(0, [1], q, sinks=np.zeros(3, np.float32))
    with pytest.raises(kvarn.InvalidArgumentError, match="sinks"):
        cache.attention(0, [1], q, sinks=np.array([0, 0, np.nan, 0], np.float32))
