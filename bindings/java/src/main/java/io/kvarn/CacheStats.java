/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

/** Statistics of a managed cache ({@code kvarn_cache_stats_t}). */
public final class CacheStats {
  private final long sequences;
  private final long tokens;
  private final long committedTokens;
  private final long records;
  private final long pages;
  private final long bytesUsed;
  private final long bytesCapacity;
  private final long fp16Bytes;
  private final double compressionRatio;

  CacheStats(long sequences, long tokens, long committedTokens, long records, long pages,
      long bytesUsed, long bytesCapacity, long fp16Bytes, double compressionRatio) {
    this.sequences = sequences;
    this.tokens = tokens;
    this.committedTokens = committedTokens;
    this.records = records;
    this.pages = pages;
    this.bytesUsed = bytesUsed;
    this.bytesCapacity = bytesCapacity;
    this.fp16Bytes = fp16Bytes;
    this.compressionRatio = compressionRatio;
  }

  /**
   * Sequences in the cache.
   *
   * @return the count
   */
  public long sequences() {
    return sequences;
  }

  /**
   * Tokens, summed over sequences and layers.
   *
   * @return the count
   */
  public long tokens() {
    return tokens;
  }

  /**
   * Committed tokens, summed over sequences and layers.
   *
   * @return the count
   */
  public long committedTokens() {
    return committedTokens;
  }

  /**
   * Distinct records in use (one per tile per KV head per layer).
   *
   * @return the count
   */
  public long records() {
    return records;
  }

  /**
   * fp16 pages in use.
   *
   * @return the count
   */
  public long pages() {
    return pages;
  }

  /**
   * Record and page bytes in use.
   *
   * @return bytes
   */
  public long bytesUsed() {
    return bytesUsed;
  }

  /**
   * Bytes reserved by the pools.
   *
   * @return bytes
   */
  public long bytesCapacity() {
    return bytesCapacity;
  }

  /**
   * Bytes the same tokens take as an fp16 K/V cache.
   *
   * @return bytes
   */
  public long fp16Bytes() {
    return fp16Bytes;
  }

  /**
   * fp16Bytes / bytesUsed (0 when empty).
   *
   * @return the ratio
   */
  public double compressionRatio() {
    return compressionRatio;
  }

  @Override
  public String toString() {
    return "CacheStats(sequences=" + sequences + ", tokens=" + tokens + ", committed="
        + committedTokens + ", records=" + records + ", pages=" + pages + ", bytes_used="
        + bytesUsed + ", bytes_capacity=" + bytesCapacity + ", fp16_bytes=" + fp16Bytes
        + ", compression=" + String.format(java.util.Locale.ROOT, "%.2f", compressionRatio) + ")";
  }
}
