#include "swap/optimizer_swapper.h"

#include <gtest/gtest.h>

#include <cmath>

#include "swap/checkpoint.h"
#include "swap/swap_test_util.h"

namespace zinf::swap {
namespace {

using testing::CorruptFile;
using testing::HeldWritesEngine;
using testing::MakeEngine;
using testing::MakeFaultyEngine;
using testing::MakePool;
using testing::MakeThreads;
using testing::RandomFloats;
using testing::TempDir;

constexpr int64_t kTotal = 100'003;    // not a multiple of the sub-group
constexpr int64_t kSubGroup = 30'000;  // 4 sub-groups, the last one 10'003

struct Result {
  std::vector<float> master, m, v;
  std::vector<uint16_t> params16;
  std::vector<int64_t> sub_groups_seen;  // StepIo::on_sub_group's calls
};

class OptimizerSwapperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    threads_ = MakeThreads();
    ASSERT_NE(threads_, nullptr);
    OptimizerConfig config;
    config.lr = 1e-3;
    config.weight_decay = 0.01;
    auto adam = optim::CpuAdam::Create(config, threads_.get(), optim::Isa::kScalar);
    ASSERT_TRUE(adam.ok()) << adam.status().ToString();
    adam_ = std::make_unique<optim::CpuAdam>(std::move(adam).value());
  }

  OptimizerSwapperOptions Options(OffloadDevice device, bool pr, bool pw) {
    OptimizerSwapperOptions o;
    o.total_elems = kTotal;
    o.sub_group_elems = kSubGroup;
    o.device = device;
    o.pipeline_read = pr;
    o.pipeline_write = pw;
    o.store.paths = {dir_.Sub("nvme0"), dir_.Sub("nvme1"), dir_.Sub("nvme2")};
    o.store.stripe_bytes = 32 << 10;
    o.prefix = "optim" + std::to_string(counter_++);
    return o;
  }

  // Three steps with fresh gradients; returns the final state.
  // `caller_grads`: the gradients go to Step (gradients_in_store off).
  // `prefetch`: PrefetchStep before every Step, and also before the
  // Initialize and SetGradients that make such reads stale.
  Result Run(OptimizerSwapper& s, bool caller_grads = false, bool prefetch = false) {
    Result r;
    const std::vector<float> master = RandomFloats(kTotal, 1, 1.0f);
    if (prefetch) {
      const std::vector<float> other = RandomFloats(kTotal, 2, 1.0f);
      EXPECT_TRUE(s.Initialize(other.data()).ok());
      EXPECT_TRUE(s.PrefetchStep().ok());
    }
    EXPECT_TRUE(s.Initialize(master.data()).ok());
    r.params16.assign(kTotal, 0);
    for (int step = 1; step <= 3; ++step) {
      if (prefetch) {
        EXPECT_TRUE(s.PrefetchStep().ok());
        EXPECT_TRUE(s.PrefetchStep().ok());  // already under way: nothing more
      }
      const std::vector<float> grads = RandomFloats(kTotal, 10 + step, 0.1f);
      StepIo io = OutputTo(r.params16.data());
      if (caller_grads) {
        io.grads = grads.data();
        io.on_sub_group = [&](int64_t k) {
          r.sub_groups_seen.push_back(k);
          return Status::Ok();
        };
      } else {
        EXPECT_TRUE(s.SetGradients(grads.data()).ok());
      }
      optim::AdamStepArgs args;
      args.step = step;
      args.lr = 1e-3;
      Status st = s.Step(*adam_, args, io);
      EXPECT_TRUE(st.ok()) << st.ToString();
    }
    r.master.resize(kTotal);
    r.m.resize(kTotal);
    r.v.resize(kTotal);
    EXPECT_TRUE(s.ReadState(r.master.data(), r.m.data(), r.v.data(), nullptr).ok());
    return r;
  }

  // A swapper on NVMe with options `o` over an engine that counts its
  // requests (HeldWritesEngine), with a pool of PoolBuffers(o).
  struct Counted {
    std::unique_ptr<aio::IoEngine> inner = MakeEngine();
    HeldWritesEngine engine{inner.get()};
    std::unique_ptr<aio::PinnedPool> pool;
    std::unique_ptr<OptimizerSwapper> swapper;
  };
  std::unique_ptr<Counted> MakeCounted(const OptimizerSwapperOptions& o) {
    auto c = std::make_unique<Counted>();
    c->pool = MakePool(OptimizerSwapper::PoolBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
    auto s = OptimizerSwapper::Create(o, &c->engine, c->pool.get());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) c->swapper = std::move(s).value();
    return c;
  }

  // Step t with gradients stored by SetGradients (seed 100 + t), the
  // 16-bit output into `out16`.
  void StepStored(OptimizerSwapper& s, int t, std::vector<uint16_t>& out16) {
    const std::vector<float> grads = RandomFloats(kTotal, 100 + t, 0.1f);
    ASSERT_TRUE(s.SetGradients(grads.data()).ok());
    optim::AdamStepArgs args;
    args.step = t;
    args.lr = 1e-3;
    const Status st = s.Step(*adam_, args, OutputTo(out16.data()));
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  TempDir dir_;
  int counter_ = 0;
  std::unique_ptr<optim::ThreadPool> threads_;
  std::unique_ptr<optim::CpuAdam> adam_;
};

// The reference: the same three steps with CpuAdam over whole arrays in RAM.
Result Reference(const optim::CpuAdam& adam) {
  Result r;
  r.master = RandomFloats(kTotal, 1, 1.0f);
  r.m.assign(kTotal, 0.0f);
  r.v.assign(kTotal, 0.0f);
  r.params16.assign(kTotal, 0);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> grads = RandomFloats(kTotal, 10 + step, 0.1f);
    optim::AdamSpan span;
    span.params = r.master.data();
    span.exp_avg = r.m.data();
    span.exp_avg_sq = r.v.data();
    span.grads = grads.data();
    span.params16 = r.params16.data();
    span.params16_dtype = ElementType::kBf16;
    span.n = kTotal;
    optim::AdamStepArgs args;
    args.step = step;
    args.lr = 1e-3;
    EXPECT_TRUE(adam.Update(span, args).ok());
  }
  return r;
}

void ExpectBitIdentical(const Result& a, const Result& b) {
  ASSERT_EQ(a.master.size(), b.master.size());
  EXPECT_EQ(std::memcmp(a.master.data(), b.master.data(), a.master.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.m.data(), b.m.data(), a.m.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.v.data(), b.v.data(), a.v.size() * 4), 0);
  EXPECT_EQ(a.params16, b.params16);
}

TEST_F(OptimizerSwapperTest, CpuStateMatchesWholeArrayAdam) {
  auto s = OptimizerSwapper::Create(Options(OffloadDevice::kCpu, false, false), nullptr, nullptr);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->num_sub_groups(), 4);
  EXPECT_EQ((*s)->sub_group_elems(3), 10'003);
  ExpectBitIdentical(Run(**s), Reference(*adam_));
}

// One sub-group of the whole shard, stepped in slices of kChunkElems: each
// slice is announced (StepIo::on_stepped) once its parameters are out and
// before the next slice's are, and slicing changes no bit.
TEST_F(OptimizerSwapperTest, LargeSubGroupsAreSteppedAndAnnouncedInSlices) {
  for (OffloadDevice device : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    SCOPED_TRACE(OffloadDeviceName(device));
    OptimizerSwapperOptions o = Options(device, true, true);
    o.sub_group_elems = kTotal;
    o.step_slice_elems = optim::kChunkElems;
    const bool nvme = device == OffloadDevice::kNvme;
    auto engine = MakeEngine();
    auto pool =
        nvme ? MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096)) : nullptr;
    auto s = OptimizerSwapper::Create(o, engine.get(), pool.get());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_EQ((*s)->num_sub_groups(), 1);
    const std::vector<float> master = RandomFloats(kTotal, 1, 1.0f), grads = RandomFloats(kTotal, 11, 0.1f);
    ASSERT_TRUE((*s)->Initialize(master.data()).ok());
    ASSERT_TRUE((*s)->SetGradients(grads.data()).ok());
    constexpr uint16_t kUnset = 0x7FC1;  // a NaN Adam does not write
    std::vector<uint16_t> params16(kTotal, kUnset);
    std::vector<int64_t> ends;
    StepIo io = OutputTo(params16.data());
    io.on_stepped = [&](int64_t end) {
      ends.push_back(end);
      EXPECT_NE(params16[static_cast<size_t>(end - 1)], kUnset) << end;
      if (end < kTotal) {
        EXPECT_EQ(params16[static_cast<size_t>(end)], kUnset) << end;
      }
      return Status::Ok();
    };
    optim::AdamStepArgs args;
    args.lr = 1e-3;
    ASSERT_TRUE((*s)->Step(*adam_, args, io).ok());
    EXPECT_EQ(ends, (std::vector<int64_t>{optim::kChunkElems, kTotal}));

    // The reference's first step: one span of the whole shard.
    std::vector<float> m(kTotal, 0.0f), v(kTotal, 0.0f), want_master = master;
    std::vector<uint16_t> want16(kTotal);
    optim::AdamSpan span;
    span.params = want_master.data();
    span.exp_avg = m.data();
    span.exp_avg_sq = v.data();
    span.grads = grads.data();
    span.params16 = want16.data();
    span.n = kTotal;
    ASSERT_TRUE(adam_->Update(span, args).ok());
    EXPECT_EQ(params16, want16);
    std::vector<float> got(kTotal);
    ASSERT_TRUE((*s)->ReadState(got.data(), nullptr, nullptr, nullptr).ok());
    EXPECT_EQ(std::memcmp(got.data(), want_master.data(), got.size() * 4), 0);
  }
  OptimizerSwapperOptions bad = Options(OffloadDevice::kCpu, false, false);
  bad.step_slice_elems = optim::kChunkElems + 16;
  const auto s = OptimizerSwapper::Create(bad, nullptr, nullptr);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("step_slice_elems"), std::string::npos) << s.status().message();
}

// The resident state's pool, as Create makes it: master, m, v per
// sub-group with the gradient from the caller; none for NVMe.
TEST_F(OptimizerSwapperTest, ResidentPoolOptionsAreWhatCreateAllocates) {
  OptimizerSwapperOptions o = Options(OffloadDevice::kCpu, false, false);
  EXPECT_EQ(OptimizerSwapper::NumSubGroups(o), 4);
  aio::PinnedPoolOptions po = OptimizerSwapper::ResidentPoolOptions(o);
  EXPECT_EQ(po.buffer_count, (o.gradients_in_store ? 4 : 3) * 4);
  EXPECT_EQ(po.buffer_bytes, OptimizerSwapper::RequiredBufferBytes(o, 4096));
  EXPECT_EQ(po.pin, o.pin_memory);
  o.device = OffloadDevice::kNvme;
  EXPECT_EQ(OptimizerSwapper::ResidentPoolOptions(o).buffer_count, 0);
}

class OptimizerSwapperPipelineTest : public OptimizerSwapperTest,
                                     public ::testing::WithParamInterface<std::tuple<bool, bool>> {};

TEST_P(OptimizerSwapperPipelineTest, NvmeStepIsBitIdenticalToRam) {
  const auto [pr, pw] = GetParam();
  const OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, pr, pw);
  auto engine = MakeEngine();
  auto pool = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
  auto s = OptimizerSwapper::Create(o, engine.get(), pool.get());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(pool->free_count(), 0);  // every buffer leased up front
  const Result nvme = Run(**s);
  auto cpu = OptimizerSwapper::Create(Options(OffloadDevice::kCpu, pr, pw), nullptr, nullptr);
  ASSERT_TRUE(cpu.ok());
  ExpectBitIdentical(nvme, Run(**cpu));
  ExpectBitIdentical(nvme, Reference(*adam_));
}

// The engine's mode: the gradient stays with the caller. The store holds
// three arrays per sub-group, the pipeline needs three buffers per sub-group
// in flight, the results are bit-identical, and the callback hears of every
// sub-group in order.
TEST_P(OptimizerSwapperPipelineTest, GradientsFromTheCallerAreBitIdenticalAndNotStored) {
  const auto [pr, pw] = GetParam();
  OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, pr, pw);
  o.gradients_in_store = false;
  EXPECT_EQ(OptimizerSwapper::RequiredBuffers(o), 3 * (1 + int{pr} + int{pw}));
  auto engine = MakeEngine();
  auto pool = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
  auto s = OptimizerSwapper::Create(o, engine.get(), pool.get());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->store()->tensor_count(), 3 * (*s)->num_sub_groups());
  const std::vector<float> grads(kTotal, 0.5f);
  EXPECT_EQ((*s)->SetGradients(grads.data()).code(), StatusCode::kFailedPrecondition);
  const Result nvme = Run(**s, /*caller_grads=*/true);
  ExpectBitIdentical(nvme, Reference(*adam_));
  std::vector<int64_t> order;
  for (int step = 0; step < 3; ++step) {
    for (int64_t k = 0; k < (*s)->num_sub_groups(); ++k) order.push_back(k);
  }
  EXPECT_EQ(nvme.sub_groups_seen, order);

  o.device = OffloadDevice::kCpu;
  auto cpu = OptimizerSwapper::Create(o, nullptr, nullptr);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ExpectBitIdentical(nvme, Run(**cpu, /*caller_grads=*/true));
}

// PrefetchStep reads the first sub-groups' state ahead of the Step; the
// Step uses those reads, and the calls that change the state (Initialize,
// SetGradients) drop them, so the results stay bit-identical.
TEST_P(OptimizerSwapperPipelineTest, PrefetchedStepsAreBitIdentical) {
  const auto [pr, pw] = GetParam();
  for (bool caller_grads : {false, true}) {
    SCOPED_TRACE(caller_grads ? "gradients from the caller" : "gradients in the store");
    OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, pr, pw);
    o.gradients_in_store = !caller_grads;
    auto engine = MakeEngine();
    auto pool = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
    auto s = OptimizerSwapper::Create(o, engine.get(), pool.get());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ExpectBitIdentical(Run(**s, caller_grads, /*prefetch=*/true), Reference(*adam_));
    // Prefetched reads left behind are waited for, not leaked or written over.
    EXPECT_TRUE((*s)->PrefetchStep().ok());
    std::vector<float> master(kTotal);
    ASSERT_TRUE((*s)->ReadMaster(0, kTotal, master.data()).ok());
    EXPECT_EQ(std::memcmp(master.data(), Reference(*adam_).master.data(), master.size() * 4), 0);
    EXPECT_TRUE((*s)->PrefetchStep().ok());  // the destructor waits for these
  }
}

// The Step after a PrefetchStep reads every sub-group's state once: the
// prefetched reads are used, not repeated.
TEST_P(OptimizerSwapperPipelineTest, StepUsesThePrefetchedReads) {
  const auto [pr, pw] = GetParam();
  OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, pr, pw);
  o.gradients_in_store = false;
  const auto c = MakeCounted(o);
  ASSERT_NE(c->swapper, nullptr);
  HeldWritesEngine& engine = c->engine;
  auto* s = &c->swapper;
  const std::vector<float> master = RandomFloats(kTotal, 1, 1.0f), grads = RandomFloats(kTotal, 11, 0.1f);
  ASSERT_TRUE((*s)->Initialize(master.data()).ok());
  std::vector<uint16_t> params16(kTotal);
  StepIo io = OutputTo(params16.data());
  io.grads = grads.data();
  optim::AdamStepArgs args;
  args.lr = 1e-3;
  for (args.step = 1; args.step <= 2; ++args.step) {
    SCOPED_TRACE("step " + std::to_string(args.step));
    const int64_t before = engine.reads;
    ASSERT_TRUE((*s)->PrefetchStep().ok());
    EXPECT_GT(engine.reads, before);
    ASSERT_TRUE((*s)->PrefetchStep().ok());
    ASSERT_TRUE((*s)->Step(*adam_, args, io).ok());
    // The first step reads the master weights alone: m and v start zero
    // (ZeroMoments wrote nothing to read).
    EXPECT_EQ(engine.reads - before, (args.step == 1 ? 1 : 3) * (*s)->num_sub_groups());
  }
}

// A gradient the caller holds in RAM (StepIo::held_grads: the engine's
// gradient window after Finish) is used as it is and not read from the
// store: here the store holds zeros where the caller holds the values, so
// only a step that takes each from the right place gives the reference's
// bits, and the reads are the state's plus the gradients not held.
TEST_P(OptimizerSwapperPipelineTest, HeldGradientsAreUsedNotRead) {
  const auto [pr, pw] = GetParam();
  OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, pr, pw);
  o.gradients_in_store = true;
  const auto c = MakeCounted(o);
  ASSERT_NE(c->swapper, nullptr);
  HeldWritesEngine& engine = c->engine;
  auto* s = &c->swapper;
  const Result want = Reference(*adam_);
  Result got;
  got.params16.assign(kTotal, 0);
  const std::vector<float> master = RandomFloats(kTotal, 1, 1.0f);
  ASSERT_TRUE((*s)->Initialize(master.data()).ok());
  const int64_t n = (*s)->num_sub_groups();
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> grads = RandomFloats(kTotal, 10 + step, 0.1f);
    std::vector<float> stored = grads;
    auto held = [&](int64_t k) { return (k + step) % 2 == 0; };  // a different half each step
    for (int64_t k = 0; k < n; ++k) {
      if (held(k)) std::fill_n(stored.begin() + (*s)->sub_group_begin(k), (*s)->sub_group_elems(k), 0.0f);
    }
    ASSERT_TRUE((*s)->SetGradients(stored.data()).ok());
    if (step == 2) {
      ASSERT_TRUE((*s)->PrefetchStep().ok());
    }
    StepIo io = OutputTo(got.params16.data());
    io.held_grads = [&](int64_t k) -> const float* {
      return held(k) ? grads.data() + (*s)->sub_group_begin(k) : nullptr;
    };
    optim::AdamStepArgs args;
    args.step = step;
    args.lr = 1e-3;
    const int64_t before = engine.reads;
    ASSERT_TRUE((*s)->Step(*adam_, args, io).ok());
    int64_t not_held = 0;
    for (int64_t k = 0; k < n; ++k) not_held += held(k) ? 0 : 1;
    const int64_t prefetched = step == 2 ? 3 * std::min<int64_t>(n, OptimizerSwapper::PoolBuffers(o) / 4) : 0;
    const int64_t state = step == 1 ? n : 3 * n;  // m and v start zero, not read
    EXPECT_EQ(engine.reads - before, state + not_held - prefetched) << "step " << step;
  }
  got.master.resize(kTotal);
  got.m.resize(kTotal);
  got.v.resize(kTotal);
  ASSERT_TRUE((*s)->ReadState(got.master.data(), got.m.data(), got.v.data(), nullptr).ok());
  ExpectBitIdentical(got, want);
}

// buffer_count beyond what the pipeline needs: with pipeline_read the extra
// whole sub-groups of buffers read further ahead, and slots are reused many
// times over 15 sub-groups; results stay bit-identical.
TEST_P(OptimizerSwapperPipelineTest, ExtraBuffersReadFurtherAheadBitIdentically) {
  const auto [pr, pw] = GetParam();
  OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, pr, pw);
  o.gradients_in_store = false;
  o.sub_group_elems = 7'000;
  const int64_t need = OptimizerSwapper::RequiredBuffers(o);
  o.buffer_count = need + 2 * 3 + 1;  // two more sub-groups, and one buffer that makes no whole one
  EXPECT_EQ(OptimizerSwapper::PoolBuffers(o), pr ? need + 6 : need);
  auto engine = MakeEngine();
  auto pool = MakePool(OptimizerSwapper::PoolBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
  auto s = OptimizerSwapper::Create(o, engine.get(), pool.get());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(pool->free_count(), 0);
  EXPECT_EQ((*s)->num_sub_groups(), 15);
  ExpectBitIdentical(Run(**s, /*caller_grads=*/true, /*prefetch=*/true), Reference(*adam_));
}

INSTANTIATE_TEST_SUITE_P(ReadWrite, OptimizerSwapperPipelineTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST_F(OptimizerSwapperTest, StepIoMisuseAndCallbackErrorsStopTheStep) {
  OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, true, true);
  o.gradients_in_store = false;
  auto engine = MakeEngine();
  auto pool = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
  auto s = OptimizerSwapper::Create(o, engine.get(), pool.get());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const std::vector<float> master = RandomFloats(kTotal, 1, 1.0f);
  ASSERT_TRUE((*s)->Initialize(master.data()).ok());
  optim::AdamStepArgs args;
  args.step = 1;
  args.lr = 1e-3;
  std::vector<float> out(kTotal);
  StepIo io;
  io.params = out.data();
  io.params_dtype = ElementType::kF32;
  EXPECT_EQ((*s)->Step(*adam_, args, io).code(), StatusCode::kInvalidArgument);  // no gradient given

  const std::vector<float> grads = RandomFloats(kTotal, 2, 0.1f);
  io.grads = grads.data();
  std::vector<int64_t> seen;
  io.on_sub_group = [&](int64_t k) {
    seen.push_back(k);
    return k == 1 ? Status::Aborted("stop here") : Status::Ok();
  };
  Status st = (*s)->Step(*adam_, args, io);
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("sub-group 1"), std::string::npos) << st.message();
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1}));

  // fp32 output is the new master weights, copied per sub-group.
  io.on_sub_group = nullptr;
  args.step = 2;
  ASSERT_TRUE((*s)->Step(*adam_, args, io).ok());
  std::vector<float> stepped(kTotal);
  ASSERT_TRUE((*s)->ReadState(stepped.data(), nullptr, nullptr, nullptr).ok());
  EXPECT_EQ(std::memcmp(out.data(), stepped.data(), out.size() * 4), 0);
  std::vector<float> g(kTotal);
  EXPECT_EQ((*s)->ReadState(nullptr, nullptr, nullptr, g.data()).code(), StatusCode::kFailedPrecondition);
}

TEST_F(OptimizerSwapperTest, PoolTooSmallForThePipelineIsAConfigError) {
  const OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, true, true);
  EXPECT_EQ(OptimizerSwapper::RequiredBuffers(o), 12);
  auto engine = MakeEngine();
  auto pool = MakePool(4, OptimizerSwapper::RequiredBufferBytes(o, 4096));  // DeepSpeed's default count
  auto s = OptimizerSwapper::Create(o, engine.get(), pool.get());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("buffer_count"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("12 buffers"), std::string::npos) << s.status().message();

  auto small = MakePool(12, 64 << 10);
  s = OptimizerSwapper::Create(o, engine.get(), small.get());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("sub_group_size"), std::string::npos) << s.status().message();
}

TEST_F(OptimizerSwapperTest, IoErrorDuringStepIsReportedWithTheSubGroup) {
  const OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, true, true);
  aio::FaultOptions f;
  f.seed = 3;
  f.eio_rate = 0.2;
  auto engine = MakeFaultyEngine(f);
  engine->injector().set_enabled(false);
  auto pool = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
  auto s = OptimizerSwapper::Create(o, engine.get(), pool.get());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const std::vector<float> master = RandomFloats(kTotal, 1, 1.0f);
  ASSERT_TRUE((*s)->Initialize(master.data()).ok());
  engine->injector().set_enabled(true);
  std::vector<uint16_t> out(kTotal);
  optim::AdamStepArgs args;
  args.lr = 1e-3;
  Status st = (*s)->Step(*adam_, args, OutputTo(out.data()));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sub-group"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(".swp"), std::string::npos) << st.message();
  EXPECT_EQ(pool->free_count(), 0);  // buffers stay leased; nothing in flight
}

// Train 2 steps, checkpoint the NVMe state, load it into a new swapper on
// other files, train 2 more: bit for bit what 4 uninterrupted steps give.
// The same from a checkpoint before the first step, whose m and v are
// still marked zero (not on disk): the save writes them out.
TEST_F(OptimizerSwapperTest, ResumeFromCheckpointEqualsUninterruptedTraining) {
  constexpr int kAfter = 2;
  for (const int kBefore : {2, 0}) {
    SCOPED_TRACE("checkpoint after step " + std::to_string(kBefore));
    auto engine = MakeEngine();
    const std::vector<float> master = RandomFloats(kTotal, 1, 1.0f);
    auto step = [&](OptimizerSwapper& s, int t, std::vector<uint16_t>& out16) { StepStored(s, t, out16); };
    auto make = [&](std::unique_ptr<aio::PinnedPool>& pool) {
      const OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, true, true);
      pool = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
      auto s = OptimizerSwapper::Create(o, engine.get(), pool.get());
      EXPECT_TRUE(s.ok()) << s.status().ToString();
      return s.ok() ? std::move(s).value() : nullptr;
    };
    // The state blobs a checkpoint holds: every master, m and v sub-group.
    auto state_blobs = [](OptimizerSwapper& s, OptimizerSwapper::BlobUse use) {
      auto blobs = s.CheckpointBlobs(use);
      EXPECT_TRUE(blobs.ok()) << blobs.status().ToString();
      EXPECT_EQ(blobs.ok() ? blobs->size() : 0, static_cast<size_t>(3 * s.num_sub_groups()));
      return blobs.ok() ? *blobs : std::vector<BlobRef>{};
    };

    std::unique_ptr<aio::PinnedPool> pool_a, pool_b, pool_c;
    std::vector<uint16_t> out_a(kTotal), out_b(kTotal);
    auto uninterrupted = make(pool_a);
    ASSERT_NE(uninterrupted, nullptr);
    ASSERT_TRUE(uninterrupted->Initialize(master.data()).ok());
    for (int t = 1; t <= kBefore + kAfter; ++t) step(*uninterrupted, t, out_a);

    auto first = make(pool_b);
    ASSERT_NE(first, nullptr);
    if (kBefore == 0) {  // m and v on disk that are not zero, under the marks
      const std::vector<float> other = RandomFloats(kTotal, 2, 1.0f);
      ASSERT_TRUE(first->Initialize(other.data()).ok());
      std::vector<uint16_t> ignored(kTotal);
      step(*first, 1, ignored);
    }
    ASSERT_TRUE(first->Initialize(master.data()).ok());
    for (int t = 1; t <= kBefore; ++t) step(*first, t, out_b);
    auto ckpt_pool = MakePool(2, 64 << 10);
    const std::string ckpt = dir_.Sub("ckpt") + "/step-" + std::to_string(kBefore);
    ASSERT_TRUE(MakeDirectories(dir_.Sub("ckpt")).ok());
    Status st = SaveCheckpoint(*engine, *ckpt_pool, ckpt, {{"step", std::to_string(kBefore)}},
                               state_blobs(*first, OptimizerSwapper::BlobUse::kSave));
    ASSERT_TRUE(st.ok()) << st.ToString();
    first.reset();

    auto resumed = make(pool_c);
    ASSERT_NE(resumed, nullptr);
    ASSERT_TRUE(resumed->Initialize(master.data()).ok());  // then overwritten by the checkpoint
    auto meta = LoadCheckpoint(*engine, *ckpt_pool, ckpt, state_blobs(*resumed, OptimizerSwapper::BlobUse::kRestore));
    ASSERT_TRUE(meta.ok()) << meta.status().ToString();
    resumed->Restored();
    ASSERT_EQ(meta->at("step"), std::to_string(kBefore));
    for (int t = kBefore + 1; t <= kBefore + kAfter; ++t) step(*resumed, t, out_b);

    Result a, b;
    for (Result* r : {&a, &b}) {
      r->master.resize(kTotal);
      r->m.resize(kTotal);
      r->v.resize(kTotal);
    }
    ASSERT_TRUE(uninterrupted->ReadState(a.master.data(), a.m.data(), a.v.data(), nullptr).ok());
    ASSERT_TRUE(resumed->ReadState(b.master.data(), b.m.data(), b.v.data(), nullptr).ok());
    a.params16 = out_a;
    b.params16 = out_b;
    ExpectBitIdentical(a, b);
  }
}

// A load refused before it writes anything (a corrupt blob) leaves m and v
// marked zero: the swapper's own start (Initialize) trains on, bit for bit
// as an uninterrupted run, rather than reading m and v never written.
TEST_F(OptimizerSwapperTest, ARefusedLoadKeepsTheZeroMarks) {
  auto engine = MakeEngine();
  const OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, true, true);
  const std::vector<float> master = RandomFloats(kTotal, 1, 1.0f);
  std::vector<uint16_t> out(kTotal);
  auto steps = [&](OptimizerSwapper& s) {
    for (int t = 1; t <= 2; ++t) StepStored(s, t, out);
  };

  auto pool_a = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
  auto a = OptimizerSwapper::Create(o, engine.get(), pool_a.get());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE((*a)->Initialize(master.data()).ok());
  steps(**a);
  auto saved = (*a)->CheckpointBlobs(OptimizerSwapper::BlobUse::kSave);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  auto ckpt_pool = MakePool(2, 64 << 10);
  ASSERT_TRUE(MakeDirectories(dir_.Sub("ckpt")).ok());
  const std::string ckpt = dir_.Sub("ckpt") + "/step-2";
  ASSERT_TRUE(SaveCheckpoint(*engine, *ckpt_pool, ckpt, {{"step", "2"}}, *saved).ok());
  CorruptFile(ckpt + "/blob-00000.bin", 1000);

  const OptimizerSwapperOptions ob = Options(OffloadDevice::kNvme, true, true);
  auto pool_b = MakePool(OptimizerSwapper::RequiredBuffers(ob), OptimizerSwapper::RequiredBufferBytes(ob, 4096));
  auto b = OptimizerSwapper::Create(ob, engine.get(), pool_b.get());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE((*b)->Initialize(master.data()).ok());
  auto blobs = (*b)->CheckpointBlobs(OptimizerSwapper::BlobUse::kRestore);
  ASSERT_TRUE(blobs.ok()) << blobs.status().ToString();
  auto meta = LoadCheckpoint(*engine, *ckpt_pool, ckpt, *blobs);
  ASSERT_EQ(meta.status().code(), StatusCode::kCorruption) << meta.status().ToString();
  steps(**b);
  Result ra, rb;
  for (auto [s, r] : {std::pair{a->get(), &ra}, std::pair{b->get(), &rb}}) {
    r->master.resize(kTotal);
    r->m.resize(kTotal);
    r->v.resize(kTotal);
    ASSERT_TRUE(s->ReadState(r->master.data(), r->m.data(), r->v.data(), nullptr).ok());
  }
  ExpectBitIdentical(ra, rb);
}

// The initial master weights streamed in by ranges, in any order and cut
// across sub-groups, equal Initialize's; ZeroMoments zeroes m and v.
TEST_F(OptimizerSwapperTest, WriteMasterByRangesEqualsInitialize) {
  for (OffloadDevice device : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    SCOPED_TRACE(OffloadDeviceName(device));
    OptimizerSwapperOptions o = Options(device, true, true);
    auto engine = MakeEngine();
    auto pool = MakePool(OptimizerSwapper::RequiredBuffers(o) + 1, OptimizerSwapper::RequiredBufferBytes(o, 4096));
    auto s = OptimizerSwapper::Create(o, engine.get(), pool.get());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const std::vector<float> master = RandomFloats(kTotal, 7, 1.0f);
    // Ascending pieces written in a shuffled order; one written twice.
    const int64_t cuts[] = {0, 12'345, 29'999, 30'001, 61'000, 90'000, 100'003};
    for (int i : {3, 0, 5, 1, 4, 2, 3}) {
      const int64_t b = cuts[i], n = cuts[i + 1] - cuts[i];
      ASSERT_TRUE((*s)->WriteMaster(b, n, master.data() + b).ok());
    }
    ASSERT_TRUE((*s)->ZeroMoments().ok());
    std::vector<float> got(kTotal), m(kTotal, 1.0f), v(kTotal, 1.0f);
    ASSERT_TRUE((*s)->ReadState(got.data(), m.data(), v.data(), nullptr).ok());
    EXPECT_EQ(got, master);
    EXPECT_EQ(m, std::vector<float>(kTotal, 0.0f));
    EXPECT_EQ(v, std::vector<float>(kTotal, 0.0f));
    EXPECT_FALSE((*s)->WriteMaster(kTotal - 1, 2, master.data()).ok());
  }
}

// On NVMe, ZeroMoments writes nothing (m and v are marked zero) and
// Initialize writes the master weights alone; the state reads back zero
// where m and v were not, and the steps after stay bit-identical to RAM
// (NvmeStepIsBitIdenticalToRam); the bytes a step moves count the reads
// skipped.
TEST_F(OptimizerSwapperTest, ZeroMomentsWriteNothingOnNvme) {
  OptimizerSwapperOptions o = Options(OffloadDevice::kNvme, true, true);
  o.gradients_in_store = false;
  const auto c = MakeCounted(o);
  ASSERT_NE(c->swapper, nullptr);
  HeldWritesEngine& engine = c->engine;
  auto* s = &c->swapper;
  const int64_t n = (*s)->num_sub_groups(), state = kTotal * 4;
  const std::vector<float> master = RandomFloats(kTotal, 1, 1.0f), grads = RandomFloats(kTotal, 3, 0.1f);
  int64_t before = engine.writes;
  ASSERT_TRUE((*s)->Initialize(master.data()).ok());
  EXPECT_EQ(engine.writes - before, n);
  EXPECT_EQ((*s)->StepStateBytes(), state * (1 + 3));
  std::vector<uint16_t> params16(kTotal);
  StepIo io = OutputTo(params16.data());
  io.grads = grads.data();
  optim::AdamStepArgs args;
  args.step = 1;
  args.lr = 1e-3;
  ASSERT_TRUE((*s)->Step(*adam_, args, io).ok());
  EXPECT_EQ((*s)->StepStateBytes(), state * (3 + 3));
  std::vector<float> m(kTotal), v(kTotal);
  ASSERT_TRUE((*s)->ReadState(nullptr, m.data(), v.data(), nullptr).ok());
  EXPECT_NE(m, std::vector<float>(kTotal, 0.0f));
  before = engine.writes;
  ASSERT_TRUE((*s)->ZeroMoments().ok());
  EXPECT_EQ(engine.writes, before);
  ASSERT_TRUE((*s)->ReadState(nullptr, m.data(), v.data(), nullptr).ok());
  EXPECT_EQ(m, std::vector<float>(kTotal, 0.0f));
  EXPECT_EQ(v, std::vector<float>(kTotal, 0.0f));
}

// ReadMaster of ranges inside one sub-group, across several and whole,
// from RAM and from NVMe: the values, handed over a sub-group's part at a
// time in order (each piece within one sub-group, the pieces tiling the
// range); with delayed completions too (the read ahead lands while the
// last piece is handed over). An I/O error is returned naming the file
// (that no read is left in flight into the buffers freed after it is
// ASan's to see).
TEST_F(OptimizerSwapperTest, ReadMasterHandsOverRangesBySubGroup) {
  for (OffloadDevice device : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    SCOPED_TRACE(OffloadDeviceName(device));
    const OptimizerSwapperOptions o = Options(device, true, true);
    aio::FaultOptions f;
    f.seed = 5;
    f.delay_rate = 0.5;
    const bool nvme = device == OffloadDevice::kNvme;
    auto engine = MakeFaultyEngine(f);
    auto pool =
        nvme ? MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096)) : nullptr;
    auto s = OptimizerSwapper::Create(o, nvme ? engine.get() : nullptr, pool.get());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const std::vector<float> master = RandomFloats(kTotal, 9, 1.0f);
    ASSERT_TRUE((*s)->Initialize(master.data()).ok());
    const std::pair<int64_t, int64_t> ranges[] = {
        {0, kTotal}, {5, 100}, {29'990, 20}, {12'345, 70'000}, {kTotal - 1, 1}};
    for (const auto& [begin, count] : ranges) {
      SCOPED_TRACE(std::to_string(begin) + " +" + std::to_string(count));
      std::vector<float> got(static_cast<size_t>(count), -1.0f);
      int64_t next = 0;
      ASSERT_TRUE((*s)->ReadMaster(begin, count,
                                   [&](int64_t at, const float* src, int64_t n) {
                                     EXPECT_EQ(at, next);
                                     EXPECT_GT(n, 0);
                                     EXPECT_EQ((begin + at) / kSubGroup, (begin + at + n - 1) / kSubGroup)
                                         << "two sub-groups";
                                     std::memcpy(got.data() + at, src, static_cast<size_t>(n) * sizeof(float));
                                     next = at + n;
                                   })
                      .ok());
      EXPECT_EQ(next, count);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), master.begin() + begin));
      std::vector<float> copy(static_cast<size_t>(count));
      ASSERT_TRUE((*s)->ReadMaster(begin, count, copy.data()).ok());
      EXPECT_EQ(copy, got);
    }
    EXPECT_FALSE((*s)->ReadMaster(kTotal - 1, 2, [](int64_t, const float*, int64_t) {}).ok());
    if (!nvme) continue;
    aio::FaultOptions eio;
    eio.seed = 1;
    eio.eio_rate = 1.0;
    auto failing = MakeFaultyEngine(eio);
    failing->injector().set_enabled(false);
    auto pool2 = MakePool(OptimizerSwapper::RequiredBuffers(o), OptimizerSwapper::RequiredBufferBytes(o, 4096));
    auto t = OptimizerSwapper::Create(Options(device, true, true), failing.get(), pool2.get());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE((*t)->Initialize(master.data()).ok());
    failing->injector().set_enabled(true);
    int pieces = 0;
    const Status st = (*t)->ReadMaster(0, kTotal, [&](int64_t, const float*, int64_t) { ++pieces; });
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(".swp"), std::string::npos) << st.message();
    EXPECT_EQ(pieces, 0);
    // The engine's errors are sticky: the next read is refused, naming it.
    failing->injector().set_enabled(false);
    std::vector<float> again(kTotal);
    const Status retry = (*t)->ReadMaster(0, kTotal, again.data());
    EXPECT_NE(retry.message().find("earlier I/O error"), std::string::npos) << retry.ToString();
  }
}

}  // namespace
}  // namespace zinf::swap
