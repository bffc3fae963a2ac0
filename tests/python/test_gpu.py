"""GPU tensors in and out (torch CUDA, CuPy, __cuda_array_interface__): run on a machine with a
CUDA device, torch and libkvarn built with the CUDA backend; skipped cleanly elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

import kvarn
from conftest import kv_tiles


def _cuda_backend_available() -> bool:
    return any(i.backend == kvarn.Backend.CUDA and i.available for i in kvarn.backends())


torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
    pytest.mark.skipif(
        not _cuda_backend_available(), reason="libkvarn built without the CUDA backend or no device"
    ),
]


@pytest.fixture(scope="module")
def gpu():
    stream = torch.cuda.Stream()
    with kvarn.Context("cuda", device=0, stream=stream.cuda_stream) as ctx:
        yield ctx, stream


def test_cuda_context_reports_its_backend(gpu):
    ctx, _ = gpu
    assert ctx.backend == kvarn.Backend.CUDA and ctx.is_gpu
    assert ctx.cpu_isa == kvarn.CpuIsa.NONE and ctx.__dlpack_device__() == (2, 0)


def test_torch_cuda_tensors_in_and_out_match_the_cpu(gpu, rng):
    ctx, stream = gpu
    config = kvarn.Config()
    k, v = kv_tiles(rng, 4, 128, 128)
    cpu_records = kvarn.quantize(k, v, config)
    with torch.cuda.stream(stream):
        tk = torch.from_numpy(k).to("cuda", torch.bfloat16)
        tv = torch.from_numpy(v).to("cuda", torch.bfloat16)
        records = ctx.quantize(tk, tv, config)
    assert isinstance(records, torch.Tensor) and records.is_cuda
    assert records.dtype == torch.uint8 and tuple(records.shape) == cpu_records.shape
    ref = kvarn.quantize(
        tk.cpu().view(torch.int16).numpy().view(np.uint16),
        tv.cpu().view(torch.int16).numpy().view(np.uint16),
        config,
        dtype="bf16",
    )
    ctx.synchronize()
    # The GPU codec matches the CPU's in >= 99.99% of codes; fp16 scales may split differently
    # between rows and columns (docs/FORMAT.md), so compare codes and reconstructions.
    got = records.cpu().numpy()
    for field in ("k_codes", "v_codes"):
        off, size = config.record_field(field)
        same = np.mean(got[:, off : off + size] == ref[:, off : off + size])
        assert same >= 0.999, f"{field}: only {same:.5f} of code bytes equal the CPU's"
    k_gpu_rec, v_gpu_rec = kvarn.dequantize(got, config)
    k_ref, v_ref = kvarn.dequantize(ref, config)
    for name, a, b in (("k", k_gpu_rec, k_ref), ("v", v_gpu_rec, v_ref)):
        rel = np.linalg.norm(a - b) / np.linalg.norm(b)
        assert rel < 2e-2, f"{name}: GPU records reconstruct {rel:.2e} away from the CPU's"
    out_k = torch.empty((4, 128, 128), device="cuda", dtype=torch.float16)
    pointer = out_k.data_ptr()
    k2, v2 = ctx.dequantize(records, config, out_dtype="f16", k_out=out_k)
    assert k2 is out_k and out_k.data_ptr() == pointer and v2.is_cuda
    ctx.synchronize()
    # Dequantize on the GPU equals dequantize on the CPU of the same records.
    k_cpu, v_cpu = kvarn.dequantize(got, config, out_dtype="f16")
    np.testing.assert_allclose(k2.cpu().numpy(), k_cpu, rtol=2e-3, atol=2e-3)


def test_wrong_device_is_refused_both_ways(gpu, rng):
    ctx, _ = gpu
    x = rng.standard_normal((2, 128)).astype(np.float32)
    with pytest.raises(kvarn.DeviceMismatchError, match="GPU context"):
        ctx.rotate(x)
    with pytest.raises(kvarn.DeviceMismatchError, match="CPU context"):
        kvarn.Context("cpu").rotate(torch.from_numpy(x).cuda())
    if torch.cuda.device_count() > 1:
        with pytest.raises(kvarn.DeviceMismatchError):
            ctx.rotate(torch.from_numpy(x).to("cuda:1"))
    with pytest.raises(kvarn.LayoutError):
        ctx.rotate(torch.from_numpy(x).cuda().t())


def test_default_context_follows_the_tensor_device(rng):
    x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32)).cuda()
    y = kvarn.rotate(x)
    assert y.is_cuda
    torch.cuda.synchronize()
    np.testing.assert_allclose(y.cpu().numpy(), kvarn.rotate(x.cpu().numpy()), rtol=1e-5, atol=1e-5)


def test_device_array_exports_cuda_array_interface(gpu, rng):
    ctx, _ = gpu
    x = rng.standard_normal((2, 128)).astype(np.float32)
    dev = kvarn.DeviceArray.from_numpy(ctx, x)
    cai = dev.__cuda_array_interface__
    assert cai["shape"] == (2, 128) and cai["typestr"] == "<f4" and cai["data"][0] == dev.address
    y = ctx.rotate(dev)
    assert isinstance(y, kvarn.DeviceArray)
    np.testing.assert_allclose(y.numpy(), kvarn.rotate(x), rtol=1e-5, atol=1e-5)
    as_torch = torch.as_tensor(dev, device="cuda")
    np.testing.assert_array_equal(as_torch.cpu().numpy(), x)


def test_cupy_arrays(gpu, rng):
    cupy = pytest.importorskip("cupy")
    ctx, _ = gpu
    x = rng.standard_normal((2, 128)).astype(np.float32)
    y = ctx.rotate(cupy.asarray(x))
    assert isinstance(y, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(y), kvarn.rotate(x), rtol=1e-5, atol=1e-5)


def test_selftest_on_the_cuda_context(gpu):
    """kvarn.selftest on a CUDA context: codec, paged attention and the managed cache (device
    arrays in and out) against the float64 references."""
    ctx, _ = gpu
    report = kvarn.selftest(ctx, raise_on_failure=False)
    assert report, str(report)
    assert all("cache_rel_l2" in row for row in report.rows), "the cache checks did not run"
