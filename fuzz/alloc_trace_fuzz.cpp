// Fuzz harness: memfit's text allocation traces (parse_trace, which `memfit replay FILE` and
// read_trace call), then validate() as replay does before running one.
#include "fuzz/fuzz_util.h"
#include "memory/alloc_trace.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  memfit::fuzz::run([&] {
    const memfit::AllocTrace t = memfit::parse_trace(memfit::fuzz::text(data, size), "fuzz.trace");
    (void)t.validate();
  });
  return 0;
}
