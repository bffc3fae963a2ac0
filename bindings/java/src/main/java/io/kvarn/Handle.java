/*
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
package io.kvarn;

import java.lang.ref.Cleaner;
import java.util.function.LongConsumer;

/**
 * A native handle shared by an owner object (Context, Cache) and its Cleaner action.
 *
 * <p>Every native call on the handle runs while holding its monitor and after {@link #ptr()}
 * checked that the owner has not closed it, so close() never frees memory under a running call.
 * Handles are reference-counted: a cache holds a reference on its context's handle, so the context
 * is destroyed only after the last of its caches (the C API requires the context to outlive them),
 * whatever order the user or the garbage collector closes them in.
 */
final class Handle {
  private static final Cleaner CLEANER = Cleaner.create();

  private final String what;
  private final LongConsumer destroy;
  private final Handle parent;
  private long ptr;
  private int refs = 1;
  private boolean closed;

  Handle(String what, long ptr, LongConsumer destroy, Handle parent) {
    this.what = what;
    this.ptr = ptr;
    this.destroy = destroy;
    this.parent = parent;
  }

  /** Frees the handle when owner becomes phantom-reachable (the action holds no owner ref). */
  Cleaner.Cleanable register(Object owner) {
    return CLEANER.register(owner, this::close);
  }

  /** The native pointer; throws INVALID_ARGUMENT once the owner closed it. Call under the lock. */
  synchronized long ptr() {
    if (closed) throw new KvarnException(Status.INVALID_ARGUMENT, "the " + what + " is closed");
    return ptr;
  }

  /** The native pointer for a child's call (valid while the child holds its reference). */
  synchronized long rawPtr() {
    return ptr;
  }

  synchronized boolean isClosed() {
    return closed;
  }

  /** A child (a cache) takes a reference; the owner must still be open. */
  synchronized void retain() {
    ptr();
    refs++;
  }

  /** The owner's close (idempotent): later calls fail; the memory goes with the last reference. */
  void close() {
    synchronized (this) {
      if (closed) return;
      closed = true;
    }
    release();
  }

  private void release() {
    long p = 0;
    synchronized (this) {
      if (--refs == 0) {
        p = ptr;
        ptr = 0;
      }
    }
    if (p != 0) {
      destroy.accept(p);
      if (parent != null) parent.release();
    }
  }
}
