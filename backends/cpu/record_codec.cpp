#include "backends/cpu/record_codec.h"

#include <cmath>
#include <cstring>
#include <string>

#include "backends/cpu/kernels.h"
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
                      TileScratch& s, uint8_t* codes, uint16_t* a, uint16_t* z, uint16_t* c,
                      const Kernels* k) {
  const Kernels& K = k ? *k : ScalarKernels();
  s.s_r.assign(R, 1.f);
  s.s_c.assign(C, 1.f);
  s.B.resize(static_cast<size_t>(R) * C);
  if (normalize && iterations > 0) {
    NormalizeTile(M, R, C, iterations, s.s_r.data(), s.s_c.data(), s.X, &K);
  }
  s.lo.resize(R);
  s.step.resize(R);
  // B = (M / s_c) / s_r, column scale first (section 4), then RTN per row (section 5).
  K.balance_rtn(M, R, C, s.s_c.data(), s.s_r.data(), bits, s.B.data(), codes, s.lo.data(),
                s.step.data());
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
                      uint8_t* record, TileScratch& s, const Kernels* k) {
  const Kernels& K = k ? *k : ScalarKernels();
  const int D = cfg.D, G = cfg.G;
  const RecordLayout& L = cfg.layout;
  const size_t n = static_cast<size_t>(G) * D;
  s.M.resize(n);
  s.V.resize(n);
  s.codes.resize(n);
  std::vector<uint16_t> a(std::max(D, G)), z(std::max(D, G)), c(std::max(D, G));

  // Both tiles in fp32, checked for inf/NaN before any work: K transposed (rows = channels d,
  // columns = tokens t), V as stored (rows = tokens t, columns = channels d).
  if (!K.load_tile(k_tile, G, D, true, s.M.data()) ||
      !K.load_tile(v_tile, G, D, false, s.V.data())) {
    return {KVARN_ERR_NON_FINITE, "tile holds a NaN or Inf value"};
  }
  KVARN_RETURN_IF_ERROR(QuantizeMatrix(s.M.data(), D, G, cfg.key_bits, cfg.k_normalize,
                                       cfg.iterations, s, s.codes.data(), a.data(), z.data(),
                                       c.data(), &K));
  K.pack_rows(s.codes.data(), D, G, cfg.key_bits, record + L.offset[KVARN_FIELD_K_CODES]);
  std::memcpy(record + L.offset[KVARN_FIELD_K_SCALE], a.data(), 2 * D);
  std::memcpy(record + L.offset[KVARN_FIELD_K_ZERO], z.data(), 2 * D);
  std::memcpy(record + L.offset[KVARN_FIELD_K_TOKEN_SCALE], c.data(), 2 * G);

  // V: rows = tokens t, columns = channels d.
  KVARN_RETURN_IF_ERROR(QuantizeMatrix(s.V.data(), G, D, cfg.value_bits, cfg.v_normalize,
                                       cfg.iterations, s, s.codes.data(), a.data(), z.data(),
                                       c.data(), &K));
  K.pack_rows(s.codes.data(), G, D, cfg.value_bits, record + L.offset[KVARN_FIELD_V_CODES]);
  std::memcpy(record + L.offset[KVARN_FIELD_V_CHANNEL_SCALE], c.data(), 2 * D);
  std::memcpy(record + L.offset[KVARN_FIELD_V_SCALE], a.data(), 2 * G);
  std::memcpy(record + L.offset[KVARN_FIELD_V_ZERO], z.data(), 2 * G);
  return Status::Ok();
}

void ScalarHalvesToFloats(const uint8_t* in, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = half_to_float(ReadU16(in + 2 * i));
}

RecordView ViewRecord(const Config& cfg, const uint8_t* rec, std::vector<float>& f,
                      const Kernels* kernels) {
  const Kernels& K = kernels ? *kernels : ScalarKernels();
  const int D = cfg.D, G = cfg.G;
  const RecordLayout& L = cfg.layout;
  f.resize(3 * static_cast<size_t>(D) + 3 * static_cast<size_t>(G));
  float* ka = f.data();
  float* kz = ka + D;
  float* vc = kz + D;
  float* kc = vc + D;
  float* va = kc + G;
  float* vz = va + G;
  K.halves_to_floats(rec + L.offset[KVARN_FIELD_K_SCALE], D, ka);
  K.halves_to_floats(rec + L.offset[KVARN_FIELD_K_ZERO], D, kz);
  K.halves_to_floats(rec + L.offset[KVARN_FIELD_V_CHANNEL_SCALE], D, vc);
  K.halves_to_floats(rec + L.offset[KVARN_FIELD_K_TOKEN_SCALE], G, kc);
  K.halves_to_floats(rec + L.offset[KVARN_FIELD_V_SCALE], G, va);
  K.halves_to_floats(rec + L.offset[KVARN_FIELD_V_ZERO], G, vz);
  RecordView v;
  v.k_codes = rec + L.offset[KVARN_FIELD_K_CODES];
  v.v_codes = rec + L.offset[KVARN_FIELD_V_CODES];
  v.ka = ka;
  v.kz = kz;
  v.kc = kc;
  v.vc = vc;
  v.va = va;
  v.vz = vz;
  return v;
}

void ScalarDequantizeRecord(const RecordView& rec, int D, int G, int key_bits, int value_bits,
                            float* k, float* v) {
  std::vector<uint8_t> codes(static_cast<size_t>(D) * G);
  if (k != nullptr) {
    UnpackRows(rec.k_codes, D, G, key_bits, codes.data());
    for (int d = 0; d < D; ++d) {
      for (int t = 0; t < G; ++t) {
        k[t * D + d] = (codes[static_cast<size_t>(d) * G + t] * rec.ka[d] + rec.kz[d]) * rec.kc[t];
      }
    }
  }
  if (v != nullptr) {
    UnpackRows(rec.v_codes, G, D, value_bits, codes.data());
    for (int t = 0; t < G; ++t) {
      for (int d = 0; d < D; ++d) {
        v[t * D + d] = (codes[static_cast<size_t>(t) * D + d] * rec.va[t] + rec.vz[t]) * rec.vc[d];
      }
    }
  }
}

void DequantizeRecord(const Config& cfg, const uint8_t* record, float* k, float* v,
                      const Kernels* kernels) {
  const Kernels& K = kernels ? *kernels : ScalarKernels();
  std::vector<float> scales;
  const RecordView rec = ViewRecord(cfg, record, scales, &K);
  K.dequantize_record(rec, cfg.D, cfg.G, cfg.key_bits, cfg.value_bits, k, v);
}

}  // namespace cpu
}  // namespace kvarn
