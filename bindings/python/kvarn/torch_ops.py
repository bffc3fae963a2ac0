"""torch custom ops over the capturable layer 2: ``torch.ops.kvarn.paged_append``,
``torch.ops.kvarn.paged_flush`` and ``torch.ops.kvarn.paged_attention``.

Importing this module imports torch and registers the ops (once; :func:`kvarn.register_torch_ops`
does the same and returns False without torch). They are ``torch.library.custom_op`` s with
``mutates_args`` naming what they write (the page pools, the record pool, out/lse, the status
array) and fake implementations, so ``torch.compile`` traces them as opaque calls and a
``torch.cuda.CUDAGraph`` captures them (on the current torch stream; the run calls never
synchronize or allocate).

Plans and contexts are not tensors: an op takes an int handle, :func:`kvarn.torch_handle` of an
:class:`kvarn.AttentionPlan` (attention; also append) or a :class:`kvarn.FlushPlan` (flush; also
append), made before tracing or capture. The plan's workspace is allocated once, with the plan,
and reused by every call. The page arrays of a :class:`kvarn.PagedKV` are passed as six tensors
(records, k_pages, v_pages, block_table, seq_lens, record_tiles); the helpers below take the
PagedKV.

    plan = kvarn.AttentionPlan(ctx, config, batch=B, num_kv_heads=Hk, max_blocks_per_seq=M,
                               num_q_heads=Hq, like=q)
    flush = kvarn.FlushPlan(ctx, config, num_kv_heads=Hk, max_tiles=B, like=q)
    kvarn.torch_ops.paged_append(flush, kv, token_indptr, slot_mapping, k, v, status)
    kvarn.torch_ops.paged_flush(flush, kv, n_flush, flush_src, flush_dst, flush_seq, status)
    kvarn.torch_ops.paged_attention(plan, kv, q, out, lse, status=status)

The one-pool memory model (kvarn_experimental.h, experimental) has two ops of its own:
``torch.ops.kvarn.paged_append_flush_tail`` (append and flush in one, under a
:class:`kvarn.TailFlushPlan`) and ``torch.ops.kvarn.paged_attention_tail``; the tail slots are a
tensor (``kvarn.TailState(..., like=t)`` or ``kvarn.TailState.over(ctx, config, tensor, ...)``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from . import _paged
from ._core import PagedKV

Tensor = torch.Tensor


def _kv(records: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor,
        seq_lens: Tensor, record_tiles: Tensor) -> PagedKV:
    return PagedKV(records, k_pages, v_pages, block_table, seq_lens, record_tiles)


def _define() -> None:
    if hasattr(torch.ops, "kvarn") and hasattr(torch.ops.kvarn, "paged_attention"):
        return  # registered already (a second import of the module, e.g. after a reload)

    @torch.library.custom_op(
        "kvarn::paged_append", mutates_args=("k_pages", "v_pages", "seq_status")
    )
    def paged_append_op(
        handle: int,
        records: Tensor,
        k_pages: Tensor,
        v_pages: Tensor,
        block_table: Tensor,
        seq_lens: Tensor,
        record_tiles: Tensor,
        token_indptr: Tensor,
        slot_mapping: Tensor,
        k: Tensor,
        v: Tensor,
        seq_status: Optional[Tensor],
    ) -> None:
        obj = _paged.from_handle(handle)
        _paged.paged_append_run(
            obj.ctx,
            obj.config,
            _kv(records, k_pages, v_pages, block_table, seq_lens, record_tiles),
            token_indptr,
            slot_mapping,
            k,
            v,
            seq_status=seq_status,
        )

    @paged_append_op.register_fake
    def _(handle, records, k_pages, v_pages, block_table, seq_lens, record_tiles,  # type: ignore
          token_indptr, slot_mapping, k, v, seq_status) -> None:
        return None

    @torch.library.custom_op("kvarn::paged_flush", mutates_args=("records", "seq_status"))
    def paged_flush_op(
        handle: int,
        records: Tensor,
        k_pages: Tensor,
        v_pages: Tensor,
        block_table: Tensor,
        seq_lens: Tensor,
        record_tiles: Tensor,
        n_tiles: Tensor,
        src_pages: Tensor,
        dst_blocks: Tensor,
        tile_seqs: Optional[Tensor],
        seq_status: Optional[Tensor],
    ) -> None:
        plan = _paged.from_handle(handle)
        if not isinstance(plan, _paged.FlushPlan):
            raise TypeError(f"kvarn::paged_flush: handle {handle} is not a kvarn.FlushPlan")
        plan.run(
            _kv(records, k_pages, v_pages, block_table, seq_lens, record_tiles),
            n_tiles,
            src_pages,
            dst_blocks,
            tile_seqs,
            seq_status=seq_status,
        )

    @paged_flush_op.register_fake
    def _(handle, records, k_pages, v_pages, block_table, seq_lens, record_tiles,  # type: ignore
          n_tiles, src_pages, dst_blocks, tile_seqs, seq_status) -> None:
        return None

    @torch.library.custom_op(
        "kvarn::paged_attention", mutates_args=("out", "lse", "seq_status")
    )
    def paged_attention_op(
        handle: int,
        records: Tensor,
        k_pages: Tensor,
        v_pages: Tensor,
        block_table: Tensor,
        seq_lens: Tensor,
        record_tiles: Tensor,
        q: Tensor,
        out: Tensor,
        lse: Optional[Tensor],
        q_indptr: Optional[Tensor],
        seq_status: Optional[Tensor],
    ) -> None:
        plan = _paged.from_handle(handle)
        if not isinstance(plan, _paged.AttentionPlan):
            raise TypeError(f"kvarn::paged_attention: handle {handle} is not a kvarn.AttentionPlan")
        plan.run(
            _kv(records, k_pages, v_pages, block_table, seq_lens, record_tiles),
            q,
            q_indptr=q_indptr,
            out=out,
            lse=lse,
            seq_status=seq_status,
        )

    @paged_attention_op.register_fake
    def _(handle, records, k_pages, v_pages, block_table, seq_lens, record_tiles,  # type: ignore
          q, out, lse, q_indptr, seq_status) -> None:
        return None

    # The one-pool memory model (kvarn_experimental.h's tail state): `states` is the layer's
    # tail slots (a TailState.over view is made of it each call), record_tiles is advanced in
    # place.
    @torch.library.custom_op(
        "kvarn::paged_append_flush_tail",
        mutates_args=("records", "record_tiles", "states", "seq_status"),
    )
    def paged_append_flush_tail_op(
        handle: int,
        records: Tensor,
        k_pages: Tensor,
        v_pages: Tensor,
        block_table: Tensor,
        seq_lens: Tensor,
        record_tiles: Tensor,
        states: Tensor,
        tail_slots: Tensor,
        max_step_tokens: int,
        row_bits: int,
        token_indptr: Tensor,
        k: Tensor,
        v: Tensor,
        committed: Tensor,
        seq_status: Optional[Tensor],
    ) -> None:
        plan = _paged.from_handle(handle)
        if not isinstance(plan, _paged.TailFlushPlan):
            raise TypeError(f"kvarn::paged_append_flush_tail: handle {handle} is not a "
                            "kvarn.TailFlushPlan")
        kv = _kv(records, k_pages, v_pages, block_table, seq_lens, record_tiles)
        tail = _paged.TailState.over(plan.ctx, plan.config, states, num_kv_heads=kv.num_kv_heads,
                                     max_step_tokens=max_step_tokens, row_bits=row_bits)
        plan.append_run(kv, tail, tail_slots, token_indptr, k, v, committed,
                        seq_status=seq_status)

    @paged_append_flush_tail_op.register_fake
    def _(handle, records, k_pages, v_pages, block_table, seq_lens, record_tiles,  # type: ignore
          states, tail_slots, max_step_tokens, row_bits, token_indptr, k, v, committed,
          seq_status) -> None:
        return None

    @torch.library.custom_op(
        "kvarn::paged_attention_tail", mutates_args=("out", "lse", "seq_status")
    )
    def paged_attention_tail_op(
        handle: int,
        records: Tensor,
        k_pages: Tensor,
        v_pages: Tensor,
        block_table: Tensor,
        seq_lens: Tensor,
        record_tiles: Tensor,
        states: Tensor,
        tail_slots: Tensor,
        max_step_tokens: int,
        row_bits: int,
        q: Tensor,
        out: Tensor,
        lse: Optional[Tensor],
        q_indptr: Optional[Tensor],
        seq_status: Optional[Tensor],
    ) -> None:
        plan = _paged.from_handle(handle)
        if not isinstance(plan, _paged.AttentionPlan):
            raise TypeError(f"kvarn::paged_attention_tail: handle {handle} is not a "
                            "kvarn.AttentionPlan")
        kv = _kv(records, k_pages, v_pages, block_table, seq_lens, record_tiles)
        tail = _paged.TailState.over(plan.ctx, plan.config, states, num_kv_heads=kv.num_kv_heads,
                                     max_step_tokens=max_step_tokens, row_bits=row_bits)
        plan.run(kv, q, q_indptr=q_indptr, out=out, lse=lse, seq_status=seq_status, tail=tail,
                 tail_slots=tail_slots)

    @paged_attention_tail_op.register_fake
    def _(handle, records, k_pages, v_pages, block_table, seq_lens, record_tiles,  # type: ignore
          states, tail_slots, max_step_tokens, row_bits, q, out, lse, q_indptr,
          seq_status) -> None:
        return None


_define()


def _pools(kv: PagedKV) -> tuple:
    return (kv.records, kv.k_pages, kv.v_pages, kv.block_table, kv.seq_lens, kv.record_tiles)


def _handle(obj: Any) -> int:
    if isinstance(obj, int):
        return obj
    handle = obj.__dict__.get("_torch_handle", 0)
    return handle if handle else _paged.torch_handle(obj)


def paged_append(
    plan: Any,
    kv: PagedKV,
    token_indptr: Tensor,
    slot_mapping: Tensor,
    k: Tensor,
    v: Tensor,
    seq_status: Optional[Tensor] = None,
) -> None:
    """``torch.ops.kvarn.paged_append`` with the context and config of `plan` (an
    AttentionPlan or FlushPlan, or its handle); see :func:`kvarn.paged_append_run`."""
    torch.ops.kvarn.paged_append(
        _handle(plan), *_pools(kv), token_indptr, slot_mapping, k, v, seq_status
    )


def paged_flush(
    plan: Any,
    kv: PagedKV,
    n_tiles: Tensor,
    src_pages: Tensor,
    dst_blocks: Tensor,
    tile_seqs: Optional[Tensor] = None,
    seq_status: Optional[Tensor] = None,
) -> None:
    """``torch.ops.kvarn.paged_flush`` under a FlushPlan (or its handle); see
    :meth:`kvarn.FlushPlan.run`."""
    torch.ops.kvarn.paged_flush(
        _handle(plan), *_pools(kv), n_tiles, src_pages, dst_blocks, tile_seqs, seq_status
    )


def paged_attention(
    plan: Any,
    kv: PagedKV,
    q: Tensor,
    out: Tensor,
    lse: Optional[Tensor] = None,
    *,
    q_indptr: Optional[Tensor] = None,
    seq_status: Optional[Tensor] = None,
) -> Tensor:
    """``torch.ops.kvarn.paged_attention`` under an AttentionPlan (or its handle), writing
    `out` (and `lse`); returns out. See :meth:`kvarn.AttentionPlan.run`."""
    torch.ops.kvarn.paged_attention(
        _handle(plan), *_pools(kv), q, out, lse, q_indptr, seq_status
    )
    return out


def _tail(tail: Any, tail_slots: Tensor) -> tuple:
    return (tail.states, tail_slots, tail.max_step_tokens, tail.row_bits)


def paged_append_flush_tail(
    plan: Any,
    kv: PagedKV,
    tail: Any,
    tail_slots: Tensor,
    token_indptr: Tensor,
    k: Tensor,
    v: Tensor,
    committed: Tensor,
    seq_status: Optional[Tensor] = None,
) -> None:
    """``torch.ops.kvarn.paged_append_flush_tail`` under a TailFlushPlan made with max_tokens
    (or its handle): the one-pool step's append and flush in one op, kv.record_tiles advanced in
    place; see :meth:`kvarn.TailFlushPlan.append_run`. `tail`: a :class:`kvarn.TailState` whose
    states are a tensor (``like=`` a tensor, or :meth:`kvarn.TailState.over`). Experimental."""
    torch.ops.kvarn.paged_append_flush_tail(
        _handle(plan), *_pools(kv), *_tail(tail, tail_slots), token_indptr, k, v, committed,
        seq_status
    )


def paged_attention_tail(
    plan: Any,
    kv: PagedKV,
    tail: Any,
    tail_slots: Tensor,
    q: Tensor,
    out: Tensor,
    lse: Optional[Tensor] = None,
    *,
    q_indptr: Optional[Tensor] = None,
    seq_status: Optional[Tensor] = None,
) -> Tensor:
    """``torch.ops.kvarn.paged_attention_tail``: attention over the records and the tail slots
    under an AttentionPlan (or its handle); returns out. Experimental."""
    torch.ops.kvarn.paged_attention_tail(
        _handle(plan), *_pools(kv), *_tail(tail, tail_slots), q, out, lse, q_indptr, seq_status
    )
    return out


__all__ = ["paged_append", "paged_append_flush_tail", "paged_attention", "paged_attention_tail",
           "paged_flush"]
