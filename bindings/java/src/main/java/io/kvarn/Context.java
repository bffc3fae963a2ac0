/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import io.kvarn.internal.KvarnNative;
import io.kvarn.internal.NativeConfig;
import io.kvarn.internal.NativeContextOptions;
import java.lang.ref.Cleaner;
import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.FloatBuffer;

/**
 * A libkvarn context ({@code kvarn_context_t}): the backend, device and CPU threads that run the
 * calls, and the codec (layer 1): {@link #rotate}, {@link #quantize} and {@link #dequantize}.
 *
 * <p>Tensors are direct NIO buffers in the native byte order, read from their position, never
 * copied; host memory, so the codec runs on CPU contexts (a GPU context refuses host memory with
 * {@link Status#INVALID_ARGUMENT}). Calls on one context are serialized. Close it when done
 * (try-with-resources); one that is not closed is freed after it becomes unreachable. A context
 * with open {@link Cache caches} is freed when the last of them is closed; using a closed context
 * throws {@link KvarnException} with {@link Status#INVALID_ARGUMENT}.
 *
 * <pre>{@code
 * try (Context ctx = new Context()) {
 *   Config config = Config.fromPreset("k4v2_g128", 128);
 *   ByteBuffer records = ctx.quantize(config, k, v);     // k, v: FloatBuffer [n_tiles][G][D]
 *   ctx.dequantize(config, records, k2, v2);
 * }
 * }</pre>
 */
public final class Context implements AutoCloseable {
  final Handle handle;
  private final Cleaner.Cleanable cleanable;

  /** A CPU context using every core. */
  public Context() {
    this(Backend.CPU, 0, 0);
  }

  /**
   * A context on a backend (device 0, every core for the CPU).
   *
   * @param backend the backend; {@link Backend#AUTO} picks a GPU when one is present
   * @throws KvarnException BACKEND_UNAVAILABLE when the backend is not built or has no device
   */
  public Context(Backend backend) {
    this(backend, 0, 0);
  }

  /**
   * A context.
   *
   * @param backend the backend; {@link Backend#AUTO} picks a GPU when one is present
   * @param device the device ordinal for GPU backends
   * @param numThreads CPU worker threads, 0 = hardware concurrency
   * @throws KvarnException BACKEND_UNAVAILABLE when the backend is not built or has no device
   */
  public Context(Backend backend, int device, int numThreads) {
    if (backend == null) throw Buffers.invalid("the backend is null");
    NativeContextOptions options = new NativeContextOptions();
    long[] out = new long[1];
    try {
      options.setBackend(backend.code());
      options.setDevice(device);
      options.setNum_threads(numThreads);
      KvarnNative.context_create(options, out);
    } finally {
      options.delete();
    }
    handle = new Handle("context", out[0], KvarnNative::context_destroy, null);
    cleanable = handle.register(this);
  }

  /**
   * The backend that runs this context's calls (never AUTO).
   *
   * @return the backend
   */
  public Backend backend() {
    synchronized (handle) {
      int[] out = new int[1];
      KvarnNative.context_get_backend(handle.ptr(), out);
      return Backend.fromCode(out[0]);
    }
  }

  /**
   * The CPU ISA of this context ({@link CpuIsa#NONE} on GPU contexts).
   *
   * @return the ISA
   */
  public CpuIsa cpuIsa() {
    synchronized (handle) {
      int[] out = new int[1];
      KvarnNative.context_get_cpu_isa(handle.ptr(), out);
      return CpuIsa.fromCode(out[0]);
    }
  }

  /**
   * The device ordinal (0 for the CPU).
   *
   * @return the device
   */
  public int device() {
    synchronized (handle) {
      int[] out = new int[1];
      KvarnNative.context_get_device(handle.ptr(), out);
      return out[0];
    }
  }

  /**
   * CPU worker threads (1 for GPU contexts).
   *
   * @return the thread count
   */
  public int numThreads() {
    synchronized (handle) {
      int[] out = new int[1];
      KvarnNative.context_get_num_threads(handle.ptr(), out);
      return out[0];
    }
  }

  /** Waits until the context's queued work is complete (a no-op on the CPU). */
  public void synchronize() {
    synchronized (handle) {
      KvarnNative.context_synchronize(handle.ptr());
    }
  }

  /**
   * Rotates rows by the orthonormal Hadamard matrix (its own inverse, so this also un-rotates).
   *
   * @param headDim D of each row: 64, 80, 96, 128, 256 or 512 (80 and 96: CPU contexts only)
   * @param nRows rows
   * @param inDtype dtype of in
   * @param in [nRows][headDim] of inDtype
   * @param outDtype dtype of out
   * @param out [nRows][headDim] of outDtype (may be the same memory as in when the dtypes agree)
   */
  public void rotate(int headDim, long nRows, DType inDtype, Buffer in, DType outDtype,
      Buffer out) {
    if (headDim <= 0 || nRows < 0) throw Buffers.invalid("headDim must be > 0 and nRows >= 0");
    long n = Buffers.product("rotate", nRows, headDim, 1);
    Buffer inView = Buffers.tensor(in, "in", inDtype, n, false);
    Buffer outView = Buffers.tensor(out, "out", outDtype, n, true);
    synchronized (handle) {
      KvarnNative.rotate(handle.ptr(), headDim, nRows, inDtype.code(), inView, outDtype.code(),
          outView);
    }
  }

  /**
   * Quantizes (K, V) tile pairs into records.
   *
   * @param config the configuration
   * @param nTiles tiles
   * @param dtype dtype of k and v
   * @param k [nTiles][G][D] keys, unrotated unless cacheFrame
   * @param v [nTiles][G][D] values, likewise
   * @param records nTiles records, recordStride bytes apart
   * @param recordStride bytes between records, at least {@link Config#recordBytes()}
   * @param cacheFrame the inputs are already rotated fp16 values (KVARN_CODEC_CACHE_FRAME)
   * @throws KvarnException NON_FINITE for NaN/Inf, OVERFLOW beyond fp16; nothing is written then
   */
  public void quantize(Config config, int nTiles, DType dtype, Buffer k, Buffer v,
      ByteBuffer records, long recordStride, boolean cacheFrame) {
    long elements = tileElements(config, nTiles);
    Buffer kView = Buffers.tensor(k, "k", dtype, elements, false);
    Buffer vView = Buffers.tensor(v, "v", dtype, elements, false);
    ByteBuffer rView = Buffers.bytes(records, "records", recordSpan(config, nTiles, recordStride),
        true);
    NativeConfig c = config.toNative();
    try {
      synchronized (handle) {
        KvarnNative.quantize(handle.ptr(), c, nTiles, dtype.code(), kView, vView,
            cacheFrame ? KvarnNative.CODEC_CACHE_FRAME : KvarnNative.CODEC_DEFAULT, rView,
            recordStride);
      }
    } finally {
      c.delete();
    }
  }

  /**
   * Quantizes whole tiles of unrotated K and V into a new direct buffer of packed records.
   *
   * @param config the configuration
   * @param k keys [n_tiles][G][D], a FloatBuffer (f32) or a ShortBuffer (f16)
   * @param v values, the same shape and type
   * @return n_tiles records of {@link Config#recordBytes()} bytes each
   */
  public ByteBuffer quantize(Config config, Buffer k, Buffer v) {
    DType dtype = Buffers.infer(k, "k");
    long tile = (long) config.tileTokens() * config.headDim();
    long have = Buffers.elements(k, dtype);
    if (tile <= 0 || have % tile != 0) {
      throw Buffers.invalid("k: " + have + " elements are not whole tiles of " + tile);
    }
    int nTiles = Math.toIntExact(have / tile);
    long recordBytes = config.recordBytes();
    ByteBuffer records = Buffers.allocate(nTiles * recordBytes);
    quantize(config, nTiles, dtype, k, v, records, recordBytes, false);
    return records;
  }

  /**
   * Reconstructs tiles from records.
   *
   * @param config the configuration
   * @param nTiles tiles
   * @param records nTiles records, recordStride bytes apart
   * @param recordStride bytes between records
   * @param cacheFrame return the cache frame (rotated), not the un-rotated tensors
   * @param outDtype dtype of kOut and vOut
   * @param kOut [nTiles][G][D] keys, or null to skip them
   * @param vOut [nTiles][G][D] values, or null to skip them
   */
  public void dequantize(Config config, int nTiles, ByteBuffer records, long recordStride,
      boolean cacheFrame, DType outDtype, Buffer kOut, Buffer vOut) {
    long elements = tileElements(config, nTiles);
    ByteBuffer rView = Buffers.bytes(records, "records", recordSpan(config, nTiles, recordStride),
        false);
    Buffer kView = kOut == null ? null : Buffers.tensor(kOut, "kOut", outDtype, elements, true);
    Buffer vView = vOut == null ? null : Buffers.tensor(vOut, "vOut", outDtype, elements, true);
    if (outDtype == null) throw Buffers.invalid("outDtype is null");
    NativeConfig c = config.toNative();
    try {
      synchronized (handle) {
        KvarnNative.dequantize(handle.ptr(), c, nTiles, rView, recordStride,
            cacheFrame ? KvarnNative.CODEC_CACHE_FRAME : KvarnNative.CODEC_DEFAULT,
            outDtype.code(), kView, vView);
      }
    } finally {
      c.delete();
    }
  }

  /**
   * Reconstructs the unrotated f32 tiles of packed records (as {@link #quantize(Config, Buffer,
   * Buffer)} returns them).
   *
   * @param config the configuration
   * @param records packed records: its remaining bytes are whole records
   * @param kOut [n_tiles][G][D] f32 keys, or null
   * @param vOut [n_tiles][G][D] f32 values, or null
   */
  public void dequantize(Config config, ByteBuffer records, FloatBuffer kOut, FloatBuffer vOut) {
    if (records == null) throw Buffers.invalid("records is null");
    long recordBytes = config.recordBytes();
    if (records.remaining() % recordBytes != 0) {
      throw Buffers.invalid("records: " + records.remaining() + " bytes are not whole records of "
          + recordBytes);
    }
    dequantize(config, Math.toIntExact(records.remaining() / recordBytes), records, recordBytes,
        false, DType.F32, kOut, vOut);
  }

  /**
   * Whether {@link #close()} was called.
   *
   * @return true once closed
   */
  public boolean isClosed() {
    return handle.isClosed();
  }

  /** Frees the context (after its last open cache); idempotent. */
  @Override
  public void close() {
    cleanable.clean();
  }

  @Override
  public String toString() {
    if (isClosed()) return "Context(closed)";
    return "Context(" + backend().name().toLowerCase(java.util.Locale.ROOT) + ", device "
        + device() + ", " + numThreads() + " thread(s))";
  }

  private static long tileElements(Config config, int nTiles) {
    if (config == null) throw Buffers.invalid("the config is null");
    if (nTiles < 0) throw Buffers.invalid("nTiles must be >= 0");
    return (long) nTiles * config.tileTokens() * config.headDim();
  }

  private static long recordSpan(Config config, int nTiles, long recordStride) {
    long recordBytes = config.recordBytes();
    if (recordStride < recordBytes) {
      throw Buffers.invalid("recordStride " + recordStride + " is below the record size "
          + recordBytes);
    }
    return nTiles == 0 ? 0 : (nTiles - 1) * recordStride + recordBytes;
  }
}
