/*
 * kvarn.i - the SWIG interface shared by every libkvarn binding (Python, Java).
 *
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 *
 * SWIG wraps the public C API (kvarn/kvarn.h) only, never the C++ core. This file holds the
 * policy every language shares:
 *   - names lose the kvarn_ / KVARN_ prefix (kvarn_quantize -> quantize, KVARN_OK -> OK);
 *   - a kvarn_status_t result never reaches the caller: KVARN_OK becomes "no result" and any
 *     other status becomes the language's exception, carrying the status and kvarn_last_error();
 *   - out-parameters become results (a handle, a size, a tuple of them);
 *   - option structs are created with their size field set (the *_defaults() functions do it);
 *   - raw pointer members of structs are not settable from the target language (a binding sets
 *     them through the set_* extensions below with integer addresses it keeps alive itself).
 *
 * The including language file defines, before %include-ing this file:
 *   KVARN_SWIG_RAISE(status)   statements that raise the exception for a failing status and
 *                              leave the wrapper (the message is kvarn_last_error());
 *   KVARN_SWIG_OK_RESULT       the statement that sets $result for KVARN_OK;
 * and its own typemaps for memory arguments (void*, const void*, typed arrays) and for the
 * out-parameter conversions (see bindings/python/kvarn_python.i).
 */

%{
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kvarn/kvarn.h"
%}

%include <stdint.i>

/* ---- names ---------------------------------------------------------------------------------- */
%rename("%(regex:/^(kvarn_|KVARN_)(.*)$/\\2/)s") "";

/* Enum sentinels pin enum sizes in C; they are not values. */
%ignore KVARN_STATUS_SENTINEL_;
%ignore KVARN_DTYPE_SENTINEL_;
%ignore KVARN_BACKEND_SENTINEL_;
%ignore KVARN_CPU_ISA_SENTINEL_;
%ignore KVARN_COPY_SENTINEL_;
%ignore KVARN_INDEX_SENTINEL_;
%ignore KVARN_ATTENTION_MODE_SENTINEL_;
%ignore KVARN_FIELD_SENTINEL_;
%ignore KVARN_BASELINE_SENTINEL_;
%ignore KVARN_API;

/* ---- statuses become exceptions --------------------------------------------------------- */
%typemap(out) kvarn_status_t {
  if ($1 != KVARN_OK) {
    KVARN_SWIG_RAISE($1)
  }
  KVARN_SWIG_OK_RESULT
}

/* ---- structs: read-only strings, pointer members through set_* ------------------------------ */
%immutable kvarn_backend_info::name;
%immutable kvarn_backend_info::reason;

%ignore kvarn_paged_kv::records;
%ignore kvarn_paged_kv::k_pages;
%ignore kvarn_paged_kv::v_pages;
%ignore kvarn_paged_kv::block_table;
%ignore kvarn_paged_kv::seq_lens;
%ignore kvarn_paged_kv::record_tiles;
%ignore kvarn_attention_params::q_indptr;
%ignore kvarn_attention_params::sinks;
%ignore kvarn_launch::stream;
%ignore kvarn_launch::seq_status;
%ignore kvarn_launch::workspace;

%include "kvarn/kvarn.h"

/* kvarn_experimental.h's tail state (for the languages that %include that header): its pointer
 * members through set_pointers, as for the launch. */
%ignore kvarn_tail_state::states;
%ignore kvarn_tail_state::slots;
%extend kvarn_tail_state {
  void set_pointers(unsigned long long states, unsigned long long slots) {
    $self->states = (void*)(uintptr_t)states;
    $self->slots = (const int32_t*)(uintptr_t)slots;
  }
}

/* Integer addresses (host or device memory of the context) for the pointer members. The caller
 * keeps the memory alive while the struct is used. */
%extend kvarn_paged_kv {
  void set_pointers(unsigned long long records, unsigned long long k_pages,
                    unsigned long long v_pages, unsigned long long block_table,
                    unsigned long long seq_lens, unsigned long long record_tiles) {
    $self->records = (void*)(uintptr_t)records;
    $self->k_pages = (void*)(uintptr_t)k_pages;
    $self->v_pages = (void*)(uintptr_t)v_pages;
    $self->block_table = (const int32_t*)(uintptr_t)block_table;
    $self->seq_lens = (const int32_t*)(uintptr_t)seq_lens;
    $self->record_tiles = (const int32_t*)(uintptr_t)record_tiles;
  }
}
%extend kvarn_attention_params {
  /* 0 = NULL (decode). */
  void set_q_indptr(unsigned long long q_indptr) {
    $self->q_indptr = (const int32_t*)(uintptr_t)q_indptr;
  }
  /* 0 = NULL (no sink logits); else fp32 [Hq] in the context's memory. */
  void set_sinks(unsigned long long sinks) {
    $self->sinks = (const float*)(uintptr_t)sinks;
  }
}
%extend kvarn_launch {
  /* The capturable layer 2's launch: a cudaStream_t / hipStream_t (0 = the context's stream),
   * the int32 [batch] per-sequence status array and the workspace, all as integer addresses
   * (0 = NULL). workspace_bytes is an ordinary member. */
  void set_pointers(unsigned long long stream, unsigned long long seq_status,
                    unsigned long long workspace) {
    $self->stream = (void*)(uintptr_t)stream;
    $self->seq_status = (int32_t*)(uintptr_t)seq_status;
    $self->workspace = (void*)(uintptr_t)workspace;
  }
}
