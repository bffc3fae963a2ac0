/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

/**
 * Parameters of an attention call ({@code kvarn_attention_params_t}): query heads, softmax
 * scale, query/output dtypes, split-K partitions and, for extend (prefill) attention, the query
 * tokens per sequence. Mutable, with chained setters:
 *
 * <pre>{@code
 * AttentionParams p = new AttentionParams(32);                 // decode, f32 in and out
 * AttentionParams e = new AttentionParams(32).qIndptr(0, 5, 9); // extend: 5 and 4 query tokens
 * }</pre>
 */
public final class AttentionParams {
  private int numQHeads;
  private float scale;
  private int[] qIndptr;
  private DType qDtype = DType.F32;
  private DType outDtype = DType.F32;
  private int numSplits;

  /**
   * Decode parameters (one query token per sequence), f32 query and output, scale 1/sqrt(D).
   *
   * @param numQHeads Hq, a multiple of the cache's KV heads
   */
  public AttentionParams(int numQHeads) {
    this.numQHeads = numQHeads;
  }

  /**
   * Sets the query heads.
   *
   * @param heads Hq
   * @return this
   */
  public AttentionParams numQHeads(int heads) {
    this.numQHeads = heads;
    return this;
  }

  /**
   * Sets the softmax scale.
   *
   * @param s the scale; 0 = 1/sqrt(D)
   * @return this
   */
  public AttentionParams scale(float s) {
    this.scale = s;
    return this;
  }

  /**
   * Extend attention: query tokens [indptr[b], indptr[b+1]) belong to sequence b; query i of n_b
   * sees the keys up to its own position (causal, aligned to the sequence end). null = decode.
   *
   * @param indptr batch + 1 non-decreasing offsets starting at 0, or null
   * @return this
   */
  public AttentionParams qIndptr(int... indptr) {
    this.qIndptr = indptr == null ? null : indptr.clone();
    return this;
  }

  /**
   * Sets the query dtype.
   *
   * @param dtype dtype of q
   * @return this
   */
  public AttentionParams qDtype(DType dtype) {
    this.qDtype = dtype;
    return this;
  }

  /**
   * Sets the output dtype.
   *
   * @param dtype dtype of out
   * @return this
   */
  public AttentionParams outDtype(DType dtype) {
    this.outDtype = dtype;
    return this;
  }

  /**
   * Sets the split-K partitions per (sequence, KV head).
   *
   * @param splits partitions; 0 = automatic
   * @return this
   */
  public AttentionParams numSplits(int splits) {
    this.numSplits = splits;
    return this;
  }

  /**
   * Query heads.
   *
   * @return Hq
   */
  public int numQHeads() {
    return numQHeads;
  }

  /**
   * Softmax scale (0 = 1/sqrt(D)).
   *
   * @return the scale
   */
  public float scale() {
    return scale;
  }

  /**
   * Query offsets of extend attention (a copy), or null for decode.
   *
   * @return the offsets or null
   */
  public int[] qIndptr() {
    return qIndptr == null ? null : qIndptr.clone();
  }

  int[] qIndptrRef() {
    return qIndptr;
  }

  /**
   * Query dtype.
   *
   * @return dtype of q
   */
  public DType qDtype() {
    return qDtype;
  }

  /**
   * Output dtype.
   *
   * @return dtype of out
   */
  public DType outDtype() {
    return outDtype;
  }

  /**
   * Split-K partitions (0 = automatic).
   *
   * @return the partitions
   */
  public int numSplits() {
    return numSplits;
  }
}
