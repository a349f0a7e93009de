// The engine's checkpoint manifest keys (engine_manifest.h).
#include "zero3/engine_manifest.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "zinf/element_type.h"

#include "core/crc32c.h"

namespace zinf::zero3 {
namespace {

// A double as a hexadecimal float: exact through a string and back.
std::string ExactDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", v);
  return buf;
}

// A CRC of every block's and tensor's name and shape.
std::string LayoutCrc(const std::vector<BlockSpec>& specs) {
  std::string layout;
  for (const BlockSpec& b : specs) {
    layout += b.name + "{";
    for (const TensorSpec& t : b.tensors) {
      layout += t.name + "[";
      for (int64_t d : t.shape) layout += std::to_string(d) + ",";
      layout += "]";
    }
    layout += "}";
  }
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", Crc32c(layout.data(), layout.size()));
  return crc;
}

StatusOr<std::string> Get(const Metadata& md, const std::string& key, const std::string& dir) {
  auto it = md.find(key);
  if (it == md.end()) return Status::Corruption("checkpoint " + dir + ": manifest lacks '" + key + "'");
  return it->second;
}

StatusOr<int64_t> GetInt(const Metadata& md, const std::string& key, const std::string& dir) {
  ZINF_ASSIGN_OR_RETURN(std::string v, Get(md, key, dir));
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0) {
    return Status::Corruption("checkpoint " + dir + ": '" + key + "' is not an integer: '" + v + "'");
  }
  return static_cast<int64_t>(x);
}

// The settings the sub-group size comes from, as recorded (the keys are
// absent from checkpoints written before they were).
constexpr const char* kSubGroupSources[][2] = {
    {"engine.sub_group_size", "zero_optimization.sub_group_size"},
    {"engine.offload_optimizer.device", "offload_optimizer.device"},
    {"engine.offload_optimizer.buffer_count", "offload_optimizer.buffer_count"},
};

// Why the sub-group sizes differ: the settings that do, or, for a checkpoint
// that did not record them, every one the size comes from.
std::string SubGroupHint(const Metadata& theirs, const Metadata& mine) {
  std::string changed;
  for (const auto& [key, setting] : kSubGroupSources) {
    const auto t = theirs.find(key), m = mine.find(key);
    if (t == theirs.end() || m == mine.end() || t->second == m->second) continue;
    changed += (changed.empty() ? "" : ", ") + std::string(setting) + " " + t->second + " there and " + m->second;
  }
  const std::string why =
      "the checkpoint holds the optimizer state per sub-group, and the sub-group size is "
      "zero_optimization.sub_group_size, split to fit offload_optimizer.buffer_count when the state is on NVMe and "
      "the buffers are fewer than the pipeline keeps";
  if (changed.empty()) return " (" + why + "; resume with the saving run's settings)";
  return " (" + changed + " here: " + why + "; resume with the saving run's settings)";
}

// What to change when a layout key differs.
std::string Hint(std::string_view key, const Metadata& theirs, const Metadata& mine) {
  if (key == "engine.sub_group_elems") return SubGroupHint(theirs, mine);
  if (key == "engine.world_size") return " (resume with as many ranks as saved it)";
  return "";
}

}  // namespace

Metadata EngineMetadata(const EngineLayoutKeys& l, const EngineProgress& p) {
  const optim::LossScaler::State& ls = p.loss_scaler;
  return {
      {"engine.format", "1"},
      {"engine.world_size", std::to_string(l.world_size)},
      {"engine.rank", std::to_string(l.rank)},
      {"engine.blocks", std::to_string(l.specs->size())},
      {"engine.layout_crc32c", LayoutCrc(*l.specs)},
      {"engine.shard_elems", std::to_string(l.shard_elems)},
      {"engine.sub_group_elems", std::to_string(l.sub_group_elems)},
      {"engine.sub_group_size", std::to_string(l.config_sub_group_size)},
      {"engine.offload_optimizer.device", std::string(OffloadDeviceName(l.optimizer_device))},
      {"engine.offload_optimizer.buffer_count", std::to_string(l.optimizer_buffer_count)},
      {"engine.param_type", std::string(ElementTypeName(l.param_type))},
      {"engine.applied_steps", std::to_string(p.applied_steps)},
      {"engine.micro_steps", std::to_string(p.micro_steps)},
      {"engine.lr_iteration", std::to_string(p.lr_iteration)},
      {"engine.loss_scale", ExactDouble(ls.scale)},
      {"engine.scaler_iteration", std::to_string(ls.iteration)},
      {"engine.scaler_last_overflow", std::to_string(ls.last_overflow_iteration)},
      {"engine.scaler_hysteresis_left", std::to_string(ls.hysteresis_left)},
  };
}

Status CheckLayoutFits(const Metadata& theirs, const Metadata& mine, const std::string& dir, bool weights_only) {
  for (const char* key : {"engine.format", "engine.world_size", "engine.rank", "engine.blocks", "engine.layout_crc32c",
                          "engine.shard_elems", "engine.sub_group_elems"}) {
    if (weights_only && std::string_view(key) == "engine.sub_group_elems") continue;
    ZINF_ASSIGN_OR_RETURN(std::string value, Get(theirs, key, dir));
    if (value != mine.at(key)) {
      return Status::FailedPrecondition("checkpoint " + dir + " does not fit this run: " + key + " is " + value +
                                        " there and " + mine.at(key) + " here" + Hint(key, theirs, mine));
    }
  }
  return Status::Ok();
}

StatusOr<EngineProgress> ReadProgress(const Metadata& md, const std::string& dir) {
  EngineProgress p;
  ZINF_ASSIGN_OR_RETURN(p.applied_steps, GetInt(md, "engine.applied_steps", dir));
  ZINF_ASSIGN_OR_RETURN(p.micro_steps, GetInt(md, "engine.micro_steps", dir));
  ZINF_ASSIGN_OR_RETURN(p.lr_iteration, GetInt(md, "engine.lr_iteration", dir));
  optim::LossScaler::State& ls = p.loss_scaler;
  ZINF_ASSIGN_OR_RETURN(std::string scale, Get(md, "engine.loss_scale", dir));
  char* end = nullptr;
  ls.scale = std::strtod(scale.c_str(), &end);
  if (scale.empty() || *end != '\0' || !(ls.scale > 0)) {
    return Status::Corruption("checkpoint " + dir + ": bad engine.loss_scale '" + scale + "'");
  }
  ZINF_ASSIGN_OR_RETURN(ls.iteration, GetInt(md, "engine.scaler_iteration", dir));
  ZINF_ASSIGN_OR_RETURN(ls.last_overflow_iteration, GetInt(md, "engine.scaler_last_overflow", dir));
  ZINF_ASSIGN_OR_RETURN(int64_t hysteresis, GetInt(md, "engine.scaler_hysteresis_left", dir));
  ls.hysteresis_left = static_cast<int>(hysteresis);
  return p;
}

Metadata UserMetadata(const Metadata& md) {
  Metadata user;
  for (const auto& [key, value] : md) {
    if (key.rfind(kEngineKeyPrefix, 0) != 0) user[key] = value;
  }
  return user;
}

Status CheckUserKeys(const Metadata& md) {
  for (const auto& [key, value] : md) {
    if (key.rfind(kEngineKeyPrefix, 0) == 0) {
      return Status::InvalidArgument("engine: checkpoint metadata key '" + key +
                                     "' uses the reserved prefix 'engine.'");
    }
  }
  return Status::Ok();
}

}  // namespace zinf::zero3
