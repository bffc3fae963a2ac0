"""The capturable layer 2 (kvarn.h "plan / run over device-resident metadata").

What a scheduler fixes when it fixes a batch shape goes into a plan made once, outside any CUDA
graph capture (:class:`AttentionPlan`, :class:`FlushPlan`: they own the C plan and a workspace
allocated once); every per-step value (lengths, block tables, write slots, flush lists and their
count, the per-sequence status array) lives in the context's memory, so on a GPU context the run
calls read no host data, never synchronize and never allocate (unless asked to allocate an
output): they can be captured in a CUDA graph and replayed while the metadata changes.

Arrays: numpy arrays on CPU contexts, device tensors of the context's device on GPU contexts, as
everywhere in the package (see :mod:`kvarn._arrays`). On a GPU context the calls run on `stream`
when it is given, else on torch's current stream when an argument is a torch tensor, else on the
context's stream.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Sequence, Tuple

from . import _arrays as A
from . import capi
from ._core import Config, Context, PagedKV, _Closable, _config
from ._errors import DTypeError, InvalidArgumentError, ShapeError

# cudaStreamLegacy: names the legacy default stream where NULL would mean the context's stream.
_CUDA_STREAM_LEGACY = 1


def _streams(ctx: Context, stream: Optional[int], arrays: Sequence[Any]) -> Tuple[int, int]:
    """(the launch's stream, the DLPack stream to ask producers for the data on).

    CPU: (0, 0). GPU: `stream` if given; else torch's current stream of the first torch tensor
    among `arrays` (the data is then already ordered on it: DLPack -1, no synchronization);
    else 0, the context's stream."""
    if ctx._device[0] == A.DL_CPU:
        return 0, 0
    if stream is not None:
        s = int(stream)
        return s, (s if s else ctx.stream)
    for obj in arrays:
        if obj is not None and A._framework(obj) == "torch" and obj.device.type == "cuda":
            import torch  # noqa: PLC0415 - only when the caller passes torch tensors

            s = int(torch.cuda.current_stream(obj.device).cuda_stream)
            if s == 0 and ctx.stream and ctx._device[0] == A.DL_CUDA:
                s = _CUDA_STREAM_LEGACY  # torch's default stream, not the context's own
            return s, -1
    return 0, ctx.stream


def _take(ctx: Context, obj: Any, name: str, dl_stream: int, writable: bool = False,
          row_strided: bool = False) -> A.Array:
    return A.take(obj, name, ctx._device, dl_stream, writable, row_strided)


def _launch(stream: int, seq_status: int, workspace: int, workspace_bytes: int,
            **layout: int) -> Any:
    """A kvarn_launch_t; `layout`: q/k/v/out_row_stride (elements, 0 = dense) and index_type."""
    launch = capi.launch()
    capi.launch_defaults(launch)  # sets the size field
    launch.set_pointers(int(stream), int(seq_status), int(workspace))
    launch.workspace_bytes = int(workspace_bytes)
    for field, value in layout.items():
        setattr(launch, field, int(value))
    return launch


def _ints(ctx: Context, obj: Any, name: str, dl: int, shape: Sequence[Optional[int]],
          writable: bool = False, kinds: Sequence[str] = ("i32",)) -> A.Array:
    arr = _take(ctx, obj, name, dl, writable)
    A.expect(arr, name, shape, kinds)
    return arr


def _index_type(arrays: Sequence[Tuple[str, Optional[A.Array]]]) -> int:
    """The launch's index_type of slot or flush lists: int32 or int64, the same for all."""
    kinds = {arr.kind for _, arr in arrays if arr is not None}
    if len(kinds) > 1:
        raise DTypeError(
            ", ".join(name for name, _ in arrays) + ": int32 or int64, the same for all (got "
            + " and ".join(sorted(A.dtype_name(k) for k in kinds)) + ")"
        )
    return capi.INDEX_INT64 if kinds == {"i64"} else capi.INDEX_INT32


def _status(ctx: Context, seq_status: Any, batch: int, dl: int) -> Tuple[int, Any]:
    if seq_status is None:
        return 0, None
    arr = _ints(ctx, seq_status, "seq_status", dl, (batch,), writable=True)
    return arr.address, arr


def _workspace(ctx: Context, nbytes: int, like: Any) -> Tuple[Any, int]:
    """A workspace of nbytes (at least 1) in the context's memory, and its address."""
    ws = A.empty(ctx, like, (max(int(nbytes), 1),), "u8")
    return ws, _take(ctx, ws, "workspace", ctx.stream, writable=True).address


def _check_open(ctx: Context) -> Any:
    return ctx._h()


# ---- append ---------------------------------------------------------------------------------


def paged_append_run(
    ctx: Context,
    config: Config,
    kv: PagedKV,
    token_indptr: Any,
    slot_mapping: Any,
    k: Any,
    v: Any,
    *,
    seq_status: Any = None,
    dtype: Optional[str] = None,
    stream: Optional[int] = None,
) -> None:
    """Writes new tokens by slot (vLLM's slot_mapping) into the fp16 pages of `kv`
    (``kvarn_paged_append_run``): token t goes, rotated and rounded to fp16, to position
    slot_mapping[t] % G of page slot_mapping[t] // G; slot -1 skips the token (padding).

    token_indptr: int32 [batch+1] (sequence b owns tokens [token_indptr[b], token_indptr[b+1]));
    slot_mapping: int32 or int64 [max_tokens]; k, v: [max_tokens, Hk, D] float, whose rows
    (tokens) may be further apart than dense (views of a fused qkv projection: no copy);
    seq_status: int32 [batch] or None; all in the context's memory. Only the pools of `kv` are
    written: the engine owns seq_lens and the block table."""
    config = _config(config)
    _check_open(ctx)
    launch_stream, dl = _streams(ctx, stream, (k, kv.k_pages))
    c_kv, keep = kv._c(ctx, config, dl)
    ka = _take(ctx, k, "k", dl, row_strided=True)
    va = _take(ctx, v, "v", dl, row_strided=True)
    kind = A.float_kind(ka, "k", dtype)
    if len(ka.shape) != 3:
        raise ShapeError(f"k: shape {ka.shape}, expected (max_tokens, num_kv_heads, head_dim)")
    max_tokens = ka.shape[0]
    A.expect(ka, "k", (max_tokens, kv.num_kv_heads, config.head_dim), [ka.kind])
    A.expect(va, "v", ka.shape, [ka.kind])
    ti = _ints(ctx, token_indptr, "token_indptr", dl, (kv.batch + 1,))
    sm = _ints(ctx, slot_mapping, "slot_mapping", dl, (max_tokens,), kinds=("i32", "i64"))
    status_address, status_keep = _status(ctx, seq_status, kv.batch, dl)
    launch = _launch(launch_stream, status_address, 0, 0, k_row_stride=ka.row_stride,
                     v_row_stride=va.row_stride,
                     index_type=_index_type([("slot_mapping", sm)]))
    with ctx._lock:
        capi.paged_append_run(
            ctx._h(),
            config._c(),
            c_kv,
            launch,
            ti.address,
            sm.address,
            max_tokens,
            A.KIND_TO_CODE[kind],
            ka.address,
            va.address,
        )
    del keep, status_keep


# ---- flush ----------------------------------------------------------------------------------


class FlushPlan(_Closable):
    """The workspace of :meth:`run` (``kvarn_paged_flush_run``) for up to `max_tiles` flush
    entries of `num_kv_heads` heads, allocated once in the context's memory (`like`: a tensor
    whose framework allocates it, as for outputs; default numpy on the CPU, else a
    :class:`DeviceArray`)."""

    def __init__(
        self,
        ctx: Context,
        config: Config,
        *,
        num_kv_heads: int,
        max_tiles: int,
        like: Any = None,
    ) -> None:
        self._closed = True
        self.ctx = ctx
        self.config = _config(config)
        self.num_kv_heads = int(num_kv_heads)
        self.max_tiles = int(max_tiles)
        _check_open(ctx)
        self.workspace_bytes = int(
            capi.paged_flush_workspace_size(self.config._c(), self.num_kv_heads, self.max_tiles)
        )
        self.workspace, self._ws_address = _workspace(ctx, self.workspace_bytes, like)
        self._closed = False

    def run(
        self,
        kv: PagedKV,
        n_tiles: Any,
        src_pages: Any,
        dst_blocks: Any,
        tile_seqs: Any = None,
        *,
        seq_status: Any = None,
        stream: Optional[int] = None,
    ) -> None:
        """Quantizes the first n_tiles[0] entries of the device list: page src_pages[i] (all
        KV heads) -> record block dst_blocks[i]. n_tiles: int32 [1]; src_pages, dst_blocks,
        tile_seqs: int32 or int64 (the same for all) [max_tiles] (tile_seqs, the sequence of each
        entry or -1 for an entry of no sequence, e.g. a finished request's last tile, is
        required with seq_status); seq_status: int32 [batch] or None; all in the context's
        memory."""
        if self._closed:
            raise InvalidArgumentError("the FlushPlan is closed")
        ctx, config = self.ctx, self.config
        _check_open(ctx)
        launch_stream, dl = _streams(ctx, stream, (src_pages, kv.records))
        if kv.num_kv_heads != self.num_kv_heads:
            raise ShapeError(
                f"kv: {kv.num_kv_heads} KV heads, the FlushPlan was made for {self.num_kv_heads}"
            )
        c_kv, keep = kv._c(ctx, config, dl)
        m = self.max_tiles
        nt = _ints(ctx, n_tiles, "n_tiles", dl, (1,))
        wide = ("i32", "i64")
        src = _ints(ctx, src_pages, "src_pages", dl, (m,), kinds=wide)
        dst = _ints(ctx, dst_blocks, "dst_blocks", dl, (m,), kinds=wide)
        seqs = (_ints(ctx, tile_seqs, "tile_seqs", dl, (m,), kinds=wide)
                if tile_seqs is not None else None)
        if seq_status is not None and seqs is None:
            raise InvalidArgumentError("tile_seqs: required with seq_status")
        index_type = _index_type([("src_pages", src), ("dst_blocks", dst), ("tile_seqs", seqs)])
        status_address, status_keep = _status(ctx, seq_status, kv.batch, dl)
        launch = _launch(launch_stream, status_address, self._ws_address, self.workspace_bytes,
                         index_type=index_type)
        with ctx._lock:
            capi.paged_flush_run(
                ctx._h(),
                config._c(),
                c_kv,
                launch,
                m,
                nt.address,
                src.address,
                dst.address,
                seqs.address if seqs is not None else 0,
            )
        del keep, status_keep

    def close(self) -> None:
        """Drops the workspace (and the torch-op handle, if one was made)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        _forget_handle(self)
        self.workspace = None
        self._ws_address = 0

    def __repr__(self) -> str:
        return (
            f"FlushPlan(num_kv_heads={self.num_kv_heads}, max_tiles={self.max_tiles}, "
            f"workspace_bytes={self.workspace_bytes}{', closed' if self._closed else ''})"
        )


_flush_plans_lock = threading.Lock()


def paged_flush_run(
    ctx: Context,
    config: Config,
    kv: PagedKV,
    n_tiles: Any,
    src_pages: Any,
    dst_blocks: Any,
    tile_seqs: Any = None,
    *,
    seq_status: Any = None,
    stream: Optional[int] = None,
) -> None:
    """:meth:`FlushPlan.run` with a FlushPlan the context keeps for this (config, KV heads,
    max_tiles = len(src_pages)): its workspace is allocated on the first call and reused (make
    the first call, or a :class:`FlushPlan`, before a CUDA graph capture)."""
    config = _config(config)
    shape = tuple(getattr(src_pages, "shape", ()))
    if len(shape) != 1:
        raise ShapeError(f"src_pages: shape {shape}, expected (max_tiles,)")
    max_tiles = int(shape[0])
    key = (tuple(getattr(config, n) for n in config.__slots__), kv.num_kv_heads, max_tiles)
    with _flush_plans_lock:
        plans: Dict[Any, FlushPlan] = ctx.__dict__.setdefault("_kvarn_flush_plans", {})
        plan = plans.get(key)
        if plan is None:
            plan = FlushPlan(ctx, config, num_kv_heads=kv.num_kv_heads, max_tiles=max_tiles)
            plans[key] = plan
    plan.run(kv, n_tiles, src_pages, dst_blocks, tile_seqs, seq_status=seq_status, stream=stream)


# ---- attention ------------------------------------------------------------------------------


class AttentionPlan(_Closable):
    """An attention plan (``kvarn_attention_plan_t``) for every step of one batch shape, and its
    workspace (``kvarn_attention_plan_workspace_size`` bytes), allocated once in the context's
    memory (`like`: a tensor whose framework allocates it; default numpy on the CPU, else a
    :class:`DeviceArray`). Make it outside any CUDA graph capture.

    Decode (``max_q_per_seq=0``): one query row per sequence slot, q/out [batch, Hq, D].
    Extend: up to max_q_per_seq query tokens per sequence and max_total_q per step, q/out
    [max_total_q, Hq, D] with ``q_indptr`` (int32 [batch+1], context memory) at run time.
    sinks, sliding_window, logit_softcap and mode: the model variants, as for
    :meth:`Context.paged_attention`; the plan keeps `sinks` and reads its values at every run.
    The plan belongs to its context: closing the context closes the plan.
    """

    def __init__(
        self,
        ctx: Context,
        config: Config,
        *,
        batch: int,
        num_kv_heads: int,
        max_blocks_per_seq: int,
        num_q_heads: int,
        max_q_per_seq: int = 0,
        max_total_q: int = 0,
        scale: float = 0.0,
        q_dtype: Any = "f32",
        out_dtype: Any = None,
        num_splits: int = 0,
        sinks: Any = None,
        sliding_window: int = 0,
        logit_softcap: float = 0.0,
        mode: str = "causal",
        like: Any = None,
    ) -> None:
        self._token = 0
        self.ctx = ctx
        self.config = _config(config)
        self.batch = int(batch)
        self.num_kv_heads = int(num_kv_heads)
        self.max_blocks_per_seq = int(max_blocks_per_seq)
        self.num_q_heads = int(num_q_heads)
        self.max_q_per_seq = int(max_q_per_seq)
        self.max_total_q = int(max_total_q)
        self.q_dtype = A.parse_dtype(q_dtype)
        self.out_dtype = A.parse_dtype(out_dtype) if out_dtype is not None else self.q_dtype
        shape = capi.attention_shape()
        capi.attention_shape_defaults(shape)
        shape.batch = self.batch
        shape.num_kv_heads = self.num_kv_heads
        shape.max_blocks_per_seq = self.max_blocks_per_seq
        shape.max_q_per_seq = self.max_q_per_seq
        shape.max_total_q = self.max_total_q
        params = capi.attention_params()
        capi.attention_params_defaults(params)
        params.num_q_heads = self.num_q_heads
        params.scale = float(scale)
        params.q_dtype = A.KIND_TO_CODE[self.q_dtype]
        params.out_dtype = A.KIND_TO_CODE[self.out_dtype]
        params.num_splits = int(num_splits)
        # The plan keeps the sinks pointer and reads it at every run: the plan keeps the array.
        self._sinks = ctx._set_variant(
            params, self.num_q_heads, sinks, sliding_window, logit_softcap, mode
        )
        with ctx._lock:
            handle = capi.attention_plan_create(ctx._h(), self.config._c(), shape, params)
            self._token, self._finalizer = ctx._adopt(self, capi.attention_plan_destroy, handle)
            self.workspace_bytes = int(capi.attention_plan_workspace_size(handle))
            #: The kernel the plan runs: "cpu", "cuda-tensor-core-decode",
            #: "cuda-tensor-core-extend" or "cuda-general" (kvarn_attention_plan_kernel).
            self.kernel = str(capi.attention_plan_kernel(handle))
        self.workspace, self._ws_address = _workspace(ctx, self.workspace_bytes, like)

    @property
    def is_decode(self) -> bool:
        return self.max_q_per_seq == 0

    @property
    def rows(self) -> int:
        """Rows of q, out and lse: batch (decode) or max_total_q (extend)."""
        return self.batch if self.is_decode else self.max_total_q

    @property
    def _handle(self) -> Any:
        """The native handle, or None once closed (for tests and the torch ops)."""
        with self.ctx._lock:
            return self.ctx._native.child(self._token)

    def _h(self) -> Any:
        """The native handle; call under the context's lock (a close waits for the call)."""
        handle = self.ctx._native.child(self._token)
        if handle is None:
            raise InvalidArgumentError("the AttentionPlan is closed (or its context is)")
        return handle

    def run(
        self,
        kv: PagedKV,
        q: Any,
        *,
        q_indptr: Any = None,
        out: Any = None,
        lse: Any = None,
        return_lse: bool = False,
        seq_status: Any = None,
        stream: Optional[int] = None,
        tail: Optional["TailState"] = None,
        tail_slots: Any = None,
    ) -> Any:
        """Attention of one step (``kvarn_paged_attention_run``; with `tail` and `tail_slots`
        the experimental ``kvarn_paged_attention_tail_run``: tiles past record_tiles[b] are
        rows of slot tail_slots[b] of the :class:`TailState`). kv: batch, KV heads and block
        table stride equal to the plan's; seq_lens are the lengths after this step's append.
        q: [rows, Hq, D] of the plan's q_dtype, unrotated; returns out [rows, Hq, D] (allocated
        when not given) or (out, lse) with lse float32 [rows, Hq]. The rows (tokens) of q and out
        may be further apart than dense (a view of a fused qkv projection, of a larger output
        buffer): no copy is made. A padding slot
        (seq_lens[b] == 0) gets zero rows and lse -inf; extend rows past q_indptr[batch] are not
        written. seq_status: int32 [batch] or None."""
        ctx = self.ctx
        with ctx._lock:
            self._h()  # closed plans fail before any argument is converted
        _check_open(ctx)
        launch_stream, dl = _streams(ctx, stream, (q, out, kv.k_pages))
        c_kv, keep = kv._c(ctx, self.config, dl)
        rows, hq, d = self.rows, self.num_q_heads, self.config.head_dim
        qa = _take(ctx, q, "q", dl, row_strided=True)
        q_kinds = [self.q_dtype] + (["u16"] if self.q_dtype != "f32" else [])
        try:
            A.expect(qa, "q", (rows, hq, d), q_kinds)
        except DTypeError:
            raise DTypeError(
                f"q: dtype {A.dtype_name(qa.kind)}, the plan was made for "
                f"q_dtype={A.dtype_name(self.q_dtype)}"
            ) from None
        if out is None:
            out = A.empty(ctx, q, (rows, hq, d), self.out_dtype)
        oa = _take(ctx, out, "out", dl, writable=True, row_strided=True)
        A.expect(oa, "out", (rows, hq, d), [self.out_dtype] + (
            ["u16"] if self.out_dtype != "f32" else []))
        lse_address, la = 0, None
        if return_lse or lse is not None:
            if lse is None:
                lse = A.empty(ctx, q, (rows, hq), "f32")
            la = _take(ctx, lse, "lse", dl, writable=True)
            A.expect(la, "lse", (rows, hq), ["f32"])
            lse_address = la.address
        ia = None
        if self.is_decode:
            if q_indptr is not None:
                raise InvalidArgumentError("q_indptr: a decode plan takes none")
        else:
            if q_indptr is None:
                raise InvalidArgumentError("q_indptr: an extend plan needs int32 [batch+1]")
            ia = _ints(ctx, q_indptr, "q_indptr", dl, (self.batch + 1,))
        status_address, status_keep = _status(ctx, seq_status, self.batch, dl)
        launch = _launch(launch_stream, status_address, self._ws_address, self.workspace_bytes,
                         q_row_stride=qa.row_stride, out_row_stride=oa.row_stride)
        if (tail is None) != (tail_slots is None):
            raise InvalidArgumentError("tail and tail_slots: give both or neither")
        c_tail, tail_keep = (tail._c(ctx, self.batch, tail_slots, dl) if tail is not None
                             else (None, None))
        with ctx._lock:
            handle = self._h()  # under the context's lock (issue 28)
            if c_tail is None:
                capi.paged_attention_run(ctx._h(), handle, c_kv, launch,
                                         ia.address if ia is not None else 0, qa.address,
                                         oa.address, lse_address)
            else:
                capi.paged_attention_tail_run(ctx._h(), handle, c_kv, c_tail, launch,
                                              ia.address if ia is not None else 0, qa.address,
                                              oa.address, lse_address)
        del keep, status_keep, la, tail_keep
        return (out, lse) if return_lse else out

    def close(self) -> None:
        """Destroys the plan and drops its workspace (also done when it is collected, or when
        its context is closed); safe from any thread, in any order with the context's close."""
        if "_finalizer" not in self.__dict__:
            return
        self._finalizer()
        _forget_handle(self)
        self.workspace = None
        self._ws_address = 0

    def __repr__(self) -> str:
        kind = "decode" if self.is_decode else f"extend(max_q_per_seq={self.max_q_per_seq}, " \
            f"max_total_q={self.max_total_q})"
        with self.ctx._lock:
            state = "" if self.ctx._native.child(self._token) is not None else ", closed"
        return (
            f"AttentionPlan({kind}, batch={self.batch}, num_kv_heads={self.num_kv_heads}, "
            f"num_q_heads={self.num_q_heads}, max_blocks_per_seq={self.max_blocks_per_seq}, "
            f"workspace_bytes={self.workspace_bytes}{state})"
        )


def paged_attention_run(plan: AttentionPlan, kv: PagedKV, q: Any, **kwargs: Any) -> Any:
    """:meth:`AttentionPlan.run`."""
    if not isinstance(plan, AttentionPlan):
        raise InvalidArgumentError(f"plan: expected a kvarn.AttentionPlan, got {type(plan).__name__}")
    return plan.run(kv, q, **kwargs)


# ---- handles for the torch ops (kvarn.torch_ops) --------------------------------------------

_handles_lock = threading.Lock()
_handles: Dict[int, Any] = {}
_next_handle = [1]


def torch_handle(obj: Any) -> int:
    """The int handle naming an :class:`AttentionPlan`, :class:`FlushPlan` or
    :class:`TailFlushPlan` in the torch custom ops (``torch.ops.kvarn.*``): the same int for
    the object's lifetime; the registry holds the object until it is closed (a TailFlushPlan:
    until :func:`forget_torch_handle`)."""
    if not isinstance(obj, (AttentionPlan, FlushPlan, TailFlushPlan)):
        raise InvalidArgumentError(
            "expected a kvarn.AttentionPlan, FlushPlan or TailFlushPlan, got "
            f"{type(obj).__name__}"
        )
    if isinstance(obj, AttentionPlan):
        obj._h()
    elif isinstance(obj, FlushPlan) and obj._closed:
        raise InvalidArgumentError("the FlushPlan is closed")
    with _handles_lock:
        handle = obj.__dict__.get("_torch_handle", 0)
        if not handle:
            handle = _next_handle[0]
            _next_handle[0] += 1
            _handles[handle] = obj
            obj._torch_handle = handle
    return handle


def from_handle(handle: int) -> Any:
    with _handles_lock:
        obj = _handles.get(int(handle))
    if obj is None:
        raise InvalidArgumentError(f"kvarn handle {handle}: no open plan has it")
    return obj


def forget_torch_handle(obj: Any) -> None:
    """Drops obj's handle from the registry (the torch ops can no longer name it)."""
    _forget_handle(obj)


def _forget_handle(obj: Any) -> None:
    handle = obj.__dict__.pop("_torch_handle", 0)
    if handle:
        with _handles_lock:
            _handles.pop(handle, None)


def register_torch_ops() -> bool:
    """Registers the torch custom ops ``kvarn::paged_append``, ``kvarn::paged_flush`` and
    ``kvarn::paged_attention`` (and their fake implementations for torch.compile); returns
    False when torch cannot be imported. Idempotent; ``import kvarn.torch_ops`` does the same."""
    try:
        from . import torch_ops  # noqa: F401,PLC0415 - imports torch
    except ImportError:
        return False
    return True


# ---- the per-request tail state (kvarn_experimental.h: no stability promise) -----------------


def tail_state_bytes(config: Config, num_kv_heads: int, max_step_tokens: int = 1,
                     row_bits: int = 16) -> int:
    """Bytes of one request's tail slot (``kvarn_tail_state_bytes``): K and V of
    G - 1 + max_step_tokens tokens (rounded up to 8) per KV head, as fp16 rows (row_bits 16)
    or int8 rows with an fp16 scale each (row_bits 8). The config's sink_tiles must be 0.
    Experimental."""
    return int(capi.tail_state_bytes(_config(config)._c(), int(num_kv_heads),
                                     int(max_step_tokens), int(row_bits)))


class TailState:
    """`num_slots` tail slots of one layer (``kvarn_tail_state_t``), allocated in the context's
    memory (`like` as for the plans). A sequence's slot index comes with each call
    (`tail_slots`, int32 [batch] in the context's memory). Experimental: the one-pool memory
    model of docs/ENGINES.md, where every complete tile is a record block of the
    :class:`PagedKV` (whose page pools may be empty) and the tokens past them live in the slot.
    row_bits 16 (fp16 rows; CPU and CUDA) or 8 (int8 rows with an fp16 scale; CPU only)."""

    def __init__(
        self,
        ctx: Context,
        config: Config,
        *,
        num_kv_heads: int,
        num_slots: int,
        max_step_tokens: int = 1,
        row_bits: int = 16,
        like: Any = None,
    ) -> None:
        self.ctx = ctx
        self.config = _config(config)
        self.num_kv_heads = int(num_kv_heads)
        self.num_slots = int(num_slots)
        self.max_step_tokens = int(max_step_tokens)
        self.row_bits = int(row_bits)
        self.slot_bytes = tail_state_bytes(self.config, self.num_kv_heads, self.max_step_tokens,
                                           self.row_bits)
        self.states, self._address = _workspace(ctx, self.slot_bytes * self.num_slots, like)

    @classmethod
    def over(
        cls,
        ctx: Context,
        config: Config,
        states: Any,
        *,
        num_kv_heads: int,
        max_step_tokens: int = 1,
        row_bits: int = 16,
    ) -> "TailState":
        """A TailState over memory the caller owns (e.g. a tensor of an engine's pool): the
        slots are `states` (contiguous, in the context's memory) cut into slots of
        :func:`tail_state_bytes`; num_slots = its bytes // slot_bytes."""
        self = cls.__new__(cls)
        self.ctx = ctx
        self.config = _config(config)
        self.num_kv_heads = int(num_kv_heads)
        self.max_step_tokens = int(max_step_tokens)
        self.row_bits = int(row_bits)
        self.slot_bytes = tail_state_bytes(self.config, self.num_kv_heads, self.max_step_tokens,
                                           self.row_bits)
        arr = _take(ctx, states, "states", ctx.stream, writable=True)
        nbytes = int(getattr(states, "nbytes", 0))
        if nbytes < self.slot_bytes:
            raise ShapeError(f"states: {nbytes} bytes, less than one slot ({self.slot_bytes})")
        self.num_slots = nbytes // self.slot_bytes
        self.states, self._address = states, arr.address
        return self

    def _c(self, ctx: Context, batch: int, tail_slots: Any, dl: int) -> Tuple[Any, Any]:
        if ctx is not self.ctx:
            raise InvalidArgumentError("the TailState belongs to another context")
        slots = _ints(ctx, tail_slots, "tail_slots", dl, (batch,))
        t = capi.tail_state()
        capi.tail_state_defaults(t)
        t.set_pointers(self._address, slots.address)
        t.slot_bytes = self.slot_bytes
        t.max_step_tokens = self.max_step_tokens
        t.num_slots = self.num_slots
        t.row_bits = self.row_bits
        return t, slots

    def __repr__(self) -> str:
        return (
            f"TailState(num_kv_heads={self.num_kv_heads}, num_slots={self.num_slots}, "
            f"max_step_tokens={self.max_step_tokens}, row_bits={self.row_bits}, "
            f"slot_bytes={self.slot_bytes})"
        )


def paged_append_tail_run(
    ctx: Context,
    config: Config,
    kv: PagedKV,
    tail: TailState,
    tail_slots: Any,
    token_indptr: Any,
    k: Any,
    v: Any,
    *,
    seq_status: Any = None,
    dtype: Optional[str] = None,
    stream: Optional[int] = None,
) -> None:
    """Appends tokens into the tail slots (``kvarn_paged_append_tail_run``): token t of
    sequence b is at position kv.seq_lens[b] - (token_indptr[b+1] - t) (the lengths after this
    append) and goes to row position - kv.record_tiles[b] * G of slot tail_slots[b]; no slot
    mapping. k, v: [max_tokens, Hk, D] float (rows may be strided). Experimental."""
    config = _config(config)
    _check_open(ctx)
    launch_stream, dl = _streams(ctx, stream, (k,))
    c_kv, keep = kv._c(ctx, config, dl)
    c_tail, tail_keep = tail._c(ctx, kv.batch, tail_slots, dl)
    ka = _take(ctx, k, "k", dl, row_strided=True)
    va = _take(ctx, v, "v", dl, row_strided=True)
    kind = A.float_kind(ka, "k", dtype)
    if len(ka.shape) != 3:
        raise ShapeError(f"k: shape {ka.shape}, expected (max_tokens, num_kv_heads, head_dim)")
    A.expect(ka, "k", (ka.shape[0], kv.num_kv_heads, config.head_dim), [ka.kind])
    A.expect(va, "v", ka.shape, [ka.kind])
    ti = _ints(ctx, token_indptr, "token_indptr", dl, (kv.batch + 1,))
    status_address, status_keep = _status(ctx, seq_status, kv.batch, dl)
    launch = _launch(launch_stream, status_address, 0, 0, k_row_stride=ka.row_stride,
                     v_row_stride=va.row_stride)
    with ctx._lock:
        capi.paged_append_tail_run(ctx._h(), config._c(), c_kv, c_tail, launch, ti.address,
                                   ka.shape[0], A.KIND_TO_CODE[kind], ka.address, va.address)
    del keep, tail_keep, status_keep


class TailFlushPlan:
    """The workspace of :meth:`run` (``kvarn_paged_flush_tail_run``) for `batch` sequences,
    and with ``max_tokens`` > 0 of :meth:`append_run` (``kvarn_paged_append_flush_tail_run``)
    for up to that many appended tokens, allocated once in the context's memory. Experimental."""

    def __init__(
        self,
        ctx: Context,
        config: Config,
        *,
        num_kv_heads: int,
        batch: int,
        max_step_tokens: int = 1,
        max_tokens: int = 0,
        like: Any = None,
    ) -> None:
        self.ctx = ctx
        self.config = _config(config)
        self.num_kv_heads = int(num_kv_heads)
        self.batch = int(batch)
        self.max_step_tokens = int(max_step_tokens)
        self.max_tokens = int(max_tokens)
        if self.max_tokens < 0:
            raise InvalidArgumentError("max_tokens must be >= 0")
        self.workspace_bytes = int(capi.paged_flush_tail_workspace_size(
            self.config._c(), self.num_kv_heads, self.batch, self.max_step_tokens))
        if self.max_tokens > 0:
            self.workspace_bytes = max(self.workspace_bytes, int(
                capi.paged_append_flush_tail_workspace_size(
                    self.config._c(), self.num_kv_heads, self.batch, self.max_step_tokens,
                    self.max_tokens)))
        self.workspace, self._ws_address = _workspace(ctx, self.workspace_bytes, like)

    def run(
        self,
        kv: PagedKV,
        tail: TailState,
        tail_slots: Any,
        committed: Any,
        record_tiles_out: Any = None,
        *,
        seq_status: Any = None,
        stream: Optional[int] = None,
    ) -> None:
        """Quantizes every sequence's committed complete tiles (record_tiles[b] up to
        committed[b] // G) from its slot into the blocks kv.block_table names, moves the rest of
        the slot down and writes the new counts to record_tiles_out (int32 [batch]; default
        kv.record_tiles, in place). committed: int32 [batch], the committed lengths. No host
        flush list. Experimental."""
        ctx, config = self.ctx, self.config
        _check_open(ctx)
        self._check(kv, tail)
        launch_stream, dl = _streams(ctx, stream, (committed, kv.records))
        c_kv, keep = kv._c(ctx, config, dl)
        c_tail, tail_keep = tail._c(ctx, kv.batch, tail_slots, dl)
        ca = _ints(ctx, committed, "committed", dl, (kv.batch,))
        out = kv.record_tiles if record_tiles_out is None else record_tiles_out
        ra = _ints(ctx, out, "record_tiles_out", dl, (kv.batch,), writable=True)
        status_address, status_keep = _status(ctx, seq_status, kv.batch, dl)
        launch = _launch(launch_stream, status_address, self._ws_address, self.workspace_bytes)
        with ctx._lock:
            capi.paged_flush_tail_run(ctx._h(), config._c(), c_kv, c_tail, launch, ca.address,
                                      ra.address)
        del keep, tail_keep, status_keep

    def append_run(
        self,
        kv: PagedKV,
        tail: TailState,
        tail_slots: Any,
        token_indptr: Any,
        k: Any,
        v: Any,
        committed: Any,
        record_tiles_out: Any = None,
        *,
        seq_status: Any = None,
        dtype: Optional[str] = None,
        stream: Optional[int] = None,
    ) -> None:
        """:func:`paged_append_tail_run` then :meth:`run` in one call
        (``kvarn_paged_append_flush_tail_run``) whose tokens need not fit the slot: the tiles
        complete and committed after the append go from the slot and the input straight into
        their blocks, only the rows past them stay in the slot. A prefill chunk of any length
        (up to ``max_tokens``) then fits a decode-sized slot. Bit for bit the two calls with a
        slot large enough for the step. CPU only so far. Experimental."""
        ctx, config = self.ctx, self.config
        _check_open(ctx)
        self._check(kv, tail)
        launch_stream, dl = _streams(ctx, stream, (k, committed, kv.records))
        c_kv, keep = kv._c(ctx, config, dl)
        c_tail, tail_keep = tail._c(ctx, kv.batch, tail_slots, dl)
        ka = _take(ctx, k, "k", dl, row_strided=True)
        va = _take(ctx, v, "v", dl, row_strided=True)
        kind = A.float_kind(ka, "k", dtype)
        if len(ka.shape) != 3:
            raise ShapeError(f"k: shape {ka.shape}, expected (max_tokens, num_kv_heads, head_dim)")
        A.expect(ka, "k", (ka.shape[0], kv.num_kv_heads, config.head_dim), [ka.kind])
        A.expect(va, "v", ka.shape, [ka.kind])
        if ka.shape[0] > self.max_tokens:
            raise ShapeError(f"k: {ka.shape[0]} tokens, more than the TailFlushPlan's max_tokens "
                             f"{self.max_tokens}")
        ti = _ints(ctx, token_indptr, "token_indptr", dl, (kv.batch + 1,))
        ca = _ints(ctx, committed, "committed", dl, (kv.batch,))
        out = kv.record_tiles if record_tiles_out is None else record_tiles_out
        ra = _ints(ctx, out, "record_tiles_out", dl, (kv.batch,), writable=True)
        status_address, status_keep = _status(ctx, seq_status, kv.batch, dl)
        launch = _launch(launch_stream, status_address, self._ws_address, self.workspace_bytes,
                         k_row_stride=ka.row_stride, v_row_stride=va.row_stride)
        with ctx._lock:
            capi.paged_append_flush_tail_run(ctx._h(), config._c(), c_kv, c_tail, launch,
                                             ti.address, ka.shape[0], A.KIND_TO_CODE[kind],
                                             ka.address, va.address, ca.address, ra.address)
        del keep, tail_keep, status_keep

    def _check(self, kv: PagedKV, tail: TailState) -> None:
        if kv.batch != self.batch or kv.num_kv_heads != self.num_kv_heads:
            raise ShapeError(
                f"kv: batch {kv.batch}, {kv.num_kv_heads} KV heads; the TailFlushPlan was made "
                f"for batch {self.batch}, {self.num_kv_heads} KV heads"
            )
        if tail.max_step_tokens != self.max_step_tokens:
            raise InvalidArgumentError("tail: max_step_tokens differs from the TailFlushPlan's")

    def __repr__(self) -> str:
        return (
            f"TailFlushPlan(num_kv_heads={self.num_kv_heads}, batch={self.batch}, "
            f"max_step_tokens={self.max_step_tokens}, max_tokens={self.max_tokens}, "
            f"workspace_bytes={self.workspace_bytes})"
        )
