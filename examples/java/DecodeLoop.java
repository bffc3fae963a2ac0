/*
 * DecodeLoop.java - a managed KVarN cache from Java through a prompt and a few decode steps.
 *
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 *
 * Each step appends one token's K/V (the model's output, here random), runs decode attention over
 * the quantized cache and checks it against a plain Java fp32 attention over the dequantized
 * cache: tiles held as records are dequantized with the codec (Context.quantize/dequantize of the
 * same tokens give the cache's records), the fp16 tiles (the sink and the incomplete tail) are
 * rounded to fp16 in the rotated frame as the cache stores them. Exits 1 when the relative error
 * exceeds 1e-3.
 *
 *   java -cp kvarn.jar:decode-loop.jar DecodeLoop
 */
import io.kvarn.Cache;
import io.kvarn.CacheStats;
import io.kvarn.Config;
import io.kvarn.Context;
import io.kvarn.DType;
import io.kvarn.Kvarn;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.ShortBuffer;
import java.util.Random;

public final class DecodeLoop {
  static final int D = 128;    // head dim
  static final int HK = 2;     // KV heads
  static final int HQ = 8;     // query heads (GQA 4)
  static final int PROMPT = 300;
  static final int STEPS = 6;
  static final long SEQ = 42;

  public static void main(String[] args) {
    Random rng = new Random(7);
    Config config = Config.fromPreset("k4v2_g128", D);
    int total = PROMPT + STEPS;
    float[] k = gaussian(rng, total * HK * D);
    float[] v = gaussian(rng, total * HK * D);
    double worst = 0;
    System.out.println("libkvarn " + Kvarn.version() + ", " + config);
    try (Context ctx = new Context();
        Cache cache = new Cache(ctx, config, /*numLayers=*/1, HK, /*maxTokens=*/4096, 4)) {
      cache.addSequence(SEQ);
      cache.append(SEQ, 0, tokens(k, 0, PROMPT), tokens(v, 0, PROMPT));      // the prompt
      for (int step = 0; step < STEPS; step++) {
        int n = PROMPT + step + 1;
        cache.append(SEQ, 0, tokens(k, n - 1, n), tokens(v, n - 1, n));     // the new token
        float[] q = gaussian(rng, HQ * D);
        FloatBuffer out = direct(HQ * D);
        cache.attention(0, new long[] {SEQ}, HQ, direct(q), out);

        float[][] held = dequantizedCache(ctx, config, k, v, n);
        float[] ref = attention(q, held[0], held[1], n);
        float[] got = new float[HQ * D];
        out.get(got);
        double err = relativeL2(got, ref);
        worst = Math.max(worst, err);
        System.out.printf("step %d: %d tokens, relative error vs fp32 reference %.2e%n", step, n,
            err);
      }
      CacheStats stats = cache.stats();
      System.out.println(stats);
    }
    if (worst > 1e-3) {
      System.out.println("FAILED: error " + worst + " > 1e-3");
      System.exit(1);
    }
    System.out.println("OK: worst relative error " + worst);
  }

  /** What the cache holds for its first n tokens, as unrotated f32 [n][HK][D] K and V. */
  static float[][] dequantizedCache(Context ctx, Config config, float[] k, float[] v, int n) {
    int g = config.tileTokens();
    float[][] held = {fp16Frame(ctx, k, n), fp16Frame(ctx, v, n)};
    FloatBuffer kt = direct(g * D);
    FloatBuffer vt = direct(g * D);
    FloatBuffer kd = direct(g * D);
    FloatBuffer vd = direct(g * D);
    for (int tile = config.sinkTiles(); tile < n / g; tile++) {   // complete tiles past the sink
      for (int h = 0; h < HK; h++) {
        kt.clear();
        vt.clear();
        for (int t = 0; t < g; t++) {
          kt.put(k, ((tile * g + t) * HK + h) * D, D);
          vt.put(v, ((tile * g + t) * HK + h) * D, D);
        }
        kt.flip();
        vt.flip();
        ByteBuffer record = ctx.quantize(config, kt, vt);
        kd.clear();
        vd.clear();
        ctx.dequantize(config, record, kd, vd);
        for (int t = 0; t < g; t++) {
          kd.get(held[0], ((tile * g + t) * HK + h) * D, D);
          vd.get(held[1], ((tile * g + t) * HK + h) * D, D);
        }
      }
    }
    return held;
  }

  /** x rotated, rounded to fp16 and rotated back (the Hadamard rotation is its own inverse). */
  static float[] fp16Frame(Context ctx, float[] x, int n) {
    int rows = n * HK;
    ShortBuffer half = ByteBuffer.allocateDirect(2 * rows * D).order(ByteOrder.nativeOrder())
        .asShortBuffer();
    FloatBuffer back = direct(rows * D);
    ctx.rotate(D, rows, DType.F32, direct(java.util.Arrays.copyOf(x, rows * D)), DType.F16, half);
    ctx.rotate(D, rows, DType.F16, half, DType.F32, back);
    float[] out = new float[rows * D];
    back.get(out);
    return out;
  }

  /** Plain fp32 decode attention: q [HQ][D] over k, v [n][HK][D], query head h reads KV head
   * h / (HQ / HK), scale 1/sqrt(D). */
  static float[] attention(float[] q, float[] k, float[] v, int n) {
    float[] out = new float[HQ * D];
    float scale = (float) (1.0 / Math.sqrt(D));
    for (int h = 0; h < HQ; h++) {
      int kvh = h / (HQ / HK);
      float[] p = new float[n];
      float max = Float.NEGATIVE_INFINITY;
      for (int t = 0; t < n; t++) {
        float s = 0;
        for (int c = 0; c < D; c++) s += q[h * D + c] * k[(t * HK + kvh) * D + c];
        p[t] = s * scale;
        max = Math.max(max, p[t]);
      }
      float sum = 0;
      for (int t = 0; t < n; t++) {
        p[t] = (float) Math.exp(p[t] - max);
        sum += p[t];
      }
      for (int t = 0; t < n; t++) {
        for (int c = 0; c < D; c++) out[h * D + c] += p[t] / sum * v[(t * HK + kvh) * D + c];
      }
    }
    return out;
  }

  static FloatBuffer tokens(float[] x, int from, int to) {
    FloatBuffer b = direct((to - from) * HK * D);
    b.put(x, from * HK * D, (to - from) * HK * D).flip();
    return b;
  }

  static FloatBuffer direct(int n) {
    return ByteBuffer.allocateDirect(4 * n).order(ByteOrder.nativeOrder()).asFloatBuffer();
  }

  static FloatBuffer direct(float[] x) {
    FloatBuffer b = direct(x.length);
    b.put(x).flip();
    return b;
  }

  static float[] gaussian(Random rng, int n) {
    float[] x = new float[n];
    for (int i = 0; i < n; i++) x[i] = (float) rng.nextGaussian();
    return x;
  }

  static double relativeL2(float[] a, float[] b) {
    double num = 0;
    double den = 0;
    for (int i = 0; i < a.length; i++) {
      num += (a[i] - b[i]) * (double) (a[i] - b[i]);
      den += b[i] * (double) b[i];
    }
    return Math.sqrt(num / den);
  }
}
