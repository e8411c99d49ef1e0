// Fuzz harness: training-state files (TrainStateFile::from_bytes, which --resume's
// TrainStateFile::read calls). The file ends in a checksum of everything before it, which a
// mutation almost never keeps; the harness writes the right checksum into a mutated input
// (when it is long enough to have one) so the fuzzer reaches the header and entry checks
// behind it. Inputs shorter than the suffix go in unchanged.
#include <cstring>
#include <string>

#include "fuzz/fuzz_util.h"
#include "policies/train_state.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::size_t kSuffix = 16;  // checksum (8 bytes), then the end magic
  std::string bytes(memfit::fuzz::text(data, size));
  if (bytes.size() >= 24 + kSuffix) {
    const std::uint64_t sum = memfit::Hash64::of(bytes.data(), bytes.size() - kSuffix);
    std::memcpy(bytes.data() + bytes.size() - kSuffix, &sum, sizeof sum);
  }
  memfit::fuzz::run([&] { (void)memfit::TrainStateFile::from_bytes(bytes, "fuzz.mfstate"); });
  return 0;
}
