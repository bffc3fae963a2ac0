"""libkvarn for Python: KV-cache quantization with KVarN and attention over the quantized cache.

A thin layer over the library's C API (the SWIG module :mod:`kvarn.capi`, every ``kvarn_*``
function without its prefix):

- :class:`Context` (backend, device, stream, threads) and :func:`backends`, :func:`cpu_features`;
- :class:`Config` and :func:`presets`;
- the codec: :func:`rotate`, :func:`quantize`, :func:`dequantize` (also methods of Context);
- paged attention over engine-owned memory: :class:`PagedKV`, :meth:`Context.paged_append`,
  :meth:`Context.paged_flush`, :meth:`Context.paged_attention`;
- its capturable form (plan / run over metadata in the context's memory, for CUDA graphs):
  :class:`AttentionPlan`, :class:`FlushPlan`, :func:`paged_append_run`, :func:`paged_flush_run`,
  :func:`paged_attention_run`, and the torch custom ops ``torch.ops.kvarn.*``
  (:func:`register_torch_ops`, :mod:`kvarn.torch_ops`, :func:`torch_handle`);
- experimental (kvarn_experimental.h, no stability promise; CPU and CUDA, ``append_run`` CPU
  only): the per-request tail state of the one-pool memory model, :class:`TailState`,
  :func:`tail_state_bytes`, :func:`paged_append_tail_run`, :class:`TailFlushPlan` (``run``,
  ``append_run``) and ``AttentionPlan.run(tail=...)``;
- the managed cache :class:`Cache`;
- :func:`selftest`;
- :class:`Error` and its subclasses, one per status, each carrying ``.status``.

Arrays: numpy arrays (and anything with the buffer protocol) for CPU contexts; DLPack tensors
(torch, CuPy, JAX) and ``__cuda_array_interface__`` objects for GPU contexts. Inputs are never
copied or converted: wrong dtype, shape, layout or device raises an :class:`InvalidArgumentError`
subclass. The GIL is released while the library runs.
"""

from . import capi
from ._errors import (
    AlreadyExistsError,
    BackendUnavailableError,
    BufferTooSmallError,
    CapacityError,
    CorruptDataError,
    DeviceError,
    DeviceMismatchError,
    DTypeError,
    Error,
    Fp16OverflowError,
    InternalError,
    InvalidArgumentError,
    InvalidStateError,
    LayoutError,
    NonFiniteError,
    NotFoundError,
    OutOfMemoryError,
    SelftestError,
    ShapeError,
    Status,
    UnsupportedError,
)
from ._arrays import DeviceArray
from ._core import (
    ABLATE_NO_NORMALIZATION,
    ABLATE_NO_ROTATION,
    ABLATE_NONE,
    Backend,
    BackendInfo,
    Config,
    Context,
    CpuIsa,
    DType,
    PagedKV,
    RecordField,
    abi_version,
    backends,
    baseline_roundtrip,
    cpu_features,
    cpu_isa_best,
    default_context,
    dequantize,
    presets,
    quantize,
    rotate,
    set_max_cpu_isa,
    version,
    version_info,
)
from ._cache import Cache, CacheStats
from ._paged import (
    AttentionPlan,
    FlushPlan,
    TailFlushPlan,
    TailState,
    paged_append_run,
    paged_append_tail_run,
    paged_attention_run,
    paged_flush_run,
    register_torch_ops,
    tail_state_bytes,
    torch_handle,
)
from ._selftest import SelftestReport, selftest

__version__: str = version()

__all__ = [
    "ABLATE_NONE",
    "ABLATE_NO_NORMALIZATION",
    "ABLATE_NO_ROTATION",
    "AlreadyExistsError",
    "AttentionPlan",
    "Backend",
    "BackendInfo",
    "BackendUnavailableError",
    "BufferTooSmallError",
    "Cache",
    "CacheStats",
    "CapacityError",
    "Config",
    "Context",
    "CorruptDataError",
    "CpuIsa",
    "DType",
    "DTypeError",
    "DeviceArray",
    "DeviceError",
    "DeviceMismatchError",
    "Error",
    "FlushPlan",
    "Fp16OverflowError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidStateError",
    "LayoutError",
    "NonFiniteError",
    "NotFoundError",
    "OutOfMemoryError",
    "PagedKV",
    "RecordField",
    "SelftestError",
    "SelftestReport",
    "ShapeError",
    "Status",
    "TailFlushPlan",
    "TailState",
    "UnsupportedError",
    "__version__",
    "abi_version",
    "backends",
    "baseline_roundtrip",
    "capi",
    "cpu_features",
    "cpu_isa_best",
    "default_context",
    "dequantize",
    "paged_append_run",
    "paged_append_tail_run",
    "paged_attention_run",
    "paged_flush_run",
    "presets",
    "quantize",
    "register_torch_ops",
    "rotate",
    "selftest",
    "set_max_cpu_isa",
    "tail_state_bytes",
    "torch_handle",
    "version",
    "version_info",
]
