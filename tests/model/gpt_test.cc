// The reference GPT: the whole model in double against central finite
// differences of its loss, float against double, activation checkpointing,
// config parsing and initial weights.
//
// Parameters live in host vectors: on the host device "device memory" is
// host memory and CpuOps dereferences what it is given, so the test hands
// GptCompute its own arrays the way the engine hands it a gathered block.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/half.h"
#include "device/device.h"
#include "kernels/cpu_kernels.h"
#include "model/ops.h"
#include "model/plan.h"

namespace zinf::model {
namespace {

using Tensors = std::vector<std::vector<double>>;  // one block

// All parameters of a model, per block, in double.
std::vector<Tensors> MakeParams(const GptConfig& config, uint64_t seed) {
  std::vector<Tensors> blocks;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const std::vector<BlockSpec> specs = GptBlockSpecs(config);
  for (BlockId b = 0; b < static_cast<BlockId>(specs.size()); ++b) {
    std::vector<std::vector<float>> init = InitBlockWeights(config, b, seed);
    Tensors t;
    for (size_t i = 0; i < init.size(); ++i) {
      std::vector<double> v(init[i].begin(), init[i].end());
      const std::string& name = specs[b].tensors[i].name;
      const bool is_ln_weight = (name.find("ln") != std::string::npos || name.find("norm") != std::string::npos) &&
                                name.find(".weight") != std::string::npos;
      const bool is_bias = name.find("bias") != std::string::npos;  // a sigmoid router's selection bias too
      // Move away from the initial point (unit LayerNorm weights, zero
      // biases, near-uniform attention), so every term of the gradient is
      // exercised; the padding rows of wte / lm_head stay zero.
      for (double& x : v) {
        if (is_ln_weight) {
          x += 0.3 * u(rng);
        } else if (is_bias) {
          x = 0.1 * u(rng);
        } else {
          x *= 5.0;
        }
      }
      t.push_back(std::move(v));
    }
    blocks.push_back(std::move(t));
  }
  return blocks;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch MakeBatch(const GptConfig& config, int batch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch b;
  for (int i = 0; i < batch * config.seq_len; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng() % config.vocab_size));
    b.targets.push_back(static_cast<int32_t>(rng() % config.vocab_size));
  }
  return b;
}

// A model of element type T over host-device memory: its parameters (cast
// from the double master copy), gradients, and a GptCompute.
template <typename T>
class Harness {
 public:
  // `queued` (float): the kernels queued on one of the host device's
  // streams, as on a GPU, instead of run in place.
  Harness(const GptConfig& config, int batch, LayerActivations activations = LayerActivations::kRecompute,
          bool queued = false)
      : config_(config), device_(CreateHostDevice(0)), ops_(CreateCpuOps<T>()) {
    if constexpr (std::is_same_v<T, float>) {
      if (queued) {
        auto ops = CreateOps(*device_, /*compute16=*/false, /*host_stream=*/true);
        EXPECT_TRUE(ops.ok()) << ops.status().ToString();
        ops_ = std::move(*ops);
      }
    }
    auto c = GptCompute<T>::Create(config, batch, ops_.get(), device_.get(), activations);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    compute_ = std::move(*c);
  }

  void SetParams(const std::vector<Tensors>& params) {
    params_.clear();
    grads_.clear();
    for (const Tensors& block : params) {
      std::vector<std::vector<T>> p, g;
      for (const auto& t : block) {
        p.emplace_back(t.begin(), t.end());
        g.emplace_back(t.size(), T(0));
      }
      params_.push_back(std::move(p));
      grads_.push_back(std::move(g));
    }
  }

  // Layer matrices in bf16, one array per tensor of each block (empty for
  // the others): with them, Run hands the layers over as LayerParams and
  // walks each in two group ranges.
  using Matrices16 = std::vector<std::vector<std::vector<uint16_t>>>;

  typename GptCompute<T>::LayerParams Layer16(int l, const Matrices16& m16) const {
    typename GptCompute<T>::LayerParams lp{Const(LayerBlock(l)), {}, ElementType::kBf16};
    lp.matrices16.assign(lp.values.size(), nullptr);
    for (size_t t = 0; t < lp.values.size(); ++t) {
      const std::vector<uint16_t>& w = m16[static_cast<size_t>(LayerBlock(l))][t];
      if (w.empty()) continue;
      lp.matrices16[t] = w.data();
      lp.values[t] = nullptr;
    }
    return lp;
  }

  // The loss of `batch`; with `backward`, the gradients of every block
  // (zeroed first) as well. `layer_grads` kSet: the layers' gradients are
  // set by LayerBackwardGroups (walked in two group ranges) into arrays
  // filled with NaN instead of zeroed.
  double Run(const Batch& batch, bool backward, const Matrices16* m16 = nullptr,
             kernels::GradMode layer_grads = kernels::GradMode::kAdd) {
    const bool set = layer_grads == kernels::GradMode::kSet;
    for (BlockId b = 0; b < static_cast<BlockId>(grads_.size()); ++b) {
      const bool layer = b != kEmbedBlock && b != HeadBlock(config_);
      for (auto& g : grads_[b])
        std::fill(g.begin(), g.end(), set && layer ? std::numeric_limits<T>::quiet_NaN() : T(0));
    }
    EXPECT_TRUE(compute_->SetBatch(batch.inputs.data(), batch.targets.data()).ok());
    EXPECT_TRUE(compute_->EmbedForward(Const(kEmbedBlock)).ok());
    for (int l = 0; l < config_.n_layer; ++l) {
      if (m16 == nullptr) {
        EXPECT_TRUE(compute_->LayerForward(l, Const(LayerBlock(l))).ok());
        continue;
      }
      const auto lp = Layer16(l, *m16);
      EXPECT_TRUE(compute_->LayerForwardGroups(l, 0, 2, lp).ok());
      EXPECT_TRUE(compute_->LayerForwardGroups(l, 2, kLayerGroups, lp).ok());
    }
    const BlockId head = HeadBlock(config_);
    const int lm = LmHeadIndex(config_);
    const T* lm_head = config_.tied_embeddings ? params_[kEmbedBlock][kWte].data() : params_[head][lm].data();
    typename GptCompute<T>::HeadGrads hg;
    if (backward) {
      hg.head = Mutable(head);
      hg.lm_head = config_.tied_embeddings ? grads_[kEmbedBlock][kWte].data() : grads_[head][lm].data();
    }
    StatusOr<double> loss = compute_->HeadForward(Const(head), lm_head, backward ? &hg : nullptr, 1.0);
    EXPECT_TRUE(loss.ok()) << loss.status().ToString();
    if (backward) {
      for (int l = config_.n_layer - 1; l >= 0; --l) {
        if (m16 == nullptr && !set) {
          EXPECT_TRUE(compute_->LayerBackward(l, Const(LayerBlock(l)), Mutable(LayerBlock(l))).ok());
          continue;
        }
        const auto lp = m16 != nullptr
                            ? Layer16(l, *m16)
                            : typename GptCompute<T>::LayerParams{Const(LayerBlock(l)), {}, ElementType::kBf16};
        if (!compute_->keeps_activations()) {
          EXPECT_TRUE(compute_->LayerRecomputeGroups(l, 0, kMlpOutGroup, lp).ok());
        }
        EXPECT_TRUE(compute_->LayerBackwardGroups(l, 3, kLayerGroups, lp, Mutable(LayerBlock(l)), layer_grads).ok());
        EXPECT_TRUE(compute_->LayerBackwardGroups(l, 0, 3, lp, Mutable(LayerBlock(l)), layer_grads).ok());
      }
      EXPECT_TRUE(compute_->EmbedBackward(Mutable(kEmbedBlock)).ok());
    }
    EXPECT_TRUE(compute_->ops().Synchronize().ok());  // queued kernels have written the gradients
    return loss.ok() ? *loss : NAN;
  }

  std::vector<const T*> Const(BlockId b) const {
    std::vector<const T*> v;
    for (const auto& t : params_[b]) v.push_back(t.data());
    return v;
  }
  std::vector<T*> Mutable(BlockId b) {
    std::vector<T*> v;
    for (auto& t : grads_[b]) v.push_back(t.data());
    return v;
  }

  std::vector<std::vector<std::vector<T>>>& params() { return params_; }
  const std::vector<std::vector<std::vector<T>>>& grads() const { return grads_; }
  GptCompute<T>& compute() { return *compute_; }

 private:
  GptConfig config_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Ops<T>> ops_;
  std::unique_ptr<GptCompute<T>> compute_;
  std::vector<std::vector<std::vector<T>>> params_, grads_;
};

GptConfig Tiny(bool tied) {
  StatusOr<GptConfig> c = LoadGptConfig("tiny");
  EXPECT_TRUE(c.ok());
  GptConfig config = *c;
  config.tied_embeddings = tied;
  return config;
}

// Every parameter tensor: ~30 sampled entries of its gradient against
// central differences of the full loss. h = 1e-5: truncation ~1e-10 times
// the third derivative, rounding ~1e-16 * loss / h ~ 1e-10. Tolerance:
// 1e-6 relative plus 1e-9 absolute (entries whose gradient is ~0).
void CheckModelGradients(const GptConfig& config) {
  // One kernel thread: thousands of forwards of a tiny model whose matmuls
  // are just above the kernels' threading threshold (WorthThreads), and whose
  // parallel regions' barriers, beside other tests on the same cores
  // (ctest -j), wait for descheduled threads (two seconds become a hundred).
  const int threads = kernels::cpu::Threads();
  kernels::cpu::SetThreads(1);
  struct RestoreThreads {
    int threads;
    ~RestoreThreads() { kernels::cpu::SetThreads(threads); }
  } restore{threads};
  const int B = 2;
  Harness<double> h(config, B);
  std::vector<Tensors> params = MakeParams(config, 42);
  h.SetParams(params);
  const Batch batch = MakeBatch(config, B, 7);
  const double loss = h.Run(batch, /*backward=*/true);
  EXPECT_GT(loss, 0.0);
  const auto grads = h.grads();  // copy: the finite-difference runs overwrite them
  const std::vector<BlockSpec> specs = GptBlockSpecs(config);
  std::mt19937_64 rng(99);
  constexpr double kStep = 1e-5, kRel = 1e-6, kAbs = 1e-9;
  int checked = 0;
  for (size_t b = 0; b < specs.size(); ++b) {
    for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
      const std::string name = specs[b].name + "/" + specs[b].tensors[t].name;
      std::vector<double>& p = h.params()[b][t];
      std::vector<size_t> idx;
      for (int s = 0; s < 30; ++s) idx.push_back(rng() % p.size());
      const bool vocab_rows = specs[b].tensors[t].name == "wte" || specs[b].tensors[t].name == "lm_head" ||
                              specs[b].tensors[t].name == "embed_tokens";
      if (vocab_rows) {
        // Rows the batch uses, and a padding row (its gradient must be 0).
        idx.push_back(static_cast<size_t>(batch.inputs[0]) * config.n_embd + 3);
        idx.push_back(static_cast<size_t>(batch.targets[1]) * config.n_embd + 5);
        idx.push_back(static_cast<size_t>(config.padded_vocab_size - 1) * config.n_embd + 1);
      }
      // A frozen tensor (a sigmoid router's selection bias) gets no gradient.
      const bool frozen = IsFrozenTensor(specs[b].tensors[t]);
      if (frozen) {
        for (double g : grads[b][t]) EXPECT_EQ(g, 0.0) << name;
      }
      double max_grad = 0;
      for (size_t i : idx) {
        const double saved = p[i];
        p[i] = saved + kStep;
        const double plus = h.Run(batch, false);
        p[i] = saved - kStep;
        const double minus = h.Run(batch, false);
        p[i] = saved;
        const double numeric = (plus - minus) / (2 * kStep);
        const double analytic = grads[b][t][i];
        max_grad = std::max(max_grad, std::fabs(analytic));
        EXPECT_NEAR(analytic, numeric, kRel * std::fabs(numeric) + kAbs) << name << "[" << i << "]";
        ++checked;
      }
      if (!frozen) {
        EXPECT_GT(max_grad, 1e-7) << name << ": every sampled gradient is ~0; the check would prove nothing";
      }
      const int64_t pad_row = static_cast<int64_t>(config.padded_vocab_size - 1) * config.n_embd;
      if (vocab_rows) {
        for (int c = 0; c < config.n_embd; ++c) EXPECT_EQ(grads[b][t][pad_row + c], 0.0) << name << " padding";
      }
    }
  }
  EXPECT_GT(checked, config.llama() ? 30 * 20 : 30 * 25);
}

// The two runs' losses and every gradient are the same bits; `what` names
// the comparison in a failure.
void ExpectSameBits(double la, const Harness<float>& a, double lb, const Harness<float>& b, const std::string& what) {
  EXPECT_EQ(std::memcmp(&la, &lb, sizeof(double)), 0) << what << ": loss " << la << " vs " << lb;
  ASSERT_EQ(a.grads().size(), b.grads().size()) << what;
  for (size_t k = 0; k < a.grads().size(); ++k) {
    ASSERT_EQ(a.grads()[k].size(), b.grads()[k].size()) << what << ": block " << k;
    for (size_t t = 0; t < a.grads()[k].size(); ++t) {
      const std::vector<float>& ga = a.grads()[k][t];
      const std::vector<float>& gb = b.grads()[k][t];
      ASSERT_EQ(ga.size(), gb.size());
      EXPECT_EQ(std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)), 0)
          << what << ": block " << k << " tensor " << t;
    }
  }
}
TEST(GptTest, GradientsMatchFiniteDifferencesTied) { CheckModelGradients(Tiny(/*tied=*/true)); }
TEST(GptTest, GradientsMatchFiniteDifferencesUntied) { CheckModelGradients(Tiny(/*tied=*/false)); }

// The Llama family: GQA (4 heads, 2 key/value heads), RoPE with llama3
// rescaling, SwiGLU of width 40, RMSNorm; tied or not, with Qwen2's q/k/v
// biases or not.
GptConfig TinyLlama(bool tied, bool qkv_bias) {
  GptConfig c = Tiny(tied);
  c.family = ModelFamily::kLlama;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.intermediate_size = 40;
  c.qkv_bias = qkv_bias;
  c.norm_eps = 1e-6;
  c.rope.theta = 500.0;
  c.rope.llama3 = true;
  c.rope.factor = 4.0;
  c.rope.original_max_position = 16;
  return c;
}

// Qwen3's layer: q_norm and k_norm over each head of q and k, and heads of
// `head_size` whatever n_embd / n_head is (8 here): 12 makes q and the
// attention output 48 wide (> n_embd 32), 6 makes them 24.
GptConfig TinyQwen3(int head_size) {
  GptConfig c = TinyLlama(false, false);
  c.qk_norm = true;
  c.head_size = head_size;
  return c;
}

// Gemma 3's layer on Qwen3's: norms by 1 + w, GeGLU, the embedding scaled
// by sqrt(32), q scaled for scores by 20^-1/2 (not 8^-1/2), sandwich norms;
// layer 0 slides over 5 keys with a RoPE of its own base, layer 1 sees
// every key with linearly scaled RoPE.
GptConfig TinyGemma3() {
  GptConfig c = TinyQwen3(8);
  c.norm_unit_offset = true;
  c.mlp_glu = kernels::Glu::kGeluTanh;
  c.embed_scale = true;
  c.attn_scalar = 20;
  c.sandwich_norms = true;
  c.sliding_window = 5;
  c.sliding_layers = {0};
  c.local_rope_theta = 50;
  c.local_rope_layers = {0};
  c.rope.llama3 = false;
  c.rope.linear = true;
  c.rope.factor = 2;
  return c;
}

// Gemma 2's layer: Gemma 3's without the q/k norms and the local RoPE, with
// the attention's scores and the logits softcapped (caps small enough to
// bend the tiny model's values).
GptConfig TinyGemma2() {
  GptConfig c = TinyLlama(false, false);
  c.head_size = 8;
  c.norm_unit_offset = true;
  c.mlp_glu = kernels::Glu::kGeluTanh;
  c.embed_scale = true;
  c.attn_scalar = 20;
  c.sandwich_norms = true;
  c.sliding_window = 5;
  c.sliding_layers = {0};
  c.attn_softcap = 0.2;
  c.final_softcap = 0.5;
  return c;
}

TEST(GptTest, LlamaGradientsMatchFiniteDifferencesTied) { CheckModelGradients(TinyLlama(true, false)); }
TEST(GptTest, Gemma3GradientsMatchFiniteDifferences) { CheckModelGradients(TinyGemma3()); }
TEST(GptTest, Gemma2GradientsMatchFiniteDifferences) { CheckModelGradients(TinyGemma2()); }
// OLMo 2's layer: no norm before the attention or the MLP, one on each's
// output, q and k normed over all their heads at once.
GptConfig TinyOlmo2() {
  GptConfig c = TinyLlama(false, false);
  c.post_norms = true;
  c.qk_norm = true;
  c.qk_norm_all_heads = true;
  return c;
}

TEST(GptTest, Olmo2GradientsMatchFiniteDifferences) { CheckModelGradients(TinyOlmo2()); }

// Granite's multipliers: the embedding, each branch as it joins the
// residual stream, the scores (attn_scalar) and the logits.
GptConfig TinyGranite() {
  GptConfig c = TinyLlama(true, false);
  c.embed_multiplier = 3.0;
  c.residual_multiplier = 0.4;
  c.logits_scaling = 2.5;
  c.attn_scalar = 25;
  return c;
}

TEST(GptTest, GraniteGradientsMatchFiniteDifferences) { CheckModelGradients(TinyGranite()); }
TEST(GptTest, LlamaGradientsMatchFiniteDifferencesUntiedWithBiases) { CheckModelGradients(TinyLlama(false, true)); }
TEST(GptTest, Qwen3GradientsMatchFiniteDifferencesWideHeads) { CheckModelGradients(TinyQwen3(12)); }
// Phi-4-mini's rotary embedding: 4 of a head's 8 columns turned, LongRoPE's
// per-frequency factors and its cos/sin scale.
TEST(GptTest, LlamaGradientsMatchFiniteDifferencesPartialLongRope) {
  GptConfig c = TinyLlama(false, false);
  c.rope.llama3 = false;
  c.rope.partial_factor = 0.5;
  c.rope.longrope = true;
  c.rope.original_max_position = 8;
  c.rope.short_factor = {1.0, 1.5};
  c.rope.long_factor = {2.0, 3.0};
  c.rope.attention_factor = 1.2;
  CheckModelGradients(c);
}
TEST(GptTest, Qwen3GradientsMatchFiniteDifferencesNarrowHeads) { CheckModelGradients(TinyQwen3(6)); }
// Helium's and GLM's rotary layout: the pairs (2i, 2i + 1), here over 6 of
// a head's 8 columns.
TEST(GptTest, InterleavedPartialRopeGradientsMatchFiniteDifferences) {
  GptConfig c = TinyLlama(false, true);
  c.rope.interleaved = true;
  c.rope.partial_factor = 0.75;
  CheckModelGradients(c);
}
// SmolLM3's NoPE layers: layer 1 of 2 without the rotary embedding (with
// q/k norms, so the gradient that passes RoPE untouched feeds them).
TEST(GptTest, NopeLayerGradientsMatchFiniteDifferences) {
  GptConfig c = TinyQwen3(8);
  ASSERT_EQ(c.n_layer, 2);
  c.no_rope_layers = {1};
  CheckModelGradients(c);
}

// A routed MLP in every layer (Qwen3-MoE's): 4 experts of width 24, 2 a
// token, their weights divided by their sum; with `olmoe`, OLMoE's: the
// weights as the softmax gives them, q and k normed over all heads. Every
// expert gets tokens (CheckModelGradients wants a gradient in each).
GptConfig TinyMoe(bool olmoe) {
  GptConfig c = TinyQwen3(8);
  c.n_experts = 4;
  c.experts_per_token = 2;
  c.intermediate_size = 24;
  c.norm_topk_prob = !olmoe;
  c.qk_norm_all_heads = olmoe;
  return c;
}

TEST(GptTest, MoeGradientsMatchFiniteDifferences) { CheckModelGradients(TinyMoe(false)); }
TEST(GptTest, OlmoeGradientsMatchFiniteDifferences) { CheckModelGradients(TinyMoe(true)); }
// Routed MLPs under OLMo 2's output norms (the combine's output normed)
// and under Granite's branch multiplier.
TEST(GptTest, MoeWithPostNormsGradientsMatchFiniteDifferences) {
  GptConfig c = TinyMoe(true);
  c.post_norms = true;
  CheckModelGradients(c);
}
TEST(GptTest, MoeWithResidualMultiplierGradientsMatchFiniteDifferences) {
  GptConfig c = TinyMoe(false);
  c.residual_multiplier = 0.4;
  CheckModelGradients(c);
}

// A shared expert of width 12 beside the routed ones (Qwen2-MoE's), its
// output gated by sigmoid(x . g) when `gated`, added as it is otherwise.
GptConfig TinySharedMoe(bool gated) {
  GptConfig c = TinyMoe(false);
  c.norm_topk_prob = false;
  c.shared_expert_size = 12;
  c.shared_expert_gate = gated;
  return c;
}
TEST(GptTest, SharedExpertGradientsMatchFiniteDifferences) { CheckModelGradients(TinySharedMoe(true)); }
TEST(GptTest, UngatedSharedExpertGradientsMatchFiniteDifferences) { CheckModelGradients(TinySharedMoe(false)); }
TEST(GptTest, SharedExpertWithPostNormsGradientsMatchFiniteDifferences) {
  GptConfig c = TinySharedMoe(true);
  c.post_norms = true;
  c.qk_norm_all_heads = true;
  CheckModelGradients(c);
}

// Dense layers among routed ones (Qwen-MoE's mlp_only_layers): of three
// layers 0 and 2 dense, a gated MLP of 56 (wider than the routed rows'
// 2 x 24 a token), 1 routed with a gated shared expert; the load-balancing
// loss over the one routed layer.
GptConfig TinyMixedMoe() {
  GptConfig c = TinySharedMoe(true);
  c.n_layer = 3;
  c.dense_layers = {0, 2};
  c.dense_intermediate_size = 56;
  c.router_aux_coef = 0.3;
  return c;
}
TEST(GptTest, DenseLayersAmongRoutedOnesGradientsMatchFiniteDifferences) { CheckModelGradients(TinyMixedMoe()); }

// GLM-4.5's routed MLP (DeepSeek-V3's router): 6 experts in 3 groups of
// which 2 are candidates, 3 a token, chosen by sigmoid score + a selection
// bias (frozen: no gradient), weighted by their normalized scores times
// 2.5; an ungated shared expert; layer 0 dense (first_k_dense_replace).
GptConfig TinySigmoidMoe() {
  GptConfig c = TinySharedMoe(false);
  c.n_experts = 6;
  c.experts_per_token = 3;
  c.norm_topk_prob = true;
  c.router_scoring = kernels::MoeScoring::kSigmoid;
  c.router_bias = true;
  c.router_groups = 3;
  c.router_topk_groups = 2;
  c.routed_scale = 2.5;
  c.n_layer = 3;
  c.dense_layers = {0};
  c.dense_intermediate_size = 20;
  return c;
}
TEST(GptTest, SigmoidRouterGradientsMatchFiniteDifferences) { CheckModelGradients(TinySigmoidMoe()); }
TEST(GptTest, SigmoidRouterWithoutNormalizingGradientsMatchFiniteDifferences) {
  GptConfig c = TinySigmoidMoe();
  c.norm_topk_prob = false;
  c.router_groups = 1;
  c.router_topk_groups = 1;
  CheckModelGradients(c);
}

// DeepSeek-V3's layer: latent attention beside its router (GLM-4.5's,
// above). q through a latent of `q_lora_rank` (0: q_proj), k and v out of
// one of 5; heads of 6 q/k columns, the last 4 rotated in pairs and
// shared by the heads of k, and values of 3 (padded to 6 in the
// attention); the scores scaled by attn_scalar 5 (DeepSeek's yarn mscale).
GptConfig TinyMla(int q_lora_rank) {
  GptConfig c = TinySigmoidMoe();
  c.qk_norm = false;
  c.n_kv_head = c.n_head;
  c.head_size = 6;
  c.kv_lora_rank = 5;
  c.q_lora_rank = q_lora_rank;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 3;
  c.rope.interleaved = true;
  c.attn_scalar = 5;
  return c;
}
TEST(GptTest, LatentAttentionGradientsMatchFiniteDifferences) { CheckModelGradients(TinyMla(7)); }

// DeepSeek-V2's layer: latent attention (here with heads of an odd 7
// columns, 4 rotated) beside its router, the softmax's probabilities
// chosen within the 2 of 3 groups whose single best is highest, weighted
// by the probabilities alone (never renormalized) times 1.5; the router
// kept in fp32; an ungated shared expert; layer 0 dense.
GptConfig TinyDeepseekV2() {
  GptConfig c = TinyMla(0);
  c.head_size = 7;
  c.router_scoring = kernels::MoeScoring::kSoftmax;
  c.router_bias = false;
  c.router_fp32 = true;
  c.router_group_best = 1;
  c.norm_topk_prob = false;
  c.routed_scale = 1.5;
  return c;
}
TEST(GptTest, GroupLimitedSoftmaxRouterGradientsMatchFiniteDifferences) { CheckModelGradients(TinyDeepseekV2()); }
TEST(GptTest, LatentAttentionWithoutQLatentGradientsMatchFiniteDifferences) { CheckModelGradients(TinyMla(0)); }

// ERNIE 4.5's routed MLP: 6 experts, 3 a token, chosen by softmax
// probability + a selection bias (frozen), weighted by their probabilities
// divided by their sum or norm_min where that is larger; an ungated shared
// expert; layer 0 dense (moe_layer_start_index 1).
GptConfig TinyErnieMoe(double norm_min) {
  GptConfig c = TinySharedMoe(false);
  c.n_experts = 6;
  c.experts_per_token = 3;
  c.norm_topk_prob = true;
  c.router_bias = true;
  c.router_norm_min = norm_min;
  c.n_layer = 3;
  c.dense_layers = {0};
  c.dense_intermediate_size = 20;
  return c;
}
TEST(GptTest, SoftmaxRouterWithBiasGradientsMatchFiniteDifferences) { CheckModelGradients(TinyErnieMoe(1e-12)); }
// A floor above every token's sum (3 probabilities of 6 sum below 1): the
// weights divided by the constant.
TEST(GptTest, SoftmaxRouterWithFlooredSumGradientsMatchFiniteDifferences) { CheckModelGradients(TinyErnieMoe(1.5)); }

// The routers' load-balancing loss in the loss: its gradient through
// every layer's softmax.
GptConfig TinyMoeAux() {
  GptConfig c = TinyMoe(false);
  c.router_aux_coef = 0.3;
  return c;
}
TEST(GptTest, MoeLoadBalancingLossGradientsMatchFiniteDifferences) { CheckModelGradients(TinyMoeAux()); }
// The term joins the loss; cross_entropy() is the loss without it, the
// bits of the same model without the term.
TEST(GptTest, LoadBalancingLossAddsToTheCrossEntropy) {
  const std::vector<Tensors> params = MakeParams(TinyMoeAux(), 41);
  const Batch batch = MakeBatch(TinyMoeAux(), 2, 42);
  Harness<double> with(TinyMoeAux(), 2), without(TinyMoe(false), 2);
  with.SetParams(params);
  without.SetParams(params);
  const double l_with = with.Run(batch, /*backward=*/false), l_without = without.Run(batch, false);
  EXPECT_EQ(with.compute().cross_entropy(), l_without);
  EXPECT_EQ(without.compute().cross_entropy(), l_without);
  EXPECT_GT(l_with - l_without, 0.3);  // 0.3 E sum f_e P_e: about 0.3 K when the routing is near uniform
}

// More experts than a batch's token slots (64 experts, one a token, 64
// tokens): some get none, and their gradients are zero whether the
// backward adds or sets them (SetLayerGradientsNeedNoZeroing: set over NaN).
GptConfig TinySparseMoe() {
  GptConfig c = TinyMoe(false);
  c.n_experts = 64;
  c.experts_per_token = 1;
  c.intermediate_size = 4;
  return c;
}

TEST(GptTest, ExpertsWithoutTokensGetZeroGradients) {
  const GptConfig config = TinySparseMoe();
  const int B = 1;
  Harness<double> h(config, B);
  h.SetParams(MakeParams(config, 31));
  const Batch batch = MakeBatch(config, B, 32);
  h.Run(batch, /*backward=*/true);
  int idle = 0, used = 0;
  for (int l = 0; l < config.n_layer; ++l) {
    const auto& g = h.grads()[static_cast<size_t>(LayerBlock(l))];
    for (int e = 0; e < config.n_experts; ++e) {
      const auto& down = g[static_cast<size_t>(ExpertTensor(config, e, 2))];
      const bool zero = std::all_of(down.begin(), down.end(), [](double v) { return v == 0.0; });
      (zero ? idle : used)++;
      for (int w = 0; w < 2; ++w) {
        const auto& gw = g[static_cast<size_t>(ExpertTensor(config, e, w))];
        EXPECT_EQ(std::all_of(gw.begin(), gw.end(), [](double v) { return v == 0.0; }), zero)
            << "layer " << l << " expert " << e << " weight " << w;
      }
    }
  }
  EXPECT_GT(idle, 0);  // 32 tokens a layer for 64 experts
  EXPECT_GT(used, 0);
}

TEST(GptTest, LossAtInitIsNearLogVocab) {
  const GptConfig config = Tiny(true);
  Harness<double> h(config, 2);
  std::vector<Tensors> params;
  for (BlockId b = 0; b <= HeadBlock(config); ++b) {
    Tensors t;
    for (const auto& v : InitBlockWeights(config, b, 1)) t.emplace_back(v.begin(), v.end());
    params.push_back(std::move(t));
  }
  h.SetParams(params);
  const double loss = h.Run(MakeBatch(config, 2, 3), false);
  EXPECT_NEAR(loss, std::log(static_cast<double>(config.vocab_size)), 0.1);
}

TEST(GptTest, FloatAgreesWithDouble) {
  for (bool tied : {true, false}) {
    const GptConfig config = Tiny(tied);
    const int B = 2;
    std::vector<Tensors> params = MakeParams(config, 5);
    const Batch batch = MakeBatch(config, B, 6);
    Harness<double> hd(config, B);
    Harness<float> hf(config, B);
    hd.SetParams(params);
    hf.SetParams(params);
    const double ld = hd.Run(batch, true);
    const double lf = hf.Run(batch, true);
    EXPECT_NEAR(lf, ld, 1e-5 * ld) << "tied " << tied;
    // Per tensor: float error relative to the tensor's largest gradient.
    const std::vector<BlockSpec> specs = GptBlockSpecs(config);
    for (size_t b = 0; b < specs.size(); ++b) {
      for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
        const auto& gd = hd.grads()[b][t];
        const auto& gf = hf.grads()[b][t];
        double scale = 0, err = 0;
        for (size_t i = 0; i < gd.size(); ++i) {
          scale = std::max(scale, std::fabs(gd[i]));
          err = std::max(err, std::fabs(gd[i] - static_cast<double>(gf[i])));
        }
        EXPECT_LE(err, 1e-4 * scale) << specs[b].name << "/" << specs[b].tensors[t].name << " tied " << tied;
      }
    }
  }
}

// The layers' matrices of `params` in bf16, one array per tensor (empty for
// the others), with `params` rounded to those values so that the float
// path sees them too; *matrices (optional) counts them.
Harness<float>::Matrices16 LayerMatricesToBf16(const GptConfig& config, std::vector<Tensors>& params, int* matrices) {
  Harness<float>::Matrices16 m16(params.size());
  for (size_t b = 0; b < params.size(); ++b) {
    m16[b].resize(params[b].size());
    const bool layer = static_cast<BlockId>(b) != kEmbedBlock && static_cast<BlockId>(b) != HeadBlock(config);
    for (size_t t = 0; layer && t < params[b].size(); ++t) {
      if (!IsLayerMatrix(config, static_cast<int>(t))) continue;
      if (matrices != nullptr) ++*matrices;
      for (double& x : params[b][t]) {
        m16[b][t].push_back(FloatToBf16(static_cast<float>(x)));
        x = Bf16ToFloat(m16[b][t].back());
      }
    }
  }
  return m16;
}

// Layer matrices handed over in bf16 (LayerParams, read as they are by the
// float CPU ops) give the bits of handing over their float casts: the loss
// and every gradient, GPT-2 and Llama with q/k/v biases, layers walked in
// group ranges. Refused: a non-matrix in 16 bits, a short list, and ops
// that do not read 16-bit weights.
TEST(GptTest, SixteenBitMatricesGiveTheBitsOfTheirFloatCasts) {
  for (const GptConfig& config : {Tiny(true), TinyLlama(false, true), TinyGemma3(), TinyMoe(false), TinySharedMoe(true),
                                  TinyMixedMoe(), TinySigmoidMoe(), TinyMla(7), TinyDeepseekV2()}) {
    SCOPED_TRACE(config.mla()             ? "latent attention"
                 : config.shared_expert() ? "shared expert"
                 : config.moe()           ? "moe"
                 : config.sandwich_norms  ? "gemma3"
                 : config.llama()         ? "llama"
                                          : "gpt2");
    const int B = 2;
    std::vector<Tensors> params = MakeParams(config, 11);
    int matrices = 0;
    const Harness<float>::Matrices16 m16 = LayerMatricesToBf16(config, params, &matrices);
    // q, k, v, o and the MLP's three (in a routed layer each expert's, and
    // the router unless it is kept in fp32 (a sigmoid one, DeepSeek-V2's:
    // as transformers keeps them), never its bias; the shared expert's three and its gate's;
    // latent attention's q_b_proj)
    const int q_b = config.q_lora_rank > 0 ? 1 : 0;
    const int shared = config.shared_expert() ? 3 + (config.shared_expert_gate ? 1 : 0) : 0;
    const int router = config.router_fp32 || config.router_bias ? 0 : 1;
    const int routed = config.moe() ? 3 * config.n_experts + router + shared : 3;
    const int dense = config.n_layer - config.routed_layers(), routed_layers = config.n_layer - dense;
    EXPECT_EQ(matrices,
              config.llama() ? (4 + q_b) * config.n_layer + 3 * dense + routed * routed_layers : 4 * config.n_layer);
    const Batch batch = MakeBatch(config, B, 12);
    Harness<float> want(config, B), got(config, B);
    want.SetParams(params);
    got.SetParams(params);
    const double lw = want.Run(batch, true);
    const double lg = got.Run(batch, true, &m16);
    ExpectSameBits(lw, want, lg, got, "16-bit matrices");

    auto lp = got.Layer16(0, m16);
    lp.matrices16[0] = lp.values[0];  // tensor 0 is a norm weight
    Status s = got.compute().LayerForwardGroups(0, 0, kLayerGroups, lp);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("not a matrix"), std::string::npos) << s.ToString();
    lp = got.Layer16(0, m16);
    lp.matrices16.pop_back();
    EXPECT_EQ(got.compute().LayerForwardGroups(0, 0, kLayerGroups, lp).code(), StatusCode::kInvalidArgument);
    Harness<double> d(config, B);
    GptCompute<double>::LayerParams dp{std::vector<const double*>(lp.values.size(), nullptr),
                                       std::vector<const void*>(lp.values.size(), lp.matrices16[1]),
                                       ElementType::kBf16};
    s = d.compute().LayerForwardGroups(0, 0, kLayerGroups, dp);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("do not read"), std::string::npos) << s.ToString();
  }
}

// Layer gradients set (GradMode::kSet, as the trainer asks) into arrays
// full of NaN: every tensor of the walked groups is written whole, with the
// bits of adding into zeroed arrays, for GPT-2, Llama with q/k/v biases and
// Qwen3's q/k norms, recomputed and kept activations, float and its 16-bit
// matrices, and double.
TEST(GptTest, SetLayerGradientsNeedNoZeroing) {
  for (const auto& [config, acts] : {std::pair{Tiny(true), LayerActivations::kRecompute},
                                     std::pair{TinyLlama(false, true), LayerActivations::kRecompute},
                                     std::pair{Tiny(false), LayerActivations::kKeep},
                                     std::pair{TinyLlama(true, false), LayerActivations::kKeep},
                                     std::pair{TinyQwen3(12), LayerActivations::kRecompute},
                                     std::pair{TinyQwen3(6), LayerActivations::kKeep},
                                     std::pair{TinyGemma3(), LayerActivations::kRecompute},
                                     std::pair{TinyGemma3(), LayerActivations::kKeep},
                                     std::pair{TinyOlmo2(), LayerActivations::kRecompute},
                                     std::pair{TinyOlmo2(), LayerActivations::kKeep},
                                     std::pair{TinyGranite(), LayerActivations::kRecompute},
                                     std::pair{TinyGranite(), LayerActivations::kKeep},
                                     std::pair{TinyMoe(false), LayerActivations::kRecompute},
                                     std::pair{TinyMoe(true), LayerActivations::kKeep},
                                     std::pair{TinySparseMoe(), LayerActivations::kRecompute},
                                     std::pair{TinySparseMoe(), LayerActivations::kKeep},
                                     std::pair{TinyMoeAux(), LayerActivations::kRecompute},
                                     std::pair{TinySharedMoe(true), LayerActivations::kRecompute},
                                     std::pair{TinySharedMoe(false), LayerActivations::kKeep},
                                     std::pair{TinyMixedMoe(), LayerActivations::kRecompute},
                                     std::pair{TinyMixedMoe(), LayerActivations::kKeep}}) {
    SCOPED_TRACE(std::string(config.residual_multiplier != 1 ? "granite"
                             : config.post_norms             ? "olmo2"
                             : config.sandwich_norms         ? "gemma3"
                             : config.qk_norm                ? "qwen3"
                             : config.llama()                ? "llama"
                                                             : "gpt2") +
                 (acts == LayerActivations::kKeep ? ", kept activations" : ", recomputed"));
    const int B = 2;
    std::vector<Tensors> params = MakeParams(config, 13);
    const Batch batch = MakeBatch(config, B, 14);
    const Harness<float>::Matrices16 m16 = LayerMatricesToBf16(config, params, nullptr);  // rounds params too
    auto check = [&](auto& add, auto& set, const char* what) {
      SCOPED_TRACE(what);
      for (size_t b = 0; b < params.size(); ++b) {
        for (size_t t = 0; t < params[b].size(); ++t) {
          const auto& ga = add.grads()[b][t];
          const auto& gs = set.grads()[b][t];
          size_t differ = 0;
          for (size_t i = 0; i < ga.size(); ++i) differ += std::memcmp(&ga[i], &gs[i], sizeof(ga[i])) != 0;
          EXPECT_EQ(differ, 0u) << "block " << b << " tensor " << t << " of " << ga.size() << " elements";
        }
      }
    };
    for (const bool sixteen : {false, true}) {
      Harness<float> add(config, B, acts), set(config, B, acts);
      add.SetParams(params);
      set.SetParams(params);
      const Harness<float>::Matrices16* m = sixteen ? &m16 : nullptr;
      add.Run(batch, true, m);
      set.Run(batch, true, m, kernels::GradMode::kSet);
      check(add, set, sixteen ? "float, 16-bit matrices" : "float");
    }
    Harness<double> add(config, B, acts), set(config, B, acts);
    add.SetParams(params);
    set.SetParams(params);
    add.Run(batch, true);
    set.Run(batch, true, nullptr, kernels::GradMode::kSet);
    check(add, set, "double");
  }
}

TEST(GptTest, CheckpointedBackwardIsRepeatable) {
  // The backward recomputes each layer from its saved input; running the
  // whole step twice must give the same gradients bit for bit (nothing is
  // read from a buffer a previous step or layer left behind).
  const GptConfig config = Tiny(true);
  Harness<double> h(config, 2);
  h.SetParams(MakeParams(config, 8));
  const Batch batch = MakeBatch(config, 2, 9);
  const double l1 = h.Run(batch, true);
  const auto g1 = h.grads();
  // A different batch in between scribbles over every activation buffer.
  h.Run(MakeBatch(config, 2, 10), true);
  const double l2 = h.Run(batch, true);
  EXPECT_EQ(l1, l2);
  EXPECT_TRUE(g1 == h.grads());
}

TEST(GptTest, KeptActivationsGiveTheBitsOfTheRecompute) {
  // The kernels are deterministic, so the activations kept from the forward
  // are the ones a recompute would make: the same loss and gradients, bit
  // for bit, whole layers and in group ranges (16-bit matrices), over two
  // batches (each layer's kept set is overwritten by the next forward).
  for (const GptConfig& config :
       {Tiny(true), TinyLlama(false, true), TinyGemma3(), TinyOlmo2(), TinyGranite(), TinyMoe(false), TinyMoeAux(),
        TinySharedMoe(true), TinyMixedMoe(), TinySigmoidMoe(), TinyMla(7), TinyDeepseekV2()}) {
    SCOPED_TRACE(config.residual_multiplier != 1 ? "granite"
                 : config.post_norms             ? "olmo2"
                 : config.sandwich_norms         ? "gemma3"
                 : config.llama()                ? "llama"
                                                 : "gpt2");
    const int B = 2;
    std::vector<Tensors> params = MakeParams(config, 21);
    const Harness<float>::Matrices16 m16 = LayerMatricesToBf16(config, params, nullptr);
    Harness<float> recompute(config, B), keep(config, B, LayerActivations::kKeep);
    EXPECT_FALSE(recompute.compute().keeps_activations());
    EXPECT_TRUE(keep.compute().keeps_activations());
    EXPECT_EQ(keep.compute().activation_bytes() - recompute.compute().activation_bytes(),
              (config.n_layer - 1) * LayerActivationBytes(config, B, /*fused_attention=*/true));
    recompute.SetParams(params);
    keep.SetParams(params);
    for (uint64_t seed : {22, 23}) {
      const Batch batch = MakeBatch(config, B, seed);
      const Harness<float>::Matrices16* const walks[] = {nullptr, &m16};
      for (const Harness<float>::Matrices16* m : walks) {
        const double lr = recompute.Run(batch, true, m);
        const double lk = keep.Run(batch, true, m);
        ExpectSameBits(lr, recompute, lk, keep, "kept, seed " + std::to_string(seed));
      }
    }
    // Nothing to recompute: the call is out of order.
    GptCompute<float>& c = keep.compute();
    const Batch batch = MakeBatch(config, B, 24);
    ASSERT_TRUE(c.SetBatch(batch.inputs.data(), batch.targets.data()).ok());
    ASSERT_TRUE(c.EmbedForward(keep.Const(kEmbedBlock)).ok());
    for (int l = 0; l < config.n_layer; ++l) ASSERT_TRUE(c.LayerForward(l, keep.Const(LayerBlock(l))).ok());
    const BlockId head = HeadBlock(config);
    const bool tied = config.tied_embeddings;
    const BlockId lm_block = tied ? kEmbedBlock : head;
    const int lm = tied ? static_cast<int>(kWte) : LmHeadIndex(config);
    typename GptCompute<float>::HeadGrads hg{keep.Mutable(head), keep.Mutable(lm_block)[lm]};
    ASSERT_TRUE(c.HeadForward(keep.Const(head), keep.Const(lm_block)[lm], &hg, 1.0).ok());
    const int last = config.n_layer - 1;
    const Status s = c.LayerRecomputeGroups(last, 0, kMlpOutGroup, keep.Const(LayerBlock(last)));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("kept"), std::string::npos) << s.ToString();
    // The backward uses the kept set up: a second one needs a new forward.
    ASSERT_TRUE(c.LayerBackward(last, keep.Const(LayerBlock(last)), keep.Mutable(LayerBlock(last))).ok());
    const Status again = c.HeadForward(keep.Const(head), keep.Const(lm_block)[lm], &hg, 1.0).status();
    EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(again.message().find("forward again"), std::string::npos) << again.ToString();
    EXPECT_TRUE(c.HeadForward(keep.Const(head), keep.Const(lm_block)[lm], nullptr, 1.0).ok());  // no backward: fine
  }
}

// Layer inputs in pinned host memory (kOffload, DeepSpeed's
// cpu_checkpointing): the loss and gradients of keeping them on the device,
// bit for bit, with the kernels run in place and queued on a stream (the
// copies on a stream of their own either way), whole layers and in group
// ranges, over two batches with an evaluation's forward between them (each
// forward overwrites the slots), five layers deep so that the three device
// slots turn over twice.
TEST(GptTest, OffloadedLayerInputsGiveTheBitsOfTheRecompute) {
  for (GptConfig config :
       {Tiny(true), TinyLlama(false, true), TinyGemma3(), TinyOlmo2(), TinyGranite(), TinyMoe(false), TinyMoeAux(),
        TinySharedMoe(true), TinyMixedMoe(), TinySigmoidMoe(), TinyMla(7), TinyDeepseekV2()}) {
    config.n_layer = 5;
    SCOPED_TRACE(config.residual_multiplier != 1 ? "granite"
                 : config.post_norms             ? "olmo2"
                 : config.sandwich_norms         ? "gemma3"
                 : config.llama()                ? "llama"
                                                 : "gpt2");
    const int B = 2;
    const int64_t x_bytes = int64_t{B} * config.seq_len * config.n_embd * static_cast<int64_t>(sizeof(float));
    std::vector<Tensors> params = MakeParams(config, 31);
    const Harness<float>::Matrices16 m16 = LayerMatricesToBf16(config, params, nullptr);
    Harness<float> recompute(config, B);
    recompute.SetParams(params);
    EXPECT_EQ(recompute.compute().host_activation_bytes(), 0);
    for (const bool queued : {false, true}) {
      SCOPED_TRACE(queued ? "kernels queued" : "kernels in place");
      Harness<float> offload(config, B, LayerActivations::kOffload, queued);
      EXPECT_FALSE(offload.compute().keeps_activations());
      EXPECT_EQ(recompute.compute().activation_bytes() - offload.compute().activation_bytes(),
                (config.n_layer + 1 - 3) * x_bytes);
      EXPECT_GE(offload.compute().host_activation_bytes(), (config.n_layer + 1) * x_bytes);
      offload.SetParams(params);
      for (uint64_t seed : {32, 33}) {
        const Batch batch = MakeBatch(config, B, seed);
        const Harness<float>::Matrices16* const walks[] = {nullptr, &m16};
        for (const Harness<float>::Matrices16* m : walks) {
          const double lr = recompute.Run(batch, true, m);
          const double lo = offload.Run(batch, true, m);
          ExpectSameBits(lr, recompute, lo, offload, "offloaded, seed " + std::to_string(seed));
        }
        const Batch other = MakeBatch(config, B, seed + 100);
        EXPECT_EQ(recompute.Run(other, false), offload.Run(other, false));
      }
      // The head again after a whole backward (whose look-ahead reused
      // x_L's slot), then a backward abandoned three layers down (its
      // look-ahead copy still queued) before the next step.
      for (Harness<float>* h : {&recompute, &offload}) {
        const Batch batch = MakeBatch(config, B, 35);
        h->Run(batch, true);
        GptCompute<float>& c = h->compute();
        const BlockId head = HeadBlock(config);
        const float* lm = config.tied_embeddings ? h->Const(kEmbedBlock)[kWte] : h->Const(head)[LmHeadIndex(config)];
        auto again = c.HeadForward(h->Const(head), lm, nullptr, 1.0);
        ASSERT_TRUE(again.ok()) << again.status().ToString();
        EXPECT_EQ(*again, recompute.Run(batch, false)) << "the head after a backward";
        ASSERT_TRUE(c.SetBatch(batch.inputs.data(), batch.targets.data()).ok());
        ASSERT_TRUE(c.EmbedForward(h->Const(kEmbedBlock)).ok());
        for (int l = 0; l < config.n_layer; ++l) ASSERT_TRUE(c.LayerForward(l, h->Const(LayerBlock(l))).ok());
        const BlockId lm_block = config.tied_embeddings ? kEmbedBlock : head;
        const int lm_index = config.tied_embeddings ? static_cast<int>(kWte) : LmHeadIndex(config);
        typename GptCompute<float>::HeadGrads hg{h->Mutable(head), h->Mutable(lm_block)[lm_index]};
        ASSERT_TRUE(c.HeadForward(h->Const(head), lm, &hg, 1.0).ok());
        for (int l = config.n_layer - 1; l >= config.n_layer - 3; --l) {
          ASSERT_TRUE(c.LayerBackward(l, h->Const(LayerBlock(l)), h->Mutable(LayerBlock(l))).ok());
        }
        // The kernels (not the copies) done before Run refills the gradients.
        ASSERT_TRUE(c.ops().Synchronize().ok());
      }
      const Batch next = MakeBatch(config, B, 36);
      EXPECT_EQ(recompute.Run(next, true), offload.Run(next, true)) << "the step after an abandoned backward";
      EXPECT_TRUE(recompute.grads() == offload.grads());
    }
    Harness<double> recompute64(config, B), offload64(config, B, LayerActivations::kOffload);
    recompute64.SetParams(params);
    offload64.SetParams(params);
    const Batch batch = MakeBatch(config, B, 34);
    EXPECT_EQ(recompute64.Run(batch, true), offload64.Run(batch, true));
    EXPECT_TRUE(recompute64.grads() == offload64.grads());
  }
}

TEST(GptTest, ActivationMemoryGrowsOneResidualPerLayer) {
  // Checkpointing keeps one [B*T, C] input per layer; everything else is
  // one layer's worth, whatever the depth.
  for (int batch : {1, 3}) {
    std::vector<int64_t> bytes;
    for (int layers : {1, 2, 4}) {
      GptConfig config = Tiny(true);
      config.n_layer = layers;
      Harness<float> h(config, batch);
      bytes.push_back(h.compute().activation_bytes());
    }
    const GptConfig config = Tiny(true);
    const int64_t per_layer = int64_t{batch} * config.seq_len * config.n_embd * static_cast<int64_t>(sizeof(float));
    EXPECT_EQ(bytes[1] - bytes[0], per_layer);
    EXPECT_EQ(bytes[2] - bytes[1], 2 * per_layer);
  }
}

TEST(GptTest, ActivationsCountAgainstTheDeviceBudget) {
  const GptConfig config = Tiny(true);
  auto device = CreateHostDevice(64 << 10);  // far below what tiny needs
  auto ops = CreateCpuOps<float>();
  auto c = GptCompute<float>::Create(config, 2, ops.get(), device.get());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kOutOfMemory) << c.status().ToString();
  EXPECT_EQ(device->bytes_in_use(), 0u);  // what was allocated before the failure is freed

  auto big = CreateHostDevice(0);
  auto ok = GptCompute<float>::Create(config, 2, ops.get(), big.get());
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(static_cast<int64_t>(big->bytes_in_use()) >= (*ok)->activation_bytes(), true);
  ok->reset();
  EXPECT_EQ(big->bytes_in_use(), 0u);
}

TEST(GptTest, CallsOutOfOrderAreRefused) {
  const GptConfig config = Tiny(true);
  Harness<double> h(config, 1);
  h.SetParams(MakeParams(config, 1));
  GptCompute<double>& c = h.compute();
  // Before any batch.
  EXPECT_EQ(c.EmbedForward(h.Const(kEmbedBlock)).code(), StatusCode::kFailedPrecondition);
  const Batch batch = MakeBatch(config, 1, 2);
  ASSERT_TRUE(c.SetBatch(batch.inputs.data(), batch.targets.data()).ok());
  ASSERT_TRUE(c.EmbedForward(h.Const(kEmbedBlock)).ok());
  // Layer 1 before layer 0.
  EXPECT_EQ(c.LayerForward(1, h.Const(LayerBlock(1))).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.LayerForward(5, h.Const(LayerBlock(1))).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.LayerForward(0, {}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(c.LayerForward(0, h.Const(LayerBlock(0))).ok());
  ASSERT_TRUE(c.LayerForward(1, h.Const(LayerBlock(1))).ok());
  // Backward without a head backward.
  EXPECT_EQ(c.LayerBackward(1, h.Const(LayerBlock(1)), h.Mutable(LayerBlock(1))).code(),
            StatusCode::kFailedPrecondition);
  typename GptCompute<double>::HeadGrads hg{h.Mutable(HeadBlock(config)), h.Mutable(kEmbedBlock)[kWte]};
  ASSERT_TRUE(c.HeadForward(h.Const(HeadBlock(config)), h.Const(kEmbedBlock)[kWte], &hg, 1.0).ok());
  // Layer 0 before layer 1.
  EXPECT_EQ(c.LayerBackward(0, h.Const(LayerBlock(0)), h.Mutable(LayerBlock(0))).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.EmbedBackward(h.Mutable(kEmbedBlock)).code(), StatusCode::kFailedPrecondition);
}

TEST(GptTest, BadTokensAreRefused) {
  const GptConfig config = Tiny(true);
  Harness<float> h(config, 1);
  Batch batch = MakeBatch(config, 1, 2);
  batch.targets[5] = config.vocab_size;
  Status s = h.compute().SetBatch(batch.inputs.data(), batch.targets.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("target token 5"), std::string::npos) << s.ToString();
  batch = MakeBatch(config, 1, 2);
  batch.inputs[0] = -1;
  EXPECT_EQ(h.compute().SetBatch(batch.inputs.data(), batch.targets.data()).code(), StatusCode::kInvalidArgument);
}

TEST(GptTest, LossWithAndWithoutGradientsAgreeAndScaleScalesGradients) {
  const GptConfig config = Tiny(true);
  Harness<double> h(config, 2);
  h.SetParams(MakeParams(config, 3));
  const Batch batch = MakeBatch(config, 2, 4);
  const double l_fwd = h.Run(batch, false);
  const double l_bwd = h.Run(batch, true);
  EXPECT_EQ(l_fwd, l_bwd);
  const auto g1 = h.grads();
  // loss_scale multiplies every gradient.
  GptCompute<double>& c = h.compute();
  ASSERT_TRUE(c.SetBatch(batch.inputs.data(), batch.targets.data()).ok());
  ASSERT_TRUE(c.EmbedForward(h.Const(kEmbedBlock)).ok());
  for (int l = 0; l < config.n_layer; ++l) ASSERT_TRUE(c.LayerForward(l, h.Const(LayerBlock(l))).ok());
  std::vector<std::vector<double>> head_grads(2, std::vector<double>(config.n_embd, 0.0));
  std::vector<double> wte_grad(g1[kEmbedBlock][kWte].size(), 0.0);
  typename GptCompute<double>::HeadGrads hg{{head_grads[0].data(), head_grads[1].data()}, wte_grad.data()};
  StatusOr<double> l = c.HeadForward(h.Const(HeadBlock(config)), h.Const(kEmbedBlock)[kWte], &hg, 8.0);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(*l, l_fwd);  // the loss itself is not scaled
  for (int i = 0; i < config.n_embd; ++i) {
    EXPECT_NEAR(head_grads[0][i], 8.0 * g1[HeadBlock(config)][kLnfW][i], 1e-12);
    EXPECT_NEAR(head_grads[1][i], 8.0 * g1[HeadBlock(config)][kLnfB][i], 1e-12);
  }
}

// Plain gradient descent from the GPT-2 initialisation, small steps: the
// LayerNorms amplify the tiny initial residual stream, so larger learning
// rates overshoot now and then without anything being wrong.
TEST(GptTest, SgdOnAFixedBatchLowersTheLoss) {
  const GptConfig config = Tiny(true);
  const int B = 2;
  Harness<float> h(config, B);
  std::vector<Tensors> params;
  for (BlockId b = 0; b <= HeadBlock(config); ++b) {
    Tensors t;
    for (const auto& v : InitBlockWeights(config, b, 11)) t.emplace_back(v.begin(), v.end());
    params.push_back(std::move(t));
  }
  h.SetParams(params);
  const Batch batch = MakeBatch(config, B, 12);
  std::vector<double> losses;
  for (int step = 0; step < 10; ++step) {
    losses.push_back(h.Run(batch, true));
    for (size_t b = 0; b < h.params().size(); ++b)
      for (size_t t = 0; t < h.params()[b].size(); ++t)
        for (size_t i = 0; i < h.params()[b][t].size(); ++i) h.params()[b][t][i] -= 0.05f * h.grads()[b][t][i];
  }
  for (size_t i = 1; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[i - 1]) << "step " << i;
  EXPECT_LT(losses.back(), losses.front() - 0.3);
}

// ---------------------------------------------------------------- config

TEST(GptConfigTest, BuiltinsHaveTheDocumentedShapes) {
  const std::vector<std::string> names = BuiltinGptConfigNames();
  EXPECT_EQ(names, (std::vector<std::string>{"tiny", "demo", "small", "gpt2-124m", "100B", "175B"}));
  auto tiny = LoadGptConfig("tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->vocab_size, 257);
  EXPECT_EQ(tiny->padded_vocab_size, 320);
  EXPECT_EQ(tiny->seq_len, 32);
  EXPECT_EQ(tiny->n_layer, 2);
  EXPECT_EQ(tiny->n_head, 2);
  EXPECT_EQ(tiny->n_embd, 32);
  EXPECT_TRUE(tiny->tied_embeddings);
  auto gpt2 = LoadGptConfig("gpt2-124m");
  ASSERT_TRUE(gpt2.ok());
  EXPECT_EQ(gpt2->padded_vocab_size, 50304);
  // GPT-2 small with the vocabulary padded to 50304 (llm.c's count).
  EXPECT_EQ(gpt2->NumParameters(), 124475904);
  // GPT-3 175B: 96 layers of 12 C^2 + 13 C at C = 12288, tied embeddings of
  // 50304 x 12288 and 2048 positions: 174.6B (GPT-3's "175B").
  auto gpt3 = LoadGptConfig("175B");
  ASSERT_TRUE(gpt3.ok());
  EXPECT_EQ(gpt3->n_layer, 96);
  EXPECT_EQ(gpt3->n_embd, 12288);
  EXPECT_EQ(gpt3->n_embd / gpt3->n_head, 128);
  EXPECT_EQ(gpt3->seq_len, 2048);
  EXPECT_EQ(gpt3->NumParameters(),
            96 * (12 * int64_t{12288} * 12288 + 13 * 12288) + (50304 + 2048) * 12288 + 2 * 12288);
  auto b100 = LoadGptConfig("100B");
  ASSERT_TRUE(b100.ok());
  EXPECT_NEAR(static_cast<double>(b100->NumParameters()), 1e11, 1e9);
  for (const std::string& n : names) {
    auto c = LoadGptConfig(n);
    ASSERT_TRUE(c.ok()) << n;
    for (bool tied : {true, false}) {
      c->tied_embeddings = tied;
      int64_t total = 0;
      for (const BlockSpec& b : GptBlockSpecs(*c)) total += b.numel();
      EXPECT_EQ(total, c->NumParameters()) << n;
    }
  }
}

// The llama family's count is its blocks' too: biases, q/k norms, sandwich
// norms, experts with a shared expert and dense layers among them; the
// active count leaves out each routed layer's E - K idle experts.
TEST(GptConfigTest, LlamaParameterCountsAreTheBlocks) {
  for (const GptConfig& c : {TinyLlama(true, true), TinyGemma3(), TinyMoe(false), TinySharedMoe(true), TinyMixedMoe(),
                             TinySigmoidMoe(), TinyMla(7), TinyDeepseekV2()}) {
    int64_t total = 0;
    for (const BlockSpec& b : GptBlockSpecs(c)) total += b.numel();
    EXPECT_EQ(total, c.NumParameters()) << GptConfigToJson(c);
  }
  const GptConfig m = TinyMixedMoe();  // one routed layer of 4 experts, 2 a token
  EXPECT_EQ(m.NumParameters() - m.ActiveParameters(), int64_t{2} * 3 * m.intermediate_size * m.n_embd);
}

TEST(GptConfigTest, JsonRoundTrips) {
  GptConfig c;
  c.vocab_size = 1000;
  c.padded_vocab_size = 1024;
  c.seq_len = 48;
  c.n_layer = 3;
  c.n_head = 6;
  c.n_embd = 96;
  c.tied_embeddings = false;
  auto parsed = ParseGptConfig(GptConfigToJson(c), "roundtrip");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->vocab_size, 1000);
  EXPECT_EQ(parsed->padded_vocab_size, 1024);
  EXPECT_EQ(parsed->seq_len, 48);
  EXPECT_EQ(parsed->n_layer, 3);
  EXPECT_EQ(parsed->n_head, 6);
  EXPECT_EQ(parsed->n_embd, 96);
  EXPECT_FALSE(parsed->tied_embeddings);
}

// The checkpoints' model identity holds latent attention's shape (a
// checkpoint of another rank is not resumed), and nothing of it without.
TEST(GptConfigTest, JsonNamesTheLatentAttention) {
  const std::string mla = GptConfigToJson(TinyMla(7));
  for (const char* k : {"\"kv_lora_rank\": 5", "\"q_lora_rank\": 7", "\"qk_rope_head_dim\": 4", "\"v_head_dim\": 3",
                        "\"latent_norm_eps\": 1e-06"}) {
    EXPECT_NE(mla.find(k), std::string::npos) << k << " in " << mla;
  }
  EXPECT_NE(mla, GptConfigToJson(TinyMla(0)));
  EXPECT_EQ(GptConfigToJson(TinySigmoidMoe()).find("lora"), std::string::npos);
  EXPECT_EQ(AttentionNote(TinyMla(7)), " (latent attention: kv rank 5, q rank 7)");
  EXPECT_EQ(AttentionNote(TinyMla(0)), " (latent attention: kv rank 5)");
  EXPECT_EQ(AttentionNote(TinySigmoidMoe()), "");
}

// The checkpoints' model identity tells the routers apart: a selection
// bias on the softmax and a floor on the sum are named; the sigmoid
// router's bias is implied (GLM-4.5's identity as it was before the field).
TEST(GptConfigTest, JsonNamesTheRoutersBiasAndFloor) {
  const GptConfig ernie = TinyErnieMoe(1e-12);
  GptConfig plain = ernie;
  plain.router_bias = false;
  plain.router_norm_min = 0;
  GptConfig floor = ernie;
  floor.router_norm_min = 0.5;
  const std::string e = GptConfigToJson(ernie);
  EXPECT_NE(e.find("\"router_bias\": true"), std::string::npos) << e;
  EXPECT_NE(e, GptConfigToJson(plain));
  EXPECT_NE(e, GptConfigToJson(floor));
  const std::string glm = GptConfigToJson(TinySigmoidMoe());
  EXPECT_EQ(glm.find("router_bias"), std::string::npos) << glm;
  EXPECT_NE(glm.find("\"router_scoring\": \"sigmoid\""), std::string::npos) << glm;
}

// Field combinations no architecture has, and values the kernels cannot
// take, are refused by GptCompute::Create (each would compute something
// else silently: q/k norms over all heads with 1 + w would overrun the
// norm weights' buffer; a multiplier beside branch norms would share their
// gradient buffer).
TEST(GptConfigTest, CreateRefusesFieldsThatDoNotGoTogether) {
  // kYarn: the tiny Llama with YaRN for llama3, valid as it is; kMoe: the
  // tiny mixture with dense layers and a shared expert; kSigmoid: GLM-4.5's
  // (6 experts in 3 groups, 2 candidates, 3 a token); kErnie: ERNIE 4.5's
  // (a softmax with a selection bias and a floor); kMla: DeepSeek-V3's
  // latent attention
  enum Base { kGpt2, kLlama, kYarn, kMoe, kSigmoid, kErnie, kMla };
  auto base = [](Base b) {
    GptConfig c = b == kGpt2      ? Tiny(true)
                  : b == kMoe     ? TinyMixedMoe()
                  : b == kSigmoid ? TinySigmoidMoe()
                  : b == kErnie   ? TinyErnieMoe(1e-12)
                  : b == kMla     ? TinyMla(7)
                                  : TinyLlama(false, false);
    if (b == kYarn) {
      c.rope.llama3 = false;
      c.rope.yarn = true;
      c.rope.factor = 4;
    }
    return c;
  };
  struct Bad {
    const char* what;
    Base base;
    std::function<void(GptConfig&)> change;
  };
  const Bad bad[] = {
      {"post and sandwich norms", kLlama, [](GptConfig& c) { c.post_norms = c.sandwich_norms = true; }},
      {"post norms and a residual multiplier", kLlama,
       [](GptConfig& c) {
         c.post_norms = true;
         c.residual_multiplier = 0.5;
       }},
      {"sandwich norms and a residual multiplier", kLlama,
       [](GptConfig& c) {
         c.sandwich_norms = true;
         c.residual_multiplier = 0.5;
       }},
      {"all-heads q/k norms without q/k norms", kLlama, [](GptConfig& c) { c.qk_norm_all_heads = true; }},
      {"all-heads q/k norms by 1 + w", kLlama,
       [](GptConfig& c) { c.qk_norm = c.qk_norm_all_heads = c.norm_unit_offset = true; }},
      {"Gemma's and Granite's embedding scales", kLlama,
       [](GptConfig& c) {
         c.embed_scale = true;
         c.embed_multiplier = 2.0;
       }},
      {"a softcap of infinity", kLlama, [](GptConfig& c) { c.attn_softcap = INFINITY; }},
      {"a softcap that is 0 as a float", kLlama, [](GptConfig& c) { c.final_softcap = 1e-300; }},
      {"a negative logits scaling", kLlama, [](GptConfig& c) { c.logits_scaling = -8.0; }},
      {"a residual multiplier past float's range", kLlama, [](GptConfig& c) { c.residual_multiplier = 1e300; }},
      {"a softcap past float's range", kLlama, [](GptConfig& c) { c.attn_softcap = 1e300; }},
      {"YaRN over rope_theta 1", kYarn, [](GptConfig& c) { c.rope.theta = 1; }},
      {"YaRN with beta_slow 0", kYarn, [](GptConfig& c) { c.rope.beta_slow = 0; }},
      {"YaRN with factor 0", kYarn, [](GptConfig& c) { c.rope.factor = 0; }},
      {"YaRN with an infinite attention factor", kYarn, [](GptConfig& c) { c.rope.attention_factor = INFINITY; }},
      {"YaRN and llama3 at once", kYarn, [](GptConfig& c) { c.rope.llama3 = true; }},
      {"GPT-2 with a residual multiplier", kGpt2, [](GptConfig& c) { c.residual_multiplier = 0.5; }},
      {"GPT-2 with post norms", kGpt2, [](GptConfig& c) { c.post_norms = true; }},
      {"GPT-2 with a softcap", kGpt2, [](GptConfig& c) { c.attn_softcap = 50; }},
      {"GPT-2 with dense layers", kGpt2, [](GptConfig& c) { c.dense_layers = {0}; }},
      {"dense layers without experts", kLlama,
       [](GptConfig& c) {
         c.dense_layers = {0};
         c.dense_intermediate_size = 8;
       }},
      {"every layer dense", kMoe,
       [](GptConfig& c) {
         c.dense_layers = {0, 1, 2};
       }},
      {"dense layers out of order", kMoe,
       [](GptConfig& c) {
         c.dense_layers = {2, 0};
       }},
      {"a dense layer past the model", kMoe,
       [](GptConfig& c) {
         c.dense_layers = {0, 3};
       }},
      {"dense layers of width 0", kMoe, [](GptConfig& c) { c.dense_intermediate_size = 0; }},
      {"a shared expert without experts", kLlama, [](GptConfig& c) { c.shared_expert_size = 8; }},
      {"a sigmoid router without experts", kLlama,
       [](GptConfig& c) { c.router_scoring = kernels::MoeScoring::kSigmoid; }},
      {"expert groups with the load-balancing loss", kMoe, [](GptConfig& c) { c.router_groups = 2; }},
      {"groups scored by their 3 best", kSigmoid, [](GptConfig& c) { c.router_group_best = 3; }},
      {"groups scored by their 0 best", kSigmoid, [](GptConfig& c) { c.router_group_best = 0; }},
      {"a router kept in fp32 without experts", kLlama, [](GptConfig& c) { c.router_fp32 = true; }},
      {"expert groups that do not divide the experts", kSigmoid, [](GptConfig& c) { c.router_groups = 4; }},
      {"expert groups of one", kSigmoid,
       [](GptConfig& c) {
         c.router_groups = 6;
         c.router_topk_groups = 3;
       }},
      {"candidate groups too few for the experts a token takes", kSigmoid,
       [](GptConfig& c) { c.router_topk_groups = 1; }},
      {"more candidate groups than groups", kSigmoid, [](GptConfig& c) { c.router_topk_groups = 4; }},
      {"a load-balancing loss with a sigmoid router", kSigmoid, [](GptConfig& c) { c.router_aux_coef = 0.3; }},
      {"a load-balancing loss with a selection bias", kErnie, [](GptConfig& c) { c.router_aux_coef = 0.3; }},
      {"a sigmoid router without its selection bias", kSigmoid, [](GptConfig& c) { c.router_bias = false; }},
      {"a selection bias without experts", kLlama, [](GptConfig& c) { c.router_bias = true; }},
      {"a floor on the sum of weights not normalized", kErnie, [](GptConfig& c) { c.norm_topk_prob = false; }},
      {"a negative floor on the sum", kErnie, [](GptConfig& c) { c.router_norm_min = -1; }},
      {"an infinite floor on the sum", kErnie, [](GptConfig& c) { c.router_norm_min = INFINITY; }},
      {"a routed scale of 0", kMoe, [](GptConfig& c) { c.routed_scale = 0; }},
      {"a routed scale without experts", kLlama, [](GptConfig& c) { c.routed_scale = 2; }},
      {"a shared expert's gate without the expert", kMoe,
       [](GptConfig& c) {
         c.shared_expert_size = 0;
         c.shared_expert_gate = true;
       }},
      {"latent attention in GPT-2", kGpt2,
       [](GptConfig& c) {
         c.kv_lora_rank = 4;
         c.qk_rope_head_dim = 2;
         c.v_head_dim = 2;
       }},
      {"a q latent without the kv latent", kLlama, [](GptConfig& c) { c.q_lora_rank = 4; }},
      {"rotated key columns without the kv latent", kLlama, [](GptConfig& c) { c.qk_rope_head_dim = 4; }},
      {"latent attention of an odd rotated width", kMla, [](GptConfig& c) { c.qk_rope_head_dim = 3; }},
      {"latent attention rotating more than a head", kMla, [](GptConfig& c) { c.qk_rope_head_dim = 8; }},
      {"latent attention's values wider than a head", kMla, [](GptConfig& c) { c.v_head_dim = 7; }},
      {"latent attention's values of no width", kMla, [](GptConfig& c) { c.v_head_dim = 0; }},
      {"latent attention with fewer key/value heads", kMla, [](GptConfig& c) { c.n_kv_head = 2; }},
      {"latent attention with q/k biases", kMla, [](GptConfig& c) { c.qkv_bias = true; }},
      {"latent attention with q/k norms", kMla, [](GptConfig& c) { c.qk_norm = true; }},
      {"latent attention with a NoPE layer", kMla, [](GptConfig& c) { c.no_rope_layers = {1}; }},
      {"latent attention with a partial rotary factor", kMla, [](GptConfig& c) { c.rope.partial_factor = 0.5; }},
      {"latent attention without a head size", kMla, [](GptConfig& c) { c.head_size = 0; }},
      {"latent norms of eps 0", kMla, [](GptConfig& c) { c.latent_norm_eps = 0; }},
      {"a negative q rank", kMla, [](GptConfig& c) { c.q_lora_rank = -1; }},
  };
  auto ops = CreateCpuOps<float>();
  auto device = CreateHostDevice(0);
  for (Base b : {kLlama, kYarn, kMoe, kSigmoid, kErnie, kMla}) {
    EXPECT_TRUE(GptCompute<float>::Create(base(b), 1, ops.get(), device.get()).ok()) << b;
  }
  for (const Bad& b : bad) {
    GptConfig config = base(b.base);
    b.change(config);
    auto c = GptCompute<float>::Create(config, 1, ops.get(), device.get());
    EXPECT_FALSE(c.ok()) << b.what;
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << b.what;
    }
  }
}

void ExpectConfigError(const std::string& json, const std::string& key) {
  auto c = ParseGptConfig(json, "model.json");
  ASSERT_FALSE(c.ok()) << json;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("model.json"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find(key), std::string::npos) << c.status().message();
}

TEST(GptConfigTest, ErrorsNameTheKey) {
  const std::string base = R"("vocab_size": 257, "seq_len": 16, "n_head": 2, "n_embd": 8)";
  ExpectConfigError("{" + base + R"(, "n_layer": "two"})", "n_layer");
  ExpectConfigError("{" + base + R"(, "n_layer": 2.5})", "n_layer");
  ExpectConfigError("{" + base + R"(, "n_layer": 0})", "n_layer");
  ExpectConfigError("{" + base + R"(, "n_layer": -3})", "n_layer");
  ExpectConfigError("{" + base + R"(, "n_layer": 2, "n_layers": 3})", "n_layers");
  ExpectConfigError("{" + base + R"(, "n_layer": 2, "tied_embeddings": "yes"})", "tied_embeddings");
  ExpectConfigError("{" + base + R"(, "n_layer": 2, "padded_vocab_size": 300})", "padded_vocab_size");
  ExpectConfigError("{" + base + "}", "n_layer");  // missing
  ExpectConfigError(R"({"vocab_size": 257, "seq_len": 16, "n_layer": 2, "n_head": 3, "n_embd": 8})", "n_embd");
  ExpectConfigError("[1, 2]", "object");
  ExpectConfigError("{" + base, "JSON");
  // The same keys are fine.
  auto ok = ParseGptConfig("{" + base + R"(, "n_layer": 2, "padded_vocab_size": 320})", "model.json");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->padded_vocab_size, 320);
  EXPECT_TRUE(ok->tied_embeddings);
}

TEST(GptConfigTest, LoadsFilesAndRefusesUnknownNames) {
  auto missing = LoadGptConfig("no-such-model");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("tiny"), std::string::npos);

  const std::string path = ::testing::TempDir() + "gpt_test_model.json";
  {
    std::ofstream f(path);
    f << R"({"vocab_size": 300, "seq_len": 8, "n_layer": 1, "n_head": 1, "n_embd": 4, "tied_embeddings": false})";
  }
  auto c = LoadGptConfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->padded_vocab_size, 320);
  EXPECT_FALSE(c->tied_embeddings);
  {
    std::ofstream f(path);
    f << R"({"vocab_size": 300, "seq_len": 8, "n_layer": 1, "n_head": 1, "n_embd": 4, "dropout": 0.1})";
  }
  auto bad = LoadGptConfig(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path), std::string::npos);
  EXPECT_NE(bad.status().message().find("dropout"), std::string::npos);
  std::remove(path.c_str());
}

// ---------------------------------------------------------------- init

double Std(const std::vector<float>& v) {
  double m = 0, s = 0;
  for (float x : v) m += x;
  m /= v.size();
  for (float x : v) s += (x - m) * (x - m);
  return std::sqrt(s / v.size());
}

TEST(GptInitTest, DeterministicAndGpt2Scaled) {
  GptConfig config = *LoadGptConfig("small");
  config.tied_embeddings = false;
  const auto a = InitBlockWeights(config, LayerBlock(2), 1234);
  const auto b = InitBlockWeights(config, LayerBlock(2), 1234);
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a == InitBlockWeights(config, LayerBlock(2), 1235));
  EXPECT_FALSE(a == InitBlockWeights(config, LayerBlock(3), 1234));
  // Independent of the other blocks: the same whatever is asked before.
  InitBlockWeights(config, kEmbedBlock, 1234);
  EXPECT_TRUE(a == InitBlockWeights(config, LayerBlock(2), 1234));

  const double proj_std = 0.02 / std::sqrt(2.0 * config.n_layer);
  EXPECT_NEAR(Std(a[kQkvW]), 0.02, 0.02 * 0.02);  // 442k samples: ~0.1% sampling error
  EXPECT_NEAR(Std(a[kFcW]), 0.02, 0.02 * 0.02);
  EXPECT_NEAR(Std(a[kAttProjW]), proj_std, proj_std * 0.03);
  EXPECT_NEAR(Std(a[kFcProjW]), proj_std, proj_std * 0.02);
  for (int t : {kLn1W, kLn2W}) {
    for (float x : a[t]) ASSERT_EQ(x, 1.0f);
  }
  for (int t : {kLn1B, kLn2B, kQkvB, kAttProjB, kFcB, kFcProjB}) {
    for (float x : a[t]) ASSERT_EQ(x, 0.0f);
  }
  const auto embed = InitBlockWeights(config, kEmbedBlock, 1234);
  const auto head = InitBlockWeights(config, HeadBlock(config), 1234);
  ASSERT_EQ(head.size(), 3u);
  for (const auto* t : {&embed[kWte], &head[kLmHead]}) {
    const std::vector<float> real(t->begin(), t->begin() + int64_t{config.vocab_size} * config.n_embd);
    EXPECT_NEAR(Std(real), 0.02, 0.02 * 0.02);
    for (size_t i = real.size(); i < t->size(); ++i) ASSERT_EQ((*t)[i], 0.0f) << "padding row";
  }
  EXPECT_NEAR(Std(embed[kWpe]), 0.02, 0.02 * 0.02);
  for (float x : head[kLnfW]) ASSERT_EQ(x, 1.0f);
  for (float x : head[kLnfB]) ASSERT_EQ(x, 0.0f);
}

// Each value depends on its place alone: any cut of a tensor into ranges,
// filled on any number of threads, gives the whole tensor's bits, across
// pair boundaries and the padding rows' edge.
TEST(GptInitTest, AnyRangeOnAnyThreadsGivesTheWholeTensorsBits) {
  GptConfig config = *LoadGptConfig("small");
  config.tied_embeddings = false;
  const RandomInit init(config, 99);
  const int threads = kernels::cpu::Threads();
  struct RestoreThreads {
    int threads;
    ~RestoreThreads() { kernels::cpu::SetThreads(threads); }
  } restore{threads};
  const int64_t real_vocab = int64_t{config.vocab_size} * config.n_embd;
  for (BlockId b : {kEmbedBlock, LayerBlock(1), HeadBlock(config)}) {
    const std::vector<std::vector<float>> whole = init.Block(b);
    for (int n_threads : {1, 3}) {
      kernels::cpu::SetThreads(n_threads);
      for (size_t t = 0; t < whole.size(); ++t) {
        const auto n = static_cast<int64_t>(whole[t].size());
        std::vector<int64_t> cuts = {0, 1, 2, 5, n / 3 + 1, n / 2, n - 1, n};
        if (real_vocab < n) cuts.insert(cuts.end(), {real_vocab - 3, real_vocab, real_vocab + 5});
        std::sort(cuts.begin(), cuts.end());
        cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
        std::vector<float> pieced(static_cast<size_t>(n), -1.0f);
        for (size_t c = 0; c + 1 < cuts.size(); ++c) {
          if (cuts[c] < 0 || cuts[c + 1] > n) continue;
          init.Fill(b, t, cuts[c], cuts[c + 1] - cuts[c], pieced.data() + cuts[c]);
        }
        ASSERT_EQ(std::memcmp(pieced.data(), whole[t].data(), whole[t].size() * sizeof(float)), 0)
            << "block " << b << " tensor " << t << " on " << n_threads << " thread(s)";
      }
    }
  }
}

// The draws are standard normal (scaled by the tensor's std) and
// independent: within five standard errors (fixed seeds, so the check
// cannot flicker) for the mean, the variance, the shares within 1, 2 and
// 3 sigma, neighbours (within a pair and across pairs) and the same place
// in two tensors.
TEST(GptInitTest, DrawsAreNormalAndIndependent) {
  const GptConfig config = *LoadGptConfig("small");
  const std::vector<std::vector<float>> layer = RandomInit(config, 5).Block(LayerBlock(0));
  const std::vector<float>& x = layer[kFcW];
  const std::vector<float>& y = layer[kQkvW];
  const auto n = static_cast<double>(x.size());
  double mean = 0, var = 0, within[3] = {0, 0, 0}, lag_in = 0, lag_across = 0, cross = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double z = x[i] / 0.02;
    mean += z / n;
    var += z * z / n;
    for (int k = 0; k < 3; ++k) within[k] += std::abs(z) < k + 1 ? 1 / n : 0;
    if (i + 1 < x.size()) ((i % 2 == 0) ? lag_in : lag_across) += z * x[i + 1] / 0.02 / (n / 2);
    if (i < y.size()) cross += z * y[i] / 0.02 / static_cast<double>(y.size());
  }
  const double se = 1 / std::sqrt(n);
  EXPECT_NEAR(mean, 0.0, 5 * se);
  EXPECT_NEAR(var, 1.0, 5 * std::sqrt(2.0) * se);
  const double share[3] = {0.682689492, 0.954499736, 0.997300204};
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(within[k], share[k], 5 * std::sqrt(share[k] * (1 - share[k])) * se) << k + 1;
  EXPECT_NEAR(lag_in, 0.0, 5 * std::sqrt(2.0) * se);
  EXPECT_NEAR(lag_across, 0.0, 5 * std::sqrt(2.0) * se);
  EXPECT_NEAR(cross, 0.0, 5 / std::sqrt(static_cast<double>(y.size())));
}

}  // namespace
}  // namespace zinf::model
