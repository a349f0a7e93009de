// Hugging Face model folders in: config.json + model.safetensors (or shards
// listed by model.safetensors.index.json) described as a GptConfig of the
// right family, and each engine block's weights read tensor by tensor from
// memory-mapped files; or a folder's config.json alone (OpenHfConfig), an
// architecture to start from random weights.
//
// Families (config.json "architectures"):
//   GPT2LMHeadModel     -> kGpt2: Conv1D weights stored [in, out] are
//                          transposed to the engine's [out, in]; c_attn is
//                          the fused q|k|v; gelu_new; learned positions.
//   LlamaForCausalLM    -> kLlama
//   Qwen2ForCausalLM    -> kLlama with q/k/v biases
//   Qwen3ForCausalLM    -> kLlama with q_norm/k_norm (RMSNorm over each head
//                          of q and k before RoPE)
//   MistralForCausalLM  -> kLlama whose attention slides in every layer
//                          when sliding_window is set
//   Phi3ForCausalLM     -> kLlama (Phi-3, Phi-4) whose q, k and v are stored
//                          fused as the rows of one qkv_proj, gate and up as
//                          those of gate_up_proj; a sliding window as
//                          Mistral's; the rotary
//                          embedding on partial_rotary_factor of each head,
//                          with "longrope" scaling when configured
//   Olmo2ForCausalLM    -> kLlama with post norms in place of the input
//                          norms (post_attention_layernorm,
//                          post_feedforward_layernorm) and q/k norms over
//                          all heads (gpt.h post_norms, qk_norm_all_heads)
//   Olmo3ForCausalLM    -> OLMo 2's with three layers in four sliding, a
//                          default RoPE of its own base in those, the full
//                          layers' scaled (YaRN)
//   SeedOssForCausalLM  -> kLlama with q/k/v biases when attention_bias
//   HeliumForCausalLM   -> kLlama with RoPE on interleaved pairs, q/k/v
//                          biases when attention_bias
//   GlmForCausalLM      -> Helium's with RoPE on partial_rotary_factor of
//                          each head and gate|up fused (gate_up_proj)
//   Glm4ForCausalLM     -> GLM's with sandwich norms (post_self_attn_layernorm,
//                          post_mlp_layernorm)
//   Ernie4_5ForCausalLM -> kLlama with RoPE on interleaved pairs
//   Exaone4ForCausalLM  -> OLMo 2's post norms with q/k norms per head; with
//                          a window set, the layers that do not slide have
//                          no RoPE (no_rope_layers)
//   GraniteForCausalLM  -> kLlama with Granite's multipliers (gpt.h): the
//                          embedding's, the branches', the logits' and the
//                          scores' (attention_multiplier: attn_scalar)
//   GemmaForCausalLM    -> kLlama with Gemma's fields (gpt.h): norms by
//                          1 + w, GeGLU, the embedding scaled
//   Gemma2ForCausalLM   -> the same with sandwich norms, every other layer
//                          sliding, the attention's scores and the logits
//                          softcapped (attn_softcap, final_softcap)
//   Gemma3ForCausalLM   -> Gemma 2's with q/k norms, sliding layers with a
//                          RoPE of their own base, no softcaps unless set
//   DeepseekV3ForCausalLM
//                       -> kLlama with multi-head latent attention (gpt.h
//                          kv_lora_rank ...: kv_a_proj_with_mqa, kv_b_proj,
//                          q_a_proj, q_b_proj or q_proj, their norms) and
//                          GLM-4.5's routed MLP with DeepSeek-V3's defaults
//   DeepseekV2ForCausalLM
//                       -> the same attention, RoPE always on interleaved
//                          pairs, and a softmax router (greedy, or within
//                          the groups whose best expert is highest) kept in
//                          fp32, never renormalized
//   Gemma3ForConditionalGeneration
//                       -> Gemma 3 4B and up: its language model
//                          (text_config, its absent shape keys taking
//                          transformers' defaults; tensors under
//                          language_model.model. or model.language_model.),
//                          trained on text; the vision tower and projector
//                          (their other keys noted, their tensors under
//                          [model.]vision_tower. and multi_modal_projector.)
//                          are not read, and an export copies their
//                          tensors unchanged (`kept`)
// An explicit head_dim other than hidden_size / num_attention_heads
// (Qwen3, Mistral-Nemo) sets GptConfig::head_size. Qwen2, Qwen3,
// Qwen2-MoE and SmolLM3 slide in the layers layer_types names (else from
// max_window_layers on; Qwen2-MoE: the even ones below it; SmolLM3: its
// NoPE layers) when use_sliding_window is true: GptConfig::sliding_window
// and sliding_layers. The mixtures of experts (Qwen3-MoE, Qwen2-MoE,
// Mixtral, OLMoE, GLM-4.5, dots.llm1, DeepSeek-V2 and V3, ERNIE 4.5) set
// GptConfig's expert fields (the DeepSeek routers and ERNIE 4.5's
// selection bias its router fields); Qwen-MoE's dense layers
// (mlp_only_layers, decoder_sparse_step), the DeepSeek routers'
// (first_k_dense_replace) and ERNIE 4.5's (moe_layer_start_index,
// moe_layer_end_index, moe_layer_interval) its dense_layers.
// The vocabulary rows of the embedding and an untied head are padded with
// zero rows to padded_vocab_size (they receive no gradient and stay 0).
// pad_token_id (absent: the class's default, Phi-3 32000, SmolLM3 128004,
// Gemma 0, OLMo 2 and 3 1, Seed-OSS 1, Helium 3, GLM 151329, ERNIE 4.5 0)
// sets GptConfig::padding_token, the embedding row that gets no gradient
// from the input side (transformers' padding_idx).
//
// Config keys: those that do not change the math (dtype, token ids,
// generation settings, dropout: zinf trains without dropout, ...) are
// ignored and listed in `notes`; a key that would change the math is
// accepted only at its neutral value, otherwise kInvalidArgument naming the
// key; a key zinf does not know is an error too (it may change the math;
// a multimodal model's keys beside text_config are only noted).
// Tensors: a missing, extra or mis-shaped tensor is kInvalidArgument naming
// it (expected vs found shape), but for a multimodal model's vision
// tensors (`kept`). F32, BF16 and F16 tensors.
//
// Memory: OpenHfCheckpoint reads only headers. ReadHfTensor maps the file
// holding a tensor, converts the range asked for to fp32, and drops its
// pages (MADV_DONTNEED): the trainer reads each range straight into the
// engine's staging, so RAM holds one tensor's pages, never a block in fp32
// beside it, nor the model (the page cache keeps what was read, clean
// and reclaimable: scale/hf_load_beyond_ram loads, trains and exports a
// checkpoint inside a memory cgroup of about half its size).
//
// Thread-safety: an HfCheckpoint is immutable once opened; its
// functions may be called from any thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/safetensors.h"
#include "zinf/status.h"

namespace zinf::model {

struct HfCheckpoint {
  std::string dir;
  std::string architecture;  // "LlamaForCausalLM", ...
  // The model; seq_len is the checkpoint's positions (n_positions /
  // max_position_embeddings); HfModelAtSeqLen gives it another.
  GptConfig model;
  int max_positions = 0;
  // Phi-3: q|k|v stored as one qkv_proj; Phi-3 and GLM: gate|up as one
  // gate_up_proj (HfTensorNames names their row ranges).
  bool fused_qkv = false;
  bool fused_gate_up = false;
  // GLM-4's names for the sandwich norms: post_self_attn_layernorm and
  // post_mlp_layernorm on the outputs, post_attention_layernorm the MLP's
  // input (Gemma's: post_attention_layernorm, post_feedforward_layernorm,
  // pre_feedforward_layernorm).
  bool glm4_norm_names = false;
  // Mixtral's names for a routed MLP: block_sparse_moe.gate and
  // block_sparse_moe.experts.<e>.w1 (gate), w3 (up), w2 (down); else
  // mlp.gate and mlp.experts.<e>.gate_proj, up_proj, down_proj.
  bool mixtral_names = false;
  // GLM-4.5's, dots.llm1's and ERNIE 4.5's name for the shared experts:
  // mlp.shared_experts (Qwen2-MoE's: mlp.shared_expert).
  bool shared_experts_names = false;
  // A router's selection bias is mlp.gate.e_score_correction_bias [E];
  // ERNIE 4.5's is mlp.moe_statics.e_score_correction_bias, stored [1, E]
  // (HfBiasAsRow), and its multi-token-prediction module's tensors are
  // model.mtp_block.<i>, mtp_emb_norm.<i>, mtp_hidden_norm.<i> and
  // mtp_linear_proj.<i> (`kept`).
  bool ernie_moe_names = false;
  // GLM-4.5's multi-token-prediction layers (num_nextn_predict_layers),
  // stored as layers n_layer .. n_layer + mtp_layers - 1: not part of the
  // model transformers trains (nor zinf): `kept`.
  int mtp_layers = 0;
  std::vector<std::string> notes;  // keys and tensors ignored, and why
  // Where the language model's tensors are: "model." and "lm_head.weight"
  // (HfTensorNames' names), or under a multimodal model's prefix.
  std::string body_prefix = "model.";
  std::string head_name = "lm_head.weight";
  // The source's tensors outside the model zinf trains (a multimodal
  // model's vision tower and projector, GLM-4.5's and ERNIE 4.5's
  // multi-token-prediction layers), in name order: an export copies them.
  std::vector<std::string> kept;

  struct Source {
    size_t file = 0;  // index into files
    SafetensorsHeader::Entry entry;
  };
  std::vector<std::string> files;
  std::map<std::string, Source> tensors;
};

// True when `path` is a directory holding config.json.
bool IsHfModelDir(const std::string& path);
// True when the folder holds weights (model.safetensors, or the shards'
// model.safetensors.index.json).
bool HasHfWeights(const std::string& dir);

// Parses config.json and the safetensors headers, and checks that the
// tensors are exactly those the model needs, with their shapes.
StatusOr<HfCheckpoint> OpenHfCheckpoint(const std::string& dir);
// config.json alone (files and tensors empty; safetensors there are not
// read): the architecture to start from random weights, exported as a
// folder of its kind. A multimodal architecture is refused (an export
// copies its vision side's weights, which this has none of).
StatusOr<HfCheckpoint> OpenHfConfig(const std::string& dir);

// The model at sequence length `seq_len` (0: the checkpoint's positions).
// kInvalidArgument beyond the positions, or for GPT-2 at another length
// than n_positions (its position table is a weight of that many rows). A
// sliding window of seq_len or more is dropped (it changes nothing).
StatusOr<GptConfig> HfModelAtSeqLen(const HfCheckpoint& ckpt, int seq_len);

// The checkpoint's name of each tensor of `block` (GptBlockSpecs order).
// Consecutive tensors of a block that share a name are row ranges of one
// fused checkpoint tensor, in order (HfRowsOf).
std::vector<std::string> HfTensorNames(const HfCheckpoint& ckpt, BlockId block);

// Whether tensor `t` of `block` is stored with a leading 1 before its
// engine shape (ERNIE 4.5's selection bias: [1, E]).
bool HfBiasAsRow(const HfCheckpoint& ckpt, BlockId block, size_t t);

// Tensor `t` of `spec` within its checkpoint tensor (names: HfTensorNames of
// that block): its first row there and that tensor's rows, which are the
// tensor's own (row 0) unless it is fused with its neighbours.
struct HfRows {
  int64_t row = 0;
  int64_t rows = 0;
  bool fused = false;
};
HfRows HfRowsOf(const BlockSpec& spec, const std::vector<std::string>& names, size_t t);

// Elements [first, first + count) of tensor t of block `block`, `spec` =
// GptBlockSpecs(model)[block] (`model`: HfModelAtSeqLen's result), in the
// engine's layout (row-major fp32: GPT-2's Conv1D weights transposed, a
// fused tensor's own rows, the vocabulary padding rows 0) into `out`.
Status ReadHfTensor(const HfCheckpoint& ckpt, const GptConfig& model, BlockId block, const BlockSpec& spec, size_t t,
                    int64_t first, int64_t count, float* out);
// Block `block`'s weights in fp32, whole (ReadHfTensor for each tensor).
StatusOr<std::vector<std::vector<float>>> ReadHfBlock(const HfCheckpoint& ckpt, const GptConfig& model, BlockId block);

// What a --model value names: a built-in (LoadGptConfig), a JSON model
// config (both initialised at random by the trainer), or a HF model folder
// (its weights; with `from_config`, OpenHfConfig: its architecture, random
// weights). `seq_len` > 0 overrides the sequence length (for a HF folder
// through HfModelAtSeqLen; 0 keeps its positions).
struct ModelSource {
  GptConfig model;
  std::shared_ptr<const HfCheckpoint> hf;  // null unless a HF folder (no files: its config alone)
  std::string description;                 // for logs: the name, or "<dir> (<architecture>)"
  // True when the sequence length is a HF folder's positions, taken
  // because no length was asked for.
  bool default_seq_len = false;
  // TrainerOptions::initial_weights: the checkpoint's tensors
  // (ReadHfTensor); empty without a checkpoint's files (random init).
  std::function<Status(BlockId, size_t, int64_t, int64_t, float*)> InitialWeights() const;
  // `s` with a hint when the run is at a Llama-family folder's default
  // sequence length (max_position_embeddings: 131072 for Llama 3.1, whose
  // activations no budget holds) and `s` says that memory ran out or that
  // the data holds too few tokens for one batch: the length, where it came
  // from, and --seq-len. `s` unchanged otherwise.
  Status HintSeqLen(const Status& s) const;
};
StatusOr<ModelSource> ResolveModel(const std::string& value, int seq_len, bool from_config = false);

}  // namespace zinf::model
