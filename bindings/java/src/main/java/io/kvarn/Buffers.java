/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import io.kvarn.internal.KvarnNative;
import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.ShortBuffer;

/**
 * Checks of the NIO buffers handed to the C API, made before any C call so that no buffer
 * can make the C code read or write outside it: direct, native byte order, element type matching
 * the dtype, aligned to the element size, writable for outputs, and enough elements remaining
 * after its position. The buffer passed on is a slice starting at the position (the JNI layer
 * takes the base address of what it gets); positions are never moved.
 */
final class Buffers {
  private Buffers() {}

  static KvarnException invalid(String message) {
    return new KvarnException(Status.INVALID_ARGUMENT, message);
  }

  /** The dtype a typed buffer implies: FloatBuffer F32, ShortBuffer F16; else the caller's. */
  static DType infer(Buffer b, String name) {
    if (b instanceof FloatBuffer) return DType.F32;
    if (b instanceof ShortBuffer) return DType.F16;
    if (b == null) throw invalid(name + " is null");
    throw invalid(name + ": cannot tell the dtype of a " + b.getClass().getSimpleName()
        + "; use a FloatBuffer (f32), a ShortBuffer (f16) or pass a DType");
  }

  /** Remaining elements of dtype in b (ByteBuffer: whole elements of its remaining bytes). */
  static long elements(Buffer b, DType dtype) {
    if (b instanceof ByteBuffer) return b.remaining() / dtype.size();
    return b.remaining();
  }

  /** A typed tensor of `elements` elements of dtype: input or output. */
  static Buffer tensor(Buffer b, String name, DType dtype, long elements, boolean output) {
    if (b == null) throw invalid(name + " is null");
    if (dtype == null) throw invalid(name + ": the dtype is null");
    if (b instanceof FloatBuffer) {
      if (dtype != DType.F32) {
        throw invalid(name + ": a FloatBuffer holds f32 data, not " + lower(dtype));
      }
      if (((FloatBuffer) b).order() != ByteOrder.nativeOrder()) throw order(name);
    } else if (b instanceof ShortBuffer) {
      if (dtype == DType.F32) throw invalid(name + ": a ShortBuffer holds f16/bf16 data, not f32");
      if (((ShortBuffer) b).order() != ByteOrder.nativeOrder()) throw order(name);
    } else if (b instanceof ByteBuffer) {
      if (((ByteBuffer) b).order() != ByteOrder.nativeOrder()) throw order(name);
    } else {
      throw invalid(name + ": a " + b.getClass().getSimpleName()
          + " cannot hold tensor data (use a ByteBuffer, ShortBuffer or FloatBuffer)");
    }
    common(b, name, output);
    long have = elements(b, dtype);
    if (have < elements) {
      throw new KvarnException(output ? Status.BUFFER_TOO_SMALL : Status.INVALID_ARGUMENT,
          name + ": needs " + elements + " " + lower(dtype) + " elements, the buffer has " + have
          + " remaining");
    }
    Buffer view = view(b);
    if (KvarnNative.buffer_address(view) % dtype.size() != 0) {
      throw invalid(name + ": the data is not aligned to " + dtype.size() + " bytes");
    }
    return view;
  }

  /** Opaque bytes (records, blobs): any byte order. */
  static ByteBuffer bytes(ByteBuffer b, String name, long bytes, boolean output) {
    if (b == null) throw invalid(name + " is null");
    common(b, name, output);
    if (b.remaining() < bytes) {
      throw new KvarnException(output ? Status.BUFFER_TOO_SMALL : Status.INVALID_ARGUMENT,
          name + ": needs " + bytes + " bytes, the buffer has " + b.remaining() + " remaining");
    }
    return (ByteBuffer) view(b);
  }

  private static void common(Buffer b, String name, boolean output) {
    if (!b.isDirect()) {
      throw invalid(name + ": a heap buffer; pass a direct buffer "
          + "(ByteBuffer.allocateDirect(n).order(ByteOrder.nativeOrder()))");
    }
    if (output && b.isReadOnly()) throw invalid(name + ": the output buffer is read-only");
  }

  private static Buffer view(Buffer b) {
    return b.position() == 0 ? b : b.slice();
  }

  private static KvarnException order(String name) {
    return invalid(name + ": the buffer is not in the native byte order ("
        + ByteOrder.nativeOrder() + "); use .order(ByteOrder.nativeOrder())");
  }

  static String lower(DType dtype) {
    return dtype.name().toLowerCase(java.util.Locale.ROOT);
  }

  /** The product of element counts; INVALID_ARGUMENT when it overflows a long. */
  static long product(String what, long a, long b, long c) {
    try {
      return Math.multiplyExact(Math.multiplyExact(a, b), c);
    } catch (ArithmeticException e) {
      throw invalid(what + ": the element count overflows");
    }
  }

  /** A new direct buffer of n bytes in native order. */
  static ByteBuffer allocate(long bytes) {
    if (bytes > Integer.MAX_VALUE) {
      throw new KvarnException(Status.OUT_OF_MEMORY, bytes + " bytes do not fit one NIO buffer");
    }
    return ByteBuffer.allocateDirect((int) bytes).order(ByteOrder.nativeOrder());
  }
}
