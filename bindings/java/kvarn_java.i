/*
 * kvarn_java.i - the Java specifics of the SWIG/JNI layer io.kvarn.internal.KvarnNative.
 *
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 *
 * The raw layer under the hand-written package io.kvarn (bindings/java/src/main/java): every
 * kvarn_* function of kvarn.h with the prefix dropped, as static methods of KvarnNative. On top
 * of the shared policy of ../swig/kvarn.i:
 *   - a failing status throws io.kvarn.KvarnException(status, kvarn_last_error()) from the JNI
 *     wrapper; a kvarn_status_t result is `void` in Java;
 *   - enums are int constants (the package io.kvarn has the Java enums);
 *   - handles (kvarn_context_t*, kvarn_cache_t*) are `long` addresses, 0 = NULL; a handle
 *     out-parameter is a long[] of at least one element;
 *   - memory arguments (void*, const void*, float*) are java.nio.Buffer: null = NULL, a direct
 *     buffer = its base address (position ignored: the package passes slices), anything else
 *     throws IllegalArgumentException before the C call. This layer does not know how many bytes
 *     the C call will touch: io.kvarn checks sizes, dtypes and byte order before calling;
 *   - host id arrays (seq_ids, token_indptr, src_pages, dst_blocks) are long[] / int[];
 *   - scalar out-parameters are one-element arrays (int[], long[], String[]) written on success;
 *   - structs the library fills or reads (config, options, params, stats, backend info) are SWIG
 *     proxy classes whose constructor sets the size field (and the defaults where C has them).
 */
%module(jniclassname="KvarnNativeJNI") KvarnNative

%{
#include <jni.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kvarn/kvarn.h"

/* Throws io.kvarn.KvarnException(status, message) with this thread's kvarn_last_error(). */
static void kvarn_java_throw(JNIEnv* jenv, kvarn_status_t status) {
  const char* detail = kvarn_last_error();
  jclass cls;
  jmethodID ctor;
  jstring message;
  jobject exc;
  if ((*jenv)->ExceptionCheck(jenv)) return;
  cls = (*jenv)->FindClass(jenv, "io/kvarn/KvarnException");
  if (cls == NULL) return; /* NoClassDefFoundError pending */
  ctor = (*jenv)->GetMethodID(jenv, cls, "<init>", "(ILjava/lang/String;)V");
  if (ctor == NULL) return;
  message = (*jenv)->NewStringUTF(jenv, detail);
  if (message == NULL) return;
  exc = (*jenv)->NewObject(jenv, cls, ctor, (jint)status, message);
  if (exc != NULL) (*jenv)->Throw(jenv, (jthrowable)exc);
}

static void kvarn_java_illegal_argument(JNIEnv* jenv, const char* message) {
  jclass cls = (*jenv)->FindClass(jenv, "java/lang/IllegalArgumentException");
  if (cls != NULL) (*jenv)->ThrowNew(jenv, cls, message);
}

/* A memory argument: null -> NULL, a direct buffer -> its address; 0 with an exception pending
 * for anything else. */
static int kvarn_java_buffer(JNIEnv* jenv, jobject buffer, void** ptr) {
  *ptr = NULL;
  if (buffer == NULL) return 1;
  *ptr = (*jenv)->GetDirectBufferAddress(jenv, buffer);
  if (*ptr == NULL) {
    kvarn_java_illegal_argument(jenv, "kvarn: expected a direct NIO buffer (ByteBuffer."
                                      "allocateDirect), got a heap buffer");
    return 0;
  }
  return 1;
}

/* An out-parameter array must hold at least one element. */
static int kvarn_java_out_array(JNIEnv* jenv, jarray array) {
  if (array == NULL || (*jenv)->GetArrayLength(jenv, array) < 1) {
    kvarn_java_illegal_argument(jenv, "kvarn: an out-parameter array needs one element");
    return 0;
  }
  return 1;
}
%}

/* The native library is loaded (System.loadLibrary, else from the jar) before any native call. */
%pragma(java) jniclasscode=%{
  static {
    NativeLoader.load();
  }
%}
/* The JNI class is used by KvarnNative and the proxies only. */
%pragma(java) jniclassclassmodifiers="final class"
%pragma(java) moduleclassmodifiers="public final class"

%include <enumtypeunsafe.swg>
%javaconst(1);
/* Unsigned #define constants (1u) are not Java literals: read them through JNI. */
%javaconst(0) KVARN_CODEC_DEFAULT;
%javaconst(0) KVARN_CODEC_CACHE_FRAME;
%javaconst(0) KVARN_ABLATE_NONE;             /* kvarn_experimental.h */
%javaconst(0) KVARN_ABLATE_NO_ROTATION;      /* kvarn_experimental.h */
%javaconst(0) KVARN_ABLATE_NO_NORMALIZATION; /* kvarn_experimental.h */
%javaconst(0) KVARN_APPEND_DEFAULT;
%javaconst(0) KVARN_APPEND_SPECULATIVE;
%javaconst(0) KVARN_VERSION_NUMBER;

/* ---- statuses ----------------------------------------------------------------------------- */
%define KVARN_SWIG_RAISE(status)
  kvarn_java_throw(jenv, status);
%enddef
%define KVARN_SWIG_OK_RESULT
%enddef
/* void in Java: the wrapper returns nothing; argout typemaps write only when result is OK and
 * freearg typemaps still run after a throw (the exception is pending, not a longjmp). */
%typemap(jni) kvarn_status_t "void"
%typemap(jtype) kvarn_status_t "void"
%typemap(jstype) kvarn_status_t "void"
%typemap(javaout) kvarn_status_t { $jnicall; }
/* kvarn_status_string takes a status: a plain int. */
%typemap(jni) kvarn_status_t status "jint"
%typemap(jtype) kvarn_status_t status "int"
%typemap(jstype) kvarn_status_t status "int"
%typemap(javain) kvarn_status_t status "$javainput"
%typemap(in) kvarn_status_t status "$1 = (kvarn_status_t)$input;"

/* ---- handles as long -------------------------------------------------------------------------- */
%define KVARN_JAVA_HANDLE(TYPE)
%typemap(jni) TYPE*, const TYPE* "jlong"
%typemap(jtype) TYPE*, const TYPE* "long"
%typemap(jstype) TYPE*, const TYPE* "long"
%typemap(javain) TYPE*, const TYPE* "$javainput"
%typemap(in) TYPE*, const TYPE* "$1 = ($1_ltype)(intptr_t)$input;"
%typemap(jni) TYPE** "jlongArray"
%typemap(jtype) TYPE** "long[]"
%typemap(jstype) TYPE** "long[]"
%typemap(javain) TYPE** "$javainput"
%typemap(in) TYPE** (TYPE* tmp = NULL) {
  if (!kvarn_java_out_array(jenv, $input)) return $null;
  $1 = &tmp;
}
%typemap(argout) TYPE** {
  if (result == KVARN_OK) {
    jlong value = (jlong)(intptr_t)tmp$argnum;
    (*jenv)->SetLongArrayRegion(jenv, $input, 0, 1, &value);
  }
}
%enddef
KVARN_JAVA_HANDLE(kvarn_context_t)
KVARN_JAVA_HANDLE(kvarn_cache_t)
KVARN_JAVA_HANDLE(kvarn_attention_plan_t)

/* ---- memory arguments as direct buffers ------------------------------------------------------- */
%typemap(jni) void*, const void* "jobject"
%typemap(jtype) void*, const void* "java.nio.Buffer"
%typemap(jstype) void*, const void* "java.nio.Buffer"
%typemap(javain) void*, const void* "$javainput"
%typemap(in) void*, const void* {
  if (!kvarn_java_buffer(jenv, $input, (void**)&$1)) return $null;
}
%apply void* { float* out, float* lse };
%apply const void* { const float* in };
/* The capturable layer 2 (plan / run): int32 arrays in the context's memory, as direct buffers
 * (host memory of a CPU context). The run calls whose parameter names clash with the host id
 * arrays above (token_indptr, src_pages, dst_blocks) are wrapped below with buffer parameters. */
%apply const void* { const int32_t* slot_mapping, const int32_t* n_tiles,
                     const int32_t* tile_seqs, const int32_t* q_indptr };
%ignore kvarn_paged_append_run;
%ignore kvarn_paged_flush_run;
/* The error word serves engines on GPU contexts; the Java binding runs CPU contexts, whose calls
 * return every error themselves. */
%ignore kvarn_context_error_word;

/* ---- host id arrays ----------------------------------------------------------------------- */
%define KVARN_JAVA_IN_ARRAY(CTYPE, NAME, JARRAY, JTYPE, GET, RELEASE, JELEM)
%typemap(jni) const CTYPE* NAME "JARRAY"
%typemap(jtype) const CTYPE* NAME "JTYPE[]"
%typemap(jstype) const CTYPE* NAME "JTYPE[]"
%typemap(javain) const CTYPE* NAME "$javainput"
/* Acquired in the check phase, after every argument's in typemap: an in typemap that throws
 * (a heap buffer) returns before any array is held, so nothing leaks. */
%typemap(in) const CTYPE* NAME "$1 = NULL;"
%typemap(check) const CTYPE* NAME {
  if ($input != NULL) {
    $1 = (CTYPE*)(*jenv)->GET(jenv, $input, NULL);
    if ($1 == NULL) return $null; /* OutOfMemoryError pending */
  }
}
%typemap(freearg) const CTYPE* NAME {
  if ($1 != NULL) (*jenv)->RELEASE(jenv, $input, (JELEM*)$1, JNI_ABORT);
}
%enddef
KVARN_JAVA_IN_ARRAY(int64_t, seq_ids, jlongArray, long, GetLongArrayElements,
                    ReleaseLongArrayElements, jlong)
KVARN_JAVA_IN_ARRAY(int32_t, token_indptr, jintArray, int, GetIntArrayElements,
                    ReleaseIntArrayElements, jint)
KVARN_JAVA_IN_ARRAY(int32_t, src_pages, jintArray, int, GetIntArrayElements,
                    ReleaseIntArrayElements, jint)
KVARN_JAVA_IN_ARRAY(int32_t, dst_blocks, jintArray, int, GetIntArrayElements,
                    ReleaseIntArrayElements, jint)

/* ---- scalar out-parameters as one-element arrays ------------------------------------------ */
%define KVARN_JAVA_OUT(CTYPE, NAME, JARRAY, JTYPE, JELEM, SET)
%typemap(jni) CTYPE* NAME "JARRAY"
%typemap(jtype) CTYPE* NAME "JTYPE[]"
%typemap(jstype) CTYPE* NAME "JTYPE[]"
%typemap(javain) CTYPE* NAME "$javainput"
%typemap(in) CTYPE* NAME (CTYPE tmp) {
  if (!kvarn_java_out_array(jenv, $input)) return $null;
  memset(&tmp, 0, sizeof(tmp));
  $1 = &tmp;
}
%typemap(argout) CTYPE* NAME {
  if (result == KVARN_OK) {
    JELEM value = (JELEM)tmp$argnum;
    (*jenv)->SET(jenv, $input, 0, 1, &value);
  }
}
%enddef
KVARN_JAVA_OUT(kvarn_backend_t, out_backend, jintArray, int, jint, SetIntArrayRegion)
KVARN_JAVA_OUT(kvarn_cpu_isa_t, out_isa, jintArray, int, jint, SetIntArrayRegion)
KVARN_JAVA_OUT(int32_t, out_device, jintArray, int, jint, SetIntArrayRegion)
KVARN_JAVA_OUT(int32_t, out_threads, jintArray, int, jint, SetIntArrayRegion)
KVARN_JAVA_OUT(size_t, out_bytes, jlongArray, long, jlong, SetLongArrayRegion)
KVARN_JAVA_OUT(size_t, out_offset, jlongArray, long, jlong, SetLongArrayRegion)
KVARN_JAVA_OUT(int64_t, out_tokens, jlongArray, long, jlong, SetLongArrayRegion)
KVARN_JAVA_OUT(int64_t, out_committed, jlongArray, long, jlong, SetLongArrayRegion)
KVARN_JAVA_OUT(void*, out_ptr, jlongArray, long, jlong, SetLongArrayRegion)

/* kvarn_cpu_features: a String[1]. */
%typemap(jni) (char* buf, size_t buf_bytes) "jobjectArray"
%typemap(jtype) (char* buf, size_t buf_bytes) "String[]"
%typemap(jstype) (char* buf, size_t buf_bytes) "String[]"
%typemap(javain) (char* buf, size_t buf_bytes) "$javainput"
%typemap(in) (char* buf, size_t buf_bytes) (char tmp[4096]) {
  if (!kvarn_java_out_array(jenv, $input)) return $null;
  tmp[0] = '\0';
  $1 = tmp;
  $2 = sizeof(tmp);
}
%typemap(argout) (char* buf, size_t buf_bytes) {
  if (result == KVARN_OK) {
    jstring text = (*jenv)->NewStringUTF(jenv, tmp$argnum);
    if (text != NULL) (*jenv)->SetObjectArrayElement(jenv, $input, 0, text);
  }
}

/* kvarn_attention_plan_kernel: a String[1] (the name is a static string). */
%typemap(jni) const char** out_name "jobjectArray"
%typemap(jtype) const char** out_name "String[]"
%typemap(jstype) const char** out_name "String[]"
%typemap(javain) const char** out_name "$javainput"
%typemap(in) const char** out_name (const char* tmp = NULL) {
  if (!kvarn_java_out_array(jenv, $input)) return $null;
  $1 = ($1_ltype)&tmp; /* SWIG declares the argument without its const */
}
%typemap(argout) const char** out_name {
  if (result == KVARN_OK && tmp$argnum != NULL) {
    jstring text = (*jenv)->NewStringUTF(jenv, tmp$argnum);
    if (text != NULL) (*jenv)->SetObjectArrayElement(jenv, $input, 0, text);
  }
}

/* size_t and the addresses of the set_* extensions are Java long (no BigInteger). With
 * SWIGWORDSIZE64 (LP64, as the C compiler sees int64_t) int64_t is C `long`, which SWIG maps to a
 * Java int: keep it a Java long. */
%apply long long { size_t };
%apply long long { int64_t };
%apply long long { unsigned long long };

/* ---- structs: constructors set the size field and the C defaults --------------------------- */
/* Proxy classes get CamelCase names (the shared prefix-dropping rename would give `config`, which
 * a parameter named config shadows in the generated Java). */
%rename(NativeConfig) kvarn_config;
%rename(NativeContextOptions) kvarn_context_options;
%rename(NativeCacheOptions) kvarn_cache_options;
%rename(NativeAttentionParams) kvarn_attention_params;
%rename(NativePagedKv) kvarn_paged_kv;
%rename(NativeBackendInfo) kvarn_backend_info;
%rename(NativeCacheStats) kvarn_cache_stats;
%rename(NativeLaunch) kvarn_launch;
%rename(NativeAttentionShape) kvarn_attention_shape;
%define KVARN_JAVA_STRUCT(TAG, TYPE, INIT)
%extend TAG {
  TAG() {
    TYPE* self = (TYPE*)calloc(1, sizeof(TYPE));
    if (self != NULL) {
      self->size = sizeof(TYPE);
      INIT
    }
    return self;
  }
  ~TAG() { free($self); }
}
%ignore TAG::size;
%enddef
KVARN_JAVA_STRUCT(kvarn_config, kvarn_config_t, kvarn_config_defaults(self);)
KVARN_JAVA_STRUCT(kvarn_context_options, kvarn_context_options_t,
                  kvarn_context_options_defaults(self);)
KVARN_JAVA_STRUCT(kvarn_cache_options, kvarn_cache_options_t, kvarn_cache_options_defaults(self);)
KVARN_JAVA_STRUCT(kvarn_attention_params, kvarn_attention_params_t,
                  kvarn_attention_params_defaults(self);)
KVARN_JAVA_STRUCT(kvarn_paged_kv, kvarn_paged_kv_t, kvarn_paged_kv_defaults(self);)
KVARN_JAVA_STRUCT(kvarn_backend_info, kvarn_backend_info_t, )
KVARN_JAVA_STRUCT(kvarn_cache_stats, kvarn_cache_stats_t, )
KVARN_JAVA_STRUCT(kvarn_launch, kvarn_launch_t, kvarn_launch_defaults(self);)
KVARN_JAVA_STRUCT(kvarn_attention_shape, kvarn_attention_shape_t,
                  kvarn_attention_shape_defaults(self);)
/* The stream is a device stream address; set through set_stream. */
%ignore kvarn_context_options::stream;

%include "../swig/kvarn.i"

/* The experimental entry points (ablation flags, baseline quantizers: Config.ABLATE_*,
 * KvarnNative.baseline_roundtrip for the self-test): kvarn/kvarn_experimental.h, outside the
 * stability promises of kvarn.h. */
%{
#include "kvarn/kvarn_experimental.h"
%}
/* The tail state (experimental; CPU and CUDA) is not in the Java binding yet: Python and Rust
 * have it. */
%ignore kvarn_tail_state;
%ignore kvarn_tail_state_defaults;
%ignore kvarn_tail_state_bytes;
%ignore kvarn_paged_append_tail_run;
%ignore kvarn_paged_flush_tail_workspace_size;
%ignore kvarn_paged_flush_tail_run;
%ignore kvarn_paged_append_flush_tail_workspace_size;
%ignore kvarn_paged_append_flush_tail_run;
%ignore kvarn_paged_attention_tail_run;
%include "kvarn/kvarn_experimental.h"

/* kvarn_paged_append_run / kvarn_paged_flush_run with every array a direct buffer (context
 * memory), under their usual names. */
%rename(paged_append_run) kvarn_java_paged_append_run;
%rename(paged_flush_run) kvarn_java_paged_flush_run;
%inline %{
static kvarn_status_t kvarn_java_paged_append_run(kvarn_context_t* context,
                                                  const kvarn_config_t* config,
                                                  const kvarn_paged_kv_t* kv,
                                                  const kvarn_launch_t* launch,
                                                  const void* token_indptr_buffer,
                                                  const void* slot_mapping_buffer,
                                                  size_t max_tokens, kvarn_dtype_t dtype,
                                                  const void* k, const void* v) {
  return kvarn_paged_append_run(context, config, kv, launch, (const int32_t*)token_indptr_buffer,
                                (const int32_t*)slot_mapping_buffer, max_tokens, dtype, k, v);
}
static kvarn_status_t kvarn_java_paged_flush_run(kvarn_context_t* context,
                                                 const kvarn_config_t* config,
                                                 const kvarn_paged_kv_t* kv,
                                                 const kvarn_launch_t* launch, size_t max_tiles,
                                                 const void* n_tiles_buffer,
                                                 const void* src_pages_buffer,
                                                 const void* dst_blocks_buffer,
                                                 const void* tile_seqs_buffer) {
  return kvarn_paged_flush_run(context, config, kv, launch, max_tiles,
                               (const int32_t*)n_tiles_buffer, (const int32_t*)src_pages_buffer,
                               (const int32_t*)dst_blocks_buffer,
                               (const int32_t*)tile_seqs_buffer);
}
%}

%extend kvarn_context_options {
  /* A cudaStream_t / hipStream_t as an integer address; 0 = the default stream. */
  void set_stream(long long stream) { $self->stream = (void*)(intptr_t)stream; }
}

/* The address of a direct buffer (for the paged layer's set_pointers); 0 for null. */
%typemap(jni) jobject buffer "jobject"
%typemap(jtype) jobject buffer "java.nio.Buffer"
%typemap(jstype) jobject buffer "java.nio.Buffer"
%typemap(javain) jobject buffer "$javainput"
%typemap(in) jobject buffer "$1 = $input;"
%native(buffer_address) long long buffer_address(jobject buffer);
%{
SWIGEXPORT jlong JNICALL Java_io_kvarn_internal_KvarnNativeJNI_buffer_1address(JNIEnv* jenv,
                                                                               jclass jcls,
                                                                               jobject buffer) {
  void* ptr = NULL;
  (void)jcls;
  if (!kvarn_java_buffer(jenv, buffer, &ptr)) return 0;
  return (jlong)(intptr_t)ptr;
}
%}
