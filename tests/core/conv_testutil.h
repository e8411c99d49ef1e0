// The naive convolution the conv2d tests compare against (CPU ops, the Conv2d layer, cuDNN on
// a GPU): every product term visited in plain loops, in double, channels-last
// (inp NHWC, weight KRSC, out NPQK), no cleverness to share a bug with the kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend.h"

namespace memfit::testing {

inline Conv2dDesc conv(std::int64_t n, std::int64_t h, std::int64_t w, std::int64_t c,
                       std::int64_t k, std::int64_t r, std::int64_t s, std::int64_t sh = 1,
                       std::int64_t sw = 1, std::int64_t ph = 0, std::int64_t pw = 0) {
  Conv2dDesc d;
  d.n = n;
  d.h = h;
  d.w = w;
  d.c = c;
  d.k = k;
  d.r = r;
  d.s = s;
  d.stride_h = sh;
  d.stride_w = sw;
  d.pad_h = ph;
  d.pad_w = pw;
  return d;
}

// Calls f(out index, inp index, weight index) for every product term of the convolution.
template <typename F>
void for_conv_terms(const Conv2dDesc& d, F&& f) {
  const std::int64_t pp = d.p(), qq = d.q();
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t p = 0; p < pp; ++p)
      for (std::int64_t q = 0; q < qq; ++q)
        for (std::int64_t k = 0; k < d.k; ++k)
          for (std::int64_t r = 0; r < d.r; ++r)
            for (std::int64_t s = 0; s < d.s; ++s) {
              const std::int64_t y = p * d.stride_h - d.pad_h + r;
              const std::int64_t x = q * d.stride_w - d.pad_w + s;
              if (y < 0 || y >= d.h || x < 0 || x >= d.w) continue;
              for (std::int64_t c = 0; c < d.c; ++c) {
                f(((n * pp + p) * qq + q) * d.k + k, ((n * d.h + y) * d.w + x) * d.c + c,
                  ((k * d.r + r) * d.s + s) * d.c + c);
              }
            }
}

inline std::vector<double> ref_conv_forward(const Conv2dDesc& d, const std::vector<double>& inp,
                                            const std::vector<double>& w) {
  std::vector<double> out(static_cast<std::size_t>(d.n * d.p() * d.q() * d.k), 0.0);
  for_conv_terms(d, [&](std::int64_t o, std::int64_t i, std::int64_t j) {
    out[static_cast<std::size_t>(o)] +=
        inp[static_cast<std::size_t>(i)] * w[static_cast<std::size_t>(j)];
  });
  return out;
}

struct RefConvGrads {
  std::vector<double> dinp, dw;
};
inline RefConvGrads ref_conv_backward(const Conv2dDesc& d, const std::vector<double>& dout,
                                      const std::vector<double>& inp,
                                      const std::vector<double>& w) {
  RefConvGrads g{std::vector<double>(inp.size(), 0.0), std::vector<double>(w.size(), 0.0)};
  for_conv_terms(d, [&](std::int64_t o, std::int64_t i, std::int64_t j) {
    const auto oi = static_cast<std::size_t>(o), ii = static_cast<std::size_t>(i),
               ji = static_cast<std::size_t>(j);
    g.dinp[ii] += dout[oi] * w[ji];
    g.dw[ji] += dout[oi] * inp[ii];
  });
  return g;
}

}  // namespace memfit::testing
