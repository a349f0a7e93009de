// HF model folders (see hf_checkpoint.h): config.json parsing per family,
// the tensor name map, and the memory-mapped block reader.
#include "model/hf_checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "kernels/cpu_kernels.h"
#include "zinf/element_type.h"

namespace zinf::model {
namespace {

using nlohmann::json;

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Keys that never change the forward or backward math (max_window_layers
// where windows are off: ParseSlidingWindow reads it where they are on).
const std::set<std::string>& IgnoredKeys() {
  static const std::set<std::string> kKeys = {"architectures",
                                              "model_type",
                                              "torch_dtype",
                                              "dtype",
                                              "transformers_version",
                                              "bos_token_id",
                                              "eos_token_id",
                                              "pad_token_id",
                                              "sep_token_id",
                                              "decoder_start_token_id",
                                              "use_cache",
                                              "_name_or_path",
                                              "initializer_range",
                                              "return_dict",
                                              "output_attentions",
                                              "output_hidden_states",
                                              "id2label",
                                              "label2id",
                                              "tokenizer_class",
                                              "task_specific_params",
                                              "prefix",
                                              "problem_type",
                                              "torchscript",
                                              "use_bfloat16",
                                              "finetuning_task",
                                              "n_ctx",
                                              "pretraining_tp",
                                              "max_length",
                                              "min_length",
                                              "do_sample",
                                              "early_stopping",
                                              "num_beams",
                                              "num_beam_groups",
                                              "diversity_penalty",
                                              "temperature",
                                              "top_k",
                                              "top_p",
                                              "typical_p",
                                              "repetition_penalty",
                                              "length_penalty",
                                              "no_repeat_ngram_size",
                                              "bad_words_ids",
                                              "num_return_sequences",
                                              "output_scores",
                                              "return_dict_in_generate",
                                              "forced_bos_token_id",
                                              "forced_eos_token_id",
                                              "remove_invalid_values",
                                              "suppress_tokens",
                                              "begin_suppress_tokens",
                                              "tf_legacy_loss",
                                              "chunk_size_feed_forward",
                                              "pruned_heads",
                                              "is_decoder",
                                              "is_encoder_decoder",
                                              "tie_encoder_decoder",
                                              "max_window_layers",
                                              "reorder_and_upcast_attn",
                                              "auto_map",
                                              "cache_implementation",
                                              "_sliding_window_pattern",
                                              "sliding_window_size"};  // Gemma 2's first configs, beside sliding_window
  return kKeys;
}
const std::set<std::string>& DropoutKeys() {
  static const std::set<std::string> kKeys = {"attention_dropout", "resid_pdrop",    "embd_pdrop",
                                              "attn_pdrop",        "hidden_dropout", "summary_first_dropout",
                                              "residual_dropout"};
  return kKeys;
}

// Reads config.json keys, remembering which were used, with the errors and
// notes the file comment of hf_checkpoint.h describes.
class KeyReader {
 public:
  KeyReader(const json& doc, std::vector<std::string>* notes) : doc_(doc), notes_(notes) {}

  // Whether the config has the key at all (null included): an absent key
  // takes transformers' default, which may differ from null's meaning.
  bool Has(const std::string& key) const { return doc_.contains(key); }
  const json* Get(const std::string& key) {
    used_.insert(key);
    auto it = doc_.find(key);
    return it == doc_.end() || it->is_null() ? nullptr : &*it;
  }
  int Int(const std::string& key, int fallback, bool required) {
    const json* v = Get(key);
    if (v == nullptr) {
      if (required) errors_.push_back(key + ": missing (an integer is required)");
      return fallback;
    }
    if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > (int64_t{1} << 30)) {
      errors_.push_back(key + ": expected a positive integer, got " + v->dump());
      return fallback;
    }
    return v->get<int>();
  }
  double Number(const std::string& key, double fallback) {
    const json* v = Get(key);
    if (v == nullptr) return fallback;
    if (!v->is_number()) {
      errors_.push_back(key + ": expected a number, got " + v->dump());
      return fallback;
    }
    return v->get<double>();
  }
  bool Bool(const std::string& key, bool fallback) {
    const json* v = Get(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) {
      errors_.push_back(key + ": expected true or false, got " + v->dump());
      return fallback;
    }
    return v->get<bool>();
  }
  // A key that changes the math: absent, null or one of `neutral`.
  void Neutral(const std::string& key, const std::vector<json>& neutral) {
    const json* v = Get(key);
    if (v == nullptr) return;
    for (const json& n : neutral) {
      if (*v == n) return;
    }
    std::string allowed;
    for (const json& n : neutral) allowed += (allowed.empty() ? "" : " or ") + n.dump();
    errors_.push_back(key + ": " + v->dump() + " changes the model's math; zinf supports only " + allowed);
  }
  void Error(std::string e) { errors_.push_back(std::move(e)); }
  // A key present as null where transformers' class would fail on null.
  void RefuseNull(const std::string& key, const std::string& expected) {
    if (Has(key) && doc_.at(key).is_null()) errors_.push_back(key + ": null (expected " + expected + ")");
  }

  // Notes the ignored keys; an unknown key is an error.
  void Finish() {
    std::string neutral, dropout;
    for (auto it = doc_.begin(); it != doc_.end(); ++it) {
      const std::string& k = it.key();
      if (used_.count(k) || k == "architectures") continue;
      if (IgnoredKeys().count(k) || k.rfind("summary_", 0) == 0) {
        neutral += (neutral.empty() ? "" : ", ") + k;
      } else if (DropoutKeys().count(k)) {
        dropout += (dropout.empty() ? "" : ", ") + k;
      } else {
        errors_.push_back(k + ": unknown key (zinf does not know whether it changes the math)");
      }
    }
    if (!neutral.empty()) notes_->push_back("ignored (no effect on the math): " + neutral);
    if (!dropout.empty()) notes_->push_back("ignored (zinf trains without dropout): " + dropout);
  }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  const json& doc_;
  std::vector<std::string>* notes_;
  std::set<std::string> used_;
  std::vector<std::string> errors_;
};

// The layers whose attention slides once a config turns windows on, by
// transformers' rule for each architecture: none (Llama reads no window),
// all (Mistral, Phi-3), those from max_window_layers on (Qwen2, Qwen3),
// the NoPE layers (SmolLM3), or all but every sliding_window_pattern-th
// (Gemma 3; Gemma 2 every other, OLMo 3 every fourth; their windows always
// on too); kAllWhenUsed: every layer when use_sliding_window (Qwen3-MoE);
// kEvenBelowMaxWindow: with use_sliding_window, the even layers below
// max_window_layers (Qwen2-MoE); kFromMaxWindowLayersWhenSet: those from
// max_window_layers on whenever sliding_window is set (dots.llm1: no
// use_sliding_window). kFromMaxWindowLayers, kFromMaxWindowLayersWhenSet,
// kEvenBelowMaxWindow, kNopeLayers and kPattern read layer_types first.
enum class SlidingLayers {
  kNone,
  kAll,
  kAllWhenUsed,
  kFromMaxWindowLayers,
  kFromMaxWindowLayersWhenSet,
  kEvenBelowMaxWindow,
  kNopeLayers,
  kPattern
};
// Routed MLPs (GptConfig's experts; Qwen-MoE's dense layers among them:
// ParseDenseLayers): Qwen3-MoE's (experts
// of moe_intermediate_size, norm_topk_prob), Qwen2-MoE's (Qwen3-MoE's
// plus a gated shared expert of shared_expert_intermediate_size), OLMoE's
// (of intermediate_size, norm_topk_prob) or Mixtral's (of
// intermediate_size, always normalized; router_jitter_noise refused), or
// DeepSeek-V3's as GLM-4.5 and dots.llm1 have it (ParseDeepSeekExperts:
// a sigmoid router, ungated shared experts, the first layers dense), or
// DeepSeek-V2's (the same with a softmax router in groups scored by their
// best), or ERNIE 4.5's (ParseErnieMoeExperts: a softmax with a selection
// bias, ungated shared experts, dense layers outside a range).
enum class Experts { kNone, kQwen3Moe, kQwen2Moe, kOlmoe, kMixtral, kSigmoidRouter, kDeepseekV2, kErnie45Moe };
// The DeepSeek routers' reading (ParseDeepSeekExperts).
bool DeepSeekRouter(Experts e) { return e == Experts::kSigmoidRouter || e == Experts::kDeepseekV2; }

// What each supported architecture is, in the terms zinf's model uses:
// GPT-2's block, or Llama's with these changes. The one place an
// architecture's name is looked at.
struct Architecture {
  std::string_view name;
  bool llama = true;      // false: GPT-2
  bool qkv_bias = false;  // Qwen2: biases on q, k and v, whatever attention_bias says
  // The key whose true would put biases on q, k, v and o (refused); with
  // attention_bias_qkv (Seed-OSS, Helium, GLM; Qwen2-MoE's qkv_bias) it
  // puts them on q, k and v only, by default qkv_bias.
  std::string_view bias_key = "attention_bias";
  bool attention_bias_qkv = false;
  std::string_view out_bias_key = "";  // Seed-OSS: attention_out_bias, o_proj's bias (refused)
  int default_head_dim = 0;            // head_dim when the key is absent; 0: hidden_size / heads
  int default_kv_heads = 0;            // num_key_value_heads when the key is absent; 0: the heads
  bool interleaved_rope = false;       // Helium, GLM, ERNIE 4.5: RoPE turns the pairs (2i, 2i + 1)
  bool qk_norm = false;                // Qwen3: an RMSNorm over each head of q and k (OLMo 2: over all heads)
  std::string_view qk_norm_key = "";   // GLM-4.5: qk_norm as this key says (default false)
  // Phi-3: q|k|v and gate|up stored fused (qkv_proj, gate_up_proj); the
  // first partial_rotary_factor of each head turned; LongRoPE called "su"
  // or "yarn" too; the attention slides whenever sliding_window is set
  // (use_sliding_window is not read).
  bool phi3 = false;
  // GLM, GLM-4: gate|up stored fused as gate_up_proj (q, k and v apart);
  // the first partial_rotary_factor of each head turned (Phi-3's too; the
  // default when the key is absent: 0 reads no key, whole heads turn).
  bool fused_gate_up = false;
  double default_partial_rotary = 0;
  // GLM-4: sandwich norms (Gemma 2's, without its other changes) under
  // names of its own.
  bool glm4_norms = false;
  bool tied_by_default = false;  // tie_word_embeddings when absent (Gemma's: true)
  SlidingLayers sliding = SlidingLayers::kNone;
  int default_window = 0;  // transformers' sliding_window when the key is absent (null: none)
  // SmolLM3: no_rope_layers (1: the layer's attention turns q and k, 0: it
  // does not), else a NoPE layer every no_rope_layer_interval (default 4).
  bool nope_layers = false;
  // Gemma: RMSNorms by 1 + w, GeGLU (hidden_act, or Gemma 3's
  // hidden_activation), the embedding scaled by sqrt(hidden_size), a tied
  // head and heads of 256 unless the config says otherwise.
  bool gemma = false;
  // transformers' pad_token_id when the config has no such key (its
  // embedding row gets no gradient: padding_idx); -1: none.
  int default_pad_token = -1;
  // Gemma 2 and 3: sandwich norms, query_pre_attn_scalar, hidden_activation
  // (not hidden_act), and the softcaps attn_logit_softcapping and
  // final_logit_softcapping, whose defaults (the key absent) these are
  // (Gemma 2's 50 and 30; Gemma 3's none).
  bool sandwich = false;
  double default_attn_softcap = 0;
  double default_final_softcap = 0;
  // OLMo 2, 3 and EXAONE 4: no norms before the attention and the MLP, one
  // on each's output (post_attention_layernorm, post_feedforward_layernorm);
  // OLMo's q_norm and k_norm span all of q's and k's heads at once
  // (qk_norm_all_heads), EXAONE's each head (Qwen3's).
  bool post_norms = false;
  bool qk_norm_all_heads = false;
  // EXAONE 4: with a sliding_window set, the layers that do not slide turn
  // no RoPE (its hybrid attention's NoPE layers).
  bool nope_full_layers = false;
  // Granite: embedding_multiplier, attention_multiplier (the scores' scale
  // in place of head_dim^-1/2), residual_multiplier, logits_scaling.
  bool granite = false;
  // Gemma 3: q_norm and k_norm, RoPE of base rope_local_base_freq in the
  // sliding layers.
  bool gemma3 = false;
  // Gemma 3 and OLMo 3: the sliding layers' RoPE is the default kind, of
  // its own base; the scaling is the full layers' (transformers 5's
  // rope_parameters may hold one per layer type).
  bool layer_type_rope = false;
  // kPattern: every sliding_pattern-th layer full, the others sliding;
  // the config's sliding_window_pattern when reads_pattern (Gemma 3,
  // EXAONE 4) and layer_types is absent.
  int sliding_pattern = 2;
  bool reads_pattern = false;
  // Gemma 3 4B and up: a vision tower beside the language model, whose
  // config is text_config and whose tensors are under language_model.
  bool multimodal = false;
  Experts experts = Experts::kNone;
  int default_experts = 0;  // num_experts when absent (0: required)
  int default_experts_per_token = 0;
  bool default_norm_topk = false;  // norm_topk_prob when absent (GLM-4.5's true)
  // DeepSeekRouter: n_shared_experts and first_k_dense_replace when absent
  // (0 shared: required; GLM-4.5's 1 and 1, dots.llm1's none and 0), and
  // whether the checkpoint may hold multi-token-prediction layers
  // (GLM-4.5's num_nextn_predict_layers).
  int default_shared_experts = 0;
  int default_first_dense = 0;
  bool reads_mtp_layers = false;
  // dots.llm1: its Hub config's null n_group and topk_group read as one
  // group, and the original code's keys (scoring_func, topk_method, ...)
  // noted as not read.
  bool original_moe_keys = false;
  int default_max_window_layers = 28;  // max_window_layers when absent
  double default_aux_coef = 0;         // router_aux_loss_coef when absent
  double default_rope_theta = 10000.0;
  double default_norm_eps = 1e-6;  // rms_norm_eps when the key is absent
  // DeepSeekRouter's widths and groups when absent: moe_intermediate_size,
  // intermediate_size (the dense layers'), n_group, topk_group.
  int default_moe_width = 1408;
  int default_dense_width = 10944;
  int default_groups = 1;
  int default_topk_groups = 1;
  double default_routed_scale = 1.0;  // routed_scaling_factor when absent
  // DeepSeek-V2 and V3: multi-head latent attention (ParseLatentAttention).
  bool latent_attention = false;
};

// Gemma 3's language model: as Gemma3ForCausalLM holds it (1B and smaller),
// or inside Gemma3ForConditionalGeneration (4B and up).
constexpr Architecture Gemma3(std::string_view name, bool multimodal) {
  return {.name = name,
          .qk_norm = true,
          .sliding = SlidingLayers::kPattern,
          .default_window = 4096,
          .gemma = true,
          .default_pad_token = 0,
          .sandwich = true,
          .gemma3 = true,
          .layer_type_rope = true,
          .sliding_pattern = 6,
          .reads_pattern = true,
          .multimodal = multimodal,
          .default_rope_theta = 1000000.0};
}

// GLM (GLM-4 9B's first release) and GLM-4-0414, which adds sandwich norms
// under names of its own.
constexpr Architecture Glm(std::string_view name, bool glm4) {
  return {.name = name,
          .qkv_bias = true,
          .attention_bias_qkv = true,
          .default_head_dim = 128,
          .default_kv_heads = 2,
          .interleaved_rope = true,
          .fused_gate_up = true,
          .default_partial_rotary = 0.5,
          .glm4_norms = glm4,
          .default_pad_token = 151329,
          .default_norm_eps = 1.5625e-7};
}

constexpr Architecture kArchitectures[] = {
    {.name = "GPT2LMHeadModel", .llama = false},
    {.name = "LlamaForCausalLM"},
    {.name = "Qwen2ForCausalLM",
     .qkv_bias = true,
     .default_kv_heads = 32,
     .sliding = SlidingLayers::kFromMaxWindowLayers,
     .default_window = 4096},
    {.name = "Qwen3ForCausalLM",
     .default_head_dim = 128,
     .default_kv_heads = 32,
     .qk_norm = true,
     .sliding = SlidingLayers::kFromMaxWindowLayers,
     .default_window = 4096},
    {.name = "MistralForCausalLM", .default_kv_heads = 8, .sliding = SlidingLayers::kAll, .default_window = 4096},
    {.name = "Qwen3MoeForCausalLM",
     .default_kv_heads = 4,
     .qk_norm = true,
     .sliding = SlidingLayers::kAllWhenUsed,
     .default_window = 4096,
     .experts = Experts::kQwen3Moe,
     .default_experts = 128,
     .default_experts_per_token = 8,
     .default_aux_coef = 0.001},
    {.name = "Qwen2MoeForCausalLM",
     .qkv_bias = true,
     .bias_key = "qkv_bias",
     .attention_bias_qkv = true,
     .default_kv_heads = 16,
     .sliding = SlidingLayers::kEvenBelowMaxWindow,
     .default_window = 4096,
     .experts = Experts::kQwen2Moe,
     .default_experts = 60,
     .default_experts_per_token = 4,
     .default_aux_coef = 0.001},
    {.name = "MixtralForCausalLM",
     .default_kv_heads = 8,
     .sliding = SlidingLayers::kAll,
     .experts = Experts::kMixtral,
     .default_experts = 8,
     .default_experts_per_token = 2,
     .default_aux_coef = 0.001,
     .default_rope_theta = 1000000.0,
     .default_norm_eps = 1e-5},
    {.name = "Glm4MoeForCausalLM",
     .attention_bias_qkv = true,
     .default_kv_heads = 8,
     .qk_norm_key = "use_qk_norm",
     .default_partial_rotary = 0.5,
     .experts = Experts::kSigmoidRouter,
     .default_experts = 128,
     .default_experts_per_token = 8,
     .default_norm_topk = true,
     .default_shared_experts = 1,
     .default_first_dense = 1,
     .reads_mtp_layers = true,
     .default_norm_eps = 1e-5},
    {.name = "DeepseekV2ForCausalLM",
     .experts = Experts::kDeepseekV2,
     .default_experts = 64,
     .default_shared_experts = 2,
     .original_moe_keys = true,
     .default_moe_width = 1407,
     .default_dense_width = 11008,
     .latent_attention = true},
    {.name = "DeepseekV3ForCausalLM",
     .experts = Experts::kSigmoidRouter,
     .default_experts = 256,
     .default_experts_per_token = 8,
     .default_norm_topk = true,
     .default_shared_experts = 1,
     .default_first_dense = 3,
     .reads_mtp_layers = true,
     .original_moe_keys = true,
     .default_moe_width = 2048,
     .default_dense_width = 18432,
     .default_groups = 8,
     .default_topk_groups = 4,
     .default_routed_scale = 2.5,
     .latent_attention = true},
    {.name = "Dots1ForCausalLM",
     .default_kv_heads = 32,
     .qk_norm = true,
     .sliding = SlidingLayers::kFromMaxWindowLayersWhenSet,
     .default_window = 4096,
     .experts = Experts::kSigmoidRouter,
     .original_moe_keys = true,
     .default_max_window_layers = 62},
    {.name = "OlmoeForCausalLM",
     .qk_norm = true,
     .default_pad_token = 1,
     .qk_norm_all_heads = true,
     .experts = Experts::kOlmoe,
     .default_experts = 64,
     .default_experts_per_token = 8,
     .default_aux_coef = 0.01,
     .default_norm_eps = 1e-5},
    {.name = "Phi3ForCausalLM",
     .phi3 = true,
     .default_partial_rotary = 1.0,
     .sliding = SlidingLayers::kAll,
     .default_pad_token = 32000,
     .default_norm_eps = 1e-5},
    {.name = "SmolLM3ForCausalLM",
     .default_kv_heads = 4,
     .sliding = SlidingLayers::kNopeLayers,
     .nope_layers = true,
     .default_pad_token = 128004},
    {.name = "GraniteForCausalLM", .granite = true},
    {.name = "SeedOssForCausalLM",
     .qkv_bias = true,
     .attention_bias_qkv = true,
     .out_bias_key = "attention_out_bias",
     .default_head_dim = 128,
     .default_kv_heads = 8,
     .default_pad_token = 1},
    Glm("GlmForCausalLM", /*glm4=*/false),
    Glm("Glm4ForCausalLM", /*glm4=*/true),
    {.name = "Ernie4_5ForCausalLM",
     .bias_key = "use_bias",
     .default_head_dim = 128,
     .default_kv_heads = 2,
     .interleaved_rope = true,
     .tied_by_default = true,
     .default_pad_token = 0,
     .default_rope_theta = 500000.0,
     .default_norm_eps = 1e-5},
    {.name = "Ernie4_5_MoeForCausalLM",
     .bias_key = "use_bias",
     .default_kv_heads = 4,
     .interleaved_rope = true,
     .tied_by_default = true,
     .default_pad_token = 0,
     .experts = Experts::kErnie45Moe,
     .default_experts = 64,
     .default_experts_per_token = 6,
     .default_rope_theta = 500000.0,
     .default_norm_eps = 1e-5},
    {.name = "HeliumForCausalLM",
     .attention_bias_qkv = true,
     .default_head_dim = 128,
     .default_kv_heads = 20,
     .interleaved_rope = true,
     .default_pad_token = 3,
     .default_rope_theta = 100000.0,
     .default_norm_eps = 1e-8},
    {.name = "Olmo2ForCausalLM",
     .qk_norm = true,
     .default_pad_token = 1,
     .post_norms = true,
     .qk_norm_all_heads = true,
     .default_norm_eps = 1e-5},
    {.name = "Olmo3ForCausalLM",
     .qk_norm = true,
     .sliding = SlidingLayers::kPattern,
     .default_window = 4096,
     .default_pad_token = 1,
     .post_norms = true,
     .qk_norm_all_heads = true,
     .layer_type_rope = true,
     .sliding_pattern = 4,
     .default_rope_theta = 500000.0,
     .default_norm_eps = 1e-5},
    {.name = "Exaone4ForCausalLM",
     .default_kv_heads = 32,
     .qk_norm = true,
     .sliding = SlidingLayers::kPattern,
     .default_window = 4096,
     .post_norms = true,
     .nope_full_layers = true,
     .sliding_pattern = 4,
     .reads_pattern = true,
     .default_norm_eps = 1e-5},
    {.name = "GemmaForCausalLM", .gemma = true, .default_pad_token = 0},
    {.name = "Gemma2ForCausalLM",
     .sliding = SlidingLayers::kPattern,
     .default_window = 4096,
     .gemma = true,
     .default_pad_token = 0,
     .sandwich = true,
     .default_attn_softcap = 50.0,
     .default_final_softcap = 30.0},
    Gemma3("Gemma3ForCausalLM", /*multimodal=*/false),
    Gemma3("Gemma3ForConditionalGeneration", /*multimodal=*/true),
};

const Architecture* FindArchitecture(std::string_view name) {
  for (const Architecture& a : kArchitectures) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

void ParseGpt2(KeyReader& r, HfCheckpoint& c) {
  GptConfig& m = c.model;
  m.family = ModelFamily::kGpt2;
  m.vocab_size = r.Int("vocab_size", 1, true);
  m.n_embd = r.Int("n_embd", 1, true);
  m.n_head = r.Int("n_head", 1, true);
  m.n_layer = r.Int("n_layer", 1, true);
  c.max_positions = r.Int("n_positions", 1, true);
  m.seq_len = c.max_positions;
  m.tied_embeddings = r.Bool("tie_word_embeddings", true);
  r.Neutral("activation_function", {"gelu_new", "gelu_pytorch_tanh"});
  r.Neutral("n_inner", {json(4 * m.n_embd)});
  r.Neutral("layer_norm_epsilon", {json(kernels::kLayerNormEps)});
  r.Neutral("scale_attn_weights", {true});
  r.Neutral("scale_attn_by_inverse_layer_idx", {false});
  r.Neutral("add_cross_attention", {false});
}

// Gemma 3's and OLMo 3's sliding layers' RoPE, under
// rope_parameters.sliding_attention: the default kind, of its own base.
void ParseLocalRope(KeyReader& r, GptConfig& m, const json& s, const std::string& key) {
  if (!s.is_object()) return r.Error(key + ": expected an object, got " + s.dump());
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (it.key() == "rope_theta" && it->is_number() && it->get<double>() > 0) {
      m.local_rope_theta = it->get<double>();
    } else if (!((it.key() == "rope_type" || it.key() == "type") && *it == "default")) {
      r.Error(key + "." + it.key() + ": " + it->dump() + " is not supported (zinf's local RoPE is \"default\" " +
              "with a positive rope_theta)");
    }
  }
}

void ParseRopeParams(KeyReader& r, HfCheckpoint& c, const Architecture& arch, const json* s, const std::string& key);

// A count of positions: an integer >= 2, or a number without a fraction
// (8192.0).
std::optional<int> PositionCount(const json& v) {
  const double d = v.is_number() ? v.get<double>() : 0;
  if (!(d >= 2 && d <= static_cast<double>(int64_t{1} << 30) && d == std::floor(d))) return std::nullopt;
  return static_cast<int>(d);
}

void ParseRope(KeyReader& r, HfCheckpoint& c, const Architecture& arch) {
  RopeConfig& rope = c.model.rope;
  rope.theta = r.Number("rope_theta", arch.default_rope_theta);
  if (arch.gemma3) {
    c.model.local_rope_theta = r.Number("rope_local_base_freq", 10000.0);
  } else if (arch.layer_type_rope) {
    // OLMo 3: the class's base whatever rope_theta says (transformers hands
    // that key to the full layers alone).
    c.model.local_rope_theta = arch.default_rope_theta;
  }
  // transformers >= 5 keeps theta and the scaling under rope_parameters.
  const json* params = r.Get("rope_parameters");
  const json* scaling = r.Get("rope_scaling");
  if (params != nullptr && scaling != nullptr) r.Error("rope_parameters and rope_scaling: give one, not both");
  const json* s = params != nullptr ? params : scaling;
  const std::string key = params != nullptr ? "rope_parameters" : "rope_scaling";
  if (s != nullptr && !s->is_object()) return r.Error(key + ": expected an object, got " + s->dump());
  // Gemma 3's and OLMo 3's rope_parameters per layer type (rope_scaling
  // is the full attention's); transformers ignores them given flat.
  const bool nested = s != nullptr && (s->contains("full_attention") || s->contains("sliding_attention"));
  if (arch.layer_type_rope && params != nullptr && !nested) {
    return r.Error("rope_parameters: " + c.architecture +
                   " keeps its RoPE per layer type (\"full_attention\", \"sliding_attention\"); transformers " +
                   "ignores a flat rope_parameters (give them per layer type, or rope_scaling for the full layers)");
  }
  if (arch.layer_type_rope && params != nullptr) {
    for (auto it = s->begin(); it != s->end(); ++it) {
      const std::string name = key + "." + it.key();
      if (it.key() == "full_attention") {
        if (!it->is_null()) ParseRopeParams(r, c, arch, &*it, name);
      } else if (it.key() == "sliding_attention") {
        if (!it->is_null()) ParseLocalRope(r, c.model, *it, name);
      } else {
        r.Error(name + ": not a layer type (\"full_attention\" or \"sliding_attention\")");
      }
    }
  } else if (s != nullptr) {
    ParseRopeParams(r, c, arch, s, key);
  }
  // The top-level key: read by the scalings, not under a layer type.
  const bool scaled = rope.llama3 || rope.longrope || rope.yarn;
  if (!(scaled && !arch.layer_type_rope) && r.Get("original_max_position_embeddings") != nullptr) {
    c.notes.push_back(std::string("original_max_position_embeddings: ignored (") +
                      (arch.layer_type_rope
                           ? c.architecture + " keeps its rope parameters per layer type, where transformers "
                                              "reads their own"
                           : std::string("only \"llama3\", \"longrope\" and \"yarn\" scaling "
                                         "read it")) +
                      ")");
  }
}

// One rotary embedding's parameters (rope_scaling, rope_parameters, or
// the full attention's under rope_parameters per layer type) into
// c.model.rope. transformers keeps the parameters of an architecture with
// RoPE per layer type (arch.layer_type_rope) per layer type whatever the
// config's form, which changes two defaults below.
void ParseRopeParams(KeyReader& r, HfCheckpoint& c, const Architecture& arch, const json* s, const std::string& key) {
  RopeConfig& rope = c.model.rope;
  const bool per_layer_type = arch.layer_type_rope;
  if (!s->is_object()) return r.Error(key + ": expected an object, got " + s->dump());
  std::string type = s->value("rope_type", s->value("type", std::string("default")));
  const bool phi3 = arch.phi3;
  // Phi-3's config names LongRoPE "su" (and "yarn") too.
  if (phi3 && (type == "su" || type == "yarn")) type = "longrope";
  std::optional<double> factor, attention_factor, mscale, mscale_all_dim;
  bool factor_null = false;
  for (auto it = s->begin(); it != s->end(); ++it) {
    const std::string& k = it.key();
    const std::string name = key + "." + k;
    if (k == "rope_type" || k == "type") continue;
    const bool scaled = type == "llama3" || type == "longrope" || type == "yarn";
    if (k == "rope_theta" && it->is_number()) {
      rope.theta = it->get<double>();
    } else if (k == "partial_rotary_factor" && it->is_number()) {
      if (arch.default_partial_rotary > 0) rope.partial_factor = it->get<double>();  // see ParseLlama
    } else if (scaled && k == "original_max_position_embeddings") {
      const std::optional<int> v = PositionCount(*it);
      if (!v) return r.Error(name + ": expected an integer >= 2, got " + it->dump());
      rope.original_max_position = *v;
    } else if (type == "longrope" && (k == "short_factor" || k == "long_factor")) {
      std::vector<double>& f = k == "short_factor" ? rope.short_factor : rope.long_factor;
      if (!it->is_array()) return r.Error(name + ": expected a list of numbers, got " + it->dump());
      for (const json& v : *it) {
        if (!v.is_number() || !(v.get<double>() > 0))
          return r.Error(name + ": expected positive numbers, got " + v.dump());
        f.push_back(v.get<double>());
      }
    } else if ((type == "longrope" || type == "yarn") && (k == "factor" || k == "attention_factor") && it->is_null()) {
      factor_null = factor_null || k == "factor";  // null: as absent
    } else if ((type == "longrope" || type == "yarn" || type == "linear") &&
               (k == "factor" || (type != "linear" && k == "attention_factor")) && it->is_number()) {
      (k == "factor" ? factor : attention_factor) = it->get<double>();
    } else if (type == "yarn" && (k == "beta_fast" || k == "beta_slow") && (it->is_number() || it->is_null())) {
      // null or 0: the default (transformers' `or`)
      if (it->is_number() && it->get<double>() != 0) {
        (k == "beta_fast" ? rope.beta_fast : rope.beta_slow) = it->get<double>();
      }
    } else if (type == "yarn" && (k == "mscale" || k == "mscale_all_dim") && (it->is_number() || it->is_null())) {
      if (it->is_number()) (k == "mscale" ? mscale : mscale_all_dim) = it->get<double>();
    } else if (type == "yarn" && k == "truncate" && it->is_boolean()) {
      // transformers reads truncate from the top of rope_parameters: under
      // a layer type it has no effect.
      if (per_layer_type) {
        c.notes.push_back(name + ": ignored (" + c.architecture +
                          " keeps its rope parameters per layer type; transformers reads truncate above them)");
      } else {
        rope.truncate = it->get<bool>();
      }
    } else if (type == "llama3" && it->is_number() &&
               (k == "factor" || k == "low_freq_factor" || k == "high_freq_factor")) {
      const double v = it->get<double>();
      if (k == "factor") rope.factor = v;
      if (k == "low_freq_factor") rope.low_freq_factor = v;
      if (k == "high_freq_factor") rope.high_freq_factor = v;
    } else {
      r.Error(name + ": " + it->dump() + " is not supported (rope_type \"" + type + "\")");
    }
  }
  if (type == "llama3" || type == "longrope" || type == "yarn") {
    // As transformers' standardize_rope_params, which the model runs again
    // once the config holds every key: the top-level key wins over the rope
    // parameters' own (Phi-3's class has it always, 4096 when absent), but
    // not under a layer type; else the own, else the positions.
    const json* top = per_layer_type ? nullptr : r.Get("original_max_position_embeddings");
    const int own = rope.original_max_position;
    if (top != nullptr) {
      const std::optional<int> v = PositionCount(*top);
      if (!v) return r.Error("original_max_position_embeddings: expected an integer >= 2, got " + top->dump());
      rope.original_max_position = *v;
    } else if (phi3 && !per_layer_type) {
      rope.original_max_position = 4096;
    } else if (!s->contains("original_max_position_embeddings")) {
      rope.original_max_position = c.max_positions;
    }
    if (s->contains("original_max_position_embeddings") && rope.original_max_position != own) {
      c.notes.push_back(key + ".original_max_position_embeddings: " + std::to_string(own) + " ignored (" +
                        (top != nullptr ? "the top-level key's " : "Phi-3's default ") +
                        std::to_string(rope.original_max_position) + " wins, as in transformers)");
    }
  }
  const double ratio = static_cast<double>(c.max_positions) / rope.original_max_position;
  if (type == "linear") {
    rope.linear = true;
    rope.factor = factor.value_or(0.0);
    if (!(rope.factor > 0)) r.Error(key + ": linear needs factor > 0 (transformers requires it)");
  } else if (type == "llama3") {
    rope.llama3 = true;
    if (!(rope.factor > 0) || !(rope.high_freq_factor > rope.low_freq_factor)) {
      r.Error(key + ": llama3 needs factor > 0 and high_freq_factor > low_freq_factor");
    }
  } else if (type == "longrope") {
    // HF's LongRoPE: short factors within the pretraining length, long ones
    // beyond; cos and sin scaled by sqrt(1 + ln(factor) / ln(original)),
    // factor by default the ratio of the positions to the original ones.
    rope.longrope = true;
    if (rope.short_factor.empty() || rope.long_factor.empty()) {
      return r.Error(key + ": longrope needs short_factor and long_factor");
    }
    const double f = factor.value_or(ratio);
    rope.attention_factor =
        attention_factor.value_or(f <= 1.0 ? 1.0 : std::sqrt(1 + std::log(f) / std::log(rope.original_max_position)));
  } else if (type == "yarn") {
    // HF's YaRN: factor required (null: the ratio of the positions to the
    // original ones); cos and sin scaled by attention_factor, by default
    // 0.1 ln(factor) + 1, or the ratio of two such terms weighted by
    // mscale and mscale_all_dim when both are set (DeepSeek's form).
    rope.yarn = true;
    if (!factor && !factor_null) return r.Error(key + ": yarn needs factor (transformers requires it)");
    rope.factor = factor.value_or(ratio);
    auto m = [&](double weight) { return rope.factor <= 1 ? 1.0 : 0.1 * weight * std::log(rope.factor) + 1; };
    rope.attention_factor = attention_factor.value_or(
        mscale.value_or(0) != 0 && mscale_all_dim.value_or(0) != 0 ? m(*mscale) / m(*mscale_all_dim) : m(1));
    const std::pair<const char*, double> positive[] = {{"factor", rope.factor},
                                                       {"attention_factor", rope.attention_factor},
                                                       {"beta_fast", rope.beta_fast},
                                                       {"beta_slow", rope.beta_slow}};
    for (const auto& [k, v] : positive) {
      if (!(v > 0)) r.Error(key + "." + k + ": yarn needs it > 0, got " + json(v).dump());
    }
    if (!(rope.theta > 1)) r.Error(key + ": yarn needs rope_theta > 1 (its ramp divides by ln(rope_theta))");
  } else if (type != "default") {
    r.Error(key + ".rope_type: \"" + type +
            "\" changes the math; zinf supports \"default\", \"linear\", \"llama3\", \"longrope\" and \"yarn\"");
  }
}

// SmolLM3's layers without RoPE: no_rope_layers, one 0 or 1 per layer (1:
// RoPE), else every no_rope_layer_interval-th layer (transformers' rule).
void ParseNopeLayers(KeyReader& r, GptConfig& m) {
  const int interval = r.Int("no_rope_layer_interval", 4, false);
  const json* flags = r.Get("no_rope_layers");
  if (flags == nullptr) {
    for (int l = 0; l < m.n_layer; ++l) {
      if ((l + 1) % interval == 0) m.no_rope_layers.push_back(l);
    }
    return;
  }
  if (!flags->is_array() || flags->size() != static_cast<size_t>(m.n_layer)) {
    return r.Error("no_rope_layers: expected a list of " + std::to_string(m.n_layer) +
                   " flags (1: the layer uses RoPE, 0: it does not), got " + flags->dump());
  }
  for (int l = 0; l < m.n_layer; ++l) {
    const json& f = (*flags)[static_cast<size_t>(l)];
    if (f != 0 && f != 1) {
      return r.Error("no_rope_layers[" + std::to_string(l) + "]: expected 0 or 1, got " + f.dump());
    }
    if (f == 0) m.no_rope_layers.push_back(l);
  }
}

// The attention's sliding window, as transformers reads the config
// (SlidingLayers): the window's length and the layers it applies to.
void ParseSlidingWindow(KeyReader& r, HfCheckpoint& c, const Architecture& arch) {
  GptConfig& m = c.model;
  bool on = false;
  switch (arch.sliding) {
    case SlidingLayers::kNone: r.Neutral("use_sliding_window", {false}); break;
    case SlidingLayers::kAll:
    case SlidingLayers::kPattern:
    case SlidingLayers::kFromMaxWindowLayersWhenSet:
      on = true;
      if (r.Get("use_sliding_window") != nullptr) {
        c.notes.push_back("use_sliding_window: ignored (" + c.architecture + " slides whenever sliding_window is set)");
      }
      break;
    default: on = r.Bool("use_sliding_window", false);
  }
  int window = r.Has("sliding_window") ? 0 : arch.default_window;
  if (const json* w = r.Get("sliding_window"); w != nullptr && !on) {
    c.notes.push_back(arch.sliding == SlidingLayers::kNone
                          ? "sliding_window: ignored (" + c.architecture + " does not read it)"
                          : "sliding_window: ignored (use_sliding_window is false)");
  } else if (w != nullptr) {
    if (!w->is_number_integer() || w->get<int64_t>() < 1 || w->get<int64_t>() > (int64_t{1} << 30)) {
      r.Error("sliding_window: expected a positive integer or null, got " + w->dump());
    } else {
      window = w->get<int>();
    }
  }
  const bool from_max =
      arch.sliding == SlidingLayers::kFromMaxWindowLayers || arch.sliding == SlidingLayers::kFromMaxWindowLayersWhenSet;
  const bool reads_types = from_max || arch.sliding == SlidingLayers::kEvenBelowMaxWindow ||
                           arch.sliding == SlidingLayers::kNopeLayers || arch.sliding == SlidingLayers::kPattern;
  // The pattern: every pattern-th layer full, the others sliding (Gemma 2
  // every other, OLMo 3 every fourth). Gemma 3 and EXAONE 4 read
  // sliding_window_pattern, transformers only without layer_types (Gemma
  // 3's saved configs carry _sliding_window_pattern, which it ignores;
  // EXAONE 4's say "LLLG" beside layer_types).
  int pattern = arch.sliding_pattern;
  if (arch.reads_pattern && r.Get("layer_types") == nullptr) {
    pattern = r.Int("sliding_window_pattern", arch.sliding_pattern, false);
  } else if (arch.reads_pattern && r.Get("sliding_window_pattern") != nullptr) {
    c.notes.push_back("sliding_window_pattern: ignored (layer_types says which layers slide)");
  }
  std::vector<int> layers;
  if (const json* types = r.Get("layer_types"); types != nullptr && !reads_types) {
    c.notes.push_back("layer_types: ignored (" + c.architecture + " does not read it)");
  } else if (types != nullptr) {
    if (!types->is_array() || types->size() != static_cast<size_t>(m.n_layer)) {
      return r.Error("layer_types: expected a list of " + std::to_string(m.n_layer) +
                     " (num_hidden_layers) \"full_attention\" or \"sliding_attention\", got " + types->dump());
    }
    for (int l = 0; l < m.n_layer; ++l) {
      const json& t = (*types)[static_cast<size_t>(l)];
      const std::string at = "layer_types[" + std::to_string(l) + "]: ";
      if (t == "sliding_attention" && !(on && window > 0)) {
        // transformers refuses this (Qwen2, Qwen3), or its attention
        // implementations disagree on it (SmolLM3).
        return r.Error(
            at + "\"sliding_attention\" without a window (" +
            (arch.sliding == SlidingLayers::kPattern || arch.sliding == SlidingLayers::kFromMaxWindowLayersWhenSet
                 ? std::string("sliding_window null")
                 : "use_sliding_window true and sliding_window set") +
            ")");
      }
      if (t == "sliding_attention") {
        layers.push_back(l);
      } else if (t != "full_attention" && t != "attention") {  // "attention": transformers' older name
        r.Error(at + t.dump() + " changes the math; zinf supports \"full_attention\" and \"sliding_attention\"");
      }
    }
  } else if (arch.sliding == SlidingLayers::kAll || (arch.sliding == SlidingLayers::kAllWhenUsed && on)) {
    for (int l = 0; l < m.n_layer; ++l) layers.push_back(l);
  } else if ((from_max || arch.sliding == SlidingLayers::kEvenBelowMaxWindow) && on) {
    int bound = arch.default_max_window_layers;
    if (const json* f = r.Get("max_window_layers"); f != nullptr) {
      if (!f->is_number_integer() || f->get<int64_t>() < 0) {
        return r.Error("max_window_layers: expected an integer >= 0, got " + f->dump());
      }
      bound = static_cast<int>(std::min<int64_t>(f->get<int64_t>(), m.n_layer));
    }
    if (from_max) {
      for (int l = bound; l < m.n_layer; ++l) layers.push_back(l);
    } else {
      for (int l = 0; l < bound; l += 2) layers.push_back(l);
    }
  } else if (arch.sliding == SlidingLayers::kNopeLayers) {
    layers = m.no_rope_layers;
  } else if (arch.sliding == SlidingLayers::kPattern) {
    for (int l = 0; l < m.n_layer; ++l) {
      if ((l + 1) % pattern != 0) layers.push_back(l);
    }
    if (window <= 0 && !layers.empty()) {
      return r.Error("sliding_window: null, but layers " + std::to_string(layers.front()) + "... slide (" +
                     (arch.reads_pattern ? "sliding_window_pattern " + std::to_string(pattern)
                                         : "one layer in " + std::to_string(pattern) + " full") +
                     ")");
    }
  }
  // Gemma 3's and OLMo 3's sliding layers have their own RoPE, window or
  // not.
  if (arch.layer_type_rope) m.local_rope_layers = layers;
  // EXAONE 4's hybrid attention: with a window configured, the layers that
  // do not slide turn no RoPE (all of them, if layer_types slides none).
  if (arch.nope_full_layers && on && window > 0) {
    for (int l = 0; l < m.n_layer; ++l) {
      if (!std::binary_search(layers.begin(), layers.end(), l)) m.no_rope_layers.push_back(l);
    }
  }
  if (on && window > 0 && !layers.empty()) {
    m.sliding_window = window;
    m.sliding_layers = std::move(layers);
  }
}

// A softcap key (Gemma 2, 3): absent, transformers' default; null, none;
// else a positive number.
double Softcap(KeyReader& r, const std::string& key, double fallback) {
  if (!r.Has(key)) return fallback;
  const json* v = r.Get(key);
  if (v == nullptr) return 0;
  if (!v->is_number() || !(v->get<double>() > 0) || v->get<double>() > 1e6) {
    r.Error(key + ": expected a positive number or null (no softcapping), got " + v->dump());
    return 0;
  }
  return v->get<double>();
}

// Granite's multipliers (ParseLlama reads the rest): each a positive
// number, transformers' 1 when absent.
void ParseGranite(KeyReader& r, GptConfig& m) {
  auto multiplier = [&r](const char* key) {
    const double v = r.Number(key, 1.0);
    if (!(v > 0) || v > 1e6 || v < 1e-6) {
      r.Error(std::string(key) + ": expected a positive number in [1e-6, 1e6], got " + json(v).dump());
      return 1.0;
    }
    return v;
  };
  m.embed_multiplier = multiplier("embedding_multiplier");
  m.residual_multiplier = multiplier("residual_multiplier");
  m.logits_scaling = multiplier("logits_scaling");
  // The scores are q.k times attention_multiplier: zinf's attn_scalar^-1/2.
  const double attention = multiplier("attention_multiplier");
  m.attn_scalar = 1.0 / (attention * attention);
}

// Gemma's keys (ParseLlama reads the rest).
void ParseGemma(KeyReader& r, HfCheckpoint& c, const Architecture& arch) {
  GptConfig& m = c.model;
  m.norm_unit_offset = true;
  m.embed_scale = true;
  m.mlp_glu = kernels::Glu::kGeluTanh;
  m.sandwich_norms = arch.sandwich;
  // Gemma reads hidden_act, where "gelu" (its first releases' value) means
  // the tanh approximation; Gemma 2 and 3 read hidden_activation.
  const char* act = arch.sandwich ? "hidden_activation" : "hidden_act";
  const char* other = arch.sandwich ? "hidden_act" : "hidden_activation";
  if (arch.sandwich) {
    r.Neutral(act, {"gelu_pytorch_tanh", "gelu_new"});
  } else {
    r.Neutral(act, {"gelu_pytorch_tanh", "gelu_new", "gelu"});
  }
  if (r.Get(other) != nullptr) {
    c.notes.push_back(std::string(other) + ": ignored (transformers' " + c.architecture + " reads " + act + ")");
  }
  r.Neutral("use_bidirectional_attention", {false});
  if (!arch.sandwich) return;
  m.attn_softcap = Softcap(r, "attn_logit_softcapping", arch.default_attn_softcap);
  m.final_softcap = Softcap(r, "final_logit_softcapping", arch.default_final_softcap);
  // transformers' Gemma3ForConditionalGeneration leaves its logits uncapped
  // whatever text_config says (its Gemma3ForCausalLM caps them): refused
  // rather than trained against the other class's math.
  if (arch.multimodal && m.final_softcap > 0) {
    r.Error("final_logit_softcapping: " + json(m.final_softcap).dump() + " in text_config: " + c.architecture +
            " does not cap its logits in transformers (null only)");
  }
  m.attn_scalar = r.Number("query_pre_attn_scalar", 256.0);
  if (!(m.attn_scalar > 0))
    r.Error("query_pre_attn_scalar: expected a positive number, got " + json(m.attn_scalar).dump());
}

// transformers' Gemma3TextConfig defaults for the shape keys, which the
// Hub's multimodal Gemma 3 configs leave out of text_config (4B names only
// its widths and depth).
struct ShapeDefault {
  const char* key;
  int value;
};
constexpr ShapeDefault kGemma3Shape[] = {
    {"vocab_size", 262208},
    {"hidden_size", 2304},
    {"intermediate_size", 9216},
    {"num_hidden_layers", 26},
    {"num_attention_heads", 8},
    {"num_key_value_heads", 4},
    {"max_position_embeddings", 131072},
};

// Qwen2-MoE and Qwen3-MoE: experts of moe_intermediate_size, dense layers
// possible (mlp_only_layers, decoder_sparse_step).
bool QwenMoe(const Architecture& arch) {
  return arch.experts == Experts::kQwen3Moe || arch.experts == Experts::kQwen2Moe;
}

// Notes the dense layers among the routed ones (up to 8 named; more as the
// first three, the last and the count), chosen by the config's `keys`.
void NoteDenseLayers(HfCheckpoint& c, const std::string& keys) {
  const std::vector<int>& d = c.model.dense_layers;
  std::string list;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d.size() > 8 && i == 3) {
      list += ", ... " + std::to_string(d.back()) + " (" + std::to_string(d.size()) + " layers)";
      break;
    }
    list += (list.empty() ? "" : ", ") + std::to_string(d[i]);
  }
  c.notes.push_back((d.size() == 1 ? "layer " : "layers ") + list + ": a dense MLP of " +
                    std::to_string(c.model.dense_intermediate_size) + " (intermediate_size; " + keys + ")");
}

// With dense_layers chosen by the config's `keys`: an error when no layer
// is left routed (`all_dense` says how), else the dense layers' width
// (intermediate_size: `dense_width`; null refused, as transformers' dense
// MLP would fail on it) and a note naming them.
void FinishDenseLayers(KeyReader& r, HfCheckpoint& c, int dense_width, const std::string& keys,
                       const std::string& all_dense) {
  GptConfig& m = c.model;
  if (m.dense_layers.empty()) return;
  if (m.routed_layers() < 1) {
    return r.Error(keys + ": " + all_dense +
                   " (no experts in use); zinf needs a routed layer (or the config of the dense class)");
  }
  r.RefuseNull("intermediate_size",
               "a positive integer: layers " + std::to_string(m.dense_layers.front()) + "... are dense");
  m.dense_intermediate_size = dense_width;
  NoteDenseLayers(c, keys);
}

// The experts' width, moe_intermediate_size: absent, the class's
// `fallback`; null refused (transformers' would fail on it).
int MoeWidth(KeyReader& r, int fallback) {
  r.RefuseNull("moe_intermediate_size", "a positive integer");
  return r.Int("moe_intermediate_size", fallback, false);
}

// A count that may be 0: absent, `fallback`; else an integer in [0, 2^30].
int Count(KeyReader& r, const std::string& key, int fallback) {
  r.RefuseNull(key, "an integer >= 0");
  const json* v = r.Get(key);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > (int64_t{1} << 30)) {
    r.Error(key + ": expected an integer >= 0, got " + v->dump());
    return fallback;
  }
  return v->get<int>();
}

// `count` ungated shared experts of moe_intermediate_size (GLM-4.5's and
// ERNIE 4.5's, under `key`): one gated MLP of their summed width, as
// transformers builds them.
void SharedExperts(KeyReader& r, GptConfig& m, const std::string& key, int count) {
  const int64_t shared = int64_t{count} * m.intermediate_size;
  if (shared > (int64_t{1} << 30)) {
    r.Error(key + ": " + std::to_string(count) + " shared experts of " + std::to_string(m.intermediate_size) +
            " (moe_intermediate_size) are wider than 2^30");
  } else {
    m.shared_expert_size = static_cast<int>(shared);
  }
}

// The multi-token-prediction layers' count (GLM-4.5's, ERNIE 4.5's), which
// transformers 5 also calls num_mtp_layers.
int MtpLayers(KeyReader& r, int fallback) {
  if (r.Has("num_nextn_predict_layers") && r.Has("num_mtp_layers")) {
    r.Error("num_nextn_predict_layers and num_mtp_layers: give one");
  }
  return Count(r, r.Has("num_mtp_layers") ? "num_mtp_layers" : "num_nextn_predict_layers", fallback);
}

// DeepSeek-V3's routed MLP as GLM-4.5 (transformers' Glm4MoeMoE) and
// dots.llm1 (Dots1MoE) have it: sigmoid scores whose experts are chosen by
// score + e_score_correction_bias within the topk_group best of n_group
// groups, weighted by the scores (normalized with norm_topk_prob) times
// routed_scaling_factor; n_shared_experts ungated shared experts of
// moe_intermediate_size (one gated MLP of their summed width: transformers
// builds them so); the first first_k_dense_replace layers dense, of
// intermediate_size; no load-balancing loss; GLM-4.5's
// num_nextn_predict_layers multi-token-prediction layers in the
// checkpoint, not in the model. The defaults are the architecture's.
// DeepSeek-V2's (transformers' DeepseekV2Moe) differs in its router: a
// softmax whose topk_method "greedy" takes the k most probable experts and
// "group_limited_greedy" those among the topk_group of n_group groups whose
// most probable expert is highest, weighted by their probabilities (never
// renormalized, whatever norm_topk_prob says) times routed_scaling_factor;
// its weight kept in fp32.
void ParseDeepSeekExperts(KeyReader& r, HfCheckpoint& c, const Architecture& arch, int dense_width) {
  GptConfig& m = c.model;
  const bool v2 = arch.experts == Experts::kDeepseekV2;
  if (v2) {
    m.router_fp32 = true;  // its _keep_in_fp32_modules_strict
    m.router_group_best = 1;
  } else {
    m.router_scoring = kernels::MoeScoring::kSigmoid;
    m.router_bias = true;
  }
  m.intermediate_size = MoeWidth(r, arch.default_moe_width);
  r.RefuseNull("n_shared_experts", "a positive integer");
  const bool shared_required = arch.default_shared_experts == 0 && !r.Has("n_shared_experts");
  SharedExperts(r, m, "n_shared_experts", r.Int("n_shared_experts", arch.default_shared_experts, shared_required));
  r.RefuseNull("routed_scaling_factor", "a positive number");
  m.routed_scale = r.Number("routed_scaling_factor", arch.default_routed_scale);
  if (!(m.routed_scale > 0) || m.routed_scale > 1e6) {
    r.Error("routed_scaling_factor: " + json(m.routed_scale).dump() + " (expected a number in (0, 1e6])");
  }
  // DeepSeek-V2's greedy router has no groups (n_group and topk_group
  // not read); its group-limited one needs both.
  std::string method;
  if (v2) {
    r.RefuseNull("topk_method", "\"greedy\" or \"group_limited_greedy\"");
    const json* t = r.Get("topk_method");
    method = t != nullptr && t->is_string() ? t->get<std::string>() : t == nullptr ? "greedy" : "";
    if (t != nullptr && method != "greedy" && method != "group_limited_greedy") {
      r.Error("topk_method: " + (t != nullptr ? t->dump() : std::string("null")) + " (transformers' " + c.architecture +
              " knows \"greedy\" and \"group_limited_greedy\")");
    }
  }
  const bool grouped = !v2 || method == "group_limited_greedy";
  // dots.llm1's Hub config leaves both null, the original code's "no
  // groups" (transformers' Dots1 fails on null): one group, noted.
  for (const char* k : {"n_group", "topk_group"}) {
    if (!grouped) {
      if (r.Get(k) != nullptr) c.notes.push_back(std::string(k) + ": ignored (topk_method \"greedy\")");
    } else if (!arch.original_moe_keys || v2) {
      r.RefuseNull(k, "a positive integer");
    } else if (r.Has(k) && r.Get(k) == nullptr) {
      c.notes.push_back(std::string(k) + ": null, one group (transformers' " + c.architecture + " needs a number)");
    }
  }
  // dots.llm1's null: one group (above), not DeepSeek-V3's default.
  const bool null_groups = arch.original_moe_keys && r.Has("n_group") && r.Get("n_group") == nullptr;
  const bool null_topk = arch.original_moe_keys && r.Has("topk_group") && r.Get("topk_group") == nullptr;
  if (grouped) {
    m.router_groups = r.Int("n_group", null_groups ? 1 : arch.default_groups, v2);
    m.router_topk_groups = r.Int("topk_group", null_topk ? 1 : arch.default_topk_groups, v2);
  }
  const int E = m.n_experts, G = m.router_groups, TG = m.router_topk_groups, best = m.router_group_best;
  if (G > kernels::kMaxRouterGroups || E % G != 0 || E / G < best) {
    r.Error("n_group: " + std::to_string(G) + " groups of the " + std::to_string(E) + " experts (expected a divisor" +
            (best > 1 ? " leaving two or more experts a group" : "") + ", at most " +
            std::to_string(kernels::kMaxRouterGroups) + " groups" +
            (best > 1 ? ": transformers scores a group by its two best)" : ")"));
  } else if (TG > G || m.experts_per_token > TG * (E / G)) {
    r.Error("topk_group: " + std::to_string(TG) + " of " + std::to_string(G) + " groups of " + std::to_string(E / G) +
            " experts cannot hold num_experts_per_tok " + std::to_string(m.experts_per_token) + " experts");
  }
  const int dense = Count(r, "first_k_dense_replace", arch.default_first_dense);
  for (int l = 0; l < std::min(dense, m.n_layer); ++l) m.dense_layers.push_back(l);
  FinishDenseLayers(r, c, dense_width, "first_k_dense_replace",
                    std::to_string(dense) + " makes every one of the " + std::to_string(m.n_layer) + " layers dense");
  if (arch.reads_mtp_layers) c.mtp_layers = MtpLayers(r, 1);
  if (r.Bool("output_router_logits", false)) {
    c.notes.push_back("output_router_logits: ignored (transformers' " + c.architecture +
                      " adds no load-balancing loss)");
  }
  if (r.Get("router_aux_loss_coef") != nullptr) {
    c.notes.push_back("router_aux_loss_coef: ignored (transformers' " + c.architecture + " does not read it)");
  }
  // The original (DeepSeek-V3-derived) code's keys, which transformers
  // does not read: its router is always the sigmoid with the bias.
  for (const char* k : {"scoring_func", "topk_method", "moe_layer_freq", "ep_size", "aux_loss_alpha", "seq_aux"}) {
    if (arch.original_moe_keys && !(v2 && std::string_view(k) == "topk_method") && r.Get(k) != nullptr) {
      c.notes.push_back(std::string(k) + ": ignored (transformers' " + c.architecture + " does not read it)");
    }
  }
}

// ERNIE 4.5's routed MLP (transformers' Ernie4_5_MoeSparseMoeBlock): a
// softmax whose experts are chosen by probability + e_score_correction_bias
// (mlp.moe_statics), weighted by their probabilities divided by their sum,
// at least moe_norm_min; moe_num_shared_experts ungated shared experts of
// moe_intermediate_size; routed the layers l in [moe_layer_start_index,
// moe_layer_end_index] (-1: the last) with l + 1 a multiple of
// moe_layer_interval, the others dense, of intermediate_size; no
// load-balancing loss (transformers' would count the experts chosen
// without the bias); num_nextn_predict_layers multi-token-prediction
// modules in the checkpoint, not in the model.
void ParseErnieMoeExperts(KeyReader& r, HfCheckpoint& c, int dense_width) {
  GptConfig& m = c.model;
  m.router_bias = true;
  m.intermediate_size = MoeWidth(r, 1536);
  SharedExperts(r, m, "moe_num_shared_experts", Count(r, "moe_num_shared_experts", 2));
  // torch.clamp's floor: one of 0 or less never binds (the sum is positive).
  r.RefuseNull("moe_norm_min", "a number");
  const double floor = r.Number("moe_norm_min", 1e-12);
  if (!std::isfinite(floor) || floor > 1e6) {
    r.Error("moe_norm_min: " + json(floor).dump() + " (expected a number <= 1e6)");
  } else if (floor <= 0) {
    c.notes.push_back("moe_norm_min: " + json(floor).dump() + ": no floor (the weights' sum is positive)");
  } else {
    m.router_norm_min = floor;
  }
  // transformers asks layer_idx >= start: one below 0 is 0.
  r.RefuseNull("moe_layer_start_index", "a layer index");
  const json* start_key = r.Get("moe_layer_start_index");
  int64_t start = 1;
  if (start_key != nullptr && !start_key->is_number_integer()) {
    r.Error("moe_layer_start_index: expected a layer index, got " + start_key->dump());
  } else if (start_key != nullptr) {
    start = std::max<int64_t>(start_key->get<int64_t>(), 0);
  }
  r.RefuseNull("moe_layer_end_index", "-1 (the last layer) or a layer index");
  const json* end_key = r.Get("moe_layer_end_index");
  int64_t end = m.n_layer - 1;
  if (end_key != nullptr && (!end_key->is_number_integer() || end_key->get<int64_t>() < -1)) {
    r.Error("moe_layer_end_index: expected -1 (the last layer) or a layer index, got " + end_key->dump());
  } else if (end_key != nullptr && end_key->get<int64_t>() >= 0) {
    end = end_key->get<int64_t>();
  }
  r.RefuseNull("moe_layer_interval", "a positive integer");
  const int interval = r.Int("moe_layer_interval", 1, false);
  for (int l = 0; l < m.n_layer; ++l) {
    if (l < start || l > end || (l + 1) % interval != 0) m.dense_layers.push_back(l);
  }
  FinishDenseLayers(r, c, dense_width, "moe_layer_start_index, moe_layer_end_index, moe_layer_interval",
                    "no layer of the " + std::to_string(m.n_layer) + " is routed");
  if (r.Bool("output_router_logits", false)) {
    r.Error(
        "output_router_logits: true adds transformers' load-balancing loss, which counts the experts chosen "
        "without e_score_correction_bias; zinf supports only false");
  }
  r.Get("router_aux_loss_coef");  // read only with the loss
  // The Hub's configs carry the original code's keys, which transformers
  // does not read (its router always adds the bias, drops no token).
  // Its multi-token-prediction module's tensors (model.mtp_*) are kept
  // whatever num_nextn_predict_layers says: transformers skips them so.
  for (const char* k : {"moe_capacity", "moe_gate", "moe_use_aux_free", "multi_token_pred_lambda", "use_rmsnorm",
                        "num_nextn_predict_layers"}) {
    if (r.Get(k) != nullptr) {
      c.notes.push_back(std::string(k) + ": ignored (transformers' " + c.architecture + " does not read it)");
    }
  }
}

// Qwen-MoE's dense layers, as transformers picks them: those in
// mlp_only_layers (layers past the model's change nothing: it asks
// `layer_idx in`) and those whose layer + 1 decoder_sparse_step does not
// divide; a gated MLP of intermediate_size (`dense_width`) each.
void ParseDenseLayers(KeyReader& r, HfCheckpoint& c, int dense_width) {
  GptConfig& m = c.model;
  r.RefuseNull("decoder_sparse_step", "a positive integer");  // transformers' `%` would fail on it
  const int step = r.Int("decoder_sparse_step", 1, false);
  std::vector<bool> dense(static_cast<size_t>(m.n_layer), false);
  for (int l = 0; l < m.n_layer; ++l) dense[static_cast<size_t>(l)] = (l + 1) % step != 0;
  if (const json* only = r.Get("mlp_only_layers"); only != nullptr) {
    if (!only->is_array() ||
        !std::all_of(only->begin(), only->end(), [](const json& l) { return l.is_number_integer(); })) {
      return r.Error("mlp_only_layers: expected a list of layer indices, got " + only->dump());
    }
    std::string past;
    for (const json& l : *only) {
      const int64_t i = l.get<int64_t>();
      if (i >= 0 && i < m.n_layer) {
        dense[static_cast<size_t>(i)] = true;
      } else {
        past += (past.empty() ? "" : ", ") + l.dump();
      }
    }
    if (!past.empty()) c.notes.push_back("mlp_only_layers: " + past + " ignored (no such layer)");
  }
  for (int l = 0; l < m.n_layer; ++l) {
    if (dense[static_cast<size_t>(l)]) m.dense_layers.push_back(l);
  }
  FinishDenseLayers(r, c, dense_width, "mlp_only_layers, decoder_sparse_step", "every layer's MLP is dense");
}

// The routed MLP's keys (Qwen-MoE's dense layers among the routed ones:
// ParseDenseLayers), the load-balancing loss in the loss when
// output_router_logits.
void ParseExperts(KeyReader& r, HfCheckpoint& c, const Architecture& arch, int dense_width) {
  GptConfig& m = c.model;
  // num_experts, or transformers 5's num_local_experts (both names map to
  // one attribute in all three classes); Mixtral's Hub configs say
  // num_local_experts.
  // GLM-4.5's and dots.llm1's is n_routed_experts (num_local_experts in
  // transformers 5);
  // ERNIE 4.5's moe_num_experts and moe_k (num_experts and
  // num_experts_per_tok map to them).
  // DeepSeek-V2's n_routed_experts is num_experts there.
  const bool deepseek = DeepSeekRouter(arch.experts), ernie = arch.experts == Experts::kErnie45Moe;
  const bool v2 = arch.experts == Experts::kDeepseekV2;
  const char* own = deepseek ? "n_routed_experts" : ernie ? "moe_num_experts" : "num_experts";
  const char* other = ernie || v2 ? "num_experts" : "num_local_experts";
  if (r.Has(own) && r.Has(other)) r.Error(std::string(own) + " and " + other + ": give one");
  const char* key = r.Has(other) || (arch.experts == Experts::kMixtral && !r.Has(own)) ? other : own;
  if (ernie && r.Has("moe_k") && r.Has("num_experts_per_tok")) r.Error("moe_k and num_experts_per_tok: give one");
  const char* per_token = ernie && !r.Has("num_experts_per_tok") ? "moe_k" : "num_experts_per_tok";
  // Absent: the class's default (none: required); null: an error
  // (transformers' would fail).
  auto count = [&](const char* k, int fallback) {
    r.RefuseNull(k, "a positive integer");
    return r.Int(k, fallback, fallback == 0 && !r.Has(k));
  };
  m.n_experts = count(key, arch.default_experts);
  m.experts_per_token = count(per_token, arch.default_experts_per_token);
  if (m.experts_per_token > m.n_experts || m.experts_per_token > kernels::cpu::kMaxExpertsPerToken) {
    r.Error(std::string(per_token) + ": " + std::to_string(m.experts_per_token) + " experts a token, of " +
            std::to_string(m.n_experts) + " (zinf routes a token to at most " +
            std::to_string(kernels::cpu::kMaxExpertsPerToken) + ")");
  }
  if (arch.experts == Experts::kMixtral || ernie) {
    m.norm_topk_prob = true;
    if (r.Get("norm_topk_prob") != nullptr) {
      c.notes.push_back("norm_topk_prob: ignored (" + c.architecture + " always renormalizes)");
    }
  } else if (v2) {
    if (r.Bool("norm_topk_prob", false)) {
      c.notes.push_back("norm_topk_prob: ignored (transformers' " + c.architecture + " never renormalizes)");
    }
  } else {
    m.norm_topk_prob = r.Bool("norm_topk_prob", arch.default_norm_topk);
  }
  if (deepseek) return ParseDeepSeekExperts(r, c, arch, dense_width);
  if (ernie) return ParseErnieMoeExperts(r, c, dense_width);
  if (QwenMoe(arch)) {
    m.intermediate_size = r.Int("moe_intermediate_size", arch.experts == Experts::kQwen2Moe ? 1408 : 768, false);
    if (arch.experts == Experts::kQwen2Moe) {
      m.shared_expert_size = r.Int("shared_expert_intermediate_size", 5632, false);
      m.shared_expert_gate = true;
    }
    ParseDenseLayers(r, c, dense_width);
  }
  if (arch.experts == Experts::kMixtral) r.Neutral("router_jitter_noise", {0, 0.0});
  if (const json* clip = arch.experts == Experts::kOlmoe ? r.Get("clip_qkv") : nullptr; clip != nullptr) {
    r.Error("clip_qkv: " + clip->dump() + " clamps q, k and v, which zinf does not; it supports only null");
  }
  // The load-balancing loss joins the training loss when
  // output_router_logits; its coefficient is read only then.
  if (r.Bool("output_router_logits", false)) {
    r.RefuseNull("router_aux_loss_coef", "a number: output_router_logits is true");
    m.router_aux_coef = r.Number("router_aux_loss_coef", arch.default_aux_coef);
    if (!(m.router_aux_coef >= 0)) {
      r.Error("router_aux_loss_coef: " + json(m.router_aux_coef).dump() + " (expected a number >= 0)");
    }
    c.notes.push_back("output_router_logits: the loss includes the routers' load-balancing loss times " +
                      json(m.router_aux_coef).dump() + " (router_aux_loss_coef), as transformers' does");
  } else {
    r.Get("router_aux_loss_coef");
  }
}

// DeepSeek-V2's and V3's multi-head latent attention (transformers'
// DeepseekV2Attention, DeepseekV3Attention): kv_lora_rank, q_lora_rank
// (null: q_proj), qk_nope_head_dim + qk_rope_head_dim a head's q and k
// (head_dim, which transformers derives as qk_rope_head_dim, is read only
// to check it), v_head_dim; V3's rope_interleave (V2 always turns
// interleaved pairs and has no such key); with YaRN's mscale_all_dim the scores
// scaled by its mscale squared (attn_scalar). As many key/value heads as
// heads: transformers' attention repeats them otherwise, which fails.
void ParseLatentAttention(KeyReader& r, HfCheckpoint& c, const Architecture& arch) {
  GptConfig& m = c.model;
  for (const char* k : {"kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"}) {
    r.RefuseNull(k, "a positive integer");
  }
  m.kv_lora_rank = r.Int("kv_lora_rank", 512, false);
  m.q_lora_rank = r.Has("q_lora_rank") && r.Get("q_lora_rank") == nullptr ? 0 : r.Int("q_lora_rank", 1536, false);
  m.qk_rope_head_dim = r.Int("qk_rope_head_dim", 64, false);
  const int nope = r.Int("qk_nope_head_dim", 128, false);
  m.v_head_dim = r.Int("v_head_dim", 128, false);
  m.head_size = nope + m.qk_rope_head_dim;
  // Derived keys transformers' config writes out: checked, not read.
  if (const json* hd = r.Get("head_dim"); hd != nullptr && *hd != json(m.qk_rope_head_dim)) {
    r.Error("head_dim: " + hd->dump() + " (transformers' " + c.architecture + " sets it to qk_rope_head_dim, " +
            std::to_string(m.qk_rope_head_dim) + ")");
  }
  if (const json* qk = r.Get("qk_head_dim"); qk != nullptr && *qk != json(m.head_size)) {
    r.Error("qk_head_dim: " + qk->dump() + " (transformers sets it to qk_nope_head_dim + qk_rope_head_dim, " +
            std::to_string(m.head_size) + ")");
  }
  if (m.qk_rope_head_dim % 2 != 0) {
    r.Error("qk_rope_head_dim: " + std::to_string(m.qk_rope_head_dim) + " (RoPE turns pairs: expected an even number)");
  }
  if (m.v_head_dim > m.head_size) {
    r.Error("v_head_dim: " + std::to_string(m.v_head_dim) + " is wider than a query head (qk_nope_head_dim + " +
            "qk_rope_head_dim = " + std::to_string(m.head_size) + "), which zinf's attention does not support");
  }
  if (m.n_kv_head != m.n_head) {
    r.Error("num_key_value_heads: " + std::to_string(m.n_kv_head) + " (latent attention gives every one of the " +
            std::to_string(m.n_head) + " heads its own keys and values: expected " + std::to_string(m.n_head) + ")");
  }
  // DeepSeek-V3's rope_interleave; V2 always turns interleaved pairs.
  if (arch.experts != Experts::kDeepseekV2) r.RefuseNull("rope_interleave", "true or false");
  m.rope.interleaved = arch.experts == Experts::kDeepseekV2 || r.Bool("rope_interleave", true);
  // transformers' yarn_apply_mscale: the scores' scale hd^-1/2 times
  // mscale(factor, mscale_all_dim)^2, so q times that (attn_scalar).
  const json* rope = r.Get("rope_parameters");
  if (rope == nullptr) rope = r.Get("rope_scaling");
  if (!m.rope.yarn || rope == nullptr || !rope->is_object() || !(m.rope.factor > 1)) return;
  const auto all_dim = rope->find("mscale_all_dim");
  if (all_dim != rope->end() && all_dim->is_number() && all_dim->get<double>() != 0) {
    const double s = 0.1 * all_dim->get<double>() * std::log(m.rope.factor) + 1;
    m.attn_scalar = m.head_size / (s * s * s * s);
  }
}

void ParseLlama(KeyReader& r, HfCheckpoint& c, const Architecture& arch) {
  GptConfig& m = c.model;
  m.family = ModelFamily::kLlama;
  if (const json* q = r.Get("quantization_config"); q != nullptr) {
    const auto method = q->is_object() ? q->find("quant_method") : q->end();
    r.Error("quantization_config: a quantized checkpoint (" +
            (method != q->end() && method->is_string() ? method->get<std::string>() : std::string("?")) +
            "); zinf trains 16- or 32-bit weights: dequantize it (to bf16) first");
  }
  // A shape key: required, but for Gemma 3 transformers' default (noted).
  auto shape = [&](const char* key) {
    if (arch.gemma3 && !r.Has(key)) {
      for (const ShapeDefault& d : kGemma3Shape) {
        if (std::string_view(d.key) == key) {
          c.notes.push_back(std::string(key) + ": absent, transformers' Gemma 3 default " + std::to_string(d.value));
          return d.value;
        }
      }
    }
    return r.Int(key, 1, true);
  };
  m.vocab_size = shape("vocab_size");
  m.n_embd = shape("hidden_size");
  m.n_head = shape("num_attention_heads");
  m.n_layer = shape("num_hidden_layers");
  // Gemma's classes default it to other than the heads: required there.
  // Absent: the class's default (Gemma's: required); null: the heads.
  m.n_kv_head =
      arch.gemma3 ? shape("num_key_value_heads")
                  : r.Int("num_key_value_heads",
                          arch.default_kv_heads > 0 && !r.Has("num_key_value_heads") ? arch.default_kv_heads : m.n_head,
                          arch.gemma);
  // The mixtures' (but Mixtral's and OLMoE's) is their dense layers' width (the class's
  // default when absent), unused when every layer routes.
  m.intermediate_size = QwenMoe(arch)
                            ? r.Int("intermediate_size", arch.experts == Experts::kQwen2Moe ? 5632 : 6144, false)
                        : DeepSeekRouter(arch.experts) ? r.Int("intermediate_size", arch.default_dense_width, false)
                        : arch.experts == Experts::kErnie45Moe ? r.Int("intermediate_size", 12288, false)
                                                               : shape("intermediate_size");
  // The experts' width replaces it; it stays the dense layers'.
  if (arch.experts != Experts::kNone) ParseExperts(r, c, arch, m.intermediate_size);
  c.max_positions = shape("max_position_embeddings");
  m.seq_len = c.max_positions;
  m.tied_embeddings = r.Bool("tie_word_embeddings", arch.gemma || arch.tied_by_default);
  if (arch.multimodal && !m.tied_embeddings) {  // transformers ties on the top level's key
    c.notes.push_back("tie_word_embeddings: false in text_config ignored (the model ties on the top level's)");
    m.tied_embeddings = true;
  }
  m.norm_eps = r.Number("rms_norm_eps", arch.default_norm_eps);
  // The embedding's padding_idx: pad_token_id, or the class's default.
  const json* pad = r.Get("pad_token_id");
  const bool pad_default = !r.Has("pad_token_id") && arch.default_pad_token >= 0;
  const int64_t pad_id = pad != nullptr && pad->is_number_integer() ? pad->get<int64_t>()
                         : pad_default                              ? arch.default_pad_token
                                                                    : -1;
  if (pad != nullptr && !pad->is_number_integer()) {
    r.Error("pad_token_id: expected a token id, got " + pad->dump());
  } else if ((pad != nullptr || pad_default) && (pad_id < 0 || pad_id >= m.vocab_size)) {
    r.Error("pad_token_id: " + std::to_string(pad_id) + (pad_default ? " (absent: transformers' default)" : "") +
            " is outside the vocabulary [0, " + std::to_string(m.vocab_size) +
            "), which transformers' embedding (padding_idx) refuses");
  } else if (pad_id >= 0) {
    m.padding_token = static_cast<int>(pad_id);
    c.notes.push_back("pad_token_id " + std::to_string(pad_id) +
                      (pad_default ? " (absent: transformers' default)" : "") +
                      ": its embedding row gets no gradient from the input side, as transformers' padding_idx");
  }
  m.qkv_bias = arch.attention_bias_qkv ? r.Bool(std::string(arch.bias_key), arch.qkv_bias) : arch.qkv_bias;
  if (!arch.out_bias_key.empty()) r.Neutral(std::string(arch.out_bias_key), {false});  // Seed-OSS's o_proj bias
  m.qk_norm = arch.qk_norm_key.empty() ? arch.qk_norm : r.Bool(std::string(arch.qk_norm_key), false);
  m.post_norms = arch.post_norms;
  m.qk_norm_all_heads = arch.qk_norm_all_heads;
  m.sandwich_norms = arch.glm4_norms;  // Gemma's: ParseGemma
  const bool phi3 = arch.phi3;
  if (arch.granite) ParseGranite(r, m);
  if (arch.gemma) {
    ParseGemma(r, c, arch);
  } else {
    r.Neutral("hidden_act", {"silu"});
  }
  r.Neutral("mlp_bias", {false});
  r.Neutral("lm_head_bias", {false});  // Phi-4-mini's config
  // Qwen2 hard-wires its q/k/v biases; Seed-OSS, Helium and GLM take them
  // from attention_bias (read above); elsewhere it would add biases to q,
  // k, v and o (ERNIE's use_bias: to the MLP's projections too).
  if (!arch.attention_bias_qkv) r.Neutral(std::string(arch.bias_key), {m.qkv_bias});
  // An explicit head_dim other than hidden_size / num_attention_heads
  // (Qwen3, Mistral-Nemo) makes q and o_proj num_attention_heads * head_dim wide.
  // null: hidden_size / num_attention_heads (Seed-OSS's and ERNIE's
  // classes say so; others would fail on it).
  const int head_dim = r.Int("head_dim", r.Has("head_dim") ? 0 : arch.gemma ? 256 : arch.default_head_dim, false);
  if (head_dim > 0 && !(m.n_head > 0 && m.n_embd % m.n_head == 0 && head_dim == m.n_embd / m.n_head)) {
    m.head_size = head_dim;
  }
  // transformers' Phi-3 and GLM turn the first partial_rotary_factor of
  // each head (the key sat beside the rope keys before transformers 5, and
  // may sit in rope_parameters since); its other decoders turn whole heads
  // whatever the key says.
  if (arch.default_partial_rotary > 0) {
    m.rope.partial_factor = r.Number("partial_rotary_factor", arch.default_partial_rotary);
  }
  if (phi3) {
    for (const char* k : {"full_attn_mod", "interpolate_factor"}) {  // Phi-4-mini's, read by its remote code only
      if (r.Get(k) != nullptr) c.notes.push_back(std::string(k) + ": ignored (transformers' Phi3 does not read it)");
    }
  } else if (arch.latent_attention) {
    r.Neutral("partial_rotary_factor", {1, 1.0});  // transformers' tables would not fit qk_rope_head_dim
  } else if (arch.default_partial_rotary == 0 && r.Get("partial_rotary_factor") != nullptr) {
    c.notes.push_back("partial_rotary_factor: ignored (" + c.architecture + " turns whole heads)");
  }
  ParseRope(r, c, arch);
  m.rope.interleaved = arch.interleaved_rope;
  if (arch.latent_attention) ParseLatentAttention(r, c, arch);
  if (arch.nope_layers) ParseNopeLayers(r, m);
  ParseSlidingWindow(r, c, arch);
}

// <i> where `name` is `prefix`<i>.<rest>, else -1.
int64_t IndexAfter(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return -1;
  int64_t i = -1;
  const char* end = name.data() + name.size();
  const auto [next, error] = std::from_chars(name.data() + prefix.size(), end, i);
  return error == std::errc() && next != end && *next == '.' ? i : -1;
}

// Whether `name` is a tensor of the multi-token-prediction layers: GLM-4.5's
// <body>layers.<i>. with n_layer <= i < n_layer + mtp_layers; ERNIE 4.5's
// <body>mtp_block.<i>. (and mtp_emb_norm, mtp_hidden_norm,
// mtp_linear_proj), whatever the config says (transformers skips them).
bool IsMtpTensor(const HfCheckpoint& c, const std::string& name) {
  if (c.ernie_moe_names) {
    for (const char* module : {"mtp_block.", "mtp_emb_norm.", "mtp_hidden_norm.", "mtp_linear_proj."}) {
      if (IndexAfter(name, c.body_prefix + module) >= 0) return true;
    }
    return false;
  }
  const int64_t i = IndexAfter(name, c.body_prefix + "layers.");
  return c.mtp_layers > 0 && i >= c.model.n_layer && i < int64_t{c.model.n_layer} + c.mtp_layers;
}

StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, "open", path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return ErrnoStatus(errno, "read", path);
  return text.str();
}

StatusOr<json> ReadJson(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadText(path));
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(path + ": not valid JSON: " + e.what());
  }
}

// The safetensors files of the folder: the index's shards, or model.safetensors.
StatusOr<std::vector<std::string>> ShardFiles(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  struct stat st {};
  if (::stat(index.c_str(), &st) != 0) {
    const std::string single = dir + "/model.safetensors";
    if (::stat(single.c_str(), &st) != 0) {
      return Status::NotFound(dir + ": neither model.safetensors nor model.safetensors.index.json");
    }
    return std::vector<std::string>{single};
  }
  ZINF_ASSIGN_OR_RETURN(json doc, ReadJson(index));
  auto map = doc.find("weight_map");
  if (map == doc.end() || !map->is_object()) return Status::InvalidArgument(index + ": no \"weight_map\" object");
  std::set<std::string> names;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) return Status::InvalidArgument(index + ": weight_map." + it.key() + " is not a file name");
    const std::string f = it->get<std::string>();
    if (f.find('/') != std::string::npos) return Status::InvalidArgument(index + ": shard \"" + f + "\" is not a name");
    names.insert(f);
  }
  std::vector<std::string> files;
  for (const std::string& f : names) files.push_back(dir + "/" + f);
  return files;
}

}  // namespace

bool HasHfWeights(const std::string& dir) {
  struct stat st {};
  return ::stat((dir + "/model.safetensors").c_str(), &st) == 0 ||
         ::stat((dir + "/model.safetensors.index.json").c_str(), &st) == 0;
}

bool IsHfModelDir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::stat((path + "/config.json").c_str(), &st) == 0;
}

namespace {

// config.json's model, architecture and notes (what OpenHfCheckpoint and
// OpenHfConfig both read); `traits_out` gets the architecture's traits.
StatusOr<HfCheckpoint> ParseHfConfig(const std::string& dir, const Architecture** traits_out) {
  HfCheckpoint c;
  c.dir = dir;
  const std::string config_path = dir + "/config.json";
  ZINF_ASSIGN_OR_RETURN(json doc, ReadJson(config_path));
  if (!doc.is_object()) return Status::InvalidArgument(config_path + ": expected a JSON object");
  auto arch = doc.find("architectures");
  if (arch == doc.end() || !arch->is_array() || arch->size() != 1 || !(*arch)[0].is_string()) {
    return Status::InvalidArgument(config_path + ": \"architectures\" must list one architecture");
  }
  c.architecture = (*arch)[0].get<std::string>();
  const Architecture* traits = FindArchitecture(c.architecture);
  // A multimodal model's language model: text_config; the other keys
  // configure the vision side, which zinf does not run.
  const json* text = &doc;
  std::string key_prefix;
  if (traits != nullptr && traits->multimodal) {
    auto t = doc.find("text_config");
    if (t == doc.end() || !t->is_object()) {
      return Status::InvalidArgument(config_path + ": " + c.architecture + " needs a \"text_config\" object");
    }
    text = &*t;
    key_prefix = "text_config";
    std::string other;
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (it.key() == "text_config" || it.key() == "architectures") continue;
      if (it.key() == "tie_word_embeddings") {
        if (*it == true) continue;
        return Status::InvalidArgument(config_path + ": tie_word_embeddings: " + it->dump() +
                                       " (zinf trains Gemma 3's tied language model)");
      }
      other += (other.empty() ? "" : ", ") + it.key();
    }
    if (!other.empty()) c.notes.push_back("ignored (the vision side; zinf trains the language model): " + other);
  }
  KeyReader r(*text, &c.notes);
  if (traits == nullptr) {
    std::string known;
    for (const Architecture& a : kArchitectures) known += (known.empty() ? "" : ", ") + std::string(a.name);
    return Status::InvalidArgument(config_path + ": architecture " + c.architecture + " is not supported (" + known +
                                   ")");
  }
  c.fused_qkv = traits->phi3;
  c.fused_gate_up = traits->phi3 || traits->fused_gate_up;
  c.glm4_norm_names = traits->glm4_norms;
  c.mixtral_names = traits->experts == Experts::kMixtral;
  c.shared_experts_names = DeepSeekRouter(traits->experts) || traits->experts == Experts::kErnie45Moe;
  c.ernie_moe_names = traits->experts == Experts::kErnie45Moe;
  if (traits->llama) {
    ParseLlama(r, c, *traits);
  } else {
    ParseGpt2(r, c);
  }
  r.Finish();
  GptConfig& m = c.model;
  if (r.errors().empty()) {
    if (m.head_size == 0 && m.n_embd % m.n_head != 0) {
      r.Error("hidden size " + std::to_string(m.n_embd) + " is not a multiple of heads");
    }
    if (m.llama() && m.n_head % m.n_kv_head != 0) {
      r.Error("num_key_value_heads " + std::to_string(m.n_kv_head) + " must divide num_attention_heads " +
              std::to_string(m.n_head));
    }
    if (m.llama() && !m.mla() && m.head_dim() % 2 != 0) {  // latent attention: ParseLatentAttention
      r.Error("head size " + std::to_string(m.head_dim()) +
              " (head_dim, or hidden_size / num_attention_heads): " + "the rotary embedding needs an even one");
    }
    const int rot = m.rope_dims();
    if (m.llama() && !m.mla() &&
        (!(m.rope.partial_factor > 0 && m.rope.partial_factor <= 1) || rot < 2 || rot % 2 != 0)) {
      r.Error("partial_rotary_factor " + json(m.rope.partial_factor).dump() + ": expected a value in (0, 1] " +
              "turning an even number (at least 2) of a head's " + std::to_string(m.head_dim()) +
              " columns; it turns " + std::to_string(rot));
    }
    for (const auto* f : {&m.rope.short_factor, &m.rope.long_factor}) {
      if (m.rope.longrope && f->size() != static_cast<size_t>(rot / 2)) {
        r.Error(std::string(f == &m.rope.short_factor ? "short_factor" : "long_factor") + ": " +
                std::to_string(f->size()) + " numbers, expected " + std::to_string(rot / 2) +
                " (half the rotated columns of a head)");
      }
    }
  }
  if (!r.errors().empty()) {
    std::string msg = config_path + " (" + c.architecture + "): " + std::to_string(r.errors().size()) + " error(s)";
    for (const std::string& e : r.errors()) msg += "\n  " + (key_prefix.empty() ? "" : "in " + key_prefix + ": ") + e;
    return Status::InvalidArgument(std::move(msg));
  }
  m.padded_vocab_size = (m.vocab_size + 63) / 64 * 64;
  *traits_out = traits;
  return c;
}

}  // namespace

StatusOr<HfCheckpoint> OpenHfConfig(const std::string& dir) {
  const Architecture* traits = nullptr;
  ZINF_ASSIGN_OR_RETURN(HfCheckpoint c, ParseHfConfig(dir, &traits));
  if (traits->multimodal) {
    return Status::InvalidArgument(dir + ": " + c.architecture +
                                   " from its config alone: its vision side has no weights to start from " +
                                   "(zinf trains the language model and copies the vision tower's)");
  }
  c.notes.push_back("from config.json alone: the weights start random");
  return c;
}

StatusOr<HfCheckpoint> OpenHfCheckpoint(const std::string& dir) {
  const Architecture* traits = nullptr;
  ZINF_ASSIGN_OR_RETURN(HfCheckpoint c, ParseHfConfig(dir, &traits));
  const GptConfig& m = c.model;

  // Tensors: every file's header; then exactly the names the blocks need.
  ZINF_ASSIGN_OR_RETURN(c.files, ShardFiles(dir));
  for (size_t f = 0; f < c.files.size(); ++f) {
    ZINF_ASSIGN_OR_RETURN(SafetensorsHeader h, ReadSafetensorsHeader(c.files[f]));
    for (SafetensorsHeader::Entry& e : h.tensors) {
      if (c.tensors.count(e.name)) {
        return Status::InvalidArgument(dir + ": tensor " + e.name + " is in two files (" +
                                       c.files[c.tensors[e.name].file] + ", " + c.files[f] + ")");
      }
      std::string name = e.name;
      c.tensors[name] = {f, std::move(e)};
    }
  }
  // A multimodal model's language model: under language_model.model. (the
  // Hub's layout, which transformers keeps on save) or model.language_model.
  if (traits->multimodal) {
    if (c.tensors.count("language_model.model.embed_tokens.weight")) {
      c.body_prefix = "language_model.model.";
      c.head_name = "language_model.lm_head.weight";
    } else if (c.tensors.count("model.language_model.embed_tokens.weight")) {
      c.body_prefix = "model.language_model.";
    } else {
      return Status::InvalidArgument(dir + ": " + c.architecture + " without its language model's embedding " +
                                     "(language_model.model.embed_tokens.weight, or " +
                                     "model.language_model.embed_tokens.weight)");
    }
  }
  // GPT-2 checkpoints come with and without the "transformer." prefix.
  if (!m.llama() && !c.tensors.count("transformer.wte.weight") && c.tensors.count("wte.weight")) {
    std::map<std::string, HfCheckpoint::Source> renamed;
    for (auto& [k, v] : c.tensors) renamed[k == "lm_head.weight" ? k : "transformer." + k] = std::move(v);
    c.tensors = std::move(renamed);
  }
  std::set<std::string> expected;
  const std::vector<BlockSpec> specs = GptBlockSpecs(m);
  for (BlockId b = 0; b < static_cast<BlockId>(specs.size()); ++b) {
    const std::vector<std::string> names = HfTensorNames(c, b);
    for (size_t t = 0; t < names.size(); ++t) {
      expected.insert(names[t]);
      std::vector<int64_t> shape = specs[b].tensors[t].shape;
      const HfRows rows = HfRowsOf(specs[b], names, t);
      if (rows.row > 0) continue;  // a fused tensor's later part: checked with its first
      shape[0] = rows.rows;
      const bool vocab_rows =
          (b == kEmbedBlock && t == 0) || (b == HeadBlock(m) && static_cast<int>(t) == LmHeadIndex(m));
      if (vocab_rows) shape[0] = m.vocab_size;
      if (!m.llama() && shape.size() == 2 && names[t].find("lm_head") == std::string::npos &&
          names[t].find(".wte.") == std::string::npos && names[t].find(".wpe.") == std::string::npos) {
        std::swap(shape[0], shape[1]);  // Conv1D: [in, out]
      }
      if (HfBiasAsRow(c, b, t)) shape.insert(shape.begin(), 1);
      auto it = c.tensors.find(names[t]);
      if (it == c.tensors.end()) {
        // transformers 5 can save the experts stacked (save_original_format
        // false): say so rather than only name the first expert.
        const size_t experts = names[t].find(".experts.");
        const bool stacked =
            experts != std::string::npos && c.tensors.count(names[t].substr(0, experts) + ".experts.gate_up_proj") > 0;
        return Status::InvalidArgument(dir + ": tensor " + names[t] + " is missing (expected shape " +
                                       ShapeText(shape) + ")" +
                                       (stacked ? "; the checkpoint stacks its experts (experts.gate_up_proj, "
                                                  "experts.down_proj), which zinf does not read: save it with "
                                                  "transformers' save_original_format=True, one tensor an expert"
                                                : ""));
      }
      const SafetensorsHeader::Entry& e = it->second.entry;
      if (e.shape != shape) {
        return Status::InvalidArgument(dir + ": tensor " + names[t] + " has shape " + ShapeText(e.shape) +
                                       ", expected " + ShapeText(shape));
      }
      if (!SafetensorsFloatType(e.dtype)) {
        return Status::InvalidArgument(dir + ": tensor " + names[t] + " has dtype " + e.dtype +
                                       " (F32, BF16 or F16 expected)");
      }
    }
  }
  const std::string body = c.body_prefix;
  for (const auto& [name, source] : c.tensors) {
    if (expected.count(name)) continue;
    if (traits->multimodal) {  // the vision tower's, the projector's
      bool vision = false;
      for (const char* root :
           {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."}) {
        vision |= name.rfind(root, 0) == 0;
      }
      if (vision) {
        c.kept.push_back(name);
        continue;
      }
    }
    if (IsMtpTensor(c, name)) {
      c.kept.push_back(name);
      continue;
    }
    const bool buffer = name.find("rotary_emb.inv_freq") != std::string::npos ||
                        (name.find(".attn.bias") != std::string::npos && !m.llama()) ||
                        name.find(".attn.masked_bias") != std::string::npos;
    if (buffer || (name == c.head_name && m.tied_embeddings)) {
      c.notes.push_back(name + ": ignored (" + (buffer ? "a buffer, not a weight" : "the head is tied") + ")");
      continue;
    }
    return Status::InvalidArgument(dir + ": tensor " + name + " (" + source.entry.dtype + " " +
                                   ShapeText(source.entry.shape) + ") is not part of a " + c.architecture);
  }
  if (!c.kept.empty()) {
    c.notes.push_back(std::to_string(c.kept.size()) + " tensors outside the model zinf trains (" +
                      (traits->multimodal ? "the vision side" : "the multi-token-prediction layers") + ", e.g. " +
                      c.kept.front() + "): not trained, copied unchanged on export");
  }
  return c;
}

StatusOr<GptConfig> HfModelAtSeqLen(const HfCheckpoint& ckpt, int seq_len) {
  GptConfig m = ckpt.model;
  if (seq_len == 0) seq_len = ckpt.max_positions;
  if (seq_len < 1 || seq_len > ckpt.max_positions) {
    return Status::InvalidArgument("sequence length " + std::to_string(seq_len) + " is outside [1, " +
                                   std::to_string(ckpt.max_positions) + "], the positions of " + ckpt.dir);
  }
  if (m.sliding_window >= seq_len) {  // every query sees every earlier key: no window
    m.sliding_window = 0;
    m.sliding_layers.clear();
  }
  if (!m.llama() && seq_len != ckpt.max_positions) {
    return Status::InvalidArgument("GPT-2 " + ckpt.dir + ": the sequence length must be n_positions (" +
                                   std::to_string(ckpt.max_positions) + "), got " + std::to_string(seq_len));
  }
  m.seq_len = seq_len;
  return m;
}

std::vector<std::string> HfTensorNames(const HfCheckpoint& ckpt, BlockId block) {
  const GptConfig& m = ckpt.model;
  const BlockId head = HeadBlock(m);
  if (!m.llama()) {
    if (block == kEmbedBlock) return {"transformer.wte.weight", "transformer.wpe.weight"};
    if (block == head) {
      std::vector<std::string> n = {"transformer.ln_f.weight", "transformer.ln_f.bias"};
      if (!m.tied_embeddings) n.push_back("lm_head.weight");
      return n;
    }
    const std::string h = "transformer.h." + std::to_string(block - 1) + ".";
    return {h + "ln_1.weight",        h + "ln_1.bias",        h + "attn.c_attn.weight", h + "attn.c_attn.bias",
            h + "attn.c_proj.weight", h + "attn.c_proj.bias", h + "ln_2.weight",        h + "ln_2.bias",
            h + "mlp.c_fc.weight",    h + "mlp.c_fc.bias",    h + "mlp.c_proj.weight",  h + "mlp.c_proj.bias"};
  }
  const std::string& body = ckpt.body_prefix;
  if (block == kEmbedBlock) return {body + "embed_tokens.weight"};
  if (block == head) {
    std::vector<std::string> n = {body + "norm.weight"};
    if (!m.tied_embeddings) n.push_back(ckpt.head_name);
    return n;
  }
  const std::string l = body + "layers." + std::to_string(block - 1) + ".";
  std::vector<std::string> n = {
      l + "input_layernorm.weight",  l + "self_attn.q_proj.weight", l + "self_attn.k_proj.weight",
      l + "self_attn.v_proj.weight", l + "self_attn.o_proj.weight", l + "post_attention_layernorm.weight",
      l + "mlp.gate_proj.weight",    l + "mlp.up_proj.weight",      l + "mlp.down_proj.weight"};
  if (m.qkv_bias) {
    for (const char* p : {"q", "k", "v"}) n.push_back(l + "self_attn." + p + "_proj.bias");
  }
  if (m.qk_norm) {
    for (const char* p : {"q", "k"}) n.push_back(l + "self_attn." + p + "_norm.weight");
  }
  if (m.mla()) {  // DeepSeek-V3's latent attention (LatentIndex)
    const std::string a = l + "self_attn.";
    if (m.q_lora_rank > 0) n[kQW] = a + "q_a_proj.weight";
    n[kKW] = a + "kv_a_proj_with_mqa.weight";
    n[kVW] = a + "kv_b_proj.weight";
    n.push_back(a + "kv_a_layernorm.weight");
    if (m.q_lora_rank > 0) {
      n.push_back(a + "q_a_layernorm.weight");
      n.push_back(a + "q_b_proj.weight");
    }
  }
  if (m.post_norms) {  // OLMo 2: the outputs' norms in the input norms' places
    n[kAttnNormW] = l + "post_attention_layernorm.weight";
    n[kMlpNormW] = l + "post_feedforward_layernorm.weight";
  }
  if (m.sandwich_norms && ckpt.glm4_norm_names) {  // GLM-4: the MLP's input norm keeps Llama's name
    n.push_back(l + "post_self_attn_layernorm.weight");
    n.push_back(l + "post_mlp_layernorm.weight");
  } else if (m.sandwich_norms) {  // Gemma 2, 3: the MLP's input norm is "pre-feedforward"
    n[kMlpNormW] = l + "pre_feedforward_layernorm.weight";
    n.push_back(l + "post_attention_layernorm.weight");
    n.push_back(l + "post_feedforward_layernorm.weight");
  }
  if (m.moe_in(block - 1)) {  // a dense layer among routed ones keeps the names above
    const std::string moe = l + (ckpt.mixtral_names ? "block_sparse_moe." : "mlp.");
    const std::array<const char*, 3> kind = ckpt.mixtral_names
                                                ? std::array<const char*, 3>{"w1", "w3", "w2"}
                                                : std::array<const char*, 3>{"gate_proj", "up_proj", "down_proj"};
    n.resize(static_cast<size_t>(RoutedLayerTensors(m)));
    for (int e = 0; e < m.n_experts; ++e) {
      for (int w = 0; w < 3; ++w) {
        n[static_cast<size_t>(ExpertTensor(m, e, w))] =
            moe + "experts." + std::to_string(e) + "." + kind[static_cast<size_t>(w)] + ".weight";
      }
    }
    n[static_cast<size_t>(RouterIndex(m))] = moe + "gate.weight";
    if (m.router_bias) {
      n[static_cast<size_t>(RouterBiasIndex(m))] =
          moe + (ckpt.ernie_moe_names ? "moe_statics." : "gate.") + "e_score_correction_bias";
    }
    if (m.shared_expert()) {  // Qwen2-MoE's, GLM-4.5's, ERNIE 4.5's
      constexpr std::array<const char*, 3> kProj = {"gate_proj", "up_proj", "down_proj"};
      const std::string shared = ckpt.shared_experts_names ? "shared_experts." : "shared_expert.";
      for (int w = 0; w < 3; ++w) {
        n[static_cast<size_t>(SharedExpertTensor(m, w))] = moe + shared + kProj[static_cast<size_t>(w)] + ".weight";
      }
      if (m.shared_expert_gate) n[static_cast<size_t>(SharedGateIndex(m))] = moe + "shared_expert_gate.weight";
    }
  }
  if (ckpt.fused_qkv) n[kQW] = n[kKW] = n[kVW] = l + "self_attn.qkv_proj.weight";
  if (ckpt.fused_gate_up) n[kGateW] = n[kUpW] = l + "mlp.gate_up_proj.weight";
  return n;
}

bool HfBiasAsRow(const HfCheckpoint& ckpt, BlockId block, size_t t) {
  const GptConfig& m = ckpt.model;
  return ckpt.ernie_moe_names && m.router_bias && block != kEmbedBlock && block != HeadBlock(m) &&
         m.moe_in(block - 1) && static_cast<int>(t) == RouterBiasIndex(m);
}

HfRows HfRowsOf(const BlockSpec& spec, const std::vector<std::string>& names, size_t t) {
  HfRows r;
  size_t first = t, end = t + 1;
  while (first > 0 && names[first - 1] == names[t]) --first;
  while (end < names.size() && names[end] == names[t]) ++end;
  r.fused = end - first > 1;
  for (size_t i = first; i < end; ++i) {
    const int64_t rows = spec.tensors[i].shape.empty() ? 1 : spec.tensors[i].shape[0];
    if (i < t) r.row += rows;
    r.rows += rows;
  }
  return r;
}

namespace {

// One file mapped read-only; pages are dropped after each tensor.
class MappedFile {
 public:
  static StatusOr<MappedFile> Open(const std::string& path, uint64_t bytes) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "open", path);
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) return ErrnoStatus(err, "mmap", path);
    return MappedFile(static_cast<const std::byte*>(p), bytes);
  }
  MappedFile(MappedFile&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(o.bytes_) {}
  MappedFile& operator=(MappedFile&&) = delete;
  ~MappedFile() {
    if (base_ != nullptr) ::munmap(const_cast<std::byte*>(base_), bytes_);
  }
  const std::byte* data() const { return base_; }
  // The page cache keeps the file; this mapping lets go of the range.
  void Drop(uint64_t begin, uint64_t end) const {
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t b = begin / page * page;
    ::madvise(const_cast<std::byte*>(base_) + b, end - b, MADV_DONTNEED);
  }

 private:
  MappedFile(const std::byte* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  const std::byte* base_;
  uint64_t bytes_;
};

float ElementAt(const std::byte* p, ElementType type, int64_t i) {
  if (type == ElementType::kF32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return type == ElementType::kBf16 ? Bf16ToFloat(h) : HalfToFloat(h);
}

// Stored elements [at, at + count) as fp32: the kernels' cast (the type
// looked at once, on OpenMP's threads, which also take the mapped file's
// page faults side by side; it needs no alignment, which the safetensors
// format does not promise).
void ReadElements(const std::byte* p, ElementType type, int64_t at, int64_t count, float* out) {
  kernels::cpu::CastIn(out, p + ElementSizeBytes(type) * at, type, count);
}

// Elements [first, first + count) of the [cols, rows] transpose of a stored
// [rows, cols] matrix, as fp32: the output rows the range holds whole by
// the kernels' tiled transpose (element by element, each read a stored row
// apart, waits for memory); the partial first and last rows one by one.
void ReadTransposed(const std::byte* p, ElementType type, int64_t rows, int64_t cols, int64_t first, int64_t count,
                    float* out) {
  const int64_t end = first + count;
  auto one_by_one = [&](int64_t j0, int64_t j1) {  // j: row j / rows, column j % rows of the output
    for (int64_t j = j0; j < j1; ++j) out[j - first] = ElementAt(p, type, (j % rows) * cols + j / rows);
  };
  const int64_t whole0 = (first + rows - 1) / rows, whole1 = end / rows;  // output rows inside the range
  if (whole0 >= whole1) {
    one_by_one(first, end);
    return;
  }
  one_by_one(first, whole0 * rows);
  one_by_one(whole1 * rows, end);
  kernels::cpu::TransposeCast(out + (whole0 * rows - first), ElementType::kF32, p, type, rows, cols, whole0, whole1);
}

}  // namespace

Status ReadHfTensor(const HfCheckpoint& ckpt, const GptConfig& model, BlockId block, const BlockSpec& spec, size_t t,
                    int64_t first, int64_t count, float* out) {
  if (t >= spec.tensors.size() || first < 0 || count < 0 || first + count > spec.tensors[t].numel()) {
    return Status::InvalidArgument("ReadHfTensor: tensor " + std::to_string(t) + " elements [" + std::to_string(first) +
                                   ", " + std::to_string(first + count) + ") of block " + std::to_string(block) +
                                   " out of range");
  }
  const std::vector<std::string> names = HfTensorNames(ckpt, block);
  if (names.size() != spec.tensors.size()) {
    return Status::InvalidArgument("ReadHfTensor: block " + std::to_string(block) + " has " +
                                   std::to_string(names.size()) + " checkpoint tensors, its spec " +
                                   std::to_string(spec.tensors.size()));
  }
  const HfCheckpoint::Source& src = ckpt.tensors.at(names[t]);
  const SafetensorsHeader::Entry& e = src.entry;
  ZINF_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(ckpt.files[src.file], e.end));
  const std::byte* p = file.data() + e.begin;
  const ElementType type = *SafetensorsFloatType(e.dtype);  // F32, BF16 or F16: checked at open
  const bool conv1d = !model.llama() && e.shape.size() == 2 && names[t].find(".h.") != std::string::npos;
  const HfRows rows = HfRowsOf(spec, names, t);
  if (rows.fused) {  // this tensor's rows of the fused one
    ReadElements(p, type, rows.row * (spec.tensors[t].numel() / spec.tensors[t].shape[0]) + first, count, out);
  } else if (conv1d) {  // stored [in, out]; the engine keeps [out, in]
    ReadTransposed(p, type, e.shape[0], e.shape[1], first, count, out);
  } else {
    // Same layout; the vocabulary padding rows (beyond the file's) are 0.
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    const int64_t stored = std::clamp<int64_t>(n - first, 0, count);
    ReadElements(p, type, first, stored, out);
    std::fill(out + stored, out + count, 0.0f);
  }
  file.Drop(e.begin, e.end);
  return Status::Ok();
}

StatusOr<std::vector<std::vector<float>>> ReadHfBlock(const HfCheckpoint& ckpt, const GptConfig& model, BlockId block) {
  const std::vector<BlockSpec> specs = GptBlockSpecs(model);
  if (block < 0 || block >= static_cast<BlockId>(specs.size())) {
    return Status::InvalidArgument("ReadHfBlock: block " + std::to_string(block) + " out of range");
  }
  const BlockSpec& spec = specs[static_cast<size_t>(block)];
  std::vector<std::vector<float>> out;
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    std::vector<float> w(static_cast<size_t>(spec.tensors[t].numel()));
    ZINF_RETURN_IF_ERROR(ReadHfTensor(ckpt, model, block, spec, t, 0, spec.tensors[t].numel(), w.data()));
    out.push_back(std::move(w));
  }
  return out;
}

std::function<Status(BlockId, size_t, int64_t, int64_t, float*)> ModelSource::InitialWeights() const {
  if (hf == nullptr || hf->files.empty()) return {};  // random (a built-in, JSON, or a folder's config alone)
  return [ckpt = hf, model = model, specs = GptBlockSpecs(model)](BlockId b, size_t t, int64_t first, int64_t count,
                                                                  float* out) {
    if (b < 0 || b >= static_cast<BlockId>(specs.size())) {
      return Status::InvalidArgument("initial weights: block " + std::to_string(b) + " out of range");
    }
    return ReadHfTensor(*ckpt, model, b, specs[static_cast<size_t>(b)], t, first, count, out);
  };
}

Status ModelSource::HintSeqLen(const Status& s) const {
  // GPT-2 trains at n_positions only (its position table): no hint to give.
  if (s.ok() || hf == nullptr || !default_seq_len || !model.llama()) return s;
  const bool memory = s.code() == StatusCode::kOutOfMemory;
  const bool data = s.code() == StatusCode::kInvalidArgument && s.message().rfind("data loader:", 0) == 0;
  if (!memory && !data) return s;
  return Status(s.code(), s.message() + "; the sequence length " + std::to_string(model.seq_len) + " is " + hf->dir +
                              "'s max_position_embeddings, the default for a HF model" +
                              (memory ? " (activations grow with it)" : "") +
                              ": give a shorter one with --seq-len (e.g. --seq-len 2048)");
}

StatusOr<ModelSource> ResolveModel(const std::string& value, int seq_len, bool from_config) {
  ModelSource s;
  if (from_config && !IsHfModelDir(value)) {
    return Status::InvalidArgument(value + ": a config alone is read from a Hugging Face model folder (config.json)");
  }
  if (IsHfModelDir(value)) {
    ZINF_ASSIGN_OR_RETURN(HfCheckpoint c, from_config ? OpenHfConfig(value) : OpenHfCheckpoint(value));
    ZINF_ASSIGN_OR_RETURN(s.model, HfModelAtSeqLen(c, seq_len));
    s.description = value + " (" + c.architecture + (from_config ? ", random weights" : "") + ")";
    s.default_seq_len = seq_len == 0;
    s.hf = std::make_shared<const HfCheckpoint>(std::move(c));
    return s;
  }
  ZINF_ASSIGN_OR_RETURN(s.model, LoadGptConfig(value));
  if (seq_len > 0) s.model.seq_len = seq_len;
  s.description = value;
  return s;
}

}  // namespace zinf::model
