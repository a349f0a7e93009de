// The HuggingFace TrainingArguments that `zinf train` and `zinf config-check`
// take as flags (--lr, --weight-decay, --warmup-steps, --max-grad-norm,
// --adam-beta1, --adam-beta2, --adam-epsilon, --micro-batch, --grad-accum):
// they fill a DeepSpeed config's "auto" keys as the HF Trainer would
// (ResolveAuto's rules), and a key the file left out. Also the --fetch-unit
// and --model that `zinf train` and `zinf eval` resolve (FetchUnitText,
// ModelFromFlags).
//
// Thread-safety: plain functions.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "cli/command.h"
#include "model/hf_checkpoint.h"
#include "zinf/config.h"

namespace zinf::cli {

// `flags` plus the trainer-argument flag names, for Flags::Parse.
std::set<std::string> WithTrainerArgFlags(std::set<std::string> flags);

// Flags::Parse with the trainer-argument flags added to `value_flags`.
StatusOr<Flags> TrainerFlags(const std::vector<std::string>& args, std::set<std::string> value_flags,
                             std::set<std::string> switches = {});

// The values given; each checked against its key's range (kInvalidArgument
// naming the flag).
StatusOr<TrainerArgs> TrainerArgsFromFlags(const Flags& flags);

// `key: from -> value (rule)`, one line per value ResolveAuto chose.
std::string FormatResolution(const AutoResolution& r);

// The --fetch-unit text to resolve (model::FetchUnitForDevice): the flag's,
// or, with `auto` (or none) and a checkpoint in --resume, the unit that
// checkpoint's run resolved ("layer" or an element count): its engine blocks
// are that cut, which `auto` on another device or budget could miss, and a
// checkpoint loads only into the same cut. `auto` when the checkpoint cannot
// be found or read here (the resume then says why). `rank` and `world_size`
// find the rank's checkpoint as Trainer::Resume does.
std::string FetchUnitText(const Flags& flags, int rank, int world_size);

// The --model value `value` as `zinf train` and `zinf eval` resolve it
// (model::ResolveModel, --from-config its config alone, `seq_len` > 0 the
// length), the error naming --model or --from-config; a HF folder without
// weights whose config alone could start is refused naming --from-config.
StatusOr<model::ModelSource> ModelFromFlags(const Flags& flags, const std::string& value, int seq_len);

// The usage lines for the flags, indented for a command's help.
extern const char kTrainerArgsUsage[];

}  // namespace zinf::cli
