// GptCompute with its layer inputs in pinned host memory
// (LayerActivations::kOffload) and its kernels queued on one of the host
// device's streams, as on a GPU: the inputs' copies run on a stream of their
// own beside the kernels' worker thread, ordered by events alone. Also run
// under ThreadSanitizer (label threads, make test-tsan), where a missing wait
// between a copy and the kernels that read or rewrite its slot is a reported
// race even when the bits survive it (mutation tried: a copy back not behind
// the kernels). Not seen there: a wait the kernels skip for a copy the host
// stream has already run, since a host stream's events share one mutex (the
// forward's wait for a backward's unused look-ahead, below). The calls: a
// whole step, the head again after it (the backward's look-ahead reused
// x_L's slot), a backward abandoned three layers down, and the next step;
// against the same calls with the inputs on the device and the kernels run
// in place, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "device/device.h"
#include "model/gpt.h"
#include "model/ops.h"

namespace zinf::model {
namespace {

using Block = std::vector<std::vector<float>>;

class Model {
 public:
  Model(const GptConfig& config, LayerActivations activations, bool queued)
      : config_(config), device_(CreateHostDevice(0)) {
    if (queued) {
      auto ops = CreateOps(*device_, /*compute16=*/false, /*host_stream=*/true);
      EXPECT_TRUE(ops.ok()) << ops.status().ToString();
      if (ops.ok()) ops_ = std::move(*ops);
    } else {
      ops_ = CreateCpuOps<float>();
    }
    for (BlockId b = 0; b < static_cast<BlockId>(GptBlockSpecs(config).size()); ++b) {
      params_.push_back(InitBlockWeights(config, b, 7));
      Block g;
      for (const auto& t : params_.back()) g.emplace_back(t.size(), 0.0f);
      grads_.push_back(std::move(g));
    }
    auto c = GptCompute<float>::Create(config, 2, ops_.get(), device_.get(), activations);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (c.ok()) compute_ = std::move(*c);
  }

  // Forward and the head's backward (its loss); with `layers` > 0 the
  // backward of that many layers from the top, and of the embedding when
  // that is all of them. The gradients are zeroed first; the kernels (not
  // the copies) have finished when this returns.
  double Step(uint64_t seed, int layers) {
    for (Block& g : grads_) {
      for (auto& t : g) std::fill(t.begin(), t.end(), 0.0f);
    }
    std::mt19937_64 rng(seed);
    std::vector<int32_t> in(static_cast<size_t>(2 * config_.seq_len)), out(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<int32_t>(rng() % config_.vocab_size);
      out[i] = static_cast<int32_t>(rng() % config_.vocab_size);
    }
    GptCompute<float>& c = *compute_;
    EXPECT_TRUE(c.SetBatch(in.data(), out.data()).ok());
    EXPECT_TRUE(c.EmbedForward(Const(kEmbedBlock)).ok());
    for (int l = 0; l < config_.n_layer; ++l) EXPECT_TRUE(c.LayerForward(l, Const(LayerBlock(l))).ok());
    const BlockId head = HeadBlock(config_), lm_block = LmBlock();
    typename GptCompute<float>::HeadGrads hg{Mutable(head), Mutable(lm_block)[static_cast<size_t>(LmIndex())]};
    auto loss = c.HeadForward(Const(head), Const(lm_block)[static_cast<size_t>(LmIndex())], &hg, 1.0);
    EXPECT_TRUE(loss.ok()) << loss.status().ToString();
    for (int l = config_.n_layer - 1; l >= config_.n_layer - layers; --l) {
      EXPECT_TRUE(c.LayerBackward(l, Const(LayerBlock(l)), Mutable(LayerBlock(l))).ok());
    }
    if (layers == config_.n_layer) {
      EXPECT_TRUE(c.EmbedBackward(Mutable(kEmbedBlock)).ok());
    }
    EXPECT_TRUE(c.ops().Synchronize().ok());
    return loss.ok() ? *loss : -1.0;
  }

  // The loss of the last forward again, without gradients.
  double HeadAgain() {
    const BlockId head = HeadBlock(config_);
    auto loss = compute_->HeadForward(Const(head), Const(LmBlock())[static_cast<size_t>(LmIndex())], nullptr, 1.0);
    EXPECT_TRUE(loss.ok()) << loss.status().ToString();
    return loss.ok() ? *loss : -1.0;
  }

  const std::vector<Block>& grads() const { return grads_; }

 private:
  BlockId LmBlock() const { return config_.tied_embeddings ? kEmbedBlock : HeadBlock(config_); }
  int LmIndex() const { return config_.tied_embeddings ? static_cast<int>(kWte) : LmHeadIndex(config_); }
  std::vector<const float*> Const(BlockId b) const {
    std::vector<const float*> v;
    for (const auto& t : params_[static_cast<size_t>(b)]) v.push_back(t.data());
    return v;
  }
  std::vector<float*> Mutable(BlockId b) {
    std::vector<float*> v;
    for (auto& t : grads_[static_cast<size_t>(b)]) v.push_back(t.data());
    return v;
  }

  GptConfig config_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Ops<float>> ops_;
  std::vector<Block> params_, grads_;
  std::unique_ptr<GptCompute<float>> compute_;  // last: it uses the ops and the device
};

TEST(GptOffloadStreamTest, QueuedCopiesGiveTheRecomputesBits) {
  auto tiny = LoadGptConfig("tiny");
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  GptConfig config = *tiny;
  config.n_layer = 5;  // six inputs: the three device slots turn over twice
  Model want(config, LayerActivations::kRecompute, /*queued=*/false);
  Model got(config, LayerActivations::kOffload, /*queued=*/true);
  auto same = [](double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; };
  EXPECT_TRUE(same(want.Step(1, config.n_layer), got.Step(1, config.n_layer)));
  EXPECT_TRUE(same(want.HeadAgain(), got.HeadAgain()));
  // Abandoned three layers down; nothing between it and the next step's
  // forward orders the look-ahead copy before that forward rewrites its slot
  // but the forward's own wait.
  want.Step(2, 3);
  got.Step(2, 3);
  EXPECT_TRUE(same(want.Step(3, config.n_layer), got.Step(3, config.n_layer)));
  ASSERT_EQ(want.grads().size(), got.grads().size());
  for (size_t b = 0; b < want.grads().size(); ++b) {
    for (size_t t = 0; t < want.grads()[b].size(); ++t) {
      const std::vector<float>& w = want.grads()[b][t];
      const std::vector<float>& g = got.grads()[b][t];
      EXPECT_EQ(std::memcmp(w.data(), g.data(), w.size() * sizeof(float)), 0) << "block " << b << " tensor " << t;
    }
  }
  EXPECT_TRUE(same(want.HeadAgain(), got.HeadAgain()));
}

}  // namespace
}  // namespace zinf::model
