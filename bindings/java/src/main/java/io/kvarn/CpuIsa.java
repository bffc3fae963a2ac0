/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

/** CPU instruction sets of the CPU kernels ({@code kvarn_cpu_isa_t}). */
public enum CpuIsa {
  /** The portable scalar reference. */
  SCALAR(0),
  /** AVX2 + FMA. */
  AVX2(1),
  /** AVX-512. */
  AVX512(2),
  /** Arm NEON. */
  NEON(3),
  /** The context does not run on the CPU. */
  NONE(255);

  private final int code;

  CpuIsa(int code) {
    this.code = code;
  }

  /**
   * The C value.
   *
   * @return the {@code kvarn_cpu_isa_t} value
   */
  public int code() {
    return code;
  }

  /**
   * The ISA of a C value.
   *
   * @param code a {@code kvarn_cpu_isa_t} value
   * @return the ISA
   * @throws KvarnException INVALID_ARGUMENT for an unknown value
   */
  public static CpuIsa fromCode(int code) {
    for (CpuIsa i : values()) {
      if (i.code == code) return i;
    }
    throw new KvarnException(Status.INVALID_ARGUMENT, "unknown CPU ISA value " + code);
  }
}
