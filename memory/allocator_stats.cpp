#include "memory/allocator_stats.h"

namespace memfit {

std::map<std::string, std::int64_t> AllocatorStats::as_map() const {
  std::map<std::string, std::int64_t> m;
  static constexpr const char* kTypes[kStatTypeCount] = {"all", "small_pool", "large_pool"};
  const auto put = [&](const char* name, const StatArray& a) {
    for (int t = 0; t < kStatTypeCount; ++t) {
      const std::string prefix = std::string(name) + "." + kTypes[t] + ".";
      m[prefix + "current"] = a[t].current;
      m[prefix + "peak"] = a[t].peak;
      m[prefix + "allocated"] = a[t].allocated;
      m[prefix + "freed"] = a[t].freed;
    }
  };
  put("allocation", allocation);
  put("segment", segment);
  put("active", active);
  put("inactive_split", inactive_split);
  put("allocated_bytes", allocated_bytes);
  put("reserved_bytes", reserved_bytes);
  put("active_bytes", active_bytes);
  put("inactive_split_bytes", inactive_split_bytes);
  put("requested_bytes", requested_bytes);
  m["num_alloc_retries"] = num_alloc_retries;
  m["num_ooms"] = num_ooms;
  m["num_device_alloc"] = num_device_alloc;
  m["num_device_free"] = num_device_free;
  for (std::size_t c = 0; c < kCategoryCount; ++c) {
    const std::string prefix =
        std::string("category_bytes.") + category_name(static_cast<Category>(c)) + ".";
    m[prefix + "current"] = category_bytes[c].current;
    m[prefix + "peak"] = category_bytes[c].peak;
  }
  return m;
}

}  // namespace memfit
