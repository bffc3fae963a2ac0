/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

/** Compute backends ({@code kvarn_backend_t}). */
public enum Backend {
  /** A GPU when one is present, else the CPU. */
  AUTO(0),
  /** The CPU (scalar reference and SIMD kernels, thread pool). */
  CPU(1),
  /** NVIDIA CUDA. */
  CUDA(2),
  /** AMD ROCm (not built in this release). */
  ROCM(3);

  private final int code;

  Backend(int code) {
    this.code = code;
  }

  /**
   * The C value.
   *
   * @return the {@code kvarn_backend_t} value
   */
  public int code() {
    return code;
  }

  /**
   * The backend of a C value.
   *
   * @param code a {@code kvarn_backend_t} value
   * @return the backend
   * @throws KvarnException INVALID_ARGUMENT for an unknown value
   */
  public static Backend fromCode(int code) {
    for (Backend b : values()) {
      if (b.code == code) return b;
    }
    throw new KvarnException(Status.INVALID_ARGUMENT, "unknown backend value " + code);
  }
}
