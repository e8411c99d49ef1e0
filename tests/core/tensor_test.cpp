#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "memory/caching_allocator.h"
#include "memory/error.h"
#include "memory/host_provider.h"
#include "memory/null_provider.h"

namespace memfit {
namespace {

constexpr std::int64_t kBig = std::int64_t{1} << 40;

// The message of the InvalidArgument `fn` throws ("" and a test failure if none).
template <typename F>
std::string invalid_argument_message(F fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InvalidArgument thrown";
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- Shape ----------------------------------------------------------------------------------

TEST(ShapeTest, Basics) {
  const Shape scalar;
  EXPECT_EQ(scalar.ndim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.str(), "()");
  const Shape s{2, 3, 4};
  EXPECT_EQ(s.ndim(), 3);
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s[2], 4);
  EXPECT_EQ(s.numel(), 2 * 3 * 4);
  EXPECT_EQ(s.str(), "(2, 3, 4)");
  EXPECT_EQ(s, (Shape{2, 3, 4}));
  EXPECT_NE(s, (Shape{2, 3}));
  EXPECT_NE(s, (Shape{2, 3, 5}));
  EXPECT_NE(Shape{}, Shape{1});  // same numel, different rank
  EXPECT_EQ((Shape{5, 0, 7}).numel(), 0);
  const std::int64_t dims[] = {1, 2, 3, 4, 5, 6};
  const Shape six = Shape::of(dims, kMaxDims);
  EXPECT_EQ(six.numel(), 720);
  EXPECT_EQ(Shape::of(nullptr, 0), Shape{});
}

TEST(ShapeTest, IndexOutsideTheRankThrows) {
  const Shape s{2, 3, 4};
  const std::string msg = invalid_argument_message([&] { (void)s[3]; });
  EXPECT_TRUE(contains(msg, "dimension 3 of a 3-dimensional shape")) << msg;
  EXPECT_THROW((void)s[-1], InvalidArgument);
  EXPECT_THROW((void)s[kMaxDims], InvalidArgument);  // past the storage, not just the rank
  EXPECT_THROW((void)Shape{}[0], InvalidArgument);
  std::vector<float> buf(24);
  EXPECT_THROW((void)Tensor(buf.data(), s, DType::kF32, Device::kCpu).size(3), InvalidArgument);
}

TEST(ShapeTest, NegativeDimensionThrowsNamingIt) {
  const std::string msg = invalid_argument_message([] { Shape s{2, -3, 4}; });
  EXPECT_TRUE(contains(msg, "dimension 1")) << msg;
  EXPECT_TRUE(contains(msg, "-3")) << msg;
  EXPECT_TRUE(contains(msg, ">= 0")) << msg;
  const std::int64_t dims[] = {-1};
  EXPECT_THROW(Shape::of(dims, 1), InvalidArgument);
}

TEST(ShapeTest, TooManyDimensionsThrows) {
  const std::string msg = invalid_argument_message([] { Shape s{1, 1, 1, 1, 1, 1, 1}; });
  EXPECT_TRUE(contains(msg, std::to_string(kMaxDims))) << msg;
  const std::int64_t dims[kMaxDims + 1] = {1, 1, 1, 1, 1, 1, 1};
  EXPECT_THROW(Shape::of(dims, kMaxDims + 1), InvalidArgument);
  EXPECT_THROW(Shape::of(dims, -1), InvalidArgument);
  EXPECT_THROW(Shape::of(nullptr, 2), InvalidArgument);
}

TEST(ShapeTest, OverflowingNumelThrows) {
  EXPECT_THROW((Shape{kBig, kBig}), InvalidArgument);  // 2^80 wraps a 64-bit product
  // Fits 64 bits but not as bytes of f32 in an int64.
  EXPECT_THROW((Shape{std::int64_t{1} << 31, std::int64_t{1} << 31}), InvalidArgument);
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  EXPECT_THROW((Shape{max, 2}), InvalidArgument);
  EXPECT_NO_THROW((Shape{std::int64_t{1} << 30, std::int64_t{1} << 30}));
  // A zero anywhere makes the product 0, whatever the other dimensions are.
  EXPECT_EQ((Shape{kBig, 0, kBig}).numel(), 0);
  EXPECT_EQ((Shape{kBig, kBig, 0}).numel(), 0);  // even when the dimensions before it overflow
}

// ---- Tensor ---------------------------------------------------------------------------------

TEST(TensorTest, ViewAccessors) {
  std::vector<float> buf(24);
  const Tensor t(buf.data(), {2, 3, 4}, DType::kF32, Device::kCpu);
  EXPECT_EQ(t.raw(), buf.data());
  EXPECT_EQ(t.data<float>(), buf.data());
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.size(1), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(Tensor().defined());
  EXPECT_TRUE(Tensor(nullptr, {0, 3}, DType::kBF16, Device::kCpu).defined());
}

TEST(TensorTest, DataWithWrongElementSizeThrows) {
  std::vector<std::uint16_t> buf(6);
  const Tensor h(buf.data(), {2, 3}, DType::kF16, Device::kCpu);
  EXPECT_EQ(h.data<std::uint16_t>(), buf.data());
  const std::string msg = invalid_argument_message([&] { (void)h.data<float>(); });
  EXPECT_TRUE(contains(msg, "f16")) << msg;
  EXPECT_TRUE(contains(msg, "4-byte")) << msg;
  const Tensor f(buf.data(), {3}, DType::kF32, Device::kCpu);
  EXPECT_THROW((void)f.data<std::uint16_t>(), InvalidArgument);
  EXPECT_THROW((void)Tensor(buf.data(), {6}, DType::kBF16, Device::kCpu).data<std::int32_t>(),
               InvalidArgument);
}

TEST(TensorTest, ConstructorRejectsBadInput) {
  float x = 0;
  EXPECT_THROW(Tensor(nullptr, {2}, DType::kF32, Device::kCpu), InvalidArgument);
  EXPECT_THROW(Tensor(&x, {1}, static_cast<DType>(5), Device::kCpu), InvalidArgument);
  EXPECT_THROW(Tensor(&x, {1}, DType::kF32, static_cast<Device>(9)), InvalidArgument);
  // A pointer off its element size: typed access through it would be undefined.
  alignas(4) unsigned char bytes[16] = {};
  const std::string msg =
      invalid_argument_message([&] { (void)Tensor(bytes + 2, {2}, DType::kF32, Device::kCpu); });
  EXPECT_TRUE(contains(msg, "not aligned")) << msg;
  EXPECT_TRUE(contains(msg, "f32 element size (4 bytes)")) << msg;
  EXPECT_THROW(Tensor(bytes + 1, {2}, DType::kBF16, Device::kCpu), InvalidArgument);
  EXPECT_NO_THROW(Tensor(bytes + 2, {2}, DType::kBF16, Device::kCpu));
  EXPECT_THROW(Tensor(reinterpret_cast<void*>(0x7e0000000001), {2}, DType::kF16, Device::kMeta),
               InvalidArgument);
  EXPECT_STREQ(device_name(Device::kCpu), "cpu");
  EXPECT_STREQ(device_name(Device::kCuda), "cuda");
  EXPECT_STREQ(device_name(Device::kMeta), "meta");
  EXPECT_STREQ(device_name(static_cast<Device>(9)), "invalid");
}

TEST(TensorTest, ReshapeKeepsMemory) {
  std::vector<float> buf(24);
  const Tensor t(buf.data(), {2, 3, 4}, DType::kF32, Device::kCpu);
  const Tensor r = t.reshape({6, 4});
  EXPECT_EQ(r.raw(), t.raw());
  EXPECT_EQ(r.shape(), (Shape{6, 4}));
  EXPECT_EQ(r.dtype(), DType::kF32);
  EXPECT_EQ(t.reshape({24}).numel(), 24);
  const std::string msg = invalid_argument_message([&] { (void)t.reshape({5, 5}); });
  EXPECT_TRUE(contains(msg, "(2, 3, 4)")) << msg;
  EXPECT_TRUE(contains(msg, "(5, 5)")) << msg;
  EXPECT_THROW((void)t.reshape({25}), InvalidArgument);
}

TEST(TensorTest, Slice0OffsetsRows) {
  std::vector<std::uint16_t> buf(5 * 3 * 2);
  const Tensor t(buf.data(), {5, 3, 2}, DType::kBF16, Device::kCpu);
  const Tensor s = t.slice0(1, 4);
  EXPECT_EQ(s.shape(), (Shape{3, 3, 2}));
  EXPECT_EQ(s.data<std::uint16_t>(), buf.data() + 6);  // one row = 3 * 2 elements
  EXPECT_EQ(s.dtype(), DType::kBF16);
  const Tensor e = t.slice0(5, 5);
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.data<std::uint16_t>(), buf.data() + 30);
  EXPECT_EQ(t.slice0(0, 5).shape(), t.shape());
  // Slices of slices stay consistent.
  EXPECT_EQ(s.slice0(2, 3).raw(), t.slice0(3, 4).raw());

  for (auto [b, e2] : {std::pair<std::int64_t, std::int64_t>{-1, 2}, {3, 2}, {0, 6}, {6, 6}}) {
    const std::string msg =
        invalid_argument_message([&, b = b, e2 = e2] { (void)t.slice0(b, e2); });
    EXPECT_TRUE(contains(msg, "(5, 3, 2)")) << msg;
    EXPECT_TRUE(contains(msg, "<= 5")) << msg;
  }
  float x = 0;
  EXPECT_THROW((void)Tensor(&x, {}, DType::kF32, Device::kCpu).slice0(0, 1), InvalidArgument);
  // Dimension 0 of size 0: the only slice is [0, 0).
  const Tensor z(nullptr, {0, 4}, DType::kF32, Device::kCpu);
  EXPECT_EQ(z.slice0(0, 0).numel(), 0);
  EXPECT_THROW((void)z.slice0(0, 1), InvalidArgument);
}

// ---- OwnedTensor ----------------------------------------------------------------------------

std::int64_t category_current(const CachingAllocator& a, Category c) {
  return a.stats().category_bytes[category_index(c)].current;
}

TEST(OwnedTensorTest, EmptyAllocatesWithCategoryAndTag) {
  HostProvider host;
  CachingAllocator alloc(host);
  {
    OwnedTensor t = OwnedTensor::empty(alloc, {4, 100}, DType::kF32, Device::kCpu,
                                       Category::kActivation, kDefaultStream, "fc1.out");
    ASSERT_NE(t.view().raw(), nullptr);
    EXPECT_EQ(t.view().shape(), (Shape{4, 100}));
    EXPECT_EQ(t.view().device(), Device::kCpu);
    EXPECT_EQ(t.block().size(), 1600u);
    EXPECT_EQ(t.block().data(), t.view().raw());
    const AllocatorStats s = alloc.stats();
    EXPECT_EQ(s.requested_bytes[kStatAll].current, 1600);
    EXPECT_EQ(category_current(alloc, Category::kActivation),
              static_cast<std::int64_t>(alloc.round_size(1600)));
    EXPECT_EQ(category_current(alloc, Category::kParameter), 0);
    // The memory is usable through the typed view.
    float* p = t.view().data<float>();
    for (int i = 0; i < 400; ++i) p[i] = static_cast<float>(i);
    EXPECT_EQ(p[399], 399.0f);

    bool tagged = false;
    for (const SegmentInfo& seg : alloc.snapshot().segments) {
      for (const BlockInfo& b : seg.blocks) {
        if (b.address == reinterpret_cast<std::uintptr_t>(p)) {
          tagged = b.tag == "fc1.out" && b.category == Category::kActivation;
        }
      }
    }
    EXPECT_TRUE(tagged);
  }
  EXPECT_EQ(category_current(alloc, Category::kActivation), 0);  // destruction frees
  EXPECT_EQ(alloc.stats().allocation[kStatAll].current, 0);
}

TEST(OwnedTensorTest, SizesFollowTheDType) {
  HostProvider host;
  CachingAllocator alloc(host);
  OwnedTensor h =
      OwnedTensor::empty(alloc, {3, 5}, DType::kBF16, Device::kCpu, Category::kGradient);
  EXPECT_EQ(h.block().size(), 30u);
  EXPECT_EQ(h.view().nbytes(), 30u);
  EXPECT_EQ(alloc.stats().requested_bytes[kStatAll].current, 30);
  EXPECT_THROW((void)h.view().data<float>(), InvalidArgument);
}

TEST(OwnedTensorTest, ResetReleasesAndUndefines) {
  HostProvider host;
  CachingAllocator alloc(host);
  OwnedTensor t =
      OwnedTensor::empty(alloc, {1024}, DType::kF32, Device::kCpu, Category::kOptimizerState);
  EXPECT_GT(category_current(alloc, Category::kOptimizerState), 0);
  t.reset();
  EXPECT_EQ(category_current(alloc, Category::kOptimizerState), 0);
  EXPECT_FALSE(t.view().defined());
  EXPECT_FALSE(t.block());
  t.reset();  // twice is fine
  EXPECT_EQ(alloc.stats().allocation[kStatAll].current, 0);
}

TEST(OwnedTensorTest, MoveTransfersOwnership) {
  HostProvider host;
  CachingAllocator alloc(host);
  OwnedTensor a = OwnedTensor::empty(alloc, {64}, DType::kF16, Device::kCpu, Category::kInput);
  void* p = a.view().raw();
  OwnedTensor b = std::move(a);
  EXPECT_EQ(b.view().raw(), p);
  EXPECT_EQ(b.block().data(), p);
  EXPECT_EQ(alloc.stats().allocation[kStatAll].current, 1);
  b = OwnedTensor();
  EXPECT_EQ(alloc.stats().allocation[kStatAll].current, 0);
}

TEST(OwnedTensorTest, ZeroSizeGetsNoBlock) {
  HostProvider host;
  CachingAllocator alloc(host);
  OwnedTensor t =
      OwnedTensor::empty(alloc, {0, 128}, DType::kF32, Device::kCpu, Category::kActivation);
  EXPECT_EQ(t.view().raw(), nullptr);
  EXPECT_TRUE(t.view().defined());
  EXPECT_EQ(t.view().numel(), 0);
  EXPECT_FALSE(t.block());
  EXPECT_EQ(alloc.stats().allocation[kStatAll].allocated, 0);
}

TEST(OwnedTensorTest, BadRequestsThrowBeforeAllocating) {
  HostProvider host;
  CachingAllocator alloc(host);
  EXPECT_THROW(
      OwnedTensor::empty(alloc, {2}, DType::kF32, static_cast<Device>(7), Category::kActivation),
      InvalidArgument);
  EXPECT_THROW(
      OwnedTensor::empty(alloc, {2}, static_cast<DType>(7), Device::kCpu, Category::kActivation),
      InvalidArgument);
  // More than any provider can give: the allocator's own InvalidArgument.
  EXPECT_THROW(OwnedTensor::empty(alloc, {std::int64_t{1} << 50}, DType::kF32, Device::kCpu,
                                  Category::kActivation),
               InvalidArgument);
  EXPECT_EQ(alloc.stats().allocation[kStatAll].allocated, 0);
}

TEST(OwnedTensorTest, DeviceMustMatchTheProvidersMemory) {
  HostProvider host;
  NullProvider null;
  CachingAllocator host_alloc(host), null_alloc(null);
  // Null addresses on the CPU would be dereferenced; real memory for meta is what a dry run
  // must not allocate; host memory is not CUDA device memory.
  const std::string msg = invalid_argument_message([&] {
    (void)OwnedTensor::empty(null_alloc, {4}, DType::kF32, Device::kCpu, Category::kActivation);
  });
  EXPECT_TRUE(contains(msg, "cpu tensor")) << msg;
  EXPECT_TRUE(contains(msg, "'null' provider")) << msg;
  EXPECT_THROW(
      OwnedTensor::empty(host_alloc, {4}, DType::kF32, Device::kMeta, Category::kActivation),
      InvalidArgument);
  EXPECT_THROW(
      OwnedTensor::empty(host_alloc, {4}, DType::kF32, Device::kCuda, Category::kActivation),
      InvalidArgument);
  EXPECT_EQ(host_alloc.stats().allocation[kStatAll].allocated, 0);
  EXPECT_EQ(null_alloc.stats().allocation[kStatAll].allocated, 0);
}

TEST(OwnedTensorTest, MetaTensorsComeFromANullProvider) {
  NullProvider null;
  CachingAllocator alloc(null);
  OwnedTensor t = OwnedTensor::empty(alloc, {1024, 1024, 64}, DType::kBF16, Device::kMeta,
                                     Category::kActivation);
  EXPECT_NE(t.view().raw(), nullptr);  // an address, never dereferenced
  EXPECT_EQ(t.view().device(), Device::kMeta);
  EXPECT_EQ(category_current(alloc, Category::kActivation),
            static_cast<std::int64_t>(alloc.round_size(std::size_t{1} << 27)));
  EXPECT_EQ(t.view().slice0(512, 1024).raw(),
            static_cast<char*>(t.view().raw()) + (std::size_t{1} << 26));
}

}  // namespace
}  // namespace memfit
