// The offload planner (model/plan.h): parameter counts and derived shapes,
// the 100B-on-one-GPU case, configs that parse, and the estimate checked
// against what the Trainer really allocates on the host device.
//
// Tolerances: the resident device bytes (everything but gathered blocks)
// must match Device::bytes_in_use after a step to within 1%; the gathered
// blocks the engine held at their peak must not exceed the estimate; a host
// device whose budget is exactly the estimate must train.
#include "model/plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>

#include "core/units.h"
#include "device/device.h"
#include "model/ops.h"
#include "model/trainer.h"
#include "swap/optimizer_swapper.h"
#include "swap/swap_test_util.h"
#include "zero3/buffer_plan.h"

namespace zinf::model {
namespace {

using swap::testing::TempDir;

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(PlanTest, ParsesParameterCounts) {
  EXPECT_EQ(*ParseParameterCount("100B"), 100'000'000'000);
  EXPECT_EQ(*ParseParameterCount("7b"), 7'000'000'000);
  EXPECT_EQ(*ParseParameterCount("350M"), 350'000'000);
  EXPECT_EQ(*ParseParameterCount("1.3e9"), 1'300'000'000);
  EXPECT_EQ(*ParseParameterCount("125000000"), 125'000'000);
  for (const char* bad : {"", "abc", "-5B", "1.5X", "B"}) {
    auto r = ParseParameterCount(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--model"), std::string::npos);
  }
}

TEST(PlanTest, DerivedShapeHasAboutTheCount) {
  for (int64_t p : {int64_t{125'000'000}, int64_t{1'300'000'000}, int64_t{7'000'000'000}, int64_t{100'000'000'000}}) {
    auto g = GptConfigForParameterCount(p, 2048, 50257);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->n_embd % 128, 0);
    EXPECT_EQ(g->n_embd / g->n_head, 128);
    EXPECT_NEAR(static_cast<double>(g->NumParameters()), static_cast<double>(p), 0.06 * static_cast<double>(p)) << p;
  }
  auto g = GptConfigForParameterCount(100'000'000'000, 2048, 50257);
  EXPECT_EQ(g->n_embd, 10240);
  EXPECT_EQ(g->n_layer, 79);
  EXPECT_FALSE(GptConfigForParameterCount(1000, 2048, 50257).ok());
}

PlanInputs HundredB() {
  PlanInputs in;
  in.model = *GptConfigForParameterCount(100'000'000'000, 2048, 50257);
  in.gpu_bytes = 24 * kGiB;
  in.cpu_bytes = 128 * kGiB;  // less than the 16-bit parameters (186 GiB): they go to NVMe
  in.nvme_bytes = 2048 * kGiB;
  in.nvme_paths = {"/nvme0"};
  return in;
}

const PlanOption& Find(const Plan& plan, OffloadDevice p, OffloadDevice o) {
  for (const PlanOption& opt : plan.options) {
    if (opt.param == p && opt.optimizer == o) return opt;
  }
  ADD_FAILURE() << "no such option";
  return plan.options.front();
}

// 100B parameters, one 24 GiB GPU, 256 GiB RAM, 2 TiB NVMe: the 16-bit
// parameters (200 GB) do not fit the GPU and the fp32 optimizer state (1.6
// TB) does not fit RAM, so the model states fit only with both on NVMe (or
// parameters in RAM); nvme/nvme fits RAM, NVMe and, with the 16-bit mode's
// fused attention (no B*NH*T*T probabilities or scores: 2.7 GB at
// sequence 2048), the GPU with whole layers; in fp32 compute the GPU
// buffers do not fit 24 GiB, and nvme/nvme is the closest.
TEST(PlanTest, HundredBillionOnOneGpuPicksNvmeNvme) {
  auto plan = MakePlan(HundredB());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_GE(plan->chosen, 0);
  const PlanOption& chosen = plan->options[static_cast<size_t>(plan->chosen)];
  EXPECT_EQ(chosen.param, OffloadDevice::kNvme);
  EXPECT_EQ(chosen.optimizer, OffloadDevice::kNvme);
  EXPECT_TRUE(chosen.state_fits);
  EXPECT_TRUE(plan->chosen_fits);
  // RAM: only windows (the gradient accumulates on NVMe, the new
  // parameters go home through a ring): they fit 128 GiB.
  EXPECT_TRUE(chosen.fits_cpu);
  EXPECT_TRUE(chosen.fits_nvme);
  for (OffloadDevice o : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    EXPECT_FALSE(Find(*plan, OffloadDevice::kNone, o).state_fits);  // 200 GB of parameters on a 24 GiB GPU
  }
  for (OffloadDevice p : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    EXPECT_FALSE(Find(*plan, p, OffloadDevice::kCpu).state_fits);  // 1.6 TB of optimizer state in RAM
  }
  // Swap files: 2 B + 16 B (master, m, v, gradient) per parameter.
  EXPECT_NEAR(static_cast<double>(chosen.nvme_bytes), 18e11, 0.02 * 18e11);
  // Both pools are sized for the model, not the defaults.
  const ZeroConfig& z = chosen.config.zero;
  EXPECT_GE(z.offload_param.buffer_size, int64_t{12} * 10240 * 10240);  // a whole layer shard
  EXPECT_GE(z.offload_param.buffer_count * z.offload_param.buffer_size, z.stage3_prefetch_bucket_size);

  PlanInputs fp32 = HundredB();
  fp32.compute16 = false;
  auto unfused = MakePlan(fp32);
  ASSERT_TRUE(unfused.ok()) << unfused.status().ToString();
  ASSERT_GE(unfused->chosen, 0);
  EXPECT_EQ(unfused->options[static_cast<size_t>(unfused->chosen)].param, OffloadDevice::kNvme);
  EXPECT_FALSE(unfused->chosen_fits);  // the GPU: the trainer's fp32 scratch and activations
}

// The RAM column of every option is the BufferPlan's host items, exactly
// (per rank, times the ranks of the node). For GPT-3 175B on one 24 GiB GPU
// with 128 GiB of RAM and 100B with 96 GiB, parameters and optimizer on NVMe:
// RAM holds no whole-shard buffer (no fp32 gradient accumulator, the new
// parameters through a ring smaller than the shard, no start-up master),
// only windows of a shard or a sub-group, and they fit (fits_cpu; also
// cli/plan_175b_json).
TEST(PlanTest, RamOfNvmeTiersIsTheBufferPlansWindows) {
  struct Case {
    const char* model;
    int64_t ram;
    int world;
  };
  for (const Case& c : {Case{"175B", 128 * kGiB, 1}, Case{"100B", 96 * kGiB, 1}, Case{"175B", 128 * kGiB, 2}}) {
    SCOPED_TRACE(std::string(c.model) + " world " + std::to_string(c.world));
    PlanInputs in;
    in.model = *LoadGptConfig(c.model);
    in.world_size = c.world;
    in.gpu_bytes = 24 * kGiB;
    in.cpu_bytes = c.ram;
    in.nvme_bytes = 8192 * kGiB;
    in.nvme_paths = {"/nvme0"};
    auto plan = MakePlan(in);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (const PlanOption& o : plan->options) {
      const zero3::BufferPlan& bp = o.buffers;
      EXPECT_EQ(o.pinned_bytes, c.world * bp.TierBytes(Tier::kPinned));
      EXPECT_EQ(o.pageable_bytes, c.world * bp.TierBytes(Tier::kPageable));
    }
    const PlanOption& o = Find(*plan, OffloadDevice::kNvme, OffloadDevice::kNvme);
    const zero3::BufferPlan& bp = o.buffers;
    auto mapped = [](const aio::PinnedPoolOptions& p) {
      return p.buffer_count > 0 ? aio::PinnedPool::MappedBytes(p) : int64_t{0};
    };
    EXPECT_EQ(mapped(bp.grad_accumulator), 0);
    EXPECT_GT(bp.new_params_ring_elems, 0);
    EXPECT_LT(bp.new_params_ring_elems, bp.total_shard_elems);
    EXPECT_LE(mapped(bp.new_params), AlignUp(bp.new_params_ring_elems * bp.param_elem_bytes, 2 << 20));
    const int64_t ram = o.pinned_bytes + o.pageable_bytes;
    std::printf("%s x%d nvme/nvme: RAM %lld B (%.2f GiB)\n", c.model, c.world, static_cast<long long>(ram),
                static_cast<double>(ram) / static_cast<double>(kGiB));
    EXPECT_LE(ram, c.ram);
    EXPECT_TRUE(o.fits_cpu);
    // Each window is bounded by a shard or a sub-group, not by the model.
    EXPECT_LE(mapped(bp.param_swap_buffers),
              AlignUp(bp.param_swapper.buffer_count * AlignUp(bp.max_shard_elems * 2, 4096), 2 << 20));
    EXPECT_LE(bp.optimizer.sub_group_elems, 100'000'000);
    EXPECT_TRUE(o.fits_nvme);
    EXPECT_TRUE(o.state_fits);
  }
}

// Every proposed config is valid DeepSpeed JSON for zinf: ParseConfig and
// ResolveAuto accept it, it says what was chosen, and its pools are as large
// as the pipeline and the prefetch window need (config-check's checks).
TEST(PlanTest, ProposedConfigsParse) {
  PlanInputs in;
  in.model = *GptConfigForParameterCount(7'000'000'000, 2048, 50257);
  in.world_size = 2;
  in.micro_batch = 2;
  in.gpu_bytes = 80 * kGiB;
  in.cpu_bytes = 1024 * kGiB;
  in.nvme_bytes = 4096 * kGiB;
  in.nvme_paths = {"/nvme0", "/nvme1"};
  auto plan = MakePlan(in);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(plan->chosen_fits);
  for (const PlanOption& o : plan->options) {
    const std::string text = ConfigChangesToJson(o.config);
    auto c = ParseConfig(text, "plan");
    ASSERT_TRUE(c.ok()) << c.status().ToString() << "\n" << text;
    AutoContext ctx;
    ctx.world_size = 2;
    ASSERT_TRUE(ResolveAuto(*c, ctx).ok());
    EXPECT_EQ(c->zero.stage, 3);
    EXPECT_EQ(c->train_batch_size, 4);
    EXPECT_EQ(c->zero.offload_param.device, o.param);
    EXPECT_EQ(c->zero.offload_optimizer.device, o.optimizer);
    EXPECT_EQ(c->zero.sub_group_size, o.config.zero.sub_group_size);
    if (o.param == OffloadDevice::kNvme) {
      EXPECT_EQ(c->zero.offload_param.nvme_paths, in.nvme_paths);
      EXPECT_GE(c->zero.offload_param.buffer_count * c->zero.offload_param.buffer_size,
                c->zero.stage3_prefetch_bucket_size);
    }
    if (o.optimizer == OffloadDevice::kNvme) {
      EXPECT_EQ(c->zero.offload_optimizer.nvme_paths, in.nvme_paths);
      swap::OptimizerSwapperOptions so = swap::OptimizerSwapperOptionsFromConfig(c->zero, 1'000'000'000);
      EXPECT_GE(c->zero.offload_optimizer.buffer_count, swap::OptimizerSwapper::RequiredBuffers(so));
      EXPECT_EQ(c->aio.thread_count, 2);
    }
  }
}

TEST(PlanTest, NvmeChoicesNeedNvme) {
  PlanInputs in = HundredB();
  in.nvme_bytes = 0;
  auto plan = MakePlan(in);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(Find(*plan, OffloadDevice::kNvme, OffloadDevice::kNvme).fits_nvme);
  EXPECT_TRUE(Find(*plan, OffloadDevice::kNone, OffloadDevice::kCpu).fits_nvme);
  in.gpu_bytes = 0;
  EXPECT_FALSE(MakePlan(in).ok());
}

// Predicted device bytes against the Trainer's on the host device, for each
// offload choice: resident bytes equal bytes_in_use after a step (1%), the
// engine's gathered peak is within the estimate, and a budget of exactly
// the estimate trains.
void CheckAgainstTrainer(const GptConfig& model, const std::string& name, int batch,
                         const std::vector<std::pair<OffloadDevice, OffloadDevice>>& choices, int64_t fetch_unit = 0,
                         LayerActivations activations = LayerActivations::kKeep) {
  for (const auto& [p, o] : choices) {
    SCOPED_TRACE(name + " param " + std::string(OffloadDeviceName(p)) + " optimizer " +
                 std::string(OffloadDeviceName(o)) + " activations " + LayerActivationsName(activations));
    TempDir dir;
    PlanInputs in;
    in.model = model;
    in.micro_batch = batch;
    in.cuda = false;
    in.gpu_bytes = kGiB;
    in.cpu_bytes = 64 * kGiB;
    in.nvme_bytes = 64 * kGiB;
    in.nvme_paths = {dir.Sub("nvme")};
    in.fetch_unit = fetch_unit;
    in.activations = activations;
    in.activations_auto = false;
    const Config config = PlanConfig(in, p, o);
    auto est = EstimateOption(in, config);
    ASSERT_TRUE(est.ok()) << est.status().ToString();

    for (int budgeted = 0; budgeted < 2; ++budgeted) {
      std::unique_ptr<Device> device = CreateHostDevice(budgeted ? static_cast<size_t>(est->gpu_bytes) : 0);
      TrainerOptions to;
      to.model = in.model;
      to.corpus_bytes = 256 << 10;
      to.hooks.device = device.get();
      to.engine.optimizer_threads = 1;
      to.engine.run_id = "plan-test";
      to.fetch_unit = fetch_unit;
      to.activations = activations;
      auto trainer = Trainer::Create(config, to);
      ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
      EXPECT_EQ((*trainer)->layout().Describe(), est->fetch_layout);
      for (int s = 0; s < 2; ++s) {
        auto r = (*trainer)->Step();
        ASSERT_TRUE(r.ok()) << "budget " << (budgeted ? est->gpu_bytes : 0) << ": " << r.status().ToString();
      }
      if (budgeted) continue;
      const double actual = static_cast<double>(device->bytes_in_use());
      EXPECT_NEAR(static_cast<double>(est->gpu_resident_bytes), actual, 0.01 * actual)
          << "predicted resident " << est->gpu_resident_bytes << ", bytes_in_use after a step " << actual;
      const int64_t peak_gathered = (*trainer)->engine().counters().peak_live_elems * 2;
      EXPECT_LE(peak_gathered, est->gpu_gathered_bytes);
      EXPECT_GT(peak_gathered, 0);
      std::printf("%s %s/%s: device bytes resident predicted %lld, bytes_in_use %.0f; gathered peak %lld <= %lld\n",
                  name.c_str(), std::string(OffloadDeviceName(p)).c_str(), std::string(OffloadDeviceName(o)).c_str(),
                  static_cast<long long>(est->gpu_resident_bytes), actual, static_cast<long long>(peak_gathered),
                  static_cast<long long>(est->gpu_gathered_bytes));
    }
  }
}

void CheckAgainstTrainer(const std::string& name, int batch,
                         const std::vector<std::pair<OffloadDevice, OffloadDevice>>& choices, int64_t fetch_unit = 0,
                         LayerActivations activations = LayerActivations::kKeep) {
  CheckAgainstTrainer(*LoadGptConfig(name), name, batch, choices, fetch_unit, activations);
}

TEST(PlanTest, TinyMatchesTrainer) {
  std::vector<std::pair<OffloadDevice, OffloadDevice>> all;
  for (OffloadDevice p : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    for (OffloadDevice o : {OffloadDevice::kCpu, OffloadDevice::kNvme}) all.push_back({p, o});
  }
  CheckAgainstTrainer("tiny", 8, all);
  CheckAgainstTrainer("tiny", 8, all, 0, LayerActivations::kRecompute);
}

// tiny as an untied Llama with Qwen2's q/k/v biases (2 key/value heads,
// SwiGLU of width 40).
GptConfig UntiedTinyLlama() {
  GptConfig llama = *LoadGptConfig("tiny");
  llama.family = ModelFamily::kLlama;
  llama.n_kv_head = 2;
  llama.intermediate_size = 40;
  llama.qkv_bias = true;
  llama.tied_embeddings = false;
  return llama;
}

// An untied Llama: the embedding and the head are cast whole into the
// trainer's scratch, a layer's matrices are not (the CPU ops read them in
// bf16).
TEST(PlanTest, UntiedLlamaMatchesTrainer) {
  CheckAgainstTrainer(UntiedTinyLlama(), "tiny-llama-untied", 4,
                      {{OffloadDevice::kNone, OffloadDevice::kCpu}, {OffloadDevice::kNvme, OffloadDevice::kNvme}});
}

// Qwen3's layer (q/k norms, heads of 24: q and o_proj 48 wide against
// n_embd 32) on NVMe: the norms' and the wider projections' bytes.
TEST(PlanTest, Qwen3MatchesTrainer) {
  GptConfig qwen3 = UntiedTinyLlama();
  qwen3.qkv_bias = false;
  qwen3.qk_norm = true;
  qwen3.head_size = 24;
  CheckAgainstTrainer(qwen3, "tiny-qwen3", 4, {{OffloadDevice::kNvme, OffloadDevice::kNvme}});
}

// Gemma 3's layer: two more norms a layer, and their activations.
TEST(PlanTest, Gemma3MatchesTrainer) {
  GptConfig gemma3 = UntiedTinyLlama();
  gemma3.qkv_bias = false;
  gemma3.qk_norm = gemma3.sandwich_norms = gemma3.norm_unit_offset = gemma3.embed_scale = true;
  gemma3.mlp_glu = kernels::Glu::kGeluTanh;
  gemma3.head_size = 16;
  gemma3.local_rope_theta = 100;
  gemma3.local_rope_layers = {0};
  CheckAgainstTrainer(gemma3, "tiny-gemma3", 4, {{OffloadDevice::kNvme, OffloadDevice::kNvme}});
}

// ActivationBytes is what GptCompute allocates, array by array, for both
// families, every choice and any batch (the host device rounds as CUDA
// does): kept activations cost L - 1 more layers' worth of what the
// backward reads; offloaded layer inputs leave three on the device, and
// HostActivationBytes is the pinned memory GptCompute maps for them.
TEST(PlanTest, ActivationBytesAreGptComputesAllocations) {
  const GptConfig llama = UntiedTinyLlama();
  auto ops = CreateCpuOps<float>();
  GptConfig one = *LoadGptConfig("tiny");
  one.n_layer = 1;  // two layer inputs: offloaded, two device slots
  // Qwen3's q/k norms, heads wider (A = 48 > C = 32) and narrower (16)
  GptConfig wide = llama, narrow = llama;
  wide.qk_norm = narrow.qk_norm = true;
  wide.head_size = 24;
  narrow.head_size = 8;
  narrow.rope.partial_factor = 0.5;  // rope tables of 2 columns, not 4
  // Gemma 3's: sandwich norms (two more layer outputs and rstds, a
  // gradient), norms by 1 + w (two vectors), local RoPE tables
  GptConfig gemma3 = wide;
  gemma3.sandwich_norms = gemma3.norm_unit_offset = true;
  gemma3.local_rope_theta = 100;
  gemma3.local_rope_layers = {0};
  // Granite's residual multiplier: a branch gradient; OLMo 2's post norms
  // (the outputs' norms as Gemma's) and q/k norms over all heads
  GptConfig granite = llama, olmo2 = wide;
  granite.residual_multiplier = 0.25;
  olmo2.post_norms = olmo2.qk_norm_all_heads = true;
  // Routed MLPs: the router's probabilities, the routing, the dispatch,
  // the experts' rows in and out, and the MLP's arrays K times as long
  GptConfig moe = wide;
  moe.n_experts = 5;
  moe.experts_per_token = 3;
  GptConfig moe_aux = moe;
  moe_aux.router_aux_coef = 0.01;  // the load-balancing loss's gradient, E values
  // A shared expert wider than the routed rows (its gradients outgrow
  // theirs), gated; and a narrow one, ungated
  GptConfig shared = moe, shared_narrow = moe;
  shared.shared_expert_size = 4 * moe.intermediate_size;
  shared.shared_expert_gate = true;
  shared_narrow.shared_expert_size = 3;
  // Dense layers among routed ones: wider than the routed rows, and
  // narrower
  GptConfig mixed = shared, mixed_narrow = moe_aux;
  mixed.dense_layers = {0};
  mixed.dense_intermediate_size = 8 * moe.intermediate_size;
  mixed_narrow.dense_layers = {1};
  mixed_narrow.dense_intermediate_size = 5;
  // Latent attention: the latents before and after their norms, their
  // rstds, the values cut out (o_proj's input), the projections' outputs
  // and the latents' gradients; with and without q's latent, a latent
  // wider than C (the norm-weight vectors follow it), Gemma's norms
  GptConfig mla = llama, mla_wide = llama;
  for (GptConfig* c : {&mla, &mla_wide}) {
    c->n_kv_head = c->n_head;
    c->qkv_bias = false;
    c->head_size = 10;
    c->qk_rope_head_dim = 4;
    c->v_head_dim = 7;
  }
  mla.kv_lora_rank = 6;
  mla.q_lora_rank = 5;
  mla_wide.kv_lora_rank = 3 * mla_wide.n_embd;
  mla_wide.norm_unit_offset = true;
  for (const GptConfig& m : {*LoadGptConfig("tiny"), *LoadGptConfig("demo"), llama, one, wide, narrow, gemma3, granite,
                             olmo2, moe, moe_aux, shared, shared_narrow, mixed, mixed_narrow, mla, mla_wide}) {
    for (int batch : {1, 3}) {
      for (LayerActivations a : {LayerActivations::kRecompute, LayerActivations::kKeep, LayerActivations::kOffload}) {
        SCOPED_TRACE(std::string(m.llama() ? "llama" : "gpt2") + " layers " + std::to_string(m.n_layer) + " heads " +
                     std::to_string(m.head_dim()) + (m.qk_norm ? " qk_norm" : "") +
                     (m.sandwich_norms ? " gemma3" : "") + " batch " + std::to_string(batch) + " " +
                     LayerActivationsName(a));
        auto device = CreateHostDevice(0);
        auto c = GptCompute<float>::Create(m, batch, ops.get(), device.get(), a);
        ASSERT_TRUE(c.ok()) << c.status().ToString();
        EXPECT_EQ(ActivationBytes(m, batch, ComputeKernels::kHost, 4, a), static_cast<int64_t>(device->bytes_in_use()));
        EXPECT_EQ(HostActivationBytes(m, batch, a), (*c)->host_activation_bytes());
      }
    }
  }
}

// The fused attention (the host's, any head size; CudaOps' 16-bit mode,
// head sizes 16..128) keeps a log-sum-exp a row where the unfused (CudaOps
// in fp32) keeps the T x T probabilities, and its scratch is one float a
// row (ActivationBytesAreGptComputesAllocations and gpt_cuda_test check
// these against the devices' allocations).
TEST(PlanTest, FusedAttentionKeepsARowsLogSumExp) {
  const GptConfig demo = *LoadGptConfig("demo");  // head size 64
  EXPECT_TRUE(FusedAttention(demo, ComputeKernels::kCuda16, 2));
  EXPECT_TRUE(FusedAttention(demo, ComputeKernels::kHost, 2));
  EXPECT_TRUE(FusedAttention(demo, ComputeKernels::kHost, 4));
  EXPECT_FALSE(FusedAttention(demo, ComputeKernels::kCuda, 2));    // --gpu-compute fp32
  EXPECT_FALSE(FusedAttention(demo, ComputeKernels::kCuda16, 4));  // fp32 parameters
  GptConfig odd = demo;
  odd.n_embd = 96;  // head size 24
  EXPECT_FALSE(FusedAttention(odd, ComputeKernels::kCuda16, 2));
  EXPECT_TRUE(FusedAttention(odd, ComputeKernels::kHost, 2));
  odd.n_embd = 512;  // 128
  EXPECT_TRUE(FusedAttention(odd, ComputeKernels::kCuda16, 2));
  EXPECT_EQ(KernelsFor(false, true), ComputeKernels::kHost);
  EXPECT_EQ(KernelsFor(true, false), ComputeKernels::kCuda);

  const int64_t B = 2, T = demo.seq_len, NH = demo.n_head, C = demo.n_embd, L = demo.n_layer;
  auto bytes = [](int64_t floats) { return zero3::DeviceFootprint(floats * 4); };  // as the devices round
  const int64_t probs = bytes(B * NH * T * T), lse = bytes(B * NH * T);
  const int64_t scratch = bytes(7 * B * T * C + B * NH * T * T);
  // kCuda (fp32) against kCuda16 (fused) with 2-byte parameters: the
  // 16-bit mode's own buffers are not in ActivationBytes.
  EXPECT_EQ(ActivationBytes(demo, 2, ComputeKernels::kCuda, 2, LayerActivations::kRecompute) -
                ActivationBytes(demo, 2, ComputeKernels::kCuda16, 2, LayerActivations::kRecompute),
            probs - lse + scratch - lse);
  EXPECT_EQ(ActivationBytes(demo, 2, ComputeKernels::kCuda, 2, LayerActivations::kKeep) -
                ActivationBytes(demo, 2, ComputeKernels::kCuda16, 2, LayerActivations::kKeep),
            L * (probs - lse) + scratch - lse);
  // The host's fused attention allocates as CUDA's.
  EXPECT_EQ(ActivationBytes(demo, 2, ComputeKernels::kHost, 4, LayerActivations::kKeep),
            ActivationBytes(demo, 2, ComputeKernels::kCuda16, 2, LayerActivations::kKeep));
  EXPECT_EQ(LayerActivationBytes(demo, 2, false) - LayerActivationBytes(demo, 2, true), probs - lse);
}

// `auto` keeps the activations when the L - 1 more layers' take at most
// half of the device and the working set with them fits it; the plan's
// choice follows the device size.
TEST(PlanTest, AutoKeepsActivationsThatFitHalfTheDevice) {
  const GptConfig m = *LoadGptConfig("demo");
  const int64_t kept = (m.n_layer - 1) * LayerActivationBytes(m, 2, /*fused_attention=*/true);
  const int64_t need = ModelWorkingSetBytes(m, 2, ComputeKernels::kHost, 2,
                                            FetchLayout::Create(m, 0).max_non_embed_elems(), LayerActivations::kKeep);
  const int64_t enough = std::max(2 * kept, need);
  EXPECT_EQ(AutoLayerActivations(m, 2, ComputeKernels::kHost, enough, 2, 0), LayerActivations::kKeep);
  EXPECT_EQ(AutoLayerActivations(m, 2, ComputeKernels::kHost, enough - 2, 2, 0), LayerActivations::kRecompute);
  EXPECT_EQ(AutoLayerActivations(m, 2, ComputeKernels::kHost, 0, 2, 0), LayerActivations::kRecompute);  // unknown size
  EXPECT_EQ(AutoLayerActivations(m, 2, ComputeKernels::kHost, 100 * need, 2, 0), LayerActivations::kKeep);
  GptConfig one = m;
  one.n_layer = 1;  // nothing to keep beyond the one set
  EXPECT_EQ(AutoLayerActivations(one, 2, ComputeKernels::kHost, int64_t{1} << 40, 2, 0), LayerActivations::kRecompute);
  PlanInputs in;
  in.model = m;
  in.micro_batch = 2;
  in.cuda = false;
  in.gpu_bytes = enough;
  EXPECT_EQ(PlanActivations(in, 2), LayerActivations::kRecompute);  // not auto: as given
  in.activations_auto = true;
  EXPECT_EQ(PlanActivations(in, 2), LayerActivations::kKeep);
  in.gpu_bytes = enough - 2;
  EXPECT_EQ(PlanActivations(in, 2), LayerActivations::kRecompute);
  bool automatic = false;
  EXPECT_EQ(*ParseLayerActivations("keep", &automatic), LayerActivations::kKeep);
  EXPECT_FALSE(automatic);
  EXPECT_TRUE(ParseLayerActivations("auto", &automatic).ok());
  EXPECT_TRUE(automatic);
  const Status bad = ParseLayerActivations("sometimes", &automatic).status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("--activations"), std::string::npos) << bad.ToString();
}

TEST(PlanTest, DemoMatchesTrainer) { CheckAgainstTrainer("demo", 2, {{OffloadDevice::kNvme, OffloadDevice::kNvme}}); }

// Offloaded layer inputs: three on the device, all in pinned RAM (tiny,
// five layers deep).
TEST(PlanTest, OffloadedLayerInputsMatchTrainer) {
  GptConfig deeper = *LoadGptConfig("tiny");
  deeper.n_layer = 5;
  CheckAgainstTrainer(deeper, "tiny-5-layers", 8, {{OffloadDevice::kCpu, OffloadDevice::kCpu}}, 0,
                      LayerActivations::kOffload);
}

// Layers in pieces (fetch_layout.h): the plan's device bytes are still the
// Trainer's (tiny: 3 pieces a layer; demo: 3, the largest 263168 elements).
TEST(PlanTest, PiecesMatchTrainer) {
  CheckAgainstTrainer(
      "tiny", 8, {{OffloadDevice::kNone, OffloadDevice::kCpu}, {OffloadDevice::kNvme, OffloadDevice::kNvme}}, 6000);
  CheckAgainstTrainer("demo", 2, {{OffloadDevice::kNvme, OffloadDevice::kNvme}}, 300000);
}

// GPT-3 175B on one 24 GiB GPU, 128 GiB of RAM and 8 TiB of NVMe.
PlanInputs Gpt3OnOneGpu() {
  PlanInputs in;
  in.model = *LoadGptConfig("175B");
  in.gpu_bytes = 24 * kGiB;
  in.cpu_bytes = 128 * kGiB;
  in.nvme_bytes = 8192 * kGiB;
  in.nvme_paths = {"/nvme0"};
  return in;
}

// The bytes of the option's first item whose description starts with
// `prefix`; -1 when it has none.
int64_t ItemBytes(const PlanOption& o, const std::string& prefix) {
  for (const PlanItem& it : o.items) {
    if (it.what.rfind(prefix, 0) == 0) return it.bytes;
  }
  return -1;
}

std::string ItemWhat(const PlanOption& o, const std::string& prefix) {
  for (const PlanItem& it : o.items) {
    if (it.what.rfind(prefix, 0) == 0) return it.what;
  }
  return "";
}

// The nvme/nvme option of the plan for `in` (an empty one, with a failure,
// when there is no plan).
PlanOption NvmeOption(const PlanInputs& in) {
  auto plan = MakePlan(in);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (!plan.ok()) return {};
  return Find(*plan, OffloadDevice::kNvme, OffloadDevice::kNvme);
}

// With 16-bit parameters the trainer casts a block's vectors to fp32, not
// its matrices, on the host and with `--gpu-compute 16`; with
// `--gpu-compute fp32` (compute16 false) it casts whole blocks and needs
// no 16-bit compute buffers: the GPU column grows by 4 B per element of
// the largest block's matrices, less those buffers.
TEST(PlanTest, Fp32GpuComputeCastsWholeBlocks) {
  PlanInputs in = Gpt3OnOneGpu();
  const PlanOption a = NvmeOption(in);
  in.compute16 = false;
  const PlanOption b = NvmeOption(in);
  const FetchLayout whole = FetchLayout::Create(in.model, 0);
  const int64_t matrices = whole.max_cast_elems(false, false) - whole.max_cast_elems(true, false);
  EXPECT_EQ(matrices, 12LL * 12288 * 12288);  // a layer's four matrices
  EXPECT_NEAR(static_cast<double>(ItemBytes(b, "trainer scratch") - ItemBytes(a, "trainer scratch")),
              static_cast<double>(4 * matrices), 1e6);  // DeviceBytes rounding
  EXPECT_GT(ItemBytes(a, "16-bit compute"), 0);
  EXPECT_EQ(ItemBytes(b, "16-bit compute"), -1);
  // And the attention unfused: the probabilities and the CUDA scratch.
  const int64_t unfused = ActivationBytes(in.model, 1, ComputeKernels::kCuda, 2, a.activations) -
                          ActivationBytes(in.model, 1, ComputeKernels::kCuda16, 2, a.activations);
  EXPECT_EQ(ItemBytes(b, "activations") - ItemBytes(a, "activations"), unfused);
  EXPECT_EQ(b.gpu_bytes - a.gpu_bytes, ItemBytes(b, "trainer scratch") - ItemBytes(a, "trainer scratch") -
                                           ItemBytes(a, "16-bit compute") + unfused);
  // The host device's ops read the matrices in 16 bits whatever the flag.
  in.cuda = false;
  const int64_t host32 = NvmeOption(in).gpu_bytes;
  in.compute16 = true;
  EXPECT_EQ(host32, NvmeOption(in).gpu_bytes);
}

// `auto` offloads the layer inputs when the working set with all of them
// on the device does not fit it and with three does, and never for three
// or fewer inputs; the plan's item and the config it writes say so.
TEST(PlanTest, AutoOffloadsLayerInputsThatDoNotFit) {
  const GptConfig m = *LoadGptConfig("demo");
  const int64_t blocks = FetchLayout::Create(m, 0).max_non_embed_elems();
  const int64_t recompute = ModelWorkingSetBytes(m, 2, ComputeKernels::kHost, 2, blocks, LayerActivations::kRecompute);
  const int64_t offload = ModelWorkingSetBytes(m, 2, ComputeKernels::kHost, 2, blocks, LayerActivations::kOffload);
  const int64_t x = zero3::DeviceFootprint(int64_t{2} * m.seq_len * m.n_embd * 4);
  EXPECT_EQ(recompute - offload, (m.n_layer + 1 - 3) * x);
  EXPECT_EQ(AutoLayerActivations(m, 2, ComputeKernels::kHost, recompute, 2, 0), LayerActivations::kRecompute);
  EXPECT_EQ(AutoLayerActivations(m, 2, ComputeKernels::kHost, recompute - 1, 2, 0), LayerActivations::kOffload);
  EXPECT_EQ(AutoLayerActivations(m, 2, ComputeKernels::kHost, offload - 1, 2, 0),
            LayerActivations::kOffload);  // the closest
  GptConfig two = m;
  two.n_layer = 2;  // three inputs: nothing to offload
  EXPECT_EQ(AutoLayerActivations(two, 2, ComputeKernels::kHost, 1, 2, 0), LayerActivations::kRecompute);
  bool automatic = true;
  EXPECT_EQ(*ParseLayerActivations("offload", &automatic), LayerActivations::kOffload);
  EXPECT_FALSE(automatic);
  EXPECT_STREQ(LayerActivationsName(LayerActivations::kOffload), "offload");
  EXPECT_EQ(HostActivationBytes(m, 2, LayerActivations::kRecompute), 0);
  EXPECT_GE(HostActivationBytes(m, 2, LayerActivations::kOffload),
            (m.n_layer + 1) * int64_t{2} * m.seq_len * m.n_embd * 4);

  PlanInputs in;
  in.model = m;
  in.micro_batch = 2;
  in.cuda = false;
  in.gpu_bytes = kGiB;
  in.activations = LayerActivations::kOffload;
  const Config config = PlanConfig(in, OffloadDevice::kCpu, OffloadDevice::kCpu);
  auto o = EstimateOption(in, config);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(ItemBytes(*o, "activation checkpoints"), HostActivationBytes(m, 2, LayerActivations::kOffload));
  EXPECT_TRUE(o->config.activation_checkpointing.cpu_checkpointing);
  in.activations = LayerActivations::kRecompute;
  auto r = EstimateOption(in, config);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ItemBytes(*r, "activation checkpoints"), -1);
  EXPECT_FALSE(r->config.activation_checkpointing.cpu_checkpointing);
  EXPECT_EQ(r->gpu_bytes - o->gpu_bytes, (m.n_layer + 1 - 3) * x);
  EXPECT_EQ(o->pinned_bytes - r->pinned_bytes, HostActivationBytes(m, 2, LayerActivations::kOffload));
  // Every input goes out a micro-batch, all but the last three come back.
  EXPECT_EQ(o->h2d_bytes - r->h2d_bytes, (m.n_layer + 1 - 3) * int64_t{2} * m.seq_len * m.n_embd * 4);
  EXPECT_EQ(o->d2h_bytes - r->d2h_bytes, (m.n_layer + 1) * int64_t{2} * m.seq_len * m.n_embd * 4);
}

// GPT-3 175B and 100B with parameters and optimizer state on NVMe fit one
// 24 GiB GPU beside 128 (96) GiB of RAM, as `zinf plan` chooses by
// default (--fetch-unit auto, --activations auto): the layers in pieces,
// every layer input on the GPU. On 16 GiB, where the 175B's working set
// with those inputs does not fit, the inputs (9.1 GiB) go to pinned RAM.
TEST(PlanTest, GptThreeFitsOneGpuWithItsLayerInputsInRam) {
  for (const auto& [name, ram, gpu] :
       {std::tuple{"175B", 128 * kGiB, 24 * kGiB}, std::tuple{"100B", 96 * kGiB, 24 * kGiB},
        std::tuple{"175B", 128 * kGiB, 16 * kGiB}}) {
    SCOPED_TRACE(std::string(name) + " on " + std::to_string(gpu / kGiB) + " GiB");
    PlanInputs in = Gpt3OnOneGpu();
    in.model = *LoadGptConfig(name);
    in.cpu_bytes = ram;
    in.gpu_bytes = gpu;
    in.fetch_unit_auto = true;
    in.activations_auto = true;
    const PlanOption o = NvmeOption(in);
    EXPECT_TRUE(o.fits_gpu) << o.gpu_bytes;
    EXPECT_TRUE(o.fits_cpu) << o.pinned_bytes + o.pageable_bytes;
    EXPECT_TRUE(o.fits_nvme);
    std::printf("%s nvme/nvme on %lld GiB: activations %s, GPU %.2f GiB, RAM %.2f GiB\n", name,
                static_cast<long long>(gpu / kGiB), LayerActivationsName(o.activations),
                static_cast<double>(o.gpu_bytes) / kGiB, static_cast<double>(o.pinned_bytes + o.pageable_bytes) / kGiB);
    if (gpu == 24 * kGiB) {
      EXPECT_EQ(o.activations, LayerActivations::kRecompute);
      continue;
    }
    EXPECT_EQ(o.activations, LayerActivations::kOffload);
    EXPECT_TRUE(o.config.activation_checkpointing.cpu_checkpointing);
    const int64_t inputs = (in.model.n_layer + 1) * int64_t{in.model.seq_len} * in.model.n_embd * 4;
    EXPECT_GE(ItemBytes(o, "activation checkpoints"), inputs);
    in.activations_auto = false;
    in.activations = LayerActivations::kRecompute;
    const PlanOption r = NvmeOption(in);
    EXPECT_FALSE(r.fits_gpu) << r.gpu_bytes;
    EXPECT_EQ(ItemWhat(o, "trainer scratch").find("two buffers"), std::string::npos) << "no room for a second";
    EXPECT_EQ(r.gpu_bytes - o.gpu_bytes,
              (in.model.n_layer + 1 - 3) * zero3::DeviceFootprint(inputs / (in.model.n_layer + 1)));
  }
}

// On a GPU with room (GPT-2 124M on 80 GiB) the layers' gradients get a
// second buffer, so that one is copied to the host while the next layer's
// backward computes into the other: the trainer scratch grows by one
// layer's fp32 gradient. Not on the host device, whose kernels run in place.
TEST(PlanTest, ARoomyGpuKeepsTwoGradientBuffers) {
  PlanInputs in = Gpt3OnOneGpu();
  in.model = *LoadGptConfig("gpt2-124m");
  in.gpu_bytes = 80 * kGiB;
  const PlanOption two = NvmeOption(in);
  EXPECT_NE(ItemWhat(two, "trainer scratch").find("in two buffers"), std::string::npos);
  in.gpu_bytes = 64 * kMiB;  // no room: one
  const PlanOption one = NvmeOption(in);
  EXPECT_EQ(ItemWhat(one, "trainer scratch").find("two buffers"), std::string::npos);
  const FetchLayout layout = FetchLayout::Create(in.model, GptBlockSpecs(in.model), 0);
  EXPECT_EQ(ItemBytes(two, "trainer scratch") - ItemBytes(one, "trainer scratch"),
            zero3::DeviceFootprint(4 * layout.max_layer_piece_elems()));
  in.cuda = false;
  in.gpu_bytes = 80 * kGiB;
  EXPECT_EQ(ItemWhat(NvmeOption(in), "trainer scratch").find("two buffers"), std::string::npos);
}

// GPT-3 175B on a 24 GiB GPU: --fetch-unit auto cuts its 1.8G-parameter
// layers, and every row sized by the largest engine block follows: the
// trainer's fp32 scratch, the gathered window, the offload_param buffers
// and the gradient staging; the GPU column falls by their difference.
TEST(PlanTest, PiecesShrinkTheRowsSizedByTheLargestBlock) {
  PlanInputs in = Gpt3OnOneGpu();
  const PlanOption w = NvmeOption(in);
  in.fetch_unit_auto = true;
  const PlanOption c = NvmeOption(in);
  EXPECT_EQ(w.fetch_layout, "whole layers");
  EXPECT_EQ(w.max_piece_elems, 12LL * 12288 * 12288 + 13 * 12288);
  EXPECT_NE(c.fetch_layout, "whole layers");
  EXPECT_GT(c.fetch_unit, 0);
  EXPECT_LT(c.max_piece_elems, w.max_piece_elems / 2);
  auto item = [](const PlanOption& o, const std::string& prefix) {
    const int64_t bytes = ItemBytes(o, prefix);
    EXPECT_GE(bytes, 0) << "no item " << prefix;
    return bytes;
  };
  for (const char* row : {"trainer scratch", "offload_param buffers", "gradient staging"}) {
    EXPECT_LT(item(c, row), item(w, row)) << row;
  }
  EXPECT_LT(c.gpu_gathered_bytes, w.gpu_gathered_bytes);
  EXPECT_LT(c.gpu_bytes, w.gpu_bytes);
  EXPECT_LE(c.pinned_bytes, w.pinned_bytes);
  // The activations are the same model's (fp32: the 16-bit GPU path's to shrink).
  EXPECT_EQ(item(c, "activations"), item(w, "activations"));
  // Pieces fetched again in the backward make the parameter traffic larger.
  EXPECT_GT(c.param_nvme_s, w.param_nvme_s);
  std::printf("175B nvme/nvme GPU per rank: whole layers %.2f GiB, %s %.2f GiB\n",
              static_cast<double>(w.gpu_bytes) / kGiB, c.fetch_layout.c_str(), static_cast<double>(c.gpu_bytes) / kGiB);
}

}  // namespace
}  // namespace zinf::model
