"""Arrays in and out of libkvarn: numpy (buffer protocol), DLPack, __cuda_array_interface__.

Inputs are never copied or converted: an array must already be dense (C-contiguous), of a dtype
the call takes, of the expected shape and in the memory of the context (host memory for a CPU
context, device memory of the context's device for a CUDA/ROCm context). Anything else raises a
:class:`kvarn.InvalidArgumentError` subclass that says what was wrong.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import capi
from ._errors import DeviceMismatchError, DTypeError, InvalidArgumentError, LayoutError, ShapeError

try:  # bfloat16 numpy arrays; without ml_dtypes bf16 travels as raw uint16
    import ml_dtypes as _ml_dtypes

    _NP_BF16: Optional[np.dtype] = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - exercised only without ml_dtypes
    _ml_dtypes = None
    _NP_BF16 = None

# DLPack device types (dlpack.h DLDeviceType).
DL_CPU = 1
DL_CUDA = 2
DL_CUDA_HOST = 3
DL_ROCM = 10
DL_CUDA_MANAGED = 13
_DEVICE_NAMES = {
    DL_CPU: "cpu",
    DL_CUDA: "cuda",
    DL_CUDA_HOST: "cuda_host",
    DL_ROCM: "rocm",
    DL_CUDA_MANAGED: "cuda_managed",
}

# Element kinds the package knows: the three float dtypes of kvarn_dtype_t plus the integer
# arrays of the API. "u16" is raw 16-bit data that a `dtype=` argument names as f16 or bf16.
_ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "u16": 2, "u8": 1, "i32": 4, "i64": 8}
# (DLPack code, bits) -> kind.  Codes: 0 int, 1 uint, 2 float, 4 bfloat.
_DLPACK_KINDS = {
    (2, 32): "f32",
    (2, 16): "f16",
    (4, 16): "bf16",
    (1, 16): "u16",
    (1, 8): "u8",
    (0, 32): "i32",
    (0, 64): "i64",
}
# __cuda_array_interface__ / numpy typestr (without byte order) -> kind.
_TYPESTR_KINDS = {"f4": "f32", "f2": "f16", "u2": "u16", "u1": "u8", "i4": "i32", "i8": "i64"}


def dtype_name(kind: str) -> str:
    return {
        "f32": "float32",
        "f16": "float16",
        "bf16": "bfloat16",
        "u16": "uint16",
        "u8": "uint8",
        "i32": "int32",
        "i64": "int64",
    }.get(kind, kind)


def numpy_dtype(kind: str) -> np.dtype:
    """The numpy dtype of a kind (bf16 is ml_dtypes.bfloat16, or uint16 without ml_dtypes)."""
    if kind == "bf16":
        return _NP_BF16 if _NP_BF16 is not None else np.dtype(np.uint16)
    return np.dtype(
        {
            "f32": np.float32,
            "f16": np.float16,
            "u16": np.uint16,
            "u8": np.uint8,
            "i32": np.int32,
            "i64": np.int64,
        }[kind]
    )


def _numpy_kind(dtype: np.dtype) -> Optional[str]:
    if _NP_BF16 is not None and dtype == _NP_BF16:
        return "bf16"
    if dtype.name == "bfloat16":  # another bfloat16 provider
        return "bf16"
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False):
        return None
    return {
        "float32": "f32",
        "float16": "f16",
        "uint16": "u16",
        "uint8": "u8",
        "int32": "i32",
        "int64": "i64",
    }.get(dtype.name)


class Array(NamedTuple):
    """A checked view of a caller's array: what the C call needs and what keeps it alive."""

    address: int
    shape: Tuple[int, ...]
    kind: str
    device_type: int
    device_id: int
    keep: Any
    row_stride: int = 0  # elements between rows (dim 0) when taken row-strided; 0 = dense

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _ITEMSIZE[self.kind]


def _c_contiguous(shape: Sequence[int], strides_elems: Optional[Sequence[int]]) -> bool:
    if strides_elems is None or 0 in shape:
        return True  # an empty array has no element to misplace (torch may give it any strides)
    expected = 1
    for extent, stride in zip(reversed(shape), reversed(strides_elems)):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def _row_stride(shape: Sequence[int], strides_elems: Optional[Sequence[int]]) -> Optional[int]:
    """0 for a C-contiguous array; the dim-0 stride (elements) of an array whose rows are
    C-contiguous and do not overlap (a view of a wider buffer, e.g. q of a fused qkv); else
    None."""
    if _c_contiguous(shape, strides_elems):
        return 0
    if strides_elems is None or len(shape) < 2 or not _c_contiguous(shape[1:], strides_elems[1:]):
        return None
    row = math.prod(shape[1:])
    return int(strides_elems[0]) if strides_elems[0] >= row else None


def _layout(name: str, shape: Sequence[int], strides_elems: Optional[Sequence[int]],
            row_strided: bool, how: str) -> int:
    stride = _row_stride(shape, strides_elems) if row_strided else (
        0 if _c_contiguous(shape, strides_elems) else None)
    if stride is None:
        if row_strided:
            raise LayoutError(
                f"{name}: {how} rows are not C-contiguous and non-overlapping (strides "
                f"{strides_elems}); call .contiguous() first"
            )
        raise LayoutError(
            f"{name}: {how} is not C-contiguous (strides {strides_elems}); call .contiguous() first"
        )
    return stride


def _check_device(name: str, device_type: int, device_id: int, ctx_device: Tuple[int, int]) -> None:
    want_type, want_id = ctx_device
    same_type = device_type == want_type or (
        want_type == DL_CUDA and device_type == DL_CUDA_MANAGED
    )
    if not same_type or (want_type != DL_CPU and device_id != want_id):
        have = f"{_DEVICE_NAMES.get(device_type, device_type)}:{device_id}"
        want = f"{_DEVICE_NAMES.get(want_type, want_type)}:{want_id}"
        hint = ""
        if want_type == DL_CPU:
            hint = " (a CPU context takes host arrays; use a CUDA context for GPU tensors)"
        elif device_type == DL_CPU:
            hint = " (a GPU context takes device tensors; move the array to the GPU first)"
        raise DeviceMismatchError(f"{name}: array is on {have}, the context on {want}{hint}")


def _from_numpy(name: str, arr: np.ndarray, writable: bool, row_strided: bool = False) -> Array:
    kind = _numpy_kind(arr.dtype)
    if kind is None:
        raise DTypeError(f"{name}: numpy dtype {arr.dtype} is not one libkvarn takes")
    stride = 0
    if not arr.flags.c_contiguous:
        item = arr.itemsize
        elems = [s // item for s in arr.strides] if all(s % item == 0 for s in arr.strides) else None
        stride = _row_stride(arr.shape, elems) if row_strided and elems is not None else None
        if stride is None:
            raise LayoutError(
                f"{name}: array is not C-contiguous (strides {arr.strides}); "
                "pass numpy.ascontiguousarray(...) explicitly"
            )
    if writable and not arr.flags.writeable:
        raise LayoutError(f"{name}: output array is read-only")
    address = arr.__array_interface__["data"][0] if arr.size else 0
    return Array(address, tuple(arr.shape), kind, DL_CPU, 0, arr, stride)


def _dlpack_stream(ctx_device: Tuple[int, int], stream: int) -> Optional[int]:
    if ctx_device[0] == DL_CPU:
        return None
    # The DLPack stream protocol for CUDA: 1 = the legacy default stream; else the handle.
    # ROCm: 0 = the default stream.
    if stream:
        return stream
    return 1 if ctx_device[0] == DL_CUDA else 0


def take(
    obj: Any,
    name: str,
    ctx_device: Tuple[int, int],
    stream: int = 0,
    writable: bool = False,
    row_strided: bool = False,
) -> Array:
    """Checks an array argument and returns its address, shape and element kind.

    numpy arrays and buffer-protocol objects are host memory; objects with ``__dlpack__`` and
    ``__dlpack_device__`` (torch, CuPy, JAX, numpy >= 1.22) and ``__cuda_array_interface__``
    objects may be device memory. The device must be the context's (``ctx_device`` is a DLPack
    (device_type, device_id) pair); the producer is asked for the data on the context's stream.
    row_strided: rows (dim 0) may be further apart than dense, as in a view of a wider buffer
    (the run calls' token tensors); the result's row_stride gives their distance in elements.
    """
    if isinstance(obj, np.ndarray):
        if ctx_device[0] != DL_CPU:
            _check_device(name, DL_CPU, 0, ctx_device)
        return _from_numpy(name, obj, writable, row_strided)
    if isinstance(obj, DeviceArray):
        return obj._as_array(name, ctx_device)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device_type, device_id = (int(x) for x in obj.__dlpack_device__())
        _check_device(name, device_type, device_id, ctx_device)
        if device_type == DL_CPU:
            capsule = obj.__dlpack__()
        else:
            capsule = obj.__dlpack__(stream=_dlpack_stream(ctx_device, stream))
        owner, address, dev_type, dev_id, (code, bits, lanes), shape, strides, read_only = (
            capi._dlpack_unpack(capsule)
        )
        kind = _DLPACK_KINDS.get((code, bits)) if lanes == 1 else None
        if kind is None:
            raise DTypeError(
                f"{name}: DLPack dtype (code {code}, {bits} bits, {lanes} lanes) is "
                "not one libkvarn takes"
            )
        stride = _layout(name, shape, strides, row_strided, "tensor")
        if writable and read_only:
            raise LayoutError(f"{name}: output tensor is read-only")
        return Array(address, tuple(shape), kind, dev_type, dev_id, (owner, obj), stride)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        # The interface names no device: the pointer is taken to be on the context's device.
        _check_device(name, DL_CUDA, ctx_device[1], ctx_device)
        address, read_only = cai["data"]
        shape = tuple(int(x) for x in cai["shape"])
        kind = _TYPESTR_KINDS.get(cai["typestr"][1:])
        if kind is None or cai["typestr"][0] == ">":
            raise DTypeError(
                f"{name}: __cuda_array_interface__ typestr {cai['typestr']} is not "
                "one libkvarn takes"
            )
        strides = cai.get("strides")
        stride = 0
        if strides is not None:
            item = _ITEMSIZE[kind]
            if any(s % item for s in strides):
                raise LayoutError(f"{name}: device array strides {strides} are not whole elements")
            stride = _layout(name, shape, [s // item for s in strides], row_strided, "device array")
        if writable and read_only:
            raise LayoutError(f"{name}: output array is read-only")
        return Array(int(address or 0), shape, kind, DL_CUDA, ctx_device[1], obj, stride)
    try:
        view = memoryview(obj)
    except TypeError:
        raise DTypeError(
            f"{name}: expected an array (numpy, buffer protocol, DLPack or "
            f"__cuda_array_interface__), got {type(obj).__name__}"
        ) from None
    if ctx_device[0] != DL_CPU:
        _check_device(name, DL_CPU, 0, ctx_device)
    return _from_numpy(name, np.asarray(view), writable)


def expect(arr: Array, name: str, shape: Sequence[Optional[int]], kinds: Sequence[str]) -> None:
    """Checks the kind and shape (None matches any extent)."""
    if arr.kind not in kinds:
        raise DTypeError(
            f"{name}: dtype {dtype_name(arr.kind)}, expected "
            + " or ".join(dtype_name(k) for k in kinds)
        )
    if len(arr.shape) != len(shape) or any(
        want is not None and have != want for have, want in zip(arr.shape, shape)
    ):
        shown = tuple("?" if s is None else s for s in shape)
        raise ShapeError(f"{name}: shape {arr.shape}, expected {shown}".replace("'?'", "?"))


def host_ints(values: Any, name: str, kind: str, length: Optional[int] = None) -> np.ndarray:
    """A host array of int32/int64 from a sequence or array (copied into a fresh array)."""
    dtype = np.int32 if kind == "i32" else np.int64
    src = np.asarray(values)
    if src.dtype.kind not in "iu" and src.size:
        raise DTypeError(f"{name}: expected integers, got {src.dtype}")
    if src.size and (src.min() < np.iinfo(dtype).min or src.max() > np.iinfo(dtype).max):
        raise InvalidArgumentError(f"{name}: values do not fit {dtype_name(kind)}")
    arr = np.ascontiguousarray(src, dtype=dtype)
    if arr.ndim != 1:
        raise ShapeError(f"{name}: expected a 1-D sequence, got shape {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ShapeError(f"{name}: {arr.shape[0]} values, expected {length}")
    return arr


def float_kind(arr: Array, name: str, dtype: Optional[str]) -> str:
    """The kvarn dtype of a float array: its own, or `dtype` ("f16"/"bf16") for raw uint16."""
    if dtype is not None:
        dtype = parse_dtype(dtype)
        if arr.kind == "u16" and dtype in ("f16", "bf16"):
            return dtype
        if arr.kind != dtype:
            raise DTypeError(
                f"{name}: dtype {dtype_name(arr.kind)} does not match dtype={dtype_name(dtype)}"
            )
        return dtype
    if arr.kind == "u16":
        raise DTypeError(f"{name}: raw uint16 data needs dtype='f16' or dtype='bf16'")
    if arr.kind not in ("f32", "f16", "bf16"):
        raise DTypeError(
            f"{name}: dtype {dtype_name(arr.kind)}, expected float32, float16 or bfloat16"
        )
    return arr.kind


_DTYPE_ALIASES = {
    "f32": "f32",
    "float32": "f32",
    "fp32": "f32",
    "float": "f32",
    "f16": "f16",
    "float16": "f16",
    "fp16": "f16",
    "half": "f16",
    "bf16": "bf16",
    "bfloat16": "bf16",
}


def parse_dtype(dtype: Any) -> str:
    """ "f32"/"f16"/"bf16" from a name, a kvarn.DType, a numpy dtype or a torch dtype."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        for kind, code in KIND_TO_CODE.items():
            if code == dtype:
                return kind
    text = str(dtype).lower().replace("torch.", "").replace("dtype.", "")
    if text in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[text]
    try:
        kind = _numpy_kind(np.dtype(dtype))
    except TypeError:
        kind = None
    if kind in ("f32", "f16", "bf16"):
        return kind
    raise DTypeError(f"dtype {dtype!r}: expected float32, float16 or bfloat16")


KIND_TO_CODE = {"f32": capi.DTYPE_F32, "f16": capi.DTYPE_F16, "bf16": capi.DTYPE_BF16}


# ---- outputs ------------------------------------------------------------------------------------


def _framework(obj: Any) -> str:
    module = type(obj).__module__.split(".")[0]
    return module if module in ("torch", "cupy") else ""


def empty(ctx: Any, like: Any, shape: Sequence[int], kind: str) -> Any:
    """A new uninitialized array in the context's memory: numpy on the CPU; on a GPU, an array
    of the framework of `like` (torch, CuPy) or else a :class:`DeviceArray`."""
    shape = tuple(int(s) for s in shape)
    if ctx._device[0] == DL_CPU:
        return np.empty(shape, numpy_dtype(kind))
    framework = _framework(like)
    if framework == "torch":
        import torch  # noqa: PLC0415 - only when the caller uses torch

        tdtype = {
            "f32": torch.float32,
            "f16": torch.float16,
            "bf16": torch.bfloat16,
            "u16": torch.int16,
            "u8": torch.uint8,
            "i32": torch.int32,
            "i64": torch.int64,
        }[kind]
        return torch.empty(shape, dtype=tdtype, device=like.device)
    if framework == "cupy" and kind != "bf16":
        import cupy  # noqa: PLC0415

        with cupy.cuda.Device(ctx._device[1]):
            return cupy.empty(shape, dtype=numpy_dtype(kind))
    return DeviceArray(ctx, shape, kind)


class DeviceArray:
    """A dense array in a context's memory, allocated by ``kvarn_memory_alloc``.

    What the package returns on a GPU context when the inputs do not say which framework to use.
    It exports ``__cuda_array_interface__`` (CUDA contexts) and ``__dlpack_device__``; copy it to
    and from the host with :meth:`numpy` and :meth:`copy_from`.
    """

    def __init__(self, ctx: Any, shape: Sequence[int], dtype: Any) -> None:
        kind = dtype if dtype in _ITEMSIZE else parse_dtype(dtype)
        self._ctx = ctx
        self.shape = tuple(int(s) for s in shape)
        self.kind = kind
        self.nbytes = math.prod(self.shape) * _ITEMSIZE[kind]
        native = ctx._native  # the free names the context's handle as it is then
        with ctx._lock:
            address = capi.memory_alloc(ctx._h(), max(self.nbytes, 1))
            self._token, self._finalizer = ctx._adopt(
                self, lambda a: capi.memory_free(native.handle, a), address
            )

    @property
    def address(self) -> int:
        """The address in the context's memory; 0 once freed (or the context closed)."""
        native = self._ctx._native
        with native.lock:
            return int(native.child(self._token) or 0) if "_token" in self.__dict__ else 0

    def _live(self) -> int:
        """The address for a call under the context's lock; raises once freed."""
        address = self.address
        if not address:
            raise InvalidArgumentError("the DeviceArray is freed (or its context closed)")
        return address

    def free(self) -> None:
        """Frees the memory now (also done when the array is collected, or with its context)."""
        if "_finalizer" in self.__dict__:
            self._finalizer()

    @classmethod
    def from_numpy(cls, ctx: Any, array: np.ndarray, dtype: Optional[str] = None) -> "DeviceArray":
        """A copy of a host array in the context's memory."""
        arr = np.ascontiguousarray(array)
        kind = _numpy_kind(arr.dtype)
        if kind is None:
            raise DTypeError(f"numpy dtype {arr.dtype} is not one libkvarn takes")
        if dtype is not None and kind == "u16":
            kind = parse_dtype(dtype)
        out = cls(ctx, arr.shape, kind)
        out.copy_from(arr)
        return out

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.kind)

    def copy_from(self, array: np.ndarray) -> None:
        """Copies a host array of the same size in bytes into this one."""
        arr = np.ascontiguousarray(array)
        if arr.nbytes != self.nbytes:
            raise ShapeError(f"copy_from: {arr.nbytes} bytes into an array of {self.nbytes}")
        with self._ctx._lock:
            capi.memory_copy(
                self._ctx._h(),
                self._live(),
                arr.view(np.uint8) if arr.size else None,
                self.nbytes,
                capi.COPY_HOST_TO_DEVICE,
            )

    def numpy(self) -> np.ndarray:
        """A host copy."""
        out = np.empty(self.shape, numpy_dtype(self.kind))
        if self.nbytes:
            with self._ctx._lock:
                capi.memory_copy(
                    self._ctx._h(),
                    out.view(np.uint8),
                    self._live(),
                    self.nbytes,
                    capi.COPY_DEVICE_TO_HOST,
                )
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    def _as_array(self, name: str, ctx_device: Tuple[int, int]) -> Array:
        if not self.address and self.nbytes:
            raise InvalidArgumentError(f"{name}: the DeviceArray's context is closed")
        _check_device(name, *self._ctx._device, ctx_device)
        return Array(
            self.address, self.shape, self.kind, self._ctx._device[0], self._ctx._device[1], self
        )

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self._ctx._device

    @property
    def __cuda_array_interface__(self) -> dict:
        if self._ctx._device[0] != DL_CUDA:
            raise AttributeError("__cuda_array_interface__: not CUDA memory")
        typestr = {
            "f32": "<f4",
            "f16": "<f2",
            "bf16": "<u2",
            "u16": "<u2",
            "u8": "|u1",
            "i32": "<i4",
            "i64": "<i8",
        }[self.kind]
        return {
            "shape": self.shape,
            "typestr": typestr,
            "data": (self.address, False),
            "strides": None,
            "version": 3,
            "stream": self._ctx.stream or 1,
        }

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def __repr__(self) -> str:
        return (
            f"DeviceArray(shape={self.shape}, dtype={dtype_name(self.kind)}, "
            f"device={_DEVICE_NAMES.get(self._ctx._device[0])}:{self._ctx._device[1]})"
        )
