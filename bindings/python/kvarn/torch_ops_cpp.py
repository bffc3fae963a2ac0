"""The torch ops in C++: ``torch.ops.kvarn_cpp.paged_append``, ``paged_flush`` and
``paged_attention``, with the schemas and semantics of :mod:`kvarn.torch_ops`
(``torch.ops.kvarn.*``) but no Python in the call path (a few microseconds of host time per call
instead of a few hundred).

The extension (``kvarn/csrc/torch_ops.cpp``) is compiled on first use with
``torch.utils.cpp_extension.load`` against the installed torch and the libkvarn.so this package
has loaded, and cached (``$KVARN_TORCH_OPS_CACHE``, else ``$XDG_CACHE_HOME/kvarn`` or
``~/.cache/kvarn``). Without a C++ compiler (or when the build fails) :func:`available` is False
and the helpers below run the Python ops instead; :func:`load_error` says why.

Plans are named by the same int handle as in the Python ops (:func:`kvarn.torch_handle`);
:func:`handle` also registers the plan's context, config, workspace and shape with the C++ ops
(the helpers do it on first use), and the registration is dropped before the plan or its context
is destroyed. Make handles before tracing or capture.

    from kvarn import torch_ops_cpp as ops
    ops.paged_append(flush, kv, token_indptr, slot_mapping, k, v, status)
    ops.paged_flush(flush, kv, n_flush, flush_src, flush_dst, flush_seq, status)
    ops.paged_attention(plan, kv, q, out, lse, seq_status=status)

Errors: argument errors raise ValueError (TypeError for a handle of the wrong plan kind), failing
library calls RuntimeError naming the kvarn status (the Python ops raise kvarn.Error subclasses).
Calls on one context are serialized among the C++ ops; as with the C API, do not run them on a
context while another thread runs other calls on it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import threading
from typing import Any, Dict, Optional

import torch

from . import _paged
from . import torch_ops as _py_ops
from ._arrays import KIND_TO_CODE
from ._core import PagedKV

Tensor = torch.Tensor

_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
_CONFIG_FIELDS = ("head_dim", "tile_tokens", "key_bits", "value_bits", "iterations",
                  "sink_tiles", "key_flags", "value_flags")

_lock = threading.RLock()
_state: Dict[str, Any] = {"tried": False, "error": None}
# handle -> (the plan's workspace, kept alive while registered; the context's _Native; its token)
_registered: Dict[int, Any] = {}

# The ops, bound once loaded (OpOverloads: the cheapest call from Python).
_append: Any = None
_flush: Any = None
_attention: Any = None


def _libkvarn() -> str:
    """The path of the libkvarn the package has loaded (the extension must use the same one)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").split(maxsplit=5)[-1]
            if os.path.basename(path).startswith("libkvarn.so"):
                return path
    raise OSError("libkvarn.so is not mapped in this process")


def _include_dir() -> str:
    """kvarn.h: next to the source in an installed or build-tree package, else the source
    tree's capi/include (running from bindings/python)."""
    for candidate in (os.path.join(_CSRC, "include"),
                      os.path.join(_CSRC, "..", "..", "..", "..", "capi", "include")):
        if os.path.isfile(os.path.join(candidate, "kvarn", "kvarn.h")):
            return os.path.abspath(candidate)
    raise OSError(f"kvarn/kvarn.h not found beside {_CSRC}")


def _cuda_include() -> Optional[str]:
    """CUDA's include dir when torch is a CUDA build and the headers are present: then the ops
    take the stream from c10::cuda::getCurrentCUDAStream (else c10::Stream::native_handle)."""
    if not torch.version.cuda or sys.platform != "linux":
        return None
    from torch.utils import cpp_extension  # noqa: PLC0415

    home = cpp_extension.CUDA_HOME or "/usr/local/cuda"
    inc = os.path.join(home, "include")
    return inc if os.path.isfile(os.path.join(inc, "cuda_runtime_api.h")) else None


def _cache_dir() -> str:
    base = os.environ.get("KVARN_TORCH_OPS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "kvarn", "torch_ops")
    return base


def _build() -> None:
    from torch.utils import cpp_extension  # noqa: PLC0415

    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise OSError(f"no C++ compiler ({cxx!r} not found; set CXX)")
    source = os.path.join(_CSRC, "torch_ops.cpp")
    include = _include_dir()
    lib = _libkvarn()
    cuda_inc = _cuda_include()
    with open(source, "rb") as f:
        digest = hashlib.sha256(f.read())
    for header in ("kvarn.h", "kvarn_experimental.h"):
        with open(os.path.join(include, "kvarn", header), "rb") as f:
            digest.update(f.read())
    digest.update(f"{torch.__version__}|{sys.version}|{lib}|{cuda_inc}".encode())
    tag = digest.hexdigest()[:16]
    build_dir = os.path.join(_cache_dir(), tag)
    os.makedirs(build_dir, exist_ok=True)
    cflags = ["-O2", "-fvisibility=hidden"]
    ldflags = [lib, "-Wl,-rpath," + os.path.dirname(lib)]
    includes = [include]
    if cuda_inc is not None:
        cflags.append("-DKVARN_TORCH_OPS_CUDA")
        includes.append(cuda_inc)
        ldflags += ["-L" + os.path.join(os.path.dirname(torch.__file__), "lib"), "-lc10_cuda"]
    cpp_extension.load(
        name=f"kvarn_torch_ops_{tag}",
        sources=[source],
        extra_cflags=cflags,
        extra_ldflags=ldflags,
        extra_include_paths=includes,
        build_directory=build_dir,
        is_python_module=False,
        verbose=bool(os.environ.get("KVARN_TORCH_OPS_VERBOSE")),
    )


def load() -> bool:
    """Builds (first time) and loads the extension; True when the C++ ops are registered.
    Tried once per process; set ``KVARN_TORCH_OPS_CPP=0`` to never try."""
    global _append, _flush, _attention
    if _append is not None:
        return True
    with _lock:
        if _state["tried"]:
            return _append is not None
        _state["tried"] = True
        if os.environ.get("KVARN_TORCH_OPS_CPP", "1") == "0":
            _state["error"] = "disabled by KVARN_TORCH_OPS_CPP=0"
            return False
        try:
            if not hasattr(torch.ops.kvarn_cpp, "paged_attention"):
                _build()
            ops = torch.ops.kvarn_cpp
            _flush, _attention = ops.paged_flush.default, ops.paged_attention.default
            _append = ops.paged_append.default
        except Exception as exc:  # noqa: BLE001 - any failure means: use the Python ops
            _state["error"] = f"{type(exc).__name__}: {exc}"
            return False
        return True


def available() -> bool:
    """Whether the C++ ops are in use (builds and loads them on the first call)."""
    return load()


def load_error() -> Optional[str]:
    """Why the C++ ops are not available (None when they are, or were not tried yet)."""
    return _state["error"]


# ---- plan registration ------------------------------------------------------------------------


def _forget(h: int) -> None:
    """Drops handle h from the C++ registry (waits for a call running under it)."""
    with _lock:
        entry = _registered.pop(h, None)
    if entry is None:
        return
    torch.ops.kvarn_cpp._forget_plan(h)
    _, native, token = entry
    native.release(token)  # no-op when the context's close is what called us


def _forget_then(h: int, free: Any, native_handle: Any) -> None:
    _forget(h)
    free(native_handle)


def handle(obj: Any) -> int:
    """The int handle of an :class:`kvarn.AttentionPlan`, :class:`kvarn.FlushPlan` or
    :class:`kvarn.TailFlushPlan` (the one :func:`kvarn.torch_handle` gives), registered with the
    C++ ops when they are available."""
    if isinstance(obj, int):
        if obj in _registered or _append is None:
            return obj
        obj = _paged.from_handle(obj)
    h = obj.__dict__.get("_torch_handle", 0)
    if h and h in _registered:
        return h
    h = _paged.torch_handle(obj)  # checks the type and that the plan is open
    if not load():
        return h
    ctx = obj.ctx
    with ctx._lock, _lock:
        if h in _registered:
            return h
        native = ctx._native
        config = [int(getattr(obj.config, n)) for n in _CONFIG_FIELDS]
        device = [int(ctx._device[0]), int(ctx._device[1]), int(bool(ctx.stream))]
        if isinstance(obj, _paged.AttentionPlan):
            kind, plan = 1, int(obj._h())
            shape = [obj.num_kv_heads, obj.batch, obj.num_q_heads, obj.rows, int(obj.is_decode),
                     int(KIND_TO_CODE[obj.q_dtype]), int(KIND_TO_CODE[obj.out_dtype]), 0]
            # Whatever destroys the plan (its close, its collection, the context's close) drops
            # the registration first.
            free, native_handle = native._children[obj._token]
            native._children[obj._token] = (
                functools.partial(_forget_then, h, free), native_handle)
        elif isinstance(obj, _paged.TailFlushPlan):
            # No native handle and no close: registered until the context closes (or
            # _paged.forget_torch_handle / _forget).
            kind, plan = 2, 0
            shape = [obj.num_kv_heads, obj.batch, 0, 0, 0, 0, 0, obj.max_tokens]
        else:
            kind, plan = 0, 0
            shape = [obj.num_kv_heads, 0, 0, 0, 0, 0, 0, obj.max_tiles]
            close = obj.close

            def closing(close: Any = close, h: int = h) -> None:
                _forget(h)
                close()

            obj.close = closing  # FlushPlan owns no native handle: hook its close
        # The context's close drops the registration before it destroys the context.
        token = native.adopt(lambda _unused, h=h: _forget(h), None)
        torch.ops.kvarn_cpp._register_plan(
            h, kind, int(ctx._h()), plan, config, int(obj._ws_address),
            int(obj.workspace_bytes), device, shape)
        _registered[h] = (obj.workspace, native, token)
    return h


# ---- helpers (as kvarn.torch_ops's) -----------------------------------------------------------


def paged_append(
    plan: Any,
    kv: PagedKV,
    token_indptr: Tensor,
    slot_mapping: Tensor,
    k: Tensor,
    v: Tensor,
    seq_status: Optional[Tensor] = None,
) -> None:
    """``torch.ops.kvarn_cpp.paged_append`` (else ``torch.ops.kvarn.paged_append``) with the
    context and config of `plan` (an AttentionPlan or FlushPlan, or its handle)."""
    h = handle(plan)
    if _append is None:
        return _py_ops.paged_append(h, kv, token_indptr, slot_mapping, k, v, seq_status)
    _append(h, kv.records, kv.k_pages, kv.v_pages, kv.block_table, kv.seq_lens,
            kv.record_tiles, token_indptr, slot_mapping, k, v, seq_status)
    return None


def paged_flush(
    plan: Any,
    kv: PagedKV,
    n_tiles: Tensor,
    src_pages: Tensor,
    dst_blocks: Tensor,
    tile_seqs: Optional[Tensor] = None,
    seq_status: Optional[Tensor] = None,
) -> None:
    """``torch.ops.kvarn_cpp.paged_flush`` (else the Python op) under a FlushPlan."""
    h = handle(plan)
    if _flush is None:
        return _py_ops.paged_flush(h, kv, n_tiles, src_pages, dst_blocks, tile_seqs, seq_status)
    _flush(h, kv.records, kv.k_pages, kv.v_pages, kv.block_table, kv.seq_lens,
           kv.record_tiles, n_tiles, src_pages, dst_blocks, tile_seqs, seq_status)
    return None


def paged_attention(
    plan: Any,
    kv: PagedKV,
    q: Tensor,
    out: Tensor,
    lse: Optional[Tensor] = None,
    *,
    q_indptr: Optional[Tensor] = None,
    seq_status: Optional[Tensor] = None,
) -> Tensor:
    """``torch.ops.kvarn_cpp.paged_attention`` (else the Python op) under an AttentionPlan,
    writing `out` (and `lse`); returns out."""
    h = handle(plan)
    if _attention is None:
        return _py_ops.paged_attention(h, kv, q, out, lse, q_indptr=q_indptr,
                                       seq_status=seq_status)
    _attention(h, kv.records, kv.k_pages, kv.v_pages, kv.block_table, kv.seq_lens,
               kv.record_tiles, q, out, lse, q_indptr, seq_status)
    return out


def paged_append_flush_tail(
    plan: Any,
    kv: PagedKV,
    tail: Any,
    tail_slots: Tensor,
    token_indptr: Tensor,
    k: Tensor,
    v: Tensor,
    committed: Tensor,
    seq_status: Optional[Tensor] = None,
) -> None:
    """``torch.ops.kvarn_cpp.paged_append_flush_tail`` (else the Python op) under a
    TailFlushPlan made with max_tokens: append and flush of the one-pool model in one op,
    kv.record_tiles advanced in place. Experimental."""
    h = handle(plan)
    if _append is None:
        return _py_ops.paged_append_flush_tail(h, kv, tail, tail_slots, token_indptr, k, v,
                                               committed, seq_status)
    torch.ops.kvarn_cpp.paged_append_flush_tail.default(
        h, kv.records, kv.k_pages, kv.v_pages, kv.block_table, kv.seq_lens, kv.record_tiles,
        tail.states, tail_slots, tail.max_step_tokens, tail.row_bits, token_indptr, k, v,
        committed, seq_status)
    return None


def paged_attention_tail(
    plan: Any,
    kv: PagedKV,
    tail: Any,
    tail_slots: Tensor,
    q: Tensor,
    out: Tensor,
    lse: Optional[Tensor] = None,
    *,
    q_indptr: Optional[Tensor] = None,
    seq_status: Optional[Tensor] = None,
) -> Tensor:
    """``torch.ops.kvarn_cpp.paged_attention_tail`` (else the Python op): attention over the
    records and the tail slots under an AttentionPlan; returns out. Experimental."""
    h = handle(plan)
    if _attention is None:
        return _py_ops.paged_attention_tail(h, kv, tail, tail_slots, q, out, lse,
                                            q_indptr=q_indptr, seq_status=seq_status)
    torch.ops.kvarn_cpp.paged_attention_tail.default(
        h, kv.records, kv.k_pages, kv.v_pages, kv.block_table, kv.seq_lens, kv.record_tiles,
        tail.states, tail_slots, tail.max_step_tokens, tail.row_bits, q, out, lse, q_indptr,
        seq_status)
    return out


def registered_plans() -> int:
    """Plans registered with the C++ ops (for tests)."""
    return int(torch.ops.kvarn_cpp._registered_plans()) if load() else 0


__all__ = ["available", "handle", "load", "load_error", "paged_append",
           "paged_append_flush_tail", "paged_attention", "paged_attention_tail", "paged_flush",
           "registered_plans"]
