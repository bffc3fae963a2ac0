/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.lang.reflect.Field;
import java.nio.FloatBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * Binding lifetimes as a contract (issue 28): contexts and caches closed or collected in any
 * order (reference cycles, closes from other threads racing calls, JVM exit with open objects)
 * never crash and never free twice. A context closed under a live cache is freed with the cache
 * (CacheTest covers the calls in that state).
 */
class LifetimeTest {
  private static final int D = 64;
  private static final Config CONFIG = Config.fromPreset("k4v2_g64", D);

  private static Handle handleOf(Object owner) {
    try {
      Field f = owner.getClass().getDeclaredField("handle");
      f.setAccessible(true);
      return (Handle) f.get(owner);
    } catch (ReflectiveOperationException e) {
      throw new AssertionError(e);
    }
  }

  private static FloatBuffer ones(int n) {
    FloatBuffer b = TestData.zeros(n);
    for (int i = 0; i < n; i++) b.put(i, 1f);
    return b;
  }

  /** A context and a cache that refer to each other through a self-referencing holder. */
  private static List<Handle> abandonCycle() {
    Context ctx = new Context(Backend.CPU, 0, 1);
    Cache cache = new Cache(ctx, CONFIG, 1, 1, 256, 2);
    cache.addSequence(1);
    cache.append(1, 0, ones(D), ones(D));
    Object[] holder = new Object[3];
    holder[0] = ctx;
    holder[1] = cache;
    holder[2] = holder;
    List<Handle> handles = new ArrayList<>();
    handles.add(handleOf(ctx));
    handles.add(handleOf(cache));
    return handles;
  }

  @Test
  void cyclesAreCollectedAndFreedOnce() throws InterruptedException {
    List<Handle> handles = new ArrayList<>();
    for (int i = 0; i < 50; i++) handles.addAll(abandonCycle());
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (handles.stream().anyMatch(h -> h.rawPtr() != 0) && System.nanoTime() < deadline) {
      System.gc();
      Thread.sleep(20);
    }
    for (Handle h : handles) {
      assertTrue(h.isClosed());
      assertEquals(0, h.rawPtr(), "native handle freed");
    }
  }

  @Test
  void closesFromOtherThreadsRaceCalls() throws Exception {
    for (int round = 0; round < 20; round++) {
      Context ctx = new Context(Backend.CPU, 0, 2);
      Cache cache = new Cache(ctx, CONFIG, 1, 1, 4096, 4);
      cache.addSequence(1);
      CountDownLatch start = new CountDownLatch(1);
      List<Thread> threads = new ArrayList<>();
      List<Throwable> failures = new ArrayList<>();
      Runnable[] jobs = {
        () -> {
          for (int i = 0; i < 50; i++) {
            cache.append(1, 0, ones(D), ones(D));
            cache.stats();
          }
        },
        () -> {
          for (int i = 0; i < 50; i++) ctx.quantize(CONFIG, ones(64 * D), ones(64 * D));
        },
        cache::close,
        ctx::close,
        ctx::close,
        cache::close,
      };
      for (Runnable job : jobs) {
        Thread t =
            new Thread(
                () -> {
                  try {
                    start.await();
                    job.run();
                  } catch (KvarnException e) {
                    // A call after a close: refused, as documented.
                    if (e.status() != Status.INVALID_ARGUMENT) {
                      synchronized (failures) {
                        failures.add(e);
                      }
                    }
                  } catch (Throwable e) {
                    synchronized (failures) {
                      failures.add(e);
                    }
                  }
                });
        threads.add(t);
        t.start();
      }
      start.countDown();
      for (Thread t : threads) t.join();
      if (!failures.isEmpty()) throw new AssertionError(failures.get(0));
      assertEquals(0, handleOf(cache).rawPtr());
      assertEquals(0, handleOf(ctx).rawPtr());
    }
  }

  /** The child JVM of jvmExitWithOpenObjectsIsClean: leaves everything open and exits. */
  static final class ExitMain {
    private ExitMain() {}

    @SuppressWarnings("unused")
    private static Object kept;

    public static void main(String[] args) {
      List<Object> all = new ArrayList<>();
      for (int i = 0; i < 10; i++) {
        Context ctx = new Context(Backend.CPU, 0, 2);
        Cache cache = new Cache(ctx, CONFIG, 1, 1, 256, 2);
        cache.addSequence(1);
        cache.append(1, 0, ones(D), ones(D));
        if (i % 2 == 0) ctx.close();  // some contexts only kept alive by their cache
        Object[] cycle = {ctx, cache, null};
        cycle[2] = cycle;
        all.add(cycle);
      }
      kept = all;
      Context busy = new Context(Backend.CPU, 0, 2);
      Thread worker =
          new Thread(
              () -> {
                while (true) busy.quantize(CONFIG, ones(64 * D), ones(64 * D));
              });
      worker.setDaemon(true);
      worker.start();
      System.out.println("ok exit");
      System.exit(0);  // with a call running on another thread
    }
  }

  private static String pathOf(Class<?> c) throws Exception {
    return new File(c.getProtectionDomain().getCodeSource().getLocation().toURI()).getPath();
  }

  @Test
  void jvmExitWithOpenObjectsIsClean() throws Exception {
    String java = System.getProperty("java.home") + File.separator + "bin" + File.separator + "java";
    String cp = pathOf(LifetimeTest.class) + File.pathSeparator + pathOf(Context.class);
    List<String> cmd = new ArrayList<>();
    cmd.add(java);
    cmd.add("-Xcheck:jni");
    String libPath = System.getProperty("java.library.path");
    if (libPath != null) cmd.add("-Djava.library.path=" + libPath);
    cmd.add("-cp");
    cmd.add(cp);
    cmd.add(ExitMain.class.getName());
    Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
    assertTrue(p.waitFor(120, TimeUnit.SECONDS), "the child JVM did not exit");
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertEquals(0, p.exitValue(), out);
    assertTrue(out.contains("ok exit"), out);
  }
}
