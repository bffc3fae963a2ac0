/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

/**
 * A failing libkvarn call: the {@link Status} and the detail message ({@code kvarn_last_error()}
 * of the failing C call, or the binding's own message for checks made before the C call, such as
 * a heap buffer, a too-small buffer, a closed handle or a buffer of the wrong dtype).
 */
public class KvarnException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The status of the failing call. */
  private final Status status;
  /** The raw C status value. */
  private final int code;
  /** The detail message without the status prefix. */
  private final String detail;

  /**
   * An exception for a C status value (called by the JNI layer).
   *
   * @param code the {@code kvarn_status_t} value
   * @param detail the detail message
   */
  public KvarnException(int code, String detail) {
    super("kvarn: " + Status.fromCode(code).name().toLowerCase(java.util.Locale.ROOT) + ": "
        + detail);
    this.status = Status.fromCode(code);
    this.code = code;
    this.detail = detail;
  }

  /**
   * An exception for a status.
   *
   * @param status the status
   * @param detail the detail message
   */
  public KvarnException(Status status, String detail) {
    this(status.code(), detail);
  }

  /**
   * The status of the failing call.
   *
   * @return the status
   */
  public Status status() {
    return status;
  }

  /**
   * The raw C status value (equal to {@code status().code()} for every status this binding knows).
   *
   * @return the {@code kvarn_status_t} value
   */
  public int code() {
    return code;
  }

  /**
   * The detail message without the status prefix.
   *
   * @return the message of the failing call
   */
  public String detail() {
    return detail;
  }
}
