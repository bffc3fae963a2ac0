/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import io.kvarn.internal.KvarnNative;
import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Random;

/**
 * The checks of {@link Kvarn#selftest}, through this binding, for every preset (D 128, or
 * 64..512 when not quick): record size; quantize + dequantize of synthetic K/V with outlier
 * channels (K error no worse than per-token RTN at the same bits, V error below 1, deterministic
 * bytes); the managed cache (decode attention against fp32 attention over what the cache holds,
 * relative L2 at most 1e-3; export + import giving the identical output).
 */
final class Selftest {
  private static final int HK = 2;
  private static final int HQ = 8;

  private Selftest() {}

  static SelftestReport run(Context ctx, boolean quick) {
    SelftestReport report = new SelftestReport();
    int[] dims = quick ? new int[] {128} : new int[] {64, 128, 256, 512};
    Random rng = new Random(20261203L);
    List<String> presets = Config.presets();
    for (int d : dims) {
      for (String preset : presets) {
        String name = preset + " d" + d;
        try {
          Config config = Config.fromPreset(preset, d);
          format(report, name, config);
          roundtrip(report, name, ctx, config, rng);
          cache(report, name, ctx, config, rng);
        } catch (KvarnException e) {
          report.check(name, false, e.getMessage());
        }
      }
    }
    return report;
  }

  private static void format(SelftestReport r, String name, Config c) {
    long expect = (long) c.headDim() * c.tileTokens() * (c.keyBits() + c.valueBits()) / 8
        + 6L * c.headDim() + 6L * c.tileTokens();
    long got = c.recordBytes();
    r.check(name + " format", got == expect, "record " + got + " bytes (expected " + expect + ")");
  }

  private static void roundtrip(SelftestReport r, String name, Context ctx, Config c, Random rng) {
    int g = c.tileTokens();
    int d = c.headDim();
    int tiles = 2;
    float[][] kv = Reference.syntheticKv(rng, tiles * g, 1, d);
    FloatBuffer k = Reference.floats(kv[0]);
    FloatBuffer v = Reference.floats(kv[1]);
    ByteBuffer a = ctx.quantize(c, k, v);
    ByteBuffer b = ctx.quantize(c, k, v);
    FloatBuffer k2 = Reference.floats(kv[0].length);
    FloatBuffer v2 = Reference.floats(kv[1].length);
    ctx.dequantize(c, a, k2, v2);
    double kErr = Reference.relativeL2(Reference.array(k2), kv[0]);
    double vErr = Reference.relativeL2(Reference.array(v2), kv[1]);
    FloatBuffer rtn = Reference.floats(kv[0].length);
    // kvarn_baseline_roundtrip: kvarn/kvarn_experimental.h (no stability promise).
    KvarnNative.baseline_roundtrip(io.kvarn.internal.baseline_t.BASELINE_PER_TOKEN_RTN, c.keyBits(),
        (long) tiles * g, d, k, rtn);
    double rtnErr = Reference.relativeL2(Reference.array(rtn), kv[0]);
    r.check(name + " roundtrip", kErr <= rtnErr && vErr < 1.0 && a.equals(b),
        String.format(Locale.ROOT, "K %.4f (per-token RTN %.4f), V %.4f, deterministic %b", kErr,
            rtnErr, vErr, a.equals(b)));
  }

  private static void cache(SelftestReport r, String name, Context ctx, Config c, Random rng) {
    int g = c.tileTokens();
    int d = c.headDim();
    int tokens = 3 * g + g / 2 + 3;
    float[][] kv = Reference.syntheticKv(rng, tokens, HK, d);
    try (Cache cache = new Cache(ctx, c, 1, HK, 8L * tokens, 4)) {
      cache.addSequence(1);
      int first = 2 * g + 5;
      append(cache, 1, kv, 0, first, false);
      for (int t = first; t < tokens; t += 17) {
        append(cache, 1, kv, t, Math.min(17, tokens - t), false);
      }
      float[] q = Reference.gaussian(rng, HQ * d);
      FloatBuffer out = Reference.floats(HQ * d);
      cache.attention(0, new long[] {1}, HQ, Reference.floats(q), out);
      float[][] held = Reference.cacheContents(ctx, c, kv[0], kv[1], tokens, tokens, HK);
      float[] ref = Reference.attention(q, held[0], held[1], tokens, HQ, HK, d,
          (float) (1.0 / Math.sqrt(d)));
      double err = Reference.relativeL2(Reference.array(out), ref);
      CacheStats stats = cache.stats();
      long records = (long) (tokens / g - c.sinkTiles()) * HK;
      r.check(name + " cache", err <= 1e-3 && stats.records() == records
          && stats.tokens() == tokens, String.format(Locale.ROOT,
          "decode attention vs fp32 reference %.2e, %d records, compression %.2fx", err,
          stats.records(), stats.compressionRatio()));

      ByteBuffer blob = cache.exportSequence(1);
      cache.importSequence(2, blob);
      FloatBuffer out2 = Reference.floats(HQ * d);
      cache.attention(0, new long[] {2}, HQ, Reference.floats(q), out2);
      r.check(name + " export/import", Arrays.equals(Reference.array(out), Reference.array(out2)),
          blob.remaining() + " byte blob");
    }
  }

  private static void append(Cache cache, long seq, float[][] kv, int from, int n, boolean spec) {
    int row = cache.numKvHeads() * cache.config().headDim();
    FloatBuffer k = Reference.floats(Arrays.copyOfRange(kv[0], from * row, (from + n) * row));
    FloatBuffer v = Reference.floats(Arrays.copyOfRange(kv[1], from * row, (from + n) * row));
    if (spec) {
      cache.appendSpeculative(seq, 0, k, v);
    } else {
      cache.append(seq, 0, k, v);
    }
  }
}
