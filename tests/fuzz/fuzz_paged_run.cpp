// libFuzzer target: the capturable layer 2 (kvarn.h "plan / run") over malformed metadata.
//
// Input: the choices of one engine step (tests/support/run_isolation.h): configuration, batch,
// lengths, then malformed token_indptr / q_indptr boundaries, write slots, NaN/Inf/overflowing
// rows, flush entries and counts, lengths, record counts, block-table entries, engine-set status
// entries, argument errors (struct sizes, NULLs, workspaces) and size-0 launches. The step runs
// with a status array and without one, on a 2-thread CPU context (so pool workers race where
// sequences would share rows), and every oracle of run_isolation.h is checked: defined statuses,
// failing calls write nothing, faulted sequences untouched, every sequence reported OK equal to a
// clean run of that sequence alone, the same faults with and without a status array.
#include "fuzz_common.h"
#include "support/run_isolation.h"

namespace {

// The fuzzer's bytes as choices (0 once they run out).
class ReaderChoices : public kvt::iso::Choices {
 public:
  ReaderChoices(const uint8_t* data, size_t size) : r_(data, size) {}
  uint32_t Below(uint32_t n) override { return n <= 256 ? (n ? r_.U8() % n : 0) : r_.Below(n); }

 private:
  kvfuzz::Reader r_;
};

kvarn_context_t* g_ctx = nullptr;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (g_ctx == nullptr) g_ctx = kvfuzz::CpuContext(2);
  ReaderChoices ch(data, size);
  kvt::iso::Scenario sc;
  std::string err = kvt::iso::MakeScenario(g_ctx, &ch, &sc);
  if (err.empty()) err = kvt::iso::Check(g_ctx, &ch, sc);
  if (!err.empty()) kvfuzz::Fail(__FILE__, __LINE__, err.c_str());
  return 0;
}
