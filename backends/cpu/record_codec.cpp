#include "backends/cpu/record_codec.h"

#include <cmath>
#include <cstring>
#include <string>

#include "backends/cpu/normalize.h"
#include "backends/cpu/rtn_pack.h"
#include "core/half.h"

namespace kvarn {
namespace cpu {
namespace {

bool StoreHalfChecked(float x, uint16_t* out) {
  const uint16_t h = float_to_half(x);
  *out = h;
  return (h & 0x7c00u) != 0x7c00u;  // not inf / NaN
}

inline uint16_t ReadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);  // records are little-endian; so are all supported hosts
  return v;
}

}  // namespace

Status QuantizeMatrix(const float* M, int R, int C, int bits, bool normalize, int iterations,
                      TileScratch& s, uint8_t* codes, uint16_t* a, uint16_t* z, uint16_t* c) {
  s.s_r.assign(R, 1.f);
  s.s_c.assign(C, 1.f);
  s.B.resize(static_cast<size_t>(R) * C);
  if (normalize && iterations > 0) {
    NormalizeTile(M, R, C, iterations, s.s_r.data(), s.s_c.data(), s.X);
  }
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) {
      const size_t e = static_cast<size_t>(i) * C + j;
      s.B[e] = (M[e] / s.s_c[j]) / s.s_r[i];  // column scale first, then row (section 4)
    }
  }
  s.lo.resize(R);
  s.step.resize(R);
  RoundToNearestRows(s.B.data(), R, C, bits, codes, s.lo.data(), s.step.data());
  // Scale absorption (section 6): the row scale absorbs the RTN step and zero.
  for (int i = 0; i < R; ++i) {
    if (!StoreHalfChecked(s.s_r[i] * s.step[i], &a[i]) ||
        !StoreHalfChecked(s.s_r[i] * s.lo[i], &z[i])) {
      return {KVARN_ERR_OVERFLOW, "absorbed scale or zero of row " + std::to_string(i) +
                                      " exceeds the fp16 range (|x| > 65504)"};
    }
  }
  for (int j = 0; j < C; ++j) {
    if (!StoreHalfChecked(s.s_c[j], &c[j])) {
      return {KVARN_ERR_OVERFLOW, "column scale exceeds the fp16 range"};
    }
  }
  return Status::Ok();
}

Status QuantizeRecord(const Config& cfg, const uint16_t* k_tile, const uint16_t* v_tile,
                      uint8_t* record, TileScratch& s) {
  const int D = cfg.D, G = cfg.G;
  const RecordLayout& L = cfg.layout;
  const size_t n = static_cast<size_t>(G) * D;
  for (size_t e = 0; e < n; ++e) {
    if ((k_tile[e] & 0x7c00u) == 0x7c00u || (v_tile[e] & 0x7c00u) == 0x7c00u) {
      return {KVARN_ERR_NON_FINITE, "tile holds a NaN or Inf value"};
    }
  }
  s.M.resize(n);
  s.codes.resize(n);
  std::vector<uint16_t> a(std::max(D, G)), z(std::max(D, G)), c(std::max(D, G));

  // K: rows = channels d, columns = tokens t.
  for (int d = 0; d < D; ++d) {
    for (int t = 0; t < G; ++t)
      s.M[static_cast<size_t>(d) * G + t] = half_to_float(k_tile[t * D + d]);
  }
  KVARN_RETURN_IF_ERROR(QuantizeMatrix(s.M.data(), D, G, cfg.key_bits, cfg.k_normalize,
                                       cfg.iterations, s, s.codes.data(), a.data(), z.data(),
                                       c.data()));
  PackRows(s.codes.data(), D, G, cfg.key_bits, record + L.offset[KVARN_FIELD_K_CODES]);
  std::memcpy(record + L.offset[KVARN_FIELD_K_SCALE], a.data(), 2 * D);
  std::memcpy(record + L.offset[KVARN_FIELD_K_ZERO], z.data(), 2 * D);
  std::memcpy(record + L.offset[KVARN_FIELD_K_TOKEN_SCALE], c.data(), 2 * G);

  // V: rows = tokens t, columns = channels d.
  for (size_t e = 0; e < n; ++e) s.M[e] = half_to_float(v_tile[e]);
  KVARN_RETURN_IF_ERROR(QuantizeMatrix(s.M.data(), G, D, cfg.value_bits, cfg.v_normalize,
                                       cfg.iterations, s, s.codes.data(), a.data(), z.data(),
                                       c.data()));
  PackRows(s.codes.data(), G, D, cfg.value_bits, record + L.offset[KVARN_FIELD_V_CODES]);
  std::memcpy(record + L.offset[KVARN_FIELD_V_CHANNEL_SCALE], c.data(), 2 * D);
  std::memcpy(record + L.offset[KVARN_FIELD_V_SCALE], a.data(), 2 * G);
  std::memcpy(record + L.offset[KVARN_FIELD_V_ZERO], z.data(), 2 * G);
  return Status::Ok();
}

void DequantizeRecord(const Config& cfg, const uint8_t* record, float* k, float* v) {
  const int D = cfg.D, G = cfg.G;
  const RecordLayout& L = cfg.layout;
  std::vector<uint8_t> codes(static_cast<size_t>(D) * G);
  if (k != nullptr) {
    UnpackRows(record + L.offset[KVARN_FIELD_K_CODES], D, G, cfg.key_bits, codes.data());
    for (int d = 0; d < D; ++d) {
      const float a = half_to_float(ReadU16(record + L.offset[KVARN_FIELD_K_SCALE] + 2 * d));
      const float z = half_to_float(ReadU16(record + L.offset[KVARN_FIELD_K_ZERO] + 2 * d));
      for (int t = 0; t < G; ++t) {
        const float c =
            half_to_float(ReadU16(record + L.offset[KVARN_FIELD_K_TOKEN_SCALE] + 2 * t));
        k[t * D + d] = (codes[static_cast<size_t>(d) * G + t] * a + z) * c;
      }
    }
  }
  if (v != nullptr) {
    UnpackRows(record + L.offset[KVARN_FIELD_V_CODES], G, D, cfg.value_bits, codes.data());
    for (int t = 0; t < G; ++t) {
      const float a = half_to_float(ReadU16(record + L.offset[KVARN_FIELD_V_SCALE] + 2 * t));
      const float z = half_to_float(ReadU16(record + L.offset[KVARN_FIELD_V_ZERO] + 2 * t));
      for (int d = 0; d < D; ++d) {
        const float c =
            half_to_float(ReadU16(record + L.offset[KVARN_FIELD_V_CHANNEL_SCALE] + 2 * d));
        v[t * D + d] = (codes[static_cast<size_t>(t) * D + d] * a + z) * c;
      }
    }
  }
}

}  // namespace cpu
}  // namespace kvarn
