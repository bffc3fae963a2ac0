// kvarn-selftest: shows what libkvarn can do on this machine, and how fast.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
//
// Uses only the public C API (kvarn/kvarn.h). For every backend it runs, and every preset and
// head dim: (a) record size and field offsets against docs/FORMAT.md section 7, (b) quantize /
// dequantize error on seeded synthetic KV data against plain per-token RTN, (c) paged attention
// (append, flush, decode, split decode, extend, GQA 4) against a float64 attention over the same
// stored cache, (d) quantize and decode throughput. Exit status: 0 when every check passed and at
// least one backend ran, 1 otherwise, 2 on a bad command line.
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "checks.h"
#include "kvarn/kvarn.h"
#include "report.h"

namespace kvarn_selftest {
namespace {

struct CommandLine {
  bool json = false;
  bool quick = false;
  bool verbose = false;
  bool help = false;
  bool backend_given = false;
  kvarn_backend_t backend = KVARN_BACKEND_AUTO;
  uint64_t seed = SweepOptions().seed;
};

void PrintUsage(std::FILE* out) {
  std::fputs(
      "usage: kvarn-selftest [--quick | --full] [--backend cpu|cuda|rocm|auto] [--json]\n"
      "                      [--seed N] [--verbose] [--help]\n"
      "\n"
      "Checks libkvarn on this machine: record format, quantization error against plain\n"
      "per-token RTN, paged attention against float64, and throughput, for every preset.\n"
      "\n"
      "  --quick        head_dim 128 (and 96 on the CPU), small caches (seconds)\n"
      "  --full         head_dims 64, 128, 256, 512 (and 80, 96 on the CPU; the default)\n"
      "  --backend B    run on backend B only (auto: the backend a default context picks);\n"
      "                 without it, every available backend runs\n"
      "  --json         print the results as one JSON object instead of a table\n"
      "  --seed N       seed of the synthetic data (default 0x6b7661726e2d7374)\n"
      "  --verbose      print extra measurements under each row\n"
      "  --help         print this message\n"
      "\n"
      "Exit status: 0 if every check passed and at least one backend ran, 1 if not, 2 for a bad\n"
      "command line.\n",
      out);
}

// Returns false (after printing why) for a bad command line.
bool ParseCommandLine(int argc, char** argv, CommandLine* cl) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    const size_t eq = arg.find('=');
    std::string name = arg;
    if (arg.compare(0, 2, "--") == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    auto take_value = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvarn-selftest: %s needs a value\n", name.c_str());
        return false;
      }
      value = argv[++i];
      return true;
    };
    if (name == "--help" || name == "-h") {
      cl->help = true;
    } else if (name == "--json" && !has_value) {
      cl->json = true;
    } else if (name == "--quick" && !has_value) {
      cl->quick = true;
    } else if (name == "--full" && !has_value) {
      cl->quick = false;
    } else if (name == "--verbose" && !has_value) {
      cl->verbose = true;
    } else if (name == "--backend") {
      if (!take_value()) return false;
      if (value == "auto") {
        cl->backend = KVARN_BACKEND_AUTO;
      } else if (value == "cpu") {
        cl->backend = KVARN_BACKEND_CPU;
      } else if (value == "cuda") {
        cl->backend = KVARN_BACKEND_CUDA;
      } else if (value == "rocm") {
        cl->backend = KVARN_BACKEND_ROCM;
      } else {
        std::fprintf(stderr, "kvarn-selftest: unknown backend '%s'\n", value.c_str());
        return false;
      }
      cl->backend_given = true;
    } else if (name == "--seed") {
      if (!take_value()) return false;
      char* end = nullptr;
      errno = 0;
      const unsigned long long seed = std::strtoull(value.c_str(), &end, 0);
      if (value.empty() || *end != '\0' || errno != 0) {
        std::fprintf(stderr, "kvarn-selftest: bad seed '%s'\n", value.c_str());
        return false;
      }
      cl->seed = seed;
    } else {
      std::fprintf(stderr, "kvarn-selftest: unknown option '%s'\n", arg.c_str());
      return false;
    }
  }
  return true;
}

// "call failed: status (detail)"; reads kvarn_last_error() before any other kvarn_* call.
std::string StatusMessage(kvarn_status_t status, const char* call) {
  const std::string detail = kvarn_last_error();
  std::string message = std::string(call) + " failed: " + kvarn_status_string(status);
  if (!detail.empty()) message += " (" + detail + ")";
  return message;
}

std::string CpuFeatures(Report* report) {
  std::vector<char> buf(1024);
  for (;;) {
    const kvarn_status_t status = kvarn_cpu_features(buf.data(), buf.size());
    if (status == KVARN_OK) return buf.data();
    if (status == KVARN_ERR_BUFFER_TOO_SMALL && buf.size() < (1u << 16)) {
      buf.resize(buf.size() * 4);
      continue;
    }
    report->errors.push_back(StatusMessage(status, "kvarn_cpu_features"));
    return "";
  }
}

// Finds (or adds) the report entry of a backend value.
BackendReport* EntryFor(Report* report, kvarn_backend_t backend) {
  const std::string name = kvarn_backend_name(backend);
  for (BackendReport& b : report->backends) {
    if (b.name == name) return &b;
  }
  BackendReport b;
  b.name = name;
  report->backends.push_back(b);
  return &report->backends.back();
}

// Runs the sweep on one context. Every buffer of the sweep lives in the context's memory
// (kvarn_memory_alloc), on the context's device.
void RunBackend(kvarn_context_t* context, const CommandLine& cl,
                const std::vector<std::string>& presets, Report* report) {
  kvarn_backend_t backend = KVARN_BACKEND_AUTO;
  kvarn_status_t status = kvarn_context_get_backend(context, &backend);
  if (status != KVARN_OK) {
    report->errors.push_back(StatusMessage(status, "kvarn_context_get_backend"));
    return;
  }
  BackendReport* entry = EntryFor(report, backend);
  entry->selected = true;
  kvarn_cpu_isa_t isa = KVARN_CPU_ISA_NONE;
  status = kvarn_context_get_cpu_isa(context, &isa);
  if (status != KVARN_OK) {
    report->errors.push_back(StatusMessage(status, "kvarn_context_get_cpu_isa"));
    return;
  }
  entry->isa = kvarn_cpu_isa_name(isa);
  int32_t threads = 0, device = 0;
  status = kvarn_context_get_num_threads(context, &threads);
  if (status != KVARN_OK) {
    report->errors.push_back(StatusMessage(status, "kvarn_context_get_num_threads"));
    return;
  }
  entry->threads = threads;
  // Not needed to run (the context allocates on its own device), but part of the API checked.
  status = kvarn_context_get_device(context, &device);
  if (status != KVARN_OK) {
    report->errors.push_back(StatusMessage(status, "kvarn_context_get_device"));
    return;
  }
  if (backend == KVARN_BACKEND_CPU && isa == KVARN_CPU_ISA_NONE) {
    report->errors.push_back("a CPU context reports CPU ISA 'none'");
  }
  if (backend != KVARN_BACKEND_CPU && isa != KVARN_CPU_ISA_NONE) {
    report->errors.push_back(entry->name + " context reports CPU ISA '" + entry->isa +
                             "' (expected 'none')");
  }

  BackendTarget target;
  target.context = context;
  target.name = entry->name;
  target.attention_tolerance = backend == KVARN_BACKEND_CPU ? 1e-3 : 2e-3;
  entry->ran = true;
  if (!cl.json) {
    std::printf("running on %s: ISA %s, %d thread%s\n\n", entry->name.c_str(), entry->isa.c_str(),
                entry->threads, entry->threads == 1 ? "" : "s");
    PrintTableHeader(stdout);
  }

  SweepOptions options;
  options.quick = cl.quick;
  options.seed = cl.seed;
  // Head dims 80 and 96 (docs/FORMAT.md section 3) have CPU kernels only; --quick checks 96 there.
  const bool cpu = backend == KVARN_BACKEND_CPU;
  std::vector<int> head_dims;
  if (cl.quick) {
    head_dims = cpu ? std::vector<int>{128, 96} : std::vector<int>{128};
  } else {
    head_dims =
        cpu ? std::vector<int>{64, 80, 96, 128, 256, 512} : std::vector<int>{64, 128, 256, 512};
  }
  for (const std::string& preset : presets) {
    for (int head_dim : head_dims) {
      RowResult row = RunRow(target, preset, head_dim, options);
      if (!cl.json) PrintTableRow(row, cl.verbose, stdout);
      report->rows.push_back(std::move(row));
    }
  }
}

// The CPU SIMD level against the scalar reference: quantize throughput of the same batch at both
// levels (one thread each, through the public ISA cap) and whether the records are identical.
// Runs last: it leaves the process-wide cap at the measured level.
void MeasureSimd(const CommandLine& cl, Report* report) {
  // The level a default CPU context runs (the KVARN_CPU_ISA cap included).
  kvarn_cpu_isa_t best = KVARN_CPU_ISA_SCALAR;
  {
    kvarn_context_options_t options;
    kvarn_context_options_defaults(&options);
    options.backend = KVARN_BACKEND_CPU;
    kvarn_context_t* context = nullptr;
    if (kvarn_context_create(&options, &context) != KVARN_OK) return;
    kvarn_context_get_cpu_isa(context, &best);
    kvarn_context_destroy(context);
  }
  if (best == KVARN_CPU_ISA_SCALAR || best == KVARN_CPU_ISA_NONE) return;
  kvarn_config_t config;
  if (kvarn_config_from_preset("k4v2_g128", 128, &config) != KVARN_OK) return;
  size_t rb = 0;
  kvarn_record_bytes(&config, &rb);
  const size_t n_tiles = cl.quick ? 4 : 16;
  std::vector<float> k(n_tiles * 128 * 128), v(k.size());
  uint64_t x = cl.seed | 1;
  for (size_t i = 0; i < k.size(); ++i) {  // uniform-ish values from an xorshift, never zero
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    k[i] = static_cast<float>(static_cast<int64_t>(x % 2001) - 1000) / 300.f + 0.001f;
    v[i] = static_cast<float>(static_cast<int64_t>((x >> 20) % 2001) - 1000) / 500.f + 0.001f;
  }
  std::vector<uint8_t> records[2];
  double rps[2] = {0, 0};
  const kvarn_cpu_isa_t isas[2] = {KVARN_CPU_ISA_SCALAR, best};
  for (int i = 0; i < 2; ++i) {
    kvarn_set_max_cpu_isa(isas[i]);
    kvarn_context_options_t options;
    kvarn_context_options_defaults(&options);
    options.backend = KVARN_BACKEND_CPU;
    options.num_threads = 1;
    kvarn_context_t* context = nullptr;
    const kvarn_status_t st = kvarn_context_create(&options, &context);
    kvarn_set_max_cpu_isa(best);
    if (st != KVARN_OK) {
      report->errors.push_back(StatusMessage(st, "kvarn_context_create (CPU SIMD figures)"));
      return;
    }
    records[i].assign(n_tiles * rb, 0);
    using Clock = std::chrono::steady_clock;
    int calls = 0;
    const Clock::time_point start = Clock::now();
    double elapsed = 0;
    while (calls < 2 || elapsed < (cl.quick ? 0.05 : 0.2)) {
      if (kvarn_quantize(context, &config, n_tiles, KVARN_DTYPE_F32, k.data(), v.data(), 0,
                         records[i].data(), rb) != KVARN_OK) {
        report->errors.push_back(std::string("CPU SIMD figures: kvarn_quantize: ") +
                                 kvarn_last_error());
        kvarn_context_destroy(context);
        return;
      }
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    }
    rps[i] = calls * static_cast<double>(n_tiles) / elapsed;
    kvarn_context_destroy(context);
  }
  SimdFigures& f = report->simd;
  f.measured = true;
  f.isa = kvarn_cpu_isa_name(best);
  f.scalar_records_per_s = rps[0];
  f.quantize_records_per_s = rps[1];
  f.records_identical = records[0] == records[1];
  if (!f.records_identical) {
    report->errors.push_back(std::string("CPU ISA ") + f.isa +
                             " writes records that differ from the scalar reference's");
  }
}

int Main(int argc, char** argv) {
  CommandLine cl;
  if (!ParseCommandLine(argc, argv, &cl)) {
    PrintUsage(stderr);
    return 2;
  }
  if (cl.help) {
    PrintUsage(stdout);
    return 0;
  }

  Report report;
  report.version = kvarn_version_string();
  report.version_number = kvarn_version_number();
  report.abi = kvarn_abi_version();
  report.mode = cl.quick ? "quick" : "full";
  report.seed = cl.seed;
  if (report.abi != KVARN_ABI_VERSION) {
    report.errors.push_back("the loaded library has ABI " + std::to_string(report.abi) +
                            " but this tool was built for ABI " +
                            std::to_string(KVARN_ABI_VERSION));
  }
  {
    const uint32_t n = report.version_number;
    const std::string expected = std::to_string(n / 10000) + "." + std::to_string(n / 100 % 100) +
                                 "." + std::to_string(n % 100);
    if (expected != report.version) {
      report.errors.push_back("kvarn_version_string() '" + report.version +
                              "' disagrees with kvarn_version_number() " + std::to_string(n));
    }
  }
  report.cpu_features = CpuFeatures(&report);
  report.best_isa = kvarn_cpu_isa_name(kvarn_cpu_isa_best());

  const int32_t backend_count = kvarn_backend_count();
  std::vector<kvarn_backend_t> available;
  for (int32_t i = 0; i < backend_count; ++i) {
    kvarn_backend_info_t info;
    std::memset(&info, 0, sizeof(info));
    info.size = sizeof(info);
    const kvarn_status_t status = kvarn_backend_get_info(i, &info);
    if (status != KVARN_OK) {
      report.errors.push_back(StatusMessage(status, "kvarn_backend_get_info"));
      continue;
    }
    BackendReport* entry = EntryFor(&report, info.backend);
    if (info.name != nullptr) entry->name = info.name;
    entry->available = info.available != 0;
    entry->device_count = info.device_count;
    entry->reason = info.reason != nullptr ? info.reason : "";
    if (entry->available) available.push_back(info.backend);
  }
  if (backend_count <= 0) report.errors.push_back("kvarn_backend_count() reports no backends");

  std::vector<std::string> presets;
  const int32_t preset_count = kvarn_preset_count();
  for (int32_t i = 0; i < preset_count; ++i) {
    const char* name = kvarn_preset_name(i);
    if (name == nullptr) {
      report.errors.push_back("kvarn_preset_name(" + std::to_string(i) + ") is NULL");
      continue;
    }
    presets.push_back(name);
  }
  if (presets.empty()) report.errors.push_back("kvarn_preset_count() reports no presets");

  if (!cl.json) PrintPreamble(report, stdout);

  std::vector<kvarn_backend_t> to_run;
  if (cl.backend_given) {
    to_run.push_back(cl.backend);
  } else {
    to_run = available;
  }
  for (kvarn_backend_t backend : to_run) {
    kvarn_context_options_t options;
    kvarn_context_options_defaults(&options);
    options.backend = backend;
    kvarn_context_t* context = nullptr;
    const kvarn_status_t status = kvarn_context_create(&options, &context);
    if (status != KVARN_OK) {
      // An available backend that cannot make a context, or an explicitly requested one that
      // is missing: both are failures the operator needs to see.
      report.errors.push_back(std::string("backend ") + kvarn_backend_name(backend) + ": " +
                              StatusMessage(status, "kvarn_context_create"));
      continue;
    }
    RunBackend(context, cl, presets, &report);
    kvarn_context_destroy(context);
  }
  for (const BackendReport& b : report.backends) {
    if (b.ran && b.name == "cpu") MeasureSimd(cl, &report);
  }
  bool any_ran = false;
  for (const BackendReport& b : report.backends) any_ran = any_ran || b.ran;
  if (!any_ran) report.errors.push_back("no backend ran");

  if (cl.json) {
    PrintJson(report, stdout);
  } else {
    for (const BackendReport& b : report.backends) {
      if (b.selected && !b.ran && !b.skipped.empty()) {
        std::printf("not running on %s: %s\n", b.name.c_str(), b.skipped.c_str());
      }
    }
    PrintSummary(report, stdout);
  }
  return report.Failed() == 0 && any_ran ? 0 : 1;
}

}  // namespace
}  // namespace kvarn_selftest

int main(int argc, char** argv) { return kvarn_selftest::Main(argc, argv); }
