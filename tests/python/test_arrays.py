"""Array exchange: buffer protocol, DLPack, __cuda_array_interface__; dtype, shape, layout and
device checks; the raw layer's typemaps; the GIL released during calls."""

from __future__ import annotations

import array
import sys
import threading
import time

import numpy as np
import pytest

import kvarn
from conftest import kv_tiles


class DLPackOnly:
    """Exposes an array only through DLPack (like a foreign framework's CPU tensor)."""

    def __init__(self, arr, device=None):
        self._arr = arr
        self._device = device
        self.consumed = 0

    def __dlpack_device__(self):
        return self._device or self._arr.__dlpack_device__()

    def __dlpack__(self, stream=None, **kwargs):
        self.consumed += 1
        return self._arr.__dlpack__()


class CudaArrayInterfaceOnly:
    def __init__(self, shape, typestr="<f4"):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (0xDEAD0000, False),
            "version": 3,
        }


def test_dlpack_input_gives_the_same_records_as_numpy(ctx, rng):
    config = kvarn.Config.from_preset("k4v2_g64", 64)
    k, v = kv_tiles(rng, 2, 64, 64)
    wrapped_k, wrapped_v = DLPackOnly(k), DLPackOnly(v.astype(np.float16))
    with pytest.raises(kvarn.DTypeError):  # k and v must share a dtype
        ctx.quantize(wrapped_k, wrapped_v, config)
    wrapped_v = DLPackOnly(v)
    records = ctx.quantize(wrapped_k, wrapped_v, config)
    assert wrapped_k.consumed >= 1 and wrapped_v.consumed >= 1
    np.testing.assert_array_equal(records, ctx.quantize(k, v, config))
    # Outputs may be DLPack objects too (numpy arrays exported writable).
    out = np.zeros_like(records)
    ctx.quantize(k, v, config, out=DLPackOnly(out))
    np.testing.assert_array_equal(out, records)


def test_dlpack_capsule_is_consumed_once_and_kept_alive(ctx, rng):
    x = rng.standard_normal((4, 128)).astype(np.float32)
    capsule = x.__dlpack__()
    owner, address, dev_type, dev_id, dtype, shape, strides, read_only = kvarn.capi._dlpack_unpack(
        capsule
    )
    assert (dev_type, dev_id, dtype, shape) == (1, 0, (2, 32, 1), (4, 128))
    assert address == x.__array_interface__["data"][0] and not read_only
    assert strides is None or strides == (128, 1)
    with pytest.raises(TypeError, match="unused DLPack capsule"):
        kvarn.capi._dlpack_unpack(capsule)  # renamed "used_dltensor"
    before = x.copy()
    del owner  # calls the producer's deleter; x still owns its memory
    np.testing.assert_array_equal(x, before)
    np.testing.assert_allclose(kvarn.rotate(kvarn.rotate(x)), x, rtol=1e-4, atol=1e-5)


def test_dlpack_non_contiguous_and_foreign_dtypes_are_refused(ctx, rng):
    config = kvarn.Config.from_preset("k4v2_g64", 64)
    big = rng.standard_normal((2, 64, 128)).astype(np.float32)
    strided = big[:, :, ::2]
    with pytest.raises(kvarn.LayoutError, match="contiguous"):
        ctx.quantize(DLPackOnly(strided), DLPackOnly(strided), config)
    with pytest.raises(kvarn.DTypeError, match="DLPack dtype"):
        ctx.rotate(DLPackOnly(big.astype(np.float64)))


def test_gpu_arrays_on_a_cpu_context_are_refused_before_any_access(ctx, rng):
    x = rng.standard_normal((2, 128)).astype(np.float32)
    fake_cuda = DLPackOnly(x, device=(2, 0))
    with pytest.raises(kvarn.DeviceMismatchError, match="cuda:0.*cpu"):
        ctx.rotate(fake_cuda)
    assert fake_cuda.consumed == 0
    with pytest.raises(kvarn.DeviceMismatchError):
        ctx.rotate(CudaArrayInterfaceOnly((2, 128)))
    err = pytest.raises(kvarn.DeviceMismatchError, ctx.rotate, CudaArrayInterfaceOnly((2, 128)))
    assert err.value.status == kvarn.Status.INVALID_ARGUMENT
    assert isinstance(err.value, ValueError)


def test_buffer_protocol_objects_are_taken_without_numpy_types(ctx, rng):
    x = rng.standard_normal((3, 64)).astype(np.float32)
    as_array = array.array("f", x.ravel().tolist())
    flat = ctx.rotate(memoryview(as_array).cast("B").cast("f", (3, 64)))
    np.testing.assert_array_equal(flat, ctx.rotate(x))
    with pytest.raises(kvarn.DTypeError):
        ctx.rotate(array.array("d", [1.0] * 64))
    with pytest.raises(kvarn.DTypeError, match="expected an array"):
        ctx.rotate(object())


def test_wrong_dtype_shape_layout_raise_clear_errors(ctx, rng):
    config = kvarn.Config.from_preset("k4v2_g64", 128)
    k, v = kv_tiles(rng, 2, 64, 128)
    with pytest.raises(kvarn.DTypeError, match="float64"):
        ctx.quantize(k.astype(np.float64), v.astype(np.float64), config)
    with pytest.raises(kvarn.ShapeError, match=r"\(\?, 64, 128\)"):
        ctx.quantize(k[:, :32].copy(), v[:, :32].copy(), config)
    with pytest.raises(kvarn.ShapeError):
        ctx.quantize(k, v[:1], config)
    with pytest.raises(kvarn.ShapeError):
        ctx.quantize(k.reshape(128, 128), v.reshape(128, 128), config)
    with pytest.raises(kvarn.LayoutError, match="contiguous"):
        ctx.quantize(k.transpose(0, 2, 1).copy().transpose(0, 2, 1), v, config)
    with pytest.raises(kvarn.DTypeError, match="raw uint16"):
        ctx.quantize(k.view(np.uint16)[..., ::2].copy(), v.view(np.uint16)[..., ::2].copy(), config)
    with pytest.raises(kvarn.DTypeError, match="does not match"):
        ctx.quantize(k, v, config, dtype="f16")
    with pytest.raises(kvarn.DTypeError):
        ctx.quantize(k, v, config, dtype="int8")
    records = ctx.quantize(k, v, config)
    readonly = records.copy()
    readonly.flags.writeable = False
    with pytest.raises(kvarn.LayoutError, match="read-only"):
        ctx.quantize(k, v, config, out=readonly)
    with pytest.raises(kvarn.ShapeError, match="stride"):
        ctx.quantize(k, v, config, out=np.zeros((2, 100), np.uint8))
    with pytest.raises(kvarn.DTypeError):
        ctx.dequantize(records.view(np.int8), config)
    with pytest.raises(kvarn.ShapeError):
        ctx.dequantize(records.reshape(-1), config)
    with pytest.raises(kvarn.ShapeError):
        ctx.dequantize(records, config, k_out=np.zeros((2, 64, 64), np.float32))
    for exc_type in (
        kvarn.DTypeError,
        kvarn.ShapeError,
        kvarn.LayoutError,
        kvarn.DeviceMismatchError,
    ):
        assert issubclass(exc_type, kvarn.InvalidArgumentError)
        assert issubclass(exc_type, kvarn.Error)


def test_raw_layer_typemaps_check_buffers():
    c = kvarn.capi
    ctx = kvarn.Context("cpu")
    x = np.ones((2, 64), np.float32)
    with pytest.raises(TypeError, match="integer address, None or a buffer"):
        c.rotate(ctx._handle, 64, 2, c.DTYPE_F32, "not memory", c.DTYPE_F32, x)
    with pytest.raises(BufferError):  # outputs must be writable
        c.rotate(ctx._handle, 64, 2, c.DTYPE_F32, x, c.DTYPE_F32, bytes(512))
    with pytest.raises((BufferError, ValueError), match="contiguous"):  # and contiguous
        c.rotate(
            ctx._handle, 64, 1, c.DTYPE_F32, x, c.DTYPE_F32, np.ones((2, 128), np.float32)[:, ::2]
        )
    with pytest.raises(kvarn.InvalidArgumentError, match="NULL"):
        c.rotate(ctx._handle, 64, 2, c.DTYPE_F32, None, c.DTYPE_F32, x)
    y = np.empty_like(x)
    c.rotate(ctx._handle, 64, 2, c.DTYPE_F32, x.__array_interface__["data"][0], c.DTYPE_F32, y)
    np.testing.assert_allclose(y, ctx.rotate(x))


def test_gil_is_released_while_the_library_runs(rng):
    config = kvarn.Config.from_preset("k8v8_g128", 512)
    k, v = kv_tiles(rng, 16, 128, 512)
    ctx = kvarn.Context("cpu", num_threads=1)
    start = time.perf_counter()
    ctx.quantize(k, v, config)
    single = time.perf_counter() - start
    started = threading.Event()
    ticks = 0

    def work():
        started.set()
        ctx.quantize(k, v, config)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        worker = threading.Thread(target=work)
        worker.start()
        started.wait()
        while worker.is_alive():
            ticks += 1
        worker.join()
    finally:
        sys.setswitchinterval(old)
    # With the GIL held for the whole call, this thread could not count while it ran.
    assert single > 0.02, f"call too short ({single:.3f} s) to tell"
    assert ticks > 1000, f"{ticks} loop turns during a {single:.3f} s call"


def test_one_context_is_safe_from_many_threads(ctx, rng):
    config = kvarn.Config.from_preset("k4v2_g64", 64)
    k, v = kv_tiles(rng, 8, 64, 64)
    expected = ctx.quantize(k, v, config)
    results = [None] * 4

    def work(i):
        results[i] = ctx.quantize(k, v, config)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_array_equal(r, expected)


def test_torch_cpu_tensors_through_dlpack(ctx, rng):
    torch = pytest.importorskip("torch")
    config = kvarn.Config()
    k, v = kv_tiles(rng, 1, 128, 128)
    tk, tv = torch.from_numpy(k).to(torch.bfloat16), torch.from_numpy(v).to(torch.bfloat16)
    records = ctx.quantize(tk, tv, config)
    ref = ctx.quantize(
        tk.view(torch.int16).numpy().view(np.uint16),
        tv.view(torch.int16).numpy().view(np.uint16),
        config,
        dtype="bf16",
    )
    np.testing.assert_array_equal(records, ref)
    with pytest.raises(kvarn.LayoutError):
        ctx.rotate(torch.from_numpy(k[0]).t())


def test_device_array_holds_context_memory_and_dies_with_the_context(rng):
    ctx = kvarn.Context("cpu")
    x = rng.standard_normal((3, 128)).astype(np.float32)
    dev = kvarn.DeviceArray.from_numpy(ctx, x)
    assert dev.shape == (3, 128) and dev.dtype == np.float32 and dev.nbytes == x.nbytes
    assert dev.address % 64 == 0 and dev.__dlpack_device__() == (1, 0)
    assert not hasattr(dev, "__cuda_array_interface__")  # host memory
    np.testing.assert_array_equal(dev.numpy(), x)
    np.testing.assert_array_equal(ctx.rotate(dev), ctx.rotate(x))
    out = kvarn.DeviceArray(ctx, (3, 128), "f16")
    assert ctx.rotate(dev, out=out, out_dtype="f16") is out
    np.testing.assert_array_equal(np.asarray(out), ctx.rotate(x).astype(np.float16))
    np.testing.assert_array_equal(kvarn.Context("cpu").rotate(dev), ctx.rotate(x))  # host memory
    with pytest.raises(kvarn.ShapeError):
        dev.copy_from(x[:2])
    cache = kvarn.Cache(num_kv_heads=2, ctx=ctx)
    ctx.close()  # closes the cache and frees the array first
    assert dev.address == 0
    with pytest.raises(kvarn.InvalidArgumentError, match="closed"):
        cache.stats()
    with pytest.raises(kvarn.InvalidArgumentError, match="closed"):
        kvarn.Context("cpu").rotate(dev)
