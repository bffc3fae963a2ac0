/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

/**
 * Parameters of an attention call ({@code kvarn_attention_params_t}): query heads, softmax
 * scale, query/output dtypes, split-K partitions, for extend (prefill) attention the query
 * tokens per sequence, and the model variants (learned sinks, sliding window, logit softcap,
 * prefix mode; docs/API.md "Model variants"). Mutable, with chained setters:
 *
 * <pre>{@code
 * AttentionParams p = new AttentionParams(32);                 // decode, f32 in and out
 * AttentionParams e = new AttentionParams(32).qIndptr(0, 5, 9); // extend: 5 and 4 query tokens
 * AttentionParams w = new AttentionParams(64).slidingWindow(128).sinks(sinkLogits); // gpt-oss
 * }</pre>
 */
public final class AttentionParams {
  private int numQHeads;
  private float scale;
  private int[] qIndptr;
  private DType qDtype = DType.F32;
  private DType outDtype = DType.F32;
  private int numSplits;
  private float[] sinks;
  private int slidingWindow;
  private float logitSoftcap;
  private Mode mode = Mode.CAUSAL;

  /** Which cached keys a query sees ({@code kvarn_attention_mode_t}). */
  public enum Mode {
    /** The queries are the last tokens of the cache (appended before the call). */
    CAUSAL(0),
    /**
     * The queries follow the cache (not appended) and see every cached key: for merging with an
     * attention over the new tokens by log-sum-exp.
     */
    PREFIX(1);

    private final int code;

    Mode(int code) {
      this.code = code;
    }

    int code() {
      return code;
    }
  }

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
   * Learned sink logits (gpt-oss): one per query head, each joining its head's softmax
   * denominator with no value. null = none.
   *
   * @param logits numQHeads finite values (copied), or null
   * @return this
   */
  public AttentionParams sinks(float... logits) {
    this.sinks = logits == null ? null : logits.clone();
    return this;
  }

  /**
   * Sliding window: a query sees the {@code w} most recent keys, itself included (transformers'
   * {@code config.sliding_window}). 0 = full attention.
   *
   * @param w the window, >= 0
   * @return this
   */
  public AttentionParams slidingWindow(int w) {
    this.slidingWindow = w;
    return this;
  }

  /**
   * Logit softcap (Gemma 2): scores s become c * tanh(s / c) before the softmax. 0 = off.
   *
   * @param c the cap, >= 0
   * @return this
   */
  public AttentionParams logitSoftcap(float c) {
    this.logitSoftcap = c;
    return this;
  }

  /**
   * Sets the mode.
   *
   * @param m causal (default) or prefix
   * @return this
   */
  public AttentionParams mode(Mode m) {
    this.mode = m == null ? Mode.CAUSAL : m;
    return this;
  }

  /**
   * Sink logits (a copy), or null.
   *
   * @return the logits or null
   */
  public float[] sinks() {
    return sinks == null ? null : sinks.clone();
  }

  float[] sinksRef() {
    return sinks;
  }

  /**
   * Sliding window (0 = full attention).
   *
   * @return the window
   */
  public int slidingWindow() {
    return slidingWindow;
  }

  /**
   * Logit softcap (0 = off).
   *
   * @return the cap
   */
  public float logitSoftcap() {
    return logitSoftcap;
  }

  /**
   * The mode.
   *
   * @return causal or prefix
   */
  public Mode mode() {
    return mode;
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
