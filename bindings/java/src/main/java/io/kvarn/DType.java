/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

/**
 * Element types of tensors ({@code kvarn_dtype_t}). In Java, {@link #F32} data lives in a
 * {@link java.nio.FloatBuffer} (or a {@link java.nio.ByteBuffer}), {@link #F16} and {@link #BF16}
 * data in a {@link java.nio.ShortBuffer} holding the raw 16-bit patterns (or a ByteBuffer).
 */
public enum DType {
  /** IEEE binary32. */
  F32(0, 4),
  /** IEEE binary16. */
  F16(1, 2),
  /** bfloat16. */
  BF16(2, 2);

  private final int code;
  private final int size;

  DType(int code, int size) {
    this.code = code;
    this.size = size;
  }

  /**
   * The C value.
   *
   * @return the {@code kvarn_dtype_t} value
   */
  public int code() {
    return code;
  }

  /**
   * Bytes per element.
   *
   * @return 4 for F32, 2 for F16 and BF16
   */
  public int size() {
    return size;
  }
}
