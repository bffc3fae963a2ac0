"""kvarn.selftest(): the checks of the kvarn-selftest CLI, through this package.

For every preset (head dim 128, or 64..512 with quick=False) on one context:
  format     record size and field offsets as docs/FORMAT.md section 7;
  roundtrip  quantize + dequantize of synthetic K/V with outlier channels: K error no worse than
             plain per-token RTN at the same bits, V error < 1, deterministic bytes, the padding
             between records untouched;
  paged      paged append + flush + attention (decode, split-K decode, extend) against a float64
             attention over the same stored cache (relative L2 <= 1e-3 on the CPU, 2e-3 on
             GPUs; log-sum-exp within 1e-3), flushed records equal to kvarn_quantize's;
  cache      the managed cache on the same tokens: attention within the same bound, export +
             import giving identical attention output, consistent statistics.
"""

from __future__ import annotations

import math
import time
from typing import Any, List, Optional, Sequence

import numpy as np

from . import _arrays as A
from ._cache import Cache
from ._core import ABLATE_NO_ROTATION, Config, Context, PagedKV, default_context, presets
from ._errors import Error, SelftestError

_NUM_KV_HEADS = 2
_NUM_Q_HEADS = 8  # GQA 4


def hadamard(d: int) -> np.ndarray:
    """The orthonormal rotation of order d (float64, docs/FORMAT.md section 3): the Sylvester
    Hadamard matrix for a power of two; for 80 and 96 the Kronecker product P_m (x) S_p of the
    symmetric Paley matrix P_m (m = 20, 12) and the Sylvester matrix S_p (p = 4, 8)."""
    m = {80: 20, 96: 12}.get(d, 1)
    h = np.ones((1, 1))
    while h.shape[0] < d // m:
        h = np.block([[h, h], [h, -h]])
    if m > 1:
        q = m - 1
        squares = {0} | {(r * r) % q for r in range(1, q)}
        p = np.array([[1.0 if (i + j - 2) % q in squares else -1.0 for j in range(m)]
                      for i in range(m)])
        p[0, :] = p[:, 0] = 1.0
        p[0, 0] = -1.0
        h = np.kron(p, h)
    return h / math.sqrt(d)


def synthetic_kv(rng: np.random.Generator, tokens: int, heads: int, d: int) -> Any:
    """K/V [tokens, heads, d] float32 shaped like a large model's: a few outlier channels in K
    (10-20x), per-token scale spread, a shifted mean."""
    k = rng.standard_normal((tokens, heads, d))
    outliers = rng.choice(d, size=max(2, d // 32), replace=False)
    k[:, :, outliers] *= rng.uniform(10, 20, size=outliers.size)
    k *= rng.uniform(0.5, 2.0, size=(tokens, 1, 1))
    k += 0.5
    v = rng.standard_normal((tokens, heads, d)) * rng.uniform(0.5, 1.5, size=(tokens, 1, 1))
    return k.astype(np.float32), v.astype(np.float32)


def rtn_per_token(x: np.ndarray, bits: int) -> np.ndarray:
    """Plain asymmetric min-max round to nearest, one scale per token (row)."""
    lo = x.min(axis=-1, keepdims=True)
    hi = x.max(axis=-1, keepdims=True)
    levels = (1 << bits) - 1
    scale = np.where(hi > lo, (hi - lo) / levels, 1.0)
    return np.clip(np.round((x - lo) / scale), 0, levels) * scale + lo


def _rel_mse(x: np.ndarray, y: np.ndarray) -> float:
    x = x.astype(np.float64)
    return float(np.sum((x - y) ** 2) / np.sum(x**2))


def _host(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, A.DeviceArray):
        return x.numpy()
    if hasattr(x, "cpu"):  # torch
        return x.cpu().numpy()
    return np.asarray(x)


def reference_attention(
    q: np.ndarray, k_rot: np.ndarray, v_rot: np.ndarray, config: Config, n_queries: int
) -> Any:
    """float64 attention for one sequence in the cache frame. q: [n, Hq, D] unrotated;
    k_rot/v_rot: [N, Hk, D] as stored (rotated unless ablated). Query i sees keys
    [0, N - n + i]. Returns (out [n, Hq, D] unrotated, lse [n, Hq])."""
    d = config.head_dim
    h = hadamard(d)
    k_rotated = not (config.key_flags & ABLATE_NO_ROTATION)
    v_rotated = not (config.value_flags & ABLATE_NO_ROTATION)
    q64 = q.astype(np.float64)
    if k_rotated:
        q64 = q64 @ h
    n_tokens, hk = k_rot.shape[0], k_rot.shape[1]
    hq = q.shape[1]
    group = hq // hk
    out = np.zeros((n_queries, hq, d))
    lse = np.zeros((n_queries, hq))
    for i in range(n_queries):
        visible = n_tokens - n_queries + i + 1
        for head in range(hq):
            kh = k_rot[:visible, head // group].astype(np.float64)
            vh = v_rot[:visible, head // group].astype(np.float64)
            s = kh @ q64[i, head] / math.sqrt(d)
            m = s.max()
            p = np.exp(s - m)
            out[i, head] = (p @ vh) / p.sum()
            lse[i, head] = m + math.log(p.sum())
    if v_rotated:
        out = out @ h
    return out, lse


def _rel_l2(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(x.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


class SelftestRow(dict):
    """One (preset, head_dim) row: measured figures, "failures" (list of str), "passed"."""

    @property
    def passed(self) -> bool:
        return not self["failures"]


class SelftestReport:
    """What :func:`selftest` measured: ``rows`` (one :class:`SelftestRow` per preset and head
    dim), ``passed``, ``failed`` and the context description."""

    def __init__(self, context: str, rows: List[SelftestRow]) -> None:
        self.context = context
        self.rows = rows

    @property
    def passed(self) -> int:
        return sum(1 for r in self.rows if r.passed)

    @property
    def failed(self) -> int:
        return len(self.rows) - self.passed

    def __bool__(self) -> bool:
        return self.failed == 0

    def __str__(self) -> str:
        lines = [
            f"kvarn selftest on {self.context}",
            f"{'preset':<11}{'D':>4}{'rec B':>7}{'K mse':>10}{'K rtn':>10}{'V mse':>10}"
            f"{'attn L2':>10}{'rec/s':>8}  result",
        ]
        for r in self.rows:

            def f(key: str, r: SelftestRow = r) -> str:
                value = r.get(key)
                return f"{value:10.3e}" if isinstance(value, float) else f"{'-':>10}"

            rate = r.get("quantize_records_per_s")
            lines.append(
                f"{r['preset']:<11}{r['head_dim']:>4}{r.get('record_bytes', 0):>7}"
                f"{f('k_rel_mse')}{f('k_rel_mse_rtn')}{f('v_rel_mse')}"
                f"{f('attention_rel_l2')}{(f'{rate:8.0f}' if rate else '       -')}  "
                f"{'ok' if r.passed else 'FAILED'}"
            )
            lines.extend(f"    {why}" for why in r["failures"])
        lines.append(f"{self.passed} passed, {self.failed} failed")
        return "\n".join(lines)


def _check_format(config: Config, row: SelftestRow) -> None:
    d, g, bk, bv = config.head_dim, config.tile_tokens, config.key_bits, config.value_bits
    sizes = [d * g * bk // 8, 2 * d, 2 * d, 2 * g, g * d * bv // 8, 2 * d, 2 * g, 2 * g]
    row["record_bytes"] = config.record_bytes
    if config.record_bytes != sum(sizes) or sum(sizes) != d * g * (bk + bv) // 8 + 6 * d + 6 * g:
        row["failures"].append(
            f"record_bytes {config.record_bytes}, docs/FORMAT.md section 7 gives {sum(sizes)}"
        )
    offset = 0
    for field, ((got_off, got_len), want) in enumerate(zip(config.record_layout().values(), sizes)):
        if (got_off, got_len) != (offset, want):
            row["failures"].append(
                f"record field {field}: offset {got_off}, {got_len} bytes; "
                f"expected {offset}, {want}"
            )
        offset += want


def _check_roundtrip(
    ctx: Context, config: Config, rng: np.random.Generator, quick: bool, row: SelftestRow
) -> None:
    g, d = config.tile_tokens, config.head_dim
    n_tiles = 4 if quick else 8
    k, v = synthetic_kv(rng, n_tiles * g, 1, d)
    k = k.reshape(n_tiles, g, d)
    v = v.reshape(n_tiles, g, d)
    rb = config.record_bytes
    stride = (rb + 15) // 16 * 16 + 16
    records = np.full((n_tiles, stride), 0xA5, np.uint8)
    again = records.copy()
    k_dev, v_dev = ctx.to_device(k), ctx.to_device(v)
    rec_dev, again_dev = ctx.to_device(records), ctx.to_device(again)
    start = time.perf_counter()
    ctx.quantize(k_dev, v_dev, config, out=rec_dev)
    ctx.synchronize()
    seconds = time.perf_counter() - start
    ctx.quantize(k_dev, v_dev, config, out=again_dev)
    records, again = _host(rec_dev), _host(again_dev)
    row["quantize_records_per_s"] = n_tiles / seconds if seconds > 0 else float("nan")
    if not np.array_equal(records, again):
        row["failures"].append("quantize is not deterministic (two calls gave different bytes)")
    if not np.all(records[:, rb:] == 0xA5):
        row["failures"].append("quantize wrote into the padding between records")
    k_out, v_out = ctx.dequantize(rec_dev, config)
    k_out, v_out = _host(k_out), _host(v_out)
    k16 = k.astype(np.float16).astype(np.float64)
    v16 = v.astype(np.float16).astype(np.float64)
    row["k_rel_mse"] = _rel_mse(k16, k_out)
    row["v_rel_mse"] = _rel_mse(v16, v_out)
    row["k_rel_mse_rtn"] = _rel_mse(k16, rtn_per_token(k16, config.key_bits))
    row["v_rel_mse_rtn"] = _rel_mse(v16, rtn_per_token(v16, config.value_bits))
    if not (math.isfinite(row["k_rel_mse"]) and row["k_rel_mse"] <= row["k_rel_mse_rtn"]):
        row["failures"].append(
            f"K relative MSE {row['k_rel_mse']:.3e} is not <= per-token "
            f"RTN's {row['k_rel_mse_rtn']:.3e}"
        )
    if not (math.isfinite(row["v_rel_mse"]) and row["v_rel_mse"] < 1.0):
        row["failures"].append(f"V relative MSE {row['v_rel_mse']:.3e} is not finite and < 1")


def _check_paged_and_cache(
    ctx: Context, config: Config, rng: np.random.Generator, row: SelftestRow
) -> None:
    g, d, sink = config.tile_tokens, config.head_dim, config.sink_tiles
    hk, hq = _NUM_KV_HEADS, _NUM_Q_HEADS
    tolerance = 2e-3 if ctx.is_gpu else 1e-3
    lens = [(sink + 2) * g + 5, sink * g + 3]
    kvs = [synthetic_kv(rng, n, hk, d) for n in lens]
    tiles = [-(-n // g) for n in lens]
    rec_tiles = [max(0, n // g - sink) for n in lens]
    max_blocks = max(tiles)
    # Every tile starts as a page; record tiles are flushed into blocks afterwards.
    table = np.zeros((2, max_blocks), np.int32)
    page = 0
    for b in range(2):
        for i in range(tiles[b]):
            table[b, i] = page
            page += 1
    num_pages, num_blocks = page, sum(rec_tiles)
    stride = config.record_bytes + (config.record_bytes & 1)
    records = ctx.to_device(np.zeros((num_blocks, hk, stride), np.uint8))
    # NaN-filled pages: a read beyond a sequence's length shows up as a non-finite result.
    k_pages = ctx.to_device(np.full((num_pages, hk, g, d), 0x7E7E, np.uint16), "f16")
    v_pages = ctx.to_device(np.full((num_pages, hk, g, d), 0x7E7E, np.uint16), "f16")
    zeros = np.zeros(2, np.int32)

    def state(seq_lens: Sequence[int], record_tiles: Sequence[int]) -> PagedKV:
        return PagedKV(
            records,
            k_pages,
            v_pages,
            ctx.to_device(table),
            ctx.to_device(np.asarray(seq_lens, np.int32)),
            ctx.to_device(np.asarray(record_tiles, np.int32)),
        )

    k_all = np.concatenate([kv[0] for kv in kvs])
    v_all = np.concatenate([kv[1] for kv in kvs])
    ctx.paged_append(
        config,
        state(zeros, zeros),
        [0, lens[0], lens[0] + lens[1]],
        ctx.to_device(k_all),
        ctx.to_device(v_all),
    )
    src, dst = [], []
    for b in range(2):
        for j in range(rec_tiles[b]):
            src.append(int(table[b, sink + j]))
            dst.append(len(dst))
    if src:
        ctx.paged_flush(config, state(lens, zeros), src, dst)
    pages_h = _host(k_pages).view(np.float16), _host(v_pages).view(np.float16)
    records_h = _host(records)
    # The flushed records equal the codec's records of the same cache-frame pages.
    same = True
    for s_page, block in zip(src, dst):
        expect = _host(
            ctx.quantize(
                ctx.to_device(pages_h[0][s_page]),
                ctx.to_device(pages_h[1][s_page]),
                config,
                cache_frame=True,
            )
        )
        same &= bool(np.array_equal(expect, records_h[block][:, : config.record_bytes]))
    row["flush_matches_quantize"] = same
    if not same:
        row["failures"].append("paged_flush records differ from quantize's on the same pages")
    # Point the record tiles at their blocks.
    block_of = dict(zip(src, dst))
    for b in range(2):
        for j in range(rec_tiles[b]):
            table[b, sink + j] = block_of[int(table[b, sink + j])]
    kv = state(lens, rec_tiles)
    # The stored cache, in the cache frame, per sequence.
    stored = []
    for b in range(2):
        kt, vt = [], []
        for i in range(tiles[b]):
            entry = int(table[b, i])
            if sink <= i < sink + rec_tiles[b]:
                kr, vr = ctx.dequantize(ctx.to_device(records_h[entry]), config, cache_frame=True)
                kt.append(_host(kr))
                vt.append(_host(vr))
            else:
                kt.append(pages_h[0][entry].astype(np.float64))
                vt.append(pages_h[1][entry].astype(np.float64))
        k_cat = np.concatenate(kt, axis=1).transpose(1, 0, 2)[: lens[b]]
        v_cat = np.concatenate(vt, axis=1).transpose(1, 0, 2)[: lens[b]]
        stored.append((k_cat, v_cat))
    worst, worst_lse = 0.0, 0.0
    q = rng.standard_normal((2, hq, d)).astype(np.float32)
    refs = [reference_attention(q[b : b + 1], *stored[b], config, 1) for b in range(2)]
    ref_out = np.concatenate([r[0] for r in refs])
    ref_lse = np.concatenate([r[1] for r in refs])
    for splits in (0, 3):
        out, lse = ctx.paged_attention(
            config, kv, ctx.to_device(q), num_splits=splits, return_lse=True
        )
        out, lse = _host(out), _host(lse)
        worst = max(worst, _rel_l2(out, ref_out))
        worst_lse = max(
            worst_lse, float(np.max(np.abs(lse - ref_lse) / np.maximum(1, np.abs(ref_lse))))
        )
    decode_out = out
    n_ext = [3, 2]
    qe = rng.standard_normal((sum(n_ext), hq, d)).astype(np.float32)
    out = _host(
        ctx.paged_attention(config, kv, ctx.to_device(qe), q_indptr=[0, n_ext[0], sum(n_ext)])
    )
    ref_e = np.concatenate(
        [
            reference_attention(qe[: n_ext[0]], *stored[0], config, n_ext[0])[0],
            reference_attention(qe[n_ext[0] :], *stored[1], config, n_ext[1])[0],
        ]
    )
    worst = max(worst, _rel_l2(out, ref_e))
    row["attention_rel_l2"] = worst
    row["lse_max_err"] = worst_lse
    if not worst <= tolerance:
        row["failures"].append(f"paged attention relative L2 {worst:.3e} > {tolerance:g}")
    if not worst_lse <= 1e-3:
        row["failures"].append(f"paged attention lse error {worst_lse:.3e} > 1e-3")

    # The managed cache on the same tokens of sequence 0, in two appends, on two layers (in the
    # context's memory: device arrays on a GPU context).
    with Cache(
        config, num_layers=2, num_kv_heads=hk, max_tokens=4 * lens[0], max_sequences=4, ctx=ctx
    ) as cache:
        cache.add_sequence(7)
        cut = g + 1
        k0, v0 = kvs[0]
        for layer in range(2):
            cache.append(7, layer, ctx.to_device(k0[:cut]), ctx.to_device(v0[:cut]))
            cache.append(7, layer, ctx.to_device(k0[cut:]), ctx.to_device(v0[cut:]))
        out_c = _host(cache.attention(1, [7], ctx.to_device(q[:1])))
        err = _rel_l2(out_c, ref_out[:1])
        row["cache_rel_l2"] = err
        if not err <= tolerance:
            row["failures"].append(f"managed cache attention relative L2 {err:.3e} > {tolerance:g}")
        # Same records and kernel as the paged call: equal up to the split plan's sum order.
        same = (
            _rel_l2(out_c, decode_out[:1]) <= 1e-3
            if ctx.is_gpu
            else np.allclose(out_c, decode_out[:1], rtol=1e-4, atol=1e-5)
        )
        if not same:
            row["failures"].append(
                "managed cache attention differs from paged attention on the same tokens"
            )
        blob = cache.export_sequence(7)
        cache.import_sequence(8, blob)
        both = _host(cache.attention(1, [7, 8], ctx.to_device(np.concatenate([q[:1], q[:1]]))))
        if not np.array_equal(both[0], both[1]):
            row["failures"].append("an imported sequence gives other attention than its source")
        stats = cache.stats()
        fp16 = stats.tokens * hk * d * 2 * 2
        if (
            stats.sequences != 2
            or stats.tokens != 2 * 2 * lens[0]
            or stats.records != 2 * 2 * hk * rec_tiles[0]
            or stats.fp16_bytes != fp16
            or not math.isclose(stats.compression_ratio, fp16 / stats.bytes_used, rel_tol=1e-9)
        ):
            row["failures"].append(f"cache statistics inconsistent: {stats}")


def selftest(
    ctx: Optional[Context] = None,
    *,
    quick: bool = True,
    preset_names: Optional[Sequence[str]] = None,
    head_dims: Optional[Sequence[int]] = None,
    seed: int = 0x6B7661726E2D7374,
    raise_on_failure: bool = True,
    verbose: bool = True,
) -> SelftestReport:
    """Runs the checks of ``kvarn-selftest`` on a context (default: the CPU) for every preset
    at head dim 128 (``quick=False``: 64, 128, 256 and 512; ``head_dims`` may also name 80 and
    96, which run on the CPU backend only). Returns the
    :class:`SelftestReport`; raises :class:`SelftestError` (carrying it) when a check fails,
    unless ``raise_on_failure=False``. Prints the report first (``verbose=False``: silent)."""
    ctx = ctx if ctx is not None else default_context()
    names = list(preset_names) if preset_names is not None else presets()
    dims = list(head_dims) if head_dims is not None else ([128] if quick else [64, 128, 256, 512])
    rows: List[SelftestRow] = []
    for name in names:
        for d in dims:
            row = SelftestRow(preset=name, head_dim=d, failures=[])
            rng = np.random.default_rng([seed, d, len(rows)])
            try:
                config = Config.from_preset(name, d)
                _check_format(config, row)
                _check_roundtrip(ctx, config, rng, quick, row)
                _check_paged_and_cache(ctx, config, rng, row)
            except Error as exc:
                row["failures"].append(f"{type(exc).__name__}: {exc}")
            rows.append(row)
    description = (
        f"{ctx.backend_name} (device {ctx.device}, ISA {ctx.cpu_isa_name}, "
        f"{ctx.num_threads} threads), libkvarn {ctx_version()}"
    )
    report = SelftestReport(description, rows)
    if verbose:
        print(report)
    if raise_on_failure and report.failed:
        failures = "; ".join(
            f"{r['preset']} D{r['head_dim']}: {', '.join(r['failures'])}"
            for r in rows
            if not r.passed
        )
        raise SelftestError(
            f"{report.failed} of {len(rows)} selftest rows failed: {failures}", report
        )
    return report


def ctx_version() -> str:
    from ._core import version

    return version()
