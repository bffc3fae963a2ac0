// The selftest's checks for one (backend, preset, head_dim) row.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#ifndef KVARN_TOOLS_SELFTEST_CHECKS_H_
#define KVARN_TOOLS_SELFTEST_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"

namespace kvarn_selftest {

constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

struct SweepOptions {
  bool quick = false;
  uint64_t seed = 0x6B7661726E2D7374ull;  // "kvarn-st"
};

// One backend the sweep runs on.
struct BackendTarget {
  kvarn_context_t* context = nullptr;  // also the address space of every buffer the row uses
  std::string name;
  // Pass bound of the attention check (docs/FORMAT.md section 10: 1e-3 on the CPU, 2e-3 on GPUs).
  double attention_tolerance = 1e-3;
};

// Everything measured for one row of the report. NaN marks a figure that was not measured.
struct RowResult {
  std::string backend;
  std::string preset;
  int head_dim = 0;
  int tile_tokens = 0;
  int key_bits = 0;
  int value_bits = 0;
  size_t record_bytes = 0;

  bool format_ok = false;  // record size and field offsets as docs/FORMAT.md section 7

  // Round trip (kvarn_quantize + kvarn_dequantize) against plain per-token RTN.
  double k_rel_mse = kNotMeasured;
  double k_rel_mse_rtn = kNotMeasured;
  double v_rel_mse = kNotMeasured;
  double v_rel_mse_rtn = kNotMeasured;
  bool padding_untouched = false;  // bytes between record_bytes and the stride
  bool deterministic = false;      // the same input gave the same bytes twice
  bool roundtrip_ok = false;

  // Paged attention against a float64 attention over the same stored cache.
  double attention_rel_l2 = kNotMeasured;  // worst of decode, split decode, extend
  double lse_max_err = kNotMeasured;       // max |lse - lse_ref| / max(1, |lse_ref|)
  bool flush_matches_quantize = false;     // kvarn_paged_flush bytes == kvarn_quantize bytes
  bool attention_ok = false;

  // Throughput.
  double quantize_records_per_s = kNotMeasured;
  double attention_tokens_per_s = kNotMeasured;  // cached tokens attended per second (decode)
  double attention_gb_per_s = kNotMeasured;      // record + fp16 page bytes read per second

  bool passed = false;
  std::vector<std::string> failures;  // why the row failed, one line each
  std::vector<std::string> notes;     // extra measurements shown with --verbose
};

// Runs every check of one row. Never throws; library failures become entries of `failures`.
RowResult RunRow(const BackendTarget& target, const std::string& preset, int head_dim,
                 const SweepOptions& options);

}  // namespace kvarn_selftest

#endif  // KVARN_TOOLS_SELFTEST_CHECKS_H_
