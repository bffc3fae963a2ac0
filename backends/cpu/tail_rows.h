// Rows of the per-request tail state (kvarn_experimental.h) on the CPU: fp16 rows, or int8 rows
// with an fp16 scale each (tail_bits 8). Every reader and writer of a slot goes through here, so
// the two forms differ in one place: a row is written from its fp16 value and read back as fp16
// (for int8 rows, the value the codes and scale stand for).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/backend.h"
#include "core/half.h"

namespace kvarn {
namespace cpu {

class TailRows {
 public:
  static constexpr int kMaxD = 512;  // the largest head dim (kvarn.h)

  TailRows(const PagedKV& kv, int D) : kv_(kv), D_(D) {}

  bool int8() const { return kv_.tail_bits == 8; }

  // n rows from `row` of head h of K (which 0) or V of slot s, as fp16, dense into out.
  void Read(int64_t s, int which, int h, int64_t row, int64_t n, uint16_t* out) const {
    if (!int8()) {
      std::memcpy(out, Fp16(s, which, h, row), static_cast<size_t>(n) * D_ * 2);
      return;
    }
    for (int64_t r = 0; r < n; ++r) {
      Decode(Codes(s, which, h, row + r), *Scale(s, which, h, row + r), D_, out + r * D_);
    }
  }
  // The same rows in place where they are fp16 rows already, else decoded into buf.
  const uint16_t* View(int64_t s, int which, int h, int64_t row, int64_t n, uint16_t* buf) const {
    if (!int8()) return Fp16(s, which, h, row);
    Read(s, which, h, row, n, buf);
    return buf;
  }

  // Stores one fp16 row.
  void Write(int64_t s, int which, int h, int64_t row, const uint16_t* in) const {
    if (!int8()) {
      std::memcpy(Fp16(s, which, h, row), in, static_cast<size_t>(D_) * 2);
      return;
    }
    Encode(in, D_, Codes(s, which, h, row), Scale(s, which, h, row));
  }

  // The fp16 row a stored row of value `in` reads back as (in itself for fp16 rows).
  void RoundTrip(const uint16_t* in, uint16_t* out) const {
    if (!int8()) {
      std::memcpy(out, in, static_cast<size_t>(D_) * 2);
      return;
    }
    int8_t codes[kMaxD];
    uint16_t scale = 0;
    Encode(in, D_, codes, &scale);
    Decode(codes, scale, D_, out);
  }

  // int8 rows: scale = fp16(max |x| / 127), codes = rint(x / scale) clamped to [-127, 127]
  // (all 0 where the scale is 0); a row reads back as fp16(code * scale).
  static void Encode(const uint16_t* in, int D, int8_t* codes, uint16_t* scale_out) {
    float amax = 0.f;
    for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(half_to_float(in[d])));
    const uint16_t scale_h = float_to_half(amax / 127.f);
    const float scale = half_to_float(scale_h);
    for (int d = 0; d < D; ++d) {
      const float q = scale > 0.f ? std::nearbyint(half_to_float(in[d]) / scale) : 0.f;
      codes[d] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, q)));
    }
    *scale_out = scale_h;
  }
  static void Decode(const int8_t* codes, uint16_t scale_h, int D, uint16_t* out) {
    const float scale = half_to_float(scale_h);
    for (int d = 0; d < D; ++d) out[d] = float_to_half(static_cast<float>(codes[d]) * scale);
  }

  // Moves rows [shift, shift + n) of every head of K and V of slot s to [0, n).
  void MoveDown(int64_t s, int64_t shift, int64_t n) const {
    if (n <= 0 || shift == 0) return;
    for (int which = 0; which < 2; ++which) {
      for (int h = 0; h < kv_.num_kv_heads; ++h) {
        if (!int8()) {
          std::memmove(Fp16(s, which, h, 0), Fp16(s, which, h, shift),
                       static_cast<size_t>(n) * D_ * 2);
        } else {
          std::memmove(Codes(s, which, h, 0), Codes(s, which, h, shift),
                       static_cast<size_t>(n) * D_);
          std::memmove(Scale(s, which, h, 0), Scale(s, which, h, shift),
                       static_cast<size_t>(n) * 2);
        }
      }
    }
  }

 private:
  // Head h of K (which 0) or V: row 0 of [Hk][cap] rows.
  size_t HeadRow(int which, int h, int64_t row) const {
    return (static_cast<size_t>(which) * kv_.num_kv_heads + h) * kv_.tail_cap +
           static_cast<size_t>(row);
  }
  uint16_t* SlotBase(int64_t s) const {
    return kv_.tail_states + static_cast<size_t>(s) * kv_.tail_slot_elems;
  }
  uint16_t* Fp16(int64_t s, int which, int h, int64_t row) const {
    return SlotBase(s) + HeadRow(which, h, row) * D_;
  }
  int8_t* Codes(int64_t s, int which, int h, int64_t row) const {
    return reinterpret_cast<int8_t*>(SlotBase(s)) + HeadRow(which, h, row) * D_;
  }
  uint16_t* Scale(int64_t s, int which, int h, int64_t row) const {
    // The scales follow the 2 * Hk * cap rows of D codes (an even byte count: cap % 8 == 0).
    const size_t codes = 2 * static_cast<size_t>(kv_.num_kv_heads) * kv_.tail_cap * D_;
    return SlotBase(s) + codes / 2 + HeadRow(which, h, row);
  }

  const PagedKV& kv_;
  int D_;
};

}  // namespace cpu
}  // namespace kvarn
