// The growable-struct rule of the public API (the Linux copy_struct_from_user rule).
//
// Every struct passed by pointer starts with `size_t size`, set by the caller to the sizeof()
// of the header it was compiled with (the *_defaults functions do it).
//
// Input structs (ReadStruct): `*out` holds the library's defaults on entry.
//   - size < the struct's minimum (sizeof(size_t), or more where AbiStruct says so): refused,
//     KVARN_ERR_INVALID_ARGUMENT.
//   - A field is read from the caller when it lies wholly within `size`; a field that `size`
//     does not reach keeps its default (the caller's header is older and lacks it). A size that
//     ends inside a field (no published header does: see "Growing a struct") is rounded down to
//     the field's start: that field keeps its default too.
//   - size > sizeof(T): the caller's header is newer. Accepted when every byte in
//     [sizeof(T), size) is zero (the fields this library does not know are left at 0, "as
//     before"); refused with KVARN_ERR_UNSUPPORTED otherwise (the caller asked for something
//     this library cannot do). Bytes of this library's own padding are never read.
//   - size > kAbiMaxStructSize (4096, as Linux's openat2): refused, KVARN_ERR_INVALID_ARGUMENT
//     (an unset size; no struct will grow that large), before any byte past sizeof(T) is read.
//   - On failure *out is unchanged.
//
// Output structs (WriteStruct): the library fills a full T, then writes to the caller the fields
// that lie wholly within the caller's `size`, zeroes the rest of the caller's bytes up to `size`
// (a field that `size` cuts, this library's padding, and everything past sizeof(T): fields of a
// newer header that this library does not know read as 0), and leaves the caller's `size` as it
// was. size < sizeof(size_t) or > kAbiMaxStructSize is KVARN_ERR_INVALID_ARGUMENT, with nothing
// written.
//
// Growing a struct (for maintainers): append fields at the end, at or after the previous
// sizeof() (never in the previous version's trailing padding, whose bytes old callers may leave
// uninitialized), give every new field a default of 0 meaning "as before", add it to the
// struct's AbiStruct description below, and never move or resize an existing field.
// kvarn_config_t cannot grow at all: kvarn_cache_options_t embeds it by value, so its size fixes
// where the cache options' later fields lie (CheckEmbeddedConfig).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/status.h"
#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"

namespace kvarn {

// The largest `size` accepted: past it the size field is taken as unset, not as a newer header.
constexpr size_t kAbiMaxStructSize = 4096;

// One field of a public struct: byte offset and byte length.
struct AbiField {
  size_t offset;
  size_t bytes;
};

#define KVARN_ABI_FIELD(T, f) \
  ::kvarn::AbiField { offsetof(T, f), sizeof(T::f) }

// Describes a public struct for ReadStruct / WriteStruct: kFields lists every field after
// `size` (in order) and kMinSize is the smallest `size` accepted. A struct without a
// description is read byte by byte (a field cut by `size` is then cut, not rounded down): every
// public struct should have one (tests/test_struct_abi.cpp checks the published ones).
template <typename T>
struct AbiStruct {};

template <>
struct AbiStruct<kvarn_context_options_t> {
  using T = kvarn_context_options_t;
  static constexpr size_t kMinSize = sizeof(size_t);
  static constexpr AbiField kFields[] = {KVARN_ABI_FIELD(T, backend), KVARN_ABI_FIELD(T, device),
                                         KVARN_ABI_FIELD(T, stream),
                                         KVARN_ABI_FIELD(T, num_threads)};
};

template <>
struct AbiStruct<kvarn_config_t> {
  using T = kvarn_config_t;
  static constexpr size_t kMinSize = sizeof(size_t);
  static constexpr AbiField kFields[] = {
      KVARN_ABI_FIELD(T, head_dim),   KVARN_ABI_FIELD(T, tile_tokens),
      KVARN_ABI_FIELD(T, key_bits),   KVARN_ABI_FIELD(T, value_bits),
      KVARN_ABI_FIELD(T, iterations), KVARN_ABI_FIELD(T, sink_tiles),
      KVARN_ABI_FIELD(T, key_flags),  KVARN_ABI_FIELD(T, value_flags)};
};

template <>
struct AbiStruct<kvarn_paged_kv_t> {
  using T = kvarn_paged_kv_t;
  static constexpr size_t kMinSize = sizeof(size_t);
  static constexpr AbiField kFields[] = {
      KVARN_ABI_FIELD(T, num_kv_heads),      KVARN_ABI_FIELD(T, batch),
      KVARN_ABI_FIELD(T, records),           KVARN_ABI_FIELD(T, record_stride),
      KVARN_ABI_FIELD(T, num_record_blocks), KVARN_ABI_FIELD(T, k_pages),
      KVARN_ABI_FIELD(T, v_pages),           KVARN_ABI_FIELD(T, num_pages),
      KVARN_ABI_FIELD(T, block_table),       KVARN_ABI_FIELD(T, max_blocks_per_seq),
      KVARN_ABI_FIELD(T, seq_lens),          KVARN_ABI_FIELD(T, record_tiles)};
};

template <>
struct AbiStruct<kvarn_attention_params_t> {
  using T = kvarn_attention_params_t;
  static constexpr size_t kMinSize = sizeof(size_t);
  static constexpr AbiField kFields[] = {
      KVARN_ABI_FIELD(T, num_q_heads),   KVARN_ABI_FIELD(T, scale),
      KVARN_ABI_FIELD(T, q_indptr),      KVARN_ABI_FIELD(T, q_dtype),
      KVARN_ABI_FIELD(T, out_dtype),     KVARN_ABI_FIELD(T, num_splits),
      KVARN_ABI_FIELD(T, sinks),         KVARN_ABI_FIELD(T, sliding_window),
      KVARN_ABI_FIELD(T, logit_softcap), KVARN_ABI_FIELD(T, mode)};
};

// The embedded config must be there whole: its own size field places the fields after it.
template <>
struct AbiStruct<kvarn_cache_options_t> {
  using T = kvarn_cache_options_t;
  static constexpr size_t kMinSize = offsetof(T, config) + sizeof(kvarn_config_t);
  static constexpr AbiField kFields[] = {
      KVARN_ABI_FIELD(T, config), KVARN_ABI_FIELD(T, num_layers), KVARN_ABI_FIELD(T, num_kv_heads),
      KVARN_ABI_FIELD(T, max_tokens), KVARN_ABI_FIELD(T, max_sequences)};
};

template <>
struct AbiStruct<kvarn_launch_t> {
  using T = kvarn_launch_t;
  static constexpr size_t kMinSize = sizeof(size_t);
  static constexpr AbiField kFields[] = {
      KVARN_ABI_FIELD(T, stream),       KVARN_ABI_FIELD(T, seq_status),
      KVARN_ABI_FIELD(T, workspace),    KVARN_ABI_FIELD(T, workspace_bytes),
      KVARN_ABI_FIELD(T, q_row_stride), KVARN_ABI_FIELD(T, k_row_stride),
      KVARN_ABI_FIELD(T, v_row_stride), KVARN_ABI_FIELD(T, out_row_stride),
      KVARN_ABI_FIELD(T, index_type)};
};

template <>
struct AbiStruct<kvarn_attention_shape_t> {
  using T = kvarn_attention_shape_t;
  static constexpr size_t kMinSize = sizeof(size_t);
  static constexpr AbiField kFields[] = {
      KVARN_ABI_FIELD(T, batch), KVARN_ABI_FIELD(T, num_kv_heads),
      KVARN_ABI_FIELD(T, max_blocks_per_seq), KVARN_ABI_FIELD(T, max_q_per_seq),
      KVARN_ABI_FIELD(T, max_total_q)};
};

template <>
struct AbiStruct<kvarn_tail_state_t> {
  using T = kvarn_tail_state_t;
  static constexpr size_t kMinSize = sizeof(size_t);
  static constexpr AbiField kFields[] = {
      KVARN_ABI_FIELD(T, states),          KVARN_ABI_FIELD(T, slot_bytes),
      KVARN_ABI_FIELD(T, max_step_tokens), KVARN_ABI_FIELD(T, num_slots),
      KVARN_ABI_FIELD(T, slots),           KVARN_ABI_FIELD(T, row_bits)};
};

template <>
struct AbiStruct<kvarn_backend_info_t> {
  using T = kvarn_backend_info_t;
  static constexpr size_t kMinSize = sizeof(size_t);
  static constexpr AbiField kFields[] = {
      KVARN_ABI_FIELD(T, backend), KVARN_ABI_FIELD(T, name), KVARN_ABI_FIELD(T, available),
      KVARN_ABI_FIELD(T, device_count), KVARN_ABI_FIELD(T, reason)};
};

template <>
struct AbiStruct<kvarn_cache_stats_t> {
  using T = kvarn_cache_stats_t;
  static constexpr size_t kMinSize = sizeof(size_t);
  static constexpr AbiField kFields[] = {KVARN_ABI_FIELD(T, sequences),
                                         KVARN_ABI_FIELD(T, tokens),
                                         KVARN_ABI_FIELD(T, committed_tokens),
                                         KVARN_ABI_FIELD(T, records),
                                         KVARN_ABI_FIELD(T, pages),
                                         KVARN_ABI_FIELD(T, bytes_used),
                                         KVARN_ABI_FIELD(T, bytes_capacity),
                                         KVARN_ABI_FIELD(T, fp16_bytes),
                                         KVARN_ABI_FIELD(T, compression_ratio)};
};

namespace abi_detail {

template <typename T, typename = void>
struct Described : std::false_type {};
template <typename T>
struct Described<T, std::void_t<decltype(AbiStruct<T>::kFields)>> : std::true_type {};

template <typename T>
constexpr size_t MinSize() {
  if constexpr (Described<T>::value) {
    return AbiStruct<T>::kMinSize > sizeof(size_t) ? AbiStruct<T>::kMinSize : sizeof(size_t);
  } else {
    return sizeof(size_t);
  }
}

// Calls fn(offset, bytes) for every field of T after `size`, in order. Undescribed structs are
// one field: the bytes from sizeof(size_t) to sizeof(T).
template <typename T, typename Fn>
void ForEachField(Fn&& fn) {
  if constexpr (Described<T>::value) {
    for (const AbiField& f : AbiStruct<T>::kFields) fn(f.offset, f.bytes);
  } else {
    fn(sizeof(size_t), sizeof(T) - sizeof(size_t));
  }
}

inline size_t LoadSize(const void* p) {
  size_t size;
  std::memcpy(&size, p, sizeof size);
  return size;
}

inline Status CheckSize(size_t size, size_t min_size, const char* name) {
  if (size < min_size || size > kAbiMaxStructSize) {
    return InvalidArgument(std::string(name) + "->size is " + std::to_string(size) + ", outside " +
                           std::to_string(min_size) + ".." + std::to_string(kAbiMaxStructSize) +
                           " (set it to sizeof the struct, or initialize the struct with its "
                           "*_defaults function)");
  }
  return Status::Ok();
}

}  // namespace abi_detail

// True when T has an AbiStruct description (every field listed, in order, inside sizeof(T)).
template <typename T>
constexpr bool AbiDescribed() {
  return abi_detail::Described<T>::value;
}

// The size at which T's fields stop: the end of its last field (sizeof(T) minus tail padding).
template <typename T>
size_t AbiFieldsEnd() {
  size_t end = sizeof(size_t);
  abi_detail::ForEachField<T>([&](size_t off, size_t bytes) {
    if (off + bytes > end) end = off + bytes;
  });
  return end;
}

// Reads *in into *out, which holds the defaults on entry (see the top of this file). `name`
// names the argument in messages ("options", "kv", ...).
template <typename T>
Status ReadStruct(const T* in, const char* name, T* out) {
  static_assert(offsetof(T, size) == 0, "public structs start with their size");
  static_assert(std::is_trivially_copyable<T>::value, "public structs are plain C structs");
  if (in == nullptr) return InvalidArgument(std::string(name) + " is NULL");
  const size_t size = abi_detail::LoadSize(in);
  KVARN_RETURN_IF_ERROR(abi_detail::CheckSize(size, abi_detail::MinSize<T>(), name));
  const unsigned char* src = reinterpret_cast<const unsigned char*>(in);
  if (size > sizeof(T)) {
    for (size_t i = sizeof(T); i < size; ++i) {
      if (src[i] != 0) {
        return {KVARN_ERR_UNSUPPORTED,
                std::string(name) + "->size is " + std::to_string(size) + ", larger than this " +
                    "library's " + std::to_string(sizeof(T)) + ", and byte " + std::to_string(i) +
                    " is not zero: it sets a field this library does not know (use a library "
                    "at least as new as the header, or leave the newer fields at 0)"};
      }
    }
  }
  T tmp;
  std::memcpy(&tmp, out, sizeof tmp);
  unsigned char* dst = reinterpret_cast<unsigned char*>(&tmp);
  abi_detail::ForEachField<T>([&](size_t off, size_t bytes) {
    if (off >= size) return;
    const size_t n = off + bytes <= size ? bytes : (AbiDescribed<T>() ? 0 : size - off);
    std::memcpy(dst + off, src + off, n);
  });
  tmp.size = sizeof(T);
  std::memcpy(out, &tmp, sizeof tmp);
  return Status::Ok();
}

// Checks the caller's output struct before any work: non-NULL and size >= sizeof(size_t).
template <typename T>
Status CheckOutStruct(const T* out, const char* name) {
  static_assert(offsetof(T, size) == 0, "public structs start with their size");
  if (out == nullptr) return InvalidArgument(std::string(name) + " is NULL");
  return abi_detail::CheckSize(abi_detail::LoadSize(out), abi_detail::MinSize<T>(), name);
}

// Writes the full result `value` into the caller's `out` of out->size bytes (see the top of this
// file); out->size is left as it was. `value.size` is ignored.
template <typename T>
Status WriteStruct(const T& value, const char* name, T* out) {
  static_assert(std::is_trivially_copyable<T>::value, "public structs are plain C structs");
  KVARN_RETURN_IF_ERROR(CheckOutStruct(out, name));
  const size_t size = abi_detail::LoadSize(out);
  unsigned char* dst = reinterpret_cast<unsigned char*>(out);
  const unsigned char* src = reinterpret_cast<const unsigned char*>(&value);
  std::memset(dst + sizeof(size_t), 0, size - sizeof(size_t));
  abi_detail::ForEachField<T>([&](size_t off, size_t bytes) {
    if (off + bytes <= size) std::memcpy(dst + off, src + off, bytes);
  });
  return Status::Ok();
}

// kvarn_config_t embedded in kvarn_cache_options_t: the caller's embedded config occupies
// config.size bytes and the cache options' later fields follow it, so this library can only
// read an embedded config whose size is exactly its own sizeof(kvarn_config_t) (then the later
// fields are where it expects them). Smaller: INVALID_ARGUMENT; larger: UNSUPPORTED (a layout
// of a newer header). `name` names the embedded field ("options->config").
inline Status CheckEmbeddedConfig(const kvarn_config_t& config, const char* name) {
  if (config.size == sizeof(kvarn_config_t)) return Status::Ok();
  return {config.size > sizeof(kvarn_config_t) ? KVARN_ERR_UNSUPPORTED : KVARN_ERR_INVALID_ARGUMENT,
          std::string(name) + ".size is " + std::to_string(config.size) + "; a config embedded " +
              "in another struct must have size == sizeof(kvarn_config_t) == " +
              std::to_string(sizeof(kvarn_config_t)) +
              " (its size places the fields after it; initialize it with kvarn_config_defaults "
              "or kvarn_config_from_preset)"};
}

}  // namespace kvarn
