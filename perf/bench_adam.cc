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
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "adam_arrays.h"
#include "aio_perf.h"
#include "cli/command.h"
#include "core/half.h"
#include "core/units.h"
#include "optim/cpu_adam.h"
#include "optim/isa.h"
#include "optim/thread_pool.h"
#include "report.h"

namespace zinf::perf {
namespace {

using optim::AdamSpan;
using optim::AdamStepArgs;
using optim::CpuAdam;
using optim::Isa;
using optim::ThreadPool;

constexpr const char* kName = "bench adam";

// What the flags ask for (a bad one is a usage error, exit code 2).
struct Options {
  int64_t n = 0;
  int64_t runs = 0;
  int threads = 0;
  bool bind = true;
  double lr = 0;
  Isa isa = Isa::kScalar;
  ElementType grad_dtype = ElementType::kF32;
  bool has_out = false;
  ElementType out_dtype = ElementType::kBf16;
  std::string out_name;
  std::string html_path, json_path;
};

StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  ZINF_ASSIGN_OR_RETURN(
      cli::Flags flags,
      cli::Flags::Parse(args, {"params", "threads", "isa", "grad", "out", "runs", "lr", "html", "json"}, {"no-bind"}));
  auto n_or = flags.GetInt("params", int64_t{1} << 28);
  auto threads_or = flags.GetInt("threads", ThreadPool::NumCores());
  auto runs_or = flags.GetInt("runs", 9);
  auto lr_or = flags.GetDouble("lr", 1e-3);
  for (const Status* s : {&n_or.status(), &threads_or.status(), &runs_or.status(), &lr_or.status()}) {
    if (!s->ok()) return *s;
  }
  Options o;
  o.n = *n_or;
  o.runs = *runs_or;
  if (o.n < 1 || *threads_or < 1 || *threads_or > 1024 || o.runs < 1) {
    return Status::InvalidArgument("--params, --threads and --runs must be >= 1");
  }
  o.threads = static_cast<int>(*threads_or);
  o.bind = !flags.Has("no-bind");
  o.lr = *lr_or;
  ZINF_ASSIGN_OR_RETURN(o.isa, flags.Has("isa") ? optim::ParseIsa(*flags.Get("isa")) : optim::DefaultIsa());
  ZINF_ASSIGN_OR_RETURN(o.grad_dtype, ParseElementType(flags.GetOr("grad", "fp32")));
  if (o.grad_dtype != ElementType::kF32 && o.grad_dtype != ElementType::kBf16 && o.grad_dtype != ElementType::kF16) {
    return Status::InvalidArgument("--grad must be fp32, bf16 or fp16");
  }
  o.out_name = flags.GetOr("out", "none");
  o.has_out = o.out_name != "none";
  if (o.has_out) {
    auto d = ParseElementType(o.out_name);
    if (!d.ok() || (*d != ElementType::kBf16 && *d != ElementType::kF16)) {
      return Status::InvalidArgument("--out must be none, bf16 or fp16");
    }
    o.out_dtype = *d;
  }
  o.html_path = flags.GetOr("html", "");
  o.json_path = flags.GetOr("json", "");
  return o;
}

// The step's pool, Adam (AdamW, betas (0.9, 0.999), eps 1e-8, weight decay
// 0.01, the flags' lr) and arrays.
struct Setup {
  OptimizerConfig config;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<CpuAdam> adam;
  std::unique_ptr<AdamArrays> arrays;
};

StatusOr<Setup> CreateSetup(const Options& o) {
  Setup s;
  ZINF_ASSIGN_OR_RETURN(s.pool,
                        ThreadPool::Create({.num_threads = o.threads, .bind_threads = o.bind, .name = "zinf-adam"}));
  s.config.weight_decay = 0.01;
  s.config.lr = o.lr;
  ZINF_ASSIGN_OR_RETURN(CpuAdam adam, CpuAdam::Create(s.config, s.pool.get(), o.isa));
  s.adam = std::make_unique<CpuAdam>(std::move(adam));
  const AdamArraysOptions ao{.n = o.n, .grad_dtype = o.grad_dtype, .with_out = o.has_out, .out_dtype = o.out_dtype};
  std::fprintf(stderr, "bench adam: %s params, %d threads, %s, grad %s, out %s: allocating %s\n",
               FormatCount(o.n).c_str(), s.pool->num_threads(), std::string(optim::IsaName(o.isa)).c_str(),
               std::string(ElementTypeName(o.grad_dtype)).c_str(), o.out_name.c_str(),
               FormatBytes(AdamArrays::Bytes(ao)).c_str());
  ZINF_ASSIGN_OR_RETURN(AdamArrays arrays, AdamArrays::Create(ao, *s.pool));
  s.arrays = std::make_unique<AdamArrays>(std::move(arrays));
  return s;
}

// What the check covered.
struct Checked {
  int64_t params = 0;
  size_t slices = 0;
};

// Runs step 1 and checks it against the scalar path on three slices (the
// start, the middle and the unaligned end), bit for bit.
StatusOr<Checked> CheckFirstStep(const Options& o, Setup& s) {
  struct Slice {
    int64_t begin;
    int64_t len;
    std::vector<float> p, m, v;
    std::vector<char> g;
  };
  const AdamArrays& a = *s.arrays;
  const int64_t n = o.n;
  const int64_t gsize = ElementSizeBytes(o.grad_dtype);
  const int64_t slice_len = std::min<int64_t>(n, 4096 + 37);
  std::vector<Slice> slices;
  for (int64_t begin : {int64_t{0}, n / 2 + 3, n - slice_len}) {
    begin = std::clamp<int64_t>(begin, 0, n - slice_len);
    if (std::any_of(slices.begin(), slices.end(), [&](const Slice& x) { return x.begin == begin; })) continue;
    const int64_t end = begin + slice_len;
    slices.push_back({begin,
                      slice_len,
                      {a.params() + begin, a.params() + end},
                      {a.exp_avg() + begin, a.exp_avg() + end},
                      {a.exp_avg_sq() + begin, a.exp_avg_sq() + end},
                      {a.grads() + begin * gsize, a.grads() + end * gsize}});
  }
  const AdamStepArgs first{.step = 1, .lr = s.config.lr, .grad_scale = 1.0};
  ZINF_RETURN_IF_ERROR(s.adam->Update(a.span(), first));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<ThreadPool> ref_pool,
                        ThreadPool::Create({.num_threads = 1, .bind_threads = false}));
  ZINF_ASSIGN_OR_RETURN(CpuAdam ref, CpuAdam::Create(s.config, ref_pool.get(), Isa::kScalar));
  Checked checked;
  for (Slice& x : slices) {
    std::vector<uint16_t> out16(static_cast<size_t>(x.len), 0);
    AdamSpan rs{.params = x.p.data(),
                .exp_avg = x.m.data(),
                .exp_avg_sq = x.v.data(),
                .grads = x.g.data(),
                .grad_dtype = o.grad_dtype,
                .params16 = o.has_out ? out16.data() : nullptr,
                .params16_dtype = o.out_dtype,
                .n = x.len};
    ZINF_RETURN_IF_ERROR(ref.Update(rs, first));
    const size_t bytes = static_cast<size_t>(x.len) * 4;
    if (std::memcmp(x.p.data(), a.params() + x.begin, bytes) != 0 ||
        std::memcmp(x.m.data(), a.exp_avg() + x.begin, bytes) != 0 ||
        std::memcmp(x.v.data(), a.exp_avg_sq() + x.begin, bytes) != 0 ||
        (o.has_out && std::memcmp(out16.data(), a.out() + x.begin, bytes / 2) != 0)) {
      return Status::Internal("the " + std::string(optim::IsaName(o.isa)) +
                              " step differs from the scalar reference in elements [" + std::to_string(x.begin) + ", " +
                              std::to_string(x.begin + x.len) + ")");
    }
    checked.params += x.len;
  }
  checked.slices = slices.size();
  return checked;
}

// Seconds per run of the step and of the bound, runs interleaved (which
// goes first alternates) so that noise from other work hits both alike.
struct Timings {
  std::vector<double> step_s, bound_s;
};

StatusOr<Timings> Measure(const Options& o, Setup& s) {
  const AdamSpan span = s.arrays->span();
  // Warm the bound up too (scale 0 leaves the data as it is).
  ZINF_RETURN_IF_ERROR(s.adam->BandwidthPass(span, 0.0f));
  Timings t;
  int64_t step = 1;  // step 1 was the checked one
  for (int64_t r = 0; r < o.runs; ++r) {
    ++step;
    Status st;
    auto time_step = [&] {
      t.step_s.push_back(TimeSeconds([&] { st = s.adam->Update(span, {.step = step, .lr = s.config.lr}); }));
    };
    auto time_bound = [&] { t.bound_s.push_back(TimeSeconds([&] { st = s.adam->BandwidthPass(span, 0.0f); })); };
    if (r % 2 == 0) {
      time_step();
      if (st.ok()) time_bound();
    } else {
      time_bound();
      if (st.ok()) time_step();
    }
    ZINF_RETURN_IF_ERROR(st);
  }
  return t;
}

// The figures, from the medians.
struct Summary {
  int64_t bytes_per_param = 0;
  std::string counted;  // which bytes bytes_per_param counts
  double step_med = 0, bound_med = 0, gparams = 0, bound_gparams = 0, pairwise = 0;
};

Summary Summarize(const Options& o, const Timings& t) {
  Summary s;
  const int64_t gsize = ElementSizeBytes(o.grad_dtype);
  s.bytes_per_param = 12 + gsize + 12 + (o.has_out ? 2 : 0);
  s.step_med = Median(t.step_s);
  s.bound_med = Median(t.bound_s);
  s.gparams = static_cast<double>(o.n) / s.step_med / 1e9;
  s.bound_gparams = static_cast<double>(o.n) / s.bound_med / 1e9;
  s.counted = "read params, exp_avg, exp_avg_sq (4 B each) and grads (" + std::to_string(gsize) +
              " B); write params, exp_avg, exp_avg_sq (4 B each)";
  if (o.has_out) s.counted += " and params16 (2 B)";
  // Each step and its neighbouring bound pass run back to back, so the median
  // of their ratios is the estimate least moved by other work on the machine.
  std::vector<double> pair_ratios;
  for (size_t k = 0; k < t.step_s.size(); ++k) pair_ratios.push_back(t.bound_s[k] / t.step_s[k]);
  s.pairwise = Median(pair_ratios);
  return s;
}

nlohmann::ordered_json ToJson(const Options& o, const Setup& setup, const Checked& checked, const Timings& t,
                              const Summary& s) {
  nlohmann::ordered_json j;
  j["bench"] = "adam";
  j["params"] = o.n;
  j["threads"] = setup.pool->num_threads();
  j["threads_bound_to_cores"] = setup.pool->bound();
  j["isa"] = optim::IsaName(o.isa);
  j["grad_dtype"] = ElementTypeName(o.grad_dtype);
  j["out_dtype"] = o.has_out ? std::string(ElementTypeName(o.out_dtype)) : "none";
  j["bytes_per_param"] = s.bytes_per_param;
  j["bytes_counted"] = s.counted;
  j["gb"] = "1e9 bytes";
  j["runs"] = o.runs;
  j["step_s_median"] = s.step_med;
  j["gparams_per_s"] = s.gparams;
  j["effective_gbps"] = s.gparams * static_cast<double>(s.bytes_per_param);
  j["bound_kernel"] = "same arrays, loads, stores, pool and chunks as the step; x += 0 * g";
  j["bound_s_median"] = s.bound_med;
  j["bound_gparams_per_s"] = s.bound_gparams;
  j["bandwidth_gbps"] = s.bound_gparams * static_cast<double>(s.bytes_per_param);
  j["ratio_to_bound"] = s.bound_med / s.step_med;
  j["ratio_to_bound_pairwise_median"] = s.pairwise;
  j["step_s"] = t.step_s;
  j["bound_s"] = t.bound_s;
  j["check"] = "first step bit-identical to the scalar reference on " + std::to_string(checked.params) + " params in " +
               std::to_string(checked.slices) + " slices";
  return j;
}

HtmlReport MakeReport(const Options& o, const nlohmann::ordered_json& j, const Timings& t, const Summary& s) {
  HtmlReport report("zinf bench adam: " + FormatCount(o.n) + " params, " + std::string(optim::IsaName(o.isa)) + ", " +
                    std::to_string(j["threads"].get<int>()) + " threads");
  report.AddParagraph("CPU Adam step against the memory-bandwidth bound of its access pattern (" + s.counted +
                      "), runs interleaved; " + j["check"].get<std::string>() + ".");
  report.AddTable("Key figures (medians)", {"figure", "value"},
                  {{"step s", FormatFigure(s.step_med)},
                   {"Gparam/s", FormatFigure(s.gparams)},
                   {"effective GB/s", FormatFigure(j["effective_gbps"].get<double>())},
                   {"bound s", FormatFigure(s.bound_med)},
                   {"bound GB/s", FormatFigure(j["bandwidth_gbps"].get<double>())},
                   {"ratio_to_bound", FormatFigure(s.bound_med / s.step_med)},
                   {"ratio_to_bound (pairwise median)", FormatFigure(s.pairwise)}});
  BarChart chart;
  chart.title = "Adam step and bandwidth pass per run (s)";
  chart.x_label = "run";
  chart.y_label = "seconds";
  chart.lines = true;
  chart.series = {{"Adam step", t.step_s}, {"bandwidth bound", t.bound_s}};
  for (size_t k = 0; k < t.step_s.size(); ++k) chart.categories.push_back(std::to_string(k + 1));
  report.AddBarChart(chart);
  return report;
}

int Run(const std::vector<std::string>& args) {
  auto options = ParseOptions(args);
  if (!options.ok()) return cli::Fail(kName, options.status(), 2);
  auto setup = CreateSetup(*options);
  if (!setup.ok()) return cli::Fail(kName, setup.status());
  auto checked = CheckFirstStep(*options, *setup);
  if (!checked.ok()) return cli::Fail(kName, checked.status());
  auto timings = Measure(*options, *setup);
  if (!timings.ok()) return cli::Fail(kName, timings.status());
  const Summary summary = Summarize(*options, *timings);
  const nlohmann::ordered_json j = ToJson(*options, *setup, *checked, *timings, summary);
  HtmlReport report = MakeReport(*options, j, *timings, summary);
  if (Status st = EmitResult(j.dump(2), options->json_path, options->html_path, report); !st.ok()) {
    return cli::Fail(kName, st);
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
}  // namespace zinf::perf
