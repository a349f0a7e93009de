// The engine's checkpoint manifest keys: written, checked and read back.
#include "zero3/engine_manifest.h"

#include <gtest/gtest.h>

#include <cmath>

namespace zinf::zero3 {
namespace {

const std::vector<BlockSpec> kSpecs = {{"embed", {{"wte", {10, 4}}}}, {"h.0", {{"w", {4, 4}}, {"b", {4}}}}};

EngineLayoutKeys Layout(const std::vector<BlockSpec>* specs = &kSpecs) {
  EngineLayoutKeys l;
  l.world_size = 2;
  l.rank = 1;
  l.specs = specs;
  l.shard_elems = 384;
  l.sub_group_elems = 256;
  l.param_type = ElementType::kBf16;
  return l;
}

EngineProgress Progress() {
  EngineProgress p;
  p.applied_steps = 7;
  p.micro_steps = 28;
  p.lr_iteration = 6;
  p.loss_scaler.scale = 1.0 / 3.0;  // not exact in decimal
  p.loss_scaler.iteration = 27;
  p.loss_scaler.last_overflow_iteration = 3;
  p.loss_scaler.hysteresis_left = 2;
  return p;
}

TEST(EngineManifestTest, ProgressComesBackExactly) {
  const Metadata md = EngineMetadata(Layout(), Progress());
  EXPECT_EQ(md.at("engine.param_type"), "bf16");
  EXPECT_EQ(md.at("engine.world_size"), "2");
  StatusOr<EngineProgress> p = ReadProgress(md, "/ck/step-7");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->applied_steps, 7);
  EXPECT_EQ(p->micro_steps, 28);
  EXPECT_EQ(p->lr_iteration, 6);
  EXPECT_EQ(p->loss_scaler.scale, 1.0 / 3.0);  // bit for bit
  EXPECT_EQ(p->loss_scaler.iteration, 27);
  EXPECT_EQ(p->loss_scaler.last_overflow_iteration, 3);
  EXPECT_EQ(p->loss_scaler.hysteresis_left, 2);
}

TEST(EngineManifestTest, TheSameLayoutFitsWhateverTheProgress) {
  EngineProgress other = Progress();
  other.applied_steps = 100;
  EXPECT_TRUE(CheckLayoutFits(EngineMetadata(Layout(), Progress()), EngineMetadata(Layout(), other), "d").ok());
}

TEST(EngineManifestTest, ADifferentLayoutIsNamedWithWhatToChange) {
  const Metadata mine = EngineMetadata(Layout(), Progress());
  EngineLayoutKeys ranks = Layout();
  ranks.world_size = 4;
  Status s = CheckLayoutFits(EngineMetadata(ranks, Progress()), mine, "/ck/step-7");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("checkpoint /ck/step-7 does not fit this run: engine.world_size is 4 there and 2 here"),
            std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("as many ranks"), std::string::npos);

  EngineLayoutKeys groups = Layout();
  groups.sub_group_elems = 512;
  s = CheckLayoutFits(EngineMetadata(groups, Progress()), mine, "d");
  EXPECT_NE(s.message().find("sub_group_size"), std::string::npos) << s.ToString();

  std::vector<BlockSpec> renamed = kSpecs;
  renamed[1].tensors[1].name = "bias";
  s = CheckLayoutFits(EngineMetadata(Layout(&renamed), Progress()), mine, "d");
  EXPECT_NE(s.message().find("engine.layout_crc32c"), std::string::npos) << s.ToString();

  std::vector<BlockSpec> reshaped = kSpecs;
  reshaped[0].tensors[0].shape = {4, 10};
  s = CheckLayoutFits(EngineMetadata(Layout(&reshaped), Progress()), mine, "d");
  EXPECT_NE(s.message().find("engine.layout_crc32c"), std::string::npos) << s.ToString();
}

// The sub-group size a checkpoint was laid out in follows from the config's
// sub_group_size and, on NVMe, buffer_count: a refusal names the setting
// that differs, or all of them for a checkpoint that did not record them.
TEST(EngineManifestTest, ADifferentSubGroupSizeNamesTheSettingThatChanged) {
  EngineLayoutKeys here = Layout();
  here.config_sub_group_size = 1000;
  here.optimizer_device = OffloadDevice::kNvme;
  here.optimizer_buffer_count = 12;
  EngineLayoutKeys there = here;
  there.sub_group_elems = 128;  // fitted to 4 buffers
  there.optimizer_buffer_count = 4;
  const Metadata mine = EngineMetadata(here, Progress());
  Status s = CheckLayoutFits(EngineMetadata(there, Progress()), mine, "d");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("engine.sub_group_elems is 128 there and 256 here (offload_optimizer.buffer_count 4 "
                             "there and 12 here: "),
            std::string::npos)
      << s.ToString();
  EXPECT_EQ(s.message().find("offload_optimizer.device nvme"), std::string::npos) << s.ToString();

  // The settings differ but the size they give does not: the layout fits.
  there.sub_group_elems = here.sub_group_elems;
  EXPECT_TRUE(CheckLayoutFits(EngineMetadata(there, Progress()), mine, "d").ok());

  Metadata old = EngineMetadata(there, Progress());
  old["engine.sub_group_elems"] = "128";
  for (const char* key :
       {"engine.sub_group_size", "engine.offload_optimizer.device", "engine.offload_optimizer.buffer_count"}) {
    old.erase(key);
  }
  s = CheckLayoutFits(old, mine, "d");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("offload_optimizer.buffer_count when the state is on NVMe"), std::string::npos)
      << s.ToString();
}

TEST(EngineManifestTest, MissingAndMalformedKeysAreCorruptionNamingTheKey) {
  Metadata md = EngineMetadata(Layout(), Progress());
  md.erase("engine.rank");
  Status s = CheckLayoutFits(md, EngineMetadata(Layout(), Progress()), "/ck/x");
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("checkpoint /ck/x: manifest lacks 'engine.rank'"), std::string::npos) << s.ToString();

  for (const char* key : {"engine.applied_steps", "engine.micro_steps", "engine.scaler_iteration"}) {
    Metadata bad = EngineMetadata(Layout(), Progress());
    bad[key] = "12x";
    StatusOr<EngineProgress> p = ReadProgress(bad, "/ck/x");
    ASSERT_FALSE(p.ok()) << key;
    EXPECT_EQ(p.status().code(), StatusCode::kCorruption);
    EXPECT_NE(p.status().message().find(std::string("'") + key + "' is not an integer: '12x'"), std::string::npos)
        << p.status().ToString();
  }
  for (const char* scale : {"", "0", "-1", "abc"}) {
    Metadata bad = EngineMetadata(Layout(), Progress());
    bad["engine.loss_scale"] = scale;
    StatusOr<EngineProgress> p = ReadProgress(bad, "/ck/x");
    ASSERT_FALSE(p.ok()) << scale;
    EXPECT_NE(p.status().message().find("bad engine.loss_scale"), std::string::npos);
  }
}

TEST(EngineManifestTest, TheCallersKeysAreKeptApartFromTheEngines) {
  Metadata md = EngineMetadata(Layout(), Progress());
  md["trainer.step"] = "7";
  md["note"] = "x";
  const Metadata user = UserMetadata(md);
  EXPECT_EQ(user.size(), 2u);
  EXPECT_EQ(user.at("trainer.step"), "7");
  EXPECT_TRUE(CheckUserKeys(user).ok());
  Status s = CheckUserKeys({{"engine.mine", "1"}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'engine.mine' uses the reserved prefix"), std::string::npos);
}

}  // namespace
}  // namespace zinf::zero3
