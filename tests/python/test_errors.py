"""Every status maps to its exception class, and every path the package can reach raises it
with the status and the library's message; a failing call changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

import kvarn
from conftest import kv_tiles

EXPECTED_CLASSES = {
    kvarn.Status.INVALID_ARGUMENT: kvarn.InvalidArgumentError,
    kvarn.Status.UNSUPPORTED: kvarn.UnsupportedError,
    kvarn.Status.OUT_OF_MEMORY: kvarn.OutOfMemoryError,
    kvarn.Status.BACKEND_UNAVAILABLE: kvarn.BackendUnavailableError,
    kvarn.Status.NON_FINITE: kvarn.NonFiniteError,
    kvarn.Status.OVERFLOW: kvarn.Fp16OverflowError,
    kvarn.Status.CAPACITY: kvarn.CapacityError,
    kvarn.Status.NOT_FOUND: kvarn.NotFoundError,
    kvarn.Status.ALREADY_EXISTS: kvarn.AlreadyExistsError,
    kvarn.Status.CORRUPT_DATA: kvarn.CorruptDataError,
    kvarn.Status.BUFFER_TOO_SMALL: kvarn.BufferTooSmallError,
    kvarn.Status.INVALID_STATE: kvarn.InvalidStateError,
    kvarn.Status.DEVICE: kvarn.DeviceError,
    kvarn.Status.INTERNAL: kvarn.InternalError,
}


def test_status_values_are_the_pinned_c_values():
    assert [int(s) for s in kvarn.Status] == list(range(15))
    assert set(EXPECTED_CLASSES) == set(kvarn.Status) - {kvarn.Status.OK}


@pytest.mark.parametrize("status", sorted(EXPECTED_CLASSES))
def test_each_status_becomes_its_exception_class(status):
    from kvarn._errors import error_for_status

    exc = error_for_status(int(status), "detail text")
    assert type(exc) is EXPECTED_CLASSES[status]
    assert exc.status == status and exc.detail == "detail text"
    assert isinstance(exc, kvarn.Error)
    assert str(exc) == f"{status.name}: detail text"
    assert exc.status_string == kvarn.capi.status_string(int(status)) != "unknown status"
    unknown = error_for_status(99, "")
    assert type(unknown) is kvarn.Error and int(unknown.status) == 99


def check(exc_info, cls, status, text):
    assert type(exc_info.value) is cls, exc_info.value
    assert exc_info.value.status == status
    assert text in exc_info.value.detail, exc_info.value.detail


def test_library_statuses_reach_python_with_their_message(ctx, rng):
    c = kvarn.capi
    with pytest.raises(kvarn.Error) as e:
        c.rotate(ctx._handle, 64, 1, c.DTYPE_F32, None, c.DTYPE_F32, None)
    check(e, kvarn.InvalidArgumentError, kvarn.Status.INVALID_ARGUMENT, "NULL")
    with pytest.raises(kvarn.Error) as e:
        kvarn.Config(head_dim=100).validate()
    check(e, kvarn.UnsupportedError, kvarn.Status.UNSUPPORTED, "head_dim 100")
    with pytest.raises(kvarn.Error) as e:
        c.memory_alloc(ctx._handle, 1 << 62)
    check(e, kvarn.OutOfMemoryError, kvarn.Status.OUT_OF_MEMORY, "allocate")
    assert isinstance(e.value, MemoryError)
    with pytest.raises(kvarn.Error) as e:
        kvarn.Config.from_preset("nope")
    check(e, kvarn.NotFoundError, kvarn.Status.NOT_FOUND, "nope")
    assert isinstance(e.value, LookupError)
    with pytest.raises(kvarn.Error) as e:
        kvarn.capi.set_max_cpu_isa(77)
    check(e, kvarn.InvalidArgumentError, kvarn.Status.INVALID_ARGUMENT, "77")


def test_non_finite_and_overflowing_inputs_write_nothing(ctx, rng):
    config = kvarn.Config.from_preset("k4v2_g64", 64)
    k, v = kv_tiles(rng, 2, 64, 64)
    out = np.full((2, config.record_bytes), 0x5A, np.uint8)
    bad = k.copy()
    bad[1, 7, 3] = np.nan
    with pytest.raises(kvarn.NonFiniteError) as e:
        ctx.quantize(bad, v, config, out=out)
    check(e, kvarn.NonFiniteError, kvarn.Status.NON_FINITE, "NaN")
    bad_v = v.copy()
    bad_v[0, 3, 5] = -np.inf
    with pytest.raises(kvarn.NonFiniteError):
        ctx.quantize(k, bad_v, config, out=out)
    with pytest.raises(kvarn.Fp16OverflowError) as e:
        ctx.quantize(k * 1e6, v, config, out=out)
    check(e, kvarn.Fp16OverflowError, kvarn.Status.OVERFLOW, "fp16")
    assert np.all(out == 0x5A)


def test_cache_statuses_and_failed_calls_change_nothing(ctx, rng):
    hk, d = 2, 128
    cache = kvarn.Cache(
        kvarn.Config(), num_layers=2, num_kv_heads=hk, max_tokens=1024, max_sequences=3, ctx=ctx
    )
    k = rng.standard_normal((400, hk, d)).astype(np.float32)
    v = rng.standard_normal((400, hk, d)).astype(np.float32)
    cache.add_sequence(1)
    with pytest.raises(kvarn.Error) as e:
        cache.add_sequence(1)
    check(e, kvarn.AlreadyExistsError, kvarn.Status.ALREADY_EXISTS, "1")
    with pytest.raises(kvarn.Error) as e:
        cache.append(9, 0, k[:3], v[:3])
    check(e, kvarn.NotFoundError, kvarn.Status.NOT_FOUND, "9")
    with pytest.raises(kvarn.Error) as e:
        cache.append(1, 5, k[:3], v[:3])
    check(e, kvarn.InvalidArgumentError, kvarn.Status.INVALID_ARGUMENT, "layer 5")
    for layer in range(2):
        cache.append(1, layer, k[:300], v[:300])
    with pytest.raises(kvarn.Error) as e:
        cache.truncate(1, 200)
    check(e, kvarn.InvalidStateError, kvarn.Status.INVALID_STATE, "quantized")
    cache.append(1, 0, k[300:303], v[300:303], speculative=True)
    with pytest.raises(kvarn.InvalidStateError):
        cache.append(1, 0, k[303:305], v[303:305])
    with pytest.raises(kvarn.InvalidArgumentError):
        cache.commit(1, 10)
    assert cache.sequence_length(1, 0) == (303, 300)
    cache.add_sequence(2)
    with pytest.raises(kvarn.Error) as e:
        cache.append(2, 0, np.concatenate([k, k, k]), np.concatenate([v, v, v]))
    check(e, kvarn.CapacityError, kvarn.Status.CAPACITY, "full")
    assert cache.sequence_length(2, 0) == (0, 0)
    blob = bytearray(cache.export_sequence(1))
    before = cache.stats()
    for position in (0, len(blob) // 2, len(blob) - 1):
        damaged = bytearray(blob)
        damaged[position] ^= 0x10
        with pytest.raises(kvarn.Error) as e:
            cache.import_sequence(3, damaged)
        check(e, kvarn.CorruptDataError, kvarn.Status.CORRUPT_DATA, "")
    with pytest.raises(kvarn.CorruptDataError):
        cache.import_sequence(3, blob[:-9])
    assert cache.stats() == before
    with pytest.raises(kvarn.NotFoundError):
        cache.sequence_length(3)
    with pytest.raises(kvarn.Error) as e:
        kvarn.capi.cache_export_sequence(cache._handle, 1, bytearray(10), 10)
    check(e, kvarn.BufferTooSmallError, kvarn.Status.BUFFER_TOO_SMALL, str(len(blob)))
    cache.import_sequence(3, bytes(blob))
    with pytest.raises(kvarn.Error) as e:
        cache.add_sequence(4)
    check(e, kvarn.CapacityError, kvarn.Status.CAPACITY, "max_sequences")
    with pytest.raises(kvarn.Error) as e:
        kvarn.Cache(num_layers=0, ctx=ctx)
    check(e, kvarn.InvalidArgumentError, kvarn.Status.INVALID_ARGUMENT, "num_layers")
    cache.close()
    with pytest.raises(kvarn.InvalidArgumentError, match="closed"):
        cache.stats()


def test_package_argument_errors(ctx):
    with pytest.raises(kvarn.InvalidArgumentError, match="backend"):
        kvarn.Context("tpu")
    with pytest.raises(kvarn.InvalidArgumentError, match="kvarn.Config"):
        ctx.quantize(
            np.zeros((1, 128, 128), np.float32), np.zeros((1, 128, 128), np.float32), config=42
        )
    with pytest.raises(kvarn.DTypeError):
        kvarn.Cache(ctx=ctx, num_kv_heads=2).attention(0, [1.5], np.ones((1, 2, 128), np.float32))
    with pytest.raises(kvarn.ShapeError):
        kvarn.Cache(ctx=ctx, num_kv_heads=2).attention(0, [[1]], np.ones((1, 2, 128), np.float32))


def test_backend_unavailable_or_device_error_is_raised_for_gpu_contexts():
    info = {i.backend: i for i in kvarn.backends()}
    for backend in (kvarn.Backend.CUDA, kvarn.Backend.ROCM):
        if info[backend].available:
            continue
        with pytest.raises(kvarn.BackendUnavailableError) as e:
            kvarn.Context(backend)
        assert e.value.detail == kvarn.capi.last_error()


def test_error_word_is_a_zero_int32_on_the_cpu():
    import ctypes

    ctx = kvarn.Context(backend="cpu")
    address = ctx.error_word_address
    assert address != 0 and address == ctx.error_word_address
    assert ctypes.c_int32.from_address(address).value == 0
    with pytest.raises(kvarn.NonFiniteError):
        ctx.quantize(np.full((1, 128, 128), np.nan, np.float32),
                     np.zeros((1, 128, 128), np.float32), kvarn.Config())
    assert ctypes.c_int32.from_address(address).value == 0  # CPU calls return their own errors
