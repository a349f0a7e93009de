// Embedding the zinf engine: a two-layer MLP learns a synthetic regression
// task, its parameters and Adam state held by the ZeRO-3 engine.
//
// The program owns the model's math (on the CPU, here); the engine owns the
// parameters. Each step the program asks the engine for a block's full
// parameters right before it computes with it and hands them back right
// after, hands each block's gradients in, and lets the engine step:
//
//   forward:  Acquire(b); compute; Release(b)                      b = 0, 1
//   backward: Acquire(b); compute grads; ReduceGradients(b); Release(b)   b = 1, 0
//   Step()
//
// The engine keeps the working parameters and the fp32 optimizer state at the
// tiers the DeepSpeed config names: pinned RAM here, or NVMe files when a
// directory is given (`mlp_regression /mnt/nvme/scratch`).
//
// Exits 0 when the loss fell below half its start, 1 otherwise, 2 on an
// engine error.
#include <zinf/config.h>
#include <zinf/engine.h>
#include <zinf/status.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kIn = 8;         // input features
constexpr int kHidden = 32;    // hidden units
constexpr int kSamples = 128;  // the whole (synthetic) data set, one batch
constexpr int kSteps = 300;

// The data set: y = sin(x . a) + 0.5 * x_0 * x_1, x uniform in [-1, 1].
struct Data {
  std::vector<float> x;  // kSamples x kIn
  std::vector<float> y;  // kSamples
};

Data MakeData(std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float a[kIn];
  for (float& v : a) v = u(rng);
  Data d;
  d.x.resize(kSamples * kIn);
  d.y.resize(kSamples);
  for (int s = 0; s < kSamples; ++s) {
    float dot = 0.0f;
    for (int i = 0; i < kIn; ++i) {
      d.x[s * kIn + i] = u(rng);
      dot += d.x[s * kIn + i] * a[i];
    }
    d.y[s] = std::sin(2.0f * dot) + 0.5f * d.x[s * kIn] * d.x[s * kIn + 1];
  }
  return d;
}

// Block 0: hidden = relu(w1 x + b1); block 1: out = w2 hidden + b2.
std::vector<zinf::BlockSpec> Blocks() {
  return {{"layer1", {{"w1", {kHidden, kIn}}, {"b1", {kHidden}}}}, {"layer2", {{"w2", {1, kHidden}}, {"b2", {1}}}}};
}

// What the forward pass keeps for the backward one.
struct Activations {
  std::vector<float> pre;     // kSamples x kHidden, before the relu
  std::vector<float> hidden;  // kSamples x kHidden
  std::vector<float> out;     // kSamples
};

void Layer1Forward(const float* w1, const float* b1, const Data& d, Activations& act) {
  for (int s = 0; s < kSamples; ++s) {
    for (int h = 0; h < kHidden; ++h) {
      float z = b1[h];
      for (int i = 0; i < kIn; ++i) z += w1[h * kIn + i] * d.x[s * kIn + i];
      act.pre[s * kHidden + h] = z;
      act.hidden[s * kHidden + h] = z > 0.0f ? z : 0.0f;
    }
  }
}

void Layer2Forward(const float* w2, const float* b2, Activations& act) {
  for (int s = 0; s < kSamples; ++s) {
    float o = b2[0];
    for (int h = 0; h < kHidden; ++h) o += w2[h] * act.hidden[s * kHidden + h];
    act.out[s] = o;
  }
}

// Mean squared error, and its gradient with respect to each output.
double Loss(const Data& d, const Activations& act, std::vector<float>& d_out) {
  double loss = 0.0;
  for (int s = 0; s < kSamples; ++s) {
    const float e = act.out[s] - d.y[s];
    loss += static_cast<double>(e) * e;
    d_out[s] = 2.0f * e / kSamples;
  }
  return loss / kSamples;
}

// Gradients of layer 2's parameters, and of the loss with respect to layer
// 1's output (d_hidden).
void Layer2Backward(const float* w2, const Activations& act, const std::vector<float>& d_out, std::vector<float>& gw2,
                    std::vector<float>& gb2, std::vector<float>& d_hidden) {
  gw2.assign(kHidden, 0.0f);
  gb2.assign(1, 0.0f);
  for (int s = 0; s < kSamples; ++s) {
    gb2[0] += d_out[s];
    for (int h = 0; h < kHidden; ++h) {
      gw2[h] += d_out[s] * act.hidden[s * kHidden + h];
      d_hidden[s * kHidden + h] = d_out[s] * w2[h];
    }
  }
}

void Layer1Backward(const Data& d, const Activations& act, const std::vector<float>& d_hidden, std::vector<float>& gw1,
                    std::vector<float>& gb1) {
  gw1.assign(kHidden * kIn, 0.0f);
  gb1.assign(kHidden, 0.0f);
  for (int s = 0; s < kSamples; ++s) {
    for (int h = 0; h < kHidden; ++h) {
      if (act.pre[s * kHidden + h] <= 0.0f) continue;  // relu'
      const float g = d_hidden[s * kHidden + h];
      gb1[h] += g;
      for (int i = 0; i < kIn; ++i) gw1[h * kIn + i] += g * d.x[s * kIn + i];
    }
  }
}

// The DeepSpeed config: ZeRO-3, parameters and optimizer state offloaded
// to pinned RAM, or to NVMe files under `nvme_dir`.
std::string ConfigJson(const std::string& nvme_dir) {
  const std::string tier =
      nvme_dir.empty() ? R"({"device": "cpu"})" : R"({"device": "nvme", "nvme_path": ")" + nvme_dir + R"("})";
  return R"({"train_micro_batch_size_per_gpu": )" + std::to_string(kSamples) +
         R"(, "gradient_accumulation_steps": 1,)"
         R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},)"
         R"( "zero_optimization": {"stage": 3, "offload_param": )" +
         tier + R"(, "offload_optimizer": )" + tier + "}}";
}

// One training step through the engine; returns the step's loss (before
// the update).
zinf::StatusOr<double> TrainStep(zinf::Engine& engine, const Data& d, Activations& act) {
  // Forward, block by block.
  ZINF_ASSIGN_OR_RETURN(std::vector<void*> p1, engine.Acquire(0));
  Layer1Forward(static_cast<const float*>(p1[0]), static_cast<const float*>(p1[1]), d, act);
  ZINF_RETURN_IF_ERROR(engine.Release(0));
  ZINF_ASSIGN_OR_RETURN(std::vector<void*> p2, engine.Acquire(1));
  Layer2Forward(static_cast<const float*>(p2[0]), static_cast<const float*>(p2[1]), act);
  ZINF_RETURN_IF_ERROR(engine.Release(1));

  std::vector<float> d_out(kSamples), d_hidden(kSamples * kHidden), gw1, gb1, gw2, gb2;
  const double loss = Loss(d, act, d_out);

  // Backward, in reverse: each block's gradients go to the engine, which
  // reduces them (over ranks, when there are several) into its fp32
  // accumulator.
  ZINF_ASSIGN_OR_RETURN(p2, engine.Acquire(1));
  Layer2Backward(static_cast<const float*>(p2[0]), act, d_out, gw2, gb2, d_hidden);
  ZINF_RETURN_IF_ERROR(engine.ReduceGradients(1, {gw2.data(), gb2.data()}));
  ZINF_RETURN_IF_ERROR(engine.Release(1));
  // Layer 1's backward reads no weights of its own (only d_hidden); it is
  // acquired all the same, as a layer with inputs to differentiate would be.
  ZINF_ASSIGN_OR_RETURN(p1, engine.Acquire(0));
  Layer1Backward(d, act, d_hidden, gw1, gb1);
  ZINF_RETURN_IF_ERROR(engine.ReduceGradients(0, {gw1.data(), gb1.data()}));
  ZINF_RETURN_IF_ERROR(engine.Release(0));

  ZINF_ASSIGN_OR_RETURN(zinf::StepResult step, engine.Step());
  if (!step.applied) return zinf::Status::Internal("the optimizer step was skipped");
  return loss;
}

zinf::StatusOr<int> Run(const std::string& nvme_dir) {
  ZINF_ASSIGN_OR_RETURN(zinf::Config config, zinf::ParseConfig(ConfigJson(nvme_dir), "mlp_regression"));
  ZINF_RETURN_IF_ERROR(zinf::ResolveAuto(config, zinf::AutoContext{}));

  zinf::EngineOptions options;
  options.host_device = true;  // the math above runs on the CPU: Acquire must give host memory
  options.optimizer_threads = 1;
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<zinf::Engine> engine, zinf::Engine::Create(config, Blocks(), options));
  if (engine->param_type() != zinf::ElementType::kF32) return zinf::Status::Internal("expected fp32 parameters");

  // Initial weights: uniform in +-1/sqrt(fan_in), biases zero.
  std::mt19937 rng(42);
  const Data data = MakeData(rng);
  std::uniform_real_distribution<float> u1(-1.0f / std::sqrt(float{kIn}), 1.0f / std::sqrt(float{kIn}));
  std::uniform_real_distribution<float> u2(-1.0f / std::sqrt(float{kHidden}), 1.0f / std::sqrt(float{kHidden}));
  std::vector<float> w1(kHidden * kIn), b1(kHidden, 0.0f), w2(kHidden), b2(1, 0.0f);
  for (float& v : w1) v = u1(rng);
  for (float& v : w2) v = u2(rng);
  ZINF_RETURN_IF_ERROR(engine->SetParameters(0, {w1.data(), b1.data()}));
  ZINF_RETURN_IF_ERROR(engine->SetParameters(1, {w2.data(), b2.data()}));

  Activations act{std::vector<float>(kSamples * kHidden), std::vector<float>(kSamples * kHidden),
                  std::vector<float>(kSamples)};
  double first = 0.0, last = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    ZINF_ASSIGN_OR_RETURN(last, TrainStep(*engine, data, act));
    if (step == 0) first = last;
    if (step % 50 == 0 || step == kSteps - 1) std::printf("step %3d  loss %.5f\n", step, last);
  }
  ZINF_RETURN_IF_ERROR(engine->WaitForUpdate());

  const zinf::EngineCounters c = engine->counters();
  std::printf("loss %.5f -> %.5f over %d steps (%lld optimizer steps, %lld blocks gathered, %lld NVMe bytes)\n", first,
              last, kSteps, static_cast<long long>(engine->optimizer_steps()), static_cast<long long>(c.fetches),
              static_cast<long long>(c.nvme_read_bytes + c.nvme_write_bytes + c.optimizer_nvme_bytes));
  const bool fell = last < 0.5 * first;
  std::printf("%s\n", fell ? "ok: the loss fell below half its start" : "FAILED: the loss did not fall below half");
  return fell ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2) {
    std::fprintf(stderr, "usage: %s [nvme_dir]\n", argv[0]);
    return 2;
  }
  zinf::StatusOr<int> rc = Run(argc == 2 ? argv[1] : "");
  if (!rc.ok()) {
    std::fprintf(stderr, "mlp_regression: %s\n", rc.status().ToString().c_str());
    return 2;
  }
  return *rc;
}
