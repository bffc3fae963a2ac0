"""Contexts, configurations, the codec (layer 1) and paged attention (layer 2)."""

from __future__ import annotations

import enum
import math
import threading
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _arrays as A
from . import capi
from ._errors import InvalidArgumentError, ShapeError


class DType(enum.IntEnum):
    """``kvarn_dtype_t``."""

    F32 = capi.DTYPE_F32
    F16 = capi.DTYPE_F16
    BF16 = capi.DTYPE_BF16


class Backend(enum.IntEnum):
    """``kvarn_backend_t``."""

    AUTO = capi.BACKEND_AUTO
    CPU = capi.BACKEND_CPU
    CUDA = capi.BACKEND_CUDA
    ROCM = capi.BACKEND_ROCM


class CpuIsa(enum.IntEnum):
    """``kvarn_cpu_isa_t``."""

    SCALAR = capi.CPU_ISA_SCALAR
    AVX2 = capi.CPU_ISA_AVX2
    AVX512 = capi.CPU_ISA_AVX512
    NEON = capi.CPU_ISA_NEON
    NONE = capi.CPU_ISA_NONE


class RecordField(enum.IntEnum):
    """``kvarn_record_field_t``: record fields in storage order (docs/FORMAT.md section 7)."""

    K_CODES = capi.FIELD_K_CODES
    K_SCALE = capi.FIELD_K_SCALE
    K_ZERO = capi.FIELD_K_ZERO
    K_TOKEN_SCALE = capi.FIELD_K_TOKEN_SCALE
    V_CODES = capi.FIELD_V_CODES
    V_CHANNEL_SCALE = capi.FIELD_V_CHANNEL_SCALE
    V_SCALE = capi.FIELD_V_SCALE
    V_ZERO = capi.FIELD_V_ZERO


# Experimental (kvarn/kvarn_experimental.h: no stability promise, may change in any release):
# the values of Config.key_flags / value_flags; 0 is their only stable value.
ABLATE_NONE: int = capi.ABLATE_NONE
ABLATE_NO_ROTATION: int = capi.ABLATE_NO_ROTATION
ABLATE_NO_NORMALIZATION: int = capi.ABLATE_NO_NORMALIZATION

# kvarn_attention_params_t.mode by name.
_ATTENTION_MODES = {"causal": capi.ATTENTION_CAUSAL, "prefix": capi.ATTENTION_PREFIX}

_BACKEND_DEVICE_TYPE = {Backend.CPU: A.DL_CPU, Backend.CUDA: A.DL_CUDA, Backend.ROCM: A.DL_ROCM}


def _enum_value(enum_cls: Any, value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return enum_cls[value.upper()]
        except KeyError:
            names = ", ".join(m.name.lower() for m in enum_cls)
            raise InvalidArgumentError(
                f"unknown {what} {value!r} (expected one of {names})"
            ) from None
    try:
        return enum_cls(value)
    except ValueError:
        raise InvalidArgumentError(f"unknown {what} {value!r}") from None


# ---- library-wide queries -----------------------------------------------------------------------


def version() -> str:
    """The loaded library's version, "MAJOR.MINOR.PATCH" (``kvarn_version_string``)."""
    return capi.version_string()


def version_info() -> Tuple[int, int, int]:
    """(major, minor, patch) of the loaded library."""
    number = capi.version_number()
    return (number // 10000, number // 100 % 100, number % 100)


def abi_version() -> int:
    """The ABI major of the loaded library (the SONAME's number)."""
    return capi.abi_version()


class BackendInfo(NamedTuple):
    """One backend libkvarn knows (``kvarn_backend_info_t``)."""

    backend: Backend
    name: str
    available: bool
    device_count: int
    reason: str


def backends() -> List[BackendInfo]:
    """Every backend libkvarn knows, built or not, and why an unavailable one is unavailable."""
    out = []
    for index in range(capi.backend_count()):
        info = capi.backend_get_info(index)
        out.append(
            BackendInfo(
                Backend(info.backend),
                info.name,
                bool(info.available),
                int(info.device_count),
                info.reason,
            )
        )
    return out


def cpu_features() -> List[str]:
    """The CPU features libkvarn detected ("sse4.2", "avx2", "avx512f", ...)."""
    return capi.cpu_features().split()


def cpu_isa_best() -> CpuIsa:
    """The best ISA this CPU supports that libkvarn was built with."""
    return CpuIsa(capi.cpu_isa_best())


def set_max_cpu_isa(isa: Union[CpuIsa, str, int]) -> None:
    """Caps the ISA of CPU contexts created afterwards (process-wide)."""
    capi.set_max_cpu_isa(int(_enum_value(CpuIsa, isa, "CPU ISA")))


def presets() -> List[str]:
    """The named presets ("k4v2_g128", ...)."""
    return [capi.preset_name(i) for i in range(capi.preset_count())]


# ---- configurations -----------------------------------------------------------------------------

_CONFIG_FIELDS = (
    "head_dim",
    "tile_tokens",
    "key_bits",
    "value_bits",
    "iterations",
    "sink_tiles",
    "key_flags",
    "value_flags",
)


class Config:
    """A quantization configuration (``kvarn_config_t``).

    ``Config()`` is the library's default (preset k4v2_g128, D 128, 8 Sinkhorn passes, one sink
    tile); keyword arguments override fields. ``Config.from_preset("k4v4_g64", head_dim=64)``
    starts from a preset. Configurations are validated by the library when used, or explicitly
    with :meth:`validate`.
    """

    __slots__ = _CONFIG_FIELDS

    def __init__(self, **fields: int) -> None:
        c = capi.config()
        capi.config_defaults(c)
        self._load(c)
        self._override(fields)

    @classmethod
    def from_preset(cls, preset: str, head_dim: int = 128, **fields: int) -> "Config":
        """A preset ("k<b>v<b>_g<G>", see :func:`presets`) at a head dim; unknown names raise
        :class:`NotFoundError`."""
        c = capi.config()
        capi.config_defaults(c)
        capi.config_from_preset(str(preset), int(head_dim), c)
        self = cls.__new__(cls)
        self._load(c)
        self._override(fields)
        return self

    def _load(self, c: Any) -> None:
        for name in _CONFIG_FIELDS:
            object.__setattr__(self, name, int(getattr(c, name)))

    def _override(self, fields: Dict[str, int]) -> None:
        for name, value in fields.items():
            if name not in _CONFIG_FIELDS:
                raise TypeError(f"Config has no field {name!r}")
            setattr(self, name, int(value))

    def _c(self) -> Any:
        c = capi.config()
        capi.config_defaults(c)  # sets the size field
        for name in _CONFIG_FIELDS:
            value = getattr(self, name)
            if not (-(2**31) <= value < 2**32):
                raise InvalidArgumentError(f"Config.{name} = {value} does not fit 32 bits")
            setattr(c, name, value)
        return c

    def replace(self, **fields: int) -> "Config":
        """A copy with some fields changed."""
        out = Config.__new__(Config)
        for name in _CONFIG_FIELDS:
            object.__setattr__(out, name, getattr(self, name))
        out._override(fields)
        return out

    def validate(self) -> "Config":
        """Raises :class:`UnsupportedError`/:class:`InvalidArgumentError` unless every field is
        supported; returns self."""
        capi.config_validate(self._c())
        return self

    @property
    def preset(self) -> str:
        """The preset-style name "k<bK>v<bV>_g<G>" of the bit widths and tile size."""
        return f"k{self.key_bits}v{self.value_bits}_g{self.tile_tokens}"

    @property
    def record_bytes(self) -> int:
        """Bytes of one record: D*G*(bK+bV)/8 + 6D + 6G."""
        return int(capi.record_bytes(self._c()))

    def record_field(self, field: Union[RecordField, str, int]) -> Tuple[int, int]:
        """(byte offset, length) of one field inside a record."""
        value = _enum_value(RecordField, field, "record field")
        offset, nbytes = capi.record_field(self._c(), int(value))
        return int(offset), int(nbytes)

    def record_layout(self) -> Dict[str, Tuple[int, int]]:
        """Every field's (offset, length), in storage order."""
        return {f.name.lower(): self.record_field(f) for f in RecordField}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in _CONFIG_FIELDS)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in _CONFIG_FIELDS))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)}" for n in _CONFIG_FIELDS)
        return f"Config({inner})"


def _config(config: Optional[Config]) -> Config:
    if config is None:
        return Config()
    if isinstance(config, str):
        return Config.from_preset(config)
    if not isinstance(config, Config):
        raise InvalidArgumentError(f"expected a kvarn.Config, got {type(config).__name__}")
    return config


# ---- contexts -----------------------------------------------------------------------------------


class _Native:
    """The native handles of one context: its own and those of the caches, plans and device
    arrays made on it, each with the call that frees it.

    Python objects point here, never the reverse, and each frees its handle through a
    ``weakref.finalize`` (which outlives the garbage collector's clearing of weak references),
    so whatever order objects are closed or collected in (reference cycles, interpreter exit,
    closes from other threads), every handle is freed exactly once and dependents always before
    their context. The lock serializes calls on the context with the frees: a handle is never
    freed under a running call.
    """

    def __init__(self, handle: Any) -> None:
        self.lock = threading.RLock()
        self.handle = handle
        self._children: Dict[int, Tuple[Callable[[Any], None], Any]] = {}
        self._next = 0

    def adopt(self, free: Callable[[Any], None], handle: Any) -> int:
        """Takes a dependent's handle; returns its token. Call under the lock, context open."""
        self._next += 1
        self._children[self._next] = (free, handle)
        return self._next

    def child(self, token: int) -> Any:
        """The dependent's handle, or None once it or the context is closed. Under the lock."""
        entry = self._children.get(token)
        return entry[1] if entry is not None else None

    def release(self, token: int) -> None:
        """Frees one dependent's handle (no-op if already freed, by it or by the context)."""
        with self.lock:
            entry = self._children.pop(token, None)
            if entry is not None:
                entry[0](entry[1])

    def close(self) -> None:
        """Frees every dependent's handle (newest first), then the context's."""
        with self.lock:
            while self._children:
                _, (free, handle) = self._children.popitem()
                free(handle)
            handle, self.handle = self.handle, None
            if handle is not None:
                capi.context_destroy(handle)


class _Closable:
    """`with` support for the handle-owning classes; each defines close(). Collection frees
    their handles through a finalizer (_Native), never __del__."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Context(_Closable):
    """A backend, device, stream and CPU thread count (``kvarn_context_t``).

    ``Context()`` picks a GPU when one is present, else the CPU; ``Context("cpu")`` or
    ``Context("cuda", device=1, stream=torch.cuda.current_stream().cuda_stream)`` ask for one
    explicitly (an unavailable backend raises :class:`BackendUnavailableError`, never a silent
    fallback). Array arguments must live in the context's memory: host arrays for a CPU context,
    device tensors of `device` for a CUDA context. Calls on one context are serialized by a lock
    (the C API allows one call at a time per context); the GIL is released while they run.
    """

    def __init__(
        self,
        backend: Union[Backend, str, int] = Backend.AUTO,
        device: int = 0,
        stream: Optional[int] = None,
        num_threads: int = 0,
    ) -> None:
        options = capi.context_options()
        capi.context_options_defaults(options)
        options.backend = int(_enum_value(Backend, backend, "backend"))
        options.device = int(device)
        options.stream = int(stream or 0)
        options.num_threads = int(num_threads)
        self._native = _Native(capi.context_create(options))
        self._lock = self._native.lock
        self._finalizer = weakref.finalize(self, self._native.close)
        self.stream = int(stream or 0)
        self.backend = Backend(capi.context_get_backend(self._handle))
        self.cpu_isa = CpuIsa(capi.context_get_cpu_isa(self._handle))
        self.device = int(capi.context_get_device(self._handle))
        self.num_threads = int(capi.context_get_num_threads(self._handle))
        self._device = (_BACKEND_DEVICE_TYPE[self.backend], self.device)

    @property
    def backend_name(self) -> str:
        """ "cpu", "cuda" or "rocm"."""
        return capi.backend_name(int(self.backend))

    @property
    def cpu_isa_name(self) -> str:
        """ "scalar", "avx2", "avx512", "neon", or "none" for a GPU context."""
        return capi.cpu_isa_name(int(self.cpu_isa))

    @property
    def is_gpu(self) -> bool:
        return self.backend in (Backend.CUDA, Backend.ROCM)

    def __dlpack_device__(self) -> Tuple[int, int]:
        """The DLPack (device_type, device_id) of the context's memory."""
        return self._device

    @property
    def _handle(self) -> Any:
        return self._native.handle

    def close(self) -> None:
        """Destroys the context (also done when it is collected), after closing the caches and
        plans and freeing the device arrays made on it (they refuse calls afterwards). Safe in
        any order with their own closes, from any thread."""
        if "_finalizer" in self.__dict__:
            self._finalizer()

    def _adopt(
        self, owner: Any, free: Callable[[Any], None], handle: Any
    ) -> Tuple[int, "weakref.finalize"]:
        """Registers a dependent's native handle (call under the lock): its token for
        _native.child, and the finalizer that frees it when `owner` is closed or collected
        (unless the context frees it first)."""
        token = self._native.adopt(free, handle)
        return token, weakref.finalize(owner, self._native.release, token)

    def __repr__(self) -> str:
        state = "" if self._handle is not None else ", closed"
        return (
            f"Context(backend={self.backend_name!r}, device={self.device}, "
            f"cpu_isa={self.cpu_isa_name!r}, num_threads={self.num_threads}{state})"
        )

    def _h(self) -> Any:
        if self._handle is None:
            raise InvalidArgumentError("the context is closed")
        return self._handle

    def _take(self, obj: Any, name: str, writable: bool = False) -> A.Array:
        return A.take(obj, name, self._device, self.stream, writable)

    def synchronize(self) -> None:
        """Waits for the work queued on the context's stream (a no-op on the CPU)."""
        with self._lock:
            capi.context_synchronize(self._h())

    @property
    def error_word_address(self) -> int:
        """Address of the context's error word (``kvarn_context_error_word``): an int32 in the
        context's memory holding the status of the first data error a kernel found since it was
        last reported (0 if none), readable without synchronizing (e.g. ``torch`` or CuPy over
        the address, copied to pinned memory on the engine's stream). :meth:`synchronize`
        reports that error and clears the word. Always 0 on the CPU."""
        with self._lock:
            return int(capi.context_error_word(self._h()))

    def empty(self, shape: Sequence[int], dtype: Any) -> Any:
        """An uninitialized array in the context's memory (numpy on the CPU, else DeviceArray)."""
        kind = dtype if dtype in ("u8", "i32", "i64") else A.parse_dtype(dtype)
        return A.empty(self, None, shape, kind)

    def to_device(self, array: np.ndarray, dtype: Optional[str] = None) -> Any:
        """A host array as an array in the context's memory (the array itself on the CPU)."""
        if self._device[0] == A.DL_CPU:
            return np.ascontiguousarray(array)
        return A.DeviceArray.from_numpy(self, array, dtype)

    # ---- layer 1: codec -------------------------------------------------------------------------

    def rotate(
        self,
        x: Any,
        *,
        dtype: Optional[str] = None,
        out_dtype: Optional[str] = None,
        out: Any = None,
    ) -> Any:
        """x @ H for rows of head_dim channels (the orthonormal Hadamard matrix of docs/FORMAT.md
        section 3, its own inverse). x: [..., D] of fp32/fp16/bf16, D in {64, 80, 96, 128, 256,
        512} (80 and 96: CPU contexts only). Returns an array of
        the same shape in `out_dtype` (default: x's dtype); `out` may be x itself."""
        xa = self._take(x, "x")
        in_kind = A.float_kind(xa, "x", dtype)
        if len(xa.shape) < 1:
            raise ShapeError("x: expected an array of shape [..., head_dim]")
        head_dim = xa.shape[-1]
        n_rows = math.prod(xa.shape[:-1])
        out_kind = A.parse_dtype(out_dtype) if out_dtype is not None else in_kind
        if out is None:
            out = A.empty(self, x, xa.shape, out_kind)
        oa = self._take(out, "out", writable=True)
        A.expect(oa, "out", xa.shape, [out_kind, "u16"] if out_kind != "f32" else ["f32"])
        with self._lock:
            capi.rotate(
                self._h(),
                int(head_dim),
                int(n_rows),
                A.KIND_TO_CODE[in_kind],
                xa.address,
                A.KIND_TO_CODE[out_kind],
                oa.address,
            )
        return out

    def quantize(
        self,
        k: Any,
        v: Any,
        config: Optional[Config] = None,
        *,
        dtype: Optional[str] = None,
        cache_frame: bool = False,
        record_stride: Optional[int] = None,
        out: Any = None,
    ) -> Any:
        """Quantizes (K, V) tile pairs into records.

        k, v: [n_tiles, G, D] of one float dtype (fp32, fp16, bf16; raw uint16 with
        ``dtype="f16"``/``"bf16"``), unrotated unless `cache_frame`. Returns uint8
        [n_tiles, record_stride] (default stride: ``config.record_bytes``); with `out`, bytes
        between a record's end and the stride are left untouched."""
        config = _config(config)
        g, d = config.tile_tokens, config.head_dim
        ka = self._take(k, "k")
        va = self._take(v, "v")
        kind = A.float_kind(ka, "k", dtype)
        A.expect(ka, "k", (None, g, d), [ka.kind])
        A.expect(va, "v", ka.shape, [ka.kind])
        n_tiles = ka.shape[0]
        record_bytes = config.record_bytes
        if out is None:
            stride = record_bytes if record_stride is None else int(record_stride)
            out = A.empty(self, k, (n_tiles, stride), "u8")
        ra = self._take(out, "out", writable=True)
        stride = ra.shape[1] if len(ra.shape) == 2 else 0
        A.expect(ra, "out", (n_tiles, stride), ["u8"])
        if record_stride is not None and stride != record_stride:
            raise ShapeError(f"out: stride {stride}, record_stride={record_stride}")
        if stride < record_bytes:
            raise ShapeError(f"out: record stride {stride} < record_bytes {record_bytes}")
        flags = capi.CODEC_CACHE_FRAME if cache_frame else capi.CODEC_DEFAULT
        with self._lock:
            capi.quantize(
                self._h(),
                config._c(),
                n_tiles,
                A.KIND_TO_CODE[kind],
                ka.address,
                va.address,
                flags,
                ra.address,
                stride,
            )
        return out

    def dequantize(
        self,
        records: Any,
        config: Optional[Config] = None,
        *,
        out_dtype: str = "f32",
        cache_frame: bool = False,
        keys: bool = True,
        values: bool = True,
        k_out: Any = None,
        v_out: Any = None,
    ) -> Tuple[Any, Any]:
        """Reconstructs tiles from records: returns (k, v), each [n_tiles, G, D] of `out_dtype`
        (un-rotated unless `cache_frame`); a tensor not asked for (keys/values False) is None.
        records: uint8 [n_tiles, record_stride], record_stride >= config.record_bytes."""
        config = _config(config)
        g, d = config.tile_tokens, config.head_dim
        ra = self._take(records, "records")
        if len(ra.shape) != 2:
            raise ShapeError(f"records: shape {ra.shape}, expected (n_tiles, record_stride)")
        A.expect(ra, "records", (None, None), ["u8"])
        n_tiles, stride = ra.shape
        if stride < config.record_bytes:
            raise ShapeError(f"records: stride {stride} < record_bytes {config.record_bytes}")
        kind = A.parse_dtype(out_dtype)
        outs = []
        for name, wanted, given in (("k_out", keys, k_out), ("v_out", values, v_out)):
            if not wanted and given is None:
                outs.append((None, 0))
                continue
            arr = given if given is not None else A.empty(self, records, (n_tiles, g, d), kind)
            aa = self._take(arr, name, writable=True)
            A.expect(aa, name, (n_tiles, g, d), [kind, "u16"] if kind != "f32" else ["f32"])
            outs.append((arr, aa.address))
        flags = capi.CODEC_CACHE_FRAME if cache_frame else capi.CODEC_DEFAULT
        with self._lock:
            capi.dequantize(
                self._h(),
                config._c(),
                n_tiles,
                ra.address,
                stride,
                flags,
                A.KIND_TO_CODE[kind],
                outs[0][1],
                outs[1][1],
            )
        return outs[0][0], outs[1][0]

    # ---- layer 2: paged attention ---------------------------------------------------------------

    def paged_append(
        self,
        config: Config,
        kv: "PagedKV",
        token_indptr: Sequence[int],
        k: Any,
        v: Any,
        *,
        dtype: Optional[str] = None,
    ) -> None:
        """Writes new tokens into the fp16 pages at positions seq_lens[b], ... (rotated per the
        config). token_indptr: [batch+1] (host); k, v: [token_indptr[-1], Hk, D]. The engine
        (the caller) then advances kv.seq_lens."""
        config = _config(config)
        c_kv, keep = kv._c(self, config)
        indptr = A.host_ints(token_indptr, "token_indptr", "i32", kv.batch + 1)
        n = int(indptr[-1])
        ka = self._take(k, "k")
        va = self._take(v, "v")
        kind = A.float_kind(ka, "k", dtype)
        A.expect(ka, "k", (n, kv.num_kv_heads, config.head_dim), [ka.kind])
        A.expect(va, "v", ka.shape, [ka.kind])
        with self._lock:
            capi.paged_append(
                self._h(), config._c(), c_kv, indptr, A.KIND_TO_CODE[kind], ka.address, va.address
            )
        del keep

    def paged_flush(
        self, config: Config, kv: "PagedKV", src_pages: Sequence[int], dst_blocks: Sequence[int]
    ) -> None:
        """Quantizes complete fp16 pages src_pages[i] (all KV heads) into record blocks
        dst_blocks[i]. The engine then updates its block table and record_tiles."""
        config = _config(config)
        c_kv, keep = kv._c(self, config)
        src = A.host_ints(src_pages, "src_pages", "i32")
        dst = A.host_ints(dst_blocks, "dst_blocks", "i32", src.shape[0])
        with self._lock:
            capi.paged_flush(self._h(), config._c(), c_kv, src.shape[0], src, dst)
        del keep

    def paged_attention(
        self,
        config: Config,
        kv: "PagedKV",
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
        """Attention of queries over the paged cache (decode when q_indptr is None, else
        extend). q: [total_q_tokens, Hq, D], unrotated; returns out [total_q_tokens, Hq, D]
        (dtype `out_dtype`, default q's), or (out, lse) with lse float32 [total_q_tokens, Hq].
        Model variants (docs/API.md): `sinks` float32 [Hq] learned sink logits in the context's
        memory, `sliding_window` W (the W most recent keys; 0 = full), `logit_softcap` c (0 =
        off), `mode` "causal" or "prefix" (queries follow the cache)."""
        config = _config(config)
        c_kv, keep = kv._c(self, config)
        variant = (sinks, sliding_window, logit_softcap, mode)
        params, q_arr, out, lse, total, extra = self._attention_args(
            config, q, kv.batch, q_indptr, scale, dtype, out_dtype, num_splits, variant,
            return_lse, out, lse
        )
        with self._lock:
            ws_bytes = capi.paged_attention_workspace_size(
                self._h(), config._c(), c_kv, params, total
            )
            workspace = A.empty(self, q, (max(int(ws_bytes), 1),), "u8") if ws_bytes else None
            wa = self._take(workspace, "workspace", writable=True) if ws_bytes else None
            capi.paged_attention(
                self._h(),
                config._c(),
                c_kv,
                params,
                q_arr.address,
                extra[0].address,
                extra[1],
                wa.address if wa else 0,
                int(ws_bytes),
            )
        del keep, workspace
        return (out, lse) if return_lse else out

    def _attention_args(
        self,
        config: Config,
        q: Any,
        batch: int,
        q_indptr: Optional[Sequence[int]],
        scale: float,
        dtype: Optional[str],
        out_dtype: Optional[str],
        num_splits: int,
        variant: Tuple[Any, int, float, str],
        return_lse: bool,
        out: Any,
        lse: Any,
    ) -> Any:
        qa = self._take(q, "q")
        q_kind = A.float_kind(qa, "q", dtype)
        if len(qa.shape) != 3:
            raise ShapeError(
                f"q: shape {qa.shape}, expected (total_q_tokens, num_q_heads, head_dim)"
            )
        indptr = None
        if q_indptr is None:
            total = batch
        else:
            indptr = A.host_ints(q_indptr, "q_indptr", "i32", batch + 1)
            total = int(indptr[-1])
        hq = qa.shape[1]
        A.expect(qa, "q", (total, hq, config.head_dim), [qa.kind])
        o_kind = A.parse_dtype(out_dtype) if out_dtype is not None else q_kind
        if out is None:
            out = A.empty(self, q, qa.shape, o_kind)
        oa = self._take(out, "out", writable=True)
        A.expect(oa, "out", qa.shape, [o_kind, "u16"] if o_kind != "f32" else ["f32"])
        lse_address = 0
        if return_lse or lse is not None:
            if lse is None:
                lse = A.empty(self, q, (total, hq), "f32")
            la = self._take(lse, "lse", writable=True)
            A.expect(la, "lse", (total, hq), ["f32"])
            lse_address = la.address
        params = capi.attention_params()
        capi.attention_params_defaults(params)
        params.num_q_heads = int(hq)
        params.scale = float(scale)
        params.q_dtype = A.KIND_TO_CODE[q_kind]
        params.out_dtype = A.KIND_TO_CODE[o_kind]
        params.num_splits = int(num_splits)
        params.set_q_indptr(indptr.__array_interface__["data"][0] if indptr is not None else 0)
        sinks = self._set_variant(params, int(hq), *variant)
        # The struct points into indptr and sinks: the caller keeps them alive during the call.
        return params, qa, out, lse, total, (oa, lse_address, indptr, sinks)

    def _set_variant(
        self, params: Any, num_q_heads: int, sinks: Any, sliding_window: int,
        logit_softcap: float, mode: str,
    ) -> Optional[A.Array]:
        """Sets the model-variant fields of a kvarn_attention_params_t; returns the sinks
        array (in the context's memory), which the struct points into, or None."""
        if mode not in _ATTENTION_MODES:
            raise InvalidArgumentError(
                f"mode {mode!r}: expected one of {', '.join(map(repr, _ATTENTION_MODES))}"
            )
        params.mode = _ATTENTION_MODES[mode]
        params.sliding_window = int(sliding_window)
        params.logit_softcap = float(logit_softcap)
        if sinks is None:
            params.set_sinks(0)
            return None
        sa = self._take(sinks, "sinks")
        A.expect(sa, "sinks", (num_q_heads,), ["f32"])
        params.set_sinks(sa.address)
        return sa


class PagedKV:
    """Engine-owned paged memory for :meth:`Context.paged_append`, :meth:`paged_flush` and
    :meth:`paged_attention` (``kvarn_paged_kv_t``); all arrays in the context's memory.

    records:      uint8 [num_record_blocks, Hk, record_stride] (record_stride >= record_bytes,
                  even)
    k_pages, v_pages: fp16 [num_pages, Hk, G, D] (rotated; raw uint16 is accepted)
    block_table:  int32 [batch, max_blocks_per_seq]
    seq_lens, record_tiles: int32 [batch]
    The arrays are referenced, not copied: the engine updates them between calls.
    """

    def __init__(
        self,
        records: Any,
        k_pages: Any,
        v_pages: Any,
        block_table: Any,
        seq_lens: Any,
        record_tiles: Any,
    ) -> None:
        self.records = records
        self.k_pages = k_pages
        self.v_pages = v_pages
        self.block_table = block_table
        self.seq_lens = seq_lens
        self.record_tiles = record_tiles
        shape = tuple(getattr(block_table, "shape", ()))
        if len(shape) != 2:
            raise ShapeError(f"block_table: shape {shape}, expected (batch, max_blocks_per_seq)")
        self.batch = int(shape[0])
        self.num_kv_heads = int(tuple(getattr(k_pages, "shape", (0, 0)))[1])

    @classmethod
    def allocate(
        cls,
        ctx: Context,
        config: Config,
        *,
        num_kv_heads: int,
        num_record_blocks: int,
        num_pages: int,
        batch: int,
        max_blocks_per_seq: int,
    ) -> "PagedKV":
        """Zeroed pools and tables in the context's memory (host numpy arrays on the CPU)."""
        config = _config(config)
        g, d = config.tile_tokens, config.head_dim
        stride = config.record_bytes + (config.record_bytes & 1)
        host = {
            "records": np.zeros((num_record_blocks, num_kv_heads, stride), np.uint8),
            "k_pages": np.zeros((num_pages, num_kv_heads, g, d), np.float16),
            "v_pages": np.zeros((num_pages, num_kv_heads, g, d), np.float16),
            "block_table": np.zeros((batch, max_blocks_per_seq), np.int32),
            "seq_lens": np.zeros((batch,), np.int32),
            "record_tiles": np.zeros((batch,), np.int32),
        }
        return cls(**{name: ctx.to_device(arr) for name, arr in host.items()})

    def _c(
        self, ctx: Context, config: Config, stream: Optional[int] = None
    ) -> Tuple[Any, List[Any]]:
        """The C struct and what keeps its arrays alive. `stream`: the DLPack stream to ask the
        producers for the data on (default: the context's; -1 = no synchronization)."""
        g, d = config.tile_tokens, config.head_dim
        st = ctx.stream if stream is None else stream

        def take(obj: Any, name: str, writable: bool = False) -> A.Array:
            return A.take(obj, name, ctx._device, st, writable)

        r = take(self.records, "records", writable=True)
        kp = take(self.k_pages, "k_pages", writable=True)
        vp = take(self.v_pages, "v_pages", writable=True)
        bt = take(self.block_table, "block_table")
        sl = take(self.seq_lens, "seq_lens")
        rt = take(self.record_tiles, "record_tiles")
        if len(r.shape) != 3:
            raise ShapeError(
                f"records: shape {r.shape}, expected (num_record_blocks, Hk, record_stride)"
            )
        A.expect(r, "records", (None, self.num_kv_heads, None), ["u8"])
        A.expect(kp, "k_pages", (None, self.num_kv_heads, g, d), ["f16", "u16"])
        A.expect(vp, "v_pages", kp.shape, ["f16", "u16"])
        A.expect(bt, "block_table", (self.batch, None), ["i32"])
        A.expect(sl, "seq_lens", (self.batch,), ["i32"])
        A.expect(rt, "record_tiles", (self.batch,), ["i32"])
        kv = capi.paged_kv()
        capi.paged_kv_defaults(kv)
        kv.num_kv_heads = self.num_kv_heads
        kv.batch = self.batch
        kv.record_stride = r.shape[2]
        kv.num_record_blocks = r.shape[0]
        kv.num_pages = kp.shape[0]
        kv.max_blocks_per_seq = bt.shape[1]
        kv.set_pointers(r.address, kp.address, vp.address, bt.address, sl.address, rt.address)
        return kv, [r, kp, vp, bt, sl, rt]


# ---- default contexts and module-level functions ------------------------------------------------

_defaults: Dict[Tuple[int, int], Context] = {}
_defaults_lock = threading.Lock()


def default_context(device: Optional[Tuple[int, int]] = None) -> Context:
    """The process-wide context for a DLPack device (default: the CPU), created on first use."""
    key = (A.DL_CPU, 0) if device is None else (int(device[0]), int(device[1]))
    if key[0] == A.DL_CUDA_MANAGED:
        key = (A.DL_CUDA, key[1])
    with _defaults_lock:
        ctx = _defaults.get(key)
        if ctx is None:
            backend = {A.DL_CPU: Backend.CPU, A.DL_CUDA: Backend.CUDA, A.DL_ROCM: Backend.ROCM}.get(
                key[0]
            )
            if backend is None:
                raise InvalidArgumentError(f"no libkvarn backend for DLPack device {key}")
            ctx = Context(backend, device=key[1] if backend != Backend.CPU else 0)
            _defaults[key] = ctx
    return ctx


def _device_of(obj: Any) -> Tuple[int, int]:
    if isinstance(obj, A.DeviceArray):
        return obj._ctx._device
    if hasattr(obj, "__dlpack_device__") and not isinstance(obj, np.ndarray):
        t, i = obj.__dlpack_device__()
        return (int(t), int(i))
    if hasattr(obj, "__cuda_array_interface__"):
        device = getattr(obj, "device", None)
        return (A.DL_CUDA, int(getattr(device, "id", getattr(device, "index", 0)) or 0))
    return (A.DL_CPU, 0)


def context_for(ctx: Optional[Context], obj: Any) -> Context:
    """`ctx`, or the default context of the device `obj` lives on."""
    return ctx if ctx is not None else default_context(_device_of(obj))


def rotate(
    x: Any,
    *,
    dtype: Optional[str] = None,
    out_dtype: Optional[str] = None,
    out: Any = None,
    ctx: Optional[Context] = None,
) -> Any:
    """:meth:`Context.rotate` on `ctx`, or on the default context of x's device."""
    return context_for(ctx, x).rotate(x, dtype=dtype, out_dtype=out_dtype, out=out)


def quantize(
    k: Any,
    v: Any,
    config: Optional[Config] = None,
    *,
    dtype: Optional[str] = None,
    cache_frame: bool = False,
    record_stride: Optional[int] = None,
    out: Any = None,
    ctx: Optional[Context] = None,
) -> Any:
    """:meth:`Context.quantize` on `ctx`, or on the default context of k's device."""
    return context_for(ctx, k).quantize(
        k, v, config, dtype=dtype, cache_frame=cache_frame, record_stride=record_stride, out=out
    )


def dequantize(
    records: Any,
    config: Optional[Config] = None,
    *,
    out_dtype: str = "f32",
    cache_frame: bool = False,
    keys: bool = True,
    values: bool = True,
    k_out: Any = None,
    v_out: Any = None,
    ctx: Optional[Context] = None,
) -> Tuple[Any, Any]:
    """:meth:`Context.dequantize` on `ctx`, or on the default context of the records' device."""
    return context_for(ctx, records).dequantize(
        records,
        config,
        out_dtype=out_dtype,
        cache_frame=cache_frame,
        keys=keys,
        values=values,
        k_out=k_out,
        v_out=v_out,
    )


_BASELINES = {
    "per_token_rtn": capi.BASELINE_PER_TOKEN_RTN,
    "fp8_e4m3": capi.BASELINE_FP8_E4M3,
}


def baseline_roundtrip(x: Any, method: str, bits: Optional[int] = None) -> np.ndarray:
    """Quantizes and reconstructs x with a baseline that is not KVarN, for accuracy studies
    (``kvarn_baseline_roundtrip``): ``"per_token_rtn"`` (min/max RTN of each row of the last axis
    at `bits` bits, fp16 scale and zero) or ``"fp8_e4m3"`` (per-row fp16 scale; `bits` ignored).
    x: a host array [..., cols] convertible to fp32. Returns a new fp32 array of x's shape."""
    if method not in _BASELINES:
        raise InvalidArgumentError(
            f"method: expected one of {sorted(_BASELINES)}, got {method!r}"
        )
    if method == "per_token_rtn" and bits is None:
        raise InvalidArgumentError("bits: per_token_rtn needs bits (2..8)")
    xa = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if xa.ndim < 1 or xa.shape[-1] == 0:
        raise ShapeError("x: expected an array of shape [..., cols] with cols > 0")
    out = np.empty_like(xa)
    cols = xa.shape[-1]
    capi.baseline_roundtrip(
        _BASELINES[method], int(bits or 0), xa.size // cols, int(cols), xa, out
    )
    return out

