/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import static io.kvarn.TestData.assertStatus;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.ShortBuffer;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

class ContextTest {
  private static final int D = 128;
  private static final int G = 128;
  private final Random rng = new Random(1234);
  private final Config config = Config.fromPreset("k4v2_g128", D);
  private Context ctx;

  @BeforeEach
  void open() {
    ctx = new Context(Backend.CPU, 0, 2);
  }

  @AfterEach
  void close() {
    ctx.close();
  }

  @Test
  void describesItself() {
    assertEquals(Backend.CPU, ctx.backend());
    assertEquals(0, ctx.device());
    assertEquals(2, ctx.numThreads());
    assertNotEquals(CpuIsa.NONE, ctx.cpuIsa());
    ctx.synchronize();
    assertTrue(ctx.toString().contains("cpu"), ctx.toString());
  }

  @Test
  void quantizeRoundTripsRandomTiles() {
    float[][] kv = Reference.syntheticKv(rng, 3 * G, 1, D);
    FloatBuffer k = TestData.floats(kv[0]);
    FloatBuffer v = TestData.floats(kv[1]);
    ByteBuffer records = ctx.quantize(config, k, v);
    assertEquals(3 * config.recordBytes(), records.remaining());
    assertEquals(0, k.position(), "inputs are not consumed");
    FloatBuffer k2 = TestData.zeros(3 * G * D);
    FloatBuffer v2 = TestData.zeros(3 * G * D);
    ctx.dequantize(config, records, k2, v2);
    double kErr = Reference.relativeL2(TestData.array(k2), kv[0]);
    double vErr = Reference.relativeL2(TestData.array(v2), kv[1]);
    assertTrue(kErr > 0 && kErr < 0.15, "K error " + kErr);
    assertTrue(vErr > 0 && vErr < 0.6, "V error " + vErr);
    // Deterministic, and the same bytes whatever the thread count.
    try (Context one = new Context(Backend.CPU, 0, 1)) {
      assertEquals(records, one.quantize(config, k, v));
    }
  }

  @Test
  void f16AndByteBufferInputsGiveTheSameRecords() {
    int n = G * D;
    float[][] kv = Reference.syntheticKv(rng, G, 1, D);
    ShortBuffer kh = TestData.shorts(n);
    ShortBuffer vh = TestData.shorts(n);
    float[] kr = new float[n];
    float[] vr = new float[n];
    for (int i = 0; i < n; i++) {
      kh.put(i, TestData.toHalf(kv[0][i]));
      vh.put(i, TestData.toHalf(kv[1][i]));
      kr[i] = TestData.fromHalf(kh.get(i));
      vr[i] = TestData.fromHalf(vh.get(i));
    }
    ByteBuffer fromHalf = ctx.quantize(config, kh, vh);
    // The f16 values widened to f32 are the same numbers: the same records.
    assertEquals(fromHalf, ctx.quantize(config, TestData.floats(kr), TestData.floats(vr)));
    // A ByteBuffer with an explicit dtype.
    ByteBuffer kb = ByteBuffer.allocateDirect(2 * n).order(ByteOrder.nativeOrder());
    ByteBuffer vb = ByteBuffer.allocateDirect(2 * n).order(ByteOrder.nativeOrder());
    kb.asShortBuffer().put(kh.duplicate());
    vb.asShortBuffer().put(vh.duplicate());
    ByteBuffer records = ByteBuffer.allocateDirect((int) config.recordBytes());
    ctx.quantize(config, 1, DType.F16, kb, vb, records, config.recordBytes(), false);
    assertEquals(fromHalf, records);
    // Dequantize to f16 agrees with f32 to fp16 rounding.
    ShortBuffer k16 = TestData.shorts(n);
    FloatBuffer k32 = TestData.zeros(n);
    ctx.dequantize(config, 1, records, config.recordBytes(), false, DType.F16, k16, null);
    ctx.dequantize(config, 1, records, config.recordBytes(), false, DType.F32, k32, null);
    for (int i = 0; i < n; i++) {
      float a = TestData.fromHalf(k16.get(i));
      float b = k32.get(i);
      assertTrue(Math.abs(a - b) <= Math.abs(b) * 1e-3 + 1e-4, i + ": " + a + " vs " + b);
    }
  }

  @Test
  void bf16InputsAreTheirF32Values() {
    int n = G * D;
    float[][] kv = Reference.syntheticKv(rng, G, 1, D);
    ShortBuffer kb = TestData.shorts(n);
    ShortBuffer vb = TestData.shorts(n);
    float[] kr = new float[n];
    float[] vr = new float[n];
    for (int i = 0; i < n; i++) {
      // bf16 = the upper half of the f32 bits (truncation is fine: these are the inputs).
      kb.put(i, (short) (Float.floatToIntBits(kv[0][i]) >>> 16));
      vb.put(i, (short) (Float.floatToIntBits(kv[1][i]) >>> 16));
      kr[i] = Float.intBitsToFloat((kb.get(i) & 0xffff) << 16);
      vr[i] = Float.intBitsToFloat((vb.get(i) & 0xffff) << 16);
    }
    ByteBuffer records = ByteBuffer.allocateDirect((int) config.recordBytes());
    ctx.quantize(config, 1, DType.BF16, kb, vb, records, config.recordBytes(), false);
    assertEquals(ctx.quantize(config, TestData.floats(kr), TestData.floats(vr)), records);
    // A ShortBuffer alone means f16: different numbers, different records.
    assertNotEquals(records, ctx.quantize(config, kb, vb));
  }

  @Test
  void elementCountsThatOverflowAreRefused() {
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.rotate(D, Long.MAX_VALUE / 2, DType.F32,
        TestData.zeros(D), DType.F32, TestData.zeros(D)));
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.rotate(D, -1, DType.F32,
        TestData.zeros(D), DType.F32, TestData.zeros(D)));
  }

  @Test
  void strideLeavesPaddingAndPositionsAreHonoured() {
    int n = 2 * G * D;
    FloatBuffer k = TestData.randomFloats(rng, n, 1f);
    FloatBuffer v = TestData.randomFloats(rng, n, 1f);
    long rb = config.recordBytes();
    long stride = rb + 64;
    ByteBuffer records = ByteBuffer.allocateDirect((int) (2 * stride + 16));
    for (int i = 0; i < records.capacity(); i++) records.put(i, (byte) 0x5a);
    records.position(16);
    ctx.quantize(config, 2, DType.F32, k, v, records, stride, false);
    assertEquals(16, records.position());
    for (int i = 0; i < 16; i++) assertEquals(0x5a, records.get(i), "before the position");
    for (long i = 16 + rb; i < 16 + stride; i++) assertEquals(0x5a, records.get((int) i), "pad");
    ByteBuffer packed = ctx.quantize(config, k, v);
    for (int t = 0; t < 2; t++) {
      for (int i = 0; i < rb; i++) {
        assertEquals(packed.get((int) (t * rb + i)), records.get((int) (16 + t * stride + i)));
      }
    }
    // An input read from its position: tile 1 alone gives record 1.
    FloatBuffer k1 = k.duplicate();
    k1.position(G * D);
    FloatBuffer v1 = v.duplicate();
    v1.position(G * D);
    ByteBuffer second = ctx.quantize(config, k1, v1);
    assertEquals(packed.duplicate().position((int) rb), second);
  }

  @Test
  void cacheFrameQuantizeAndDequantize() {
    FloatBuffer k = TestData.randomFloats(rng, G * D, 1f);
    FloatBuffer v = TestData.randomFloats(rng, G * D, 1f);
    ByteBuffer records = ctx.quantize(config, k, v);
    FloatBuffer kf = TestData.zeros(G * D);
    ctx.dequantize(config, 1, records, config.recordBytes(), true, DType.F32, kf, null);
    FloatBuffer ku = TestData.zeros(G * D);
    ctx.dequantize(config, 1, records, config.recordBytes(), false, DType.F32, ku, null);
    // The cache frame is the rotation of the unrotated output.
    FloatBuffer rotated = TestData.zeros(G * D);
    ctx.rotate(D, G, DType.F32, ku, DType.F32, rotated);
    assertTrue(Reference.relativeL2(TestData.array(rotated), TestData.array(kf)) < 1e-5);
    assertFalse(Reference.relativeL2(TestData.array(ku), TestData.array(kf)) < 0.1);
  }

  @Test
  void rotateIsItsOwnInverse() {
    FloatBuffer x = TestData.randomFloats(rng, 5 * 64, 3f);
    FloatBuffer y = TestData.zeros(5 * 64);
    FloatBuffer z = TestData.zeros(5 * 64);
    ctx.rotate(64, 5, DType.F32, x, DType.F32, y);
    ctx.rotate(64, 5, DType.F32, y, DType.F32, z);
    assertTrue(Reference.relativeL2(TestData.array(y), TestData.array(x)) > 0.5);
    assertTrue(Reference.relativeL2(TestData.array(z), TestData.array(x)) < 1e-6);
  }

  @Test
  void heapBuffersAreRefused() {
    FloatBuffer heap = FloatBuffer.allocate(G * D);
    FloatBuffer v = TestData.randomFloats(rng, G * D, 1f);
    KvarnException e = assertStatus(Status.INVALID_ARGUMENT, () -> ctx.quantize(config, heap, v));
    assertTrue(e.getMessage().contains("heap"), e.getMessage());
    ByteBuffer heapRecords = ByteBuffer.allocate((int) config.recordBytes());
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.quantize(config, 1, DType.F32,
        TestData.randomFloats(rng, G * D, 1f), v, heapRecords, config.recordBytes(), false));
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.rotate(D, 1, DType.F32,
        FloatBuffer.wrap(new float[D]), DType.F32, TestData.zeros(D)));
  }

  @Test
  void tooSmallBuffersAreRefused() {
    FloatBuffer k = TestData.randomFloats(rng, G * D, 1f);
    FloatBuffer shortV = TestData.randomFloats(rng, G * D - 1, 1f);
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.quantize(config, 1, DType.F32, k, shortV,
        ByteBuffer.allocateDirect((int) config.recordBytes()), config.recordBytes(), false));
    ByteBuffer small = ByteBuffer.allocateDirect((int) config.recordBytes() - 1);
    assertStatus(Status.BUFFER_TOO_SMALL, () -> ctx.quantize(config, 1, DType.F32, k, k, small,
        config.recordBytes(), false));
    ByteBuffer records = ctx.quantize(config, k, k);
    assertStatus(Status.BUFFER_TOO_SMALL, () -> ctx.dequantize(config, records,
        TestData.zeros(G * D - 1), null));
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.dequantize(config,
        records.duplicate().limit(100), TestData.zeros(G * D), null));
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.quantize(config, 1, DType.F32, k, k, records,
        config.recordBytes() - 2, false));
    // Whole tiles only for the packing overload.
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.quantize(config, shortV, shortV));
    assertStatus(Status.BUFFER_TOO_SMALL, () -> ctx.rotate(D, 2, DType.F32,
        TestData.zeros(2 * D), DType.F16, TestData.shorts(2 * D - 1)));
  }

  @Test
  void wrongDtypesAreRefused() {
    FloatBuffer k = TestData.randomFloats(rng, G * D, 1f);
    ByteBuffer records = ByteBuffer.allocateDirect((int) config.recordBytes());
    KvarnException e = assertStatus(Status.INVALID_ARGUMENT,
        () -> ctx.quantize(config, 1, DType.F16, k, k, records, config.recordBytes(), false));
    assertTrue(e.getMessage().contains("f16"), e.getMessage());
    ShortBuffer h = TestData.shorts(G * D);
    assertStatus(Status.INVALID_ARGUMENT,
        () -> ctx.quantize(config, 1, DType.F32, h, h, records, config.recordBytes(), false));
    java.nio.IntBuffer ints = ByteBuffer.allocateDirect(4 * G * D).order(ByteOrder.nativeOrder())
        .asIntBuffer();
    assertStatus(Status.INVALID_ARGUMENT,
        () -> ctx.quantize(config, 1, DType.F32, ints, ints, records, config.recordBytes(), false));
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.quantize(config, ints, ints));
    // Foreign byte order, read-only outputs, misaligned data.
    ByteBuffer big = ByteBuffer.allocateDirect(4 * G * D).order(ByteOrder.BIG_ENDIAN);
    if (ByteOrder.nativeOrder() != ByteOrder.BIG_ENDIAN) {
      assertStatus(Status.INVALID_ARGUMENT, () -> ctx.quantize(config, 1, DType.F32, big, big,
          records, config.recordBytes(), false));
    }
    ByteBuffer records2 = ctx.quantize(config, k, k);
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.dequantize(config, records2,
        TestData.zeros(G * D).asReadOnlyBuffer(), null));
    ByteBuffer odd = ByteBuffer.allocateDirect(4 * G * D + 1).order(ByteOrder.nativeOrder());
    odd.position(1);
    assertStatus(Status.INVALID_ARGUMENT, () -> ctx.quantize(config, 1, DType.F32, odd, odd,
        records, config.recordBytes(), false));
  }

  @Test
  void cLevelErrorsKeepTheirStatusAndWriteNothing() {
    float[] x = new float[G * D];
    for (int i = 0; i < x.length; i++) x[i] = (float) rng.nextGaussian();
    x[777] = Float.NaN;
    ByteBuffer records = ByteBuffer.allocateDirect((int) config.recordBytes());
    KvarnException e = assertStatus(Status.NON_FINITE, () -> ctx.quantize(config, 1, DType.F32,
        TestData.floats(x), TestData.floats(x), records, config.recordBytes(), false));
    assertFalse(e.detail().isEmpty());
    for (int i = 0; i < records.capacity(); i++) assertEquals(0, records.get(i));
    x[777] = 1e6f;
    assertStatus(Status.OVERFLOW, () -> ctx.quantize(config, 1, DType.F32, TestData.floats(x),
        TestData.floats(x), records, config.recordBytes(), false));
    assertStatus(Status.UNSUPPORTED, () -> ctx.rotate(100, 1, DType.F32, TestData.zeros(100),
        DType.F32, TestData.zeros(100)));
  }

  @Test
  void closedContextsThrowAndCloseIsIdempotent() {
    Context c = new Context();
    FloatBuffer k = TestData.randomFloats(rng, G * D, 1f);
    c.close();
    assertTrue(c.isClosed());
    c.close();
    assertStatus(Status.INVALID_ARGUMENT, () -> c.quantize(config, k, k));
    assertStatus(Status.INVALID_ARGUMENT, c::backend);
    assertStatus(Status.INVALID_ARGUMENT, () -> new Cache(c, config, 1, 1, 1024, 1));
    assertEquals("Context(closed)", c.toString());
  }
}
