/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import io.kvarn.internal.KvarnNative;
import io.kvarn.internal.NativeLoader;
import io.kvarn.internal.NativeBackendInfo;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * Library-wide queries of libkvarn: version, backends, CPU features, presets, and the selftest.
 *
 * <pre>{@code
 * System.out.println(Kvarn.version() + " " + Kvarn.backends());
 * SelftestReport report = Kvarn.selftest();   // every preset at D 128 on a CPU context
 * }</pre>
 *
 * <p>{@code java -jar kvarn.jar [--full]} prints the same and runs the selftest.
 */
public final class Kvarn {
  private Kvarn() {}

  /**
   * The loaded library's version.
   *
   * @return "MAJOR.MINOR.PATCH"
   */
  public static String version() {
    return KvarnNative.version_string();
  }

  /**
   * The loaded library's version number.
   *
   * @return major * 10000 + minor * 100 + patch
   */
  public static int versionNumber() {
    return (int) KvarnNative.version_number();
  }

  /**
   * The ABI major of the loaded library (libkvarn.so.N).
   *
   * @return the ABI major
   */
  public static int abiVersion() {
    return (int) KvarnNative.abi_version();
  }

  /**
   * Where the native library was loaded from: "java.library.path", "kvarn.library.path:DIR" or
   * "jar:/native/OS-ARCH/".
   *
   * @return the source
   */
  public static String nativeLibrarySource() {
    return NativeLoader.source();
  }

  /**
   * Every backend libkvarn knows, built or not, and why an unavailable one is unavailable.
   *
   * @return the backends
   */
  public static List<BackendInfo> backends() {
    int n = KvarnNative.backend_count();
    List<BackendInfo> out = new ArrayList<>(n);
    for (int i = 0; i < n; i++) {
      NativeBackendInfo info = new NativeBackendInfo();
      try {
        KvarnNative.backend_get_info(i, info);
        out.add(new BackendInfo(Backend.fromCode(info.getBackend()), info.getName(),
            info.getAvailable() != 0, info.getDevice_count(), info.getReason()));
      } finally {
        info.delete();
      }
    }
    return out;
  }

  /**
   * The CPU features libkvarn detected.
   *
   * @return feature names ("sse4.2", "avx2", "avx512f", ...)
   */
  public static List<String> cpuFeatures() {
    String[] text = new String[1];
    KvarnNative.cpu_features(text);
    String all = text[0] == null ? "" : text[0].trim();
    return all.isEmpty() ? new ArrayList<>() : Arrays.asList(all.split("\\s+"));
  }

  /**
   * The best ISA this CPU supports that libkvarn was built with.
   *
   * @return the ISA
   */
  public static CpuIsa cpuIsaBest() {
    return CpuIsa.fromCode(KvarnNative.cpu_isa_best());
  }

  /**
   * Caps the ISA of CPU contexts created afterwards (process-wide).
   *
   * @param isa the highest ISA to use
   */
  public static void setMaxCpuIsa(CpuIsa isa) {
    if (isa == null) throw Buffers.invalid("the ISA is null");
    KvarnNative.set_max_cpu_isa(isa.code());
  }

  /**
   * The named presets ("k4v2_g128", ...).
   *
   * @return the names
   */
  public static List<String> presets() {
    return Config.presets();
  }

  /**
   * The English description of a status.
   *
   * @param status the status
   * @return its description ({@code kvarn_status_string})
   */
  public static String statusString(Status status) {
    return KvarnNative.status_string(status.code());
  }

  /**
   * Runs the quick selftest (every preset at D 128) on a new CPU context.
   *
   * @return the report
   */
  public static SelftestReport selftest() {
    try (Context ctx = new Context()) {
      return Selftest.run(ctx, true);
    }
  }

  /**
   * Runs the selftest on a context.
   *
   * @param ctx the context (CPU)
   * @param quick D 128 only when true, D 64..512 otherwise
   * @return the report
   */
  public static SelftestReport selftest(Context ctx, boolean quick) {
    return Selftest.run(ctx, quick);
  }

  /**
   * Prints the version, the native library's source, the backends and the CPU ISA, then runs the
   * selftest; exits 1 when a check fails.
   *
   * @param args "--full" for D 64..512
   */
  public static void main(String[] args) {
    boolean full = Arrays.asList(args).contains("--full");
    System.out.println("libkvarn " + version() + " (ABI " + abiVersion() + "), native library from "
        + nativeLibrarySource());
    for (BackendInfo b : backends()) System.out.println("backend " + b);
    System.out.println("cpu isa " + cpuIsaBest().name().toLowerCase(java.util.Locale.ROOT)
        + ", features: " + String.join(" ", cpuFeatures()));
    SelftestReport report;
    try (Context ctx = new Context()) {
      report = selftest(ctx, !full);
    }
    System.out.println(report);
    if (!report.ok()) System.exit(1);
  }
}
