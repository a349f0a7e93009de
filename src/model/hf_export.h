// Hugging Face model folders out: the inverse of hf_checkpoint.h. A folder
// that transformers loads with from_pretrained: config.json, the weights
// (model.safetensors, or shards of at most `max_shard_bytes` plus
// model.safetensors.index.json) and the source's tokenizer files.
//
// Names and layouts are the source's: GPT-2 Conv1D weights go back to
// [in, out], c_attn stays the fused q|k|v, the vocabulary padding rows of
// the embedding and an untied head are dropped. Without a source (zinf's
// own GPT) the folder is a GPT2LMHeadModel (gelu_new, LayerNorm eps 1e-5,
// learned positions: the same math) with a config.json of its own.
// A multimodal source's tensors outside the language model (Gemma 3's
// vision tower and projector: HfCheckpoint::kept) follow the model's, their
// bytes and dtype as the source has them; its processor files are copied
// with the tokenizer's.
//
// Memory: each shard's header is written as the shard begins, from the
// shapes the model implies; the blocks are asked for one at a time, in
// order, and each is converted and appended before the next: RAM holds one
// block in fp32 and its converted bytes, never the model (a kept tensor:
// its bytes, read whole from the source). An F32 export of weights that
// were read from an F32 checkpoint is byte-identical tensor by tensor.
//
// Thread-safety: a free function; one call per folder at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/hf_checkpoint.h"
#include "zinf/status.h"

namespace zinf::model {

// Block `b`'s fp32 weights in the engine's layout (GptBlockSpecs order)
// into `*master` (one array per tensor, each resized to its tensor: the
// exporter passes the same arrays block after block).
using BlockReader = std::function<Status(BlockId b, std::vector<std::vector<float>>* master)>;

inline constexpr int64_t kHfMaxShardBytes = 5'000'000'000;  // transformers' default "5GB"

// Writes the folder `dir` (created; existing files of these names are
// replaced). `source` is the checkpoint the model came from, or null.
// `dtype`: "F32", "BF16" or "F16" (kInvalidArgument otherwise). A tensor
// larger than max_shard_bytes gets a shard of its own.
Status ExportHfFolder(const std::string& dir, const GptConfig& model, const HfCheckpoint* source,
                      const std::string& dtype, const BlockReader& read_block,
                      int64_t max_shard_bytes = kHfMaxShardBytes);

// The config.json of zinf's own GPT as a GPT2LMHeadModel.
std::string Gpt2ConfigJson(const GptConfig& model);

}  // namespace zinf::model
