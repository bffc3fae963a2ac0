/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import static io.kvarn.TestData.assertStatus;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import org.junit.jupiter.api.Test;

class ConfigTest {
  @Test
  void defaultsAreK4v2G128() {
    Config c = Config.defaults();
    assertEquals(128, c.headDim());
    assertEquals(128, c.tileTokens());
    assertEquals(4, c.keyBits());
    assertEquals(2, c.valueBits());
    assertEquals(8, c.iterations());
    assertEquals(1, c.sinkTiles());
    assertEquals(0, c.keyFlags());
    assertEquals(c, Config.fromPreset("k4v2_g128", 128));
    assertEquals(13824, c.recordBytes());
  }

  @Test
  void everyPresetHasTheDocumentedRecordSize() {
    for (String preset : Config.presets()) {
      for (int d : new int[] {64, 80, 96, 128, 256, 512}) {
        Config c = Config.fromPreset(preset, d).validate();
        assertEquals(d, c.headDim());
        long expect = (long) d * c.tileTokens() * (c.keyBits() + c.valueBits()) / 8 + 6L * d
            + 6L * c.tileTokens();
        assertEquals(expect, c.recordBytes(), c.toString());
      }
    }
    Config g64 = Config.fromPreset("k2v4_g64", 64);
    assertEquals(2, g64.keyBits());
    assertEquals(4, g64.valueBits());
    assertEquals(64, g64.tileTokens());
  }

  @Test
  void copiesAreValues() {
    Config c = Config.defaults();
    Config d = c.withBits(8, 8).withIterations(3).withSinkTiles(0).withTileTokens(64);
    assertEquals(8, d.keyBits());
    assertEquals(3, d.iterations());
    assertEquals(0, d.sinkTiles());
    assertEquals(64, d.tileTokens());
    assertEquals(4, c.keyBits());
    assertNotEquals(c, d);
    assertEquals(d, Config.fromPreset("k8v8_g64", 128).withIterations(3).withSinkTiles(0));
    assertEquals(d.hashCode(),
        Config.fromPreset("k8v8_g64", 128).withIterations(3).withSinkTiles(0).hashCode());
    Config ablated = c.withFlags(Config.ABLATE_NO_ROTATION, Config.ABLATE_NO_NORMALIZATION);
    assertEquals(ablated, ablated.validate());
  }

  @Test
  void badConfigsFailWithTheirStatus() {
    assertStatus(Status.NOT_FOUND, () -> Config.fromPreset("k3v2_g128", 128));
    assertStatus(Status.INVALID_ARGUMENT, () -> Config.fromPreset(null, 128));
    KvarnException e = assertStatus(Status.UNSUPPORTED,
        () -> Config.defaults().withHeadDim(100).validate());
    assertEquals(false, e.detail().isEmpty());
    assertStatus(Status.UNSUPPORTED, () -> Config.defaults().withBits(3, 2).recordBytes());
    assertStatus(Status.UNSUPPORTED, () -> Config.defaults().withTileTokens(32).validate());
  }
}
