#include "tests/core/golden_testutil.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include "core/model.h"

namespace memfit::testing {

std::string golden_data_path(const std::string& file) {
  const char* dir = std::getenv("MEMFIT_SOURCE_DIR");
  return std::string(dir ? dir : MEMFIT_TEST_SOURCE_DIR) + "/tests/core/data/" + file;
}

std::map<std::string, GoldenEntry> read_golden(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::vector<char> data((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
  std::size_t off = 0;
  bool ok = true;
  const auto take = [&](void* dst, std::size_t n) {
    if (!ok || n > data.size() - off) {
      ok = false;
      return;
    }
    std::memcpy(dst, data.data() + off, n);
    off += n;
  };
  char magic[8] = {};
  std::uint32_t version = 0, count = 0;
  take(magic, 8);
  take(&version, 4);
  take(&count, 4);
  if (!ok || std::memcmp(magic, "MFGOLDEN", 8) != 0 || version != 1) {
    ADD_FAILURE() << path << ": missing, or not a version 1 MFGOLDEN file";
    return {};
  }
  constexpr std::int64_t kMaxElements = std::int64_t{1} << 24;
  std::map<std::string, GoldenEntry> out;
  for (std::uint32_t e = 0; e < count && ok; ++e) {
    std::uint32_t len = 0, ndim = 0;
    take(&len, 4);
    if (!ok || len > 4096) {
      ok = false;
      break;
    }
    std::string name(len, '\0');
    take(name.data(), len);
    GoldenEntry en;
    take(&en.dtype, 4);
    take(&ndim, 4);
    if (!ok || ndim > 8 || en.dtype > 1) {
      ok = false;
      break;
    }
    en.dims.resize(ndim);
    take(en.dims.data(), 8 * ndim);
    std::int64_t numel = 1;
    for (std::int64_t d : en.dims) {
      numel = (d < 0 || d > kMaxElements || numel < 0) ? -1 : numel * d;
      if (numel > kMaxElements) numel = -1;
    }
    if (!ok || numel < 0) {
      ok = false;
      break;
    }
    if (en.dtype == 0) {
      en.f.resize(static_cast<std::size_t>(numel));
      take(en.f.data(), 4 * en.f.size());
    } else {
      en.i.resize(static_cast<std::size_t>(numel));
      take(en.i.data(), 4 * en.i.size());
    }
    ok = ok && out.emplace(std::move(name), std::move(en)).second;
  }
  if (!ok || off != data.size()) {
    ADD_FAILURE() << path << ": malformed at byte " << off;
    return {};
  }
  return out;
}

GoldenErrors golden_compare(const std::vector<float>& a, const std::vector<float>& b, double atol,
                            double rtol, const std::string& what) {
  GoldenErrors e;
  EXPECT_EQ(a.size(), b.size()) << what;
  if (a.size() != b.size()) return e;
  int reported = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    const double d = std::fabs(double{a[k]} - double{b[k]});
    const double tol = atol + rtol * std::fabs(double{b[k]});
    e.max_abs = std::max(e.max_abs, d);
    e.worst_ratio = std::max(e.worst_ratio, d / tol);
    if (!(d <= tol) && reported++ < 3) {
      ADD_FAILURE() << what << "[" << k << "]: memfit " << a[k] << ", torch " << b[k] << ", |diff| "
                    << d << " > " << tol;
    }
  }
  return e;
}

double golden_double(float v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf - 1, v);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

void load_golden_params(const std::map<std::string, GoldenEntry>& g, Model& m, LayerContext& ctx) {
  std::set<std::string> in_file;
  for (const auto& [name, e] : g) {
    if (name.rfind("param/", 0) == 0) in_file.insert(name.substr(6));
  }
  std::set<std::string> in_model;
  for (Parameter* p : m.parameters()) {
    in_model.insert(p->name);
    const auto it = g.find("param/" + p->name);
    ASSERT_NE(it, g.end()) << p->name << " not in the golden file";
    const GoldenEntry& e = it->second;
    ASSERT_EQ(Shape::of(e.dims.data(), static_cast<int>(e.dims.size())), p->shape) << p->name;
    const Tensor src(const_cast<float*>(e.f.data()), p->shape, DType::kF32, Device::kCpu);
    ctx.backend.copy(ctx.stream, src, p->master_view());
  }
  EXPECT_EQ(in_file, in_model);
  ctx.backend.synchronize(ctx.stream);
}

}  // namespace memfit::testing
