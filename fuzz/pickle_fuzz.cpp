// Fuzz harness: memory_viz snapshot pickles (read_pickle, then import_snapshot: what `memfit
// replay FILE.pickle` does after reading the file). The imported trace is validated too.
#include "fuzz/fuzz_util.h"
#include "profiler/pickle.h"
#include "profiler/snapshot_import.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  memfit::fuzz::run([&] {
    const memfit::PickleValue v =
        memfit::read_pickle(memfit::fuzz::text(data, size), "fuzz.pickle");
    const memfit::ImportedSnapshot s = memfit::import_snapshot(v, "fuzz.pickle", -1);
    (void)s.trace.validate();
  });
  return 0;
}
