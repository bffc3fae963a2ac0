/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import io.kvarn.internal.KvarnNative;
import io.kvarn.internal.NativeConfig;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;

/**
 * A quantization configuration ({@code kvarn_config_t}): head dim D, tile tokens G, key and value
 * bits, Sinkhorn iterations, fp16 sink tiles and per-tensor ablation flags. Immutable; the
 * {@code with*} methods return modified copies.
 *
 * <pre>{@code
 * Config config = Config.fromPreset("k4v2_g128", 128);
 * long bytes = config.recordBytes();   // 13,824 bytes per 128 tokens of one KV head
 * }</pre>
 */
public final class Config {
  // The ABLATE_* values come from kvarn/kvarn_experimental.h: experimental, no stability promise
  // (they may change in any release); ABLATE_NONE (0) is the only stable value.

  /** Ablation flag: no ablation (the KVarN algorithm; the only stable value). */
  public static final int ABLATE_NONE = 0;
  /** Ablation flag (experimental): the cache holds unrotated vectors. */
  public static final int ABLATE_NO_ROTATION = 1;
  /** Ablation flag (experimental): no Sinkhorn passes, plain per-row round to nearest. */
  public static final int ABLATE_NO_NORMALIZATION = 2;

  private final int headDim;
  private final int tileTokens;
  private final int keyBits;
  private final int valueBits;
  private final int iterations;
  private final int sinkTiles;
  private final int keyFlags;
  private final int valueFlags;

  private Config(int headDim, int tileTokens, int keyBits, int valueBits, int iterations,
      int sinkTiles, int keyFlags, int valueFlags) {
    this.headDim = headDim;
    this.tileTokens = tileTokens;
    this.keyBits = keyBits;
    this.valueBits = valueBits;
    this.iterations = iterations;
    this.sinkTiles = sinkTiles;
    this.keyFlags = keyFlags;
    this.valueFlags = valueFlags;
  }

  /**
   * The default configuration: preset "k4v2_g128", D 128, 8 iterations, one sink tile.
   *
   * @return the defaults of {@code kvarn_config_defaults}
   */
  public static Config defaults() {
    NativeConfig c = new NativeConfig();
    try {
      return fromNative(c);
    } finally {
      c.delete();
    }
  }

  /**
   * A preset ("k4v2_g128", "k4v2_g64", "k4v4_g128", "k4v4_g64", "k2v2_g128", "k8v8_g128", or any
   * "k&lt;b&gt;v&lt;b&gt;_g&lt;G&gt;" with b in {2, 4, 8} and G in {64, 128}) at a head dim.
   *
   * @param preset the preset name
   * @param headDim D: 64, 80, 96, 128, 256 or 512 (80 and 96: CPU contexts only)
   * @return the configuration
   * @throws KvarnException NOT_FOUND for an unknown name
   */
  public static Config fromPreset(String preset, int headDim) {
    if (preset == null) throw Buffers.invalid("the preset name is null");
    NativeConfig c = new NativeConfig();
    try {
      KvarnNative.config_from_preset(preset, headDim, c);
      return fromNative(c);
    } finally {
      c.delete();
    }
  }

  /**
   * The named presets.
   *
   * @return the preset names, "k4v2_g128" (the default) first
   */
  public static List<String> presets() {
    int n = KvarnNative.preset_count();
    List<String> names = new ArrayList<>(n);
    for (int i = 0; i < n; i++) names.add(KvarnNative.preset_name(i));
    return names;
  }

  /**
   * Checks that every field is supported.
   *
   * @return this configuration
   * @throws KvarnException UNSUPPORTED or INVALID_ARGUMENT naming the field
   */
  public Config validate() {
    NativeConfig c = toNative();
    try {
      KvarnNative.config_validate(c);
      return this;
    } finally {
      c.delete();
    }
  }

  /**
   * Bytes of one record (one tile of G tokens of one KV head): D*G*(bK+bV)/8 + 6D + 6G.
   *
   * @return the record size
   * @throws KvarnException when the configuration is not valid
   */
  public long recordBytes() {
    NativeConfig c = toNative();
    try {
      long[] bytes = new long[1];
      KvarnNative.record_bytes(c, bytes);
      return bytes[0];
    } finally {
      c.delete();
    }
  }

  /**
   * Head dimension D.
   *
   * @return D
   */
  public int headDim() {
    return headDim;
  }

  /**
   * Tokens per tile G.
   *
   * @return G
   */
  public int tileTokens() {
    return tileTokens;
  }

  /**
   * Bits per key code.
   *
   * @return bK
   */
  public int keyBits() {
    return keyBits;
  }

  /**
   * Bits per value code.
   *
   * @return bV
   */
  public int valueBits() {
    return valueBits;
  }

  /**
   * Sinkhorn passes T.
   *
   * @return T
   */
  public int iterations() {
    return iterations;
  }

  /**
   * Leading tiles of each sequence kept in fp16.
   *
   * @return the sink tiles
   */
  public int sinkTiles() {
    return sinkTiles;
  }

  /**
   * Ablation flags of K ({@link #ABLATE_NO_ROTATION}, {@link #ABLATE_NO_NORMALIZATION}).
   *
   * @return the flags
   */
  public int keyFlags() {
    return keyFlags;
  }

  /**
   * Ablation flags of V.
   *
   * @return the flags
   */
  public int valueFlags() {
    return valueFlags;
  }

  /**
   * A copy with another head dim.
   *
   * @param d the head dim
   * @return the new configuration
   */
  public Config withHeadDim(int d) {
    return new Config(d, tileTokens, keyBits, valueBits, iterations, sinkTiles, keyFlags,
        valueFlags);
  }

  /**
   * A copy with other bit widths.
   *
   * @param key bits per key code
   * @param value bits per value code
   * @return the new configuration
   */
  public Config withBits(int key, int value) {
    return new Config(headDim, tileTokens, key, value, iterations, sinkTiles, keyFlags, valueFlags);
  }

  /**
   * A copy with another tile size.
   *
   * @param g tokens per tile
   * @return the new configuration
   */
  public Config withTileTokens(int g) {
    return new Config(headDim, g, keyBits, valueBits, iterations, sinkTiles, keyFlags, valueFlags);
  }

  /**
   * A copy with another iteration count.
   *
   * @param t Sinkhorn passes
   * @return the new configuration
   */
  public Config withIterations(int t) {
    return new Config(headDim, tileTokens, keyBits, valueBits, t, sinkTiles, keyFlags, valueFlags);
  }

  /**
   * A copy with another sink tile count.
   *
   * @param tiles leading fp16 tiles
   * @return the new configuration
   */
  public Config withSinkTiles(int tiles) {
    return new Config(headDim, tileTokens, keyBits, valueBits, iterations, tiles, keyFlags,
        valueFlags);
  }

  /**
   * A copy with other ablation flags.
   *
   * @param key flags of K
   * @param value flags of V
   * @return the new configuration
   */
  public Config withFlags(int key, int value) {
    return new Config(headDim, tileTokens, keyBits, valueBits, iterations, sinkTiles, key, value);
  }

  /** A native copy; the caller deletes it. */
  NativeConfig toNative() {
    NativeConfig c = new NativeConfig();
    c.setHead_dim(headDim);
    c.setTile_tokens(tileTokens);
    c.setKey_bits(keyBits);
    c.setValue_bits(valueBits);
    c.setIterations(iterations);
    c.setSink_tiles(sinkTiles);
    c.setKey_flags(keyFlags);
    c.setValue_flags(valueFlags);
    return c;
  }

  static Config fromNative(NativeConfig c) {
    return new Config(c.getHead_dim(), c.getTile_tokens(), c.getKey_bits(), c.getValue_bits(),
        c.getIterations(), c.getSink_tiles(), (int) c.getKey_flags(), (int) c.getValue_flags());
  }

  @Override
  public boolean equals(Object o) {
    if (!(o instanceof Config)) return false;
    Config c = (Config) o;
    return headDim == c.headDim && tileTokens == c.tileTokens && keyBits == c.keyBits
        && valueBits == c.valueBits && iterations == c.iterations && sinkTiles == c.sinkTiles
        && keyFlags == c.keyFlags && valueFlags == c.valueFlags;
  }

  @Override
  public int hashCode() {
    return Objects.hash(headDim, tileTokens, keyBits, valueBits, iterations, sinkTiles, keyFlags,
        valueFlags);
  }

  @Override
  public String toString() {
    return "Config(k" + keyBits + "v" + valueBits + "_g" + tileTokens + ", head_dim=" + headDim
        + ", iterations=" + iterations + ", sink_tiles=" + sinkTiles
        + (keyFlags != 0 || valueFlags != 0 ? ", flags=" + keyFlags + "/" + valueFlags : "") + ")";
  }
}
