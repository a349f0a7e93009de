// The whole "tiny" GPT (and tiny as Qwen3's layer: q/k norms, GQA, heads
// wider than n_embd / n_head) on CudaOps against CpuOps<float>: one forward
// and backward of the same weights and batch on both, then the loss and
// every block's gradients compared.
//
// Tolerances: the two sides differ only in the order of float additions
// (cuBLAS vs the CPU's tiled matmul, double accumulators on the CPU), so
// the loss agrees to 1e-5 relative, and each gradient tensor to a relative
// L2 error of 1e-4 with no element further than 1e-3 of the tensor's
// largest magnitude.
//
// On the GPU alone: every layer's activations kept give the recompute's
// loss and gradients bit for bit (cuBLAS runs the same GEMMs the same way).
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

#include "device/cuda_device.h"
#include "device/device.h"
#include "model/gpt.h"
#include "model/ops.h"
#include "model/plan.h"

#if defined(ZINF_HAVE_CUDA_KERNELS)

namespace zinf::model {
namespace {

// One side of the comparison: a device, its Ops, the model's parameters and
// zeroed gradients in that device's memory (block, then tensor, spec order).
class Side {
 public:
  Side(Device* device, std::unique_ptr<Ops<float>> ops) : device_(device), ops_(std::move(ops)) {}
  ~Side() {
    for (void* p : buffers_) device_->Free(p);
  }

  Ops<float>& ops() { return *ops_; }

  // Uploads `weights` (InitBlockWeights per block) and zeroes same-shaped gradients.
  void Load(const std::vector<std::vector<std::vector<float>>>& weights) {
    params_.assign(weights.size(), {});
    grads_.assign(weights.size(), {});
    for (size_t b = 0; b < weights.size(); ++b) {
      for (const std::vector<float>& w : weights[b]) {
        float* p = Alloc(w.size());
        float* g = Alloc(w.size());
        ops_->CopyToDevice(p, w.data(), w.size() * sizeof(float));
        ops_->Zero(g, static_cast<int64_t>(w.size()));
        params_[b].push_back(p);
        grads_[b].push_back(g);
      }
    }
  }

  std::vector<const float*> params(size_t block) const {
    return std::vector<const float*>(params_[block].begin(), params_[block].end());
  }
  const std::vector<float*>& grads(size_t block) const { return grads_[block]; }

  std::vector<float> Download(const float* p, size_t n) {
    std::vector<float> host(n);
    ops_->CopyToHost(host.data(), p, n * sizeof(float));
    return host;
  }

 private:
  float* Alloc(size_t n) {
    auto p = device_->Allocate(n * sizeof(float));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return nullptr;
    buffers_.push_back(*p);
    return static_cast<float*>(*p);
  }

  Device* device_;
  std::unique_ptr<Ops<float>> ops_;
  std::vector<std::vector<float*>> params_, grads_;
  std::vector<void*> buffers_;
};

// Forward and backward of one micro-batch; returns the loss (NaN on error,
// with a test failure recorded).
double Step(const GptConfig& cfg, int batch, Side& side, Device* device, const std::vector<int32_t>& inputs,
            const std::vector<int32_t>& targets, LayerActivations activations = LayerActivations::kRecompute) {
  auto created = GptCompute<float>::Create(cfg, batch, &side.ops(), device, activations);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  if (!created.ok()) return NAN;
  GptCompute<float>& gpt = **created;
  const BlockId head = HeadBlock(cfg);
  Status st = gpt.SetBatch(inputs.data(), targets.data());
  EXPECT_TRUE(st.ok()) << st.ToString();
  st = gpt.EmbedForward(side.params(kEmbedBlock));
  EXPECT_TRUE(st.ok()) << st.ToString();
  for (int l = 0; l < cfg.n_layer; ++l) {
    st = gpt.LayerForward(l, side.params(LayerBlock(l)));
    EXPECT_TRUE(st.ok()) << "layer " << l << ": " << st.ToString();
  }
  GptCompute<float>::HeadGrads head_grads;
  head_grads.head = side.grads(head);
  const float* lm_head;
  if (cfg.tied_embeddings) {
    head_grads.lm_head = side.grads(kEmbedBlock)[kWte];
    lm_head = side.params(kEmbedBlock)[kWte];
  } else {
    head_grads.lm_head = side.grads(head)[kLmHead];
    lm_head = side.params(head)[kLmHead];
  }
  auto loss = gpt.HeadForward(side.params(head), lm_head, &head_grads, 1.0);
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  for (int l = cfg.n_layer - 1; l >= 0; --l) {
    st = gpt.LayerBackward(l, side.params(LayerBlock(l)), side.grads(LayerBlock(l)));
    EXPECT_TRUE(st.ok()) << "layer " << l << ": " << st.ToString();
  }
  st = gpt.EmbedBackward(side.grads(kEmbedBlock));
  EXPECT_TRUE(st.ok()) << st.ToString();
  st = side.ops().Synchronize();
  EXPECT_TRUE(st.ok()) << st.ToString();
  return loss.ok() ? *loss : NAN;
}

::testing::AssertionResult GradsAgree(const std::vector<float>& got, const std::vector<float>& want) {
  double diff2 = 0, norm2 = 0, max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff2 += d * d;
    norm2 += static_cast<double>(want[i]) * want[i];
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
    max_diff = std::max(max_diff, std::fabs(d));
    if (std::isnan(got[i])) return ::testing::AssertionFailure() << "NaN at " << i;
  }
  if (norm2 == 0) return ::testing::AssertionFailure() << "the CPU gradient is all zero (nothing compared)";
  const double rel_l2 = std::sqrt(diff2 / norm2);
  if (rel_l2 <= 1e-4 && max_diff <= 1e-3 * max_ref) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative L2 error " << rel_l2 << " (limit 1e-4), max |diff| " << max_diff
                                       << " vs max |cpu| " << max_ref << " (limit 1e-3 of it)";
}

// The tiny model, tied or not.
GptConfig TinyConfig(bool tied) {
  auto cfg_or = LoadGptConfig("tiny");
  EXPECT_TRUE(cfg_or.ok()) << cfg_or.status().ToString();
  GptConfig cfg = *cfg_or;
  cfg.tied_embeddings = tied;
  return cfg;
}

// tiny as Qwen3's layer: GQA (4 heads, 2 key/value heads), q/k norms,
// heads of 16 (q and the attention output 64 wide against n_embd 32).
GptConfig TinyQwen3Config() {
  GptConfig cfg = TinyConfig(/*tied=*/false);
  cfg.family = ModelFamily::kLlama;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.intermediate_size = 40;
  cfg.qk_norm = true;
  cfg.head_size = 16;
  return cfg;
}

// A model's seeded weights and one batch of 2 sequences.
struct TinyCase {
  GptConfig cfg;
  int batch = 2;
  std::vector<std::vector<std::vector<float>>> weights;
  std::vector<int32_t> inputs, targets;
};

TinyCase MakeTinyCase(const GptConfig& cfg) {
  TinyCase c;
  c.cfg = cfg;
  for (BlockId b = 0; b <= HeadBlock(c.cfg); ++b) c.weights.push_back(InitBlockWeights(c.cfg, b, /*seed=*/1234));
  std::mt19937 rng(99);
  // A sigmoid router's selection bias starts at 0: give it values that
  // move the choice (the device reads it as a parameter like the others).
  const std::vector<BlockSpec> specs = GptBlockSpecs(c.cfg);
  std::uniform_real_distribution<float> bias(-0.3f, 0.3f);
  for (size_t b = 0; b < specs.size(); ++b) {
    for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
      if (!IsFrozenTensor(specs[b].tensors[t])) continue;
      for (float& v : c.weights[b][t]) v = bias(rng);
    }
  }
  std::uniform_int_distribution<int32_t> tok(0, c.cfg.vocab_size - 1);
  const size_t n_tokens = static_cast<size_t>(c.batch) * c.cfg.seq_len;
  c.inputs.resize(n_tokens);
  c.targets.resize(n_tokens);
  for (auto& t : c.inputs) t = tok(rng);
  for (auto& t : c.targets) t = tok(rng);
  return c;
}

void CompareTinyModel(const GptConfig& model) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU: " << CudaUnavailableReason();
  const TinyCase c = MakeTinyCase(model);
  const GptConfig& cfg = c.cfg;
  const int batch = c.batch;
  const auto& weights = c.weights;
  const auto& inputs = c.inputs;
  const auto& targets = c.targets;

  std::unique_ptr<Device> host = CreateHostDevice(0);
  Side cpu(host.get(), CreateCpuOps<float>());
  auto cuda_device = CreateCudaDevice(0, 0);
  ASSERT_TRUE(cuda_device.ok()) << cuda_device.status().ToString();
  auto cuda_ops = CreateOps(**cuda_device);
  ASSERT_TRUE(cuda_ops.ok()) << cuda_ops.status().ToString();
  ASSERT_EQ((*cuda_ops)->name(), "cuda-f32");
  {
    Side gpu(cuda_device->get(), std::move(cuda_ops).value());
    cpu.Load(weights);
    gpu.Load(weights);

    const double cpu_loss = Step(cfg, batch, cpu, host.get(), inputs, targets);
    const double gpu_loss = Step(cfg, batch, gpu, cuda_device->get(), inputs, targets);
    ASSERT_TRUE(std::isfinite(cpu_loss));
    // Near log(vocab) for fresh weights; 1e-5 relative.
    EXPECT_NEAR(gpu_loss, cpu_loss, 1e-5 * std::fabs(cpu_loss));

    const std::vector<BlockSpec> specs = GptBlockSpecs(cfg);
    ASSERT_EQ(specs.size(), weights.size());
    for (size_t b = 0; b < specs.size(); ++b) {
      for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
        const size_t n = weights[b][t].size();
        std::vector<float> want = cpu.Download(cpu.grads(b)[t], n);
        std::vector<float> got = gpu.Download(gpu.grads(b)[t], n);
        EXPECT_TRUE(GradsAgree(got, want)) << specs[b].name << "." << specs[b].tensors[t].name;
      }
    }
    Status st = gpu.ops().Synchronize();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }  // the CUDA side is freed before its device
}

TEST(GptCudaTest, TinyModelTiedMatchesCpu) { CompareTinyModel(TinyConfig(/*tied=*/true)); }
TEST(GptCudaTest, TinyModelUntiedMatchesCpu) { CompareTinyModel(TinyConfig(/*tied=*/false)); }
TEST(GptCudaTest, TinyQwen3MatchesCpu) { CompareTinyModel(TinyQwen3Config()); }
// SmolLM3's NoPE layers: the last layer without RoPE (its backward passes
// the gradient through the rotation kernel with no column turned).
TEST(GptCudaTest, NopeLayerMatchesCpu) {
  GptConfig cfg = TinyQwen3Config();
  cfg.no_rope_layers = {cfg.n_layer - 1};
  CompareTinyModel(cfg);
}

// A sliding window in the first layer only, shorter than the sequence.
TEST(GptCudaTest, SlidingWindowLayerMatchesCpu) {
  GptConfig cfg = TinyQwen3Config();
  cfg.sliding_window = 3;
  cfg.sliding_layers = {0};
  ASSERT_LT(cfg.sliding_window, cfg.seq_len);
  CompareTinyModel(cfg);
}

// Gemma 3's layer: norms by 1 + w (q/k norms too), GeGLU, the embedding
// scaled, q scaled for the scores, sandwich norms, the first layer sliding
// with a RoPE of its own base, the second with linearly scaled RoPE.
TEST(GptCudaTest, Gemma3LayerMatchesCpu) {
  GptConfig cfg = TinyQwen3Config();
  cfg.norm_unit_offset = cfg.embed_scale = cfg.sandwich_norms = true;
  cfg.mlp_glu = kernels::Glu::kGeluTanh;
  cfg.attn_scalar = 20;
  cfg.sliding_window = 3;
  cfg.sliding_layers = {0};
  cfg.local_rope_theta = 50;
  cfg.local_rope_layers = {0};
  cfg.rope.linear = true;
  cfg.rope.factor = 2;
  CompareTinyModel(cfg);
}

// Gemma 2's layer: sandwich norms without q/k norms, the attention's scores
// and the logits softcapped (the unfused attention's backward recomputes
// the scores for the cap's derivative).
TEST(GptCudaTest, Gemma2LayerMatchesCpu) {
  GptConfig cfg = TinyQwen3Config();
  cfg.qk_norm = false;
  cfg.tied_embeddings = true;
  cfg.norm_unit_offset = cfg.embed_scale = cfg.sandwich_norms = true;
  cfg.mlp_glu = kernels::Glu::kGeluTanh;
  cfg.attn_scalar = 20;
  cfg.sliding_window = 3;
  cfg.sliding_layers = {0};
  cfg.attn_softcap = 0.3;
  cfg.final_softcap = 0.8;
  CompareTinyModel(cfg);
}

// OLMo 2's layer: norms on the attention's and the MLP's outputs only, q
// and k normed over all their heads at once.
TEST(GptCudaTest, Olmo2LayerMatchesCpu) {
  GptConfig cfg = TinyQwen3Config();
  cfg.post_norms = cfg.qk_norm_all_heads = true;
  CompareTinyModel(cfg);
}

// Granite's multipliers: the embedding's, the branches', the logits' and
// the scores' (attn_scalar).
TEST(GptCudaTest, GraniteLayerMatchesCpu) {
  GptConfig cfg = TinyQwen3Config();
  cfg.qk_norm = false;
  cfg.embed_multiplier = 3.0;
  cfg.residual_multiplier = 0.4;
  cfg.logits_scaling = 2.5;
  cfg.attn_scalar = 25;
  CompareTinyModel(cfg);
}

// tiny-qwen3 with every MLP routed (Qwen3-MoE's): 4 experts of width 24,
// 2 a token, their weights renormalized.
GptConfig TinyQwen3MoeConfig() {
  GptConfig cfg = TinyQwen3Config();
  cfg.n_experts = 4;
  cfg.experts_per_token = 2;
  cfg.intermediate_size = 24;
  return cfg;
}

// With Qwen2-MoE's gated shared expert beside the routed ones, and a
// dense layer (width 96) between two routed ones.
GptConfig TinySharedExpertConfig() {
  GptConfig cfg = TinyQwen3MoeConfig();
  cfg.shared_expert_size = 40;
  cfg.shared_expert_gate = true;
  cfg.n_layer = 3;
  cfg.dense_layers = {1};
  cfg.dense_intermediate_size = 96;
  return cfg;
}

// GLM-4.5's: a sigmoid router (2 of 4 groups of experts candidates, the
// weights normalized and times 2.5, a frozen selection bias) with an
// ungated shared expert; layer 0 dense.
GptConfig TinySigmoidRouterConfig() {
  GptConfig cfg = TinySharedExpertConfig();
  cfg.shared_expert_gate = false;
  cfg.router_scoring = kernels::MoeScoring::kSigmoid;
  cfg.router_bias = true;
  cfg.router_groups = 2;
  cfg.router_topk_groups = 1;
  cfg.routed_scale = 2.5;
  cfg.norm_topk_prob = true;
  cfg.dense_layers = {0};
  return cfg;
}

// ERNIE 4.5's: a softmax router choosing by probability + a frozen
// selection bias, the weights normalized by at least 1e-12, beside the
// same ungated shared expert and dense layer 0.
GptConfig TinyErnieRouterConfig() {
  GptConfig cfg = TinySigmoidRouterConfig();
  cfg.router_scoring = kernels::MoeScoring::kSoftmax;
  cfg.router_groups = 1;
  cfg.router_topk_groups = 1;
  cfg.routed_scale = 1;
  cfg.router_norm_min = 1e-12;
  return cfg;
}

// DeepSeek-V3's latent attention beside GLM-4.5's router: q through a
// latent of 10, k and v out of one of 12, heads of 16 q/k columns (the
// last 8 rotated in pairs, k's shared by the heads) and values of 12
// (padded to 16 in the attention), the scores scaled (attn_scalar).
GptConfig TinyLatentAttentionConfig() {
  GptConfig cfg = TinySigmoidRouterConfig();
  cfg.qk_norm = false;
  cfg.n_kv_head = cfg.n_head;
  cfg.kv_lora_rank = 12;
  cfg.q_lora_rank = 10;
  cfg.qk_rope_head_dim = 8;
  cfg.v_head_dim = 12;
  cfg.rope.interleaved = true;
  cfg.attn_scalar = 12;
  return cfg;
}

TEST(GptCudaTest, MoeLayerMatchesCpu) { CompareTinyModel(TinyQwen3MoeConfig()); }
TEST(GptCudaTest, SharedExpertLayerMatchesCpu) { CompareTinyModel(TinySharedExpertConfig()); }
TEST(GptCudaTest, SigmoidRouterLayerMatchesCpu) { CompareTinyModel(TinySigmoidRouterConfig()); }
TEST(GptCudaTest, ErnieRouterLayerMatchesCpu) { CompareTinyModel(TinyErnieRouterConfig()); }
// A floor above every token's sum (the divisor a constant).
TEST(GptCudaTest, ErnieRouterWithFlooredSumMatchesCpu) {
  GptConfig cfg = TinyErnieRouterConfig();
  cfg.router_norm_min = 1.5;
  CompareTinyModel(cfg);
}
TEST(GptCudaTest, LatentAttentionLayerMatchesCpu) { CompareTinyModel(TinyLatentAttentionConfig()); }
// DeepSeek-V2's: the same attention beside a softmax router in 2 groups
// scored by their best expert, 1 a candidate, unnormalized, times 1.5,
// kept in fp32.
TEST(GptCudaTest, DeepseekV2LayerMatchesCpu) {
  GptConfig cfg = TinyLatentAttentionConfig();
  cfg.router_scoring = kernels::MoeScoring::kSoftmax;
  cfg.router_bias = false;
  cfg.router_fp32 = true;
  cfg.router_group_best = 1;
  cfg.norm_topk_prob = false;
  cfg.routed_scale = 1.5;
  CompareTinyModel(cfg);
}
TEST(GptCudaTest, LatentAttentionWithoutQLatentMatchesCpu) {
  GptConfig cfg = TinyLatentAttentionConfig();
  cfg.q_lora_rank = 0;
  cfg.rope.interleaved = false;
  CompareTinyModel(cfg);
}

// tiny-qwen3 with Gemma 2's softcaps (heads of 16: the 16-bit mode's fused
// attention takes the cap).
GptConfig SoftcappedQwen3Config() {
  GptConfig cfg = TinyQwen3Config();
  cfg.attn_softcap = 0.5;
  cfg.final_softcap = 1.0;
  return cfg;
}

// In both compute modes (the 16-bit one's attention is the fused kernel,
// which recomputes the probabilities in its backward).
void KeptActivationsGiveTheRecomputesBits(bool compute16, const GptConfig& model) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU: " << CudaUnavailableReason();
  const TinyCase c = MakeTinyCase(model);
  auto cuda_device = CreateCudaDevice(0, 0);
  ASSERT_TRUE(cuda_device.ok()) << cuda_device.status().ToString();
  double losses[2] = {0, 0};
  std::vector<std::vector<float>> grads[2];
  const std::vector<BlockSpec> specs = GptBlockSpecs(c.cfg);
  for (int k = 0; k < 2; ++k) {
    auto ops = CreateOps(**cuda_device, compute16);
    ASSERT_TRUE(ops.ok()) << ops.status().ToString();
    Side gpu(cuda_device->get(), std::move(ops).value());
    gpu.Load(c.weights);
    const LayerActivations a = k == 0 ? LayerActivations::kRecompute : LayerActivations::kKeep;
    losses[k] = Step(c.cfg, c.batch, gpu, cuda_device->get(), c.inputs, c.targets, a);
    for (size_t b = 0; b < specs.size(); ++b) {
      for (size_t t = 0; t < specs[b].tensors.size(); ++t)
        grads[k].push_back(gpu.Download(gpu.grads(b)[t], c.weights[b][t].size()));
    }
  }
  ASSERT_TRUE(std::isfinite(losses[0]));
  EXPECT_EQ(std::memcmp(&losses[0], &losses[1], sizeof(double)), 0) << losses[0] << " vs " << losses[1];
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_EQ(std::memcmp(grads[0][i].data(), grads[1][i].data(), grads[0][i].size() * sizeof(float)), 0)
        << "gradient tensor " << i;
  }
}

TEST(GptCudaTest, KeptActivationsGiveTheRecomputesBits) {
  KeptActivationsGiveTheRecomputesBits(false, TinyConfig(/*tied=*/true));
}
TEST(GptCudaTest, KeptActivationsGiveTheRecomputesBitsIn16BitMode) {
  KeptActivationsGiveTheRecomputesBits(true, TinyConfig(/*tied=*/true));
}
TEST(GptCudaTest, KeptActivationsGiveTheRecomputesBitsWithSoftcaps) {
  KeptActivationsGiveTheRecomputesBits(false, SoftcappedQwen3Config());
  KeptActivationsGiveTheRecomputesBits(true, SoftcappedQwen3Config());
}
TEST(GptCudaTest, KeptActivationsGiveTheRecomputesBitsWithExperts) {
  KeptActivationsGiveTheRecomputesBits(false, TinyQwen3MoeConfig());
  KeptActivationsGiveTheRecomputesBits(true, TinyQwen3MoeConfig());
  KeptActivationsGiveTheRecomputesBits(true, TinySharedExpertConfig());
  KeptActivationsGiveTheRecomputesBits(true, TinySigmoidRouterConfig());
  KeptActivationsGiveTheRecomputesBits(true, TinyLatentAttentionConfig());
}

// ActivationBytes (plan.h) is what GptCompute allocates on a GPU too, in
// both compute modes: the 16-bit mode's fused attention keeps B*NH*T
// log-sum-exps a layer where the fp32 mode keeps the B*NH*T*T
// probabilities, and needs B*NH*T of scratch where it needs 7 B*T*C more.
TEST(GptCudaTest, ActivationBytesAreTheCudaAllocations) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU: " << CudaUnavailableReason();
  auto cuda_device = CreateCudaDevice(0, 0);
  ASSERT_TRUE(cuda_device.ok()) << cuda_device.status().ToString();
  Device& device = **cuda_device;
  // The softcapped model: the fp32 attention's backward has a scores slot.
  for (const auto& [name, m] :
       {std::pair{"tiny", TinyConfig(true)}, std::pair{"demo", *LoadGptConfig("demo")},
        std::pair{"tiny-qwen3", TinyQwen3Config()}, std::pair{"tiny-qwen3-softcap", SoftcappedQwen3Config()},
        std::pair{"tiny-qwen3-moe", TinyQwen3MoeConfig()}, std::pair{"tiny-shared-expert", TinySharedExpertConfig()},
        std::pair{"tiny-latent-attention", TinyLatentAttentionConfig()}}) {
    for (bool compute16 : {false, true}) {
      for (LayerActivations a : {LayerActivations::kRecompute, LayerActivations::kKeep}) {
        SCOPED_TRACE(std::string(name) + (compute16 ? " 16-bit " : " fp32 ") + LayerActivationsName(a));
        auto ops = CreateOps(device, compute16);
        ASSERT_TRUE(ops.ok()) << ops.status().ToString();
        const int64_t before = static_cast<int64_t>(device.bytes_in_use());
        {
          auto compute = GptCompute<float>::Create(m, 2, ops->get(), &device, a);
          ASSERT_TRUE(compute.ok()) << compute.status().ToString();
          const bool fused = FusedAttention(m, KernelsFor(/*cuda=*/true, compute16), /*param_elem_bytes=*/2);
          EXPECT_EQ(fused, compute16);  // head sizes 16, 64, 16, 16, 16, 16 and 16
          EXPECT_EQ(ActivationBytes(m, 2, KernelsFor(/*cuda=*/true, compute16), /*param_elem_bytes=*/2, a),
                    static_cast<int64_t>(device.bytes_in_use()) - before);
        }
        const Status st = (*ops)->Synchronize();
        ASSERT_TRUE(st.ok()) << st.ToString();
      }
    }
  }
}

}  // namespace
}  // namespace zinf::model

#else  // !ZINF_HAVE_CUDA_KERNELS

TEST(GptCudaTest, NeedsCudaKernels) {
  GTEST_SKIP() << "this build has no CUDA kernels (the CUDA Toolkit was not found at configure time)";
}

#endif  // ZINF_HAVE_CUDA_KERNELS
