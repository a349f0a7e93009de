// Each CUDA kernel against its CPU reference (kernels::cpu::*<float>) on
// random inputs. Backward kernels start from random gradients, so the tests
// check that they accumulate (+=) rather than overwrite.
//
// Tolerances: |gpu - cpu| <= atol + rtol * |cpu| per element. Elementwise
// kernels with one rounding (casts, encoder forward, residual) must match
// exactly; kernels whose sums run in a different order (the CPU uses double
// accumulators, the GPU float) get rtol 1e-5..1e-4 and an atol scaled to the
// magnitudes involved; the numbers are stated at each check.
//
// Skips (with the reason) without a GPU, and compiles to one skipping test
// in builds without CUDA kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/half.h"
#include "device/cuda_device.h"
#include "device/device.h"
#include "kernels/cpu_kernels.h"

#if defined(ZINF_HAVE_CUDA_KERNELS)
#include "kernels/cuda_kernels.h"

namespace zinf::kernels {
namespace {

namespace gpu = kernels::cuda;

std::vector<float> Uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> Tokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Element-wise |got - want| <= atol + rtol * |want|; reports the count of
// failures, the first few and the largest error.
::testing::AssertionResult Near(const std::vector<float>& got, const std::vector<float>& want, double atol,
                                double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  size_t bad = 0;
  double worst = 0.0;
  size_t worst_i = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double lim = atol + rtol * std::fabs(static_cast<double>(want[i]));
    if (!(err <= lim)) {  // NaN fails too
      if (bad < 5) first += " [" + std::to_string(i) + "] " + std::to_string(got[i]) + " vs " + std::to_string(want[i]);
      ++bad;
    }
    if (err > worst || std::isnan(err)) {
      worst = err;
      worst_i = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements off (atol " << atol << ", rtol "
                                       << rtol << "); worst error " << worst << " at " << worst_i << ";" << first;
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU: " << CudaUnavailableReason();
    auto device = CreateCudaDevice(0, 0);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(device).value();
    auto stream = device_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    stream_ = std::move(stream).value();
    auto blas = gpu::CudaBlas::Create(stream_->native_handle());
    ASSERT_TRUE(blas.ok()) << blas.status().ToString();
    blas_ = std::move(blas).value();
  }
  void TearDown() override {
    if (device_ == nullptr) return;
    blas_.reset();
    for (void* p : buffers_) device_->Free(p);
    stream_.reset();
  }

  void* s() { return stream_->native_handle(); }

  // A device copy of `host` (freed in TearDown).
  template <typename T>
  T* Up(const std::vector<T>& host) {
    return static_cast<T*>(UpBytes(host.data(), host.size() * sizeof(T)));
  }
  void* UpBytes(const void* host, size_t bytes) {
    auto p = device_->Allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return nullptr;
    buffers_.push_back(*p);
    EXPECT_TRUE(stream_->CopyAsync(*p, host, bytes, CopyDirection::kHostToDevice).ok());
    EXPECT_TRUE(stream_->Synchronize().ok());
    return *p;
  }
  template <typename T>
  T* Alloc(size_t n) {
    return Up(std::vector<T>(n, T(0)));
  }
  // Waits for the stream and copies `n` elements back.
  template <typename T>
  std::vector<T> Down(const T* dev, size_t n) {
    std::vector<T> host(n);
    EXPECT_TRUE(stream_->Synchronize().ok());
    EXPECT_TRUE(stream_->CopyAsync(host.data(), dev, n * sizeof(T), CopyDirection::kDeviceToHost).ok());
    Status st = stream_->Synchronize();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return host;
  }

  // The GPU's RMSNorm forward and backward against the CPU's on N rows of C.
  void RmsNormForwardAndBackward(int64_t N, int C);

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<gpu::CudaBlas> blas_;
  std::vector<void*> buffers_;
};

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    ::zinf::Status st_ = (expr);                              \
    ASSERT_TRUE(st_.ok()) << #expr << ": " << st_.ToString(); \
  } while (0)

TEST_F(CudaKernelsTest, ZeroClearsExactlyN) {
  const int64_t n = 1000;
  std::vector<float> h = Uniform(n + 7, 1.0f, 2.0f, 1);
  float* d = Up(h);
  ASSERT_OK(gpu::Zero(d, n, s()));
  std::vector<float> got = Down(d, n + 7);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 0.0f) << i;
  for (int64_t i = n; i < n + 7; ++i) ASSERT_EQ(got[i], h[i]) << "past n: " << i;
}

TEST_F(CudaKernelsTest, CastInMatchesCpuExactly) {
  const int64_t n = 5003;
  std::mt19937 rng(2);
  // f32 and f64 from random values.
  std::vector<float> f32 = Uniform(n, -100.0f, 100.0f, 3);
  std::vector<double> f64(n);
  for (int64_t i = 0; i < n; ++i) f64[i] = static_cast<double>(f32[i]) * 1.000000123;
  // f16: every finite bit pattern class (exponent 0..30: subnormals included).
  std::vector<uint16_t> f16(n), bf16(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t r = rng();
    f16[i] = static_cast<uint16_t>((r & 0x8000u) | (((r >> 16) % 31u) << 10) | (r & 0x3ffu));
    uint32_t bits;
    std::memcpy(&bits, &f32[i], 4);
    bf16[i] = static_cast<uint16_t>(bits >> 16);
  }
  struct Case {
    ElementType type;
    const void* host;
  } cases[] = {{ElementType::kF32, f32.data()},
               {ElementType::kF16, f16.data()},
               {ElementType::kBf16, bf16.data()},
               {ElementType::kF64, f64.data()}};
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.type));
    const void* src = UpBytes(c.host, static_cast<size_t>(n) * ElementSizeBytes(c.type));
    float* out = Alloc<float>(n);
    ASSERT_OK(gpu::CastIn(out, src, c.type, n, s()));
    std::vector<float> want(n);
    cpu::CastIn<float>(want.data(), c.host, c.type, n);
    EXPECT_TRUE(Near(Down(out, n), want, 0.0, 0.0));
  }
}

TEST_F(CudaKernelsTest, EncoderForwardAndBackward) {
  const int B = 3, T = 19, C = 70, V = 11;  // few tokens: many repeats in dwte
  const int64_t N = static_cast<int64_t>(B) * T;
  std::vector<int32_t> tokens = Tokens(N, V, 4);
  std::vector<float> wte = Uniform(static_cast<size_t>(V) * C, -1, 1, 5),
                     wpe = Uniform(static_cast<size_t>(T) * C, -1, 1, 6);
  std::vector<float> want(N * C);
  cpu::EncoderForward<float>(want.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  int32_t* d_tokens = Up(tokens);
  float* out = Alloc<float>(N * C);
  ASSERT_OK(gpu::EncoderForward(out, d_tokens, Up(wte), Up(wpe), B, T, C, s()));
  EXPECT_TRUE(Near(Down(out, N * C), want, 0.0, 0.0)) << "one addition: exact";

  std::vector<float> dout = Uniform(N * C, -1, 1, 7);
  std::vector<float> dwte = Uniform(wte.size(), -1, 1, 8), dwpe = Uniform(wpe.size(), -1, 1, 9);
  float* d_dwte = Up(dwte);
  float* d_dwpe = Up(dwpe);
  cpu::EncoderBackward<float>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  ASSERT_OK(gpu::EncoderBackward(d_dwte, d_dwpe, Up(dout), d_tokens, B, T, C, -1, s()));
  // Sums of <= N terms of magnitude 1 in a possibly different order.
  EXPECT_TRUE(Near(Down(d_dwte, dwte.size()), dwte, 1e-5, 1e-5));
  EXPECT_TRUE(Near(Down(d_dwpe, dwpe.size()), dwpe, 1e-5, 1e-5));
}

TEST_F(CudaKernelsTest, EncoderBackwardLargeVocabulary) {
  // More vocabulary rows than the kernel's row groups, C past one block.
  const int B = 4, T = 64, C = 200, V = 1000;
  const int64_t N = static_cast<int64_t>(B) * T;
  std::vector<int32_t> tokens = Tokens(N, V, 10);
  std::vector<float> dout = Uniform(N * C, -1, 1, 11);
  std::vector<float> dwte = Uniform(static_cast<size_t>(V) * C, -1, 1, 12);
  std::vector<float> dwpe = Uniform(static_cast<size_t>(T) * C, -1, 1, 13);
  float* d_dwte = Up(dwte);
  float* d_dwpe = Up(dwpe);
  // A padding token's row gets nothing.
  const int32_t pad = tokens[5];
  const std::vector<float> dwte0 = dwte;
  cpu::EncoderBackward<float>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, pad);
  ASSERT_OK(gpu::EncoderBackward(d_dwte, d_dwpe, Up(dout), Up(tokens), B, T, C, pad, s()));
  const std::vector<float> got = Down(d_dwte, dwte.size());
  for (int c = 0; c < C; ++c) ASSERT_EQ(got[int64_t{pad} * C + c], dwte0[int64_t{pad} * C + c]) << c;
  // dwpe: sums of B terms; dwte: of ~N/V (up to ~10) terms.
  EXPECT_TRUE(Near(Down(d_dwte, dwte.size()), dwte, 2e-5, 1e-5));
  EXPECT_TRUE(Near(Down(d_dwpe, dwpe.size()), dwpe, 1e-5, 1e-5));
}

TEST_F(CudaKernelsTest, LayerNormForwardAndBackward) {
  for (auto [N, C] : std::vector<std::pair<int64_t, int>>{{37, 70}, {64, 768}, {5, 3}}) {
    SCOPED_TRACE("N " + std::to_string(N) + " C " + std::to_string(C));
    std::vector<float> inp = Uniform(N * C, -2, 3, 20), w = Uniform(C, 0.5, 1.5, 21), b = Uniform(C, -1, 1, 22);
    std::vector<float> out(N * C), mean(N), rstd(N);
    cpu::LayerNormForward<float>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    float* d_inp = Up(inp);
    float* d_w = Up(w);
    float* d_out = Alloc<float>(N * C);
    float* d_mean = Alloc<float>(N);
    float* d_rstd = Alloc<float>(N);
    ASSERT_OK(gpu::LayerNormForward(d_out, d_mean, d_rstd, d_inp, d_w, Up(b), N, C, s()));
    // Normalized values of magnitude ~2: float rounding of mean and variance.
    EXPECT_TRUE(Near(Down(d_out, N * C), out, 2e-5, 1e-5));
    EXPECT_TRUE(Near(Down(d_mean, N), mean, 1e-6, 1e-5));
    EXPECT_TRUE(Near(Down(d_rstd, N), rstd, 0.0, 2e-5));

    // Backward from the CPU's saved statistics (so only the backward is tested).
    std::vector<float> dout = Uniform(N * C, -1, 1, 23);
    std::vector<float> dinp = Uniform(N * C, -1, 1, 24), dw = Uniform(C, -1, 1, 25), db = Uniform(C, -1, 1, 26);
    float* d_dinp = Up(dinp);
    float* d_dw = Up(dw);
    float* d_db = Up(db);
    ASSERT_OK(gpu::LayerNormBackward(d_dinp, d_dw, d_db, Up(dout), d_inp, d_w, Up(mean), Up(rstd), N, C, s()));
    cpu::LayerNormBackward<float>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                                  rstd.data(), N, C);
    // dinp: rstd (~0.7) times terms of magnitude ~2; dweight/dbias: sums of N terms.
    EXPECT_TRUE(Near(Down(d_dinp, N * C), dinp, 2e-5, 1e-4));
    EXPECT_TRUE(Near(Down(d_dw, C), dw, 1e-5 * N, 1e-4));
    EXPECT_TRUE(Near(Down(d_db, C), db, 1e-5 * N, 1e-4));
  }
}

TEST_F(CudaKernelsTest, MatmulForwardAndBackward) {
  struct Shape {
    int64_t N;
    int C, OC;
    bool bias;
  };
  for (const Shape& sh :
       {Shape{33, 65, 47, true}, Shape{33, 65, 47, false}, Shape{256, 256, 768, true}, Shape{1, 8, 3, true}}) {
    const int64_t N = sh.N;
    const int C = sh.C, OC = sh.OC;
    SCOPED_TRACE("N " + std::to_string(N) + " C " + std::to_string(C) + " OC " + std::to_string(OC) +
                 (sh.bias ? " bias" : " no bias"));
    std::vector<float> inp = Uniform(N * C, -1, 1, 30), w = Uniform(static_cast<size_t>(OC) * C, -1, 1, 31),
                       b = Uniform(OC, -1, 1, 32);
    std::vector<float> out(N * OC);
    cpu::MatmulForward<float>(out.data(), inp.data(), w.data(), sh.bias ? b.data() : nullptr, N, C, OC);
    float* d_inp = Up(inp);
    float* d_w = Up(w);
    float* d_out = Up(Uniform(N * OC, 5, 6, 33));  // garbage: forward overwrites
    ASSERT_OK(gpu::MatmulForward(*blas_, d_out, d_inp, d_w, sh.bias ? Up(b) : nullptr, N, C, OC));
    // Dot products of C terms in [-1, 1]: fp32 (no TF32) error ~ C * 6e-8.
    EXPECT_TRUE(Near(Down(d_out, N * OC), out, 1e-6 * C, 1e-5));

    std::vector<float> dout = Uniform(N * OC, -1, 1, 34);
    std::vector<float> dinp = Uniform(N * C, -1, 1, 35), dw = Uniform(w.size(), -1, 1, 36), db = Uniform(OC, -1, 1, 37);
    float* d_dinp = Up(dinp);
    float* d_dw = Up(dw);
    float* d_db = Up(db);
    ASSERT_OK(gpu::MatmulBackward(*blas_, d_dinp, d_dw, sh.bias ? d_db : nullptr, Up(dout), d_inp, d_w, N, C, OC));
    cpu::MatmulBackward<float>(dinp.data(), dw.data(), sh.bias ? db.data() : nullptr, dout.data(), inp.data(), w.data(),
                               N, C, OC);
    EXPECT_TRUE(Near(Down(d_dinp, N * C), dinp, 1e-6 * OC + 1e-6, 1e-5));
    EXPECT_TRUE(Near(Down(d_dw, dw.size()), dw, 1e-6 * N + 1e-6, 1e-5));
    EXPECT_TRUE(Near(Down(d_db, OC), db, 1e-6 * N + 1e-6, 1e-5)) << "without bias, dbias must stay untouched";
  }
}

TEST_F(CudaKernelsTest, MatmulWithTf32StaysClose) {
  auto tf32 = gpu::CudaBlas::Create(s(), /*allow_tf32=*/true);
  ASSERT_TRUE(tf32.ok()) << tf32.status().ToString();
  const int64_t N = 128;
  const int C = 256, OC = 192;
  std::vector<float> inp = Uniform(N * C, -1, 1, 40), w = Uniform(static_cast<size_t>(OC) * C, -1, 1, 41);
  std::vector<float> out(N * OC);
  cpu::MatmulForward<float>(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
  float* d_out = Alloc<float>(N * OC);
  ASSERT_OK(gpu::MatmulForward(**tf32, d_out, Up(inp), Up(w), nullptr, N, C, OC));
  // TF32 keeps 10 mantissa bits: ~1e-3 relative per product.
  EXPECT_TRUE(Near(Down(d_out, N * OC), out, 2e-3 * std::sqrt(static_cast<double>(C)) * 2, 0.0));
}

TEST_F(CudaKernelsTest, AttentionForwardAndBackward) {
  struct Shape {
    int B, T, C, NH;
    int window = 0;
    float softcap = 0;
    bool sinks = false;  // GPT-OSS's sink logits
  };
  // Then two cap the scores (Gemma 2's softcap, well inside their range);
  // the last two have sinks.
  for (const Shape& sh :
       {Shape{2, 17, 48, 3}, Shape{1, 64, 64, 4}, Shape{2, 1, 8, 2}, Shape{1, 40, 32, 1}, Shape{2, 40, 32, 2, 7},
        Shape{1, 70, 16, 1, 33}, Shape{2, 17, 48, 3, 0, 0.5f}, Shape{2, 40, 32, 2, 7, 0.3f},
        Shape{2, 17, 48, 3, 0, 0, true}, Shape{2, 40, 32, 2, 7, 0.3f, true}}) {
    const int B = sh.B, T = sh.T, C = sh.C, NH = sh.NH, W = sh.window;
    const float cap = sh.softcap;
    SCOPED_TRACE("B " + std::to_string(B) + " T " + std::to_string(T) + " C " + std::to_string(C) + " NH " +
                 std::to_string(NH) + " window " + std::to_string(W) + " softcap " + std::to_string(cap) +
                 (sh.sinks ? " sinks" : ""));
    const int64_t N = static_cast<int64_t>(B) * T;
    const int64_t att_n = static_cast<int64_t>(B) * NH * T * T;
    std::vector<float> qkv = Uniform(N * 3 * C, -1, 1, 50);
    const std::vector<float> sinks = sh.sinks ? Uniform(NH, -1, 2, 56) : std::vector<float>();
    const float* cpu_sinks = sh.sinks ? sinks.data() : nullptr;
    float* d_sinks = sh.sinks ? Up(sinks) : nullptr;
    std::vector<float> out(N * C), att(att_n);
    cpu::AttentionForward<float>(out.data(), att.data(), qkv.data(), B, T, C, NH, W, cap, cpu_sinks);

    float* d_qkv = Up(qkv);
    float* d_out = Up(Uniform(N * C, 7, 8, 51));
    float* d_att = Up(Uniform(att_n, 7, 8, 52));  // garbage: the causal zeros must be written
    float* scratch = Up(Uniform(gpu::AttentionScratchElems(B, T, C, NH, cap), 9, 10, 53));
    ASSERT_OK(gpu::AttentionForward(*blas_, d_out, d_att, scratch, d_qkv, B, T, C, NH, W, cap, d_sinks));
    std::vector<float> got_att = Down(d_att, att_n);
    // Probabilities in [0, 1]: float softmax vs the CPU's.
    EXPECT_TRUE(Near(got_att, att, 1e-6, 1e-5));
    for (int64_t r = 0; r < static_cast<int64_t>(B) * NH * T; ++r) {
      const int t = static_cast<int>(r % T);
      for (int s2 = 0; s2 < T; ++s2) {
        if (s2 > t || (W > 0 && t - s2 >= W)) {
          ASSERT_EQ(got_att[r * T + s2], 0.0f) << "row " << r << " key " << s2;
        }
      }
    }
    // Outputs of magnitude <= 1: att's relative error (~1e-6) times sum |att v| <= 1, plus T roundings.
    EXPECT_TRUE(Near(Down(d_out, N * C), out, 3e-5, 1e-5));

    // Backward from the CPU's att (so only the backward is tested).
    std::vector<float> dout = Uniform(N * C, -1, 1, 54);
    std::vector<float> dqkv = Uniform(N * 3 * C, -1, 1, 55);
    float* d_dqkv = Up(dqkv);
    std::vector<float> dsinks(sinks.size(), 0.5f);
    float* d_dsinks = sh.sinks ? Up(dsinks) : nullptr;
    ASSERT_OK(gpu::AttentionBackward(*blas_, d_dqkv, scratch, Up(dout), d_qkv, Up(att), B, T, C, NH, W, cap, d_dsinks));
    std::vector<float> cpu_scratch(att_n);
    cpu::AttentionBackward<float>(dqkv.data(), cpu_scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH, W,
                                  cap, sh.sinks ? dsinks.data() : nullptr);
    // Sums over up to T keys and hs channels of terms of magnitude <= 1.
    EXPECT_TRUE(Near(Down(d_dqkv, N * 3 * C), dqkv, 1e-6 * (T + C / NH), 1e-4));
    // The sinks' gradient: B*T rows' terms of magnitude <= 1 each.
    if (sh.sinks) {
      EXPECT_TRUE(Near(Down(d_dsinks, NH), dsinks, 1e-6 * B * T, 1e-4));
    }
  }
}

TEST_F(CudaKernelsTest, GeluForwardAndBackward) {
  const int64_t n = 10007;
  std::vector<float> inp = Uniform(n, -6, 6, 60);
  std::vector<float> out(n);
  cpu::GeluForward<float>(out.data(), inp.data(), n);
  float* d_inp = Up(inp);
  float* d_out = Alloc<float>(n);
  ASSERT_OK(gpu::GeluForward(d_out, d_inp, n, s()));
  // tanhf on the device (<= 2 ulp) vs std::tanh on the host; for x << 0,
  // 1 + tanh cancels, so the error is absolute: ~ 0.5 |x| * 2 ulp(1) <= 1e-6.
  EXPECT_TRUE(Near(Down(d_out, n), out, 2e-6, 1e-5));

  std::vector<float> dout = Uniform(n, -1, 1, 61), dinp = Uniform(n, -1, 1, 62);
  float* d_dinp = Up(dinp);
  ASSERT_OK(gpu::GeluBackward(d_dinp, d_inp, Up(dout), n, s()));
  cpu::GeluBackward<float>(dinp.data(), inp.data(), dout.data(), n);
  // 1 - tanh^2 cancels at large |x| and is multiplied by 0.5 x du/dx (~14 at
  // |x| = 6): absolute error up to ~4e-6.
  EXPECT_TRUE(Near(Down(d_dinp, n), dinp, 1e-5, 1e-5));
}

TEST_F(CudaKernelsTest, ResidualAndAccumulateExact) {
  const int64_t n = 4099;
  std::vector<float> a = Uniform(n, -1, 1, 70), b = Uniform(n, -1, 1, 71);
  std::vector<float> sum(n);
  cpu::ResidualForward<float>(sum.data(), a.data(), b.data(), n);
  float* d_a = Up(a);
  float* d_b = Up(b);
  float* d_out = Alloc<float>(n);
  ASSERT_OK(gpu::ResidualForward(d_out, d_a, d_b, n, s()));
  EXPECT_TRUE(Near(Down(d_out, n), sum, 0.0, 0.0));
  // out aliasing a.
  ASSERT_OK(gpu::ResidualForward(d_a, d_a, d_b, n, s()));
  EXPECT_TRUE(Near(Down(d_a, n), sum, 0.0, 0.0));

  std::vector<float> y = Uniform(n, -1, 1, 72);
  float* d_y = Up(y);
  cpu::Accumulate<float>(y.data(), b.data(), n);
  ASSERT_OK(gpu::Accumulate(d_y, d_b, n, s()));
  EXPECT_TRUE(Near(Down(d_y, n), y, 0.0, 0.0));
}

TEST_F(CudaKernelsTest, CrossEntropyForwardBackward) {
  struct Shape {
    int64_t N;
    int V, Vp;
  };
  for (const Shape& sh : {Shape{19, 257, 320}, Shape{4, 50257, 50304}, Shape{3, 5, 5}}) {
    const int64_t N = sh.N;
    const int V = sh.V, Vp = sh.Vp;
    SCOPED_TRACE("N " + std::to_string(N) + " V " + std::to_string(V) + " Vp " + std::to_string(Vp));
    std::vector<float> logits = Uniform(N * Vp, -4, 4, 80);
    std::vector<int32_t> targets = Tokens(N, V, 81);
    const float dloss = 1.0f / static_cast<float>(N);
    std::vector<float> losses(N);
    std::vector<float> dlogits = Uniform(N * Vp, -1, 1, 82);  // padding columns included
    const std::vector<float> dlogits_before = dlogits;
    float* d_logits = Up(logits);
    int32_t* d_targets = Up(targets);
    float* d_losses = Alloc<float>(N);
    float* d_dlogits = Up(dlogits);
    ASSERT_OK(gpu::CrossEntropyForwardBackward(d_losses, d_dlogits, d_logits, d_targets, N, V, Vp, dloss, s()));
    cpu::CrossEntropyForwardBackward<float>(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, Vp,
                                            dloss);
    // Losses ~ log V: float log-sum-exp over V terms.
    EXPECT_TRUE(Near(Down(d_losses, N), losses, 1e-5, 1e-5));
    std::vector<float> got = Down(d_dlogits, N * Vp);
    // Probabilities times dloss added to values of magnitude 1.
    EXPECT_TRUE(Near(got, dlogits, 1e-6, 1e-5));
    for (int64_t n = 0; n < N; ++n) {
      for (int v = V; v < Vp; ++v)
        ASSERT_EQ(got[n * Vp + v], dlogits_before[n * Vp + v]) << "padding " << n << "," << v;
    }

    // Forward only: no dlogits.
    float* d_losses2 = Alloc<float>(N);
    ASSERT_OK(gpu::CrossEntropyForwardBackward(d_losses2, nullptr, d_logits, d_targets, N, V, Vp, dloss, s()));
    EXPECT_TRUE(Near(Down(d_losses2, N), losses, 1e-5, 1e-5));
  }
}

TEST_F(CudaKernelsTest, BadSizesAreErrorsNotLaunches) {
  Status st = gpu::MatmulForward(*blas_, nullptr, nullptr, nullptr, nullptr, int64_t{1} << 32, 8, 8);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  st = gpu::CrossEntropyForwardBackward(nullptr, nullptr, nullptr, nullptr, 4, 10, 8, 1.0f, s());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  st = gpu::AttentionForward(*blas_, nullptr, nullptr, nullptr, nullptr, 1, 4, 10, 3, 0, 0.0f);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  st = gpu::AttentionForward(*blas_, nullptr, nullptr, nullptr, nullptr, 1, 4, 12, 3, 0, -1.0f);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  st = gpu::SoftcapForward(nullptr, 0.0f, 4, s());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  // Zero sizes enqueue nothing and succeed.
  EXPECT_TRUE(gpu::GeluForward(nullptr, nullptr, 0, s()).ok());
  EXPECT_TRUE(stream_->Synchronize().ok());
}

// ---- Llama family (cuda_decoder_kernels.cu) ----

// 67 rows of 96 (three column tiles), and 1000 rows of 24 (one partial
// tile: Qwen3's per-head norms are many short rows).
TEST_F(CudaKernelsTest, RmsNormForwardAndBackward) {
  for (const auto& [N, C] : {std::pair<int64_t, int>{67, 96}, std::pair<int64_t, int>{1000, 24}}) {
    SCOPED_TRACE(std::to_string(N) + " rows of " + std::to_string(C));
    RmsNormForwardAndBackward(N, C);
  }
}

void CudaKernelsTest::RmsNormForwardAndBackward(int64_t N, int C) {
  const auto inp = Uniform(N * C, -2.0f, 2.0f, 41), weight = Uniform(C, 0.5f, 1.5f, 42);
  const auto dout = Uniform(N * C, -1.0f, 1.0f, 43), dinp0 = Uniform(N * C, -1.0f, 1.0f, 44);
  const auto dw0 = Uniform(C, -1.0f, 1.0f, 45);
  std::vector<float> out(N * C), rstd(N), dinp = dinp0, dw = dw0;
  cpu::RmsNormForward(out.data(), rstd.data(), inp.data(), weight.data(), N, C, 1e-5);
  cpu::RmsNormBackward(dinp.data(), dw.data(), dout.data(), inp.data(), weight.data(), rstd.data(), N, C);
  float *d_out = Alloc<float>(N * C), *d_rstd = Alloc<float>(N), *d_inp = Up(inp), *d_w = Up(weight);
  float *d_dinp = Up(dinp0), *d_dw = Up(dw0), *d_dout = Up(dout);
  ASSERT_OK(gpu::RmsNormForward(d_out, d_rstd, d_inp, d_w, N, C, 1e-5, s()));
  EXPECT_TRUE(Near(Down(d_out, N * C), out, 1e-6, 1e-5));
  EXPECT_TRUE(Near(Down(d_rstd, N), rstd, 1e-7, 1e-5));
  ASSERT_OK(gpu::RmsNormBackward(d_dinp, d_dw, d_dout, d_inp, d_w, d_rstd, N, C, s()));
  EXPECT_TRUE(Near(Down(d_dinp, N * C), dinp, 1e-5, 1e-4));
  EXPECT_TRUE(Near(Down(d_dw, C), dw, 1e-4, 1e-4));  // sums over N rows
}

// Every column of a head rotated, 12 of 16 (a partial rotary factor of
// 0.75: the last 4 pass), and none (rot 0: a NoPE layer's backward); in
// both pair layouts.
TEST_F(CudaKernelsTest, RopeForwardAndBackward) {
  for (bool interleaved : {false, true}) {
    for (int rot : {16, 12, 0}) {
      SCOPED_TRACE("rot " + std::to_string(rot) + (interleaved ? " interleaved" : ""));
      const int B = 3, T = 7, NH = 4, hd = 16, half = rot / 2;
      const int64_t n = int64_t{B} * T * NH * hd;
      const auto x = Uniform(n, -1.0f, 1.0f, 51), dout = Uniform(n, -1.0f, 1.0f, 52), dx0 = Uniform(n, -1.f, 1.f, 53);
      const auto angle = Uniform(T * std::max(half, 1), -3.0f, 3.0f, 54);  // rot 0 reads none of it
      std::vector<float> cos(angle.size()), sin(angle.size());
      for (size_t i = 0; i < angle.size(); ++i) {
        cos[i] = std::cos(angle[i]);
        sin[i] = std::sin(angle[i]);
      }
      std::vector<float> out(n), dx = dx0;
      cpu::RopeForward(out.data(), x.data(), cos.data(), sin.data(), B, T, NH, hd, rot, interleaved);
      cpu::RopeBackward(dx.data(), dout.data(), cos.data(), sin.data(), B, T, NH, hd, rot, interleaved);
      float *d_x = Up(x), *d_out = Alloc<float>(n), *d_cos = Up(cos), *d_sin = Up(sin), *d_dx = Up(dx0);
      float* d_dout = Up(dout);
      ASSERT_OK(gpu::RopeForward(d_out, d_x, d_cos, d_sin, B, T, NH, hd, rot, interleaved, s()));
      EXPECT_TRUE(Near(Down(d_out, n), out, 1e-6, 1e-6));
      ASSERT_OK(gpu::RopeForward(d_x, d_x, d_cos, d_sin, B, T, NH, hd, rot, interleaved, s()));  // in place
      EXPECT_TRUE(Near(Down(d_x, n), out, 1e-6, 1e-6));
      ASSERT_OK(gpu::RopeBackward(d_dx, d_dout, d_cos, d_sin, B, T, NH, hd, rot, interleaved, s()));
      EXPECT_TRUE(Near(Down(d_dx, n), dx, 1e-6, 1e-6));
    }
  }
}

TEST_F(CudaKernelsTest, GluForwardAndBackward) {
  for (Glu glu : {Glu(Glu::kSilu), Glu(Glu::kGeluTanh), Glu::ClampedSwiglu(1.702f, 4.0f)}) {
    SCOPED_TRACE(static_cast<int>(glu.kind));  // the clamped SwiGLU's limit of 4 clamps some gates
    const int64_t n = 10007;
    const auto gate = Uniform(n, -6.0f, 6.0f, 61), up = Uniform(n, -2.0f, 2.0f, 62), dout = Uniform(n, -1.f, 1.f, 63);
    const auto dg0 = Uniform(n, -1.0f, 1.0f, 64), du0 = Uniform(n, -1.0f, 1.0f, 65);
    std::vector<float> out(n), dg = dg0, du = du0;
    cpu::GluForward(out.data(), gate.data(), up.data(), n, glu);
    cpu::GluBackward(dg.data(), du.data(), gate.data(), up.data(), dout.data(), n, glu);
    float *d_g = Up(gate), *d_u = Up(up), *d_out = Alloc<float>(n), *d_dout = Up(dout), *d_dg = Up(dg0),
          *d_du = Up(du0);
    ASSERT_OK(gpu::GluForward(d_out, d_g, d_u, n, glu, s()));
    EXPECT_TRUE(Near(Down(d_out, n), out, 1e-6, 1e-5));
    ASSERT_OK(gpu::GluBackward(d_dg, d_du, d_g, d_u, d_dout, n, glu, s()));
    EXPECT_TRUE(Near(Down(d_dg, n), dg, 1e-6, 1e-5));
    EXPECT_TRUE(Near(Down(d_du, n), du, 1e-6, 1e-5));
  }
}

// The routed MLP's kernels against the CPU's: the routing (fp32 here,
// double there: the same experts for logits apart by more than rounding),
// the gather and its adjoint, the combine and its adjoint (the dots by warp
// sums: within 1e-5).
TEST_F(CudaKernelsTest, MoeKernelsMatchCpu) {
  const int64_t N = 301;
  const int E = 7, K = 3, C = 70;
  const int64_t M = N * K;
  for (const bool normalize : {true, false}) {
    SCOPED_TRACE(normalize ? "normalized" : "softmax weights");
    const auto logits = Uniform(N * E, -4.0f, 4.0f, 91);
    std::vector<float> w(N * K), p(N * E);
    std::vector<int32_t> ex(N * K);
    const kernels::MoeRouting r{.E = E, .k = K, .normalize = normalize};
    cpu::MoeRouteForward(w.data(), ex.data(), p.data(), logits.data(), static_cast<const float*>(nullptr), N, r);
    float *d_w = Alloc<float>(N * K), *d_p = Up(logits);
    int32_t* d_ex = Alloc<int32_t>(N * K);
    ASSERT_OK(gpu::MoeRouteForward(d_w, d_ex, d_p, d_p, nullptr, N, r, s()));  // probabilities in place
    EXPECT_EQ(Down(d_ex, N * K), ex);
    EXPECT_TRUE(Near(Down(d_w, N * K), w, 1e-6, 1e-6));
    EXPECT_TRUE(Near(Down(d_p, N * E), p, 1e-6, 1e-6));
    const auto dw = Uniform(N * K, -1.0f, 1.0f, 92), dl0 = Uniform(N * E, -1.0f, 1.0f, 93);
    std::vector<float> dl = dl0;
    cpu::MoeRouteBackward(dl.data(), dw.data(), p.data(), ex.data(), static_cast<const float*>(nullptr), N, r);
    float* d_dl = Up(dl0);
    ASSERT_OK(gpu::MoeRouteBackward(d_dl, Up(dw), Up(p), Up(ex), nullptr, N, r, s()));
    EXPECT_TRUE(Near(Down(d_dl, N * E), dl, 1e-6, 1e-5));
    const auto dprobs = Uniform(E, -0.5f, 0.5f, 99);  // a load-balancing loss's
    std::vector<float> dl2 = dl0;
    cpu::MoeRouteBackward(dl2.data(), dw.data(), p.data(), ex.data(), dprobs.data(), N, r);
    float* d_dl2 = Up(dl0);
    ASSERT_OK(gpu::MoeRouteBackward(d_dl2, Up(dw), Up(p), Up(ex), Up(dprobs), N, r, s()));
    EXPECT_TRUE(Near(Down(d_dl2, N * E), dl2, 1e-6, 1e-5));

    std::vector<int32_t> rows(3 * M);
    std::vector<int64_t> offsets(E + 1);
    ASSERT_TRUE(
        cpu::MoeDispatch(ex.data(), N, K, E, rows.data(), rows.data() + M, rows.data() + 2 * M, offsets.data()));
    const int32_t* d_rows = Up(rows);
    const auto x = Uniform(N * C, -2.0f, 2.0f, 94), y = Uniform(M * C, -2.0f, 2.0f, 95);
    std::vector<float> xe(M * C), out(N * C);
    cpu::GatherRows(xe.data(), x.data(), rows.data(), M, C);
    float* d_xe = Alloc<float>(M * C);
    ASSERT_OK(gpu::GatherRows(d_xe, Up(x), d_rows, M, C, s()));
    EXPECT_EQ(Down(d_xe, M * C), xe);
    const auto dx0 = Uniform(N * C, -1.0f, 1.0f, 96);
    std::vector<float> dx = dx0;
    cpu::GatherRowsBackward(dx.data(), y.data(), rows.data() + 2 * M, N, K, C);
    float* d_dx = Up(dx0);
    ASSERT_OK(gpu::GatherRowsBackward(d_dx, Up(y), d_rows + 2 * M, N, K, C, s()));
    EXPECT_EQ(Down(d_dx, N * C), dx);  // the same sums in the same order
    cpu::MoeCombineForward(out.data(), y.data(), w.data(), rows.data() + 2 * M, rows.data() + M, N, K, C);
    float* d_out = Alloc<float>(N * C);
    ASSERT_OK(gpu::MoeCombineForward(d_out, Up(y), Up(w), d_rows + 2 * M, d_rows + M, N, K, C, s()));
    EXPECT_EQ(Down(d_out, N * C), out);  // products rounded, then summed in order
    const auto dout = Uniform(N * C, -1.0f, 1.0f, 97), dy0 = Uniform(M * C, -1.0f, 1.0f, 98);
    std::vector<float> dy = dy0, dwc = dw;
    cpu::MoeCombineBackward(dy.data(), dwc.data(), dout.data(), y.data(), w.data(), rows.data(), rows.data() + M, M, C);
    float *d_dy = Up(dy0), *d_dwc = Up(dw);
    ASSERT_OK(gpu::MoeCombineBackward(d_dy, d_dwc, Up(dout), Up(y), Up(w), d_rows, d_rows + M, M, C, s()));
    EXPECT_TRUE(Near(Down(d_dy, M * C), dy, 1e-6, 1e-6));
    EXPECT_TRUE(Near(Down(d_dwc, N * K), dwc, 1e-5, 1e-5));
  }
}

// The routers with a selection bias: the sigmoid one (DeepSeek-V3's,
// GLM-4.5's) with one group, four of which two are candidates, and 64 (the
// most: the mask's top bit) of which 8, normalized and scaled weights;
// ERNIE 4.5's softmax, normalized by at least norm_min (a floor far below
// the sum, and one above every sum); DeepSeek-V2's softmax in 8 groups
// scored by their best, 3 candidates. The same experts as the CPU's (scores
// apart by more than rounding), weights and gradients within fp32's
// rounding of double's.
TEST_F(CudaKernelsTest, GroupedAndBiasedRoutersMatchCpu) {
  const int64_t N = 64;  // few tokens: 128 scores apart by fp32's rounding at most rarely
  const int E = 128, K = 8;
  auto sigmoid = [&](int groups, int topk) {
    return kernels::MoeRouting{.E = E,
                               .k = K,
                               .normalize = true,
                               .scoring = kernels::MoeScoring::kSigmoid,
                               .groups = groups,
                               .topk_groups = topk,
                               .scale = 2.5};
  };
  auto softmax = [&](double norm_min) {
    return kernels::MoeRouting{.E = E, .k = K, .normalize = true, .norm_min = norm_min};
  };
  // DeepSeek-V2's: a softmax in groups scored by their best, unnormalized.
  const kernels::MoeRouting v2{.E = E, .k = K, .groups = 8, .topk_groups = 3, .group_best = 1, .scale = 1.5};
  for (const kernels::MoeRouting& r :
       {sigmoid(1, 1), sigmoid(4, 2), sigmoid(64, 8), softmax(1e-12), softmax(2.0), v2}) {
    SCOPED_TRACE(std::string(r.scoring == kernels::MoeScoring::kSigmoid ? "sigmoid" : "softmax") + ", groups " +
                 std::to_string(r.groups) + " by their best " + std::to_string(r.group_best) + ", norm_min " +
                 std::to_string(r.norm_min));
    const auto logits = Uniform(N * E, -4.0f, 4.0f, 120), bias = Uniform(E, -0.3f, 0.3f, 121);
    std::vector<float> w(N * K), p(N * E);
    std::vector<int32_t> ex(N * K);
    cpu::MoeRouteForward(w.data(), ex.data(), p.data(), logits.data(), bias.data(), N, r);
    float *d_w = Alloc<float>(N * K), *d_p = Up(logits);
    int32_t* d_ex = Alloc<int32_t>(N * K);
    ASSERT_OK(gpu::MoeRouteForward(d_w, d_ex, d_p, d_p, Up(bias), N, r, s()));
    EXPECT_EQ(Down(d_ex, N * K), ex);
    EXPECT_TRUE(Near(Down(d_w, N * K), w, 1e-6, 1e-6));
    EXPECT_TRUE(Near(Down(d_p, N * E), p, 1e-6, 1e-6));
    const auto dw = Uniform(N * K, -1.0f, 1.0f, 122), dl0 = Uniform(N * E, -1.0f, 1.0f, 123);
    std::vector<float> dl = dl0;
    cpu::MoeRouteBackward(dl.data(), dw.data(), p.data(), ex.data(), static_cast<const float*>(nullptr), N, r);
    float* d_dl = Up(dl0);
    ASSERT_OK(gpu::MoeRouteBackward(d_dl, Up(dw), Up(p), Up(ex), nullptr, N, r, s()));
    EXPECT_TRUE(Near(Down(d_dl, N * E), dl, 1e-6, 1e-5));
  }
  // Ties (equal logits, no bias): the lower group, then the lower expert.
  const kernels::MoeRouting r{.E = 8, .k = 2, .scoring = kernels::MoeScoring::kSigmoid, .groups = 4, .topk_groups = 2};
  const std::vector<float> logits(8, 0.5f);
  std::vector<float> w(2), p(8);
  std::vector<int32_t> ex(2);
  cpu::MoeRouteForward(w.data(), ex.data(), p.data(), logits.data(), static_cast<const float*>(nullptr), 1, r);
  EXPECT_EQ(ex, (std::vector<int32_t>{0, 1}));
  float *d_w = Alloc<float>(2), *d_p = Up(logits);
  int32_t* d_ex = Alloc<int32_t>(2);
  ASSERT_OK(gpu::MoeRouteForward(d_w, d_ex, d_p, d_p, nullptr, 1, r, s()));
  EXPECT_EQ(Down(d_ex, 2), ex);
}

// The shared expert's gate: expf's sigmoid against the CPU's in double
// (an ulp or two apart), then the same rounded products.
TEST_F(CudaKernelsTest, SigmoidGateMatchesCpu) {
  const int64_t N = 301;
  const int C = 67;
  const auto y = Uniform(N * C, -2.0f, 2.0f, 110), logit = Uniform(N, -6.0f, 6.0f, 111);
  const auto out0 = Uniform(N * C, -1.0f, 1.0f, 112), dout = Uniform(N * C, -1.0f, 1.0f, 113);
  std::vector<float> out = out0;
  cpu::SigmoidGateForward(out.data(), y.data(), logit.data(), N, C);
  float* d_out = Up(out0);
  ASSERT_OK(gpu::SigmoidGateForward(d_out, Up(y), Up(logit), N, C, s()));
  EXPECT_TRUE(Near(Down(d_out, N * C), out, 1e-6, 1e-6));
  const auto dy0 = Uniform(N * C, -1.0f, 1.0f, 114), dl0 = Uniform(N, -1.0f, 1.0f, 115);
  std::vector<float> dy = dy0, dl = dl0;
  cpu::SigmoidGateBackward(dy.data(), dl.data(), dout.data(), y.data(), logit.data(), N, C);
  float *d_dy = Up(dy0), *d_dl = Up(dl0);
  ASSERT_OK(gpu::SigmoidGateBackward(d_dy, d_dl, Up(dout), Up(y), Up(logit), N, C, s()));
  EXPECT_TRUE(Near(Down(d_dy, N * C), dy, 1e-6, 1e-6));
  EXPECT_TRUE(Near(Down(d_dl, N), dl, 1e-5, 1e-5));
}

TEST_F(CudaKernelsTest, ScaleMatchesCpu) {
  const int64_t n = 5003;
  const auto x = Uniform(n, -3.0f, 3.0f, 66);
  std::vector<float> want = x;
  cpu::Scale(want.data(), 33.941124f, n);
  float* d_x = Up(x);
  ASSERT_OK(gpu::Scale(d_x, 33.941124f, n, s()));
  EXPECT_EQ(Down(d_x, n), want);
}

// The logits' softcap: tanhf against the CPU's ExpFloat form, both within
// a few ulp of the cap; the backward from the same y (y / cap against y *
// (1 / cap): an ulp apart).
TEST_F(CudaKernelsTest, SoftcapMatchesCpu) {
  const int64_t n = 5003;
  const float cap = 30.0f;
  const auto x = Uniform(n, -120.0f, 120.0f, 67), dx = Uniform(n, -1.0f, 1.0f, 68);
  std::vector<float> want = x, want_dx = dx;
  cpu::SoftcapForward(want.data(), cap, n);
  cpu::SoftcapBackward(want_dx.data(), want.data(), cap, n);
  float* d_x = Up(x);
  ASSERT_OK(gpu::SoftcapForward(d_x, cap, n, s()));
  EXPECT_TRUE(Near(Down(d_x, n), want, 1e-6 * cap, 0.0));
  float* d_dx = Up(dx);
  ASSERT_OK(gpu::SoftcapBackward(d_dx, Up(want), cap, n, s()));
  EXPECT_TRUE(Near(Down(d_dx, n), want_dx, 1e-6, 1e-6));
}

TEST_F(CudaKernelsTest, GqaExpandForwardAndBackward) {
  const int64_t N = 37;
  const int NH = 8, NKV = 2, hd = 16, C = NH * hd, Ckv = NKV * hd;
  const auto q = Uniform(N * C, -1.f, 1.f, 71), k = Uniform(N * Ckv, -1.f, 1.f, 72),
             v = Uniform(N * Ckv, -1.f, 1.f, 73);
  const auto dqkv = Uniform(N * 3 * C, -1.f, 1.f, 74), dq0 = Uniform(N * C, -1.f, 1.f, 75);
  const auto dk0 = Uniform(N * Ckv, -1.f, 1.f, 76), dv0 = Uniform(N * Ckv, -1.f, 1.f, 77);
  std::vector<float> qkv(N * 3 * C), dq = dq0, dk = dk0, dv = dv0;
  cpu::GqaExpandForward(qkv.data(), q.data(), k.data(), v.data(), N, NH, NKV, hd);
  cpu::GqaExpandBackward(dq.data(), dk.data(), dv.data(), dqkv.data(), N, NH, NKV, hd);
  float *d_qkv = Alloc<float>(N * 3 * C), *d_q = Up(q), *d_k = Up(k), *d_v = Up(v), *d_dqkv = Up(dqkv);
  float *d_dq = Up(dq0), *d_dk = Up(dk0), *d_dv = Up(dv0);
  ASSERT_OK(gpu::GqaExpandForward(d_qkv, d_q, d_k, d_v, N, NH, NKV, hd, s()));
  EXPECT_TRUE(Near(Down(d_qkv, N * 3 * C), qkv, 0.0, 0.0));
  ASSERT_OK(gpu::GqaExpandBackward(d_dq, d_dk, d_dv, d_dqkv, N, NH, NKV, hd, s()));
  EXPECT_TRUE(Near(Down(d_dq, N * C), dq, 0.0, 0.0));
  EXPECT_TRUE(Near(Down(d_dk, N * Ckv), dk, 1e-6, 1e-6));
  EXPECT_TRUE(Near(Down(d_dv, N * Ckv), dv, 1e-6, 1e-6));
}

// Latent attention's head-column copies: a head's columns moved, one set
// repeated for every head, added on, and heads summed into one (in head
// order: the CPU's bits).
TEST_F(CudaKernelsTest, CopyHeadColumnsMatchesCpu) {
  const int64_t N = 29;
  const int H = 6, src_ld = 70, dst_ld = 64;
  const auto src = Uniform(N * src_ld, -1.f, 1.f, 81), dst0 = Uniform(N * dst_ld, -1.f, 1.f, 82);
  struct Case {
    int dst_off, dst_head, src_off, src_head, heads, width;
    bool accumulate;
  };
  for (const Case& c : {Case{3, 10, 1, 11, H, 7, false}, Case{0, 10, 60, 0, H, 4, false}, Case{2, 9, 5, 11, H, 9, true},
                        Case{1, 0, 4, 11, H, 5, true}, Case{0, 0, 2, 0, 1, 30, false}}) {
    SCOPED_TRACE(std::to_string(c.dst_head) + " " + std::to_string(c.src_head) + (c.accumulate ? " +=" : " ="));
    std::vector<float> want = dst0;
    cpu::CopyHeadColumns(want.data() + c.dst_off, dst_ld, c.dst_head, src.data() + c.src_off, src_ld, c.src_head, N,
                         c.heads, c.width, c.accumulate);
    float *d_dst = Up(dst0), *d_src = Up(src);
    ASSERT_OK(gpu::CopyHeadColumns(d_dst + c.dst_off, dst_ld, c.dst_head, d_src + c.src_off, src_ld, c.src_head, N,
                                   c.heads, c.width, c.accumulate, s()));
    EXPECT_TRUE(Near(Down(d_dst, N * dst_ld), want, 0.0, 0.0));
  }
  // Heads summed into one without accumulating: refused (the CPU checks).
  float *d_dst = Up(dst0), *d_src = Up(src);
  EXPECT_EQ(gpu::CopyHeadColumns(d_dst, dst_ld, 0, d_src, src_ld, 11, N, H, 5, false, s()).code(),
            StatusCode::kInvalidArgument);
}

// ---- 16-bit compute (cuda_gemm16.cu) -------------------------------------
//
// Reference: the operand rounded on the CPU (cpu::RoundTo16), then the CPU's
// 16-bit-weight matmuls. Every product of two 16-bit values is exact in
// fp32, so the GPU differs only in how its fp32 sums are ordered and
// rounded; tensor cores may add a group of products before rounding (or
// truncate while aligning them), so the bound is a little looser than the
// fp32 matmul's: atol 4e-6 * K (K terms in [-1, 1]) plus rtol 1e-4.
// Without the operand's rounding the error would be ~2^-9 * sqrt(K) per
// element, far outside it.

std::vector<uint16_t> To16(const std::vector<float>& x, ElementType type) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = type == ElementType::kBf16 ? FloatToBf16(x[i]) : FloatToHalf(x[i]);
  return out;
}

std::vector<float> Rounded(std::vector<float> x, ElementType type) {
  cpu::RoundTo16(x.data(), static_cast<int64_t>(x.size()), type);
  return x;
}

class CudaGemm16Test : public CudaKernelsTest {
 protected:
  void SetUp() override {
    CudaKernelsTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    void* workspace = Alloc<char>(static_cast<size_t>(gpu::kLtWorkspaceBytes));
    auto lt = gpu::CudaLt::Create(s(), workspace);
    ASSERT_TRUE(lt.ok()) << lt.status().ToString();
    lt_ = std::move(lt).value();
  }
  void TearDown() override {
    lt_.reset();
    CudaKernelsTest::TearDown();
  }
  void* Scratch(int64_t N, int C, int OC) {
    return Alloc<char>(static_cast<size_t>(gpu::Matmul16ScratchBytes(N, C, OC)));
  }

  // A device copy of `host` at an address `shift` elements past an
  // allocation (256-byte aligned): shift 1 leaves a 16-bit array 2-byte
  // aligned and an fp32 one 4-byte aligned, as tensors in the engine's flat
  // blocks may be.
  template <typename T>
  T* UpAt(const std::vector<T>& host, int shift) {
    std::vector<T> padded(static_cast<size_t>(shift), T(0));
    padded.insert(padded.end(), host.begin(), host.end());
    return Up(padded) + shift;
  }

  // Forward and backward of one shape against the CPU reference; `shift`
  // moves the weight and the results off their allocations' alignment.
  void CheckShape(ElementType type, int64_t N, int C, int OC, bool bias, uint32_t seed, int shift = 0) {
    SCOPED_TRACE(std::string(type == ElementType::kBf16 ? "bf16" : "f16") + " N " + std::to_string(N) + " C " +
                 std::to_string(C) + " OC " + std::to_string(OC) + (bias ? " bias" : "") + " shift " +
                 std::to_string(shift));
    std::vector<float> inp = Uniform(N * C, -1, 1, seed), w = Uniform(static_cast<size_t>(OC) * C, -1, 1, seed + 1),
                       b = Uniform(OC, -1, 1, seed + 2);
    const std::vector<uint16_t> w16 = To16(w, type);
    std::vector<float> want(N * OC);
    const std::vector<float> inp_r = Rounded(inp, type);
    cpu::MatmulForward16(want.data(), inp_r.data(), w16.data(), type, bias ? b.data() : nullptr, N, C, OC);
    float* d_inp = Up(inp);
    uint16_t* d_w = UpAt(w16, shift);
    float* d_out = UpAt(Uniform(N * OC, 5, 6, seed + 3), shift);  // overwritten
    float* d_b = bias ? Up(b) : nullptr;
    void* scratch = Scratch(N, C, OC);
    ASSERT_OK(gpu::MatmulForward16(*lt_, d_out, d_inp, d_w, type, d_b, N, C, OC, scratch));
    EXPECT_TRUE(Near(Down(d_out, N * OC), want, 4e-6 * C + 1e-6, 1e-4));

    std::vector<float> dout = Uniform(N * OC, -1, 1, seed + 4);
    std::vector<float> dinp = Uniform(N * C, -1, 1, seed + 5), dw = Uniform(w.size(), -1, 1, seed + 6),
                       db = Uniform(OC, -1, 1, seed + 7);
    float* d_dinp = UpAt(dinp, shift);
    float* d_dw = UpAt(dw, shift);
    float* d_db = Up(db);
    ASSERT_OK(gpu::MatmulBackward16(*lt_, d_dinp, d_dw, bias ? d_db : nullptr, Up(dout), d_inp, d_w, type, N, C, OC,
                                    scratch));
    // dbias sums the unrounded dout: the fp32 rule of MatmulBackward.
    std::vector<float> db_want = db;
    if (bias) {
      for (int64_t n = 0; n < N; ++n) {
        for (int o = 0; o < OC; ++o) db_want[o] += dout[n * OC + o];
      }
    }
    const std::vector<float> dout_r = Rounded(dout, type);
    cpu::MatmulBackward16(dinp.data(), dw.data(), nullptr, dout_r.data(), inp_r.data(), w16.data(), type, N, C, OC);
    EXPECT_TRUE(Near(Down(d_dinp, N * C), dinp, 4e-6 * OC + 1e-6, 1e-4)) << "dinp accumulates";
    EXPECT_TRUE(Near(Down(d_dw, dw.size()), dw, 4e-6 * N + 1e-6, 1e-4)) << "dweight accumulates";
    EXPECT_TRUE(Near(Down(d_db, OC), db_want, 1e-6 * N + 1e-6, 1e-5)) << "without bias, dbias must stay untouched";
  }

  std::unique_ptr<gpu::CudaLt> lt_;
};

TEST_F(CudaGemm16Test, CastTo16MatchesTheCpuBits) {
  // Ties both ways, the largest finite values, fp16 overflow and
  // subnormals, zeros of both signs, infinities, and random values.
  std::vector<float> x = {0.0f,  -0.0f, 1.0f,   1.00390625f, 1.01171875f, -3.140625f, 65504.0f,   65519.0f,    65520.0f,
                          1e-5f, 6e-8f, -1e-7f, 3.0e38f,     -INFINITY,   INFINITY,   1.0009766f, 0.33333334f, 1e-40f};
  const std::vector<float> r = Uniform(4096, -1000, 1000, 50);
  x.insert(x.end(), r.begin(), r.end());
  float* d_x = Up(x);
  for (ElementType type : {ElementType::kBf16, ElementType::kF16}) {
    SCOPED_TRACE(type == ElementType::kBf16 ? "bf16" : "f16");
    uint16_t* d_out = Alloc<uint16_t>(x.size());
    ASSERT_OK(gpu::CastTo16(d_out, d_x, type, static_cast<int64_t>(x.size()), s()));
    const std::vector<uint16_t> got = Down(d_out, x.size()), want = To16(x, type);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "element " << i << " = " << x[i];
    }
  }
}

TEST_F(CudaGemm16Test, Bf16MatmulsMatchTheRoundedCpuReference) {
  CheckShape(ElementType::kBf16, 256, 256, 768, true, 60);
  CheckShape(ElementType::kBf16, 128, 1024, 256, false, 61);
}

TEST_F(CudaGemm16Test, F16MatmulsMatchTheRoundedCpuReference) {
  CheckShape(ElementType::kF16, 256, 256, 768, true, 70);
  CheckShape(ElementType::kF16, 64, 128, 512, false, 71);
}

// Odd sizes leave the rows 2-byte aligned, and a shifted weight its start
// (a tensor in a flat block): the heuristic must be told so and still find
// an algorithm; the same shape at another alignment is a new cache entry.
TEST_F(CudaGemm16Test, OddShapesAndUnalignedPointers) {
  CheckShape(ElementType::kBf16, 33, 65, 47, true, 80);
  CheckShape(ElementType::kBf16, 1, 8, 3, true, 81);
  CheckShape(ElementType::kBf16, 64, 128, 256, true, 82, /*shift=*/1);
  CheckShape(ElementType::kBf16, 64, 128, 256, true, 83, /*shift=*/0);
  CheckShape(ElementType::kF16, 33, 65, 47, false, 84, /*shift=*/1);
}

TEST_F(CudaGemm16Test, SameBitsRunToRun) {
  const int64_t N = 128;
  const int C = 512, OC = 384;
  const std::vector<uint16_t> w16 = To16(Uniform(static_cast<size_t>(OC) * C, -1, 1, 90), ElementType::kBf16);
  float* d_inp = Up(Uniform(N * C, -1, 1, 91));
  uint16_t* d_w = Up(w16);
  void* scratch = Scratch(N, C, OC);
  std::vector<float> runs[2];
  for (auto& run : runs) {
    float* d_out = Alloc<float>(N * OC);
    ASSERT_OK(gpu::MatmulForward16(*lt_, d_out, d_inp, d_w, ElementType::kBf16, nullptr, N, C, OC, scratch));
    run = Down(d_out, N * OC);
  }
  EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0);
}

TEST_F(CudaGemm16Test, NonSixteenBitTypeIsAnError) {
  float* d = Alloc<float>(64);
  const Status st = gpu::MatmulForward16(*lt_, d, d, d, ElementType::kF32, nullptr, 8, 8, 8, Scratch(8, 8, 8));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_EQ(gpu::CastTo16(d, d, ElementType::kF64, 8, s()).code(), StatusCode::kInvalidArgument);
}

// ---- fused attention (16-bit mode) -----------------------------------------

// FlashAttentionForward/Backward against the CPU attention run on the
// operands the kernels round (q, k, v, dout to bf16). The kernels also round
// the probabilities (forward) and P and dS (backward) to bf16 before their
// matmuls, 2^-9 relative each, so outputs are compared against the largest
// reference magnitude of the same tensor: |gpu - cpu| <= 1.5e-2 * max |cpu|
// + 1e-3. flash_attention_tiling.py here, a numpy transliteration of the
// kernels' tiling (head sizes 16..128, T 1..1024, q, k, v in [-2, 2]),
// uses at most a fifth of that. The log-sum-exps are fp32 sums of the same
// bf16 products: 1e-4 + 1e-5 relative.
class CudaFlashAttentionTest : public CudaKernelsTest {
 protected:
  struct Shape {
    int B, T, C, NH;
    int window = 0;
    float softcap = 0;
  };

  // Columns [part * C, part * C + C) of each of the N rows of a [N, 3C] tensor.
  static std::vector<float> Part(const std::vector<float>& x, int64_t N, int C, int part) {
    std::vector<float> out(static_cast<size_t>(N) * C);
    for (int64_t n = 0; n < N; ++n) {
      std::memcpy(&out[n * C], &x[(n * 3 + part) * C], static_cast<size_t>(C) * sizeof(float));
    }
    return out;
  }
  static double MaxAbs(const std::vector<float>& x) {
    double m = 0.0;
    for (float v : x) m = std::max(m, std::fabs(static_cast<double>(v)));
    return m;
  }
  // got within 1.5e-2 * max |want| + 1e-3 of want, element by element.
  static ::testing::AssertionResult NearMax(const std::vector<float>& got, const std::vector<float>& want) {
    return Near(got, want, 1.5e-2 * MaxAbs(want) + 1e-3, 0.0);
  }

  void Check(const Shape& sh, uint32_t seed) {
    const int B = sh.B, T = sh.T, C = sh.C, NH = sh.NH, hs = C / NH, W = sh.window;
    const float cap = sh.softcap;
    SCOPED_TRACE("B " + std::to_string(B) + " T " + std::to_string(T) + " C " + std::to_string(C) + " NH " +
                 std::to_string(NH) + " window " + std::to_string(W) + " softcap " + std::to_string(cap));
    ASSERT_TRUE(gpu::FlashAttentionSupported(C, NH, 0)) << "head size " << hs;
    const int64_t N = static_cast<int64_t>(B) * T, rows = static_cast<int64_t>(B) * NH * T;
    const std::vector<float> qkv = Uniform(N * 3 * C, -2, 2, seed);
    const std::vector<float> qkv16 = Rounded(qkv, ElementType::kBf16);
    std::vector<float> out(N * C), att(rows * T);
    cpu::AttentionForward<float>(out.data(), att.data(), qkv16.data(), B, T, C, NH, W, cap);
    std::vector<float> lse(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const int t = static_cast<int>(r % T), h = static_cast<int>(r / T % NH);
      const int64_t b = r / T / NH;
      const float* q = &qkv16[((b * T + t) * 3) * C + h * hs];
      const int lo = W > 0 ? std::max(0, t - W + 1) : 0;  // the keys row r sees: lo .. t
      std::vector<double> s(t + 1 - lo);
      double mx = -INFINITY;
      for (int j = lo; j <= t; ++j) {
        const float* k = &qkv16[((b * T + j) * 3 + 1) * C + h * hs];
        double dot = 0.0;
        for (int i = 0; i < hs; ++i) dot += static_cast<double>(q[i]) * k[i];
        s[j - lo] = dot / std::sqrt(static_cast<double>(hs));
        if (cap > 0) s[j - lo] = cap * std::tanh(s[j - lo] / cap);
        mx = std::max(mx, s[j - lo]);
      }
      double sum = 0.0;
      for (double x : s) sum += std::exp(x - mx);
      lse[r] = static_cast<float>(mx + std::log(sum));
    }

    float* d_qkv = Up(qkv);
    float* d_out = Up(Uniform(N * C, 7, 8, seed + 1));  // garbage: every element must be written
    float* d_lse = Up(Uniform(rows, 7, 8, seed + 2));
    ASSERT_OK(gpu::FlashAttentionForward(d_out, d_lse, d_qkv, B, T, C, NH, W, cap, s()));
    EXPECT_TRUE(NearMax(Down(d_out, N * C), out));
    EXPECT_TRUE(Near(Down(d_lse, rows), lse, 1e-4, 1e-5));

    // Backward from the GPU's forward (its D reads that out), onto a random
    // dqkv: the kernels add.
    const std::vector<float> dout = Uniform(N * C, -1, 1, seed + 3);
    const std::vector<float> dqkv0 = Uniform(N * 3 * C, -1, 1, seed + 4);
    std::vector<float> want(N * 3 * C, 0.0f), cpu_scratch(att.size());
    cpu::AttentionBackward<float>(want.data(), cpu_scratch.data(), Rounded(dout, ElementType::kBf16).data(),
                                  qkv16.data(), att.data(), B, T, C, NH, W, cap);
    float* d_dout = Up(dout);
    float* d_scratch = Up(Uniform(gpu::FlashAttentionScratchElems(B, T, NH), 9, 10, seed + 5));
    std::vector<float> runs[2];
    for (auto& run : runs) {
      float* d_dqkv = Up(dqkv0);
      ASSERT_OK(gpu::FlashAttentionBackward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, W, cap, s()));
      run = Down(d_dqkv, N * 3 * C);
    }
    EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0) << "not the same bits";
    std::vector<float> got = runs[0];
    for (size_t i = 0; i < got.size(); ++i) got[i] -= dqkv0[i];
    for (int part = 0; part < 3; ++part) {
      SCOPED_TRACE(part == 0 ? "dq" : part == 1 ? "dk" : "dv");
      EXPECT_TRUE(NearMax(Part(got, N, C, part), Part(want, N, C, part)));
    }
  }
};

TEST_F(CudaFlashAttentionTest, HeadSize64AcrossTiles) {
  Check({2, 100, 128, 2}, 100);  // a partial second tile
  Check({1, 256, 256, 4}, 101);  // four full tiles
}

TEST_F(CudaFlashAttentionTest, HeadSizes16To128) {
  Check({2, 17, 64, 4}, 110);    // 16
  Check({1, 64, 96, 3}, 111);    // 32, one full tile
  Check({1, 130, 128, 1}, 112);  // 128, three tiles
}

TEST_F(CudaFlashAttentionTest, OnePositionAndALongSequence) {
  Check({3, 1, 64, 1}, 120);
  Check({1, 1024, 128, 2}, 121);  // the benchmarks' sequence length
}

TEST_F(CudaFlashAttentionTest, SlidingWindows) {
  Check({1, 150, 32, 2, 5}, 130);   // narrower than a tile: most key tiles skipped
  Check({2, 200, 64, 1, 70}, 131);  // wider than a tile
  Check({1, 1024, 128, 2, 256}, 132);
}

// Gemma 2's softcap (heads of 64, and of 128 as 27B's): scores capped at
// 1.5 and 0.7, where q, k in [-2, 2] give scores of several units.
TEST_F(CudaFlashAttentionTest, Softcap) {
  Check({2, 100, 128, 2, 0, 1.5f}, 140);
  Check({1, 200, 128, 1, 70, 0.7f}, 141);
}

TEST_F(CudaFlashAttentionTest, UnsupportedHeadSizeIsAnError) {
  EXPECT_FALSE(gpu::FlashAttentionSupported(48, 2, 0));  // 24
  EXPECT_FALSE(gpu::FlashAttentionSupported(48, 0, 0));
  float* d = Alloc<float>(64);
  const Status st = gpu::FlashAttentionForward(d, d, d, 1, 1, 48, 2, 0, 0.0f, s());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("head size 24"), std::string::npos) << st.ToString();
  EXPECT_EQ(gpu::FlashAttentionBackward(d, d, d, d, d, d, 1, 1, 48, 2, 0, 0.0f, s()).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf::kernels

#else  // !ZINF_HAVE_CUDA_KERNELS

TEST(CudaKernelsTest, NeedsCudaKernels) {
  GTEST_SKIP() << "this build has no CUDA kernels (the CUDA Toolkit was not found at configure time)";
}

#endif  // ZINF_HAVE_CUDA_KERNELS
