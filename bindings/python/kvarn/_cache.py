"""The managed cache (layer 3): ``kvarn_cache_t``."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import _arrays as A
from . import capi
from ._core import Config, Context, _Closable, _config, default_context
from ._errors import InvalidArgumentError


class CacheStats(NamedTuple):
    """``kvarn_cache_stats_t``: token counts are summed over sequences and layers."""

    sequences: int
    tokens: int
    committed_tokens: int
    records: int
    pages: int
    bytes_used: int
    bytes_capacity: int
    fp16_bytes: int
    compression_ratio: float


class Cache(_Closable):
    """A quantized KV cache that owns its pools on the context's device.

    Sequences are named by caller-chosen int ids. ``append`` adds K/V tokens to one layer
    ([n_tokens, Hk, D], unrotated, as the model produced them); tokens are committed at once
    unless ``speculative=True`` (then :meth:`commit` or :meth:`truncate` decides). A tile is
    quantized once, when all its G tokens are committed. ``attention`` runs decode (one query
    token per sequence) or extend (``q_indptr``) attention over everything appended. A failing
    call leaves the cache exactly as it was.
    """

    def __init__(
        self,
        config: Optional[Config] = None,
        *,
        num_layers: int = 1,
        num_kv_heads: int = 8,
        max_tokens: int = 65536,
        max_sequences: int = 256,
        ctx: Optional[Context] = None,
    ) -> None:
        self._token = 0
        self.ctx = ctx if ctx is not None else default_context()
        self.config = _config(config)
        options = capi.cache_options()
        capi.cache_options_defaults(options)
        options.config = self.config._c()
        options.num_layers = int(num_layers)
        options.num_kv_heads = int(num_kv_heads)
        options.max_tokens = int(max_tokens)
        options.max_sequences = int(max_sequences)
        with self.ctx._lock:
            handle = capi.cache_create(self.ctx._h(), options)
            self._token, self._finalizer = self.ctx._adopt(self, capi.cache_destroy, handle)
        self.num_layers = int(num_layers)
        self.num_kv_heads = int(num_kv_heads)
        self.max_tokens = int(max_tokens)
        self.max_sequences = int(max_sequences)

    # ---- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Frees the cache (also done when it is collected, or when its context is closed);
        safe from any thread, in any order with the context's close."""
        if "_finalizer" in self.__dict__:
            self._finalizer()

    @property
    def _handle(self) -> Any:
        """The native handle, or None once closed (for tests and the torch ops)."""
        with self.ctx._lock:
            return self.ctx._native.child(self._token)

    def _h(self) -> Any:
        """The native handle; call under the context's lock (a close waits for the call)."""
        handle = self.ctx._native.child(self._token)
        if handle is None:
            raise InvalidArgumentError("the cache is closed (or its context is)")
        return handle

    def __repr__(self) -> str:
        return (
            f"Cache({self.config.preset}, head_dim={self.config.head_dim}, "
            f"num_layers={self.num_layers}, num_kv_heads={self.num_kv_heads}, "
            f"max_tokens={self.max_tokens}, ctx={self.ctx!r})"
        )

    # ---- sequences ------------------------------------------------------------------------------

    def add_sequence(self, seq_id: int) -> None:
        """A new empty sequence (:class:`AlreadyExistsError` if the id is in use)."""
        with self.ctx._lock:
            capi.cache_add_sequence(self._h(), int(seq_id))

    def remove_sequence(self, seq_id: int) -> None:
        """Removes a sequence and frees what only it used."""
        with self.ctx._lock:
            capi.cache_remove_sequence(self._h(), int(seq_id))

    def fork(self, src_id: int, dst_id: int, n_tokens: int = -1) -> None:
        """New sequence dst_id holding the first n_tokens committed tokens of src_id (-1 = all);
        records of the shared prefix are shared."""
        with self.ctx._lock:
            capi.cache_fork(self._h(), int(src_id), int(dst_id), int(n_tokens))

    def truncate(self, seq_id: int, n_tokens: int) -> None:
        """Drops the tokens beyond n_tokens in every layer (a rejected draft leaves no trace)."""
        with self.ctx._lock:
            capi.cache_truncate(self._h(), int(seq_id), int(n_tokens))

    def commit(self, seq_id: int, n_tokens: int) -> None:
        """Commits the first n_tokens tokens in every layer; completed tiles are quantized."""
        with self.ctx._lock:
            capi.cache_commit(self._h(), int(seq_id), int(n_tokens))

    def sequence_length(self, seq_id: int, layer: int = 0) -> Tuple[int, int]:
        """(tokens, committed tokens) of one layer of a sequence."""
        with self.ctx._lock:
            tokens, committed = capi.cache_sequence_length(self._h(), int(seq_id), int(layer))
        return int(tokens), int(committed)

    # ---- data -----------------------------------------------------------------------------------

    def append(
        self,
        seq_id: int,
        layer: int,
        k: Any,
        v: Any,
        *,
        speculative: bool = False,
        dtype: Optional[str] = None,
    ) -> None:
        """Appends tokens to one layer. k, v: [n_tokens, Hk, D] of fp32/fp16/bf16 (raw uint16
        with dtype=), unrotated, in the context's memory."""
        ka = self.ctx._take(k, "k")
        va = self.ctx._take(v, "v")
        kind = A.float_kind(ka, "k", dtype)
        A.expect(ka, "k", (None, self.num_kv_heads, self.config.head_dim), [ka.kind])
        A.expect(va, "v", ka.shape, [ka.kind])
        flags = capi.APPEND_SPECULATIVE if speculative else capi.APPEND_DEFAULT
        with self.ctx._lock:
            capi.cache_append(
                self._h(),
                int(seq_id),
                int(layer),
                ka.shape[0],
                A.KIND_TO_CODE[kind],
                ka.address,
                va.address,
                flags,
            )

    def attention(
        self,
        layer: int,
        seq_ids: Sequence[int],
        q: Any,
        *,
        q_indptr: Optional[Sequence[int]] = None,
        scale: float = 0.0,
        dtype: Optional[str] = None,
        out_dtype: Optional[str] = None,
        num_splits: int = 0,
        sinks: Any = None,
        sliding_window: int = 0,
        logit_softcap: float = 0.0,
        mode: str = "causal",
        return_lse: bool = False,
        out: Any = None,
        lse: Any = None,
    ) -> Any:
        """Attention for one layer over the sequences seq_ids.

        Decode (q_indptr None): q [len(seq_ids), Hq, D], one query token per sequence. Extend:
        q [q_indptr[-1], Hq, D], query i of the n_b tokens of sequence b sees the keys up to
        position N_b - n_b + i (causal, aligned to the sequence end). Hq must be a multiple of
        Hk. Returns out [total, Hq, D] (dtype `out_dtype`, default q's), or (out, lse) with
        lse float32 [total, Hq]. sinks, sliding_window, logit_softcap and mode: the model
        variants, as for :meth:`Context.paged_attention`."""
        ids = A.host_ints(seq_ids, "seq_ids", "i64")
        params, qa, out, lse, _, extra = self.ctx._attention_args(
            self.config,
            q,
            len(ids),
            q_indptr,
            scale,
            dtype,
            out_dtype,
            num_splits,
            (sinks, sliding_window, logit_softcap, mode),
            return_lse,
            out,
            lse,
        )
        with self.ctx._lock:
            capi.cache_attention(
                self._h(), int(layer), len(ids), ids, params, qa.address, extra[0].address, extra[1]
            )
        return (out, lse) if return_lse else out

    def stats(self) -> CacheStats:
        """Tokens, records, pages, bytes used/reserved and the compression ratio."""
        with self.ctx._lock:
            s = capi.cache_get_stats(self._h())
        return CacheStats(
            int(s.sequences),
            int(s.tokens),
            int(s.committed_tokens),
            int(s.records),
            int(s.pages),
            int(s.bytes_used),
            int(s.bytes_capacity),
            int(s.fp16_bytes),
            float(s.compression_ratio),
        )

    def export_sequence(self, seq_id: int) -> bytes:
        """One sequence (all layers, committed and speculative) as a versioned, checksummed
        blob."""
        with self.ctx._lock:
            size = int(capi.cache_export_sequence(self._h(), int(seq_id), None, 0))
            buffer = bytearray(size)
            written = int(capi.cache_export_sequence(self._h(), int(seq_id), buffer, size))
        return bytes(buffer[:written])

    def import_sequence(self, seq_id: int, blob: Any) -> None:
        """Adds sequence seq_id from a blob of :meth:`export_sequence` (same config, layers and
        KV heads); a damaged or foreign blob raises :class:`CorruptDataError` and changes
        nothing."""
        view = np.frombuffer(memoryview(blob).cast("B"), dtype=np.uint8)
        with self.ctx._lock:
            capi.cache_import_sequence(self._h(), int(seq_id), view, view.nbytes)
