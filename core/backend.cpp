// Argument checks shared by every backend (see the contract in backend.h). Implementations
// never see an invalid call, so the CPU reference, the meta dry run and the CUDA backend agree
// on what is legal.
#include "core/backend.h"

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

#include "core/backend_check.h"
#include "memory/error.h"

namespace memfit {

namespace backend_check {

std::string tensor_desc(const Tensor& t) {
  std::ostringstream os;
  os << dtype_name(t.dtype()) << ' ' << t.shape().str() << " on " << device_name(t.device());
  return os.str();
}

std::string operator+(const Where& w, const char* s) {
  return std::string("Backend::") + w.op + " (" + w.backend + ")" + s;
}

void check_operand(const Where& where, const char* role, const Tensor& t, Device dev,
                   bool host_ok) {
  // Tensor's constructor has already rejected unknown dtypes.
  if (t.device() != dev && !(host_ok && t.device() == Device::kCpu)) {
    throw InvalidArgument(where + ": " + role + " is " + tensor_desc(t) + "; valid: a tensor on " +
                          device_name(dev) + (host_ok ? " or the host (cpu)" : ""));
  }
  if (t.raw() == nullptr && t.numel() > 0) {
    throw InvalidArgument(where + ": " + role + " is " + tensor_desc(t) +
                          " with no memory (null data); valid: a view of allocated memory");
  }
}

void check_same_numel(const Where& where, const char* ra, const Tensor& a, const char* rb,
                      const Tensor& b) {
  if (a.numel() != b.numel()) {
    throw InvalidArgument(where + ": " + ra + " is " + tensor_desc(a) + " but " + rb + " is " +
                          tensor_desc(b) + "; valid: the same number of elements");
  }
}

void check_no_overlap(const Where& where, const char* ra, Span a, const char* rb, Span b) {
  if (overlaps(a, b)) {
    std::ostringstream os;
    os << (where + ": ") << ra << " [0x" << std::hex << a.begin << ", 0x" << a.end << ") overlaps "
       << rb << " [0x" << b.begin << ", 0x" << b.end << ")"
       << "; valid: disjoint memory (an output must not alias an input)";
    throw InvalidArgument(os.str());
  }
}

}  // namespace backend_check

using namespace backend_check;  // NOLINT: this file is the checks' home

std::int64_t GemmDesc::flops() const {
  std::int64_t f = 2;
  for (std::int64_t v : {m, n, k, batch}) {
    if (v <= 0) return 0;
    f = mul_or_neg(f, v);
    if (f < 0) return kInt64Max;
  }
  return f;
}

SumSqResult read_sumsq(const Tensor& host_out) {
  if (host_out.device() != Device::kCpu || host_out.dtype() != DType::kF32 ||
      host_out.numel() != kSumSqSlots || host_out.raw() == nullptr) {
    throw InvalidArgument("read_sumsq: out is " + tensor_desc(host_out) +
                          "; valid: an f32 tensor of 2 elements on the host (cpu), copied "
                          "there from sumsq()'s output and read after synchronize()");
  }
  const float* v = host_out.data<float>();
  return {static_cast<double>(v[0]), v[1] != 0.0f};
}

Backend::Backend() : sync_(*this) {}
Backend::~Backend() = default;

std::int64_t Backend::max_gemm_dim() const { return kInt64Max; }

std::string Backend::where(const char* op) const {
  return std::string("Backend::") + op + " (" + name() + ")";
}

void Backend::check_stream(StreamId stream, const char* op) const {
  if (!do_has_stream(stream)) {
    throw InvalidArgument(where(op) + ": unknown stream " + std::to_string(stream) +
                          "; valid: kDefaultStream (0) or a stream from create_stream() not "
                          "yet destroyed");
  }
}

void Backend::check_event(EventHandle event, const char* op) const {
  if (event == 0 || !do_has_event(event)) {
    throw InvalidArgument(where(op) + ": unknown event " + std::to_string(event) +
                          "; valid: a handle from record_event() not yet released");
  }
}

// ---- streams and events --------------------------------------------------------------------

StreamId Backend::create_stream() { return do_create_stream(); }

void Backend::destroy_stream(StreamId stream) {
  if (stream == kDefaultStream) {
    throw InvalidArgument(where("destroy_stream") +
                          ": kDefaultStream cannot be destroyed; valid: a stream from "
                          "create_stream()");
  }
  check_stream(stream, "destroy_stream");
  do_destroy_stream(stream);
}

bool Backend::has_stream(StreamId stream) const { return do_has_stream(stream); }

void Backend::synchronize(StreamId stream) {
  check_stream(stream, "synchronize");
  do_synchronize(stream);
}

EventHandle Backend::record_event(StreamId stream) {
  check_stream(stream, "record_event");
  return do_record_event(stream);
}

bool Backend::query_event(EventHandle event) {
  check_event(event, "query_event");
  return do_query_event(event);
}

void Backend::synchronize_event(EventHandle event) {
  check_event(event, "synchronize_event");
  do_synchronize_event(event);
}

void Backend::wait_event(StreamId stream, EventHandle event) {
  check_stream(stream, "wait_event");
  check_event(event, "wait_event");
  do_wait_event(stream, event);
}

void Backend::release_event(EventHandle event) {
  check_event(event, "release_event");
  do_release_event(event);
}

// ---- operand checks ------------------------------------------------------------------------

namespace {

// Elements of one operand that a batched GEMM reads or writes: (batch-1)*stride + size.
std::int64_t gemm_extent(const Where& where, const char* role, std::int64_t batch,
                         std::int64_t stride, std::int64_t size) {
  if (batch == 0 || size == 0) return 0;
  std::int64_t span = mul_or_neg(batch - 1, stride);
  if (span < 0 || span > kInt64Max - size) {
    throw InvalidArgument(where + ": " + role + " spans more than 2^63 elements (batch " +
                          std::to_string(batch) + ", stride " + std::to_string(stride) +
                          "); valid: a batch and stride whose extent fits in int64");
  }
  return span + size;
}

}  // namespace

// ---- ops -----------------------------------------------------------------------------------

void Backend::gemm(StreamId stream, const GemmDesc& d, const Tensor& a, const Tensor& b,
                   const Tensor& c) {
  const Where w{name(), "gemm"};
  check_stream(stream, "gemm");
  check_operand(w, "A", a, device(), false);
  check_operand(w, "B", b, device(), false);
  check_operand(w, "C", c, device(), false);
  if (d.m < 0 || d.n < 0 || d.k < 0 || d.batch < 0) {
    throw InvalidArgument(w + ": m=" + std::to_string(d.m) + " n=" + std::to_string(d.n) +
                          " k=" + std::to_string(d.k) + " batch=" + std::to_string(d.batch) +
                          "; valid: all >= 0");
  }
  const std::int64_t lim = max_gemm_dim();
  if (d.m > lim || d.n > lim || d.k > lim || d.batch > lim) {
    throw InvalidArgument(w + ": m=" + std::to_string(d.m) + " n=" + std::to_string(d.n) +
                          " k=" + std::to_string(d.k) + " batch=" + std::to_string(d.batch) +
                          "; valid on this backend: each <= " + std::to_string(lim) +
                          " (split the GEMM)");
  }
  const std::int64_t size_a = mul_or_neg(d.m, d.k);
  const std::int64_t size_b = mul_or_neg(d.k, d.n);
  const std::int64_t size_c = mul_or_neg(d.m, d.n);
  if (size_a < 0 || size_b < 0 || size_c < 0) {
    throw InvalidArgument(w + ": a matrix of m=" + std::to_string(d.m) +
                          " n=" + std::to_string(d.n) + " k=" + std::to_string(d.k) +
                          " has more than 2^63 elements; valid: sizes whose products fit int64");
  }
  struct Operand {
    const char* role;
    const char* stride_name;
    const Tensor& t;
    std::int64_t stride;
    std::int64_t size;
  };
  Operand ops[3] = {{"A", "stride_a", a, d.stride_a, size_a},
                    {"B", "stride_b", b, d.stride_b, size_b},
                    {"C", "stride_c", c, d.stride_c, size_c}};
  Span spans[3];
  for (int i = 0; i < 3; ++i) {
    Operand& o = ops[i];
    if (o.stride == GemmDesc::kPacked) o.stride = o.size;
    if (o.stride < 0) {
      throw InvalidArgument(w + ": " + o.stride_name + "=" + std::to_string(o.stride) +
                            "; valid: >= 0, or GemmDesc::kPacked (-1) for the matrix size");
    }
    const std::int64_t need = gemm_extent(w, o.role, d.batch, o.stride, o.size);
    if (o.t.numel() < need) {
      throw InvalidArgument(
          w + ": " + o.role + " is " + tensor_desc(o.t) + " (" + std::to_string(o.t.numel()) +
          " elements) but m=" + std::to_string(d.m) + " n=" + std::to_string(d.n) +
          " k=" + std::to_string(d.k) + " trans_a=" + std::to_string(d.trans_a) +
          " trans_b=" + std::to_string(d.trans_b) + " batch=" + std::to_string(d.batch) + " " +
          o.stride_name + "=" + std::to_string(o.stride) + " need " + std::to_string(need) +
          "; valid: numel >= (batch-1)*stride + matrix size");
    }
    spans[i] = span_of(o.t, (d.m == 0 || d.n == 0) ? 0 : need);
  }
  if (d.batch > 1 && size_c > 0 && ops[2].stride < size_c) {
    throw InvalidArgument(w + ": stride_c=" + std::to_string(ops[2].stride) +
                          " < m*n=" + std::to_string(size_c) +
                          " makes the batch's outputs overlap; valid: stride_c >= m*n");
  }
  check_no_overlap(w, "C", spans[2], "A", spans[0]);
  check_no_overlap(w, "C", spans[2], "B", spans[1]);
  GemmDesc r = d;
  r.stride_a = ops[0].stride;
  r.stride_b = ops[1].stride;
  r.stride_c = ops[2].stride;
  do_gemm(stream, r, a, b, c);
}

void Backend::fill(StreamId stream, const Tensor& x, float value) {
  const Where w{name(), "fill"};
  check_stream(stream, "fill");
  check_operand(w, "x", x, device(), false);
  do_fill(stream, x, value);
}

void Backend::copy(StreamId stream, const Tensor& src, const Tensor& dst) {
  const Where w{name(), "copy"};
  check_stream(stream, "copy");
  check_operand(w, "src", src, device(), true);
  check_operand(w, "dst", dst, device(), true);
  if (src.dtype() != dst.dtype()) {
    throw InvalidArgument(w + ": src is " + tensor_desc(src) + " but dst is " + tensor_desc(dst) +
                          "; valid: the same dtype (use cast() to convert)");
  }
  check_same_numel(w, "src", src, "dst", dst);
  if (src.raw() == dst.raw() && src.device() == dst.device()) return;
  // Host and device addresses live in different spaces on a GPU; compare like with like.
  if (src.device() == dst.device()) {
    check_no_overlap(w, "dst", span_of(dst, dst.numel()), "src", span_of(src, src.numel()));
  }
  do_copy(stream, src, dst);
}

void Backend::cast(StreamId stream, const Tensor& src, const Tensor& dst) {
  const Where w{name(), "cast"};
  check_stream(stream, "cast");
  check_operand(w, "src", src, device(), false);
  check_operand(w, "dst", dst, device(), false);
  check_same_numel(w, "src", src, "dst", dst);
  if (src.raw() == dst.raw() && src.dtype() == dst.dtype()) return;
  check_no_overlap(w, "dst", span_of(dst, dst.numel()), "src", span_of(src, src.numel()));
  do_cast(stream, src, dst);
}

void Backend::axpy(StreamId stream, float a, const Tensor& x, const Tensor& y) {
  const Where w{name(), "axpy"};
  check_stream(stream, "axpy");
  check_operand(w, "x", x, device(), false);
  check_operand(w, "y", y, device(), false);
  check_same_numel(w, "x", x, "y", y);
  if (!(x.raw() == y.raw() && x.dtype() == y.dtype())) {
    check_no_overlap(w, "y", span_of(y, y.numel()), "x", span_of(x, x.numel()));
  }
  do_axpy(stream, a, x, y);
}

void Backend::scale(StreamId stream, float a, const Tensor& x) {
  const Where w{name(), "scale"};
  check_stream(stream, "scale");
  check_operand(w, "x", x, device(), false);
  do_scale(stream, a, x);
}

void Backend::sumsq(StreamId stream, const Tensor& x, const Tensor& out) {
  const Where w{name(), "sumsq"};
  check_stream(stream, "sumsq");
  check_operand(w, "x", x, device(), false);
  check_operand(w, "out", out, device(), false);
  if (out.dtype() != DType::kF32 || out.numel() != kSumSqSlots) {
    throw InvalidArgument(w + ": out is " + tensor_desc(out) +
                          "; valid: an f32 tensor of 2 elements (sum of squares, non-finite "
                          "count) on " +
                          device_name(device()));
  }
  check_no_overlap(w, "out", span_of(out, out.numel()), "x", span_of(x, x.numel()));
  do_sumsq(stream, x, out);
}

}  // namespace memfit
