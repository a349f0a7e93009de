// Sub-block fetching (fetch_layout.h): the greedy cut of a layer into
// pieces, the --fetch-unit values, the "auto" rule; and the Trainer over a
// cut model: the whole-layer model's losses and weights bit for bit on
// every tier, training under a device budget that one whole layer
// exceeds, a resume under another cut refused naming --fetch-unit, and
// Hugging Face weights in and out through pieces.
#include "model/fetch_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "device/device.h"
#include "kernels/cuda_kernels.h"
#include "model/data.h"
#include "model/hf_checkpoint.h"
#include "model/model_test_util.h"
#include "model/plan.h"
#include "model/safetensors.h"
#include "model/trainer.h"

namespace zinf::model {
namespace {

using swap::testing::TempDir;
using testing::StepLosses;

GptConfig Tiny() { return *LoadGptConfig("tiny"); }

// tiny as a Llama with Qwen2's q/k/v biases: one key/value head, SwiGLU of
// width 80.
GptConfig TinyLlamaWithBiases() {
  GptConfig m = Tiny();
  m.family = ModelFamily::kLlama;
  m.n_kv_head = 1;
  m.intermediate_size = 80;
  m.qkv_bias = true;
  return m;
}

// Every tensor of every model block is in exactly one piece, under its
// own spec, in group order.
void ExpectCovers(const GptConfig& model, const FetchLayout& layout) {
  const std::vector<BlockSpec> specs = GptBlockSpecs(model);
  for (BlockId b = 0; b < static_cast<BlockId>(specs.size()); ++b) {
    std::multiset<int> seen;
    for (BlockId e : layout.pieces_of(b)) {
      const FetchPiece& p = layout.piece(e);
      EXPECT_EQ(p.model_block, b);
      ASSERT_EQ(p.tensors.size(), layout.specs()[static_cast<size_t>(e)].tensors.size());
      for (size_t i = 0; i < p.tensors.size(); ++i) {
        seen.insert(p.tensors[i]);
        EXPECT_EQ(layout.specs()[static_cast<size_t>(e)].tensors[i].name,
                  specs[static_cast<size_t>(b)].tensors[static_cast<size_t>(p.tensors[i])].name);
      }
    }
    ASSERT_EQ(seen.size(), specs[static_cast<size_t>(b)].tensors.size()) << "block " << b;
    for (int t = 0; t < static_cast<int>(seen.size()); ++t) EXPECT_EQ(seen.count(t), 1u) << "block " << b;
  }
}

// The 16-bit mode's operand scratch holds its largest matmul's input and
// output: latent attention's out of a latent wider than n_embd (kv_b_proj,
// rkv -> NH * (dn + dv)) outgrows every n_embd-wide one; without kCuda16
// and 16-bit parameters there is none.
TEST(FetchLayoutTest, Matmul16BytesHoldTheWidestLatentMatmul) {
  GptConfig m = *LoadGptConfig("tiny");
  m.family = ModelFamily::kLlama;
  m.n_head = m.n_kv_head = 16;
  m.intermediate_size = 40;
  m.head_size = 16;
  m.qk_rope_head_dim = 4;
  m.v_head_dim = 16;
  m.kv_lora_rank = 8 * m.n_embd;
  const int64_t N = 2 * int64_t{m.seq_len};
  const int64_t kv_b = int64_t{m.n_head} * (16 - 4 + 16);  // 448, beyond kv_a_proj's 260 out of 32
  EXPECT_EQ(Matmul16Bytes(m, 2, ComputeKernels::kCuda16, 2),
            kernels::cuda::kLtWorkspaceBytes + kernels::cuda::Matmul16ScratchBytes(N, m.kv_lora_rank, kv_b));
  EXPECT_EQ(Matmul16Bytes(m, 2, ComputeKernels::kCuda, 2), 0);
  EXPECT_EQ(Matmul16Bytes(m, 2, ComputeKernels::kCuda16, 4), 0);
}

TEST(FetchLayoutTest, UnitZeroOrAboveALayerKeepsTheModelsBlocks) {
  const GptConfig m = Tiny();
  for (int64_t unit : {int64_t{0}, int64_t{12704}, int64_t{1} << 40}) {
    const FetchLayout l = FetchLayout::Create(m, unit);
    const std::vector<BlockSpec> specs = GptBlockSpecs(m);
    ASSERT_EQ(l.specs().size(), specs.size()) << unit;
    for (size_t b = 0; b < specs.size(); ++b) EXPECT_EQ(l.specs()[b].name, specs[b].name);
    EXPECT_FALSE(l.split());
    EXPECT_EQ(l.Describe(), "whole layers");
    EXPECT_EQ(l.layer_elems(), 12 * 32 * 32 + 13 * 32);
  }
}

// tiny: C 32; groups norm1 64, qkv 3168, attn_out 1056, norm2 64, mlp_in
// 4224, mlp_out 4128 elements.
TEST(FetchLayoutTest, GreedyCutKeepsWholeGroupsWithinTheUnit) {
  const GptConfig m = Tiny();
  const FetchLayout l = FetchLayout::Create(m, 6000);
  EXPECT_TRUE(l.split());
  EXPECT_EQ(l.pieces_per_layer(), 3);
  EXPECT_EQ(l.Describe(), "3 pieces per layer: norm1-norm2 | mlp_in | mlp_out");
  ASSERT_EQ(l.specs().size(), 2u + 3u * static_cast<size_t>(m.n_layer));
  EXPECT_EQ(l.specs()[1].name, "layer.0.norm1-norm2");
  EXPECT_EQ(l.specs()[2].name, "layer.0.mlp_in");
  EXPECT_EQ(l.specs()[6].name, "layer.1.mlp_out");
  EXPECT_EQ(l.embed(), 0);
  EXPECT_EQ(l.head(), 7);
  EXPECT_EQ(l.piece(2).begin_group, kMlpInGroup);
  EXPECT_EQ(l.piece(2).end_group, kMlpOutGroup);
  EXPECT_EQ(l.piece(4).layer, 1);
  ExpectCovers(m, l);
  // The finest cut: one group a piece (norms stay with their neighbour
  // only while within the unit).
  const FetchLayout fine = FetchLayout::Create(m, 1);
  EXPECT_EQ(fine.pieces_per_layer(), kLayerGroups);
  EXPECT_EQ(fine.max_piece_elems(), 320 * 32 + 32 * 32);  // the embedding is never cut
  ExpectCovers(m, fine);
}

// The trainer's fp32 scratch: a block's every tensor, or only its vectors
// when the ops read the layers' matrices in 16 bits (the embedding and the
// head are cast whole either way).
TEST(FetchLayoutTest, CastElemsLeaveOutTheMatricesReadIn16Bits) {
  GptConfig m = Tiny();  // C 32, vocabulary padded to 320, tied
  const int64_t C = 32, layer = 12 * C * C + 13 * C, embed = 320 * C + 32 * C;
  const FetchLayout whole = FetchLayout::Create(m, 0);
  EXPECT_EQ(whole.max_cast_elems(/*matrices16=*/false, /*with_embed=*/false), layer);
  EXPECT_EQ(whole.max_cast_elems(false, true), layer);
  EXPECT_EQ(whole.max_cast_elems(true, false), 13 * C);  // norms and biases
  EXPECT_EQ(whole.max_cast_elems(true, true), embed);
  // One group a piece: the widest vectors are the MLP's first bias.
  EXPECT_EQ(FetchLayout::Create(m, 1).max_cast_elems(true, false), 4 * C);
  // An untied head is cast whole: its matrix is not a layer's.
  GptConfig untied = m;
  untied.tied_embeddings = false;
  EXPECT_EQ(FetchLayout::Create(untied, 0).max_cast_elems(true, false), 320 * C + 2 * C);
  EXPECT_EQ(FetchLayout::Create(untied, 0).max_cast_elems(true, true), embed);
  // An embedding larger than a layer: `with_embed` decides either way.
  GptConfig wide = m;
  wide.padded_vocab_size = 1024;
  const FetchLayout w = FetchLayout::Create(wide, 0);
  EXPECT_EQ(w.max_cast_elems(false, false), layer);
  EXPECT_EQ(w.max_cast_elems(false, true), 1024 * C + 32 * C);
  EXPECT_EQ(w.max_cast_elems(true, false), 13 * C);
  EXPECT_EQ(w.max_cast_elems(true, true), 1024 * C + 32 * C);
  // Llama: the norms and the q/k/v biases (one kv head of 16).
  EXPECT_EQ(FetchLayout::Create(TinyLlamaWithBiases(), 0).max_cast_elems(true, false), 2 * C + C + 2 * 16);
}

TEST(FetchLayoutTest, LlamaGroupsKeepQkvAndTheirBiasesTogether) {
  const GptConfig m = TinyLlamaWithBiases();
  const FetchLayout l = FetchLayout::Create(m, 1);
  ExpectCovers(m, l);
  const BlockSpec& qkv = l.specs()[2];
  EXPECT_EQ(qkv.name, "layer.0.qkv");
  std::vector<std::string> names;
  for (const TensorSpec& t : qkv.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias",
                                             "k_proj.bias", "v_proj.bias"}));
  EXPECT_EQ(l.specs()[5].name, "layer.0.mlp_in");
  EXPECT_EQ(l.specs()[5].tensors.size(), 2u);  // gate and up
}

// Post norms (OLMo 2): the norm groups are empty and open no piece; the
// first rides with qkv; the second stays with attn_out unless that piece
// is over the unit. Every piece has tensors, and every tensor is in one.
TEST(FetchLayoutTest, EmptyNormGroupsOpenNoPiece) {
  GptConfig m = TinyLlamaWithBiases();
  m.qkv_bias = false;
  m.post_norms = m.qk_norm = m.qk_norm_all_heads = true;
  const BlockSpec layer = GptBlockSpecs(m)[static_cast<size_t>(LayerBlock(0))];
  const std::vector<std::vector<int>> groups = LayerTensorGroups(m, 0);
  ASSERT_TRUE(groups[kNorm1Group].empty() && groups[kNorm2Group].empty());
  int64_t attn_out = 0;
  for (int t : groups[kAttnOutGroup]) attn_out += layer.tensors[static_cast<size_t>(t)].numel();
  const FetchLayout fine = FetchLayout::Create(m, 1);
  ExpectCovers(m, fine);
  EXPECT_EQ(fine.Describe(), "4 pieces per layer: norm1-qkv | attn_out | norm2-mlp_in | mlp_out");
  const FetchLayout fits = FetchLayout::Create(m, attn_out);  // attn_out fills its piece, not over it
  ExpectCovers(m, fits);
  EXPECT_NE(fits.Describe().find("attn_out-norm2 |"), std::string::npos) << fits.Describe();
  for (const BlockSpec& s : fine.specs()) EXPECT_FALSE(s.tensors.empty()) << s.name;
}

// Dense layers among routed ones: one cut for every layer, over each
// group's largest size, keeps every layer's pieces within the unit. Groups
// in units of C: norm1 1, qkv 66, attn_out 32, norm2 1; mlp_in 68 routed
// (router, 4 gate/up pairs of 8) and 2 Id dense; mlp_out 32 routed, Id dense.
TEST(FetchLayoutTest, DenseAndRoutedLayersShareOneCutWithinTheUnit) {
  GptConfig m = TinyLlamaWithBiases();
  m.n_layer = 3;
  m.n_experts = 4;
  m.experts_per_token = 2;
  m.intermediate_size = 8;
  m.dense_layers = {1};
  const int64_t C = m.n_embd;
  for (int dense : {40, 33}) {
    m.dense_intermediate_size = dense;
    for (int64_t unit : {int64_t{1}, 70 * C, 100 * C, 101 * C, 120 * C, 400 * C}) {
      SCOPED_TRACE("dense width " + std::to_string(dense) + ", unit " + std::to_string(unit / C) + " C");
      const FetchLayout l = FetchLayout::Create(m, unit);
      ExpectCovers(m, l);
      for (BlockId e = 0; e < static_cast<BlockId>(l.specs().size()); ++e) {
        const FetchPiece& p = l.piece(e);
        if (p.layer >= 0 && p.end_group - p.begin_group > 1) {  // a piece of several groups: within the unit
          EXPECT_LE(l.specs()[static_cast<size_t>(e)].numel(), unit) << l.Describe() << ", layer " << p.layer;
        }
      }
    }
  }
  // Width 40: the dense layer's mlp_in and mlp_out (80 + 40) part at a unit
  // of 100 though the routed layer's (68 + 32) would fit it; width 33: the
  // routed mlp_in's 68 and the dense mlp_out's 33 come from different
  // layers and part at 100, meet at 101.
  m.dense_intermediate_size = 40;
  EXPECT_EQ(FetchLayout::Create(m, 100 * C).Describe(), "3 pieces per layer: norm1-norm2 | mlp_in | mlp_out");
  m.dense_intermediate_size = 33;
  EXPECT_EQ(FetchLayout::Create(m, 100 * C).Describe(), "3 pieces per layer: norm1-norm2 | mlp_in | mlp_out");
  EXPECT_EQ(FetchLayout::Create(m, 101 * C).Describe(), "2 pieces per layer: norm1-norm2 | mlp_in-mlp_out");
}

TEST(FetchLayoutTest, ParseFetchUnitTakesAutoLayerOrACount) {
  bool automatic = false;
  EXPECT_EQ(*ParseFetchUnit("auto", &automatic), 0);
  EXPECT_TRUE(automatic);
  EXPECT_EQ(*ParseFetchUnit("layer", &automatic), 0);
  EXPECT_FALSE(automatic);
  EXPECT_EQ(*ParseFetchUnit("300M", &automatic), 300'000'000);
  EXPECT_EQ(*ParseFetchUnit("1.5e8", &automatic), 150'000'000);
  EXPECT_EQ(*ParseFetchUnit("50000", &automatic), 50'000);
  for (const char* bad : {"0", "-5", "abc", "", "12x", "1e400", "whole"}) {
    auto r = ParseFetchUnit(bad, &automatic);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--fetch-unit"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("\"" + std::string(bad) + "\""), std::string::npos);
  }
}

// Whole layers when they fit (or without a budget); a budget too small for
// a whole layer's working set gets the largest cut that fits it; below
// even the finest cut, the finest cut (the run then fails naming what it
// needs).
TEST(FetchLayoutTest, AutoCutsOnlyWhatTheDeviceCannotHold) {
  auto m = LoadGptConfig("175B");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(ResolveAutoFetchUnit(*m, 1, ComputeKernels::kCuda16, 0, 2), 0);
  EXPECT_EQ(ResolveAutoFetchUnit(*m, 1, ComputeKernels::kCuda16, int64_t{1} << 40, 2), 0);
  const int64_t unit = ResolveAutoFetchUnit(*m, 1, ComputeKernels::kCuda16, int64_t{24} << 30, 2);
  ASSERT_GT(unit, 0);
  const FetchLayout cut = FetchLayout::Create(*m, unit);
  EXPECT_TRUE(cut.split());
  const int64_t fixed = ActivationBytes(*m, 1, ComputeKernels::kCuda16, 2, LayerActivations::kRecompute) +
                        4 * GptBlockSpecs(*m)[kEmbedBlock].tensors[0].numel() +
                        4 * GptBlockSpecs(*m)[kEmbedBlock].tensors[1].numel();
  EXPECT_LE(fixed + 10 * cut.max_piece_elems(), int64_t{24} << 30);
  // The next coarser candidate does not fit.
  const FetchLayout coarser = FetchLayout::Create(*m, unit * 2);
  EXPECT_GT(fixed + 10 * coarser.max_piece_elems(), int64_t{24} << 30);
  const int64_t floor = ResolveAutoFetchUnit(*m, 1, ComputeKernels::kCuda16, int64_t{1} << 30, 2);
  EXPECT_EQ(FetchLayout::Create(*m, floor).max_piece_elems(), FetchLayout::Create(*m, 1).max_piece_elems());
}

// ------------------------------------------------------------ the Trainer

struct TrainerRun {
  std::unique_ptr<Device> device;
  std::unique_ptr<Trainer> trainer;
};

TrainerRun MakeRun(const Config& config, int64_t fetch_unit, size_t budget = 0, const GptConfig& model = Tiny(),
                   std::function<Status(BlockId, size_t, int64_t, int64_t, float*)> weights = {},
                   const std::string& data_path = "") {
  TrainerRun r;
  r.device = CreateHostDevice(budget);
  TrainerOptions o;
  o.model = model;
  o.corpus_bytes = 256 << 10;
  o.hooks.device = r.device.get();
  o.engine.optimizer_threads = 1;
  o.engine.run_id = "fetch-layout-test";
  o.fetch_unit = fetch_unit;
  o.initial_weights = std::move(weights);
  o.data_path = data_path;
  auto t = Trainer::Create(config, o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (t.ok()) r.trainer = std::move(t).value();
  return r;
}

// Every model block's fp32 master weights, read through the export path.
std::vector<std::vector<float>> MasterOf(Trainer& t) {
  TempDir dir;
  const std::string path = dir.Sub("m.safetensors");
  EXPECT_TRUE(t.ExportSafetensors(path, "F32").ok());
  auto f = ReadSafetensors(path);
  EXPECT_TRUE(f.ok());
  std::vector<std::vector<float>> out;
  for (const auto& tensor : f->tensors) {
    std::vector<float> v(tensor.data.size() / 4);
    std::memcpy(v.data(), tensor.data.data(), tensor.data.size());
    out.push_back(std::move(v));
  }
  return out;
}

Config TinyConfig(const TempDir& dir, OffloadDevice param, OffloadDevice optimizer) {
  Config c = testing::TinyTrainingConfig(dir.path(), param, optimizer, /*micro_batch=*/8);
  c.gradient_accumulation_steps = 2;
  return c;
}

// The kernels run in the same order however a layer is cut, so the cut
// model's losses and weights are the whole-layer model's, bit for bit, on
// every tier (gradient accumulation 2, clipping on, bf16).
TEST(FetchLayoutTrainerTest, PiecesGiveTheWholeLayerLossesAndWeightsOnEveryTier) {
  TempDir dir;
  TrainerRun whole = MakeRun(TinyConfig(dir, OffloadDevice::kNone, OffloadDevice::kNone), 0);
  ASSERT_NE(whole.trainer, nullptr);
  const std::vector<double> want = StepLosses(*whole.trainer, 6);
  ASSERT_EQ(want.size(), 6u);
  const std::vector<std::vector<float>> want_w = MasterOf(*whole.trainer);
  // 6000: norm1-norm2 | mlp_in | mlp_out (the last piece is not needed by
  // the recompute); 8400: norm1-norm2 | mlp_in-mlp_out (the last piece stays
  // acquired from the recompute into the backward); 1: one group a piece.
  for (int64_t unit : {int64_t{6000}, int64_t{8400}, int64_t{1}}) {
    for (OffloadDevice tier : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
      TempDir d;
      TrainerRun cut = MakeRun(TinyConfig(d, tier, tier), unit);
      ASSERT_NE(cut.trainer, nullptr);
      EXPECT_TRUE(cut.trainer->layout().split());
      if (unit == 8400) {
        EXPECT_EQ(cut.trainer->layout().Describe(), "2 pieces per layer: norm1-norm2 | mlp_in-mlp_out");
      }
      EXPECT_EQ(StepLosses(*cut.trainer, 6), want) << "unit " << unit << " tier " << static_cast<int>(tier);
      EXPECT_TRUE(MasterOf(*cut.trainer) == want_w) << "unit " << unit << " tier " << static_cast<int>(tier);
    }
  }
}

// The Llama family from fixtures (q/k/v biases: Qwen2's layer; q/k norms:
// Qwen3's; fused projections: Phi-3's; sandwich norms and softcaps: Gemma
// 2's; multipliers: Granite's; post norms only, whose norm groups are
// empty: OLMo 2's; routed MLPs, the router and every expert's gate and up
// in one group: Qwen3-MoE's, Mixtral's; latent attention's tensors in the
// q/k/v group: DeepSeek-V3's) and GPT-2: the cut model trains to the whole-layer
// model's losses; its weights go out as the HF folder they came in as, value
// for value (F32 export: OLMo 2's bf16 values exactly, the others' bytes).
TEST(FetchLayoutTrainerTest, HfWeightsInAndOutThroughPieces) {
  for (const char* name :
       {"qwen2", "llama", "gpt2", "qwen3", "phi3", "gemma2", "granite", "olmo2", "qwen3_moe", "mixtral", "qwen2_moe",
        "qwen3_moe-dense", "glm4_moe", "ernie4_5_moe", "dots1", "deepseek_v3", "deepseek_v2-lite"}) {
    auto ckpt = OpenHfCheckpoint(testing::FixtureDir(name));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    auto model = HfModelAtSeqLen(*ckpt, 0);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const HfCheckpoint& c = *ckpt;
    const GptConfig m = *model;
    auto reader = [&c, m, specs = GptBlockSpecs(m)](BlockId b, size_t t, int64_t first, int64_t count, float* out) {
      return ReadHfTensor(c, m, b, specs[static_cast<size_t>(b)], t, first, count, out);
    };
    TempDir dir;
    Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
    config.train_micro_batch_size_per_gpu = 2;
    const std::string tokens = dir.Sub("tokens.bin");
    std::vector<uint32_t> ids(4096);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7 + i / 5) % m.vocab_size);
    ASSERT_TRUE(WriteTokenFile(tokens, ids).ok());
    {
      TrainerRun cut = MakeRun(config, 1, 0, m, reader, tokens);
      ASSERT_NE(cut.trainer, nullptr);
      ASSERT_TRUE(cut.trainer->layout().split()) << name;
      const std::string out = dir.Sub("out");
      ASSERT_TRUE(cut.trainer->ExportHfFolder(out, "F32", &c).ok()) << name;
      auto back = OpenHfCheckpoint(out);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      for (BlockId b = 0; b <= HeadBlock(m); ++b) {
        auto x = ReadHfBlock(c, m, b);
        auto y = ReadHfBlock(*back, m, b);
        ASSERT_TRUE(x.ok() && y.ok());
        EXPECT_TRUE(*x == *y) << name << " block " << b;
      }
    }
    TrainerRun whole = MakeRun(config, 0, 0, m, reader, tokens);
    TrainerRun cut = MakeRun(config, 1, 0, m, reader, tokens);
    ASSERT_NE(whole.trainer, nullptr);
    ASSERT_NE(cut.trainer, nullptr);
    EXPECT_EQ(StepLosses(*cut.trainer, 3), StepLosses(*whole.trainer, 3)) << name;
  }
}

// A model one of whose layers, gathered with its fp32 scratch, is more
// than the device budget: whole layers fail with the working-set message
// (naming --fetch-unit); the pieces --fetch-unit auto picks for that budget
// train within it, to the same losses as an unbudgeted whole-layer run.
TEST(FetchLayoutTrainerTest, PiecesTrainWhereAWholeLayerExceedsTheBudget) {
  GptConfig m = Tiny();
  m.n_embd = 256;
  m.n_head = 4;
  m.n_layer = 2;
  const int64_t layer = FetchLayout::Create(m, 0).layer_elems();  // 12 C^2 + 13 C = 789760
  TempDir dir;
  Config config = TinyConfig(dir, OffloadDevice::kNvme, OffloadDevice::kNvme);
  config.train_micro_batch_size_per_gpu = 2;
  config.zero.offload_param.buffer_size = 1 << 20;
  // Whole layers need 6 bytes per layer element and the rest of the
  // working set (bf16 gathered, fp32 gradient; the CPU ops read the
  // matrices in bf16, so only the vectors are cast to fp32): 7 bytes per
  // element is short of that, and holds what `auto` sizes a half layer at
  // (it counts a whole cast too, a margin for the engine).
  const size_t budget = static_cast<size_t>(layer * 7);
  {
    auto device = CreateHostDevice(budget);
    TrainerOptions o;
    o.model = m;
    o.corpus_bytes = 256 << 10;
    o.hooks.device = device.get();
    o.engine.optimizer_threads = 1;
    auto t = Trainer::Create(config, o);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kOutOfMemory) << t.status().ToString();
    const std::string msg(t.status().message());
    EXPECT_NE(msg.find("model's working set"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--fetch-unit (now whole layers)"), std::string::npos) << msg;
  }
  // What --fetch-unit auto picks for this device: pieces.
  const int64_t unit = ResolveAutoFetchUnit(m, 2, ComputeKernels::kHost, static_cast<int64_t>(budget), 2);
  EXPECT_GT(unit, 0);
  // A cut that fits by auto's own count, not its finest-cut fallback.
  EXPECT_LE(ModelWorkingSetBytes(m, 2, ComputeKernels::kHost, 2, FetchLayout::Create(m, unit).max_non_embed_elems(),
                                 LayerActivations::kRecompute),
            static_cast<int64_t>(budget));
  TrainerRun cut = MakeRun(config, unit, budget, m);
  ASSERT_NE(cut.trainer, nullptr);
  EXPECT_TRUE(cut.trainer->layout().split());
  const std::vector<double> got = StepLosses(*cut.trainer, 3);
  EXPECT_LE(cut.device->bytes_in_use(), budget);
  TempDir d2;
  Config resident = TinyConfig(d2, OffloadDevice::kNone, OffloadDevice::kNone);
  resident.train_micro_batch_size_per_gpu = config.train_micro_batch_size_per_gpu;
  TrainerRun free_run = MakeRun(resident, 0, 0, m);
  ASSERT_NE(free_run.trainer, nullptr);
  EXPECT_EQ(got, StepLosses(*free_run.trainer, 3));
}

// A checkpoint records the cut: a resume under another cut is refused
// naming --fetch-unit; under the same cut (another unit that cuts the
// same way) it continues the curve.
TEST(FetchLayoutTrainerTest, ResumeUnderAnotherCutIsRefusedNamingTheFlag) {
  TempDir dir;
  const Config config = TinyConfig(dir, OffloadDevice::kCpu, OffloadDevice::kCpu);
  std::vector<double> want;
  {
    TrainerRun r = MakeRun(config, 6000);
    ASSERT_NE(r.trainer, nullptr);
    StepLosses(*r.trainer, 2);
    ASSERT_TRUE(r.trainer->Save(dir.Sub("ckpt")).ok());
    want = StepLosses(*r.trainer, 2);
  }
  for (int64_t other : {int64_t{0}, int64_t{1}}) {
    TrainerRun r = MakeRun(config, other);
    ASSERT_NE(r.trainer, nullptr);
    Status s = r.trainer->Resume(dir.Sub("ckpt"));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("trainer.fetch_layout was 3 pieces per layer"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("--fetch-unit 6000,"), std::string::npos) << s.message();  // the unit it was cut by
  }
  TrainerRun same = MakeRun(config, 6100);  // the same cut
  ASSERT_NE(same.trainer, nullptr);
  ASSERT_TRUE(same.trainer->Resume(dir.Sub("ckpt")).ok());
  EXPECT_EQ(StepLosses(*same.trainer, 2), want);
}

}  // namespace
}  // namespace zinf::model
