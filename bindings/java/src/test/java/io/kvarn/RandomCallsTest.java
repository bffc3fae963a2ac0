/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;

/**
 * Random calls with buffers of random sizes, types and dtypes, some right and most wrong: every
 * call either succeeds or throws KvarnException, and no call writes past the end of a buffer
 * (each buffer is followed by 64 guard bytes that must be unchanged afterwards).
 */
class RandomCallsTest {
  private static final int GUARD = 64;
  private static final byte PATTERN = 0x77;
  private final Random rng = new Random(4242);
  private final List<ByteBuffer> guarded = new ArrayList<>();
  private int succeeded;
  private int refused;

  /** A buffer of `elements` elements of a random kind (often the right one) before a guard. */
  private Buffer buffer(long elements, DType dtype) {
    int wobble = rng.nextInt(4) == 0 ? rng.nextInt(5) - 3 : 0;
    long n = Math.max(0, elements + wobble);
    int kind = rng.nextInt(10);
    int size = dtype.size();
    if (kind == 0) return FloatBuffer.allocate((int) n);           // heap
    if (kind == 1) size = 3 - dtype.size() / 2;                    // the other element size
    ByteBuffer whole = ByteBuffer.allocateDirect((int) (n * size) + GUARD)
        .order(rng.nextInt(12) == 0 ? ByteOrder.BIG_ENDIAN : ByteOrder.nativeOrder());
    for (int i = 0; i < whole.capacity(); i++) whole.put(i, PATTERN);
    for (int i = 0; i < n * size; i++) whole.put(i, (byte) rng.nextInt(64)); // small finite values
    guarded.add(whole);
    ByteBuffer data = whole.duplicate().limit((int) (n * size)).slice().order(whole.order());
    if (kind < 6 && size == 4) return data.asFloatBuffer();
    if (kind < 6 && size == 2) return data.asShortBuffer();
    return data;
  }

  /** A direct ByteBuffer of about n bytes (sometimes fewer) before a guard. */
  private ByteBuffer bytes(long n) {
    long size = Math.max(0, n - (rng.nextInt(4) == 0 ? rng.nextInt(3) : 0));
    ByteBuffer whole = ByteBuffer.allocateDirect((int) size + GUARD);
    for (int i = 0; i < whole.capacity(); i++) whole.put(i, PATTERN);
    guarded.add(whole);
    return whole.duplicate().limit((int) size).slice();
  }

  private static DType dtype(Random rng) {
    return DType.values()[rng.nextInt(3)];
  }

  private void call(Runnable r) {
    try {
      r.run();
      succeeded++;
    } catch (KvarnException e) {
      refused++;
    } catch (RuntimeException e) {
      fail("not a KvarnException: " + e);
    }
    for (ByteBuffer b : guarded) {
      for (int i = b.capacity() - GUARD; i < b.capacity(); i++) {
        assertEquals(PATTERN, b.get(i), "a write past the end of a buffer");
      }
    }
    guarded.clear();
  }

  @Test
  void randomCodecCalls() {
    try (Context ctx = new Context()) {
      for (int it = 0; it < 300; it++) {
        int d = rng.nextBoolean() ? 64 : 128;
        Config config = Config.fromPreset(Config.presets().get(rng.nextInt(6)), d);
        int g = config.tileTokens();
        int tiles = rng.nextInt(3);
        DType dt = dtype(rng);
        long rb = config.recordBytes();
        long stride = rb + new long[] {0, 0, 2, 64, -2}[rng.nextInt(5)];
        int op = rng.nextInt(3);
        if (op == 0) {
          Buffer k = buffer((long) tiles * g * d, dt);
          Buffer v = buffer((long) tiles * g * d, dt);
          ByteBuffer rec = bytes(tiles == 0 ? 0 : (tiles - 1) * stride + rb);
          call(() -> ctx.quantize(config, tiles, dt, k, v, rec, stride, rng.nextBoolean()));
        } else if (op == 1) {
          ByteBuffer rec = ByteBuffer.allocateDirect((int) (tiles * rb));
          for (int i = 0; i < rec.capacity(); i++) rec.put(i, (byte) rng.nextInt(256));
          Buffer k = buffer((long) tiles * g * d, dt);
          Buffer v = rng.nextBoolean() ? null : buffer((long) tiles * g * d, dt);
          call(() -> ctx.dequantize(config, tiles, rec, rb, rng.nextBoolean(), dt, k, v));
        } else {
          DType out = dtype(rng);
          int rows = rng.nextInt(4);
          Buffer in = buffer((long) rows * d, dt);
          Buffer o = buffer((long) rows * d, out);
          call(() -> ctx.rotate(d, rows, dt, in, out, o));
        }
      }
    }
    System.out.println("random codec calls: " + succeeded + " succeeded, " + refused + " refused");
    assertTrue(succeeded > 20 && refused > 20, succeeded + " succeeded, " + refused + " refused");
  }

  @Test
  void randomCacheCalls() {
    int d = 64;
    int hk = 2;
    Config config = Config.fromPreset("k4v2_g64", d);
    try (Context ctx = new Context(); Cache cache = new Cache(ctx, config, 2, hk, 2048, 4)) {
      for (long s = 0; s < 3; s++) cache.addSequence(s);
      for (int it = 0; it < 400; it++) {
        int op = rng.nextInt(4);
        long seq = rng.nextInt(4);
        int layer = rng.nextInt(3);
        DType dt = dtype(rng);
        if (op == 0) {
          long n = rng.nextInt(40);
          Buffer k = buffer(n * hk * d, dt);
          Buffer v = buffer(n * hk * d, dt);
          boolean spec = rng.nextInt(4) == 0;
          call(() -> cache.append(seq, layer, n, dt, k, v, spec));
        } else if (op == 1) {
          int batch = 1 + rng.nextInt(2);
          long[] ids = new long[batch];
          for (int i = 0; i < batch; i++) ids[i] = rng.nextInt(4);
          int hq = new int[] {hk, 2 * hk, 4 * hk, 3}[rng.nextInt(4)];
          AttentionParams p = new AttentionParams(hq).qDtype(dt).outDtype(dtype(rng));
          long total = batch;
          if (rng.nextBoolean()) {
            int[] indptr = new int[batch + 1];
            for (int i = 0; i < batch; i++) indptr[i + 1] = indptr[i] + rng.nextInt(3);
            p.qIndptr(indptr);
            total = indptr[batch];
          }
          Buffer q = buffer(total * hq * d, p.qDtype());
          Buffer out = buffer(total * hq * d, p.outDtype());
          Buffer lse = rng.nextBoolean() ? null : buffer(total * hq, DType.F32);
          call(() -> cache.attention(layer, ids, p, q, out,
              lse instanceof FloatBuffer ? (FloatBuffer) lse : null));
        } else if (op == 2) {
          long n = rng.nextInt(200);
          int which = rng.nextInt(3);
          call(() -> {
            if (which == 0) cache.truncate(seq, n);
            if (which == 1) cache.commit(seq, n);
            if (which == 2) cache.fork(seq, 10 + rng.nextInt(3), rng.nextBoolean() ? -1 : n);
          });
          if (rng.nextInt(3) == 0) call(() -> cache.removeSequence(10 + rng.nextInt(3)));
        } else {
          call(() -> {
            ByteBuffer blob = cache.exportSequence(seq);
            if (blob.remaining() > 0 && rng.nextBoolean()) {
              int at = rng.nextInt(blob.remaining());
              blob.put(at, (byte) (blob.get(at) ^ (1 << rng.nextInt(8))));
            }
            cache.importSequence(20 + rng.nextInt(2), blob);
          });
          call(() -> cache.removeSequence(20 + rng.nextInt(2)));
        }
      }
      CacheStats stats = cache.stats();
      assertTrue(stats.tokens() >= stats.committedTokens(), stats.toString());
    }
    System.out.println("random cache calls: " + succeeded + " succeeded, " + refused + " refused");
    assertTrue(succeeded > 50 && refused > 50, succeeded + " succeeded, " + refused + " refused");
  }
}
