// zinf bench attention: the host device's fused attention (kernels::cpu::
// FusedAttentionForward/Backward) against the limit it chases, the CPU
// kernels' own register-tiled matmul on the same threads, measured in the
// same run, and beside the unfused kernels it replaced (the T x T
// probabilities).
//
// Work is counted as FlashAttention counts it, over the causal triangle
// only: the forward 2 products (scores, probabilities times v), the
// backward 5 (the scores again, dp, dv, dq, dk), each 2 * hs flops per
// (query, key) pair with key <= query (and within --window W of it: each
// query sees W keys, itself included; 0, the default, is none). The fused backward computes the
// scores and dp twice (once per block of queries for dq, once per block of
// keys for dk and dv, so that each thread owns what it writes): 7 products
// where 5 are counted. The limit is MatmulForward on [B*T, C] x [C, C] (the
// attention's own input width): the rate the same micro-kernel reaches on
// a large product. ratio = attention GFLOP/s / matmul GFLOP/s, from the
// medians of --runs runs, the three timed in turns.
//
// Before timing, the first run's outputs are checked against the unfused
// kernels (out, the log-sum-exps and dqkv, relative 1e-4 of each value
// plus 1e-4).
//
// --device cuda (a build with the CUDA kernels, on a GPU): the same for the
// 16-bit mode's fused kernel (kernels::cuda::FlashAttentionForward/
// Backward, bf16 tiles on tensor cores) against the bf16 matmul on tensor
// cores (MatmulForward16, cuBLASLt) of [B*T, C] x [C, C]; each timing is
// --inner launches after a synchronisation, divided. Checked first against
// the host's fused attention on the operands rounded to bf16 (within
// 1.5e-2 of the largest magnitude plus 1e-3, the GPU tests' tolerance).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aio_perf.h"
#include "cli/command.h"
#include "core/half.h"
#include "core/units.h"
#include "device/cuda_device.h"
#include "kernels/cpu_kernels.h"
#include "report.h"
#if defined(ZINF_HAVE_CUDA_KERNELS)
#include "kernels/cuda_kernels.h"
#endif

namespace zinf::perf {
namespace {

namespace k = kernels::cpu;

constexpr const char* kName = "bench attention";

struct Options {
  int B = 0, T = 0, C = 0, NH = 0;
  int window = 0;
  float softcap = 0;  // 0: none
  int64_t runs = 0, inner = 0;
  int threads = 0;
  bool unfused = true;
  bool cuda = false;
  std::string html_path, json_path;
  int64_t N() const { return int64_t{B} * T; }
};

StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  ZINF_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args,
                                                            {"batch", "seq-len", "embd", "heads", "runs", "inner",
                                                             "threads", "device", "html", "json", "window", "softcap"},
                                                            {"no-unfused"}));
  auto b = flags.GetInt("batch", 4);
  auto t = flags.GetInt("seq-len", 1024);
  auto c = flags.GetInt("embd", 768);
  auto nh = flags.GetInt("heads", 12);
  auto runs = flags.GetInt("runs", 5);
  auto threads = flags.GetInt("threads", k::Threads());
  auto inner = flags.GetInt("inner", 20);
  auto window = flags.GetInt("window", 0);
  auto softcap = flags.GetDouble("softcap", 0.0);
  for (const Status* s : {&b.status(), &t.status(), &c.status(), &nh.status(), &runs.status(), &threads.status(),
                          &inner.status(), &window.status(), &softcap.status()}) {
    if (!s->ok()) return *s;
  }
  if (!(*softcap >= 0 && *softcap <= 1e6)) return Status::InvalidArgument("--softcap must be in [0, 1e6] (0: none)");
  if (*window < 0 || *window > (1 << 20)) return Status::InvalidArgument("--window must be in [0, 1048576]");
  if (*inner < 1) return Status::InvalidArgument("--inner must be >= 1");
  const std::string device = flags.GetOr("device", "host");
  if (device != "host" && device != "cuda") {
    return Status::InvalidArgument("--device must be host or cuda, not '" + device + "'");
  }
  if (*b < 1 || *t < 1 || *c < 1 || *nh < 1 || *runs < 1 || *threads < 1 || *b > 4096 || *t > (1 << 20) ||
      *c > (1 << 16) || *nh > *c || *threads > 1024) {
    return Status::InvalidArgument(
        "--batch, --seq-len, --embd, --heads, --runs and --threads must be >= 1 (and "
        "--heads <= --embd)");
  }
  if (*c % *nh != 0) {
    return Status::InvalidArgument("--embd " + std::to_string(*c) + " is not a multiple of --heads " +
                                   std::to_string(*nh));
  }
  Options o;
  o.B = static_cast<int>(*b);
  o.T = static_cast<int>(*t);
  o.C = static_cast<int>(*c);
  o.NH = static_cast<int>(*nh);
  o.window = static_cast<int>(*window);
  o.softcap = static_cast<float>(*softcap);
  o.runs = *runs;
  o.threads = static_cast<int>(*threads);
  o.unfused = !flags.Has("no-unfused");
  o.cuda = device == "cuda";
  o.inner = *inner;
  o.html_path = flags.GetOr("html", "");
  o.json_path = flags.GetOr("json", "");
  return o;
}

// The inputs and every output, fused and unfused.
struct Arrays {
  std::vector<float> qkv, dout, out, lse, scratch, dqkv;
  std::vector<float> att, att_scratch, ref_out, ref_dqkv;  // unfused (empty without it)
  std::vector<float> mm_out, mm_w;                         // the matmul limit
};

Arrays MakeArrays(const Options& o) {
  Arrays a;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  a.qkv.resize(static_cast<size_t>(o.N() * 3 * o.C));
  a.dout.resize(static_cast<size_t>(o.N() * o.C));
  for (float& x : a.qkv) x = u(rng);
  for (float& x : a.dout) x = u(rng);
  const size_t rows = static_cast<size_t>(o.B) * o.NH * o.T;
  a.out.resize(a.dout.size());
  a.lse.resize(rows);
  a.scratch.resize(rows);
  a.dqkv.resize(a.qkv.size());
  if (o.unfused) {
    a.att.resize(rows * o.T);
    a.att_scratch.resize(rows * o.T);
    a.ref_out.resize(a.dout.size());
    a.ref_dqkv.resize(a.qkv.size());
  }
  a.mm_out.resize(a.dout.size());
  a.mm_w.resize(static_cast<size_t>(o.C) * o.C);
  for (float& x : a.mm_w) x = u(rng) * 0.05f;
  return a;
}

struct Timings {
  std::vector<double> forward_s, backward_s, matmul_s, unfused_forward_s, unfused_backward_s;
};

void RunFused(const Options& o, Arrays& a, Timings* t) {
  std::fill(a.dqkv.begin(), a.dqkv.end(), 0.0f);
  const double f = TimeSeconds([&] {
    k::FusedAttentionForward(a.out.data(), a.lse.data(), a.qkv.data(), o.B, o.T, o.C, o.NH, o.window, o.softcap);
  });
  const double b = TimeSeconds([&] {
    k::FusedAttentionBackward(a.dqkv.data(), a.scratch.data(), a.dout.data(), a.qkv.data(), a.out.data(), a.lse.data(),
                              o.B, o.T, o.C, o.NH, o.window, o.softcap);
  });
  if (t != nullptr) {
    t->forward_s.push_back(f);
    t->backward_s.push_back(b);
  }
}

void RunUnfused(const Options& o, Arrays& a, Timings* t) {
  std::fill(a.ref_dqkv.begin(), a.ref_dqkv.end(), 0.0f);
  const double f = TimeSeconds([&] {
    k::AttentionForward(a.ref_out.data(), a.att.data(), a.qkv.data(), o.B, o.T, o.C, o.NH, o.window, o.softcap);
  });
  const double b = TimeSeconds([&] {
    k::AttentionBackward(a.ref_dqkv.data(), a.att_scratch.data(), a.dout.data(), a.qkv.data(), a.att.data(), o.B, o.T,
                         o.C, o.NH, o.window, o.softcap);
  });
  if (t != nullptr) {
    t->unfused_forward_s.push_back(f);
    t->unfused_backward_s.push_back(b);
  }
}

void RunMatmul(const Options& o, Arrays& a, Timings* t) {
  const double s = TimeSeconds([&] {
    k::MatmulForward(a.mm_out.data(), a.dout.data(), a.mm_w.data(), static_cast<const float*>(nullptr), o.N(), o.C,
                     o.C);
  });
  if (t != nullptr) t->matmul_s.push_back(s);
}

// The largest |got - want| / (|want| + 1) of the three outputs, against the
// unfused kernels; fails past 1e-4.
StatusOr<double> Check(const Options& o, Arrays& a) {
  RunFused(o, a, nullptr);
  RunUnfused(o, a, nullptr);
  double worst = 0;
  auto cmp = [&](const std::vector<float>& got, const std::vector<float>& want) {
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]) / (std::fabs(want[i]) + 1.0));
    }
  };
  cmp(a.out, a.ref_out);
  cmp(a.dqkv, a.ref_dqkv);
  // The unfused kernels keep probabilities: lse = s_tt * scale - log p_tt.
  const int hs = o.C / o.NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int b = 0; b < o.B; ++b) {
    for (int h = 0; h < o.NH; ++h) {
      for (int t = 0; t < o.T; ++t) {
        const float* q = a.qkv.data() + (int64_t{b} * o.T + t) * 3 * o.C + h * hs;
        double st = 0;
        for (int i = 0; i < hs; ++i) st += static_cast<double>(q[i]) * q[o.C + i];
        const int64_t row = (int64_t{b} * o.NH + h) * o.T + t;
        const double want = st * scale - std::log(static_cast<double>(a.att[row * o.T + t]));
        worst = std::max(worst, std::fabs(a.lse[row] - want) / (std::fabs(want) + 1.0));
      }
    }
  }
  if (worst > 1e-4) {
    return Status::Internal("the fused attention differs from the unfused kernels by " + std::to_string(worst) +
                            " (relative), past 1e-4");
  }
  return worst;
}

// FLOPs of one product over the causal pairs (key <= query, within the
// window): 2 * hs each.
double ProductFlops(const Options& o) {
  const double T = o.T, W = o.window > 0 && o.window < o.T ? o.window : T;
  const double per_head = W * (W + 1) / 2 + (T - W) * W;  // queries 0 .. W-1 see t + 1 keys, the rest W
  return 2.0 * (o.C / o.NH) * static_cast<double>(o.B) * o.NH * per_head;
}
// FLOPs of the limit, [B*T, C] x [C, C].
double MatmulFlops(const Options& o) { return 2.0 * static_cast<double>(o.N()) * o.C * o.C; }
constexpr const char* kFlopsCounted =
    "causal pairs only: forward 2 products, backward 5 (the fused backward computes 7)";

// The JSON's first fields, both devices'.
nlohmann::ordered_json ShapeJson(const Options& o, const char* device) {
  nlohmann::ordered_json j;
  j["bench"] = "attention";
  j["device"] = device;
  j["batch"] = o.B;
  j["seq_len"] = o.T;
  j["embd"] = o.C;
  j["heads"] = o.NH;
  j["head_size"] = o.C / o.NH;
  j["window"] = o.window;
  j["softcap"] = o.softcap;
  j["runs"] = o.runs;
  j["flops_counted"] = kFlopsCounted;
  return j;
}

struct Summary {
  double forward_flops = 0, backward_flops = 0, matmul_flops = 0;
  double forward_med = 0, backward_med = 0, matmul_med = 0, unfused_forward_med = 0, unfused_backward_med = 0;
  double forward_gflops = 0, backward_gflops = 0, matmul_gflops = 0;
};

Summary Summarize(const Options& o, const Timings& t) {
  Summary s;
  s.forward_flops = 2 * ProductFlops(o);
  s.backward_flops = 5 * ProductFlops(o);
  s.matmul_flops = MatmulFlops(o);
  s.forward_med = Median(t.forward_s);
  s.backward_med = Median(t.backward_s);
  s.matmul_med = Median(t.matmul_s);
  s.forward_gflops = s.forward_flops / s.forward_med / 1e9;
  s.backward_gflops = s.backward_flops / s.backward_med / 1e9;
  s.matmul_gflops = s.matmul_flops / s.matmul_med / 1e9;
  if (!t.unfused_forward_s.empty()) {
    s.unfused_forward_med = Median(t.unfused_forward_s);
    s.unfused_backward_med = Median(t.unfused_backward_s);
  }
  return s;
}

nlohmann::ordered_json ToJson(const Options& o, const Timings& t, const Summary& s, double checked) {
  nlohmann::ordered_json j = ShapeJson(o, "host");
  j["threads"] = k::Threads();
  j["forward_s_median"] = s.forward_med;
  j["backward_s_median"] = s.backward_med;
  j["forward_gflops"] = s.forward_gflops;
  j["backward_gflops"] = s.backward_gflops;
  j["limit_kernel"] = "MatmulForward [B*T, C] x [C, C], the same micro-kernel on the same threads";
  j["matmul_s_median"] = s.matmul_med;
  j["matmul_gflops"] = s.matmul_gflops;
  j["forward_ratio_to_matmul"] = s.forward_gflops / s.matmul_gflops;
  j["backward_ratio_to_matmul"] = s.backward_gflops / s.matmul_gflops;
  if (o.unfused) {
    j["unfused_forward_s_median"] = s.unfused_forward_med;
    j["unfused_backward_s_median"] = s.unfused_backward_med;
    j["speedup_forward"] = s.unfused_forward_med / s.forward_med;
    j["speedup_backward"] = s.unfused_backward_med / s.backward_med;
    j["check"] = "out, lse and dqkv within " + FormatFigure(checked) + " (relative) of the unfused kernels";
  }
  j["forward_s"] = t.forward_s;
  j["backward_s"] = t.backward_s;
  j["matmul_s"] = t.matmul_s;
  if (o.unfused) {
    j["unfused_forward_s"] = t.unfused_forward_s;
    j["unfused_backward_s"] = t.unfused_backward_s;
  }
  return j;
}

HtmlReport MakeReport(const Options& o, const nlohmann::ordered_json& j, const Timings& t, const Summary& s) {
  HtmlReport report("zinf bench attention: B " + std::to_string(o.B) + ", T " + std::to_string(o.T) + ", C " +
                    std::to_string(o.C) + ", " + std::to_string(o.NH) + " heads, " + std::to_string(k::Threads()) +
                    " threads");
  report.AddParagraph(
      "The host's fused attention against the CPU kernels' matmul on the same threads (the limit), "
      "and beside the unfused kernels; " +
      j["flops_counted"].get<std::string>() + ".");
  std::vector<std::vector<std::string>> rows = {
      {"forward s", FormatFigure(s.forward_med)},
      {"backward s", FormatFigure(s.backward_med)},
      {"forward GFLOP/s", FormatFigure(s.forward_gflops)},
      {"backward GFLOP/s", FormatFigure(s.backward_gflops)},
      {"matmul GFLOP/s (limit)", FormatFigure(s.matmul_gflops)},
      {"forward / matmul", FormatFigure(s.forward_gflops / s.matmul_gflops)},
      {"backward / matmul", FormatFigure(s.backward_gflops / s.matmul_gflops)}};
  if (o.unfused) {
    rows.push_back({"unfused forward s", FormatFigure(s.unfused_forward_med)});
    rows.push_back({"unfused backward s", FormatFigure(s.unfused_backward_med)});
  }
  report.AddTable("Key figures (medians)", {"figure", "value"}, rows);
  BarChart chart;
  chart.title = "Seconds per run";
  chart.x_label = "run";
  chart.y_label = "seconds";
  chart.lines = true;
  chart.series = {{"fused forward", t.forward_s}, {"fused backward", t.backward_s}, {"matmul", t.matmul_s}};
  if (o.unfused) {
    chart.series.push_back({"unfused forward", t.unfused_forward_s});
    chart.series.push_back({"unfused backward", t.unfused_backward_s});
  }
  for (size_t r = 0; r < t.forward_s.size(); ++r) chart.categories.push_back(std::to_string(r + 1));
  report.AddBarChart(chart);
  return report;
}

#if defined(ZINF_HAVE_CUDA_KERNELS)
namespace g = kernels::cuda;

// Device memory freed at the end of the GPU run.
class DeviceArrays {
 public:
  explicit DeviceArrays(Device& d) : d_(d) {}
  ~DeviceArrays() {
    for (void* p : owned_) d_.Free(p);
  }
  DeviceArrays(const DeviceArrays&) = delete;
  DeviceArrays& operator=(const DeviceArrays&) = delete;
  StatusOr<void*> Get(size_t bytes) {
    ZINF_ASSIGN_OR_RETURN(void* p, d_.Allocate(bytes));
    owned_.push_back(p);
    return p;
  }

 private:
  Device& d_;
  std::vector<void*> owned_;
};

// The largest |got - want| over the tolerance 1.5e-2 * max |want| + 1e-3.
double OverTolerance(const std::vector<float>& got, const std::vector<float>& want) {
  double mx = 0, worst = 0;
  for (float x : want) mx = std::max(mx, std::fabs(static_cast<double>(x)));
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]) / (1.5e-2 * mx + 1e-3));
  }
  return worst;
}

// The 16-bit mode's fused attention on GPU 0 against the bf16 matmul there.
StatusOr<nlohmann::ordered_json> RunCuda(const Options& o, const Arrays& a) {
  if (!g::FlashAttentionSupported(o.C, o.NH, 0)) {
    return Status::InvalidArgument("the GPU's fused attention has no kernel for head size " +
                                   std::to_string(o.C / o.NH) + " (16, 32, 64 or 128, within the GPU's shared memory)");
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateCudaDevice(0, 0));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device->CreateStream());
  void* const s = stream->native_handle();
  const int64_t N = o.N(), rows = int64_t{o.B} * o.NH * o.T;
  const size_t f = sizeof(float);
  std::vector<uint16_t> w16(static_cast<size_t>(o.C) * o.C);
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = FloatToBf16(a.mm_w[i]);
  DeviceArrays mem(*device);
  auto up = [&](const void* host, size_t bytes) -> StatusOr<void*> {
    ZINF_ASSIGN_OR_RETURN(void* p, mem.Get(bytes));
    ZINF_RETURN_IF_ERROR(stream->CopyAsync(p, host, bytes, CopyDirection::kHostToDevice));
    return p;
  };
  const std::vector<float> zero(a.qkv.size(), 0.0f);
  ZINF_ASSIGN_OR_RETURN(void* qkv, up(a.qkv.data(), a.qkv.size() * f));
  ZINF_ASSIGN_OR_RETURN(void* dout, up(a.dout.data(), a.dout.size() * f));
  ZINF_ASSIGN_OR_RETURN(void* w, up(w16.data(), w16.size() * 2));
  ZINF_ASSIGN_OR_RETURN(void* dqkv, up(zero.data(), zero.size() * f));
  ZINF_ASSIGN_OR_RETURN(void* out, mem.Get(static_cast<size_t>(N * o.C) * f));
  ZINF_ASSIGN_OR_RETURN(void* lse, mem.Get(static_cast<size_t>(rows) * f));
  ZINF_ASSIGN_OR_RETURN(void* scratch, mem.Get(static_cast<size_t>(g::FlashAttentionScratchElems(o.B, o.T, o.NH)) * f));
  ZINF_ASSIGN_OR_RETURN(void* mm_out, mem.Get(static_cast<size_t>(N * o.C) * f));
  ZINF_ASSIGN_OR_RETURN(void* workspace, mem.Get(static_cast<size_t>(g::kLtWorkspaceBytes)));
  ZINF_ASSIGN_OR_RETURN(void* scratch16, mem.Get(static_cast<size_t>(g::Matmul16ScratchBytes(N, o.C, o.C))));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<g::CudaLt> lt, g::CudaLt::Create(s, workspace));
  auto* fq = static_cast<float*>(qkv);
  auto* fo = static_cast<float*>(out);
  auto* fl = static_cast<float*>(lse);
  auto forward = [&] { return g::FlashAttentionForward(fo, fl, fq, o.B, o.T, o.C, o.NH, o.window, o.softcap, s); };
  auto backward = [&] {
    return g::FlashAttentionBackward(static_cast<float*>(dqkv), static_cast<float*>(scratch),
                                     static_cast<const float*>(dout), fq, fo, fl, o.B, o.T, o.C, o.NH, o.window,
                                     o.softcap, s);
  };
  auto gemm = [&] {
    return g::MatmulForward16(*lt, static_cast<float*>(mm_out), static_cast<const float*>(dout), w, ElementType::kBf16,
                              nullptr, N, o.C, o.C, scratch16);
  };
  // The check: one forward and backward (dqkv from zero) against the
  // host's fused attention on the operands rounded to bf16.
  ZINF_RETURN_IF_ERROR(forward());
  ZINF_RETURN_IF_ERROR(backward());
  std::vector<float> got_out(static_cast<size_t>(N * o.C)), got_dqkv(a.qkv.size());
  ZINF_RETURN_IF_ERROR(stream->CopyAsync(got_out.data(), out, got_out.size() * f, CopyDirection::kDeviceToHost));
  ZINF_RETURN_IF_ERROR(stream->CopyAsync(got_dqkv.data(), dqkv, got_dqkv.size() * f, CopyDirection::kDeviceToHost));
  ZINF_RETURN_IF_ERROR(stream->Synchronize());
  std::vector<float> q16 = a.qkv, d16 = a.dout;
  k::RoundTo16(q16.data(), static_cast<int64_t>(q16.size()), ElementType::kBf16);
  k::RoundTo16(d16.data(), static_cast<int64_t>(d16.size()), ElementType::kBf16);
  std::vector<float> want_out(got_out.size()), want_lse(static_cast<size_t>(rows)), want_scratch(want_lse.size()),
      want_dqkv(a.qkv.size(), 0.0f);
  k::FusedAttentionForward(want_out.data(), want_lse.data(), q16.data(), o.B, o.T, o.C, o.NH, o.window, o.softcap);
  k::FusedAttentionBackward(want_dqkv.data(), want_scratch.data(), d16.data(), q16.data(), want_out.data(),
                            want_lse.data(), o.B, o.T, o.C, o.NH, o.window, o.softcap);
  const double worst = std::max(OverTolerance(got_out, want_out), OverTolerance(got_dqkv, want_dqkv));
  if (worst > 1.0) {
    return Status::Internal("the GPU's fused attention is " + FormatFigure(worst) +
                            "x its tolerance away from the host's on the bf16-rounded operands");
  }
  ZINF_RETURN_IF_ERROR(gemm());
  ZINF_RETURN_IF_ERROR(stream->Synchronize());
  // --inner launches a timing; the three in turns.
  std::vector<double> fwd_s, bwd_s, gemm_s;
  Status st;
  auto timed = [&](const auto& launch, std::vector<double>* into) {
    const double t = TimeSeconds([&] {
      for (int64_t i = 0; i < o.inner && st.ok(); ++i) st = launch();
      if (st.ok()) st = stream->Synchronize();
    });
    into->push_back(t / static_cast<double>(o.inner));
  };
  for (int64_t r = 0; r < o.runs && st.ok(); ++r) {
    timed(forward, &fwd_s);
    timed(backward, &bwd_s);
    timed(gemm, &gemm_s);
  }
  ZINF_RETURN_IF_ERROR(st);
  const double fwd = Median(fwd_s), bwd = Median(bwd_s), mm = Median(gemm_s);
  const double fwd_tflops = 2 * ProductFlops(o) / fwd / 1e12, bwd_tflops = 5 * ProductFlops(o) / bwd / 1e12;
  const double mm_tflops = MatmulFlops(o) / mm / 1e12;
  nlohmann::ordered_json j = ShapeJson(o, "cuda");
  j["inner"] = o.inner;
  j["forward_s_median"] = fwd;
  j["backward_s_median"] = bwd;
  j["forward_tflops"] = fwd_tflops;
  j["backward_tflops"] = bwd_tflops;
  j["limit_kernel"] = "MatmulForward16 [B*T, C] x [C, C] bf16 (cuBLASLt, fp32 accumulation)";
  j["matmul_s_median"] = mm;
  j["matmul_tflops"] = mm_tflops;
  j["forward_ratio_to_matmul"] = fwd_tflops / mm_tflops;
  j["backward_ratio_to_matmul"] = bwd_tflops / mm_tflops;
  j["check"] = "out and dqkv within " + FormatFigure(worst) +
               " of the tolerance (1.5e-2 of the largest magnitude + 1e-3) of the host's on bf16-rounded operands";
  j["forward_s"] = fwd_s;
  j["backward_s"] = bwd_s;
  j["matmul_s"] = gemm_s;
  return j;
}
#endif

int Run(const std::vector<std::string>& args) {
  auto options = ParseOptions(args);
  if (!options.ok()) return cli::Fail(kName, options.status(), 2);
  const Options& o = *options;
  k::SetThreads(o.threads);
  Arrays a = MakeArrays(o);
  if (o.cuda) {
#if defined(ZINF_HAVE_CUDA_KERNELS)
    if (CudaDeviceCount() == 0) {
      return cli::Fail(kName, Status::Unavailable("--device cuda: " + CudaUnavailableReason()));
    }
    std::fprintf(stderr, "bench attention: B %d, T %d, C %d, %d heads on GPU 0\n", o.B, o.T, o.C, o.NH);
    auto j = RunCuda(o, a);
    if (!j.ok()) return cli::Fail(kName, j.status());
    HtmlReport report("zinf bench attention on GPU 0");
    report.AddParagraph(j->dump(2));
    if (Status st = EmitResult(j->dump(2), o.json_path, o.html_path, report); !st.ok()) return cli::Fail(kName, st);
    return 0;
#else
    return cli::Fail(kName, Status::Unavailable("--device cuda: this build has no CUDA kernels"));
#endif
  }
  std::fprintf(stderr, "bench attention: B %d, T %d, C %d, %d heads, %d threads%s\n", o.B, o.T, o.C, o.NH, k::Threads(),
               o.unfused ? ", with the unfused kernels (B*NH*T*T probabilities)" : "");
  double checked = 0;
  if (o.unfused) {
    auto c = Check(o, a);
    if (!c.ok()) return cli::Fail(kName, c.status());
    checked = *c;
  } else {
    RunFused(o, a, nullptr);  // warm-up
  }
  RunMatmul(o, a, nullptr);
  Timings t;
  for (int64_t r = 0; r < o.runs; ++r) {  // in turns, the order rotating
    for (int i = 0; i < 3; ++i) {
      switch ((r + i) % 3) {
        case 0: RunFused(o, a, &t); break;
        case 1: RunMatmul(o, a, &t); break;
        default:
          if (o.unfused) RunUnfused(o, a, &t);
      }
    }
  }
  const Summary s = Summarize(o, t);
  const nlohmann::ordered_json j = ToJson(o, t, s, checked);
  HtmlReport report = MakeReport(o, j, t, s);
  if (Status st = EmitResult(j.dump(2), o.json_path, o.html_path, report); !st.ok()) return cli::Fail(kName, st);
  return 0;
}

ZINF_COMMAND({"bench attention", "time the host's fused attention against the CPU matmul's rate on the same threads",
              "bench attention [--batch B (4)] [--seq-len T (1024)] [--embd C (768)] [--heads NH (12)]\n"
              "                [--window W (0: none)] [--softcap S (0: none)] [--runs R (5)] [--threads N]\n"
              "                [--no-unfused]\n"
              "                [--device host|cuda] [--inner K (20)] [--html OUT.html] [--json OUT.json]\n"
              "  Times R runs of the fused attention's forward and backward (kernels::cpu) and, in turns,\n"
              "  of the matmul [B*T, C] x [C, C] and of the unfused kernels; prints JSON with the medians:\n"
              "  forward_gflops and backward_gflops over the causal pairs (2 and 5 products; with\n"
              "  --window W a sliding window: each query sees its W latest keys, itself included; --softcap\n"
              "  S caps the scores by S tanh(s / S), Gemma 2's), the\n"
              "  matmul's, their ratios, the speedups over the unfused kernels. The fused outputs are\n"
              "  checked against the unfused ones first. --no-unfused skips them (their B*NH*T*T\n"
              "  probabilities take 8*B*NH*T*T bytes). --device cuda: the GPU's fused bf16 kernel against\n"
              "  the bf16 tensor-core matmul (tflops), K launches a timing, checked against the host first.",
              Run});

}  // namespace
}  // namespace zinf::perf
