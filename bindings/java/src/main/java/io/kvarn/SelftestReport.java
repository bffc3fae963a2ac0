/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/** The outcome of {@link Kvarn#selftest()}: one line per check and the pass/fail counts. */
public final class SelftestReport {
  private final List<String> lines = new ArrayList<>();
  private int passed;
  private int failed;

  SelftestReport() {}

  void check(String name, boolean ok, String detail) {
    if (ok) {
      passed++;
    } else {
      failed++;
    }
    lines.add((ok ? "PASS " : "FAIL ") + name + (detail.isEmpty() ? "" : ": " + detail));
  }

  /**
   * Checks that passed.
   *
   * @return the count
   */
  public int passed() {
    return passed;
  }

  /**
   * Checks that failed.
   *
   * @return the count
   */
  public int failed() {
    return failed;
  }

  /**
   * Whether every check passed (and at least one ran).
   *
   * @return true when nothing failed
   */
  public boolean ok() {
    return failed == 0 && passed > 0;
  }

  /**
   * One line per check: "PASS name: detail" or "FAIL name: detail".
   *
   * @return the lines
   */
  public List<String> lines() {
    return Collections.unmodifiableList(lines);
  }

  /** The lines and a closing "N passed, M failed". */
  @Override
  public String toString() {
    StringBuilder b = new StringBuilder();
    for (String line : lines) b.append(line).append('\n');
    return b.append(passed).append(" passed, ").append(failed).append(" failed").toString();
  }
}
