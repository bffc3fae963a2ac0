/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import io.kvarn.internal.KvarnNative;
import io.kvarn.internal.NativeAttentionParams;
import io.kvarn.internal.NativeCacheOptions;
import io.kvarn.internal.NativeCacheStats;
import io.kvarn.internal.NativeConfig;
import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import java.nio.IntBuffer;

/**
 * A managed KV cache ({@code kvarn_cache_t}, layer 3): sequences named by caller-chosen long ids,
 * append (committed or speculative), commit, truncate, fork with shared records, attention over
 * the quantized cache, statistics and export/import of a sequence as a checksummed blob.
 *
 * <p>K/V to append are [n_tokens][Hk][D], queries and outputs [tokens][Hq][D], unrotated, in
 * direct buffers of the native byte order (FloatBuffer for f32, ShortBuffer for f16 or bf16 bit
 * patterns, or ByteBuffer with an explicit {@link DType}); they are read from their position and
 * never copied. A tile of G tokens is quantized once, when all its tokens are committed (sink
 * tiles stay fp16). Any failing call leaves the cache as it was. The cache keeps its context
 * alive; close it when done (one that is not closed is freed after it becomes unreachable).
 *
 * <pre>{@code
 * try (Context ctx = new Context();
 *      Cache cache = new Cache(ctx, Config.fromPreset("k4v2_g128", 128), 32, 8, 1 << 20, 64)) {
 *   cache.addSequence(42);
 *   cache.append(42, layer, k, v);                            // FloatBuffers [n][8][128]
 *   cache.attention(layer, new long[] {42}, new AttentionParams(32), q, out, null);
 * }
 * }</pre>
 */
public final class Cache implements AutoCloseable {
  private final Context context;
  private final Config config;
  private final int numLayers;
  private final int numKvHeads;
  private final Handle handle;
  private final Cleaner.Cleanable cleanable;

  /**
   * Creates a cache on a context.
   *
   * @param context the context (CPU for host buffers)
   * @param config the quantization configuration
   * @param numLayers layers, at least 1
   * @param numKvHeads KV heads Hk, at least 1
   * @param maxTokens capacity in tokens over all sequences
   * @param maxSequences sequences the cache can hold at once
   * @throws KvarnException INVALID_ARGUMENT / UNSUPPORTED for bad options, OUT_OF_MEMORY
   */
  public Cache(Context context, Config config, int numLayers, int numKvHeads, long maxTokens,
      int maxSequences) {
    if (context == null) throw Buffers.invalid("the context is null");
    if (config == null) throw Buffers.invalid("the config is null");
    this.context = context;
    this.config = config;
    this.numLayers = numLayers;
    this.numKvHeads = numKvHeads;
    NativeCacheOptions options = new NativeCacheOptions();
    NativeConfig c = config.toNative();
    long[] out = new long[1];
    try {
      options.setConfig(c);
      options.setNum_layers(numLayers);
      options.setNum_kv_heads(numKvHeads);
      options.setMax_tokens(maxTokens);
      options.setMax_sequences(maxSequences);
      Handle ctx = context.handle;
      synchronized (ctx) {
        KvarnNative.cache_create(ctx.ptr(), options, out);
        try {
          ctx.retain();
        } catch (RuntimeException e) {
          KvarnNative.cache_destroy(out[0]);
          throw e;
        }
      }
    } finally {
      c.delete();
      options.delete();
    }
    handle = new Handle("cache", out[0], KvarnNative::cache_destroy, context.handle);
    cleanable = handle.register(this);
  }

  /**
   * The context the cache runs on.
   *
   * @return the context
   */
  public Context context() {
    return context;
  }

  /**
   * The quantization configuration.
   *
   * @return the config
   */
  public Config config() {
    return config;
  }

  /**
   * Layers.
   *
   * @return the layer count
   */
  public int numLayers() {
    return numLayers;
  }

  /**
   * KV heads Hk.
   *
   * @return the KV head count
   */
  public int numKvHeads() {
    return numKvHeads;
  }

  /**
   * Adds an empty sequence.
   *
   * @param seqId the new id
   * @throws KvarnException ALREADY_EXISTS, CAPACITY
   */
  public void addSequence(long seqId) {
    synchronized (handle) {
      long p = handle.ptr();
      synchronized (context.handle) {
        KvarnNative.cache_add_sequence(p, seqId);
      }
    }
  }

  /**
   * Removes a sequence and frees what only it used.
   *
   * @param seqId the id
   * @throws KvarnException NOT_FOUND
   */
  public void removeSequence(long seqId) {
    synchronized (handle) {
      long p = handle.ptr();
      synchronized (context.handle) {
        KvarnNative.cache_remove_sequence(p, seqId);
      }
    }
  }

  /**
   * A new sequence holding the first nTokens committed tokens of src in every layer; the records
   * of the shared prefix are shared, not copied.
   *
   * @param srcId the source sequence
   * @param dstId the new sequence
   * @param nTokens tokens to keep, -1 = all committed tokens
   * @throws KvarnException INVALID_STATE when nTokens cuts a quantized tile
   */
  public void fork(long srcId, long dstId, long nTokens) {
    synchronized (handle) {
      long p = handle.ptr();
      synchronized (context.handle) {
        KvarnNative.cache_fork(p, srcId, dstId, nTokens);
      }
    }
  }

  /**
   * Drops the tokens beyond nTokens in every layer (committed or speculative).
   *
   * @param seqId the sequence
   * @param nTokens tokens to keep
   * @throws KvarnException INVALID_STATE when nTokens falls inside a quantized tile
   */
  public void truncate(long seqId, long nTokens) {
    synchronized (handle) {
      long p = handle.ptr();
      synchronized (context.handle) {
        KvarnNative.cache_truncate(p, seqId, nTokens);
      }
    }
  }

  /**
   * Commits the first nTokens tokens of the sequence in every layer; completed tiles are
   * quantized.
   *
   * @param seqId the sequence
   * @param nTokens tokens to commit (every layer must hold at least that many)
   */
  public void commit(long seqId, long nTokens) {
    synchronized (handle) {
      long p = handle.ptr();
      synchronized (context.handle) {
        KvarnNative.cache_commit(p, seqId, nTokens);
      }
    }
  }

  /**
   * Appends committed tokens to one layer of a sequence; the token count is the buffer's
   * remaining elements / (Hk * D).
   *
   * @param seqId the sequence
   * @param layer the layer
   * @param k [n_tokens][Hk][D] keys, unrotated: a FloatBuffer (f32) or a ShortBuffer (f16)
   * @param v [n_tokens][Hk][D] values, the same type
   */
  public void append(long seqId, int layer, Buffer k, Buffer v) {
    DType dtype = Buffers.infer(k, "k");
    append(seqId, layer, tokensIn(k, dtype), dtype, k, v, false);
  }

  /**
   * Appends speculative tokens (attention sees them; they stay uncommitted until {@link #commit}
   * or {@link #truncate}).
   *
   * @param seqId the sequence
   * @param layer the layer
   * @param k [n_tokens][Hk][D] keys: a FloatBuffer (f32) or a ShortBuffer (f16)
   * @param v [n_tokens][Hk][D] values, the same type
   */
  public void appendSpeculative(long seqId, int layer, Buffer k, Buffer v) {
    DType dtype = Buffers.infer(k, "k");
    append(seqId, layer, tokensIn(k, dtype), dtype, k, v, true);
  }

  /**
   * Appends tokens to one layer of a sequence.
   *
   * @param seqId the sequence
   * @param layer the layer
   * @param nTokens tokens
   * @param dtype dtype of k and v
   * @param k [nTokens][Hk][D] keys, unrotated
   * @param v [nTokens][Hk][D] values, unrotated
   * @param speculative keep the tokens uncommitted
   * @throws KvarnException INVALID_STATE for a committed append while speculative tokens are
   *     pending, CAPACITY, NON_FINITE, OVERFLOW; the cache is unchanged then
   */
  public void append(long seqId, int layer, long nTokens, DType dtype, Buffer k, Buffer v,
      boolean speculative) {
    if (nTokens < 0) throw Buffers.invalid("nTokens must be >= 0");
    long elements = Buffers.product("append", nTokens, numKvHeads, config.headDim());
    Buffer kView = Buffers.tensor(k, "k", dtype, elements, false);
    Buffer vView = Buffers.tensor(v, "v", dtype, elements, false);
    long flags = speculative ? KvarnNative.APPEND_SPECULATIVE : KvarnNative.APPEND_DEFAULT;
    synchronized (handle) {
      long p = handle.ptr();
      synchronized (context.handle) {
        KvarnNative.cache_append(p, seqId, layer, nTokens, dtype.code(), kView, vView, flags);
      }
    }
  }

  /**
   * Tokens in one layer of a sequence (committed and speculative).
   *
   * @param seqId the sequence
   * @param layer the layer
   * @return the token count
   */
  public long length(long seqId, int layer) {
    return lengths(seqId, layer)[0];
  }

  /**
   * Committed tokens in one layer of a sequence.
   *
   * @param seqId the sequence
   * @param layer the layer
   * @return the committed count
   */
  public long committed(long seqId, int layer) {
    return lengths(seqId, layer)[1];
  }

  private long[] lengths(long seqId, int layer) {
    long[] tokens = new long[1];
    long[] committed = new long[1];
    synchronized (handle) {
      long p = handle.ptr();
      synchronized (context.handle) {
        KvarnNative.cache_sequence_length(p, seqId, layer, tokens, committed);
      }
    }
    return new long[] {tokens[0], committed[0]};
  }

  /**
   * Attention of queries over one layer of the cache: decode (one query token per sequence) or,
   * with {@link AttentionParams#qIndptr}, extend.
   *
   * @param layer the layer
   * @param seqIds the sequences, in batch order
   * @param params heads, scale, dtypes, query offsets
   * @param q [total_q_tokens][Hq][D] queries of params.qDtype, unrotated
   * @param out [total_q_tokens][Hq][D] of params.outDtype
   * @param lse [total_q_tokens][Hq] f32 log-sum-exp of the scaled scores, or null
   */
  public void attention(int layer, long[] seqIds, AttentionParams params, Buffer q, Buffer out,
      FloatBuffer lse) {
    if (seqIds == null) throw Buffers.invalid("seqIds is null");
    if (params == null) throw Buffers.invalid("params is null");
    int heads = params.numQHeads();
    if (heads <= 0) throw Buffers.invalid("numQHeads must be > 0");
    int[] indptr = params.qIndptrRef();
    long totalQ = seqIds.length;
    if (indptr != null) {
      if (indptr.length != seqIds.length + 1 || indptr[0] != 0) {
        throw Buffers.invalid("qIndptr needs seqIds.length + 1 = " + (seqIds.length + 1)
            + " entries starting at 0");
      }
      for (int i = 0; i < seqIds.length; i++) {
        if (indptr[i + 1] < indptr[i]) throw Buffers.invalid("qIndptr must not decrease");
      }
      totalQ = indptr[seqIds.length];
    }
    long elements = Buffers.product("attention", totalQ, heads, config.headDim());
    Buffer qView = Buffers.tensor(q, "q", params.qDtype(), elements, false);
    Buffer outView = Buffers.tensor(out, "out", params.outDtype(), elements, true);
    Buffer lseView = lse == null ? null : Buffers.tensor(lse, "lse", DType.F32, totalQ * heads, true);
    float[] sinks = params.sinksRef();
    if (sinks != null && sinks.length != heads) {
      throw Buffers.invalid("sinks has " + sinks.length + " entries; numQHeads " + heads
          + " needs one per query head");
    }
    IntBuffer indptrBuffer = null;
    FloatBuffer sinksBuffer = null;
    NativeAttentionParams p = new NativeAttentionParams();
    try {
      p.setNum_q_heads(heads);
      p.setScale(params.scale());
      p.setQ_dtype(params.qDtype().code());
      p.setOut_dtype(params.outDtype().code());
      p.setNum_splits(params.numSplits());
      p.setSliding_window(params.slidingWindow());
      p.setLogit_softcap(params.logitSoftcap());
      p.setMode(params.mode().code());
      if (sinks != null) {
        sinksBuffer = Buffers.allocate(4L * sinks.length).asFloatBuffer();
        sinksBuffer.put(sinks);
        p.set_sinks(KvarnNative.buffer_address(sinksBuffer));
      }
      if (indptr != null) {
        indptrBuffer = Buffers.allocate(4L * indptr.length).asIntBuffer();
        indptrBuffer.put(indptr);
        p.set_q_indptr(KvarnNative.buffer_address(indptrBuffer));
      }
      synchronized (handle) {
        long c = handle.ptr();
        synchronized (context.handle) {
          KvarnNative.cache_attention(c, layer, seqIds.length, seqIds, p, qView, outView,
              lseView);
        }
      }
    } finally {
      p.delete();
      Reference.reachabilityFence(indptrBuffer);
      Reference.reachabilityFence(sinksBuffer);
    }
  }

  /**
   * Decode attention with f32 queries and output (FloatBuffers [n_seqs][Hq][D]).
   *
   * @param layer the layer
   * @param seqIds the sequences
   * @param numQHeads Hq
   * @param q [seqIds.length][Hq][D] queries
   * @param out [seqIds.length][Hq][D] output
   */
  public void attention(int layer, long[] seqIds, int numQHeads, FloatBuffer q, FloatBuffer out) {
    attention(layer, seqIds, new AttentionParams(numQHeads), q, out, null);
  }

  /**
   * Statistics.
   *
   * @return the current statistics
   */
  public CacheStats stats() {
    NativeCacheStats s = new NativeCacheStats();
    try {
      synchronized (handle) {
        long p = handle.ptr();
        synchronized (context.handle) {
          KvarnNative.cache_get_stats(p, s);
        }
      }
      return new CacheStats(s.getSequences(), s.getTokens(), s.getCommitted_tokens(),
          s.getRecords(), s.getPages(), s.getBytes_used(), s.getBytes_capacity(),
          s.getFp16_bytes(), s.getCompression_ratio());
    } finally {
      s.delete();
    }
  }

  /**
   * Bytes of the blob {@link #exportSequence(long)} would write now.
   *
   * @param seqId the sequence
   * @return the blob size
   */
  public long exportSize(long seqId) {
    long[] bytes = new long[1];
    synchronized (handle) {
      long p = handle.ptr();
      synchronized (context.handle) {
        KvarnNative.cache_export_sequence(p, seqId, null, 0, bytes);
      }
    }
    return bytes[0];
  }

  /**
   * Serializes one sequence (all layers, committed and speculative state) into a buffer.
   *
   * @param seqId the sequence
   * @param dst a direct buffer with at least {@link #exportSize} bytes remaining
   * @return the blob's size in bytes (written from dst's position; the position does not move)
   * @throws KvarnException BUFFER_TOO_SMALL when dst is too small
   */
  public long exportSequence(long seqId, ByteBuffer dst) {
    long[] bytes = new long[1];
    synchronized (handle) {
      long p = handle.ptr();
      synchronized (context.handle) {
        KvarnNative.cache_export_sequence(p, seqId, null, 0, bytes);
        ByteBuffer view = Buffers.bytes(dst, "dst", bytes[0], true);
        KvarnNative.cache_export_sequence(p, seqId, view, view.remaining(), bytes);
      }
    }
    return bytes[0];
  }

  /**
   * Serializes one sequence into a new direct buffer.
   *
   * @param seqId the sequence
   * @return the blob (position 0, limit its size)
   */
  public ByteBuffer exportSequence(long seqId) {
    synchronized (handle) {
      ByteBuffer blob = Buffers.allocate(exportSize(seqId));
      exportSequence(seqId, blob);
      return blob;
    }
  }

  /**
   * Adds sequence seqId from a blob made by {@link #exportSequence} on a cache of the same config,
   * layers and KV heads.
   *
   * @param seqId the new sequence
   * @param blob a direct buffer: its remaining bytes are the blob
   * @throws KvarnException CORRUPT_DATA for a truncated, corrupted or foreign blob (the cache is
   *     unchanged), ALREADY_EXISTS
   */
  public void importSequence(long seqId, ByteBuffer blob) {
    ByteBuffer view = Buffers.bytes(blob, "blob", blob == null ? 0 : blob.remaining(), false);
    synchronized (handle) {
      long p = handle.ptr();
      synchronized (context.handle) {
        KvarnNative.cache_import_sequence(p, seqId, view, view.remaining());
      }
    }
  }

  /**
   * Whether {@link #close()} was called.
   *
   * @return true once closed
   */
  public boolean isClosed() {
    return handle.isClosed();
  }

  /** Frees the cache (and then the context, if it was closed already); idempotent. */
  @Override
  public void close() {
    cleanable.clean();
  }

  @Override
  public String toString() {
    return "Cache(" + config + ", layers=" + numLayers + ", kv_heads=" + numKvHeads
        + (isClosed() ? ", closed" : "") + ")";
  }

  private long tokensIn(Buffer k, DType dtype) {
    long row = (long) numKvHeads * config.headDim();
    long have = Buffers.elements(k, dtype);
    if (row <= 0 || have % row != 0) {
      throw Buffers.invalid("k: " + have + " elements are not whole tokens of Hk*D = " + row);
    }
    return have / row;
  }
}
