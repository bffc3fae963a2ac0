/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.kvarn.internal.BuildInfo;
import io.kvarn.internal.KvarnNative;
import io.kvarn.internal.backend_t;
import io.kvarn.internal.cpu_isa_t;
import io.kvarn.internal.dtype_t;
import io.kvarn.internal.status_t;
import java.util.List;
import org.junit.jupiter.api.Test;

class KvarnTest {
  @Test
  void versionMatchesTheBuild() {
    assertEquals(BuildInfo.VERSION, Kvarn.version());
    String[] parts = Kvarn.version().split("\\.");
    int number = Integer.parseInt(parts[0]) * 10000 + Integer.parseInt(parts[1]) * 100
        + Integer.parseInt(parts[2]);
    assertEquals(number, Kvarn.versionNumber());
    assertEquals(BuildInfo.ABI_VERSION, Kvarn.abiVersion());
  }

  @Test
  void nativeLibraryCameFromTheExpectedPlace() {
    String expected = System.getProperty("kvarn.test.expectSource", "");
    String source = Kvarn.nativeLibrarySource();
    assertTrue(source.startsWith(expected), source + " should start with " + expected);
  }

  @Test
  void backendsListTheCpu() {
    List<BackendInfo> backends = Kvarn.backends();
    assertEquals(KvarnNative.backend_count(), backends.size());
    BackendInfo cpu = backends.stream().filter(b -> b.backend() == Backend.CPU).findFirst()
        .orElseThrow();
    assertEquals("cpu", cpu.name());
    assertTrue(cpu.available());
    assertEquals(1, cpu.deviceCount());
    assertEquals("", cpu.reason());
    for (BackendInfo b : backends) {
      assertEquals(b.available(), b.reason().isEmpty(), b.toString());
    }
  }

  @Test
  void enumsMatchTheCHeader() {
    assertEquals(status_t.OK, Status.OK.code());
    assertEquals(status_t.ERR_INVALID_ARGUMENT, Status.INVALID_ARGUMENT.code());
    assertEquals(status_t.ERR_UNSUPPORTED, Status.UNSUPPORTED.code());
    assertEquals(status_t.ERR_NON_FINITE, Status.NON_FINITE.code());
    assertEquals(status_t.ERR_OVERFLOW, Status.OVERFLOW.code());
    assertEquals(status_t.ERR_CAPACITY, Status.CAPACITY.code());
    assertEquals(status_t.ERR_NOT_FOUND, Status.NOT_FOUND.code());
    assertEquals(status_t.ERR_ALREADY_EXISTS, Status.ALREADY_EXISTS.code());
    assertEquals(status_t.ERR_CORRUPT_DATA, Status.CORRUPT_DATA.code());
    assertEquals(status_t.ERR_BUFFER_TOO_SMALL, Status.BUFFER_TOO_SMALL.code());
    assertEquals(status_t.ERR_INVALID_STATE, Status.INVALID_STATE.code());
    assertEquals(status_t.ERR_INTERNAL, Status.INTERNAL.code());
    assertEquals(dtype_t.DTYPE_F32, DType.F32.code());
    assertEquals(dtype_t.DTYPE_F16, DType.F16.code());
    assertEquals(dtype_t.DTYPE_BF16, DType.BF16.code());
    for (DType d : DType.values()) assertEquals(KvarnNative.dtype_size(d.code()), d.size());
    assertEquals(backend_t.BACKEND_CUDA, Backend.CUDA.code());
    assertEquals(cpu_isa_t.CPU_ISA_NONE, CpuIsa.NONE.code());
    assertEquals(cpu_isa_t.CPU_ISA_AVX512, CpuIsa.AVX512.code());
    for (Status s : Status.values()) {
      assertEquals(s, Status.fromCode(s.code()));
      assertFalse(Kvarn.statusString(s).isEmpty());
    }
  }

  @Test
  void presetsAndCpu() {
    List<String> presets = Kvarn.presets();
    assertTrue(presets.contains("k4v2_g128"), presets.toString());
    assertTrue(presets.size() >= 6, presets.toString());
    CpuIsa best = Kvarn.cpuIsaBest();
    assertTrue(best != CpuIsa.NONE);
    if (System.getProperty("os.arch").equals("amd64")) {
      assertTrue(Kvarn.cpuFeatures().contains("sse4.2"), Kvarn.cpuFeatures().toString());
    }
  }

  @Test
  void selftestPasses() {
    SelftestReport report = Kvarn.selftest();
    assertTrue(report.ok(), report.toString());
    assertEquals(4 * Kvarn.presets().size(), report.passed(), report.toString());
    assertEquals(0, report.failed());
    assertTrue(report.toString().endsWith(report.passed() + " passed, 0 failed"));
  }

  @Test
  void theRawLayerRefusesHeapBuffersAndShortOutArrays() {
    try (Context ctx = new Context()) {
      long handle = ctx.handle.rawPtr();
      assertThrows(IllegalArgumentException.class, () -> KvarnNative.rotate(handle, 64, 1,
          DType.F32.code(), java.nio.FloatBuffer.allocate(64), DType.F32.code(),
          TestData.zeros(64)));
      assertThrows(IllegalArgumentException.class,
          () -> KvarnNative.context_get_device(handle, new int[0]));
      assertThrows(IllegalArgumentException.class,
          () -> KvarnNative.context_get_device(handle, null));
      int[] device = {-1};
      KvarnNative.context_get_device(handle, device);
      assertEquals(0, device[0]);
      // A failing status throws KvarnException from JNI with kvarn_last_error's message.
      KvarnException e = TestData.assertStatus(Status.UNSUPPORTED, () -> KvarnNative.rotate(
          handle, 100, 1, DType.F32.code(), TestData.zeros(100), DType.F32.code(),
          TestData.zeros(100)));
      assertFalse(e.detail().isEmpty());
    }
  }

  @Test
  void backendUnavailableIsAStatus() {
    for (BackendInfo b : Kvarn.backends()) {
      if (!b.available()) {
        TestData.assertStatus(Status.BACKEND_UNAVAILABLE, () -> new Context(b.backend()).close());
      }
    }
  }
}
