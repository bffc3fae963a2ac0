# Type stubs of the kvarn package's public API (the implementation is in kvarn/_*.py; the raw
# SWIG layer kvarn.capi is untyped on purpose: use the package).
import enum
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import capi as capi

__version__: str

ArrayLike = Any  # numpy array, buffer-protocol object, DLPack tensor, __cuda_array_interface__
DTypeLike = Union[str, "DType", Any]  # "f32"/"f16"/"bf16", numpy, torch dtypes

# ---- statuses and errors ------------------------------------------------------------------------

class Status(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    OUT_OF_MEMORY = 3
    BACKEND_UNAVAILABLE = 4
    NON_FINITE = 5
    OVERFLOW = 6
    CAPACITY = 7
    NOT_FOUND = 8
    ALREADY_EXISTS = 9
    CORRUPT_DATA = 10
    BUFFER_TOO_SMALL = 11
    INVALID_STATE = 12
    DEVICE = 13
    INTERNAL = 14

class Error(Exception):
    status: Status
    detail: str
    def __init__(self, detail: str = ..., status: Optional[Union[Status, int]] = ...) -> None: ...
    @property
    def status_string(self) -> str: ...

class InvalidArgumentError(Error, ValueError): ...
class DTypeError(InvalidArgumentError, TypeError): ...
class ShapeError(InvalidArgumentError): ...
class LayoutError(InvalidArgumentError): ...
class DeviceMismatchError(InvalidArgumentError): ...
class UnsupportedError(Error): ...
class OutOfMemoryError(Error, MemoryError): ...
class BackendUnavailableError(Error): ...
class NonFiniteError(Error, ValueError): ...
class Fp16OverflowError(Error, ValueError): ...
class CapacityError(Error): ...
class NotFoundError(Error, LookupError): ...
class AlreadyExistsError(Error): ...
class CorruptDataError(Error): ...
class BufferTooSmallError(Error): ...
class InvalidStateError(Error): ...
class DeviceError(Error): ...
class InternalError(Error): ...

class SelftestError(Error):
    report: SelftestReport
    def __init__(self, detail: str, report: SelftestReport) -> None: ...

# ---- enumerations and library queries -----------------------------------------------------------

class DType(enum.IntEnum):
    F32 = 0
    F16 = 1
    BF16 = 2

class Backend(enum.IntEnum):
    AUTO = 0
    CPU = 1
    CUDA = 2
    ROCM = 3

class CpuIsa(enum.IntEnum):
    SCALAR = 0
    AVX2 = 1
    AVX512 = 2
    NEON = 3
    NONE = 255

class RecordField(enum.IntEnum):
    K_CODES = 0
    K_SCALE = 1
    K_ZERO = 2
    K_TOKEN_SCALE = 3
    V_CODES = 4
    V_CHANNEL_SCALE = 5
    V_SCALE = 6
    V_ZERO = 7

ABLATE_NONE: int
ABLATE_NO_ROTATION: int
ABLATE_NO_NORMALIZATION: int

class BackendInfo(NamedTuple):
    backend: Backend
    name: str
    available: bool
    device_count: int
    reason: str

def version() -> str: ...
def version_info() -> Tuple[int, int, int]: ...
def abi_version() -> int: ...
def backends() -> List[BackendInfo]: ...
def cpu_features() -> List[str]: ...
def cpu_isa_best() -> CpuIsa: ...
def set_max_cpu_isa(isa: Union[CpuIsa, str, int]) -> None: ...
def presets() -> List[str]: ...

# ---- configurations -----------------------------------------------------------------------------

class Config:
    head_dim: int
    tile_tokens: int
    key_bits: int
    value_bits: int
    iterations: int
    sink_tiles: int
    key_flags: int
    value_flags: int
    def __init__(
        self,
        *,
        head_dim: int = ...,
        tile_tokens: int = ...,
        key_bits: int = ...,
        value_bits: int = ...,
        iterations: int = ...,
        sink_tiles: int = ...,
        key_flags: int = ...,
        value_flags: int = ...,
    ) -> None: ...
    @classmethod
    def from_preset(cls, preset: str, head_dim: int = ..., **fields: int) -> Config: ...
    def replace(self, **fields: int) -> Config: ...
    def validate(self) -> Config: ...
    @property
    def preset(self) -> str: ...
    @property
    def record_bytes(self) -> int: ...
    def record_field(self, field: Union[RecordField, str, int]) -> Tuple[int, int]: ...
    def record_layout(self) -> Dict[str, Tuple[int, int]]: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

# ---- arrays -------------------------------------------------------------------------------------

class DeviceArray:
    shape: Tuple[int, ...]
    kind: str
    nbytes: int
    address: int
    def __init__(self, ctx: Context, shape: Sequence[int], dtype: Any) -> None: ...
    @classmethod
    def from_numpy(
        cls, ctx: Context, array: np.ndarray, dtype: Optional[str] = ...
    ) -> DeviceArray: ...
    @property
    def dtype(self) -> np.dtype: ...
    def copy_from(self, array: np.ndarray) -> None: ...
    def numpy(self) -> np.ndarray: ...
    def free(self) -> None: ...
    def __array__(self, dtype: Any = ..., copy: Any = ...) -> np.ndarray: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...
    def __len__(self) -> int: ...

# ---- contexts, codec, paged attention -----------------------------------------------------------

class PagedKV:
    records: ArrayLike
    k_pages: ArrayLike
    v_pages: ArrayLike
    block_table: ArrayLike
    seq_lens: ArrayLike
    record_tiles: ArrayLike
    batch: int
    num_kv_heads: int
    def __init__(
        self,
        records: ArrayLike,
        k_pages: ArrayLike,
        v_pages: ArrayLike,
        block_table: ArrayLike,
        seq_lens: ArrayLike,
        record_tiles: ArrayLike,
    ) -> None: ...
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
    ) -> PagedKV: ...

class Context:
    backend: Backend
    cpu_isa: CpuIsa
    device: int
    num_threads: int
    stream: int
    def __init__(
        self,
        backend: Union[Backend, str, int] = ...,
        device: int = ...,
        stream: Optional[int] = ...,
        num_threads: int = ...,
    ) -> None: ...
    @property
    def backend_name(self) -> str: ...
    @property
    def cpu_isa_name(self) -> str: ...
    @property
    def is_gpu(self) -> bool: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Context: ...
    def __exit__(self, *exc: Any) -> None: ...
    def synchronize(self) -> None: ...
    @property
    def error_word_address(self) -> int: ...
    def empty(self, shape: Sequence[int], dtype: Any) -> Any: ...
    def to_device(self, array: np.ndarray, dtype: Optional[str] = ...) -> Any: ...
    def baseline_roundtrip(x: Any, method: str, bits: Optional[int] = None) -> np.ndarray: ...
def rotate(
        self,
        x: ArrayLike,
        *,
        dtype: Optional[DTypeLike] = ...,
        out_dtype: Optional[DTypeLike] = ...,
        out: Optional[ArrayLike] = ...,
    ) -> Any: ...
    def quantize(
        self,
        k: ArrayLike,
        v: ArrayLike,
        config: Optional[Config] = ...,
        *,
        dtype: Optional[DTypeLike] = ...,
        cache_frame: bool = ...,
        record_stride: Optional[int] = ...,
        out: Optional[ArrayLike] = ...,
    ) -> Any: ...
    def dequantize(
        self,
        records: ArrayLike,
        config: Optional[Config] = ...,
        *,
        out_dtype: DTypeLike = ...,
        cache_frame: bool = ...,
        keys: bool = ...,
        values: bool = ...,
        k_out: Optional[ArrayLike] = ...,
        v_out: Optional[ArrayLike] = ...,
    ) -> Tuple[Any, Any]: ...
    def paged_append(
        self,
        config: Config,
        kv: PagedKV,
        token_indptr: Sequence[int],
        k: ArrayLike,
        v: ArrayLike,
        *,
        dtype: Optional[DTypeLike] = ...,
    ) -> None: ...
    def paged_flush(
        self, config: Config, kv: PagedKV, src_pages: Sequence[int], dst_blocks: Sequence[int]
    ) -> None: ...
    def paged_attention(
        self,
        config: Config,
        kv: PagedKV,
        q: ArrayLike,
        *,
        q_indptr: Optional[Sequence[int]] = ...,
        scale: float = ...,
        dtype: Optional[DTypeLike] = ...,
        out_dtype: Optional[DTypeLike] = ...,
        num_splits: int = ...,
        sinks: Optional[ArrayLike] = ...,
        sliding_window: int = ...,
        logit_softcap: float = ...,
        mode: str = ...,
        return_lse: bool = ...,
        out: Optional[ArrayLike] = ...,
        lse: Optional[ArrayLike] = ...,
    ) -> Any: ...

def default_context(device: Optional[Tuple[int, int]] = ...) -> Context: ...
def rotate(
    x: ArrayLike,
    *,
    dtype: Optional[DTypeLike] = ...,
    out_dtype: Optional[DTypeLike] = ...,
    out: Optional[ArrayLike] = ...,
    ctx: Optional[Context] = ...,
) -> Any: ...
def quantize(
    k: ArrayLike,
    v: ArrayLike,
    config: Optional[Config] = ...,
    *,
    dtype: Optional[DTypeLike] = ...,
    cache_frame: bool = ...,
    record_stride: Optional[int] = ...,
    out: Optional[ArrayLike] = ...,
    ctx: Optional[Context] = ...,
) -> Any: ...
def dequantize(
    records: ArrayLike,
    config: Optional[Config] = ...,
    *,
    out_dtype: DTypeLike = ...,
    cache_frame: bool = ...,
    keys: bool = ...,
    values: bool = ...,
    k_out: Optional[ArrayLike] = ...,
    v_out: Optional[ArrayLike] = ...,
    ctx: Optional[Context] = ...,
) -> Tuple[Any, Any]: ...

# ---- managed cache ------------------------------------------------------------------------------

class CacheStats(NamedTuple):
    sequences: int
    tokens: int
    committed_tokens: int
    records: int
    pages: int
    bytes_used: int
    bytes_capacity: int
    fp16_bytes: int
    compression_ratio: float

class Cache:
    ctx: Context
    config: Config
    num_layers: int
    num_kv_heads: int
    max_tokens: int
    max_sequences: int
    def __init__(
        self,
        config: Optional[Config] = ...,
        *,
        num_layers: int = ...,
        num_kv_heads: int = ...,
        max_tokens: int = ...,
        max_sequences: int = ...,
        ctx: Optional[Context] = ...,
    ) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Cache: ...
    def __exit__(self, *exc: Any) -> None: ...
    def add_sequence(self, seq_id: int) -> None: ...
    def remove_sequence(self, seq_id: int) -> None: ...
    def fork(self, src_id: int, dst_id: int, n_tokens: int = ...) -> None: ...
    def truncate(self, seq_id: int, n_tokens: int) -> None: ...
    def commit(self, seq_id: int, n_tokens: int) -> None: ...
    def sequence_length(self, seq_id: int, layer: int = ...) -> Tuple[int, int]: ...
    def append(
        self,
        seq_id: int,
        layer: int,
        k: ArrayLike,
        v: ArrayLike,
        *,
        speculative: bool = ...,
        dtype: Optional[DTypeLike] = ...,
    ) -> None: ...
    def attention(
        self,
        layer: int,
        seq_ids: Sequence[int],
        q: ArrayLike,
        *,
        q_indptr: Optional[Sequence[int]] = ...,
        scale: float = ...,
        dtype: Optional[DTypeLike] = ...,
        out_dtype: Optional[DTypeLike] = ...,
        num_splits: int = ...,
        sinks: Optional[ArrayLike] = ...,
        sliding_window: int = ...,
        logit_softcap: float = ...,
        mode: str = ...,
        return_lse: bool = ...,
        out: Optional[ArrayLike] = ...,
        lse: Optional[ArrayLike] = ...,
    ) -> Any: ...
    def stats(self) -> CacheStats: ...
    def export_sequence(self, seq_id: int) -> bytes: ...
    def import_sequence(self, seq_id: int, blob: Any) -> None: ...

# ---- capturable layer 2: plan / run over metadata in the context's memory -----------------------

class FlushPlan:
    ctx: Context
    config: Config
    num_kv_heads: int
    max_tiles: int
    workspace_bytes: int
    workspace: Any
    def __init__(
        self,
        ctx: Context,
        config: Config,
        *,
        num_kv_heads: int,
        max_tiles: int,
        like: Optional[ArrayLike] = ...,
    ) -> None: ...
    def run(
        self,
        kv: PagedKV,
        n_tiles: ArrayLike,
        src_pages: ArrayLike,
        dst_blocks: ArrayLike,
        tile_seqs: Optional[ArrayLike] = ...,
        *,
        seq_status: Optional[ArrayLike] = ...,
        stream: Optional[int] = ...,
    ) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> FlushPlan: ...
    def __exit__(self, *exc: Any) -> None: ...

class AttentionPlan:
    ctx: Context
    config: Config
    batch: int
    num_kv_heads: int
    max_blocks_per_seq: int
    num_q_heads: int
    max_q_per_seq: int
    max_total_q: int
    q_dtype: str
    out_dtype: str
    workspace_bytes: int
    workspace: Any
    def __init__(
        self,
        ctx: Context,
        config: Config,
        *,
        batch: int,
        num_kv_heads: int,
        max_blocks_per_seq: int,
        num_q_heads: int,
        max_q_per_seq: int = ...,
        max_total_q: int = ...,
        scale: float = ...,
        q_dtype: DTypeLike = ...,
        out_dtype: Optional[DTypeLike] = ...,
        num_splits: int = ...,
        sinks: Optional[ArrayLike] = ...,
        sliding_window: int = ...,
        logit_softcap: float = ...,
        mode: str = ...,
        like: Optional[ArrayLike] = ...,
    ) -> None: ...
    @property
    def is_decode(self) -> bool: ...
    @property
    def rows(self) -> int: ...
    def run(
        self,
        kv: PagedKV,
        q: ArrayLike,
        *,
        q_indptr: Optional[ArrayLike] = ...,
        out: Optional[ArrayLike] = ...,
        lse: Optional[ArrayLike] = ...,
        return_lse: bool = ...,
        seq_status: Optional[ArrayLike] = ...,
        stream: Optional[int] = ...,
        tail: Optional[TailState] = ...,
        tail_slots: Optional[ArrayLike] = ...,
    ) -> Any: ...
    def close(self) -> None: ...
    def __enter__(self) -> AttentionPlan: ...
    def __exit__(self, *exc: Any) -> None: ...

def paged_append_run(
    ctx: Context,
    config: Config,
    kv: PagedKV,
    token_indptr: ArrayLike,
    slot_mapping: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    seq_status: Optional[ArrayLike] = ...,
    dtype: Optional[DTypeLike] = ...,
    stream: Optional[int] = ...,
) -> None: ...
def paged_flush_run(
    ctx: Context,
    config: Config,
    kv: PagedKV,
    n_tiles: ArrayLike,
    src_pages: ArrayLike,
    dst_blocks: ArrayLike,
    tile_seqs: Optional[ArrayLike] = ...,
    *,
    seq_status: Optional[ArrayLike] = ...,
    stream: Optional[int] = ...,
) -> None: ...
def paged_attention_run(plan: AttentionPlan, kv: PagedKV, q: ArrayLike, **kwargs: Any) -> Any: ...
def torch_handle(obj: Union[AttentionPlan, FlushPlan]) -> int: ...
def register_torch_ops() -> bool: ...

# ---- experimental: the per-request tail state (kvarn_experimental.h; CPU only) ----------------

def tail_state_bytes(config: Config, num_kv_heads: int, max_step_tokens: int = ...) -> int: ...

class TailState:
    ctx: Context
    config: Config
    num_kv_heads: int
    num_slots: int
    max_step_tokens: int
    slot_bytes: int
    states: Any
    def __init__(
        self,
        ctx: Context,
        config: Config,
        *,
        num_kv_heads: int,
        num_slots: int,
        max_step_tokens: int = ...,
        like: Optional[ArrayLike] = ...,
    ) -> None: ...

def paged_append_tail_run(
    ctx: Context,
    config: Config,
    kv: PagedKV,
    tail: TailState,
    tail_slots: ArrayLike,
    token_indptr: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    seq_status: Optional[ArrayLike] = ...,
    dtype: Optional[DTypeLike] = ...,
    stream: Optional[int] = ...,
) -> None: ...

class TailFlushPlan:
    ctx: Context
    config: Config
    num_kv_heads: int
    batch: int
    max_step_tokens: int
    workspace_bytes: int
    workspace: Any
    def __init__(
        self,
        ctx: Context,
        config: Config,
        *,
        num_kv_heads: int,
        batch: int,
        max_step_tokens: int = ...,
        like: Optional[ArrayLike] = ...,
    ) -> None: ...
    def run(
        self,
        kv: PagedKV,
        tail: TailState,
        tail_slots: ArrayLike,
        committed: ArrayLike,
        record_tiles_out: Optional[ArrayLike] = ...,
        *,
        seq_status: Optional[ArrayLike] = ...,
        stream: Optional[int] = ...,
    ) -> None: ...

# ---- selftest -----------------------------------------------------------------------------------

class SelftestReport:
    context: str
    rows: List[Dict[str, Any]]
    @property
    def passed(self) -> int: ...
    @property
    def failed(self) -> int: ...
    def __bool__(self) -> bool: ...

def selftest(
    ctx: Optional[Context] = ...,
    *,
    quick: bool = ...,
    preset_names: Optional[Sequence[str]] = ...,
    head_dims: Optional[Sequence[int]] = ...,
    seed: int = ...,
    raise_on_failure: bool = ...,
    verbose: bool = ...,
) -> SelftestReport: ...
