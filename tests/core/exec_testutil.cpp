#include "tests/core/exec_testutil.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/text_dataset.h"

namespace memfit::testing {

Schedule random_schedule(int n, std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 2);
  const Keep keeps[] = {Keep::kAll, Keep::kInput, Keep::kNothing};
  while (true) {
    std::vector<ScheduleOp> ops;
    std::vector<char> held(static_cast<std::size_t>(n) + 1, 0);
    std::vector<char> saved(static_cast<std::size_t>(n), 0);
    held[0] = 1;
    const auto fwd = [&](int i, Keep k, bool recompute) {
      const auto u = static_cast<std::size_t>(i);
      ops.push_back(ScheduleOp::forward(i, k, recompute));
      held[u + 1] = 1;
      if (k == Keep::kAll) saved[u] = 1;
      if (k != Keep::kInput) held[u] = 0;
    };
    for (int i = 0; i < n; ++i) fwd(i, keeps[pick(rng)], false);
    bool ok = true;
    for (int i = n - 1; i >= 0 && ok; --i) {
      const auto u = static_cast<std::size_t>(i);
      if (!saved[u]) {
        // The nearest held input with no block holding saved state on the way (a layer
        // refuses a forward while it holds saved state).
        int j = i;
        while (j >= 0 && !held[static_cast<std::size_t>(j)]) --j;
        bool blocked = j < 0;
        for (int l = std::max(j, 0); l < i; ++l)
          blocked = blocked || saved[static_cast<std::size_t>(l)];
        if (blocked) {
          ok = false;  // nothing to recompute from: draw again
          break;
        }
        for (int l = j; l < i; ++l) fwd(l, keeps[pick(rng)], true);
        fwd(i, Keep::kAll, true);
      }
      ops.push_back(ScheduleOp::backward(i));
      saved[u] = 0;
      held[u] = 0;
      held[u + 1] = 0;
    }
    if (ok) return Schedule("random", std::move(ops));
  }
}

Rig::Rig(bool is_meta, AllocatorConfig conf, MemoryProvider* provider, CpuBackendOptions cpu)
    : meta(is_meta) {
  if (meta) {
    be = std::make_unique<MetaBackend>();
    if (!provider) own_provider = std::make_unique<NullProvider>();
  } else {
    be = std::make_unique<CpuBackend>(cpu);
    if (!provider) own_provider = std::make_unique<HostProvider>();
  }
  alloc = std::make_unique<CachingAllocator>(provider ? *provider : *own_provider, conf,
                                             &be->stream_sync());
}

Rig::~Rig() = default;

namespace {

Block index_block(Rig& rig, std::int64_t n, const char* tag) {
  return rig.alloc->allocate(static_cast<std::size_t>(n) * sizeof(std::int32_t), Category::kInput,
                             kDefaultStream, tag);
}

}  // namespace

Batch::Batch(Rig& rig, std::int64_t b, std::int64_t t, std::int64_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int32_t> id(0, static_cast<std::int32_t>(vocab - 1));
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(b * t));
  std::vector<std::int32_t> targets(tokens.size());
  for (auto& v : tokens) v = id(rng);
  for (auto& v : targets) v = id(rng);
  *this = Batch(rig, tokens, targets, b, t);
}

Batch::Batch(Rig& rig, const std::vector<std::int32_t>& tokens,
             const std::vector<std::int32_t>& targets, std::int64_t b, std::int64_t t) {
  tok = index_block(rig, b * t, "tokens");
  tgt = index_block(rig, b * t, "targets");
  if (!rig.meta) {
    std::memcpy(tok.data(), tokens.data(), tokens.size() * sizeof(std::int32_t));
    std::memcpy(tgt.data(), targets.data(), targets.size() * sizeof(std::int32_t));
  }
  const Device d = rig.be->device();
  mb.tokens = IndexTensor{tok.as<std::int32_t>(), Shape{b, t}, d};
  mb.targets = IndexTensor{tgt.as<std::int32_t>(), Shape{b, t}, d};
}

ModelSpec tiny_gpt_spec(std::int64_t layers) {
  ModelSpec s;
  s.name = "tiny-gpt";
  s.vocab = 256;
  s.seq_len = 32;
  s.layers = layers;
  s.hidden = 32;
  s.heads = 4;
  s.mlp_ratio = 4;
  s.tied_head = true;
  return s;
}

ModelSpec small_gpt(std::int64_t layers) {
  ModelSpec s = tiny_gpt_spec(layers);
  s.name = "small-gpt";
  s.vocab = 512;
  s.seq_len = 64;
  s.hidden = 64;
  return s;
}

const TextDataset& test_corpus() {
  static const TextDataset d(std::string(MEMFIT_TEST_SOURCE_DIR) + "/data/corpus.txt");
  return d;
}

std::vector<float> to_host(LayerContext& ctx, const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  ctx.backend.synchronize(ctx.stream);
  convert(t.raw(), t.dtype(), out.data(), DType::kF32, static_cast<std::size_t>(t.numel()));
  return out;
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.raw());
  return std::vector<unsigned char>(p, p + t.nbytes());
}

std::int64_t activation_bytes_now(const CachingAllocator& alloc) {
  const AllocatorStats s = alloc.stats();
  return s.category_bytes[static_cast<int>(Category::kActivation)].current +
         s.category_bytes[static_cast<int>(Category::kTemporary)].current;
}

}  // namespace memfit::testing
