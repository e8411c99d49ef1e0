// Policy matrix: memfit's Trainer on GPT {vocab 256, seq_len 128, layers 6, hidden 256, heads 8,
// mlp_ratio 4, tied}, global batch 16, on the CPU backend (worker streams on, a CachingAllocator
// over HostProvider that also holds the GEMM scratch), for each dtype (f32, bf16, f16) x
// checkpoint (none, all, every:2) x optimizer offload (off, on): the median step time after
// warm-up and the allocator's peaks by category. Beside each row without offload, PyTorch's
// figures at the same settings, measured in the same run by bench/torch_policy_matrix.py (run
// with /usr/bin/python3 before memfit's rows, so the two never share the cores; skipped with a
// message when python3 or torch is missing). Its header documents how CPU PyTorch's memory is
// measured: parameter, gradient and optimizer bytes from the tensors, activations as the peak
// bytes of the unique storages saved for backward. The like-for-like memory figure is therefore
// "sum4" = the peaks of parameter + gradient + optimizer_state + activation on both sides;
// memfit's peak_allocated (every category, temporaries and GEMM workspace included) and
// peak_reserved are printed beside it. PyTorch's bf16 rows time one step without warm-up: on a
// CPU without AVX512-BF16, torch 1.13's bf16 GEMM is a scalar fallback (~30x slower than f32;
// `--torch-bf16 off` skips them). Each PyTorch configuration runs just before memfit's rows of
// the same settings, so a shared machine's load hits both alike.
//
// Column "ofl": optimizer offload ("o+g": with gradient offload too, "o+g+w": and weight
// offload, "all": and activation offload).
// Targets (the training-runtime issue), each printed PASS or FAIL:
//  1. equal settings (no offload; f32 and bf16, PyTorch has no CPU f16 autocast): memfit's
//     step time <= PyTorch's and memfit's sum4 <= PyTorch's;
//  2. checkpointing (all, every:2) against none at the same dtype and offload: the activation
//     peak down >= 60%, for <= 1.25x step time with every:2 (the usual quote is -60% memory for
//     +25% time) and <= 1.35x with all, which recomputes every block (the CPU speed issue's
//     targets);
//  3. all policies together (bf16 + checkpoint all + optimizer, gradient and weight offload +
//     micro-batch 1, accumulation 16; the rows with the optimizer's offload alone and with the
//     gradients' are printed too) at global batch 16: peak >= 20x below plain f32 (checkpoint
//     none, no offload), judged on peak_allocated and on peak_reserved separately. Beside it,
//     PyTorch's best stock combination on the same config (bf16 autocast + checkpoint all +
//     1 x 16 accumulation, the script's --micro-batch 1) against its plain f32, on sum4.
//
//   ./build/bench/policy_matrix_bench                       # the full matrix (a few minutes)
//   ./build/bench/policy_matrix_bench --quick               # f32/bf16 x none/all x offload,
//                                                           # 1 timed step, PyTorch f32 only
//   ./build/bench/policy_matrix_bench --dtypes f32 --checkpoints none,every:2 --offload off
//   options: --steps N --warmup W --threads N --no-torch --torch-script PATH --torch-bf16 on|off
//            --no-all-policies --attention flash|materialized (the model's attention; flash is
//            the default, materialized reproduces the figures from before flash attention)
//            --alloc-conf TEXT (MEMFIT_ALLOC_CONF syntax, e.g. expandable_segments:True;
//            default: that variable, else the allocator's defaults)
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/model_spec.h"
#include "memory/alloc_conf.h"
#include "memory/category.h"
#include "policies/cpu_rates.h"
#include "policies/run_setup.h"

namespace memfit {
namespace {

constexpr std::int64_t kBatch = 16;
constexpr double kMiB = 1024.0 * 1024.0;

ModelSpec bench_spec() {
  ModelSpec s;
  s.kind = ModelSpec::Kind::kGpt;
  s.name = "policy-matrix";
  s.vocab = 256;
  s.seq_len = 128;
  s.layers = 6;
  s.hidden = 256;
  s.heads = 8;
  s.mlp_ratio = 4;
  s.tied_head = true;
  s.validate();
  return s;
}

struct Args {
  std::vector<std::string> dtypes = {"f32", "bf16", "f16"};
  std::vector<std::string> checkpoints = {"none", "all", "every:2"};
  std::vector<bool> offloads = {false, true};
  int steps = 2;
  int warmup = 1;
  bool quick = false;
  int threads = 0;
  bool torch = true;
  bool torch_bf16 = true;
  bool all_policies = true;
  const char* torch_script = nullptr;
  AttentionImpl attention = AttentionImpl::kFlash;
  AllocatorConfig alloc;  // --alloc-conf (default: MEMFIT_ALLOC_CONF, else the defaults)
  std::shared_ptr<const CpuRates> rates;  // this machine's (policies/cpu_rates.h), cached
};

struct Figures {  // one configuration, either side
  bool ok = false;
  std::string error;
  double seconds = 0;  // median step time
  double predicted = 0;  // memfit: CpuRates::step_seconds, the planner's prediction
  double loss = 0;
  std::size_t by[kCategoryCount] = {};
  std::size_t allocated = 0, reserved = 0;  // memfit only
  std::size_t sum4() const {
    return by[category_index(Category::kParameter)] + by[category_index(Category::kGradient)] +
           by[category_index(Category::kOptimizerState)] +
           by[category_index(Category::kActivation)];
  }
  std::size_t act() const { return by[category_index(Category::kActivation)]; }
};

struct Config {
  std::string dtype, checkpoint;
  bool offload = false;
  std::int64_t micro_batch = 0;
  bool grads = false;    // gradient offload too (the all-policies rows)
  bool weights = false;  // weight offload too
  bool acts = false;     // activation offload too
  std::string key() const {
    return dtype + "/" + checkpoint + "/" + (offload ? "on" : "off") + (grads ? "+grads" : "") +
           (weights ? "+weights" : "") + (acts ? "+acts" : "") +
           (micro_batch ? "/mb" + std::to_string(micro_batch) : "");
  }
  const char* offload_label() const {
    return acts ? "all" : weights ? "o+g+w" : grads ? "o+g" : offload ? "on" : "off";
  }
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Batch make_batch(const ModelSpec& spec) {
  Batch b;
  b.batch = kBatch;
  b.seq_len = spec.seq_len;
  std::mt19937 gen(1234);
  std::uniform_int_distribution<int> tok(0, static_cast<int>(spec.vocab) - 1);
  b.tokens.resize(static_cast<std::size_t>(kBatch * spec.seq_len));
  b.targets.resize(b.tokens.size());
  for (auto& t : b.tokens) t = tok(gen);
  for (auto& t : b.targets) t = tok(gen);
  return b;
}

// One configuration, from a fresh RunSetup (backend, allocator with the GEMM scratch inside it,
// model, trainer: what `memfit train` builds; a model's dtype is fixed).
Figures run_memfit(const Config& c, const Args& a, const ModelSpec& spec, const Batch& batch) {
  Figures f;
  try {
    RunSpec rs;
    rs.model = spec;
    rs.trainer.policy.dtype = parse_dtype(c.dtype);
    rs.trainer.policy.checkpoint =
        Checkpointing::parse(c.checkpoint, static_cast<int>(spec.layers));
    rs.trainer.policy.offload.optimizer = c.offload;
    rs.trainer.policy.offload.gradients = c.grads;
    rs.trainer.policy.offload.weights = c.weights;
    rs.trainer.policy.offload.activations = c.acts;
    rs.trainer.policy.micro_batch = c.micro_batch;
    rs.trainer.adamw.lr = 1e-3;
    rs.trainer.adamw.weight_decay = 0.01;
    rs.batch = batch.batch;
    rs.seq_len = batch.seq_len;
    rs.alloc = a.alloc;
    if (a.rates) f.predicted = a.rates->step_seconds(rs);
    RunSetup run(rs);
    std::vector<double> secs;
    for (int k = 0; k < a.warmup + a.steps; ++k) {
      const StepResult r = run.step(batch);
      f.loss = r.loss;
      if (k < a.warmup) continue;
      secs.push_back(r.seconds);
      f.allocated = std::max(f.allocated, r.peaks.allocated);
      f.reserved = std::max(f.reserved, r.peaks.reserved);
      for (std::size_t i = 0; i < kCategoryCount; ++i) {
        f.by[i] = std::max(f.by[i], r.peaks.category_peaks[i]);  // each category's own peak
      }
    }
    f.seconds = median(secs);
    f.ok = true;
  } catch (const std::exception& e) {
    f.error = e.what();
  }
  return f;
}

std::string find_script(const char* given) {
  std::vector<std::string> tries;
  if (given) tries.push_back(given);
  if (const char* dir = std::getenv("MEMFIT_SOURCE_DIR")) {
    tries.push_back(std::string(dir) + "/bench/torch_policy_matrix.py");
  }
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    std::string e(exe, static_cast<std::size_t>(len));
    e = e.substr(0, e.find_last_of('/'));  // build/bench -> the source tree two levels up
    tries.push_back(e + "/../../bench/torch_policy_matrix.py");
  }
  tries.push_back("bench/torch_policy_matrix.py");
  for (const std::string& t : tries) {
    if (access(t.c_str(), R_OK) == 0) return t;
  }
  return "";
}

// Where PyTorch comes from; "" (after printing why) when the anchor is skipped.
std::string torch_script(const Args& a) {
  if (!a.torch) return "";
  if (access("/usr/bin/python3", X_OK) != 0) {
    std::printf("PyTorch anchor skipped: /usr/bin/python3 not found\n");
    return "";
  }
  const std::string script = find_script(a.torch_script);
  if (script.empty()) {
    std::printf(
        "PyTorch anchor skipped: bench/torch_policy_matrix.py not found "
        "(pass --torch-script)\n");
  }
  return script;
}

// PyTorch at one dtype and checkpoint, run just before memfit's rows of the same settings so
// both see the same machine load. An n/a row carries its reason in `error`; nullopt when the
// script gave nothing (a message says why).
std::optional<Figures> run_torch(const std::string& script, const Args& a, int threads,
                                 const std::string& dtype, const std::string& ckpt,
                                 std::string* version, std::int64_t micro_batch = 0) {
  if (script.empty() || (dtype == "bf16" && !a.torch_bf16)) return std::nullopt;
  const std::string cmd = "/usr/bin/python3 '" + script + "' --threads " + std::to_string(threads) +
                          " --dtypes " + dtype + " --checkpoints " + ckpt + " --steps " +
                          std::to_string(a.steps) + " --warmup " + std::to_string(a.warmup) +
                          " --micro-batch " + std::to_string(micro_batch) +
                          " --bf16-steps 1 --bf16-warmup 0 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    std::printf("PyTorch anchor skipped: popen failed\n");
    return std::nullopt;
  }
  std::optional<Figures> out;
  std::string log;
  char buf[1 << 14];
  while (std::fgets(buf, sizeof buf, p)) {
    if (buf[0] != '{') {
      log += buf;
      continue;
    }
    try {
      const auto j = nlohmann::json::parse(buf);
      Figures f;
      *version = j.value("torch", "");
      if (j.at("status") == "ok") {
        f.ok = true;
        f.seconds = j.at("step_seconds_median").get<double>();
        f.loss = j.at("loss").get<double>();
        for (const char* cat : {"parameter", "gradient", "optimizer_state", "activation"}) {
          f.by[category_index(parse_category(cat))] = j.at("bytes").at(cat).get<std::size_t>();
        }
      } else {
        f.error = j.value("reason", "n/a");
      }
      out = f;
    } catch (const std::exception& e) {
      std::printf("PyTorch output line not understood (%s): %s", e.what(), buf);
    }
  }
  const int rc = pclose(p);
  if (rc != 0 || !out) {
    if (log.size() > 2000) log = "..." + log.substr(log.size() - 2000);
    std::printf("PyTorch anchor (%s, %s) skipped: `%s` exited with %d:\n%s\n", dtype.c_str(),
                ckpt.c_str(), cmd.c_str(), rc, log.c_str());
    return std::nullopt;
  }
  return out;
}

const char* verdict(bool ok) { return ok ? "PASS" : "FAIL"; }

double mib(std::size_t b) { return static_cast<double>(b) / kMiB; }

void print_row(const Config& c, const Figures& m, const Figures* t) {
  const auto cat = [&](Category k) { return mib(m.by[category_index(k)]); };
  if (!m.ok) {
    std::printf("%-5s %-8s %-5s  error: %s\n", c.dtype.c_str(), c.checkpoint.c_str(),
                c.offload_label(), m.error.c_str());
    return;
  }
  std::printf("%-5s %-8s %-5s %7.3f %7.3f %5.2f %6.3f | %6.1f %6.1f %6.1f %7.1f %6.1f | %7.1f %7.1f %7.1f",
              c.dtype.c_str(), c.checkpoint.c_str(), c.offload_label(), m.seconds, m.predicted,
              m.predicted > 0 ? m.seconds / m.predicted : 0.0, m.loss,
              cat(Category::kParameter), cat(Category::kGradient), cat(Category::kOptimizerState),
              cat(Category::kActivation),
              cat(Category::kTemporary) + cat(Category::kWorkspace) + cat(Category::kInput) +
                  cat(Category::kUnknown),
              mib(m.sum4()), mib(m.allocated), mib(m.reserved));
  if (t == nullptr) {
    std::printf(" |\n");
  } else if (!t->ok) {
    std::printf(" | torch n/a: %s\n", t->error.c_str());
  } else {
    std::printf(" | %7.3f %7.1f %7.1f | %5.2fx %6.3fx %s %s\n", t->seconds, mib(t->act()),
                mib(t->sum4()), m.seconds / t->seconds,
                static_cast<double>(m.sum4()) / static_cast<double>(t->sum4()),
                verdict(m.seconds <= t->seconds), verdict(m.sum4() <= t->sum4()));
  }
}

}  // namespace
}  // namespace memfit

int main(int argc, char** argv) {
  using namespace memfit;
  Args a;
  const auto usage = [&] {
    std::fprintf(stderr,
                 "usage: %s [--quick] [--dtypes f32,bf16,f16] [--checkpoints none,all,every:2] "
                 "[--offload off,on] [--steps N] [--warmup W] [--threads N] [--no-torch] "
                 "[--torch-script PATH] [--torch-bf16 on|off] [--no-all-policies] "
                 "[--attention flash|materialized] [--alloc-conf TEXT]\n",
                 argv[0]);
    return 2;
  };
  std::string alloc_conf;
  if (const char* env = std::getenv("MEMFIT_ALLOC_CONF")) alloc_conf = env;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const bool has = i + 1 < argc;
    if (s == "--quick") {
      a.quick = true;
      a.dtypes = {"f32", "bf16"};
      a.checkpoints = {"none", "all"};
      a.steps = 1;
      a.torch_bf16 = false;  // torch's CPU bf16 GEMM is a scalar fallback without AVX512-BF16
    } else if (s == "--dtypes" && has) {
      a.dtypes = split(argv[++i]);
    } else if (s == "--checkpoints" && has) {
      a.checkpoints = split(argv[++i]);
    } else if (s == "--offload" && has) {
      a.offloads.clear();
      for (const auto& o : split(argv[++i])) {
        if (o != "on" && o != "off") return usage();
        a.offloads.push_back(o == "on");
      }
    } else if (s == "--steps" && has) {
      a.steps = std::max(1, std::atoi(argv[++i]));
    } else if (s == "--warmup" && has) {
      a.warmup = std::max(0, std::atoi(argv[++i]));
    } else if (s == "--threads" && has) {
      a.threads = std::max(1, std::atoi(argv[++i]));
    } else if (s == "--no-torch") {
      a.torch = false;
    } else if (s == "--torch-script" && has) {
      a.torch_script = argv[++i];
    } else if (s == "--torch-bf16" && has) {
      a.torch_bf16 = std::string(argv[++i]) != "off";
    } else if (s == "--no-all-policies") {
      a.all_policies = false;
    } else if (s == "--attention" && has) {
      if (!parse_attention_impl(argv[++i], &a.attention)) return usage();
    } else if (s == "--alloc-conf" && has) {
      alloc_conf = argv[++i];
    } else {
      return usage();
    }
  }
  for (const auto& d : a.dtypes) {
    if (d != "f32" && d != "bf16" && d != "f16") return usage();
  }
  try {
    a.alloc = parse_alloc_conf(alloc_conf);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (!alloc_conf.empty()) std::printf("allocator: %s\n", a.alloc.to_string().c_str());
  // OpenMP reads this at its first parallel region, which has not run yet: memfit's kernels and
  // PyTorch (passed --threads) then use the same number of threads.
  const int threads = a.threads > 0
                          ? a.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);

  ModelSpec spec = bench_spec();
  spec.attention = a.attention;
  const Batch batch = make_batch(spec);
  std::printf(
      "policy matrix: GPT vocab %lld, seq_len %lld, layers %lld, hidden %lld, heads %lld, "
      "mlp_ratio %lld, tied, %s attention; batch %lld; %d threads; median of %d steps after %d "
      "warm-up\n",
      static_cast<long long>(spec.vocab), static_cast<long long>(spec.seq_len),
      static_cast<long long>(spec.layers), static_cast<long long>(spec.hidden),
      static_cast<long long>(spec.heads), static_cast<long long>(spec.mlp_ratio),
      attention_impl_name(spec.attention), static_cast<long long>(kBatch), threads, a.steps,
      a.warmup);
  if (a.torch && !a.torch_bf16) std::printf("PyTorch bf16 rows skipped (--torch-bf16 off)\n");
  const std::string script = torch_script(a);
  {
    std::string note;
    a.rates = CpuRates::cached(&note);
    std::printf("cpu rates: %s\n", note.c_str());
  }

  std::vector<Config> configs;
  for (const auto& d : a.dtypes) {
    for (const auto& c : a.checkpoints) {
      for (bool o : a.offloads) configs.push_back({d, c, o, 0});
    }
  }
  std::map<std::string, Figures> torch;  // "dtype/checkpoint"
  std::string version;
  std::printf(
      "\nMiB; step_s median; pred_s: the planner's prediction (this machine's measured rates), "
      "m/p = step_s / pred_s;\nother = temporary + workspace + input; sum4 = param + grad + "
      "optim + activ (peaks);\ntorch_s / t_act / t_sum4: PyTorch at the same dtype and "
      "checkpoint (no offload); ratios memfit / PyTorch\n");
  std::printf(
      "%-5s %-8s %-5s %7s %7s %5s %6s | %6s %6s %6s %7s %6s | %7s %7s %7s | %7s %7s %7s | %6s "
      "%7s %s\n",
      "dtype", "ckpt", "ofl", "step_s", "pred_s", "m/p", "loss", "param", "grad", "optim", "activ", "other", "sum4",
      "alloc", "reserv", "torch_s", "t_act", "t_sum4", "time", "sum4", "time,mem <= torch");
  std::map<std::string, Figures> res;
  for (const Config& c : configs) {
    const std::string tk = c.dtype + "/" + c.checkpoint;
    if (!torch.count(tk)) {
      if (auto t = run_torch(script, a, threads, c.dtype, c.checkpoint, &version)) torch[tk] = *t;
    }
    res[c.key()] = run_memfit(c, a, spec, batch);
    const auto t = torch.find(c.dtype + "/" + c.checkpoint);
    print_row(c, res[c.key()], (!c.offload && t != torch.end()) ? &t->second : nullptr);
    std::fflush(stdout);
  }
  const Config ap{"bf16", "all", true, 1, true, true, true};
  const Config ap_ogw{"bf16", "all", true, 1, true, true};
  const Config ap_og{"bf16", "all", true, 1, true, false};
  const Config ap_opt{"bf16", "all", true, 1, false, false};
  std::optional<Figures> torch_plain, torch_best;  // the all-policies anchor, on sum4
  if (a.all_policies) {
    std::printf(
        "all policies (micro-batch 1 x 16 accumulated; optimizer offload, + gradients, "
        "+ weights, + activations):\n");
    // 16 micro-batches make this row the slowest: one timed step (memory is its target).
    Args once = a;
    once.steps = 1;
    once.warmup = a.quick ? 0 : std::min(a.warmup, 1);
    if (const auto t = torch.find("f32/none"); t != torch.end() && t->second.ok) {
      torch_plain = t->second;
    } else {
      torch_plain = run_torch(script, a, threads, "f32", "none", &version);
    }
    torch_best = run_torch(script, once, threads, "bf16", "all", &version, 1);
    for (const Config& c : {ap_opt, ap_og, ap_ogw, ap}) {
      res[c.key()] = run_memfit(c, once, spec, batch);
      print_row(c, res[c.key()], nullptr);
    }
  }

  if (!version.empty()) std::printf("PyTorch %s (bench/torch_policy_matrix.py)\n", version.c_str());
  std::printf("\ntargets\n");
  int time_pass = 0, mem_pass = 0, compared = 0;
  for (const Config& c : configs) {
    const auto t = torch.find(c.dtype + "/" + c.checkpoint);
    const Figures& m = res[c.key()];
    if (c.offload || t == torch.end() || !t->second.ok || !m.ok) continue;
    ++compared;
    time_pass += m.seconds <= t->second.seconds;
    mem_pass += m.sum4() <= t->second.sum4();
  }
  if (compared) {
    std::printf(
        "1. equal settings, memfit <= PyTorch: step time %d/%d rows %s, sum4 %d/%d rows "
        "%s\n",
        time_pass, compared, verdict(time_pass == compared), mem_pass, compared,
        verdict(mem_pass == compared));
  } else {
    std::printf("1. equal settings: no PyTorch rows to compare\n");
  }
  std::printf("2. checkpointing vs none: activation peak -60%% or more, step time <= 1.25x "
              "(every:K) or <= 1.35x (all)\n");
  for (const Config& c : configs) {
    if (c.checkpoint == "none") continue;
    const Config base{c.dtype, "none", c.offload, 0};
    const auto b = res.find(base.key());
    const Figures& m = res[c.key()];
    if (b == res.end() || !b->second.ok || !m.ok) continue;
    const double cut = 1.0 - static_cast<double>(m.act()) / static_cast<double>(b->second.act());
    const double slow = m.seconds / b->second.seconds;
    const double bound = c.checkpoint == "all" ? 1.35 : 1.25;
    std::printf("   %-5s %-8s offload %-3s: activation -%4.1f%% %s, time %.2fx %s", c.dtype.c_str(),
                c.checkpoint.c_str(), c.offload ? "on" : "off", 100 * cut, verdict(cut >= 0.6),
                slow, verdict(slow <= bound));
    const auto tc = torch.find(c.dtype + "/" + c.checkpoint);
    const auto tb = torch.find(c.dtype + "/none");
    if (!c.offload && tc != torch.end() && tb != torch.end() && tc->second.ok && tb->second.ok) {
      std::printf("   (PyTorch: -%4.1f%%, %.2fx)",
                  100 * (1.0 - static_cast<double>(tc->second.act()) /
                                   static_cast<double>(tb->second.act())),
                  tc->second.seconds / tb->second.seconds);
    }
    std::printf("\n");
  }
  const auto plain = res.find(Config{"f32", "none", false, 0}.key());
  const auto all = res.find(ap.key());
  if (a.all_policies && plain != res.end() && plain->second.ok && all->second.ok) {
    const double ra =
        static_cast<double>(plain->second.allocated) / static_cast<double>(all->second.allocated);
    const double rr =
        static_cast<double>(plain->second.reserved) / static_cast<double>(all->second.reserved);
    std::printf(
        "3. all policies vs plain f32 at batch 16: peak allocated %.1f -> %.1f MiB "
        "(%.1fx less) %s; peak reserved %.1f -> %.1f MiB (%.1fx less) %s (target >= 20x)\n",
        mib(plain->second.allocated), mib(all->second.allocated), ra, verdict(ra >= 20),
        mib(plain->second.reserved), mib(all->second.reserved), rr, verdict(rr >= 20));
    const double rs =
        static_cast<double>(plain->second.sum4()) / static_cast<double>(all->second.sum4());
    if (torch_plain && torch_best && torch_plain->ok && torch_best->ok) {
      std::printf(
          "   beside PyTorch's best stock combination (bf16 autocast + checkpoint all + 1 x 16 "
          "accumulated) vs its plain f32, on sum4: %.1f -> %.1f MiB (%.2fx less); memfit's "
          "sum4 %.1f -> %.1f MiB (%.2fx less)\n",
          mib(torch_plain->sum4()), mib(torch_best->sum4()),
          static_cast<double>(torch_plain->sum4()) / static_cast<double>(torch_best->sum4()),
          mib(plain->second.sum4()), mib(all->second.sum4()), rs);
    } else {
      std::printf("   (no PyTorch anchor for the all-policies row: %s)\n",
                  script.empty() ? "no script or python3 torch" : "its run failed or was skipped");
    }
  } else if (a.all_policies) {
    std::printf("3. all policies: needs the f32/none/off row (and both rows without errors)\n");
  }
  // 4. The planner's time: every row's measured step within 20% of its prediction.
  int within = 0, timed = 0;
  double worst = 1.0;
  for (const auto& [key, m] : res) {
    if (!m.ok || m.predicted <= 0) continue;
    ++timed;
    const double r = m.seconds / m.predicted;
    within += r >= 1.0 / 1.2 && r <= 1.2;
    if (std::abs(std::log(r)) > std::abs(std::log(worst))) worst = r;
  }
  std::printf("4. predicted step time within 20%% of measured: %d/%d rows %s (worst measured/predicted %.2f)\n",
              within, timed, verdict(timed > 0 && within == timed), worst);
  return 0;
}
