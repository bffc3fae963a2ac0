/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.ShortBuffer;
import java.util.Random;
import org.junit.jupiter.api.function.Executable;

/** Helpers of the JUnit suites: random direct buffers and status assertions. */
final class TestData {
  private TestData() {}

  static FloatBuffer randomFloats(Random rng, int n, float scale) {
    float[] x = new float[n];
    for (int i = 0; i < n; i++) x[i] = (float) rng.nextGaussian() * scale;
    return Reference.floats(x);
  }

  static FloatBuffer floats(float[] x) {
    return Reference.floats(x);
  }

  static float[] array(FloatBuffer b) {
    return Reference.array(b);
  }

  static FloatBuffer zeros(int n) {
    return Reference.floats(n);
  }

  static ShortBuffer shorts(int n) {
    return ByteBuffer.allocateDirect(2 * n).order(ByteOrder.nativeOrder()).asShortBuffer();
  }

  /** Runs call, expects a KvarnException of status; returns it. */
  static KvarnException assertStatus(Status status, Executable call) {
    KvarnException e = assertThrows(KvarnException.class, call);
    assertEquals(status, e.status(), e.getMessage());
    assertEquals(status.code(), e.code());
    return e;
  }

  /** f32 -> IEEE binary16 bits, round to nearest even (normal and subnormal range, no NaN). */
  static short toHalf(float f) {
    int bits = Float.floatToIntBits(f);
    int sign = (bits >>> 16) & 0x8000;
    int exp = ((bits >>> 23) & 0xff) - 127 + 15;
    int mant = bits & 0x7fffff;
    if (exp >= 31) return (short) (sign | 0x7c00);
    if (exp <= 0) {
      if (exp < -10) return (short) sign;
      mant |= 0x800000;
      int shift = 14 - exp;
      int half = mant >> shift;
      int rem = mant & ((1 << shift) - 1);
      int mid = 1 << (shift - 1);
      if (rem > mid || (rem == mid && (half & 1) != 0)) half++;
      return (short) (sign | half);
    }
    int half = (exp << 10) | (mant >> 13);
    int rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1) != 0)) half++;
    return (short) (sign | half);
  }

  /** IEEE binary16 bits -> f32. */
  static float fromHalf(short h) {
    int bits = h & 0xffff;
    int sign = (bits & 0x8000) << 16;
    int exp = (bits >>> 10) & 0x1f;
    int mant = bits & 0x3ff;
    if (exp == 0) {
      float v = mant * (float) Math.pow(2, -24);
      return sign != 0 ? -v : v;
    }
    if (exp == 31) return Float.intBitsToFloat(sign | 0x7f800000 | (mant << 13));
    return Float.intBitsToFloat(sign | ((exp - 15 + 127) << 23) | (mant << 13));
  }
}
