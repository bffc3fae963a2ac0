// Text table and JSON output of kvarn-selftest.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#include "report.h"

#include <cinttypes>
#include <cmath>

#include "kvarn/kvarn.h"

namespace kvarn_selftest {
namespace {

// printf of a double with `format`, or "-" right-aligned in `width` when it was not measured.
void PrintNumber(std::FILE* out, const char* format, int width, double value) {
  if (std::isnan(value)) {
    std::fprintf(out, "%*s", width, "-");
  } else {
    std::fprintf(out, format, value);
  }
}

double Ratio(double num, double den) {
  if (std::isnan(num) || std::isnan(den) || den <= 0.0) return kNotMeasured;
  return num / den;
}

void JsonString(std::FILE* out, const std::string& s) {
  std::fputc('"', out);
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        std::fputs("\\\"", out);
        break;
      case '\\':
        std::fputs("\\\\", out);
        break;
      case '\n':
        std::fputs("\\n", out);
        break;
      case '\t':
        std::fputs("\\t", out);
        break;
      default:
        if (c < 0x20) {
          std::fprintf(out, "\\u%04x", c);
        } else {
          std::fputc(c, out);
        }
    }
  }
  std::fputc('"', out);
}

// JSON has no NaN or infinity: figures that were not measured become null.
void JsonNumber(std::FILE* out, double value) {
  if (!std::isfinite(value)) {
    std::fputs("null", out);
  } else {
    std::fprintf(out, "%.6g", value);
  }
}

void JsonBool(std::FILE* out, bool value) { std::fputs(value ? "true" : "false", out); }

void JsonStringArray(std::FILE* out, const std::vector<std::string>& items) {
  std::fputc('[', out);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) std::fputs(", ", out);
    JsonString(out, items[i]);
  }
  std::fputc(']', out);
}

// Writes `"key": ` with the indentation of an object member.
void Key(std::FILE* out, const char* indent, const char* key) {
  std::fprintf(out, "%s\"%s\": ", indent, key);
}

}  // namespace

int Report::Passed() const {
  int n = 0;
  for (const RowResult& row : rows) n += row.passed ? 1 : 0;
  return n;
}

int Report::Failed() const {
  int n = static_cast<int>(errors.size());
  for (const RowResult& row : rows) n += row.passed ? 0 : 1;
  return n;
}

void PrintPreamble(const Report& report, std::FILE* out) {
  std::fprintf(out, "kvarn-selftest: libkvarn %s (ABI %u; built against header %d.%d.%d, ABI %d)\n",
               report.version.c_str(), report.abi, KVARN_VERSION_MAJOR, KVARN_VERSION_MINOR,
               KVARN_VERSION_PATCH, KVARN_ABI_VERSION);
  std::fprintf(out, "CPU features: %s\n", report.cpu_features.c_str());
  std::fprintf(out, "best CPU ISA: %s\n", report.best_isa.c_str());
  std::fprintf(out, "backends:\n");
  for (const BackendReport& b : report.backends) {
    if (b.available) {
      std::fprintf(out, "  %-5s available, %d device%s\n", b.name.c_str(), b.device_count,
                   b.device_count == 1 ? "" : "s");
    } else {
      std::fprintf(out, "  %-5s not available: %s\n", b.name.c_str(),
                   b.reason.empty() ? "(no reason given)" : b.reason.c_str());
    }
  }
  std::fprintf(out, "mode: %s, seed 0x%016" PRIx64 "\n\n", report.mode.c_str(), report.seed);
}

void PrintTableHeader(std::FILE* out) {
  std::fprintf(out, "%-5s %-10s %4s %6s %8s %8s %6s %8s %8s %6s %8s %9s %8s  %s\n", "bknd",
               "preset", "D", "rec B", "K kvarn", "K rtn", "K x", "V kvarn", "V rtn", "V x",
               "attn L2", "quant r/s", "attn GB/s", "result");
}

void PrintTableRow(const RowResult& row, bool verbose, std::FILE* out) {
  std::fprintf(out, "%-5s %-10s %4d %6zu ", row.backend.c_str(), row.preset.c_str(), row.head_dim,
               row.record_bytes);
  PrintNumber(out, "%8.2e", 8, row.k_rel_mse);
  std::fputc(' ', out);
  PrintNumber(out, "%8.2e", 8, row.k_rel_mse_rtn);
  std::fputc(' ', out);
  PrintNumber(out, "%6.3f", 6, Ratio(row.k_rel_mse, row.k_rel_mse_rtn));
  std::fputc(' ', out);
  PrintNumber(out, "%8.2e", 8, row.v_rel_mse);
  std::fputc(' ', out);
  PrintNumber(out, "%8.2e", 8, row.v_rel_mse_rtn);
  std::fputc(' ', out);
  PrintNumber(out, "%6.3f", 6, Ratio(row.v_rel_mse, row.v_rel_mse_rtn));
  std::fputc(' ', out);
  PrintNumber(out, "%8.1e", 8, row.attention_rel_l2);
  std::fputc(' ', out);
  PrintNumber(out, "%9.0f", 9, row.quantize_records_per_s);
  std::fputc(' ', out);
  PrintNumber(out, "%9.2f", 9, row.attention_gb_per_s);
  std::fprintf(out, "  %s\n", row.passed ? "PASS" : "FAIL");
  for (const std::string& f : row.failures) std::fprintf(out, "      ! %s\n", f.c_str());
  if (verbose) {
    for (const std::string& n : row.notes) std::fprintf(out, "      . %s\n", n.c_str());
  }
  std::fflush(out);
}

void PrintSummary(const Report& report, std::FILE* out) {
  std::fprintf(out,
               "\nK/V kvarn, rtn: relative MSE (sum sq err / sum sq) of libkvarn's round trip and "
               "of plain per-token RTN\n"
               "at the same bits; x = kvarn / rtn. attn L2: relative L2 error of paged attention "
               "vs float64 over\n"
               "the same cache (worst of decode, split decode, extend). quant r/s: records "
               "quantized per second;\n"
               "attn GB/s: record + fp16 page bytes read per second by decode attention.\n");
  if (report.simd.measured) {
    const SimdFigures& f = report.simd;
    std::fprintf(
        out,
        "\nCPU SIMD %s vs scalar reference (1 thread, k4v2_g128 D128): quantize %.0f vs "
        "%.0f records/s (%.1fx); records byte-identical: %s\n",
        f.isa.c_str(), f.quantize_records_per_s, f.scalar_records_per_s,
        f.scalar_records_per_s > 0 ? f.quantize_records_per_s / f.scalar_records_per_s : 0.0,
        f.records_identical ? "yes" : "NO");
  }
  if (!report.errors.empty()) {
    std::fprintf(out, "\nfailures outside the table:\n");
    for (const std::string& e : report.errors) std::fprintf(out, "  ! %s\n", e.c_str());
  }
  std::fprintf(out, "\n%d passed, %d failed\n", report.Passed(), report.Failed());
}

void PrintJson(const Report& report, std::FILE* out) {
  std::fputs("{\n", out);
  Key(out, "  ", "tool");
  std::fputs("\"kvarn-selftest\",\n", out);
  Key(out, "  ", "version");
  JsonString(out, report.version);
  std::fputs(",\n", out);
  Key(out, "  ", "version_number");
  std::fprintf(out, "%u,\n", report.version_number);
  Key(out, "  ", "abi");
  std::fprintf(out, "%u,\n", report.abi);
  Key(out, "  ", "header_version");
  std::fprintf(out, "\"%d.%d.%d\",\n", KVARN_VERSION_MAJOR, KVARN_VERSION_MINOR,
               KVARN_VERSION_PATCH);
  Key(out, "  ", "cpu_features");
  JsonString(out, report.cpu_features);
  std::fputs(",\n", out);
  Key(out, "  ", "cpu_isa_best");
  JsonString(out, report.best_isa);
  std::fputs(",\n", out);
  Key(out, "  ", "mode");
  JsonString(out, report.mode);
  std::fputs(",\n", out);
  if (report.simd.measured) {
    Key(out, "  ", "cpu_simd");
    std::fputs("{", out);
    Key(out, "", "isa");
    JsonString(out, report.simd.isa);
    std::fprintf(out,
                 ", \"quantize_records_per_s\": %.1f, \"scalar_quantize_records_per_s\": %.1f, ",
                 report.simd.quantize_records_per_s, report.simd.scalar_records_per_s);
    Key(out, "", "records_identical");
    JsonBool(out, report.simd.records_identical);
    std::fputs("},\n", out);
  }
  Key(out, "  ", "seed");
  std::fprintf(out, "\"0x%016" PRIx64 "\",\n", report.seed);  // a string: JSON numbers are doubles

  Key(out, "  ", "backends");
  std::fputs("[", out);
  for (size_t i = 0; i < report.backends.size(); ++i) {
    const BackendReport& b = report.backends[i];
    std::fputs(i == 0 ? "\n    {" : ",\n    {", out);
    Key(out, "", "name");
    JsonString(out, b.name);
    std::fputs(", ", out);
    Key(out, "", "available");
    JsonBool(out, b.available);
    std::fputs(", ", out);
    Key(out, "", "device_count");
    std::fprintf(out, "%d, ", b.device_count);
    Key(out, "", "reason");
    JsonString(out, b.reason);
    std::fputs(", ", out);
    Key(out, "", "selected");
    JsonBool(out, b.selected);
    std::fputs(", ", out);
    Key(out, "", "ran");
    JsonBool(out, b.ran);
    std::fputs(", ", out);
    Key(out, "", "isa");
    JsonString(out, b.isa);
    std::fputs(", ", out);
    Key(out, "", "threads");
    std::fprintf(out, "%d, ", b.threads);
    Key(out, "", "skipped");
    JsonString(out, b.skipped);
    std::fputs("}", out);
  }
  std::fputs(report.backends.empty() ? "],\n" : "\n  ],\n", out);

  Key(out, "  ", "results");
  std::fputs("[", out);
  for (size_t i = 0; i < report.rows.size(); ++i) {
    const RowResult& r = report.rows[i];
    const char* in = "      ";
    std::fputs(i == 0 ? "\n    {\n" : ",\n    {\n", out);
    auto str = [&](const char* key, const std::string& value) {
      Key(out, in, key);
      JsonString(out, value);
      std::fputs(",\n", out);
    };
    auto integer = [&](const char* key, long long value) {
      Key(out, in, key);
      std::fprintf(out, "%lld,\n", value);
    };
    auto number = [&](const char* key, double value) {
      Key(out, in, key);
      JsonNumber(out, value);
      std::fputs(",\n", out);
    };
    auto boolean = [&](const char* key, bool value) {
      Key(out, in, key);
      JsonBool(out, value);
      std::fputs(",\n", out);
    };
    str("backend", r.backend);
    str("preset", r.preset);
    integer("head_dim", r.head_dim);
    integer("tile_tokens", r.tile_tokens);
    integer("key_bits", r.key_bits);
    integer("value_bits", r.value_bits);
    integer("record_bytes", static_cast<long long>(r.record_bytes));
    boolean("format_ok", r.format_ok);
    number("k_rel_mse", r.k_rel_mse);
    number("k_rel_mse_rtn", r.k_rel_mse_rtn);
    number("k_ratio", Ratio(r.k_rel_mse, r.k_rel_mse_rtn));
    number("v_rel_mse", r.v_rel_mse);
    number("v_rel_mse_rtn", r.v_rel_mse_rtn);
    number("v_ratio", Ratio(r.v_rel_mse, r.v_rel_mse_rtn));
    boolean("padding_untouched", r.padding_untouched);
    boolean("deterministic", r.deterministic);
    boolean("roundtrip_ok", r.roundtrip_ok);
    number("attention_rel_l2", r.attention_rel_l2);
    number("lse_max_err", r.lse_max_err);
    boolean("flush_matches_quantize", r.flush_matches_quantize);
    boolean("attention_ok", r.attention_ok);
    number("quantize_records_per_s", r.quantize_records_per_s);
    number("attention_tokens_per_s", r.attention_tokens_per_s);
    number("attention_gb_per_s", r.attention_gb_per_s);
    boolean("passed", r.passed);
    Key(out, in, "failures");
    JsonStringArray(out, r.failures);
    std::fputs(",\n", out);
    Key(out, in, "notes");
    JsonStringArray(out, r.notes);
    std::fputs("\n    }", out);
  }
  std::fputs(report.rows.empty() ? "],\n" : "\n  ],\n", out);
  Key(out, "  ", "errors");
  JsonStringArray(out, report.errors);
  std::fputs(",\n", out);
  Key(out, "  ", "passed");
  std::fprintf(out, "%d,\n", report.Passed());
  Key(out, "  ", "failed");
  std::fprintf(out, "%d\n}\n", report.Failed());
}

}  // namespace kvarn_selftest
