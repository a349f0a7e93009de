// zinf bench adam: the CPU Adam step against the memory-bandwidth bound it
// chases, measured in the same run on the same data.
//
// The step reads params, m, v and the gradient and writes params, m, v in
// place (plus the 16-bit params with --out): 28 B per parameter with fp32
// gradients. The bound is CpuAdam::BandwidthPass: the same arrays, the same
// loads and stores, the same thread pool and chunking, next to no arithmetic.
// ratio_to_bound = bound time / step time, from the medians of --runs runs of
// each, interleaved so that noise from other work hits both alike.
//
// Stores are ordinary (write-back) stores in both kernels: streaming
// (non-temporal) stores measured slower for the in-place arrays here (bound
// 1.5-1.8 vs 2.0 Gparam/s on a 2-core EPYC VM) and made no difference that
// stood out of the noise for the 16-bit output.
//
// Before timing, the first (warm-up) step is checked: slices at the start,
// the middle and the (unaligned) end must match the scalar reference path bit
// for bit (the ISAs are designed to be bit-identical; see kernels_impl.h).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/half.h"
#include "core/units.h"
#include "optim/cpu_adam.h"
#include "optim/isa.h"
#include "optim/thread_pool.h"
#include "report.h"

namespace zinf::cli {
namespace {

using optim::AdamSpan;
using optim::AdamStepArgs;
using optim::CpuAdam;
using optim::Isa;
using optim::ThreadPool;

constexpr const char* kName = "bench adam";
constexpr int64_t kHugePageBytes = 2 * kMiB;

// A 2 MiB-aligned buffer with transparent huge pages requested (fewer TLB
// misses while streaming gigabytes). Pages are touched later, by the pool.
class Buffer {
 public:
  static StatusOr<Buffer> Allocate(int64_t bytes) {
    const int64_t size = AlignUp(std::max<int64_t>(bytes, 1), kHugePageBytes);
    void* p = std::aligned_alloc(kHugePageBytes, static_cast<size_t>(size));
    if (p == nullptr) return Status::OutOfMemory("bench adam: cannot allocate " + FormatBytes(size));
    madvise(p, static_cast<size_t>(size), MADV_HUGEPAGE);  // a hint; failure is harmless
    Buffer b;
    b.ptr_.reset(p);
    return b;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_.get());
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr_;
};

// A cheap deterministic value in [-1, 1) for element i of stream s.
float Hash(int64_t i, uint32_t s) {
  uint64_t x = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + s * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<float>(static_cast<int64_t>(x >> 40) - (int64_t{1} << 23)) * 0x1p-23f;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : (v[k - 1] + v[k]) / 2;
}

template <typename Fn>
double TimeSeconds(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Slice {
  int64_t begin;
  int64_t len;
  std::vector<float> p, m, v;
  std::vector<char> g;
};

int Run(const std::vector<std::string>& args) {
  auto flags = Flags::Parse(args, {"params", "threads", "isa", "grad", "out", "runs", "lr", "html", "json"},
                            {"no-bind"});
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  auto n_or = flags->GetInt("params", int64_t{1} << 28);
  auto threads_or = flags->GetInt("threads", ThreadPool::NumCores());
  auto runs_or = flags->GetInt("runs", 9);
  auto lr_or = flags->GetDouble("lr", 1e-3);
  for (const Status* s : {&n_or.status(), &threads_or.status(), &runs_or.status(), &lr_or.status()}) {
    if (!s->ok()) return Fail(kName, *s, 2);
  }
  const int64_t n = *n_or;
  const int64_t runs = *runs_or;
  if (n < 1 || *threads_or < 1 || *threads_or > 1024 || runs < 1) {
    return Fail(kName, Status::InvalidArgument("--params, --threads and --runs must be >= 1"), 2);
  }
  StatusOr<Isa> isa = flags->Has("isa") ? optim::ParseIsa(*flags->Get("isa")) : optim::DefaultIsa();
  if (!isa.ok()) return Fail(kName, isa.status(), 2);
  auto grad_dtype = ParseElementType(flags->GetOr("grad", "fp32"));
  if (!grad_dtype.ok()) return Fail(kName, grad_dtype.status(), 2);
  if (*grad_dtype != ElementType::kF32 && *grad_dtype != ElementType::kBf16 && *grad_dtype != ElementType::kF16) {
    return Fail(kName, Status::InvalidArgument("--grad must be fp32, bf16 or fp16"), 2);
  }
  const std::string out_name = flags->GetOr("out", "none");
  ElementType out_dtype = ElementType::kBf16;
  const bool has_out = out_name != "none";
  if (has_out) {
    auto d = ParseElementType(out_name);
    if (!d.ok() || (*d != ElementType::kBf16 && *d != ElementType::kF16)) {
      return Fail(kName, Status::InvalidArgument("--out must be none, bf16 or fp16"), 2);
    }
    out_dtype = *d;
  }

  auto pool = ThreadPool::Create({.num_threads = static_cast<int>(*threads_or), .bind_threads = !flags->Has("no-bind"),
                                  .name = "zinf-adam"});
  if (!pool.ok()) return Fail(kName, pool.status());
  OptimizerConfig config;  // AdamW, betas (0.9, 0.999), eps 1e-8
  config.weight_decay = 0.01;
  config.lr = *lr_or;
  auto adam = CpuAdam::Create(config, pool->get(), *isa);
  if (!adam.ok()) return Fail(kName, adam.status());

  const int64_t gsize = ElementSizeBytes(*grad_dtype);
  std::fprintf(stderr, "bench adam: %s params, %d threads, %s, grad %s, out %s: allocating %s\n",
               FormatCount(n).c_str(), (*pool)->num_threads(), std::string(optim::IsaName(*isa)).c_str(),
               std::string(ElementTypeName(*grad_dtype)).c_str(), out_name.c_str(),
               FormatBytes(n * (12 + gsize + (has_out ? 2 : 0))).c_str());
  auto p = Buffer::Allocate(n * 4);
  auto m = Buffer::Allocate(n * 4);
  auto v = Buffer::Allocate(n * 4);
  auto g = Buffer::Allocate(n * gsize);
  auto o = Buffer::Allocate(has_out ? n * 2 : 1);
  for (const auto* b : {&p, &m, &v, &g, &o}) {
    if (!b->ok()) return Fail(kName, b->status());
  }
  // First touch by the pool's threads, chunk by chunk as the step will run.
  float* pp = p->as<float>();
  float* mp = m->as<float>();
  float* vp = v->as<float>();
  char* gp = g->as<char>();
  uint16_t* op = o->as<uint16_t>();
  (*pool)->ParallelFor(n, optim::kChunkElems, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pp[i] = 0.5f * Hash(i, 1);
      mp[i] = 1e-3f * Hash(i, 2);
      vp[i] = 1e-6f * (1.5f + Hash(i, 3));
      const float gv = 1e-2f * Hash(i, 4);
      if (*grad_dtype == ElementType::kF32) {
        reinterpret_cast<float*>(gp)[i] = gv;
      } else {
        reinterpret_cast<uint16_t*>(gp)[i] =
            *grad_dtype == ElementType::kBf16 ? FloatToBf16(gv) : FloatToHalf(gv);
      }
      if (has_out) op[i] = 0;
    }
  });
  AdamSpan span{.params = pp, .exp_avg = mp, .exp_avg_sq = vp, .grads = gp, .grad_dtype = *grad_dtype,
                .params16 = has_out ? op : nullptr, .params16_dtype = out_dtype, .n = n};

  // Check the first step against the scalar path on three slices.
  const int64_t slice_len = std::min<int64_t>(n, 4096 + 37);
  std::vector<Slice> slices;
  for (int64_t begin : {int64_t{0}, n / 2 + 3, n - slice_len}) {
    begin = std::clamp<int64_t>(begin, 0, n - slice_len);
    if (std::any_of(slices.begin(), slices.end(), [&](const Slice& s) { return s.begin == begin; })) continue;
    Slice s{begin, slice_len, {pp + begin, pp + begin + slice_len}, {mp + begin, mp + begin + slice_len},
            {vp + begin, vp + begin + slice_len}, {gp + begin * gsize, gp + (begin + slice_len) * gsize}};
    slices.push_back(std::move(s));
  }
  int64_t step = 1;
  const AdamStepArgs first{.step = step, .lr = config.lr, .grad_scale = 1.0};
  if (Status st = adam->Update(span, first); !st.ok()) return Fail(kName, st);
  {
    auto ref_pool = ThreadPool::Create({.num_threads = 1, .bind_threads = false});
    if (!ref_pool.ok()) return Fail(kName, ref_pool.status());
    auto ref = CpuAdam::Create(config, ref_pool->get(), Isa::kScalar);
    if (!ref.ok()) return Fail(kName, ref.status());
    for (Slice& s : slices) {
      std::vector<uint16_t> out16(static_cast<size_t>(s.len), 0);
      AdamSpan rs{.params = s.p.data(), .exp_avg = s.m.data(), .exp_avg_sq = s.v.data(), .grads = s.g.data(),
                  .grad_dtype = *grad_dtype, .params16 = has_out ? out16.data() : nullptr,
                  .params16_dtype = out_dtype, .n = s.len};
      if (Status st = ref->Update(rs, first); !st.ok()) return Fail(kName, st);
      const size_t bytes = static_cast<size_t>(s.len) * 4;
      if (std::memcmp(s.p.data(), pp + s.begin, bytes) != 0 || std::memcmp(s.m.data(), mp + s.begin, bytes) != 0 ||
          std::memcmp(s.v.data(), vp + s.begin, bytes) != 0 ||
          (has_out && std::memcmp(out16.data(), op + s.begin, bytes / 2) != 0)) {
        return Fail(kName, Status::Internal("the " + std::string(optim::IsaName(*isa)) +
                                            " step differs from the scalar reference in elements [" +
                                            std::to_string(s.begin) + ", " + std::to_string(s.begin + s.len) + ")"));
      }
    }
  }
  // Warm the bound up too (scale 0 leaves the data as it is).
  if (Status st = adam->BandwidthPass(span, 0.0f); !st.ok()) return Fail(kName, st);

  std::vector<double> step_s, bound_s;
  for (int64_t r = 0; r < runs; ++r) {
    ++step;
    Status st;
    auto time_step = [&] {
      step_s.push_back(TimeSeconds([&] { st = adam->Update(span, {.step = step, .lr = config.lr}); }));
    };
    auto time_bound = [&] { bound_s.push_back(TimeSeconds([&] { st = adam->BandwidthPass(span, 0.0f); })); };
    if (r % 2 == 0) {
      time_step();
      if (st.ok()) time_bound();
    } else {
      time_bound();
      if (st.ok()) time_step();
    }
    if (!st.ok()) return Fail(kName, st);
  }

  const int64_t bytes_per_param = 12 + gsize + 12 + (has_out ? 2 : 0);
  const double step_med = Median(step_s), bound_med = Median(bound_s);
  const double gparams = static_cast<double>(n) / step_med / 1e9;
  const double bound_gparams = static_cast<double>(n) / bound_med / 1e9;
  std::string counted = "read params, exp_avg, exp_avg_sq (4 B each) and grads (" + std::to_string(gsize) +
                        " B); write params, exp_avg, exp_avg_sq (4 B each)";
  if (has_out) counted += " and params16 (2 B)";
  nlohmann::ordered_json j;
  j["bench"] = "adam";
  j["params"] = n;
  j["threads"] = (*pool)->num_threads();
  j["threads_bound_to_cores"] = (*pool)->bound();
  j["isa"] = optim::IsaName(*isa);
  j["grad_dtype"] = ElementTypeName(*grad_dtype);
  j["out_dtype"] = has_out ? std::string(ElementTypeName(out_dtype)) : "none";
  j["bytes_per_param"] = bytes_per_param;
  j["bytes_counted"] = counted;
  j["gb"] = "1e9 bytes";
  j["runs"] = runs;
  j["step_s_median"] = step_med;
  j["gparams_per_s"] = gparams;
  j["effective_gbps"] = gparams * static_cast<double>(bytes_per_param);
  j["bound_kernel"] = "same arrays, loads, stores, pool and chunks as the step; x += 0 * g";
  j["bound_s_median"] = bound_med;
  j["bound_gparams_per_s"] = bound_gparams;
  j["bandwidth_gbps"] = bound_gparams * static_cast<double>(bytes_per_param);
  j["ratio_to_bound"] = bound_med / step_med;
  // Each step and its neighbouring bound pass run back to back, so the median
  // of their ratios is the estimate least moved by other work on the machine.
  std::vector<double> pair_ratios;
  for (size_t k = 0; k < step_s.size(); ++k) pair_ratios.push_back(bound_s[k] / step_s[k]);
  j["ratio_to_bound_pairwise_median"] = Median(pair_ratios);
  j["step_s"] = step_s;
  j["bound_s"] = bound_s;
  int64_t checked = 0;
  for (const Slice& s : slices) checked += s.len;
  j["check"] = "first step bit-identical to the scalar reference on " + std::to_string(checked) + " params in " +
               std::to_string(slices.size()) + " slices";
  perf::HtmlReport report("zinf bench adam: " + FormatCount(n) + " params, " +
                          std::string(optim::IsaName(*isa)) + ", " + std::to_string((*pool)->num_threads()) +
                          " threads");
  report.AddParagraph("CPU Adam step against the memory-bandwidth bound of its access pattern (" + counted +
                      "), runs interleaved; " + j["check"].get<std::string>() + ".");
  report.AddTable("Key figures (medians)", {"figure", "value"},
                  {{"step s", perf::FormatFigure(step_med)},
                   {"Gparam/s", perf::FormatFigure(gparams)},
                   {"effective GB/s", perf::FormatFigure(j["effective_gbps"].get<double>())},
                   {"bound s", perf::FormatFigure(bound_med)},
                   {"bound GB/s", perf::FormatFigure(j["bandwidth_gbps"].get<double>())},
                   {"ratio_to_bound", perf::FormatFigure(bound_med / step_med)},
                   {"ratio_to_bound (pairwise median)", perf::FormatFigure(Median(pair_ratios))}});
  perf::BarChart chart;
  chart.title = "Adam step and bandwidth pass per run (s)";
  chart.x_label = "run";
  chart.y_label = "seconds";
  chart.lines = true;
  chart.series = {{"Adam step", step_s}, {"bandwidth bound", bound_s}};
  for (size_t k = 0; k < step_s.size(); ++k) chart.categories.push_back(std::to_string(k + 1));
  report.AddBarChart(chart);
  if (Status st = perf::EmitResult(j.dump(2), flags->GetOr("json", ""), flags->GetOr("html", ""), report); !st.ok()) {
    return Fail(kName, st);
  }
  return 0;
}

ZINF_COMMAND({"bench adam", "time the CPU Adam step against the memory-bandwidth bound of its access pattern",
              "bench adam [--params N] [--threads T] [--isa scalar|avx2|avx512] [--grad fp32|bf16|fp16]\n"
              "           [--out none|bf16|fp16] [--runs R (9)] [--lr LR] [--no-bind] [--html OUT.html]\n"
              "           [--json OUT.json]\n"
              "  Times R Adam steps over N parameters (default 2^28) and, interleaved, R passes of a\n"
              "  bandwidth kernel with the same loads and stores; prints JSON with the medians:\n"
              "  gparams_per_s, effective_gbps, bandwidth_gbps, ratio_to_bound. The first step is\n"
              "  checked bit for bit against the scalar path before anything is timed.\n"
              "  --threads: worker threads (default: one per core), bound to cores unless --no-bind.\n"
              "  --isa: default ZINF_ADAM_ISA or the best the CPU has. --out adds the fused 16-bit copy.\n"
              "  --html writes a page with the figures and the runs charted; --json a copy of the JSON.",
              Run});

}  // namespace
}  // namespace zinf::cli
