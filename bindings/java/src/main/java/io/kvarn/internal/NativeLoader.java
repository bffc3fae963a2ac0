/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn.internal;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.Locale;

/**
 * Loads the JNI library {@code kvarnjni} and the library it links, {@code libkvarn.so.<ABI>}.
 *
 * <p>Order: the directory named by the system property {@code kvarn.library.path} when set, else
 * {@code System.loadLibrary("kvarnjni")} (java.library.path, LD_LIBRARY_PATH), else the copies
 * packed in the jar under {@code native/<os>-<arch>/}, extracted once per process into a private
 * temporary directory (deleted at exit) and loaded from there. Thread-safe and idempotent.
 */
public final class NativeLoader {
  private static String source;
  private static Throwable failure;

  private NativeLoader() {}

  /** Loads the native libraries once; throws UnsatisfiedLinkError when no way worked. */
  public static synchronized void load() {
    if (source != null) return;
    if (failure != null) throw link("kvarn: the native library could not be loaded earlier", failure);
    try {
      source = doLoad();
    } catch (UnsatisfiedLinkError | RuntimeException e) {
      failure = e;
      throw e;
    }
  }

  /** Where the native library came from ("kvarn.library.path", "java.library.path", "jar:..."). */
  public static synchronized String source() {
    load();
    return source;
  }

  /** The platform directory name inside the jar, e.g. "linux-x86_64". */
  public static String platform() {
    String os = System.getProperty("os.name", "").toLowerCase(Locale.ROOT);
    if (os.startsWith("linux")) {
      os = "linux";
    } else if (os.startsWith("mac") || os.startsWith("darwin")) {
      os = "macos";
    } else if (os.startsWith("windows")) {
      os = "windows";
    } else {
      os = os.replaceAll("[^a-z0-9]", "");
    }
    String arch = System.getProperty("os.arch", "").toLowerCase(Locale.ROOT);
    if (arch.equals("amd64") || arch.equals("x86_64") || arch.equals("x64")) {
      arch = "x86_64";
    } else if (arch.equals("aarch64") || arch.equals("arm64")) {
      arch = "aarch64";
    }
    return os + "-" + arch;
  }

  private static String doLoad() {
    String dir = System.getProperty("kvarn.library.path");
    if (dir != null && !dir.isEmpty()) {
      loadFrom(Path.of(dir));
      return "kvarn.library.path:" + dir;
    }
    UnsatisfiedLinkError systemError;
    try {
      System.loadLibrary("kvarnjni");
      return "java.library.path";
    } catch (UnsatisfiedLinkError e) {
      systemError = e;
    }
    String resourceDir = "/native/" + platform() + "/";
    String jni = System.mapLibraryName("kvarnjni");
    if (NativeLoader.class.getResource(resourceDir + jni) == null) {
      throw link("kvarn: libkvarnjni is neither on java.library.path nor in the jar under "
          + resourceDir + " (" + systemError.getMessage() + ")", systemError);
    }
    try {
      Path tmp = Files.createTempDirectory("kvarn-native-");
      tmp.toFile().deleteOnExit();
      String core = coreName();
      extract(resourceDir + core, tmp.resolve(core));
      extract(resourceDir + jni, tmp.resolve(jni));
      loadFrom(tmp);
      return "jar:" + resourceDir;
    } catch (IOException e) {
      throw link("kvarn: could not extract the native libraries from the jar: " + e, e);
    }
  }

  /** libkvarn.so.0 on Linux (the SONAME libkvarnjni needs), libkvarn.dylib / kvarn.dll elsewhere. */
  private static String coreName() {
    String name = System.mapLibraryName("kvarn");
    if (name.endsWith(".so")) {
      name = name + "." + BuildInfo.ABI_VERSION;
    }
    return name;
  }

  private static void loadFrom(Path dir) {
    Path core = dir.resolve(coreName());
    // The core library first, by full path: the JNI library's dependency is then already loaded
    // (the dynamic loader matches it by SONAME) whatever the RPATH says.
    if (Files.exists(core)) System.load(core.toAbsolutePath().toString());
    System.load(dir.resolve(System.mapLibraryName("kvarnjni")).toAbsolutePath().toString());
  }

  private static void extract(String resource, Path target) throws IOException {
    try (InputStream in = NativeLoader.class.getResourceAsStream(resource)) {
      if (in == null) throw new IOException("missing resource " + resource);
      Files.copy(in, target, StandardCopyOption.REPLACE_EXISTING);
    }
    target.toFile().deleteOnExit();
  }

  private static UnsatisfiedLinkError link(String message, Throwable cause) {
    UnsatisfiedLinkError e = new UnsatisfiedLinkError(message);
    e.initCause(cause);
    return e;
  }
}
