/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import static io.kvarn.TestData.assertStatus;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import java.nio.ShortBuffer;
import java.util.Arrays;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

class CacheTest {
  private static final int D = 64;
  private static final int G = 64;
  private static final int HK = 2;
  private static final int HQ = 8;
  private static final int ROW = HK * D;
  private final Random rng = new Random(99);
  private final Config config = Config.fromPreset("k4v2_g64", D);
  private Context ctx;
  private Cache cache;

  @BeforeEach
  void open() {
    ctx = new Context();
    cache = new Cache(ctx, config, 2, HK, 4096, 8);
  }

  @AfterEach
  void close() {
    cache.close();
    ctx.close();
  }

  private static FloatBuffer slice(float[] x, int fromToken, int toToken) {
    return TestData.floats(Arrays.copyOfRange(x, fromToken * ROW, toToken * ROW));
  }

  private float[] decode(long seq, int layer, float[] q) {
    FloatBuffer out = TestData.zeros(HQ * D);
    cache.attention(layer, new long[] {seq}, HQ, TestData.floats(q), out);
    return TestData.array(out);
  }

  private float[] reference(float[][] kv, int tokens, int committed, float[] q) {
    float[][] held = Reference.cacheContents(ctx, config, kv[0], kv[1], tokens, committed, HK);
    return Reference.attention(q, held[0], held[1], tokens, HQ, HK, D,
        (float) (1.0 / Math.sqrt(D)));
  }

  @Test
  void decodeLoopMatchesFp32AttentionOverTheDequantizedCache() {
    int prompt = 2 * G + 7;
    int steps = 3 * G / 2;
    float[][] kv = Reference.syntheticKv(rng, prompt + steps, HK, D);
    cache.addSequence(7);
    cache.append(7, 0, slice(kv[0], 0, prompt), slice(kv[1], 0, prompt));
    for (int t = prompt; t < prompt + steps; t++) {
      cache.append(7, 0, slice(kv[0], t, t + 1), slice(kv[1], t, t + 1));
      if ((t - prompt) % 29 == 0 || t == prompt + steps - 1) {
        float[] q = Reference.gaussian(rng, HQ * D);
        float[] out = decode(7, 0, q);
        float[] ref = reference(kv, t + 1, t + 1, q);
        double err = Reference.relativeL2(out, ref);
        assertTrue(err < 1e-4, "step " + t + ": relative error " + err);
      }
    }
    int tokens = prompt + steps;
    assertEquals(tokens, cache.length(7, 0));
    assertEquals(tokens, cache.committed(7, 0));
    assertEquals(0, cache.length(7, 1));
    CacheStats stats = cache.stats();
    assertEquals(1, stats.sequences());
    assertEquals(tokens, stats.tokens());
    assertEquals((tokens / G - 1) * HK, stats.records());
    // Short context: the fp16 sink and tail tiles weigh in (4.7x holds for long ones).
    assertTrue(stats.compressionRatio() > 1.3, stats.toString());
    assertTrue(stats.bytesUsed() < stats.fp16Bytes());
  }

  @Test
  void batchedDecodeF16AndLse() {
    float[][] a = Reference.syntheticKv(rng, 3 * G, HK, D);
    float[][] b = Reference.syntheticKv(rng, G + 5, HK, D);
    cache.addSequence(1);
    cache.addSequence(2);
    cache.append(1, 1, slice(a[0], 0, 3 * G), slice(a[1], 0, 3 * G));
    cache.append(2, 1, slice(b[0], 0, G + 5), slice(b[1], 0, G + 5));
    float[] q = Reference.gaussian(rng, 2 * HQ * D);
    ShortBuffer qh = TestData.shorts(2 * HQ * D);
    float[] qr = new float[q.length];
    for (int i = 0; i < q.length; i++) {
      qh.put(i, TestData.toHalf(q[i]));
      qr[i] = TestData.fromHalf(qh.get(i));
    }
    FloatBuffer out = TestData.zeros(2 * HQ * D);
    FloatBuffer lse = TestData.zeros(2 * HQ);
    cache.attention(1, new long[] {1, 2}, new AttentionParams(HQ).qDtype(DType.F16), qh, out, lse);
    float[] got = TestData.array(out);
    float scale = (float) (1.0 / Math.sqrt(D));
    float[][] heldA = Reference.cacheContents(ctx, config, a[0], a[1], 3 * G, 3 * G, HK);
    float[][] heldB = Reference.cacheContents(ctx, config, b[0], b[1], G + 5, G + 5, HK);
    float[] refA = Reference.attention(Arrays.copyOfRange(qr, 0, HQ * D), heldA[0], heldA[1],
        3 * G, HQ, HK, D, scale);
    float[] refB = Reference.attention(Arrays.copyOfRange(qr, HQ * D, 2 * HQ * D), heldB[0],
        heldB[1], G + 5, HQ, HK, D, scale);
    assertTrue(Reference.relativeL2(Arrays.copyOfRange(got, 0, HQ * D), refA) < 1e-4);
    assertTrue(Reference.relativeL2(Arrays.copyOfRange(got, HQ * D, 2 * HQ * D), refB) < 1e-4);
    // lse of sequence 1, head 0: log sum exp(scale * q.k).
    double max = Double.NEGATIVE_INFINITY;
    double[] s = new double[3 * G];
    for (int t = 0; t < 3 * G; t++) {
      double dot = 0;
      for (int c = 0; c < D; c++) dot += qr[c] * heldA[0][(t * HK) * D + c];
      s[t] = dot * scale;
      max = Math.max(max, s[t]);
    }
    double sum = 0;
    for (double x : s) sum += Math.exp(x - max);
    assertEquals(max + Math.log(sum), lse.get(0), 1e-3);
    // f16 output agrees with the f32 output to fp16 rounding.
    ShortBuffer outH = TestData.shorts(2 * HQ * D);
    cache.attention(1, new long[] {1, 2},
        new AttentionParams(HQ).qDtype(DType.F16).outDtype(DType.F16), qh, outH, null);
    for (int i = 0; i < got.length; i++) {
      assertEquals(got[i], TestData.fromHalf(outH.get(i)), Math.abs(got[i]) * 2e-3 + 1e-3);
    }
  }

  @Test
  void extendAttentionIsCausal() {
    int tokens = 2 * G + 10;
    int newTokens = 5;
    float[][] kv = Reference.syntheticKv(rng, tokens, HK, D);
    cache.addSequence(3);
    cache.append(3, 0, slice(kv[0], 0, tokens), slice(kv[1], 0, tokens));
    float[] q = Reference.gaussian(rng, newTokens * HQ * D);
    FloatBuffer out = TestData.zeros(newTokens * HQ * D);
    cache.attention(0, new long[] {3}, new AttentionParams(HQ).qIndptr(0, newTokens),
        TestData.floats(q), out, null);
    float[][] held = Reference.cacheContents(ctx, config, kv[0], kv[1], tokens, tokens, HK);
    float[] got = TestData.array(out);
    for (int i = 0; i < newTokens; i++) {
      int visible = tokens - newTokens + i + 1;
      float[] ref = Reference.attention(Arrays.copyOfRange(q, i * HQ * D, (i + 1) * HQ * D),
          held[0], held[1], visible, HQ, HK, D, (float) (1.0 / Math.sqrt(D)));
      double err = Reference.relativeL2(Arrays.copyOfRange(got, i * HQ * D, (i + 1) * HQ * D),
          ref);
      assertTrue(err < 1e-4, "query " + i + ": " + err);
    }
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.attention(0, new long[] {3},
        new AttentionParams(HQ).qIndptr(0, 3, 5), TestData.floats(q), out, null));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.attention(0, new long[] {3},
        new AttentionParams(HQ).qIndptr(1, newTokens), TestData.floats(q), out, null));
  }

  @Test
  void modelVariantsSlidingWindowSinksAndPrefix() {
    int tokens = 4 * G + 9;
    int window = 100;
    float[][] kv = Reference.syntheticKv(rng, tokens, HK, D);
    cache.addSequence(4);
    cache.append(4, 0, slice(kv[0], 0, tokens), slice(kv[1], 0, tokens));
    float[] q = Reference.gaussian(rng, HQ * D);
    // The window's keys are the last `window` tokens: the reference over those alone.
    FloatBuffer out = TestData.zeros(HQ * D);
    cache.attention(0, new long[] {4}, new AttentionParams(HQ).slidingWindow(window),
        TestData.floats(q), out, null);
    float[][] held = Reference.cacheContents(ctx, config, kv[0], kv[1], tokens, tokens, HK);
    int from = (tokens - window) * ROW;
    float[] ref = Reference.attention(q, Arrays.copyOfRange(held[0], from, tokens * ROW),
        Arrays.copyOfRange(held[1], from, tokens * ROW), window, HQ, HK, D,
        (float) (1.0 / Math.sqrt(D)));
    float[] windowed = TestData.array(out);
    assertTrue(Reference.relativeL2(windowed, ref) < 1e-4);
    float[] plain = decode(4, 0, q);
    assertTrue(Reference.relativeL2(windowed, plain) > 1e-3, "the window changed nothing");
    // Sinks: out = plain / (1 + exp(sink - lse)) per head.
    float[] sinks = new float[HQ];
    for (int h = 0; h < HQ; h++) sinks[h] = 0.5f * h - 1f;
    FloatBuffer lse = TestData.zeros(HQ);
    FloatBuffer plainOut = TestData.zeros(HQ * D);
    cache.attention(0, new long[] {4}, new AttentionParams(HQ), TestData.floats(q), plainOut,
        lse);
    FloatBuffer sunk = TestData.zeros(HQ * D);
    cache.attention(0, new long[] {4}, new AttentionParams(HQ).sinks(sinks), TestData.floats(q),
        sunk, null);
    float[] p = TestData.array(plainOut);
    float[] s = TestData.array(sunk);
    for (int h = 0; h < HQ; h++) {
      double keep = 1.0 / (1.0 + Math.exp(sinks[h] - lse.get(h)));
      for (int c = 0; c < D; c++) {
        double want = p[h * D + c] * keep;
        assertTrue(Math.abs(s[h * D + c] - want) < 1e-5 * (1 + Math.abs(want)));
      }
    }
    // Prefix mode: one query after the cache sees every key, like the last causal token.
    FloatBuffer prefix = TestData.zeros(HQ * D);
    cache.attention(0, new long[] {4}, new AttentionParams(HQ).mode(AttentionParams.Mode.PREFIX),
        TestData.floats(q), prefix, null);
    assertArrayEquals(p, TestData.array(prefix));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.attention(0, new long[] {4},
        new AttentionParams(HQ).sinks(1f, 2f), TestData.floats(q), out, null));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.attention(0, new long[] {4},
        new AttentionParams(HQ).slidingWindow(-1), TestData.floats(q), out, null));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.attention(0, new long[] {4},
        new AttentionParams(HQ).logitSoftcap(Float.NaN), TestData.floats(q), out, null));
  }

  @Test
  void speculativeAppendCommitAndTruncate() {
    float[][] kv = Reference.syntheticKv(rng, G + 20, HK, D);
    cache.addSequence(5);
    cache.append(5, 0, slice(kv[0], 0, G + 10), slice(kv[1], 0, G + 10));
    float[] q = Reference.gaussian(rng, HQ * D);
    float[] before = decode(5, 0, q);
    cache.appendSpeculative(5, 0, slice(kv[0], G + 10, G + 20), slice(kv[1], G + 10, G + 20));
    assertEquals(G + 20, cache.length(5, 0));
    assertEquals(G + 10, cache.committed(5, 0));
    float[] withDraft = decode(5, 0, q);
    assertFalse(Arrays.equals(before, withDraft), "attention sees speculative tokens");
    assertTrue(Reference.relativeL2(withDraft, reference(kv, G + 20, G + 10, q)) < 1e-4);
    // A committed append while speculative tokens are pending is refused, the cache unchanged.
    assertStatus(Status.INVALID_STATE,
        () -> cache.append(5, 0, slice(kv[0], 0, 1), slice(kv[1], 0, 1)));
    assertEquals(G + 20, cache.length(5, 0));
    // Reject the draft: exactly the state before it.
    cache.truncate(5, G + 10);
    assertEquals(G + 10, cache.length(5, 0));
    assertArrayEquals(before, decode(5, 0, q));
    // Accept part of a draft: commit covers every layer, so layer 1 needs the tokens too.
    cache.appendSpeculative(5, 0, slice(kv[0], G + 10, G + 20), slice(kv[1], G + 10, G + 20));
    KvarnException e = assertStatus(Status.INVALID_ARGUMENT, () -> cache.commit(5, G + 15));
    assertTrue(e.detail().contains("layer 1"), e.detail());
    cache.appendSpeculative(5, 1, slice(kv[0], 0, G + 20), slice(kv[1], 0, G + 20));
    cache.commit(5, G + 15);
    assertEquals(G + 15, cache.committed(5, 0));
    assertEquals(G + 15, cache.committed(5, 1));
    assertEquals(G + 20, cache.length(5, 1));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.commit(5, G + 12));
  }

  @Test
  void forkSharesRecords() {
    int tokens = 3 * G + 9;
    float[][] kv = Reference.syntheticKv(rng, tokens, HK, D);
    cache.addSequence(10);
    cache.append(10, 0, slice(kv[0], 0, tokens), slice(kv[1], 0, tokens));
    cache.append(10, 1, slice(kv[0], 0, tokens), slice(kv[1], 0, tokens));
    long records = cache.stats().records();
    cache.fork(10, 11, 2 * G);
    assertEquals(records, cache.stats().records(), "the shared prefix is not copied");
    assertEquals(2 * G, cache.length(11, 0));
    float[] q = Reference.gaussian(rng, HQ * D);
    assertTrue(Reference.relativeL2(decode(11, 0, q), reference(kv, 2 * G, 2 * G, q)) < 1e-4);
    cache.fork(10, 12, -1);
    assertArrayEquals(decode(10, 1, q), decode(12, 1, q));
    assertStatus(Status.INVALID_STATE, () -> cache.fork(10, 13, G + G / 2));
    assertStatus(Status.INVALID_STATE, () -> cache.truncate(10, G + G / 2));
    cache.removeSequence(12);
    cache.removeSequence(11);
    assertEquals(records, cache.stats().records());
    assertEquals(1, cache.stats().sequences());
  }

  @Test
  void exportImportAndCorruptBlobs() {
    int tokens = 2 * G + 3;
    float[][] kv = Reference.syntheticKv(rng, tokens, HK, D);
    cache.addSequence(20);
    for (int layer = 0; layer < 2; layer++) {
      cache.append(20, layer, slice(kv[0], 0, tokens), slice(kv[1], 0, tokens));
    }
    ByteBuffer blob = cache.exportSequence(20);
    assertEquals(cache.exportSize(20), blob.remaining());
    ByteBuffer small = ByteBuffer.allocateDirect(blob.remaining() - 1);
    assertStatus(Status.BUFFER_TOO_SMALL, () -> cache.exportSequence(20, small));
    assertStatus(Status.INVALID_ARGUMENT,
        () -> cache.exportSequence(20, ByteBuffer.allocate(blob.remaining())));
    cache.importSequence(21, blob);
    float[] q = Reference.gaussian(rng, HQ * D);
    assertArrayEquals(decode(20, 1, q), decode(21, 1, q));
    assertStatus(Status.ALREADY_EXISTS, () -> cache.importSequence(21, blob));
    // A flipped byte and a truncated blob: CORRUPT_DATA, nothing added.
    ByteBuffer flipped = ByteBuffer.allocateDirect(blob.remaining());
    flipped.put(blob.duplicate()).flip();
    int at = flipped.limit() / 2;
    flipped.put(at, (byte) (flipped.get(at) ^ 0x10));
    assertStatus(Status.CORRUPT_DATA, () -> cache.importSequence(22, flipped));
    assertStatus(Status.CORRUPT_DATA,
        () -> cache.importSequence(22, blob.duplicate().limit(blob.limit() - 8)));
    assertStatus(Status.NOT_FOUND, () -> cache.length(22, 0));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.importSequence(23, ByteBuffer.allocate(16)));
    // A blob into another cache of the same shape.
    try (Cache other = new Cache(ctx, config, 2, HK, 4096, 8)) {
      other.importSequence(99, blob);
      FloatBuffer out = TestData.zeros(HQ * D);
      other.attention(1, new long[] {99}, HQ, TestData.floats(q), out);
      assertArrayEquals(decode(20, 1, q), TestData.array(out));
    }
    try (Cache foreign = new Cache(ctx, config, 1, HK, 4096, 8)) {
      assertStatus(Status.CORRUPT_DATA, () -> foreign.importSequence(1, blob));
    }
  }

  @Test
  void sequenceErrors() {
    cache.addSequence(1);
    assertStatus(Status.ALREADY_EXISTS, () -> cache.addSequence(1));
    assertStatus(Status.NOT_FOUND, () -> cache.removeSequence(2));
    assertStatus(Status.NOT_FOUND, () -> cache.truncate(2, 0));
    FloatBuffer k = TestData.randomFloats(rng, ROW, 1f);
    assertStatus(Status.NOT_FOUND, () -> cache.append(2, 0, k, k));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.append(1, 5, k, k));
    FloatBuffer q = TestData.randomFloats(rng, HQ * D, 1f);
    assertStatus(Status.NOT_FOUND,
        () -> cache.attention(0, new long[] {4}, HQ, q, TestData.zeros(HQ * D)));
    assertStatus(Status.INVALID_ARGUMENT,
        () -> cache.attention(0, new long[] {1}, 3, TestData.randomFloats(rng, 3 * D, 1f),
            TestData.zeros(3 * D)));
    try (Cache tiny = new Cache(ctx, config, 1, HK, 4096, 1)) {
      tiny.addSequence(1);
      assertStatus(Status.CAPACITY, () -> tiny.addSequence(2));
    }
    float[] nan = new float[ROW];
    nan[3] = Float.NaN;
    assertStatus(Status.NON_FINITE, () -> cache.append(1, 0, TestData.floats(nan),
        TestData.floats(nan)));
    assertEquals(0, cache.length(1, 0));
  }

  @Test
  void bufferChecksBeforeTheCCall() {
    cache.addSequence(1);
    FloatBuffer k = TestData.randomFloats(rng, 4 * ROW, 1f);
    // Heap buffers.
    assertStatus(Status.INVALID_ARGUMENT,
        () -> cache.append(1, 0, FloatBuffer.allocate(4 * ROW), k));
    // Not whole tokens / too few elements for the count given.
    assertStatus(Status.INVALID_ARGUMENT,
        () -> cache.append(1, 0, TestData.randomFloats(rng, ROW + 1, 1f), k));
    assertStatus(Status.INVALID_ARGUMENT,
        () -> cache.append(1, 0, 5, DType.F32, k, k, false));
    assertStatus(Status.INVALID_ARGUMENT,
        () -> cache.append(1, 0, Long.MAX_VALUE / 64, DType.F32, k, k, false));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.append(1, 0, -1, DType.F32, k, k, false));
    // Wrong dtype for the buffer type.
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.append(1, 0, 4, DType.F16, k, k, false));
    assertStatus(Status.INVALID_ARGUMENT,
        () -> cache.append(1, 0, 4, DType.F32, TestData.shorts(4 * ROW),
            TestData.shorts(4 * ROW), false));
    assertEquals(0, cache.length(1, 0));
    cache.append(1, 0, k, k);
    FloatBuffer q = TestData.randomFloats(rng, HQ * D, 1f);
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.attention(0, new long[] {1}, HQ,
        TestData.randomFloats(rng, HQ * D - 1, 1f), TestData.zeros(HQ * D)));
    assertStatus(Status.BUFFER_TOO_SMALL, () -> cache.attention(0, new long[] {1}, HQ, q,
        TestData.zeros(HQ * D - 1)));
    assertStatus(Status.BUFFER_TOO_SMALL, () -> cache.attention(0, new long[] {1},
        new AttentionParams(HQ), q, TestData.zeros(HQ * D), TestData.zeros(HQ - 1)));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.attention(0, new long[] {1},
        new AttentionParams(HQ).qDtype(DType.BF16), q, TestData.zeros(HQ * D), null));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.attention(0, new long[] {1}, HQ,
        FloatBuffer.wrap(new float[HQ * D]), TestData.zeros(HQ * D)));
    assertStatus(Status.INVALID_ARGUMENT, () -> cache.attention(0, new long[] {1}, HQ, q,
        FloatBuffer.allocate(HQ * D)));
  }

  @Test
  void closedCachesThrowAndKeepTheirContextAlive() {
    Context c = new Context();
    Cache k = new Cache(c, config, 1, HK, 1024, 2);
    float[][] kv = Reference.syntheticKv(rng, G + 1, HK, D);
    k.addSequence(1);
    // Closing the context first: the cache keeps working, the context refuses calls.
    c.close();
    assertTrue(c.isClosed());
    k.append(1, 0, slice(kv[0], 0, G + 1), slice(kv[1], 0, G + 1));
    assertEquals(G + 1, k.length(1, 0));
    assertStatus(Status.INVALID_ARGUMENT, c::backend);
    k.close();
    k.close();
    assertTrue(k.isClosed());
    assertStatus(Status.INVALID_ARGUMENT, () -> k.addSequence(2));
    assertStatus(Status.INVALID_ARGUMENT, () -> k.length(1, 0));
    assertStatus(Status.INVALID_ARGUMENT, k::stats);
    assertStatus(Status.INVALID_ARGUMENT, () -> k.exportSequence(1));
    assertStatus(Status.INVALID_ARGUMENT, () -> k.attention(0, new long[] {1}, HQ,
        TestData.zeros(HQ * D), TestData.zeros(HQ * D)));
    assertTrue(k.context().handle.isClosed());
  }

  @Test
  void theCleanerFreesForgottenHandles() throws InterruptedException {
    Handle[] handles = abandon();
    long deadline = System.nanoTime() + 20_000_000_000L;
    while ((!handles[0].isClosed() || !handles[1].isClosed()) && System.nanoTime() < deadline) {
      System.gc();
      Thread.sleep(20);
    }
    assertTrue(handles[1].isClosed(), "the forgotten cache was freed");
    assertTrue(handles[0].isClosed(), "the forgotten context was freed");
    assertEquals(0, handles[0].rawPtr(), "native context destroyed");
    assertEquals(0, handles[1].rawPtr(), "native cache destroyed");
  }

  private Handle[] abandon() {
    Context c = new Context();
    Cache k = new Cache(c, config, 1, HK, 1024, 2);
    k.addSequence(1);
    return new Handle[] {c.handle, cacheHandle(k)};
  }

  private static Handle cacheHandle(Cache k) {
    try {
      java.lang.reflect.Field f = Cache.class.getDeclaredField("handle");
      f.setAccessible(true);
      return (Handle) f.get(k);
    } catch (ReflectiveOperationException e) {
      throw new AssertionError(e);
    }
  }

  @Test
  void concurrentCallsOnOneCache() throws Exception {
    int threads = 4;
    float[][] kv = Reference.syntheticKv(rng, G + 8, HK, D);
    Thread[] workers = new Thread[threads];
    Throwable[] failures = new Throwable[threads];
    for (int i = 0; i < threads; i++) {
      final int id = i;
      workers[i] = new Thread(() -> {
        try {
          cache.addSequence(100 + id);
          for (int t = 0; t < G + 8; t += 8) {
            cache.append(100 + id, 0, slice(kv[0], t, t + 8), slice(kv[1], t, t + 8));
          }
          float[] q = Reference.gaussian(new Random(id), HQ * D);
          decode(100 + id, 0, q);
        } catch (Throwable e) {
          failures[id] = e;
        }
      });
      workers[i].start();
    }
    for (Thread w : workers) w.join();
    for (Throwable f : failures) {
      if (f != null) throw new AssertionError(f);
    }
    float[] q = Reference.gaussian(rng, HQ * D);
    float[] first = decode(100, 0, q);
    for (int i = 1; i < threads; i++) assertArrayEquals(first, decode(100 + i, 0, q));
  }
}
