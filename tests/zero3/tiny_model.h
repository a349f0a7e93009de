// A tiny model that trains through zinf::Engine, for the zero3 tests: a chain
// of dense blocks h' = act(W h + b) (tanh on hidden blocks, identity on the
// last) with loss 0.5 * |y - target|^2 averaged over the micro-batch, and
// analytic gradients computed on the host from the acquired parameters.
// Parameters and gradients move between host and "device" through the
// engine's Device and a Stream, as a CUDA model's would.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/half.h"
#include "device/device.h"
#include "zero3/engine_hooks.h"
#include "zinf/engine.h"

namespace zinf::zero3::testing {

struct TinyModel {
  std::vector<int64_t> dims;  // dims[0] input, dims[i+1] output of block i
  // Biases undecayed (TensorSpec::decay), as GPT's are: the tier and rank
  // equivalence tests run the optimizer's masked path.
  bool decay_biases = false;

  int num_blocks() const { return static_cast<int>(dims.size()) - 1; }

  std::vector<BlockSpec> Blocks() const {
    std::vector<BlockSpec> blocks;
    for (int i = 0; i < num_blocks(); ++i) {
      blocks.push_back({"layer" + std::to_string(i),
                        {{"weight", {dims[static_cast<size_t>(i + 1)], dims[static_cast<size_t>(i)]}},
                         {"bias", {dims[static_cast<size_t>(i + 1)]}, decay_biases}}});
    }
    return blocks;
  }

  // Deterministic initial values.
  std::vector<std::vector<float>> InitialValues(int block) const {
    const int64_t out = dims[static_cast<size_t>(block + 1)], in = dims[static_cast<size_t>(block)];
    std::vector<float> w(static_cast<size_t>(out * in)), b(static_cast<size_t>(out));
    for (size_t k = 0; k < w.size(); ++k) {
      w[k] = 0.6f * std::sin(0.37f * static_cast<float>(k) + 1.3f * static_cast<float>(block)) /
             std::sqrt(static_cast<float>(in));
    }
    for (size_t k = 0; k < b.size(); ++k) b[k] = 0.05f * std::cos(0.7f * static_cast<float>(k + block));
    return {w, b};
  }

  // Sample `s` of optimizer step `step`: input and target.
  void Sample(int step, int s, std::vector<float>& x, std::vector<float>& t) const {
    x.resize(static_cast<size_t>(dims.front()));
    t.resize(static_cast<size_t>(dims.back()));
    for (size_t k = 0; k < x.size(); ++k) {
      x[k] = std::sin(0.9f * static_cast<float>(k) + 0.31f * static_cast<float>(s) + 0.17f * static_cast<float>(step));
    }
    for (size_t k = 0; k < t.size(); ++k) {
      t[k] = 0.5f * std::cos(0.5f * static_cast<float>(k) - 0.23f * static_cast<float>(s));
    }
  }
};

// Host copy of an acquired block's tensors, as fp32.
inline std::vector<std::vector<float>> ReadBlock(Engine& engine, Stream& stream, BlockId b,
                                                 const std::vector<void*>& ptrs) {
  std::vector<std::vector<float>> out;
  const int es = ElementSizeBytes(engine.param_type());
  for (size_t t = 0; t < ptrs.size(); ++t) {
    const int64_t n = engine.block(b).tensors[t].numel();
    std::vector<char> raw(static_cast<size_t>(n * es));
    EXPECT_TRUE(stream.CopyAsync(raw.data(), ptrs[t], raw.size(), CopyDirection::kDeviceToHost).ok());
    EXPECT_TRUE(stream.Synchronize().ok());
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      if (engine.param_type() == ElementType::kF32) {
        std::memcpy(&v[static_cast<size_t>(i)], raw.data() + i * 4, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, raw.data() + i * 2, 2);
        v[static_cast<size_t>(i)] = engine.param_type() == ElementType::kBf16 ? Bf16ToFloat(h) : HalfToFloat(h);
      }
    }
    out.push_back(std::move(v));
  }
  return out;
}

struct TrainOptions {
  int steps = 3;
  int first_step = 0;          // data of steps first_step .. first_step + steps - 1
  bool set_parameters = true;  // false: the engine's state came from a checkpoint
  int global_batch = 6;        // samples per optimizer step, over all ranks
  // Test hook: before the forward pass of step `peek_step`, acquire and
  // release the last block (an acquire order the trace has not seen).
  int peek_step = -1;
  // Test hook: in step `inf_step`, one gradient element of block 0 is Inf.
  int inf_step = -1;
  // When set, receives every boundary's StepResult.
  std::vector<StepResult>* results = nullptr;
  // Test hook: called before each Step that ends an accumulation cycle.
  std::function<void()> before_boundary_step;
};

// Hands every block its initial values (TinyModel::InitialValues).
inline void SetInitialParameters(Engine& engine, const TinyModel& model) {
  for (int b = 0; b < model.num_blocks(); ++b) {
    auto v = model.InitialValues(b);
    EXPECT_TRUE(engine.SetParameters(b, {v[0].data(), v[1].data()}).ok());
  }
}

// Trains `opts.steps` optimizer steps; rank r of n takes its share of the
// global batch, split in gradient_accumulation_steps micro-batches.
// Returns the mean loss of the last step on this rank.
inline float Train(Engine& engine, const TinyModel& model, const TrainOptions& opts, int accumulation_steps) {
  Device& device = EngineAccess::device(engine);
  auto stream_or = device.CreateStream();
  EXPECT_TRUE(stream_or.ok());
  Stream& stream = **stream_or;
  if (opts.set_parameters) SetInitialParameters(engine, model);
  const int per_rank = opts.global_batch / engine.world_size();
  const int per_micro = per_rank / accumulation_steps;
  const int nb = model.num_blocks();
  float last_loss = 0.0f;
  for (int step = opts.first_step; step < opts.first_step + opts.steps; ++step) {
    float loss_sum = 0.0f;
    for (int micro = 0; micro < accumulation_steps; ++micro) {
      if (step == opts.peek_step && micro == 0) {
        auto p = engine.Acquire(nb - 1);
        EXPECT_TRUE(p.ok()) << p.status().ToString();
        EXPECT_TRUE(engine.Release(nb - 1).ok());
      }
      const int first = engine.rank() * per_rank + micro * per_micro;
      // Forward, keeping activations: acts[s][i] is the input of block i.
      std::vector<std::vector<std::vector<float>>> acts(static_cast<size_t>(per_micro));
      std::vector<std::vector<float>> targets(static_cast<size_t>(per_micro));
      for (int s = 0; s < per_micro; ++s) {
        std::vector<float> x;
        model.Sample(step, first + s, x, targets[static_cast<size_t>(s)]);
        acts[static_cast<size_t>(s)].push_back(x);
      }
      for (int b = 0; b < nb; ++b) {
        auto ptrs = engine.Acquire(b);
        EXPECT_TRUE(ptrs.ok()) << ptrs.status().ToString();
        if (!ptrs.ok()) return NAN;
        auto p = ReadBlock(engine, stream, b, *ptrs);
        EXPECT_TRUE(engine.Release(b).ok());
        const int64_t in = model.dims[static_cast<size_t>(b)], out = model.dims[static_cast<size_t>(b + 1)];
        for (auto& a : acts) {
          const std::vector<float>& h = a.back();
          std::vector<float> y(static_cast<size_t>(out));
          for (int64_t o = 0; o < out; ++o) {
            float z = p[1][static_cast<size_t>(o)];
            for (int64_t i = 0; i < in; ++i) z += p[0][static_cast<size_t>(o * in + i)] * h[static_cast<size_t>(i)];
            y[static_cast<size_t>(o)] = b + 1 < nb ? std::tanh(z) : z;
          }
          a.push_back(std::move(y));
        }
      }
      // Loss and its gradient at the output (mean over the micro-batch),
      // times the fp16 loss scale (1 otherwise).
      const float loss_scale = static_cast<float>(engine.loss_scale());
      std::vector<std::vector<float>> delta(static_cast<size_t>(per_micro));
      for (int s = 0; s < per_micro; ++s) {
        const std::vector<float>& y = acts[static_cast<size_t>(s)].back();
        delta[static_cast<size_t>(s)].resize(y.size());
        for (size_t k = 0; k < y.size(); ++k) {
          const float e = y[k] - targets[static_cast<size_t>(s)][k];
          loss_sum += 0.5f * e * e / static_cast<float>(per_micro * accumulation_steps);
          delta[static_cast<size_t>(s)][k] = e / static_cast<float>(per_micro) * loss_scale;
        }
      }
      // Backward, block by block in reverse.
      for (int b = nb - 1; b >= 0; --b) {
        auto ptrs = engine.Acquire(b);
        EXPECT_TRUE(ptrs.ok()) << ptrs.status().ToString();
        if (!ptrs.ok()) return NAN;
        auto p = ReadBlock(engine, stream, b, *ptrs);
        const int64_t in = model.dims[static_cast<size_t>(b)], out = model.dims[static_cast<size_t>(b + 1)];
        std::vector<float> gw(static_cast<size_t>(out * in), 0.0f), gb(static_cast<size_t>(out), 0.0f);
        for (int s = 0; s < per_micro; ++s) {
          std::vector<float>& d = delta[static_cast<size_t>(s)];
          const std::vector<float>& h_in = acts[static_cast<size_t>(s)][static_cast<size_t>(b)];
          const std::vector<float>& h_out = acts[static_cast<size_t>(s)][static_cast<size_t>(b + 1)];
          if (b + 1 < nb) {
            for (int64_t o = 0; o < out; ++o)
              d[static_cast<size_t>(o)] *= 1.0f - h_out[static_cast<size_t>(o)] * h_out[static_cast<size_t>(o)];
          }
          std::vector<float> d_prev(static_cast<size_t>(in), 0.0f);
          for (int64_t o = 0; o < out; ++o) {
            gb[static_cast<size_t>(o)] += d[static_cast<size_t>(o)];
            for (int64_t i = 0; i < in; ++i) {
              gw[static_cast<size_t>(o * in + i)] += d[static_cast<size_t>(o)] * h_in[static_cast<size_t>(i)];
              d_prev[static_cast<size_t>(i)] += p[0][static_cast<size_t>(o * in + i)] * d[static_cast<size_t>(o)];
            }
          }
          d = std::move(d_prev);
        }
        if (b == 0 && step == opts.inf_step) gw[0] = INFINITY;
        // Gradients go to the device, then to the engine.
        std::vector<void*> dev;
        for (auto* g : {&gw, &gb}) {
          auto ptr = device.Allocate(g->size() * 4);
          EXPECT_TRUE(ptr.ok()) << ptr.status().ToString();
          EXPECT_TRUE(stream.CopyAsync(*ptr, g->data(), g->size() * 4, CopyDirection::kHostToDevice).ok());
          dev.push_back(*ptr);
        }
        EXPECT_TRUE(stream.Synchronize().ok());
        Status st = engine.ReduceGradients(b, {dev[0], dev[1]});
        EXPECT_TRUE(st.ok()) << st.ToString();
        for (void* ptr : dev) device.Free(ptr);
        EXPECT_TRUE(engine.Release(b).ok());
      }
      if (micro + 1 == accumulation_steps && opts.before_boundary_step) opts.before_boundary_step();
      auto r = engine.Step();
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (r.ok()) {
        EXPECT_EQ(r->boundary, micro + 1 == accumulation_steps);
        if (r->boundary && opts.results != nullptr) opts.results->push_back(*r);
      }
    }
    last_loss = loss_sum;
  }
  return last_loss;
}

// Every block's fp32 master weights, flattened in block order.
inline std::vector<float> MasterWeights(Engine& engine, const TinyModel& model) {
  std::vector<float> all;
  for (int b = 0; b < model.num_blocks(); ++b) {
    std::vector<std::vector<float>> t;
    std::vector<float*> out;
    for (const TensorSpec& s : engine.block(b).tensors) t.emplace_back(static_cast<size_t>(s.numel()));
    for (auto& v : t) out.push_back(v.data());
    EXPECT_TRUE(engine.GetMasterParameters(b, out).ok());
    for (auto& v : t) all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

}  // namespace zinf::zero3::testing
