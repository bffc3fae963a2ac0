/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

/** One backend libkvarn knows ({@code kvarn_backend_info_t}), built or not. */
public final class BackendInfo {
  private final Backend backend;
  private final String name;
  private final boolean available;
  private final int deviceCount;
  private final String reason;

  BackendInfo(Backend backend, String name, boolean available, int deviceCount, String reason) {
    this.backend = backend;
    this.name = name;
    this.available = available;
    this.deviceCount = deviceCount;
    this.reason = reason;
  }

  /**
   * The backend.
   *
   * @return the backend
   */
  public Backend backend() {
    return backend;
  }

  /**
   * Its short name ("cpu", "cuda", "rocm").
   *
   * @return the name
   */
  public String name() {
    return name;
  }

  /**
   * Whether contexts can be created on it.
   *
   * @return true when available
   */
  public boolean available() {
    return available;
  }

  /**
   * Devices found (1 for the CPU).
   *
   * @return the device count
   */
  public int deviceCount() {
    return deviceCount;
  }

  /**
   * Why it is not available ("" when it is).
   *
   * @return the reason
   */
  public String reason() {
    return reason;
  }

  @Override
  public String toString() {
    return name + (available ? " (available, " + deviceCount + " device(s))" : " (" + reason + ")");
  }
}
