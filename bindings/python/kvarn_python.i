/*
 * kvarn_python.i - the Python specifics of the SWIG module kvarn.capi (C extension kvarn._capi).
 *
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 *
 * The raw layer under the pure-Python package `kvarn`: every kvarn_* function of kvarn.h with the
 * prefix dropped. On top of the shared policy of ../swig/kvarn.i:
 *   - a failing status raises the exception made by the factory the package registers with
 *     _set_error_factory(callable(status, message)) (kvarn.Error subclasses), else RuntimeError;
 *   - memory arguments (void*, const void*, the int32/int64/float arrays) accept either an
 *     integer address (host or device memory; 0 = NULL), None (NULL), or an object with the buffer
 *     protocol; a buffer must be C-contiguous and, for outputs, writable. This layer does not know
 *     the sizes the C call will touch: the package checks dtypes and shapes before calling;
 *   - the GIL is released while the C call runs (threads="1"), never while Python objects are
 *     touched (argument conversion, exceptions, results);
 *   - _dlpack_unpack(capsule) reads a DLPack capsule (legacy or versioned) without numpy.
 * Needs no numpy to build.
 */
%module(package="kvarn", threads="1") capi

%{
#define SWIG_FILE_WITH_INIT
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "kvarn/kvarn.h"

static PyObject* kvarn_py_error_factory = NULL;

/* Raises the exception of a failing status; the message is kvarn_last_error() of this thread
 * (the C call ran on this thread, the GIL release does not move it). */
static void kvarn_py_raise(kvarn_status_t status) {
  const char* detail = kvarn_last_error();
  PyObject* message = PyUnicode_DecodeUTF8(detail, (Py_ssize_t)strlen(detail), "replace");
  if (message == NULL) return;
  if (kvarn_py_error_factory != NULL) {
    PyObject* exc = PyObject_CallFunction(kvarn_py_error_factory, "iO", (int)status, message);
    if (exc != NULL) {
      PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
      Py_DECREF(exc);
    }
  } else {
    PyErr_Format(PyExc_RuntimeError, "kvarn: %s: %U", kvarn_status_string(status), message);
  }
  Py_DECREF(message);
}

/* Adds an out-parameter to a call's result: a status call's None result becomes the value, a
 * second value makes a list. Our own, because SWIG 4.3 changed SWIG_Python_AppendOutput (a
 * non-void call's None stays in the list) and the module must behave the same with Debian's
 * SWIG 4.1 and PyPI's (pyproject.toml). Steals both references; NULL when obj is NULL. */
static PyObject* kvarn_py_append_output(PyObject* result, PyObject* obj) {
  if (obj == NULL) { /* the conversion failed: its exception propagates */
    Py_XDECREF(result);
    return NULL;
  }
  if (result == NULL) return obj;
  if (result == Py_None) {
    Py_DECREF(result);
    return obj;
  }
  if (!PyList_Check(result)) {
    PyObject* list = PyList_New(1);
    if (list == NULL) {
      Py_DECREF(obj);
      return result;
    }
    PyList_SET_ITEM(list, 0, result);
    result = list;
  }
  PyList_Append(result, obj);
  Py_DECREF(obj);
  return result;
}

/* A memory argument: integer address, None, or a C-contiguous buffer (writable if `writable`).
 * Returns 0 and sets *ptr (and *view when a buffer was acquired), or -1 with an exception set. */
static int kvarn_py_get_pointer(PyObject* obj, int writable, void** ptr, Py_buffer* view,
                                int* has_view) {
  *has_view = 0;
  if (obj == Py_None) {
    *ptr = NULL;
    return 0;
  }
  if (PyLong_Check(obj)) {
    *ptr = PyLong_AsVoidPtr(obj);
    return PyErr_Occurred() ? -1 : 0;
  }
  if (!PyObject_CheckBuffer(obj)) {
    PyErr_Format(PyExc_TypeError,
                 "kvarn: expected an integer address, None or a buffer, got %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) != 0) {
    return -1; /* BufferError: not contiguous or read-only */
  }
  *has_view = 1;
  *ptr = view->buf;
  return 0;
}
%}

/* ---- statuses --------------------------------------------------------------------------------- */
%define KVARN_SWIG_RAISE(status)
  kvarn_py_raise(status);
  SWIG_fail;
%enddef
%define KVARN_SWIG_OK_RESULT
  $result = SWIG_Py_Void();
%enddef

/* ---- memory arguments ------------------------------------------------------------------------- */
%typemap(in) const void* (Py_buffer view, int has_view = 0) {
  if (kvarn_py_get_pointer($input, 0, (void**)&$1, &view, &has_view) != 0) SWIG_fail;
}
%typemap(freearg) const void* {
  if (has_view$argnum) PyBuffer_Release(&view$argnum);
}
%typemap(in) void* (Py_buffer view, int has_view = 0) {
  if (kvarn_py_get_pointer($input, 1, (void**)&$1, &view, &has_view) != 0) SWIG_fail;
}
%typemap(freearg) void* {
  if (has_view$argnum) PyBuffer_Release(&view$argnum);
}
%typemap(typecheck) const void*, void* "$1 = 1;";
%apply const void* { const float* in };
%apply void* { float* out };
%apply const void* { const int32_t* token_indptr, const int32_t* src_pages,
                     const int32_t* dst_blocks, const int64_t* seq_ids };
%apply void* { float* lse };
/* The capturable layer 2 (plan / run): every per-step array is in the context's memory and is
 * passed as an integer address (or a host buffer on a CPU context). */
%apply const void* { const int32_t* slot_mapping, const int32_t* n_tiles,
                     const int32_t* tile_seqs, const int32_t* q_indptr };
/* The experimental tail state's flush (kvarn_experimental.h). */
%apply const void* { const int32_t* committed };
%apply void* { int32_t* record_tiles_out };

/* ---- out-parameters become results ---------------------------------------------------------- */
%define KVARN_OUT_HANDLE(TYPE, NAME, DESCRIPTOR)
%typemap(in, numinputs=0) TYPE** NAME (TYPE* tmp = NULL) { $1 = &tmp; }
%typemap(argout) TYPE** NAME {
  $result = kvarn_py_append_output($result, SWIG_NewPointerObj(tmp$argnum, DESCRIPTOR, 0));
}
%enddef
KVARN_OUT_HANDLE(kvarn_context_t, out_context, SWIGTYPE_p_kvarn_context)
KVARN_OUT_HANDLE(kvarn_cache_t, out_cache, SWIGTYPE_p_kvarn_cache)
KVARN_OUT_HANDLE(kvarn_attention_plan_t, out_plan, SWIGTYPE_p_kvarn_attention_plan)

%define KVARN_OUT_VALUE(TYPE, NAME, CONVERT)
%typemap(in, numinputs=0) TYPE* NAME (TYPE tmp = 0) { $1 = &tmp; }
%typemap(argout) TYPE* NAME { $result = kvarn_py_append_output($result, CONVERT(tmp$argnum)); }
%enddef
KVARN_OUT_VALUE(kvarn_backend_t, out_backend, PyLong_FromLong)
KVARN_OUT_VALUE(kvarn_cpu_isa_t, out_isa, PyLong_FromLong)
KVARN_OUT_VALUE(int32_t, out_device, PyLong_FromLong)
KVARN_OUT_VALUE(int32_t, out_threads, PyLong_FromLong)
KVARN_OUT_VALUE(size_t, out_bytes, PyLong_FromSize_t)
KVARN_OUT_VALUE(size_t, out_offset, PyLong_FromSize_t)
KVARN_OUT_VALUE(int64_t, out_tokens, PyLong_FromLongLong)
KVARN_OUT_VALUE(int64_t, out_committed, PyLong_FromLongLong)

/* kvarn_attention_plan_kernel: a str (a static string of the library). */
%typemap(in, numinputs=0) const char** out_name (const char* tmp = NULL) { $1 = ($1_ltype)&tmp; }
%typemap(argout) const char** out_name {
  $result = kvarn_py_append_output($result, PyUnicode_FromString(tmp$argnum ? tmp$argnum : ""));
}

/* kvarn_context_error_word: the word's address as an integer (context memory). */
%typemap(in, numinputs=0) const int32_t** out_word (const int32_t* tmp = NULL) { $1 = ($1_ltype)&tmp; }
%typemap(argout) const int32_t** out_word {
  $result = kvarn_py_append_output($result, PyLong_FromVoidPtr((void*)tmp$argnum));
}

/* kvarn_memory_alloc: the address as an integer. */
%typemap(in, numinputs=0) void** out_ptr (void* tmp = NULL) { $1 = &tmp; }
%typemap(argout) void** out_ptr {
  $result = kvarn_py_append_output($result, PyLong_FromVoidPtr(tmp$argnum));
}

/* kvarn_cpu_features: a str. */
%typemap(in, numinputs=0) (char* buf, size_t buf_bytes) (char tmp[4096]) {
  tmp[0] = '\0';
  $1 = tmp;
  $2 = sizeof(tmp);
}
%typemap(argout) (char* buf, size_t buf_bytes) {
  $result = kvarn_py_append_output($result, PyUnicode_FromString(tmp$argnum));
}

/* Structs the library fills: created here with their size field set, returned as new objects. */
%define KVARN_OUT_STRUCT(TYPE, NAME, DESCRIPTOR)
%typemap(in, numinputs=0) TYPE* NAME (TYPE* tmp = NULL) {
  tmp = (TYPE*)calloc(1, sizeof(TYPE));
  if (tmp == NULL) { PyErr_NoMemory(); SWIG_fail; }
  tmp->size = sizeof(TYPE);
  $1 = tmp;
}
%typemap(argout) TYPE* NAME {
  $result = kvarn_py_append_output($result, SWIG_NewPointerObj(tmp$argnum, DESCRIPTOR,
                                                                 SWIG_POINTER_OWN));
  tmp$argnum = NULL;
}
%typemap(freearg) TYPE* NAME { free(tmp$argnum); }
%enddef
KVARN_OUT_STRUCT(kvarn_backend_info_t, info, SWIGTYPE_p_kvarn_backend_info)
KVARN_OUT_STRUCT(kvarn_cache_stats_t, stats, SWIGTYPE_p_kvarn_cache_stats)

/* Calls that touch Python objects keep the GIL. */
%nothread _set_error_factory;
%nothread _dlpack_unpack;

%include "../swig/kvarn.i"

/* The experimental entry points (ablation flags, baseline quantizers, the tail state) the
 * package exposes as kvarn.ABLATE_*, kvarn.baseline_roundtrip and kvarn.TailState & co:
 * kvarn/kvarn_experimental.h, outside the stability promises of kvarn.h. */
%{
#include "kvarn/kvarn_experimental.h"
%}
%include "kvarn/kvarn_experimental.h"

/* ---- helpers for the package ------------------------------------------------------------------ */
%inline %{
/* Registers callable(status, message) -> exception instance; None unregisters. */
static PyObject* _set_error_factory(PyObject* factory) {
  Py_XDECREF(kvarn_py_error_factory);
  kvarn_py_error_factory = NULL;
  if (factory != Py_None) {
    Py_INCREF(factory);
    kvarn_py_error_factory = factory;
  }
  Py_RETURN_NONE;
}
%}

%{
/* DLPack (https://dmlc.github.io/dlpack/latest/c_api.html), ABI-stable structs. */
typedef struct {
  int32_t device_type;
  int32_t device_id;
} kvarn_DLDevice;
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} kvarn_DLDataType;
typedef struct {
  void* data;
  kvarn_DLDevice device;
  int32_t ndim;
  kvarn_DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} kvarn_DLTensor;
typedef struct kvarn_DLManagedTensor {
  kvarn_DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct kvarn_DLManagedTensor* self);
} kvarn_DLManagedTensor;
typedef struct {
  uint32_t major;
  uint32_t minor;
} kvarn_DLPackVersion;
typedef struct kvarn_DLManagedTensorVersioned {
  kvarn_DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct kvarn_DLManagedTensorVersioned* self);
  uint64_t flags;
  kvarn_DLTensor dl_tensor;
} kvarn_DLManagedTensorVersioned;

static void kvarn_py_release_legacy(PyObject* owner) {
  kvarn_DLManagedTensor* m =
      (kvarn_DLManagedTensor*)PyCapsule_GetPointer(owner, "kvarn.dltensor_owner");
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}
static void kvarn_py_release_versioned(PyObject* owner) {
  kvarn_DLManagedTensorVersioned* m = (kvarn_DLManagedTensorVersioned*)PyCapsule_GetPointer(
      owner, "kvarn.dltensor_versioned_owner");
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}
%}

%inline %{
/* Consumes a DLPack capsule ("dltensor" or "dltensor_versioned"; it is renamed "used_..." as the
 * protocol asks) and returns (owner, address, device_type, device_id, (code, bits, lanes), shape,
 * strides or None, read_only). address includes byte_offset. The tensor lives as long as `owner`
 * (a capsule that calls the producer's deleter when collected). */
static PyObject* _dlpack_unpack(PyObject* capsule) {
  kvarn_DLTensor* t = NULL;
  PyObject* owner = NULL;
  int read_only = 0;
  if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
    kvarn_DLManagedTensorVersioned* m =
        (kvarn_DLManagedTensorVersioned*)PyCapsule_GetPointer(capsule, "dltensor_versioned");
    if (m->version.major != 1) {
      PyErr_Format(PyExc_BufferError, "kvarn: unsupported DLPack major version %u",
                   (unsigned)m->version.major);
      return NULL;
    }
    owner = PyCapsule_New(m, "kvarn.dltensor_versioned_owner", kvarn_py_release_versioned);
    if (owner == NULL) return NULL;
    PyCapsule_SetName(capsule, "used_dltensor_versioned");
    t = &m->dl_tensor;
    read_only = (m->flags & 1u) != 0;
  } else if (PyCapsule_IsValid(capsule, "dltensor")) {
    kvarn_DLManagedTensor* m = (kvarn_DLManagedTensor*)PyCapsule_GetPointer(capsule, "dltensor");
    owner = PyCapsule_New(m, "kvarn.dltensor_owner", kvarn_py_release_legacy);
    if (owner == NULL) return NULL;
    PyCapsule_SetName(capsule, "used_dltensor");
    t = &m->dl_tensor;
  } else {
    PyErr_SetString(PyExc_TypeError,
                    "kvarn: expected an unused DLPack capsule (\"dltensor\" or "
                    "\"dltensor_versioned\")");
    return NULL;
  }
  PyObject* shape = PyTuple_New(t->ndim);
  if (shape == NULL) { Py_DECREF(owner); return NULL; }
  for (int32_t i = 0; i < t->ndim; ++i) {
    PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(t->shape[i]));
  }
  PyObject* strides = NULL;
  if (t->strides != NULL) {
    strides = PyTuple_New(t->ndim);
    if (strides == NULL) { Py_DECREF(owner); Py_DECREF(shape); return NULL; }
    for (int32_t i = 0; i < t->ndim; ++i) {
      PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(t->strides[i]));
    }
  } else {
    Py_INCREF(Py_None);
    strides = Py_None;
  }
  PyObject* address = PyLong_FromUnsignedLongLong(
      (unsigned long long)((uintptr_t)t->data + (uintptr_t)t->byte_offset));
  PyObject* result = Py_BuildValue("(NNii(iii)NNO)", owner, address, (int)t->device.device_type,
                                   (int)t->device.device_id, (int)t->dtype.code,
                                   (int)t->dtype.bits, (int)t->dtype.lanes, shape, strides,
                                   read_only ? Py_True : Py_False);
  return result;
}
%}
