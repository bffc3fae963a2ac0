"""Layer 2 through the package: an engine-style paged cache (append -> flush -> attention) and
its agreement with the codec, the managed cache and a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import kvarn
from conftest import attention_reference, rel_l2

D = 128
HK = 2


def build(ctx, config, rng, lens):
    """Appends every sequence's tokens into fp16 pages, then flushes the record tiles."""
    g, sink = config.tile_tokens, config.sink_tiles
    tiles = [-(-n // g) for n in lens]
    rec_tiles = [max(0, n // g - sink) for n in lens]
    batch = len(lens)
    kv = kvarn.PagedKV.allocate(
        ctx,
        config,
        num_kv_heads=HK,
        num_record_blocks=sum(rec_tiles),
        num_pages=sum(tiles),
        batch=batch,
        max_blocks_per_seq=max(tiles),
    )
    page = 0
    for b in range(batch):
        for i in range(tiles[b]):
            kv.block_table[b, i] = page
            page += 1
    data = [
        (
            rng.standard_normal((n, HK, D)).astype(np.float32),
            rng.standard_normal((n, HK, D)).astype(np.float32),
        )
        for n in lens
    ]
    k = np.concatenate([d[0] for d in data])
    v = np.concatenate([d[1] for d in data])
    indptr = np.concatenate([[0], np.cumsum(lens)])
    ctx.paged_append(config, kv, indptr, k.astype(np.float16), v.astype(np.float16))
    kv.seq_lens[:] = lens
    src, dst = [], []
    for b in range(batch):
        for j in range(rec_tiles[b]):
            src.append(int(kv.block_table[b, sink + j]))
            dst.append(len(dst))
    pages_before = kv.k_pages.copy(), kv.v_pages.copy()
    ctx.paged_flush(config, kv, src, dst)
    table = kv.block_table.copy()
    for s, blk in zip(src, dst):
        kv.block_table[table == s] = blk
    for b in range(batch):
        kv.record_tiles[b] = rec_tiles[b]
    return kv, data, (src, dst), pages_before


def test_paged_append_flush_attention_agree_with_codec_and_reference(ctx, rng):
    config = kvarn.Config.from_preset("k4v2_g64", D)
    lens = [5 * 64 + 3, 64 + 10, 17]
    kv, data, (src, dst), pages = build(ctx, config, rng, lens)
    # Pages hold the rotated fp16 tokens; flushed blocks equal the codec's records.
    k0 = data[0][0].astype(np.float16)
    first_page = kv.k_pages[0].transpose(1, 0, 2)[:64]  # sequence 0, tile 0, [G, Hk, D]
    np.testing.assert_array_equal(first_page, ctx.rotate(k0[:64], out_dtype="f16"))
    for s, blk in zip(src, dst):
        np.testing.assert_array_equal(
            kv.records[blk][:, : config.record_bytes],
            ctx.quantize(pages[0][s], pages[1][s], config, cache_frame=True),
        )
    # Decode against float64 attention over the stored cache.
    hq = 8
    q = rng.standard_normal((3, hq, D)).astype(np.float32)
    out, lse = ctx.paged_attention(config, kv, q, return_lse=True)
    for b, n in enumerate(lens):
        k_cf = np.zeros((n, HK, D))
        v_cf = np.zeros((n, HK, D))
        for i in range(-(-n // 64)):
            entry = kv.block_table[b, i]
            if config.sink_tiles <= i < config.sink_tiles + kv.record_tiles[b]:
                kt, vt = ctx.dequantize(kv.records[entry], config, cache_frame=True)
            else:
                kt, vt = kv.k_pages[entry].astype(np.float64), kv.v_pages[entry].astype(np.float64)
            sl = slice(i * 64, min(n, (i + 1) * 64))
            k_cf[sl] = kt.transpose(1, 0, 2)[: sl.stop - sl.start]
            v_cf[sl] = vt.transpose(1, 0, 2)[: sl.stop - sl.start]
        ref, ref_lse = attention_reference(q[b : b + 1], k_cf, v_cf, 1, D)
        assert rel_l2(out[b : b + 1], ref) < 1e-3
        np.testing.assert_allclose(lse[b], ref_lse[0], rtol=1e-4, atol=1e-4)
    # The managed cache holding the same tokens gives the same attention.
    cache = kvarn.Cache(config, num_kv_heads=HK, max_tokens=2048, ctx=ctx)
    for b in range(3):
        cache.add_sequence(b)
        cache.append(b, 0, data[b][0].astype(np.float16), data[b][1].astype(np.float16))
    np.testing.assert_allclose(cache.attention(0, [0, 1, 2], q), out, rtol=1e-5, atol=1e-6)
    # Extend with preallocated outputs.
    qe = rng.standard_normal((4, hq, D)).astype(np.float16)
    oe = np.empty((4, hq, D), np.float32)
    lse_e = np.empty((4, hq), np.float32)
    res = ctx.paged_attention(
        config, kv, qe, q_indptr=[0, 2, 3, 4], out=oe, lse=lse_e, out_dtype="f32"
    )
    assert res is oe
    ref_e = cache.attention(0, [0, 1, 2], qe, q_indptr=[0, 2, 3, 4], out_dtype="f32")
    np.testing.assert_allclose(oe, ref_e, rtol=1e-5, atol=1e-6)


def test_paged_kv_shape_and_dtype_checks(ctx, rng):
    config = kvarn.Config.from_preset("k4v2_g64", D)
    kv, _, _, _ = build(ctx, config, rng, [100, 70])
    q = rng.standard_normal((2, 4, D)).astype(np.float32)
    bad = kvarn.PagedKV(
        kv.records,
        kv.k_pages.astype(np.float32),
        kv.v_pages,
        kv.block_table,
        kv.seq_lens,
        kv.record_tiles,
    )
    with pytest.raises(kvarn.DTypeError, match="k_pages"):
        ctx.paged_attention(config, bad, q)
    bad = kvarn.PagedKV(
        kv.records,
        kv.k_pages,
        kv.v_pages,
        kv.block_table,
        kv.seq_lens.astype(np.int64),
        kv.record_tiles,
    )
    with pytest.raises(kvarn.DTypeError, match="seq_lens"):
        ctx.paged_attention(config, bad, q)
    with pytest.raises(kvarn.ShapeError, match="q"):
        ctx.paged_attention(config, kv, q[:1])
    with pytest.raises(kvarn.ShapeError, match="q_indptr"):
        ctx.paged_attention(config, kv, q, q_indptr=[0, 2])
    with pytest.raises(kvarn.ShapeError, match="k_pages"):
        ctx.paged_attention(kvarn.Config.from_preset("k4v2_g128", D), kv, q)
    with pytest.raises(kvarn.ShapeError, match="dst_blocks"):
        ctx.paged_flush(config, kv, [0, 1], [0])
    # The library's own checks: a block table entry beyond the pool.
    kv.block_table[1, 0] = 999
    with pytest.raises(kvarn.InvalidArgumentError):
        ctx.paged_attention(config, kv, q)
