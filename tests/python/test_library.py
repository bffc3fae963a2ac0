"""Versions, backends, CPU features, contexts and configurations."""

from __future__ import annotations

import re

import pytest

import kvarn
from conftest import SOURCE_DIR


def test_version_is_the_c_library_version():
    header = (SOURCE_DIR / "capi/include/kvarn/kvarn.h").read_text()
    parts = [
        int(re.search(rf"#define KVARN_VERSION_{p} (\d+)", header).group(1))
        for p in ("MAJOR", "MINOR", "PATCH")
    ]
    assert kvarn.version_info() == tuple(parts)
    assert kvarn.__version__ == kvarn.version() == "{}.{}.{}".format(*parts)
    assert kvarn.capi.version_number() == parts[0] * 10000 + parts[1] * 100 + parts[2]
    assert kvarn.abi_version() == kvarn.capi.ABI_VERSION
    assert kvarn.capi.VERSION_NUMBER == kvarn.capi.version_number()


def test_backends_list_cpu_available_and_say_why_others_are_not():
    infos = {info.backend: info for info in kvarn.backends()}
    assert kvarn.Backend.CPU in infos
    cpu = infos[kvarn.Backend.CPU]
    assert cpu.available and cpu.name == "cpu" and cpu.device_count == 1 and cpu.reason == ""
    for info in infos.values():
        assert info.name == kvarn.capi.backend_name(int(info.backend))
        assert info.available or info.reason, info


def test_unavailable_backend_is_an_error_never_a_fallback():
    cuda = next(i for i in kvarn.backends() if i.backend == kvarn.Backend.CUDA)
    if cuda.available:
        pytest.skip("CUDA is available here")
    with pytest.raises(kvarn.BackendUnavailableError) as info:
        kvarn.Context("cuda")
    assert info.value.status == kvarn.Status.BACKEND_UNAVAILABLE
    assert "cuda" in str(info.value)


def test_context_reports_backend_isa_device_and_threads():
    with kvarn.Context("cpu", num_threads=3) as ctx:
        assert ctx.backend == kvarn.Backend.CPU and ctx.backend_name == "cpu"
        assert ctx.cpu_isa in set(kvarn.CpuIsa) - {kvarn.CpuIsa.NONE}
        assert ctx.cpu_isa_name == kvarn.capi.cpu_isa_name(int(ctx.cpu_isa))
        assert ctx.device == 0 and ctx.num_threads == 3 and not ctx.is_gpu
        assert ctx.__dlpack_device__() == (1, 0)
        ctx.synchronize()
        assert "cpu" in repr(ctx)
    with pytest.raises(kvarn.InvalidArgumentError, match="closed"):
        ctx.synchronize()
    auto = kvarn.Context()
    assert auto.backend != kvarn.Backend.AUTO


def test_max_cpu_isa_caps_new_contexts():
    best = kvarn.cpu_isa_best()
    try:
        kvarn.set_max_cpu_isa("scalar")
        assert kvarn.Context("cpu").cpu_isa == kvarn.CpuIsa.SCALAR
    finally:
        kvarn.set_max_cpu_isa(best)
    assert kvarn.Context("cpu").cpu_isa == best
    with pytest.raises(kvarn.InvalidArgumentError):
        kvarn.set_max_cpu_isa("sse9")


def test_cpu_features_are_words():
    features = kvarn.cpu_features()
    assert isinstance(features, list) and all(re.fullmatch(r"[a-z0-9._]+", f) for f in features)


def test_config_defaults_come_from_the_library():
    c = kvarn.Config()
    assert (c.head_dim, c.tile_tokens, c.key_bits, c.value_bits) == (128, 128, 4, 2)
    assert c == kvarn.Config.from_preset("k4v2_g128", 128)
    assert c.preset == "k4v2_g128"
    assert c.record_bytes == 13824  # the header's example
    assert hash(c) == hash(kvarn.Config.from_preset("k4v2_g128"))


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256, 512])
def test_every_preset_has_the_record_layout_of_algorithm_md(head_dim):
    names = kvarn.presets()
    assert "k4v2_g128" in names and len(names) == kvarn.capi.preset_count()
    for name in names:
        c = kvarn.Config.from_preset(name, head_dim).validate()
        kb, vb, g = map(int, re.fullmatch(r"k(\d)v(\d)_g(\d+)", name).groups())
        assert (c.key_bits, c.value_bits, c.tile_tokens, c.head_dim) == (kb, vb, g, head_dim)
        d = head_dim
        sizes = [d * g * kb // 8, 2 * d, 2 * d, 2 * g, g * d * vb // 8, 2 * d, 2 * g, 2 * g]
        layout = c.record_layout()
        assert list(layout) == [f.name.lower() for f in kvarn.RecordField]
        offset = 0
        for (got_offset, got_len), size in zip(layout.values(), sizes):
            assert (got_offset, got_len) == (offset, size)
            offset += size
        assert c.record_bytes == offset == d * g * (kb + vb) // 8 + 6 * d + 6 * g


def test_config_replace_and_field_errors():
    c = kvarn.Config.from_preset("k4v4_g64", 64)
    d = c.replace(iterations=3, sink_tiles=0)
    assert (d.iterations, d.sink_tiles, d.tile_tokens) == (3, 0, 64) and c.iterations == 8
    assert d != c
    with pytest.raises(TypeError):
        kvarn.Config(heads=3)
    with pytest.raises(kvarn.NotFoundError) as info:
        kvarn.Config.from_preset("k5v2_g128")
    assert info.value.status == kvarn.Status.NOT_FOUND and "k5v2_g128" in info.value.detail
    with pytest.raises(kvarn.UnsupportedError):
        kvarn.Config(head_dim=100).validate()
    with pytest.raises(kvarn.InvalidArgumentError):
        kvarn.Config(iterations=99).validate()
    with pytest.raises(kvarn.InvalidArgumentError):
        kvarn.Config(head_dim=1 << 40).validate()
    with pytest.raises(kvarn.InvalidArgumentError):
        kvarn.Config().record_field("no_such_field")
