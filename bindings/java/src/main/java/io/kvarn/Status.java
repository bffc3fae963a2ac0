/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

/** The status of a libkvarn call ({@code kvarn_status_t}); the codes are pinned by the C ABI. */
public enum Status {
  /** Success. */
  OK(0),
  /** A null pointer, bad size or bad value (also: a heap buffer, a closed handle). */
  INVALID_ARGUMENT(1),
  /** Valid but unsupported: shape, dtype, bits or backend operation. */
  UNSUPPORTED(2),
  /** An allocation failed. */
  OUT_OF_MEMORY(3),
  /** The backend is not built or no device is present. */
  BACKEND_UNAVAILABLE(4),
  /** NaN or Inf in an input. */
  NON_FINITE(5),
  /** A value or scale does not fit fp16. */
  OVERFLOW(6),
  /** A managed cache limit would be exceeded. */
  CAPACITY(7),
  /** Unknown sequence id, preset name or index. */
  NOT_FOUND(8),
  /** The sequence id is already in use. */
  ALREADY_EXISTS(9),
  /** A blob is truncated, bit-flipped or of another version. */
  CORRUPT_DATA(10),
  /** An output buffer is too small. */
  BUFFER_TOO_SMALL(11),
  /** The operation is not allowed in the current state. */
  INVALID_STATE(12),
  /** A device (CUDA/HIP) call failed. */
  DEVICE(13),
  /** A bug in libkvarn: please report it. */
  INTERNAL(14);

  private final int code;

  Status(int code) {
    this.code = code;
  }

  /**
   * The C value of this status.
   *
   * @return the {@code kvarn_status_t} value
   */
  public int code() {
    return code;
  }

  /**
   * The status of a C value.
   *
   * @param code a {@code kvarn_status_t} value
   * @return the status, or {@link #INTERNAL} for a value this binding does not know
   */
  public static Status fromCode(int code) {
    for (Status s : values()) {
      if (s.code == code) return s;
    }
    return INTERNAL;
  }
}
