/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import java.nio.FloatBuffer;
import java.nio.ShortBuffer;
import java.util.Random;

/**
 * Plain-Java references for the selftest and the tests: synthetic K/V, what a managed cache holds
 * for given tokens (records dequantized through the codec, fp16 tiles through an fp16 rotation
 * round trip) and fp32 attention over it.
 */
final class Reference {
  private Reference() {}

  /** A direct native-order f32 buffer holding values. */
  static FloatBuffer floats(float[] values) {
    FloatBuffer b = Buffers.allocate(4L * values.length).asFloatBuffer();
    b.put(values).flip();
    return b;
  }

  /** A direct native-order f32 buffer of n zeros. */
  static FloatBuffer floats(int n) {
    return Buffers.allocate(4L * n).asFloatBuffer();
  }

  static float[] array(FloatBuffer b) {
    float[] out = new float[b.remaining()];
    b.duplicate().get(out);
    return out;
  }

  /**
   * K/V [tokens][heads][d] shaped like a large model's: outlier channels in K (10-20x), a
   * per-token scale spread, a shifted mean; V Gaussian with a per-token scale.
   */
  static float[][] syntheticKv(Random rng, int tokens, int heads, int d) {
    float[] k = new float[tokens * heads * d];
    float[] v = new float[tokens * heads * d];
    float[] channelScale = new float[d];
    java.util.Arrays.fill(channelScale, 1f);
    for (int i = 0; i < Math.max(2, d / 32); i++) {
      channelScale[rng.nextInt(d)] = 10f + 10f * rng.nextFloat();
    }
    for (int t = 0; t < tokens; t++) {
      float tokenScale = 0.5f + 1.5f * rng.nextFloat();
      float valueScale = 0.5f + rng.nextFloat();
      for (int h = 0; h < heads; h++) {
        for (int c = 0; c < d; c++) {
          int i = (t * heads + h) * d + c;
          k[i] = (float) rng.nextGaussian() * channelScale[c] * tokenScale + 0.5f;
          v[i] = (float) rng.nextGaussian() * valueScale;
        }
      }
    }
    return new float[][] {k, v};
  }

  static float[] gaussian(Random rng, int n) {
    float[] x = new float[n];
    for (int i = 0; i < n; i++) x[i] = (float) rng.nextGaussian();
    return x;
  }

  /**
   * What a cache holds for K/V [tokens][heads][d] of which the first `committed` are committed:
   * complete committed tiles past the sink are records (quantized and dequantized by the codec),
   * every other token is fp16 in the rotated frame (rotated, rounded, rotated back here).
   * Returns {K', V'} unrotated, f32.
   */
  static float[][] cacheContents(Context ctx, Config config, float[] kx, float[] vx, int tokens,
      int committed, int heads) {
    if (config.keyFlags() != 0 || config.valueFlags() != 0) {
      throw new IllegalArgumentException("the reference models unablated configs only");
    }
    int d = config.headDim();
    int g = config.tileTokens();
    int n = tokens * heads;
    float[][] out = new float[2][];
    float[][] in = {kx, vx};
    FloatBuffer rows = floats(n * d);
    ShortBuffer half = Buffers.allocate(2L * n * d).asShortBuffer();
    FloatBuffer back = floats(n * d);
    for (int which = 0; which < 2; which++) {
      rows.clear();
      rows.put(in[which], 0, n * d).flip();
      ctx.rotate(d, n, DType.F32, rows, DType.F16, half);
      ctx.rotate(d, n, DType.F16, half, DType.F32, back);
      out[which] = array(back);
    }
    int quantizedTiles = committed / g;
    FloatBuffer k = floats(g * d);
    FloatBuffer v = floats(g * d);
    FloatBuffer kOut = floats(g * d);
    FloatBuffer vOut = floats(g * d);
    for (int tile = config.sinkTiles(); tile < quantizedTiles; tile++) {
      for (int h = 0; h < heads; h++) {
        k.clear();
        v.clear();
        for (int t = 0; t < g; t++) {
          int off = ((tile * g + t) * heads + h) * d;
          k.put(kx, off, d);
          v.put(vx, off, d);
        }
        k.flip();
        v.flip();
        ctx.dequantize(config, ctx.quantize(config, k, v), kOut, vOut);
        for (int t = 0; t < g; t++) {
          int off = ((tile * g + t) * heads + h) * d;
          kOut.position(t * d);
          kOut.get(out[0], off, d);
          vOut.position(t * d);
          vOut.get(out[1], off, d);
        }
        kOut.clear();
        vOut.clear();
      }
    }
    return out;
  }

  /**
   * fp32 decode attention of q [hq][d] over k, v [n][hk][d] (GQA: head h reads KV head
   * h / (hq/hk)); keys [0, visible) are seen. Returns [hq][d].
   */
  static float[] attention(float[] q, float[] k, float[] v, int visible, int hq, int hk, int d,
      float scale) {
    float[] out = new float[hq * d];
    float[] scores = new float[visible];
    int group = hq / hk;
    for (int h = 0; h < hq; h++) {
      int kvh = h / group;
      float max = Float.NEGATIVE_INFINITY;
      for (int t = 0; t < visible; t++) {
        float s = 0f;
        for (int c = 0; c < d; c++) s += q[h * d + c] * k[(t * hk + kvh) * d + c];
        scores[t] = s * scale;
        max = Math.max(max, scores[t]);
      }
      float sum = 0f;
      for (int t = 0; t < visible; t++) {
        scores[t] = (float) Math.exp(scores[t] - max);
        sum += scores[t];
      }
      for (int t = 0; t < visible; t++) {
        float p = scores[t] / sum;
        for (int c = 0; c < d; c++) out[h * d + c] += p * v[(t * hk + kvh) * d + c];
      }
    }
    return out;
  }

  /** ||a - b|| / ||b||. */
  static double relativeL2(float[] a, float[] b) {
    double num = 0;
    double den = 0;
    for (int i = 0; i < a.length; i++) {
      double e = (double) a[i] - b[i];
      num += e * e;
      den += (double) b[i] * b[i];
    }
    return Math.sqrt(num / Math.max(den, 1e-30));
  }
}
