// Text table and JSON output of kvarn-selftest.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#ifndef KVARN_TOOLS_SELFTEST_REPORT_H_
#define KVARN_TOOLS_SELFTEST_REPORT_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "checks.h"

namespace kvarn_selftest {

// What kvarn_backend_get_info said about one backend, and what the sweep did with it.
struct BackendReport {
  std::string name;
  bool available = false;
  int device_count = 0;
  std::string reason;     // why not available
  bool selected = false;  // the sweep tried to run on it
  bool ran = false;       // a context was created and rows ran
  std::string isa;        // CPU ISA of the context ("none" on GPUs)
  int threads = 0;
  std::string skipped;  // why a selected backend did not run (empty if it ran)
};

// The CPU SIMD level against the scalar reference on the same batch (1 thread each).
struct SimdFigures {
  bool measured = false;
  std::string isa;                    // the SIMD level (the best this machine and build have)
  double quantize_records_per_s = 0;  // k4v2_g128, D128, fp32 input
  double scalar_records_per_s = 0;    // the same at ISA scalar
  bool records_identical = false;     // byte-identical records at both levels
};

struct Report {
  std::string version;
  uint32_t version_number = 0;
  uint32_t abi = 0;
  std::string cpu_features;
  std::string best_isa;
  std::string mode;  // "quick" or "full"
  uint64_t seed = 0;
  std::vector<BackendReport> backends;
  std::vector<RowResult> rows;
  SimdFigures simd;
  std::vector<std::string> errors;  // failures outside any row (each counts as one failure)

  int Passed() const;
  int Failed() const;
};

// The lines before the table: version, ABI, CPU, backends.
void PrintPreamble(const Report& report, std::FILE* out);
void PrintTableHeader(std::FILE* out);
void PrintTableRow(const RowResult& row, bool verbose, std::FILE* out);
// Failures outside rows, a legend, and the closing "N passed, M failed" line.
void PrintSummary(const Report& report, std::FILE* out);
// The whole report as one JSON object.
void PrintJson(const Report& report, std::FILE* out);

}  // namespace kvarn_selftest

#endif  // KVARN_TOOLS_SELFTEST_REPORT_H_
