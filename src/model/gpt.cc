// The reference GPT (see gpt.h): config, block layout, initial weights, and
// GptCompute, which runs the blocks on Ops, its activations checkpointed per
// layer or kept.
//
// Memory plan of GptCompute (elements of T; N = B*T positions):
//   kept across the step   x_0 .. x_L        (L+1) * N*C   (layer inputs;
//                                                           kOffload: 3 on
//                                                           the device, all
//                                                           in pinned host
//                                                           memory)
//   one layer, reused      ln1, ln2, atty, mid             4 * N*C
//   (every layer: kKeep)   qkv                             3 * N*C
//                          fch, fch_gelu                   8 * N*C
//                          att                             B*NH*T*T (fused
//                                                           attention: B*NH*T)
//                          LayerNorm mean / rstd           4 * N
//                          latent attention: its latents   2 * N*(rq + rkv)
//                          (mla()) before and after their  + 2 * N
//                          norms, rstds; the values        + N*NH*dv
//   shared                 attention scratch               B*NH*T fused (CpuOps,
//                                                           CudaOps 16-bit);
//                                                           7*N*C + B*NH*T*T
//                                                           (CudaOps fp32)
//   head                   lnf (+ mean / rstd)             N*C + 2N
//                          logits, dlogits                 2 * rows * Vp
//                          losses                          N
//   gradients              d residual, d [N, C], d [N, 4C] 6 * N*C
//   latent attention       projections' outputs, then      N*(A + rkv + dr
//   (mla())                their gradients; the latents'   + NH*(dn + dv))
//                          gradients                       + 2 * N*max(rq, rkv)
// The head runs over the positions in chunks of `rows` (as many as fit in
// kHeadChunkBytes), so a 50k vocabulary does not cost N * Vp twice: the
// logits of a chunk are made, turned into their gradient, and pushed through
// the lm_head matmul before the next chunk. Layer-internal gradient buffers
// reuse forward buffers whose contents the backward has finished with (see
// LayerBackward).
#include "model/gpt.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "aio/pinned_pool.h"
#include "core/check.h"
#include "device/device.h"

namespace zinf::model {

using nlohmann::json;

// ---------------------------------------------------------------- config

int64_t GptConfig::NumParameters() const {
  const int64_t C = n_embd;
  if (llama()) {
    const int64_t kv = static_cast<int64_t>(n_kv_head) * head_dim(), I = intermediate_size, A = attn_width();
    int64_t attn = 2 * C + 2 * A * C + 2 * kv * C + (qkv_bias ? A + 2 * kv : 0) +
                   (qk_norm ? q_norm_width() + k_norm_width() : 0) + (sandwich_norms ? 2 * C : 0);
    if (mla()) {  // q (through its latent), the kv latent and its norm, kv_b_proj, o_proj
      const int64_t rq = q_lora_rank, rkv = kv_lora_rank;
      attn = 2 * C + (rq > 0 ? rq * C + rq + A * rq : A * C) + kv_a_width() * C + rkv + kv_b_width() * rkv +
             C * attn_out_width() + (sandwich_norms ? 2 * C : 0);
    }
    // A routed layer's MLP: the experts, the router, a shared expert.
    const int64_t shared = shared_expert() ? 3 * int64_t{shared_expert_size} * C + (shared_expert_gate ? C : 0) : 0;
    const int64_t routed = n_experts * 3 * I * C + n_experts * C + (router_bias ? n_experts : 0) + shared;
    const int64_t dense = 3 * int64_t{dense_width()} * C;
    const int64_t routed_count = routed_layers();
    const int64_t vocab = static_cast<int64_t>(padded_vocab_size) * C;
    return vocab + n_layer * attn + routed_count * routed + (n_layer - routed_count) * dense + C +
           (tied_embeddings ? 0 : vocab);
  }
  const int64_t embed = static_cast<int64_t>(padded_vocab_size) * C + static_cast<int64_t>(seq_len) * C;
  // ln1 2C, qkv 3C*C + 3C, proj C*C + C, ln2 2C, fc 4C*C + 4C, fc_proj 4C*C + C.
  const int64_t layer = 12 * C * C + 13 * C;
  const int64_t head = 2 * C + (tied_embeddings ? 0 : static_cast<int64_t>(padded_vocab_size) * C);
  return embed + n_layer * layer + head;
}

int64_t GptConfig::ActiveParameters() const {
  const int64_t idle = moe() ? int64_t{n_experts - experts_per_token} * 3 * intermediate_size * n_embd : 0;
  return NumParameters() - routed_layers() * idle;
}

namespace {

constexpr int kVocabAlign = 64;

int PaddedVocab(int vocab_size) { return (vocab_size + kVocabAlign - 1) / kVocabAlign * kVocabAlign; }

GptConfig MakeConfig(int vocab, int seq_len, int n_layer, int n_head, int n_embd) {
  GptConfig c;
  c.vocab_size = vocab;
  c.padded_vocab_size = PaddedVocab(vocab);
  c.seq_len = seq_len;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_embd = n_embd;
  c.tied_embeddings = true;
  return c;
}

const std::vector<std::pair<std::string, GptConfig>>& Builtins() {
  static const std::vector<std::pair<std::string, GptConfig>> kBuiltins = {
      {"tiny", MakeConfig(257, 32, 2, 2, 32)},
      {"demo", MakeConfig(257, 64, 6, 4, 256)},
      {"small", MakeConfig(257, 256, 6, 6, 384)},
      {"gpt2-124m", MakeConfig(50257, 1024, 12, 12, 768)},
      // Planning shapes (`zinf plan`, `config-check --model`), far beyond one
      // machine's RAM: GPT-3 175B (96 layers x 12288, head size 128), and
      // the 100B shape GptConfigForParameterCount derives (C = 10240, 79 layers).
      {"100B", MakeConfig(50257, 2048, 79, 80, 10240)},
      {"175B", MakeConfig(50257, 2048, 96, 96, 12288)},
  };
  return kBuiltins;
}

std::string Describe(const json& v) {
  if (v.is_string()) return "\"" + v.get<std::string>() + "\"";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "a list";
  return v.dump();
}

// Upper bounds keep every size the kernels compute (Vp*C, 4C*C, B*NH*T*T)
// far from overflowing and catch typos (an extra digit) early.
struct IntKey {
  const char* key;
  int GptConfig::*field;
  int64_t max;
};
constexpr IntKey kIntKeys[] = {
    {"vocab_size", &GptConfig::vocab_size, 1 << 24}, {"seq_len", &GptConfig::seq_len, 1 << 20},
    {"n_layer", &GptConfig::n_layer, 1 << 14},       {"n_head", &GptConfig::n_head, 1 << 12},
    {"n_embd", &GptConfig::n_embd, 1 << 16},
};

}  // namespace

StatusOr<GptConfig> ParseGptConfig(const std::string& json_text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(json_text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    return Status::InvalidArgument(source + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object()) return Status::InvalidArgument(source + ": expected a JSON object at the top level");

  GptConfig config;
  std::vector<std::string> errors;
  std::set<std::string> known;
  for (const IntKey& k : kIntKeys) {
    known.insert(k.key);
    auto it = doc.find(k.key);
    if (it == doc.end()) {
      errors.push_back(std::string(k.key) + ": missing (an integer is required)");
      continue;
    }
    const std::string range = "expected an integer in [1, " + std::to_string(k.max) + "]";
    if (!it->is_number_integer()) {
      errors.push_back(std::string(k.key) + ": " + range + ", got " + Describe(*it));
      continue;
    }
    // is_number_integer covers both signed and unsigned storage.
    const bool negative = it->is_number_unsigned() ? false : it->get<int64_t>() < 1;
    const uint64_t v = negative ? 0 : it->get<uint64_t>();
    if (negative || v < 1 || v > static_cast<uint64_t>(k.max)) {
      errors.push_back(std::string(k.key) + ": " + range + ", got " + Describe(*it));
      continue;
    }
    config.*(k.field) = static_cast<int>(v);
  }
  known.insert("tied_embeddings");
  if (auto it = doc.find("tied_embeddings"); it != doc.end()) {
    if (it->is_boolean()) {
      config.tied_embeddings = it->get<bool>();
    } else {
      errors.push_back("tied_embeddings: expected true or false, got " + Describe(*it));
    }
  }
  config.padded_vocab_size = PaddedVocab(config.vocab_size);
  // Derived, but accepted when it agrees, so GptConfig dumps round-trip.
  known.insert("padded_vocab_size");
  if (auto it = doc.find("padded_vocab_size"); it != doc.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() != config.padded_vocab_size) {
      errors.push_back("padded_vocab_size: derived from vocab_size (" + std::to_string(config.padded_vocab_size) +
                       "); got " + Describe(*it));
    }
  }
  if (errors.empty() && config.n_embd % config.n_head != 0) {
    errors.push_back("n_embd: " + std::to_string(config.n_embd) + " is not a multiple of n_head " +
                     std::to_string(config.n_head));
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (known.count(it.key()) == 0) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      errors.push_back(it.key() + ": unknown key (known: " + list + ")");
    }
  }
  if (!errors.empty()) {
    std::string msg = source + ": " + std::to_string(errors.size()) + " error(s) in model config";
    for (const std::string& e : errors) msg += "\n  " + e;
    return Status::InvalidArgument(std::move(msg));
  }
  return config;
}

StatusOr<GptConfig> LoadGptConfig(const std::string& name_or_path) {
  for (const auto& [name, config] : Builtins()) {
    if (name == name_or_path) return config;
  }
  std::ifstream in(name_or_path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) {
      std::string names;
      for (const std::string& n : BuiltinGptConfigNames()) names += (names.empty() ? "" : ", ") + n;
      return Status::NotFound("model config \"" + name_or_path + "\": neither a built-in (" + names +
                              ") nor an existing file");
    }
    return ErrnoStatus(errno, "open model config", name_or_path);
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return ErrnoStatus(errno, "read model config", name_or_path);
  return ParseGptConfig(text.str(), name_or_path);
}

std::vector<std::string> BuiltinGptConfigNames() {
  std::vector<std::string> names;
  for (const auto& b : Builtins()) names.push_back(b.first);
  return names;
}

int GptConfig::rope_dims_in(int layer) const {
  return std::binary_search(no_rope_layers.begin(), no_rope_layers.end(), layer) ? 0 : rope_dims();
}

namespace {
// `layers`: distinct layer indices of an n_layer model, ascending.
bool AscendingLayers(const std::vector<int>& layers, int n_layer) {
  return std::is_sorted(layers.begin(), layers.end()) &&
         std::adjacent_find(layers.begin(), layers.end()) == layers.end() &&
         (layers.empty() || (layers.front() >= 0 && layers.back() < n_layer));
}
// A positive value the kernels' float holds, its reciprocal too (the range
// is checked in double: a cast of a double past float's range is undefined).
bool PositiveInFloat(double v) {
  return v >= static_cast<double>(std::numeric_limits<float>::min()) &&
         v <= static_cast<double>(std::numeric_limits<float>::max());
}
// A softcap: 0 (none), or positive in float.
bool SoftcapValid(double cap) { return cap == 0 || PositiveInFloat(cap); }
// A multiplier: positive in float.
bool MultiplierValid(double m) { return PositiveInFloat(m); }
// YaRN's parameters: its ramp takes logarithms of theta and of the turns.
bool YarnValid(const RopeConfig& r) {
  return PositiveInFloat(r.factor) && PositiveInFloat(r.attention_factor) && r.theta > 1 && std::isfinite(r.theta) &&
         r.beta_fast > 0 && std::isfinite(r.beta_fast) && r.beta_slow > 0 && std::isfinite(r.beta_slow) &&
         r.original_max_position >= 1;
}
}  // namespace

bool GptConfig::moe_in(int layer) const {
  return moe() && !std::binary_search(dense_layers.begin(), dense_layers.end(), layer);
}

int GptConfig::window_in(int layer) const {
  return std::binary_search(sliding_layers.begin(), sliding_layers.end(), layer) ? sliding_window : 0;
}

bool GptConfig::local_rope_in(int layer) const {
  return local_rope_theta > 0 && std::binary_search(local_rope_layers.begin(), local_rope_layers.end(), layer);
}

std::string GptConfigToJson(const GptConfig& config) {
  json j = json::object();
  j["vocab_size"] = config.vocab_size;
  j["seq_len"] = config.seq_len;
  j["n_layer"] = config.n_layer;
  j["n_head"] = config.n_head;
  j["n_embd"] = config.n_embd;
  j["tied_embeddings"] = config.tied_embeddings;
  if (config.llama()) {
    j["family"] = "llama";
    j["n_kv_head"] = config.n_kv_head;
    j["intermediate_size"] = config.intermediate_size;
    j["qkv_bias"] = config.qkv_bias;
    if (config.head_size > 0) j["head_size"] = config.head_size;
    if (config.qk_norm) j["qk_norm"] = true;
    j["norm_eps"] = config.norm_eps;
    j["rope_theta"] = config.rope.theta;
    if (config.rope.llama3) {
      j["rope_llama3"] = {{"factor", config.rope.factor},
                          {"low_freq_factor", config.rope.low_freq_factor},
                          {"high_freq_factor", config.rope.high_freq_factor},
                          {"original_max_position_embeddings", config.rope.original_max_position}};
    }
    if (config.rope.partial_factor != 1.0) j["partial_rotary_factor"] = config.rope.partial_factor;
    if (config.rope.longrope) {
      j["rope_longrope"] = {{"short_factor", config.rope.short_factor},
                            {"long_factor", config.rope.long_factor},
                            {"attention_factor", config.rope.attention_factor},
                            {"original_max_position_embeddings", config.rope.original_max_position}};
    }
    if (!config.no_rope_layers.empty()) j["no_rope_layers"] = config.no_rope_layers;
    if (config.rope.linear) j["rope_linear_factor"] = config.rope.factor;
    if (config.rope.interleaved) j["rope_interleaved"] = true;
    if (config.rope.yarn) {
      j["rope_yarn"] = {{"factor", config.rope.factor},
                        {"attention_factor", config.rope.attention_factor},
                        {"beta_fast", config.rope.beta_fast},
                        {"beta_slow", config.rope.beta_slow},
                        {"truncate", config.rope.truncate},
                        {"original_max_position_embeddings", config.rope.original_max_position}};
    }
    if (config.norm_unit_offset) j["norm_unit_offset"] = true;
    if (config.mlp_glu == kernels::Glu::kGeluTanh) j["mlp_activation"] = "gelu_tanh";
    if (config.embed_scale) j["embed_scale"] = true;
    if (config.attn_scalar > 0) j["attn_scalar"] = config.attn_scalar;
    if (config.sandwich_norms) j["sandwich_norms"] = true;
    if (config.post_norms) j["post_norms"] = true;
    if (config.qk_norm_all_heads) j["qk_norm_all_heads"] = true;
    if (config.attn_softcap > 0) j["attn_softcap"] = config.attn_softcap;
    if (config.final_softcap > 0) j["final_softcap"] = config.final_softcap;
    if (config.embed_multiplier != 1) j["embed_multiplier"] = config.embed_multiplier;
    if (config.residual_multiplier != 1) j["residual_multiplier"] = config.residual_multiplier;
    if (config.logits_scaling != 1) j["logits_scaling"] = config.logits_scaling;
    if (!config.local_rope_layers.empty()) {
      j["local_rope_theta"] = config.local_rope_theta;
      j["local_rope_layers"] = config.local_rope_layers;
    }
    if (config.padding_token >= 0) j["padding_token"] = config.padding_token;
    if (config.mla()) {
      j["kv_lora_rank"] = config.kv_lora_rank;
      j["q_lora_rank"] = config.q_lora_rank;
      j["qk_rope_head_dim"] = config.qk_rope_head_dim;
      j["v_head_dim"] = config.v_head_dim;
      j["latent_norm_eps"] = config.latent_norm_eps;
    }
    if (config.moe()) {
      j["n_experts"] = config.n_experts;
      j["experts_per_token"] = config.experts_per_token;
      j["norm_topk_prob"] = config.norm_topk_prob;
    }
    if (config.sigmoid_router()) {  // its bias implied (GptCompute::Create)
      j["router_scoring"] = "sigmoid";
      j["router_groups"] = config.router_groups;
      j["router_topk_groups"] = config.router_topk_groups;
    } else if (config.router_bias) {
      j["router_bias"] = true;
    } else if (config.router_groups > 1) {  // DeepSeek-V2's softmax in groups
      j["router_groups"] = config.router_groups;
      j["router_topk_groups"] = config.router_topk_groups;
    }
    if (config.router_groups > 1 && config.router_group_best != 2) j["router_group_best"] = config.router_group_best;
    if (config.router_fp32 && !config.router_bias) j["router_fp32"] = true;
    if (config.router_norm_min != 0) j["router_norm_min"] = config.router_norm_min;
    if (config.routed_scale != 1) j["routed_scale"] = config.routed_scale;
    if (config.shared_expert() || config.shared_expert_gate) {
      j["shared_expert_size"] = config.shared_expert_size;
      j["shared_expert_gate"] = config.shared_expert_gate;
    }
    if (!config.dense_layers.empty()) {
      j["dense_layers"] = config.dense_layers;
      j["dense_intermediate_size"] = config.dense_intermediate_size;
    }
  }
  if (!config.sliding_layers.empty()) {
    j["sliding_window"] = config.sliding_window;
    j["sliding_layers"] = config.sliding_layers;
  }
  return j.dump(2);
}

std::string AttentionNote(const GptConfig& config) {
  if (!config.mla()) return "";
  return " (latent attention: kv rank " + std::to_string(config.kv_lora_rank) +
         (config.q_lora_rank > 0 ? ", q rank " + std::to_string(config.q_lora_rank) : "") + ")";
}

// ---------------------------------------------------------------- blocks

namespace {

std::vector<BlockSpec> LlamaBlockSpecs(const GptConfig& config) {
  const int64_t C = config.n_embd, Vp = config.padded_vocab_size;
  const int64_t A = config.attn_width(), Ckv = static_cast<int64_t>(config.n_kv_head) * config.head_dim();
  std::vector<BlockSpec> specs;
  specs.push_back({"embed", {{"embed_tokens", {Vp, C}}}});
  // With sandwich norms the MLP's input norm is Gemma's "pre-feedforward"
  // one and "post-attention" names the attention output's own.
  // With post norms (OLMo 2) the first norm is the attention output's, the
  // second the MLP output's.
  const char* attn_norm = config.post_norms ? "post_attention_layernorm.weight" : "input_layernorm.weight";
  const char* mlp_norm = config.post_norms       ? "post_feedforward_layernorm.weight"
                         : config.sandwich_norms ? "pre_feedforward_layernorm.weight"
                                                 : "post_attention_layernorm.weight";
  // An MoE layer's experts are gated MLPs of width I, expert 0 where a
  // dense layer's MLP is (ExpertTensor); a dense layer among them has its
  // own width.
  for (int l = 0; l < config.n_layer; ++l) {
    const bool routed = config.moe_in(l);
    const std::string mlp = routed ? "experts.0." : "";
    const int64_t I = routed ? config.intermediate_size : config.dense_width();
    BlockSpec b{"layer." + std::to_string(l),
                {{attn_norm, {C}},
                 {"q_proj.weight", {A, C}},
                 {"k_proj.weight", {Ckv, C}},
                 {"v_proj.weight", {Ckv, C}},
                 {"o_proj.weight", {C, A}},
                 {mlp_norm, {C}},
                 {mlp + "gate_proj.weight", {I, C}},
                 {mlp + "up_proj.weight", {I, C}},
                 {mlp + "down_proj.weight", {C, I}}}};
    if (config.mla()) {
      const int64_t rq = config.q_lora_rank, rkv = config.kv_lora_rank;
      if (rq > 0) b.tensors[kQW] = {"q_a_proj.weight", {rq, C}};
      b.tensors[kKW] = {"kv_a_proj_with_mqa.weight", {config.kv_a_width(), C}};
      b.tensors[kVW] = {"kv_b_proj.weight", {config.kv_b_width(), rkv}};
      b.tensors[kOW] = {"o_proj.weight", {C, config.attn_out_width()}};
    }
    if (config.qkv_bias) {
      b.tensors.push_back({"q_proj.bias", {A}});
      b.tensors.push_back({"k_proj.bias", {Ckv}});
      b.tensors.push_back({"v_proj.bias", {Ckv}});
    }
    if (config.qk_norm) {
      b.tensors.push_back({"q_norm.weight", {config.q_norm_width()}});
      b.tensors.push_back({"k_norm.weight", {config.k_norm_width()}});
    }
    if (config.mla()) {
      b.tensors.push_back({"kv_a_layernorm.weight", {config.kv_lora_rank}});
      if (config.q_lora_rank > 0) {
        b.tensors.push_back({"q_a_layernorm.weight", {config.q_lora_rank}});
        b.tensors.push_back({"q_b_proj.weight", {A, config.q_lora_rank}});
      }
    }
    if (config.sandwich_norms) {
      b.tensors.push_back({"post_attention_layernorm.weight", {C}});
      b.tensors.push_back({"post_feedforward_layernorm.weight", {C}});
    }
    if (!routed) {
      specs.push_back(std::move(b));
      continue;
    }
    for (int e = 1; e < config.n_experts; ++e) {
      const std::string x = "experts." + std::to_string(e) + ".";
      b.tensors.push_back({x + "gate_proj.weight", {I, C}});
      b.tensors.push_back({x + "up_proj.weight", {I, C}});
      b.tensors.push_back({x + "down_proj.weight", {C, I}});
    }
    b.tensors.push_back({"router.weight", {config.n_experts, C}});
    if (config.router_bias) b.tensors.push_back({"router.score_correction_bias", {config.n_experts}});
    if (config.shared_expert()) {
      const int64_t S = config.shared_expert_size;
      b.tensors.push_back({"shared_expert.gate_proj.weight", {S, C}});
      b.tensors.push_back({"shared_expert.up_proj.weight", {S, C}});
      b.tensors.push_back({"shared_expert.down_proj.weight", {C, S}});
      if (config.shared_expert_gate) b.tensors.push_back({"shared_expert_gate.weight", {1, C}});
    }
    specs.push_back(std::move(b));
  }
  BlockSpec head{"head", {{"norm.weight", {C}}}};
  if (!config.tied_embeddings) head.tensors.push_back({"lm_head", {Vp, C}});
  specs.push_back(std::move(head));
  return specs;
}

// Whether routed-layer tensor `tensor` is the weight of a router kept in
// fp32 (router_fp32, or one with a selection bias), or that bias: kept in
// fp32 by transformers, never a 16-bit layer matrix.
bool Fp32RouterTensor(const GptConfig& config, int tensor) {
  return ((config.router_fp32 || config.router_bias) && tensor == RouterIndex(config)) ||
         (config.router_bias && tensor == RouterBiasIndex(config));
}

// As the HF Trainer groups them: biases and norm weights (LayerNorm and
// RMSNorm) undecayed, every other weight decayed; frozen tensors never.
std::vector<BlockSpec> WithDecayFlags(std::vector<BlockSpec> specs) {
  for (BlockSpec& b : specs) {
    for (TensorSpec& t : b.tensors) {
      const bool norm = t.name.starts_with("ln") || t.name.find("norm.") != std::string::npos;
      t.decay = !(norm || t.name.ends_with(".bias") || IsFrozenTensor(t));
    }
  }
  return specs;
}

}  // namespace

bool IsFrozenTensor(const TensorSpec& tensor) { return tensor.name == "router.score_correction_bias"; }

bool KeptInFp32(const GptConfig& config, int layer, int tensor) {
  return config.moe_in(layer) && Fp32RouterTensor(config, tensor);
}

std::vector<BlockSpec> GptBlockSpecs(const GptConfig& config) {
  if (config.llama()) return WithDecayFlags(LlamaBlockSpecs(config));
  const int64_t C = config.n_embd, Vp = config.padded_vocab_size, T = config.seq_len;
  std::vector<BlockSpec> specs;
  specs.push_back({"embed", {{"wte", {Vp, C}}, {"wpe", {T, C}}}});
  for (int l = 0; l < config.n_layer; ++l) {
    specs.push_back({"layer." + std::to_string(l),
                     {{"ln1.weight", {C}},
                      {"ln1.bias", {C}},
                      {"qkv.weight", {3 * C, C}},
                      {"qkv.bias", {3 * C}},
                      {"attn_proj.weight", {C, C}},
                      {"attn_proj.bias", {C}},
                      {"ln2.weight", {C}},
                      {"ln2.bias", {C}},
                      {"fc.weight", {4 * C, C}},
                      {"fc.bias", {4 * C}},
                      {"fc_proj.weight", {C, 4 * C}},
                      {"fc_proj.bias", {C}}}});
  }
  BlockSpec head{"head", {{"lnf.weight", {C}}, {"lnf.bias", {C}}}};
  if (!config.tied_embeddings) head.tensors.push_back({"lm_head", {Vp, C}});
  specs.push_back(std::move(head));
  return WithDecayFlags(std::move(specs));
}

std::vector<std::vector<int>> LayerTensorGroups(const GptConfig& config, int layer) {
  if (!config.llama())
    return {{kLn1W, kLn1B}, {kQkvW, kQkvB}, {kAttProjW, kAttProjB}, {kLn2W, kLn2B}, {kFcW, kFcB}, {kFcProjW, kFcProjB}};
  std::vector<int> qkv = {kQW, kKW, kVW};
  if (config.qkv_bias) qkv.insert(qkv.end(), {kQB, kKB, kVB});
  if (config.qk_norm) qkv.insert(qkv.end(), {QNormIndex(config), QNormIndex(config) + 1});
  for (int t = 0; t < LatentTensors(config); ++t) qkv.push_back(LatentIndex(config) + t);
  // The MLP's input: the router (and its selection bias), then each
  // expert's gate and up (then the shared expert's and its gate's); its
  // output: each expert's down (then the shared expert's).
  std::vector<int> mlp_in, mlp_out;
  const bool routed = config.moe_in(layer);
  if (routed) mlp_in.push_back(RouterIndex(config));
  if (routed && config.router_bias) mlp_in.push_back(RouterBiasIndex(config));
  for (int e = 0; e < (routed ? config.n_experts : 1); ++e) {
    mlp_in.insert(mlp_in.end(), {ExpertTensor(config, e, 0), ExpertTensor(config, e, 1)});
    mlp_out.push_back(ExpertTensor(config, e, 2));
  }
  if (routed && config.shared_expert()) {
    mlp_in.insert(mlp_in.end(), {SharedExpertTensor(config, 0), SharedExpertTensor(config, 1)});
    if (config.shared_expert_gate) mlp_in.push_back(SharedGateIndex(config));
    mlp_out.push_back(SharedExpertTensor(config, 2));
  }
  // Post norms: each norm weight is read where its output is (the norm
  // groups are empty).
  if (config.post_norms) {
    mlp_out.push_back(kMlpNormW);
    return {{}, qkv, {kOW, kAttnNormW}, {}, mlp_in, mlp_out};
  }
  if (!config.sandwich_norms) return {{kAttnNormW}, qkv, {kOW}, {kMlpNormW}, mlp_in, mlp_out};
  const int post = PostNormIndex(config);
  mlp_out.push_back(post + 1);
  return {{kAttnNormW}, qkv, {kOW, post}, {kMlpNormW}, mlp_in, mlp_out};
}

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr double kInitStd = 0.02;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;  // SplitMix64's increment

}  // namespace

RandomInit::RandomInit(const GptConfig& config, uint64_t seed) {
  const std::vector<BlockSpec> specs = GptBlockSpecs(config);
  const int64_t real_vocab_elems = static_cast<int64_t>(config.vocab_size) * config.n_embd;  // padding rows stay 0
  // GPT-2 scales the two projections that add into the residual stream so
  // its variance does not grow with depth.
  const double proj_std = kInitStd / std::sqrt(2.0 * config.n_layer);
  for (BlockId b = 0; b < static_cast<BlockId>(specs.size()); ++b) {
    const uint64_t block_key = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(b) + 0x5eed));
    std::vector<Rule>& rules = rules_.emplace_back();
    const BlockSpec& spec = specs[static_cast<size_t>(b)];
    for (size_t t = 0; t < spec.tensors.size(); ++t) {
      const TensorSpec& ts = spec.tensors[t];
      Rule r;
      r.key = SplitMix64(block_key + t);
      r.numel = ts.numel();
      const bool vocab =
          (b == kEmbedBlock && t == 0) || (b == HeadBlock(config) && static_cast<int>(t) == LmHeadIndex(config));
      const int64_t drawn = vocab ? real_vocab_elems : ts.numel();
      if (config.llama()) {
        // Llama's scheme: normal(0, 0.02) matrices, norm weights 1 (0 where
        // they are used as 1 + w: Gemma's), biases 0.
        if (ts.shape.size() == 2) {
          r.std = kInitStd;
          r.drawn = drawn;
        } else if (ts.name.find("norm") != std::string::npos && !config.norm_unit_offset) {
          r.fill = 1.0f;
        }
      } else if (b == kEmbedBlock) {
        r.std = kInitStd;  // wte, wpe
        r.drawn = drawn;
      } else if (b == HeadBlock(config)) {
        if (static_cast<int>(t) == kLnfW) r.fill = 1.0f;
        if (static_cast<int>(t) == kLmHead) {
          r.std = kInitStd;
          r.drawn = drawn;
        }
      } else {
        const int k = static_cast<int>(t);
        if (k == kLn1W || k == kLn2W) r.fill = 1.0f;
        if (k == kQkvW || k == kFcW || k == kAttProjW || k == kFcProjW) {
          r.std = k == kAttProjW || k == kFcProjW ? proj_std : kInitStd;
          r.drawn = drawn;
        }
      }
      rules.push_back(r);
    }
  }
}

void RandomInit::Fill(BlockId block, size_t tensor, int64_t first, int64_t count, float* out) const {
  ZINF_CHECK_MSG(
      block >= 0 && static_cast<size_t>(block) < rules_.size() && tensor < rules_[static_cast<size_t>(block)].size(),
      "RandomInit::Fill: block or tensor out of range");
  const Rule& r = rules_[static_cast<size_t>(block)][tensor];
  ZINF_CHECK_MSG(first >= 0 && count >= 0 && first + count <= r.numel, "RandomInit::Fill: range out of the tensor");
  // Drawn elements [first, end_drawn), the rest `fill`.
  const int64_t end = first + count, end_drawn = std::clamp(r.drawn, first, end);
  std::fill(out + (end_drawn - first), out + count, r.fill);
  if (end_drawn == first) return;
  // Pair p makes elements 2p and 2p + 1 by Marsaglia's polar method from
  // its own SplitMix64 stream, started at position p of the tensor's (a
  // counter: any pair without the ones before it).
  const int64_t p0 = first / 2, p1 = (end_drawn - 1) / 2 + 1;
#pragma omp parallel for schedule(static) if (p1 - p0 >= (int64_t{1} << 14))
  for (int64_t p = p0; p < p1; ++p) {
    uint64_t state = SplitMix64(r.key + static_cast<uint64_t>(p) * kGolden);
    double u = 0.0, v = 0.0, s = 0.0;
    do {  // a point uniform in the unit disc (taken 79% of the time); 53 random bits a coordinate
      u = static_cast<double>(static_cast<int64_t>(SplitMix64(state)) >> 11) * 0x1p-52;
      v = static_cast<double>(static_cast<int64_t>(SplitMix64(state + kGolden)) >> 11) * 0x1p-52;
      state += 2 * kGolden;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double scale = std::sqrt(-2.0 * std::log(s) / s) * r.std;
    const int64_t i = 2 * p;
    if (i >= first) out[i - first] = static_cast<float>(u * scale);
    if (i + 1 < end_drawn) out[i + 1 - first] = static_cast<float>(v * scale);
  }
}

std::vector<std::vector<float>> RandomInit::Block(BlockId block) const {
  ZINF_CHECK_MSG(block >= 0 && static_cast<size_t>(block) < rules_.size(), "RandomInit: block id out of range");
  std::vector<std::vector<float>> out;
  for (size_t t = 0; t < rules_[static_cast<size_t>(block)].size(); ++t) {
    const int64_t n = rules_[static_cast<size_t>(block)][t].numel;
    Fill(block, t, 0, n, out.emplace_back(static_cast<size_t>(n)).data());
  }
  return out;
}

std::vector<std::vector<float>> InitBlockWeights(const GptConfig& config, BlockId block, uint64_t seed) {
  return RandomInit(config, seed).Block(block);
}

// ---------------------------------------------------------------- GptCompute

namespace {
// Bytes of logits + dlogits per head chunk (see the file comment).
constexpr int64_t kHeadChunkBytes = 64ll << 20;
}  // namespace

template <typename T>
struct GptCompute<T>::Impl {
  GptConfig config;
  int B = 0;
  Ops<T>* ops = nullptr;
  Device* device = nullptr;
  int64_t N = 0;
  int C = 0;
  int A = 0;  // the attention's width: q, its output (C for kGpt2)
  int64_t bytes = 0;
  std::vector<void*> allocations;

  int32_t* tokens = nullptr;
  int32_t* targets = nullptr;
  std::vector<T*> x;  // x_0 .. x_L
  // A layer's activations, which its backward reads (and reuses as
  // gradient buffers): one set shared by the layers and recomputed
  // (LayerActivations::kRecompute), or one set per layer kept from the
  // forward (kKeep). kLlama's ln1/ln2 hold the RMSNorm outputs and it has
  // no LayerNorm means; kGpt2 has no gate, up or hmid.
  struct LayerActs {
    T* ln1 = nullptr;
    T* ln1_mean = nullptr;
    T* ln1_rstd = nullptr;
    T* qkv = nullptr;
    T* atty = nullptr;
    T* att = nullptr;
    T* mid = nullptr;
    T* ln2 = nullptr;
    T* ln2_mean = nullptr;
    T* ln2_rstd = nullptr;
    T* fch = nullptr;       // kGpt2: [N, 4C]
    T* fch_gelu = nullptr;  // kGpt2: [N, 4C]
    T* gate = nullptr;      // kLlama: [N, I]
    T* up = nullptr;        // kLlama: [N, I]
    T* hmid = nullptr;      // kLlama: [N, I] act(gate) * up (mlp_glu)
    T* q_pre = nullptr;     // qk_norm: q before its norm [N, A]
    T* k_pre = nullptr;     // qk_norm: k before its norm [N, Ckv]
    T* q_rstd = nullptr;    // qk_norm: a norm row's [N * n_head], or [N] over all heads
    T* k_rstd = nullptr;    // qk_norm: [N * n_kv_head], or [N]
    T* attn_o = nullptr;    // branch_norms: o_proj's output [N, C], before its norm
    // Latent attention (mla()): q's latent before and after its norm [N,
    // rq] and its rstd [N] (q_lora_rank), the kv latent's [N, rkv] and
    // rstd, and the heads' values out of the attention [N, NH * dv]
    // (o_proj's input; atty holds them padded to hd).
    T* q_lat_pre = nullptr;
    T* q_lat = nullptr;
    T* q_lat_rstd = nullptr;
    T* kv_lat_pre = nullptr;
    T* kv_lat = nullptr;
    T* kv_lat_rstd = nullptr;
    T* atty_v = nullptr;
    T* attn_o_rstd = nullptr;
    T* mlp_o = nullptr;  // branch_norms: down_proj's output [N, C], before its norm
    T* mlp_o_rstd = nullptr;
    // MoE (gate, up and hmid are then [M, I]): the router's logits, then
    // its probabilities in place [N, E]; each token's experts and weights
    // [N, K]; the dispatch [3M] (row_token, row_slot, token_rows:
    // cpu_kernels.h MoeDispatch) and its expert offsets on the host [E + 1];
    // the experts' inputs and outputs [M, C] in dispatch order.
    T* moe_probs = nullptr;
    T* moe_weights = nullptr;
    int32_t* moe_experts = nullptr;
    int32_t* moe_rows = nullptr;
    std::vector<int64_t> moe_offsets;
    T* moe_x = nullptr;
    T* moe_y = nullptr;
    // The shared expert (config.shared_expert()): its gate, up and
    // act(gate) * up [N, S], its output [N, C] and its gate's logit [N].
    T* shared_gate = nullptr;
    T* shared_up = nullptr;
    T* shared_hmid = nullptr;
    T* shared_y = nullptr;
    T* shared_logit = nullptr;
  };
  bool keep = false;  // LayerActivations::kKeep
  std::vector<LayerActs> acts;
  LayerActs& acts_of(int layer) { return acts[keep ? static_cast<size_t>(layer) : 0]; }
  T* attn_scratch = nullptr;
  float attn_softcap = 0;  // the config's softcaps as the kernels take them
  T final_softcap = T(0);
  T residual_multiplier = T(1);  // Granite's, as the kernels take them
  T logit_scale = T(1);          // 1 / logits_scaling
  T* lnf = nullptr;
  T* lnf_mean = nullptr;
  T* lnf_rstd = nullptr;
  int64_t head_rows = 0;
  T* logits = nullptr;
  T* dlogits = nullptr;
  T* losses = nullptr;
  T* dres = nullptr;  // gradient of the residual stream x_l
  T* dbuf_c = nullptr;
  T* dbuf_4c = nullptr;

  // kLlama only (see LlamaLayerForwardInto / LlamaLayerBackward).
  int Ckv = 0, I = 0, hd = 0, rot = 0;  // rot: the rotated columns of a head
  int Id = 0;                           // a dense MLP's width (I without experts)
  T* rope_cos = nullptr;                // [T, rot/2]
  T* rope_sin = nullptr;
  T* zero_pos = nullptr;  // [T, C] zeros: the encoder's position rows
  T* dpos = nullptr;      // [T, C] where the encoder's unused position gradient goes
  T* q = nullptr;         // [N, A] after RoPE
  T* k = nullptr;         // [N, Ckv] after RoPE
  T* v = nullptr;         // [N, Ckv]
  T* dh = nullptr;        // [N, I] x 3
  T* dgate = nullptr;
  T* dup = nullptr;
  T* dqkv = nullptr;    // [N, 3A]
  T* dq_rot = nullptr;  // [N, A]
  T* dq = nullptr;      // [N, A]
  T* dk_rot = nullptr;  // [N, Ckv] x 3
  T* dk = nullptr;
  T* dv = nullptr;
  T* local_cos = nullptr;  // local_rope_layers' tables [T, rot/2]
  T* local_sin = nullptr;
  T* ones = nullptr;    // norm_unit_offset: [max(C, hd)] ones
  T* norm_w = nullptr;  // norm_unit_offset: 1 + w of the norm at hand [max(C, hd)]
  T* dpost = nullptr;   // branch_norms: d of a post norm's input; residual_multiplier: d of a branch's output [N, C]
  T q_scale = T(1);     // attn_scalar: q times sqrt(hd / attn_scalar) after RoPE
  // Latent attention (mla()): q's and the kv latent's ranks, a head's
  // unrotated key columns and its value's; the projections' outputs (q
  // [N, A], kv_a [N, rkv + rot], kv_b [N, NH * (dn + dv)]) in the forward,
  // their gradients in the backward; the latents' gradients before and
  // after their norms [N, max(rq, rkv)].
  int rq = 0, rkv = 0, dn = 0, dv_head = 0;
  T* mla_q = nullptr;
  T* mla_kv = nullptr;
  T* mla_kvb = nullptr;
  T* dlat = nullptr;
  T* dlat_pre = nullptr;
  int KvaWidth() const { return config.kv_a_width(); }
  int KvbWidth() const { return static_cast<int>(config.kv_b_width()); }
  // o_proj's input: the attention's output, or latent attention's values
  // cut out of it.
  const T* AttnOut(const LayerActs& a) const { return config.mla() ? a.atty_v : a.atty; }
  // The attention over q, k and v as the projections left them: RoPE (none
  // in a NoPE layer), the scores' scale, the GQA expansion into a.qkv, the
  // attention into a.atty; and its adjoint from d atty (`datty`; dbuf_c,
  // or latent attention's padded copy in dq) to dq, dk and dv, d of q, k
  // and v before RoPE.
  void AttendForward(LayerActs& a, int layer);
  void AttendBackward(LayerActs& a, int layer, const T* datty);
  void LatentQkvForward(LayerActs& a, const LayerParams& lp, int layer);
  void LatentQkvBackward(LayerActs& a, const LayerParams& lp, const std::vector<T*>& g, kernels::GradMode mode,
                         int layer);

  // MoE (config.moe()): E experts, K a token, M = N * K dispatched rows.
  // The MLP's rows: M with experts (gate, up, hmid and their gradients
  // are [M, I]), N without.
  int E = 0, K = 0;
  int64_t M = 0, mlp_rows = 0;
  T* drows = nullptr;                            // [M, C]: d of the experts' outputs, then of their inputs
  T* dweights = nullptr;                         // [N, K]: d of the routing weights
  T* drouter = nullptr;                          // [N, E]: d of the router's logits
  int S = 0;                                     // the shared expert's width
  T* dshared_h = nullptr;                        // [N, S]: d of its act(gate) * up
  T* dshared_logit = nullptr;                    // [N]: d of its gate's logit
  std::vector<int32_t> host_experts, host_rows;  // the dispatch's host side
  // The load-balancing loss (router_aux_coef > 0): this forward's choices
  // and probability sums per expert over every layer (the forward proper,
  // not a backward's recompute), a layer's probabilities on the host, and
  // the loss's gradient on each probability [E] (on the device; its host
  // copy stays alive for the copy).
  std::vector<double> aux_counts, aux_probs;
  std::vector<T> host_probs, host_aux_dprobs;
  T* aux_dprobs = nullptr;
  bool aux_ready = false;    // aux_dprobs holds this forward's gradient
  double cross_entropy = 0;  // the last HeadForward's mean cross-entropy
  const int32_t* RowToken(const LayerActs& a) const { return a.moe_rows; }
  const int32_t* RowSlot(const LayerActs& a) const { return a.moe_rows + M; }
  const int32_t* TokenRows(const LayerActs& a) const { return a.moe_rows + 2 * M; }
  // Expert e's dispatched rows [first, first + count), for each expert.
  template <typename F>
  void ForEachExpert(const LayerActs& a, F f) const {
    for (int e = 0; e < E; ++e) {
      const int64_t first = a.moe_offsets[static_cast<size_t>(e)];
      f(e, first, a.moe_offsets[static_cast<size_t>(e) + 1] - first);
    }
  }
  // The routed MLP's forward up to act(gate) * up (group kMlpInGroup), its
  // experts' down projections into moe_y, and the dense or routed MLP's
  // output into `out` (down_proj's, or the experts' combined).
  // With a shared expert the first also runs its gate and up (and its
  // gate's logit), the second its down into shared_y, the third adds it
  // (gated) to the routed sum.
  void MoeForwardIn(const LayerParams& lp, LayerActs& a, int layer);
  void MoeExpertsDown(const LayerParams& lp, LayerActs& a);
  void MlpDown(const LayerParams& lp, LayerActs& a, int layer, T* out);
  // The routed MLP's backward: from d of its output (kMlpOutGroup) to dh,
  // and from dh to d of its input in dbuf_c (kMlpInGroup).
  void MoeBackwardOut(const LayerParams& lp, LayerActs& a, const T* dout, const std::vector<T*>& g,
                      kernels::GradMode mode);
  void MoeBackwardIn(const LayerParams& lp, LayerActs& a, const std::vector<T*>& g, kernels::GradMode mode);
  // A gated MLP's input side over the N rows of the MLP's input (a dense
  // layer's, or the shared expert's): gate and up of `width` from
  // tensors gate_w and up_w, act(gate) * up into hmid; its backward from d
  // hmid (dhid) through dgate and dup, adding d of the input to dbuf_c.
  void GatedMlpIn(const LayerParams& lp, const LayerActs& a, int gate_w, int up_w, T* gate, T* up, T* hmid, int width);
  void GatedMlpInBackward(const LayerParams& lp, const LayerActs& a, const std::vector<T*>& g, kernels::GradMode mode,
                          int gate_w, int up_w, const T* gate, const T* up, const T* dhid, int width);

  // The weight an RMSNorm multiplies by: `w`, or 1 + w in norm_w
  // (norm_unit_offset; formed in T: transformers forms it in fp32, and an
  // fp32 model's bits agree). norm_w serves one norm at a time: the
  // kernels run in the order they are queued.
  const T* NormWeight(const T* w, int n) {
    if (!config.norm_unit_offset) return w;
    ops->ResidualForward(norm_w, w, ones, n);
    return norm_w;
  }
  // Gemma's embedding scale: transformers holds sqrt(n_embd) in an fp32
  // buffer, so an fp64 model multiplies by the float value too.
  // Granite's embed_multiplier as the scalar it is in transformers.
  T EmbedScale() const {
    return config.embed_scale ? static_cast<T>(static_cast<float>(std::sqrt(static_cast<double>(C))))
                              : static_cast<T>(config.embed_multiplier);
  }
  bool ScalesEmbedding() const { return config.embed_scale || config.embed_multiplier != 1; }
  // The norms the attention's and the MLP's outputs go through
  // (branch_norms): OLMo 2's post norms or Gemma's sandwich ones.
  size_t AttnOutNorm() const { return static_cast<size_t>(config.post_norms ? kAttnNormW : PostNormIndex(config)); }
  size_t MlpOutNorm() const { return static_cast<size_t>(config.post_norms ? kMlpNormW : PostNormIndex(config) + 1); }
  // What the q/k/v and the gate/up projections read: the pre norms'
  // outputs, or with post norms the residual stream itself.
  const T* AttnInput(const LayerActs& a, int layer) const { return config.post_norms ? x[layer] : a.ln1; }
  const T* MlpInput(const LayerActs& a) const { return config.post_norms ? a.mid : a.ln2; }
  // Granite: d of a branch's output (o_proj's, down_proj's) is
  // residual_multiplier times that of the residual stream, into dpost
  // (which the branch norms use otherwise: Create refuses both at once).
  const T* BranchGradient() {
    if (residual_multiplier == T(1)) return dres;
    ops->Zero(dpost, N * C);
    ops->Accumulate(dpost, dres, N * C);
    ops->Scale(dpost, residual_multiplier, N * C);
    return dpost;
  }
  // The RoPE tables of layer `layer`.
  const T* CosOf(int layer) const { return config.local_rope_in(layer) ? local_cos : rope_cos; }
  const T* SinOf(int layer) const { return config.local_rope_in(layer) ? local_sin : rope_sin; }

  // Where the step is: which x_l hold this batch's values, and which layer
  // LayerBackward expects next (guards against out-of-order calls, which
  // would compute silently wrong gradients).
  bool batch_set = false;
  int forward_done = -1;  // x_0 .. x_{forward_done} are valid; -1: none
  bool head_backward_done = false;
  int backward_next = -1;
  // Within a layer walked in groups: the next forward group of layer
  // forward_done, the next recompute group and the group after the next
  // backward one of layer backward_next.
  int forward_group = 0;
  int recompute_group = 0;
  int backward_end = kLayerGroups;
  // kKeep: a backward has begun on the kept activations, which it uses as
  // gradient buffers; another backward needs a new forward first.
  bool kept_consumed = false;

  // kOffload (see gpt.h): x[l] is device slot l % kSlots, and every x_l
  // lives in host_x ((L+1) * N*C, pinned), copied out on `copies` once the
  // forward has written it and back before a backward reads it. Per slot:
  // the x_l it holds (-1: none), the last copy out of it (the kernels wait
  // for it before writing the slot again) and the last copy into it (they
  // wait for it before reading). Three slots: a layer's input and output
  // while the one before is still being copied out; in the backward, a
  // layer's input while the next one's comes in.
  static constexpr int kSlots = 3;
  bool offload = false;
  std::unique_ptr<aio::PinnedPool> host_pool;
  aio::PinnedBuffer host_buffer;
  T* host_x = nullptr;
  std::unique_ptr<Stream> copies;
  std::array<int, kSlots> slot_holds{-1, -1, -1};
  std::array<std::unique_ptr<Event>, kSlots> copied_out, copied_in;

  ~Impl() {
    // Copies still queued read or write the slots and host_x.
    if (copies != nullptr) copies->Synchronize().IgnoreError();
    for (void* p : allocations) device->Free(p);
  }

  // The copies follow the kernels queued so far: with Ops on a stream, the
  // copy stream waits for an event recorded there; Ops without one have
  // run their kernels by the time they return.
  Status CopiesAfterKernels() {
    void* s = ops->stream();
    if (s == nullptr) return Status::Ok();
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Event> e, device->RecordOn(s));
    return copies->Wait(*e);
  }
  // The kernels queued from now on follow `copy` (then cleared): the Ops'
  // stream waits for it, or the calling thread does.
  Status KernelsAfter(std::unique_ptr<Event>& copy) {
    if (copy == nullptr) return Status::Ok();
    void* s = ops->stream();
    Status st = s != nullptr ? device->WaitOn(s, *copy) : copy->Synchronize();
    copy.reset();
    return st.WithContext("GptCompute: waiting for a layer input's copy");
  }
  size_t x_bytes() const { return sizeof(T) * static_cast<size_t>(N) * static_cast<size_t>(C); }
  // Before the kernels write x_l into its slot: the slot's last copies out
  // and in (a backward's look-ahead no layer used) have finished.
  Status BeforeWritingInput(int l) {
    if (!offload) return Status::Ok();
    const auto slot = static_cast<size_t>(l % kSlots);
    slot_holds[slot] = -1;
    ZINF_RETURN_IF_ERROR(KernelsAfter(copied_in[slot]));
    return KernelsAfter(copied_out[slot]);
  }
  // After the kernels that write x_l are queued: its copy out.
  Status AfterWritingInput(int l) {
    if (!offload) return Status::Ok();
    return QueueInputCopy(l, CopyDirection::kDeviceToHost, copied_out[static_cast<size_t>(l % kSlots)]);
  }
  // Queues x_l's copy into its slot unless the slot holds it, after the
  // kernels queued so far (the slot's earlier value may still be read).
  Status LoadInput(int l) {
    if (!offload || l < 0) return Status::Ok();
    const auto slot = static_cast<size_t>(l % kSlots);
    if (slot_holds[slot] == l) return Status::Ok();
    return QueueInputCopy(l, CopyDirection::kHostToDevice, copied_in[slot]);
  }
  // x_l's copy between its slot and the host (out: kDeviceToHost), after
  // the kernels queued so far; `done` gets the event after it, and the
  // slot holds x_l.
  Status QueueInputCopy(int l, CopyDirection dir, std::unique_ptr<Event>& done) {
    const bool out = dir == CopyDirection::kDeviceToHost;
    T* host = host_x + static_cast<int64_t>(l) * N * C;
    T* slot_x = x[static_cast<size_t>(l)];
    ZINF_RETURN_IF_ERROR(CopiesAfterKernels());
    ZINF_RETURN_IF_ERROR(
        copies->CopyAsync(out ? static_cast<void*>(host) : slot_x, out ? slot_x : host, x_bytes(), dir)
            .WithContext("GptCompute: copying layer input x_" + std::to_string(l) + (out ? " to the host" : " back")));
    ZINF_ASSIGN_OR_RETURN(done, copies->Record());
    slot_holds[static_cast<size_t>(l % kSlots)] = l;
    return Status::Ok();
  }
  // Before the backward of layer l reads x_l: in its slot, and the next
  // layer down's on its way.
  Status InputForBackward(int l) {
    if (!offload) return Status::Ok();
    ZINF_RETURN_IF_ERROR(LoadInput(l));
    ZINF_RETURN_IF_ERROR(KernelsAfter(copied_in[static_cast<size_t>(l % kSlots)]));
    return LoadInput(l - 1);
  }

  template <typename U>
  Status Alloc(U** out, int64_t count, const char* what) {
    const size_t size = sizeof(U) * static_cast<size_t>(std::max<int64_t>(count, 1));
    StatusOr<void*> p = device->Allocate(size);
    if (!p.ok()) {
      return p.status().WithContext("GptCompute: allocating " + std::string(what) + " (" + std::to_string(size) +
                                    " bytes, " + std::to_string(bytes) + " already held)");
    }
    allocations.push_back(*p);
    bytes += static_cast<int64_t>(size);
    *out = static_cast<U*>(*p);
    return Status::Ok();
  }

  size_t LayerTensorCount(int layer) const {
    return static_cast<size_t>(config.llama() ? LlamaLayerTensors(config, layer) : kLayerTensors);
  }
  // One group's step of the layer's forward (LayerTensorGroups): group
  // kMlpOutGroup writes x_{l+1}, so the recompute in LayerBackward stops
  // before it. The steps run the kernels of a whole-layer forward in its
  // order, whatever the grouping of the calls.
  void ForwardGroup(int layer, int group, const LayerParams& lp);
  void LlamaForwardGroup(int layer, int group, const LayerParams& lp);
  // One group's step of the backward, after the recompute (groups from
  // kMlpOutGroup down to kNorm1Group): m.dres holds d x_{l+1} before the
  // first and d x_l after the last.
  void BackwardGroup(int layer, int group, const LayerParams& lp, const std::vector<T*>& g, kernels::GradMode mode);
  void LlamaBackwardGroup(int layer, int group, const LayerParams& lp, const std::vector<T*>& g,
                          kernels::GradMode mode);
  // A norm's parameter gradients before its backward, which adds into them:
  // `elems` each, zeroed when the call sets its gradients (kSet). Null ones
  // are skipped.
  void ZeroIfSet(kernels::GradMode mode, std::initializer_list<T*> grads, int64_t elems) {
    if (mode != kernels::GradMode::kSet) return;
    for (T* g : grads) {
      if (g != nullptr) ops->Zero(g, elems);
    }
  }
  // The layer's linear map by its weight tensor `w` ([OC, IC]): out = inp @
  // W^T + bias, and its backward (dinp accumulating, W's and the bias's
  // gradients as `mode` says), reading W in its 16-bit type when the call
  // handed it over so (lp.matrices16[w]).
  // `rows` of inp and out, N unless given (an expert's dispatched rows).
  void Linear(const LayerParams& lp, int w, T* out, const T* inp, const T* bias, int IC, int OC, int64_t rows = -1) {
    const int64_t n = rows < 0 ? N : rows;
    const void* w16 = lp.matrices16.empty() ? nullptr : lp.matrices16[static_cast<size_t>(w)];
    if (w16 != nullptr) return ops->MatmulForward16(out, inp, w16, lp.type16, bias, n, IC, OC);
    ops->MatmulForward(out, inp, lp.values[static_cast<size_t>(w)], bias, n, IC, OC);
  }
  void LinearBackward(const LayerParams& lp, int w, T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, int IC,
                      int OC, kernels::GradMode mode, int64_t rows = -1) {
    const int64_t n = rows < 0 ? N : rows;
    const void* w16 = lp.matrices16.empty() ? nullptr : lp.matrices16[static_cast<size_t>(w)];
    if (w16 != nullptr) return ops->MatmulBackward16(dinp, dweight, dbias, dout, inp, w16, lp.type16, n, IC, OC, mode);
    ops->MatmulBackward(dinp, dweight, dbias, dout, inp, lp.values[static_cast<size_t>(w)], n, IC, OC, mode);
  }
  Status CheckBackwardLayer(int layer, const char* what) const;
  Status AllocateLayerActs(LayerActs* a);
  Status AllocateLlama();
};

template <typename T>
void GptCompute<T>::Impl::ForwardGroup(int layer, int group, const LayerParams& lp) {
  LayerActs& a = acts_of(layer);
  const std::vector<const T*>& p = lp.values;
  if (config.llama()) return LlamaForwardGroup(layer, group, lp);
  const int T_ = config.seq_len, NH = config.n_head;
  const T* xin = x[layer];
  Ops<T>& o = *ops;
  switch (group) {
    case kNorm1Group: o.LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, xin, p[kLn1W], p[kLn1B], N, C); break;
    case kQkvGroup:
      Linear(lp, kQkvW, a.qkv, a.ln1, p[kQkvB], C, 3 * C);
      o.AttentionForward(a.atty, a.att, attn_scratch, a.qkv, B, T_, C, NH, config.window_in(layer), attn_softcap);
      break;
    case kAttnOutGroup:
      Linear(lp, kAttProjW, a.mid, a.atty, p[kAttProjB], C, C);
      o.ResidualForward(a.mid, xin, a.mid, N * C);
      break;
    case kNorm2Group: o.LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.mid, p[kLn2W], p[kLn2B], N, C); break;
    case kMlpInGroup:
      Linear(lp, kFcW, a.fch, a.ln2, p[kFcB], C, 4 * C);
      o.GeluForward(a.fch_gelu, a.fch, N * 4 * C);
      break;
    default: {
      T* xout = x[layer + 1];
      Linear(lp, kFcProjW, xout, a.fch_gelu, p[kFcProjB], 4 * C, C);
      o.ResidualForward(xout, a.mid, xout, N * C);
    }
  }
}

template <typename T>
void GptCompute<T>::Impl::LlamaForwardGroup(int layer, int group, const LayerParams& lp) {
  LayerActs& a = acts_of(layer);
  const std::vector<const T*>& p = lp.values;
  const T* xin = x[layer];
  Ops<T>& o = *ops;
  const bool bias = config.qkv_bias, qk_norm = config.qk_norm, normed = config.branch_norms();
  const double eps = config.norm_eps;
  switch (group) {
    case kNorm1Group:
      if (!config.post_norms) o.RmsNormForward(a.ln1, a.ln1_rstd, xin, NormWeight(p[kAttnNormW], C), N, C, eps);
      break;
    case kQkvGroup: {
      if (config.mla()) {
        LatentQkvForward(a, lp, layer);
        break;
      }
      const T* in = AttnInput(a, layer);
      Linear(lp, kQW, qk_norm ? a.q_pre : q, in, bias ? p[kQB] : nullptr, C, A);
      Linear(lp, kKW, qk_norm ? a.k_pre : k, in, bias ? p[kKB] : nullptr, C, Ckv);
      Linear(lp, kVW, v, in, bias ? p[kVB] : nullptr, C, Ckv);
      if (qk_norm) {  // a norm row: each head's hd values, or all heads' (qk_norm_all_heads)
        const auto qn = static_cast<size_t>(QNormIndex(config));
        const int qw = config.q_norm_width(), kw = config.k_norm_width();
        o.RmsNormForward(q, a.q_rstd, a.q_pre, NormWeight(p[qn], qw), N * A / qw, qw, eps);
        o.RmsNormForward(k, a.k_rstd, a.k_pre, NormWeight(p[qn + 1], kw), N * Ckv / kw, kw, eps);
      }
      AttendForward(a, layer);
      break;
    }
    case kAttnOutGroup:
      if (normed) {
        Linear(lp, kOW, a.attn_o, AttnOut(a), nullptr, config.attn_out_width(), C);
        o.RmsNormForward(a.mid, a.attn_o_rstd, a.attn_o, NormWeight(p[AttnOutNorm()], C), N, C, eps);
      } else {
        Linear(lp, kOW, a.mid, AttnOut(a), nullptr, config.attn_out_width(), C);
        if (residual_multiplier != T(1)) o.Scale(a.mid, residual_multiplier, N * C);
      }
      o.ResidualForward(a.mid, xin, a.mid, N * C);
      break;
    case kNorm2Group:
      if (!config.post_norms) o.RmsNormForward(a.ln2, a.ln2_rstd, a.mid, NormWeight(p[kMlpNormW], C), N, C, eps);
      break;
    case kMlpInGroup:
      if (config.moe_in(layer)) {
        MoeForwardIn(lp, a, layer);
        break;
      }
      GatedMlpIn(lp, a, kGateW, kUpW, a.gate, a.up, a.hmid, Id);
      break;
    default: {
      T* xout = x[layer + 1];
      if (normed) {
        MlpDown(lp, a, layer, a.mlp_o);
        o.RmsNormForward(xout, a.mlp_o_rstd, a.mlp_o, NormWeight(p[MlpOutNorm()], C), N, C, eps);
      } else {
        MlpDown(lp, a, layer, xout);
        if (residual_multiplier != T(1)) o.Scale(xout, residual_multiplier, N * C);
      }
      o.ResidualForward(xout, a.mid, xout, N * C);
    }
  }
}

// Buffers passed between groups: d(fc_proj input) in dbuf_4c (kMlpOut ->
// kMlpIn), d ln2 in dbuf_c (kMlpIn -> kNorm2), d(attention output) in
// dbuf_c (kAttnOut -> kQkv), d ln1 in atty (kQkv -> kNorm1). Each reuses a
// forward buffer whose last reader has run.
template <typename T>
void GptCompute<T>::Impl::BackwardGroup(int layer, int group, const LayerParams& lp, const std::vector<T*>& g,
                                        kernels::GradMode mode) {
  LayerActs& a = acts_of(layer);
  const std::vector<const T*>& p = lp.values;
  if (config.llama()) return LlamaBackwardGroup(layer, group, lp, g, mode);
  const int T_ = config.seq_len, NH = config.n_head;
  Ops<T>& o = *ops;
  // x_{l+1} = mid + fc_proj(gelu(fc(ln2(mid)))); mid = x_l + attn_proj(attention(qkv(ln1(x_l)))).
  switch (group) {
    case kMlpOutGroup:
      o.Zero(dbuf_4c, N * 4 * C);  // d fch_gelu
      LinearBackward(lp, kFcProjW, dbuf_4c, g[kFcProjW], g[kFcProjB], dres, a.fch_gelu, 4 * C, C, mode);
      break;
    case kMlpInGroup: {
      T* dfch = a.fch_gelu;  // fch_gelu's last reader was the fc_proj matmul backward
      o.Zero(dfch, N * 4 * C);
      o.GeluBackward(dfch, a.fch, dbuf_4c, N * 4 * C);
      o.Zero(dbuf_c, N * C);  // d ln2
      LinearBackward(lp, kFcW, dbuf_c, g[kFcW], g[kFcB], dfch, a.ln2, C, 4 * C, mode);
      break;
    }
    case kNorm2Group:
      // The residual passes d x_{l+1} through unchanged: adding the
      // LayerNorm path turns dres into d mid.
      ZeroIfSet(mode, {g[kLn2W], g[kLn2B]}, C);
      o.LayerNormBackward(dres, g[kLn2W], g[kLn2B], dbuf_c, a.mid, p[kLn2W], a.ln2_mean, a.ln2_rstd, N, C);
      break;
    case kAttnOutGroup:
      o.Zero(dbuf_c, N * C);  // d atty
      LinearBackward(lp, kAttProjW, dbuf_c, g[kAttProjW], g[kAttProjB], dres, a.atty, C, C, mode);
      break;
    case kQkvGroup: {
      T* dqkv_ = dbuf_4c;
      o.Zero(dqkv_, N * 3 * C);
      o.AttentionBackward(dqkv_, attn_scratch, dbuf_c, a.qkv, a.atty, a.att, B, T_, C, NH, config.window_in(layer),
                          attn_softcap);
      T* dln1 = a.atty;  // atty's last reader was the attn_proj matmul backward
      o.Zero(dln1, N * C);
      LinearBackward(lp, kQkvW, dln1, g[kQkvW], g[kQkvB], dqkv_, a.ln1, C, 3 * C, mode);
      break;
    }
    default:
      ZeroIfSet(mode, {g[kLn1W], g[kLn1B]}, C);
      o.LayerNormBackward(dres, g[kLn1W], g[kLn1B], a.atty, x[layer], p[kLn1W], a.ln1_mean, a.ln1_rstd, N, C);
  }
}

// As BackwardGroup: d hmid in dh (kMlpOut -> kMlpIn), d ln2 and d atty in
// dbuf_c (N * max(C, A)), d ln1 in dbuf_c (kQkv -> kNorm1).
template <typename T>
void GptCompute<T>::Impl::LlamaBackwardGroup(int layer, int group, const LayerParams& lp, const std::vector<T*>& g,
                                             kernels::GradMode mode) {
  LayerActs& a = acts_of(layer);
  const std::vector<const T*>& p = lp.values;
  Ops<T>& o = *ops;
  const bool bias = config.qkv_bias, qk_norm = config.qk_norm, normed = config.branch_norms();
  // x_{l+1} = mid + down(act(gate(ln2)) * up(ln2)), ln2 = rms(mid);
  // mid = x_l + o(attention(rope(q(ln1)), rope(k(ln1)), v(ln1))), ln1 = rms(x_l);
  // with qk_norm, rope(qn(q(ln1))) and rope(kn(k(ln1))), qn and kn per head
  // (or over all heads);
  // with sandwich norms, rms(down(..)) and rms(o(..)) join the residual;
  // with post norms, the same with ln1 = x_l and ln2 = mid;
  // with a residual multiplier r (Granite), r down(..) and r o(..).
  switch (group) {
    case kMlpOutGroup: {
      const T* d_down = BranchGradient();  // d of down_proj's output
      if (normed) {
        // The recompute stops before this group: its norm's input and
        // rstd are made here (kept from the forward with kKeep).
        const size_t n = MlpOutNorm();
        const T* w = NormWeight(p[n], C);
        if (!keep) {
          MlpDown(lp, a, layer, a.mlp_o);
          o.RmsNormForward(dpost, a.mlp_o_rstd, a.mlp_o, w, N, C, config.norm_eps);
        }
        ZeroIfSet(mode, {g[n]}, C);
        o.Zero(dpost, N * C);
        o.RmsNormBackward(dpost, g[n], dres, a.mlp_o, w, a.mlp_o_rstd, N, C);
        d_down = dpost;
      } else if (config.moe_in(layer) && !keep) {
        MoeExpertsDown(lp, a);  // the routing weights' gradients read the experts' outputs
      }
      if (config.moe_in(layer)) {
        MoeBackwardOut(lp, a, d_down, g, mode);
        break;
      }
      o.Zero(dh, N * Id);
      LinearBackward(lp, kDownW, dh, g[kDownW], nullptr, d_down, a.hmid, Id, C, mode);
      break;
    }
    case kMlpInGroup:
      if (config.moe_in(layer)) {
        MoeBackwardIn(lp, a, g, mode);
        break;
      }
      o.Zero(dbuf_c, N * C);  // d ln2
      GatedMlpInBackward(lp, a, g, mode, kGateW, kUpW, a.gate, a.up, dh, Id);
      break;
    case kNorm2Group:
      if (config.post_norms) {  // ln2 is mid
        o.Accumulate(dres, dbuf_c, N * C);
        break;
      }
      ZeroIfSet(mode, {g[kMlpNormW]}, C);
      o.RmsNormBackward(dres, g[kMlpNormW], dbuf_c, a.mid, NormWeight(p[kMlpNormW], C), a.ln2_rstd, N, C);
      break;
    case kAttnOutGroup: {
      const T* d_o = BranchGradient();  // d of o_proj's output
      if (normed) {
        const size_t n = AttnOutNorm();
        ZeroIfSet(mode, {g[n]}, C);
        o.Zero(dpost, N * C);
        o.RmsNormBackward(dpost, g[n], dres, a.attn_o, NormWeight(p[n], C), a.attn_o_rstd, N, C);
        d_o = dpost;
      }
      const int Ao = config.attn_out_width();
      o.Zero(dbuf_c, N * Ao);  // d atty (d atty_v)
      LinearBackward(lp, kOW, dbuf_c, g[kOW], nullptr, d_o, AttnOut(a), Ao, C, mode);
      break;
    }
    case kQkvGroup: {
      if (config.mla()) {
        LatentQkvBackward(a, lp, g, mode, layer);
        break;
      }
      AttendBackward(a, layer, dbuf_c);
      const T* dq_in = dq;  // d of the projections' outputs
      const T* dk_in = dk;
      if (qk_norm) {  // the rotated gradients' last readers have run: they take d q_pre, d k_pre
        const auto qn = static_cast<size_t>(QNormIndex(config));
        const int qw = config.q_norm_width(), kw = config.k_norm_width();
        ZeroIfSet(mode, {g[qn]}, qw);
        ZeroIfSet(mode, {g[qn + 1]}, kw);
        o.Zero(dq_rot, N * A);
        o.Zero(dk_rot, N * Ckv);
        o.RmsNormBackward(dq_rot, g[qn], dq, a.q_pre, NormWeight(p[qn], qw), a.q_rstd, N * A / qw, qw);
        o.RmsNormBackward(dk_rot, g[qn + 1], dk, a.k_pre, NormWeight(p[qn + 1], kw), a.k_rstd, N * Ckv / kw, kw);
        dq_in = dq_rot;
        dk_in = dk_rot;
      }
      T* dln1 = dbuf_c;  // d atty's last reader was the attention backward
      o.Zero(dln1, N * C);
      const T* in = AttnInput(a, layer);
      LinearBackward(lp, kQW, dln1, g[kQW], bias ? g[kQB] : nullptr, dq_in, in, C, A, mode);
      LinearBackward(lp, kKW, dln1, g[kKW], bias ? g[kKB] : nullptr, dk_in, in, C, Ckv, mode);
      LinearBackward(lp, kVW, dln1, g[kVW], bias ? g[kVB] : nullptr, dv, in, C, Ckv, mode);
      break;
    }
    default:
      if (config.post_norms) {  // ln1 is x_l
        o.Accumulate(dres, dbuf_c, N * C);
        break;
      }
      ZeroIfSet(mode, {g[kAttnNormW]}, C);
      o.RmsNormBackward(dres, g[kAttnNormW], dbuf_c, x[layer], NormWeight(p[kAttnNormW], C), a.ln1_rstd, N, C);
  }
}

template <typename T>
void GptCompute<T>::Impl::AttendForward(LayerActs& a, int layer) {
  Ops<T>& o = *ops;
  const int T_ = config.seq_len, NH = config.n_head, NKV = config.n_kv_head;
  if (config.rope_dims_in(layer) > 0) {  // else a NoPE layer: q and k as they are
    o.RopeForward(q, q, CosOf(layer), SinOf(layer), B, T_, NH, hd, rot, config.rope.interleaved);
    o.RopeForward(k, k, CosOf(layer), SinOf(layer), B, T_, NKV, hd, rot, config.rope.interleaved);
  }
  if (q_scale != T(1)) o.Scale(q, q_scale, N * A);
  o.GqaExpandForward(a.qkv, q, k, v, N, NH, NKV, hd);
  o.AttentionForward(a.atty, a.att, attn_scratch, a.qkv, B, T_, A, NH, config.window_in(layer), attn_softcap);
}

template <typename T>
void GptCompute<T>::Impl::AttendBackward(LayerActs& a, int layer, const T* datty) {
  Ops<T>& o = *ops;
  const int T_ = config.seq_len, NH = config.n_head, NKV = config.n_kv_head;
  o.Zero(dqkv, N * 3 * A);
  o.AttentionBackward(dqkv, attn_scratch, datty, a.qkv, a.atty, a.att, B, T_, A, NH, config.window_in(layer),
                      attn_softcap);
  o.Zero(dq_rot, N * A);
  o.Zero(dk_rot, N * Ckv);
  o.Zero(dv, N * Ckv);
  o.GqaExpandBackward(dq_rot, dk_rot, dv, dqkv, N, NH, NKV, hd);
  if (q_scale != T(1)) o.Scale(dq_rot, q_scale, N * A);
  o.Zero(dq, N * A);
  o.Zero(dk, N * Ckv);
  // A NoPE layer turns no column: the gradients pass through (rot 0).
  const int layer_rot = config.rope_dims_in(layer);
  o.RopeBackward(dq, dq_rot, CosOf(layer), SinOf(layer), B, T_, NH, hd, layer_rot, config.rope.interleaved);
  o.RopeBackward(dk, dk_rot, CosOf(layer), SinOf(layer), B, T_, NKV, hd, layer_rot, config.rope.interleaved);
}

// Latent attention's q, k and v (DeepseekV3Attention): q = q_b(rms(q_a(x)))
// (or q_proj(x)), [kv latent | k_rope] = kv_a(x), [k_nope_h | v_h] =
// kv_b(rms(kv latent)) per head. The attention sees each head's q and k
// with the rotated columns first ([q_rope | q_nope], [k_rope | k_nope_h]:
// a dot product does not mind the order, and RopeForward turns a head's
// first columns) and v padded with zeros to hd; atty_v takes the values'
// columns back out of its output.
template <typename T>
void GptCompute<T>::Impl::LatentQkvForward(LayerActs& a, const LayerParams& lp, int layer) {
  const std::vector<const T*>& p = lp.values;
  Ops<T>& o = *ops;
  const int NH = config.n_head, Wa = KvaWidth(), Wkv = KvbWidth(), Ao = config.attn_out_width();
  const double eps = config.latent_norm_eps;
  const auto lat = static_cast<size_t>(LatentIndex(config));
  const T* in = AttnInput(a, layer);
  if (rq > 0) {
    Linear(lp, kQW, a.q_lat_pre, in, nullptr, C, rq);
    o.RmsNormForward(a.q_lat, a.q_lat_rstd, a.q_lat_pre, NormWeight(p[lat + 1], rq), N, rq, eps);
    Linear(lp, static_cast<int>(lat) + 2, mla_q, a.q_lat, nullptr, rq, A);
  } else {
    Linear(lp, kQW, mla_q, in, nullptr, C, A);
  }
  Linear(lp, kKW, mla_kv, in, nullptr, C, Wa);
  o.CopyHeadColumns(a.kv_lat_pre, rkv, 0, mla_kv, Wa, 0, N, 1, rkv, false);
  o.RmsNormForward(a.kv_lat, a.kv_lat_rstd, a.kv_lat_pre, NormWeight(p[lat], rkv), N, rkv, eps);
  Linear(lp, kVW, mla_kvb, a.kv_lat, nullptr, rkv, Wkv);
  o.CopyHeadColumns(q, A, hd, mla_q + dn, A, hd, N, NH, rot, false);
  o.CopyHeadColumns(q + rot, A, hd, mla_q, A, hd, N, NH, dn, false);
  o.CopyHeadColumns(k, A, hd, mla_kv + rkv, Wa, 0, N, NH, rot, false);
  o.CopyHeadColumns(k + rot, A, hd, mla_kvb, Wkv, dn + dv_head, N, NH, dn, false);
  o.Zero(v, N * A);
  o.CopyHeadColumns(v, A, hd, mla_kvb + dn, Wkv, dn + dv_head, N, NH, dv_head, false);
  AttendForward(a, layer);
  o.CopyHeadColumns(a.atty_v, Ao, dv_head, a.atty, A, hd, N, NH, dv_head, false);
}

// LatentQkvForward's adjoint, from d atty_v in dbuf_c to d of the
// projections' input in dbuf_c: the shared k_rope's gradient sums the
// heads', in head order.
template <typename T>
void GptCompute<T>::Impl::LatentQkvBackward(LayerActs& a, const LayerParams& lp, const std::vector<T*>& g,
                                            kernels::GradMode mode, int layer) {
  const std::vector<const T*>& p = lp.values;
  Ops<T>& o = *ops;
  const int NH = config.n_head, Wa = KvaWidth(), Wkv = KvbWidth(), Ao = config.attn_out_width();
  const auto lat = static_cast<size_t>(LatentIndex(config));
  T* datty = dq;  // d of the padded attention output; dq's first writer comes after its last reader
  o.Zero(datty, N * A);
  o.CopyHeadColumns(datty, A, hd, dbuf_c, Ao, dv_head, N, NH, dv_head, false);
  AttendBackward(a, layer, datty);
  // The projections' gradients, where their outputs were (the forward's
  // values there are not read again).
  T* dmla_q = mla_q;
  T* dmla_kv = mla_kv;
  T* dmla_kvb = mla_kvb;
  o.CopyHeadColumns(dmla_q + dn, A, hd, dq, A, hd, N, NH, rot, false);
  o.CopyHeadColumns(dmla_q, A, hd, dq + rot, A, hd, N, NH, dn, false);
  o.CopyHeadColumns(dmla_kvb, Wkv, dn + dv_head, dk + rot, A, hd, N, NH, dn, false);
  o.CopyHeadColumns(dmla_kvb + dn, Wkv, dn + dv_head, dv, A, hd, N, NH, dv_head, false);
  o.Zero(dmla_kv, N * Wa);
  o.CopyHeadColumns(dmla_kv + rkv, Wa, 0, dk, A, hd, N, NH, rot, true);
  o.Zero(dlat, N * rkv);
  LinearBackward(lp, kVW, dlat, g[kVW], nullptr, dmla_kvb, a.kv_lat, rkv, Wkv, mode);
  ZeroIfSet(mode, {g[lat]}, rkv);
  o.Zero(dlat_pre, N * rkv);
  o.RmsNormBackward(dlat_pre, g[lat], dlat, a.kv_lat_pre, NormWeight(p[lat], rkv), a.kv_lat_rstd, N, rkv);
  o.CopyHeadColumns(dmla_kv, Wa, 0, dlat_pre, rkv, 0, N, 1, rkv, false);
  T* dln1 = dbuf_c;  // d atty_v's last reader has run
  o.Zero(dln1, N * C);
  const T* in = AttnInput(a, layer);
  LinearBackward(lp, kKW, dln1, g[kKW], nullptr, dmla_kv, in, C, Wa, mode);
  if (rq == 0) {
    LinearBackward(lp, kQW, dln1, g[kQW], nullptr, dmla_q, in, C, A, mode);
    return;
  }
  o.Zero(dlat, N * rq);
  LinearBackward(lp, static_cast<int>(lat) + 2, dlat, g[lat + 2], nullptr, dmla_q, a.q_lat, rq, A, mode);
  ZeroIfSet(mode, {g[lat + 1]}, rq);
  o.Zero(dlat_pre, N * rq);
  o.RmsNormBackward(dlat_pre, g[lat + 1], dlat, a.q_lat_pre, NormWeight(p[lat + 1], rq), a.q_lat_rstd, N, rq);
  LinearBackward(lp, kQW, dln1, g[kQW], nullptr, dlat_pre, in, C, rq, mode);
}

// The routed MLP (config.moe()): the router's logits and the routing, the
// dispatch on the host (the experts' row counts size their matmuls), each
// expert's gate and up over its rows, act(gate) * up over all of them.
template <typename T>
void GptCompute<T>::Impl::MoeForwardIn(const LayerParams& lp, LayerActs& a, int layer) {
  Ops<T>& o = *ops;
  const T* in = MlpInput(a);
  Linear(lp, RouterIndex(config), a.moe_probs, in, nullptr, C, E);
  const T* bias = config.router_bias ? lp.values[static_cast<size_t>(RouterBiasIndex(config))] : nullptr;
  o.MoeRouteForward(a.moe_weights, a.moe_experts, a.moe_probs, a.moe_probs, bias, N, config.routing());
  // After a failed kernel the copy may not run: slot j's expert j still
  // dispatches validly (no expert over N rows), and Synchronize returns
  // the error.
  for (size_t s = 0; s < host_experts.size(); ++s) host_experts[s] = static_cast<int32_t>(s % static_cast<size_t>(K));
  o.CopyToHost(host_experts.data(), a.moe_experts, sizeof(int32_t) * host_experts.size());
  int32_t* rows = host_rows.data();
  const bool dispatched =
      kernels::cpu::MoeDispatch(host_experts.data(), N, K, E, rows, rows + M, rows + 2 * M, a.moe_offsets.data());
  ZINF_CHECK_MSG(dispatched, "GptCompute: the routing chose an expert out of range");
  o.CopyToDevice(a.moe_rows, rows, sizeof(int32_t) * host_rows.size());
  if (config.router_aux_coef > 0 && forward_done == layer) {  // the forward proper: the loss's sums
    o.CopyToHost(host_probs.data(), a.moe_probs, sizeof(T) * host_probs.size());
    for (int e = 0; e < E; ++e) {
      aux_counts[static_cast<size_t>(e)] +=
          static_cast<double>(a.moe_offsets[static_cast<size_t>(e) + 1] - a.moe_offsets[static_cast<size_t>(e)]);
    }
    for (int64_t n = 0; n < N; ++n) {
      for (int e = 0; e < E; ++e) aux_probs[static_cast<size_t>(e)] += static_cast<double>(host_probs[n * E + e]);
    }
  }
  o.GatherRows(a.moe_x, in, RowToken(a), M, C);
  ForEachExpert(a, [&](int e, int64_t first, int64_t count) {
    if (count == 0) return;
    Linear(lp, ExpertTensor(config, e, 0), a.gate + first * I, a.moe_x + first * C, nullptr, C, I, count);
    Linear(lp, ExpertTensor(config, e, 1), a.up + first * I, a.moe_x + first * C, nullptr, C, I, count);
  });
  o.GluForward(a.hmid, a.gate, a.up, M * I, config.mlp_glu);
  if (!config.shared_expert()) return;
  GatedMlpIn(lp, a, SharedExpertTensor(config, 0), SharedExpertTensor(config, 1), a.shared_gate, a.shared_up,
             a.shared_hmid, S);
  if (config.shared_expert_gate) Linear(lp, SharedGateIndex(config), a.shared_logit, in, nullptr, C, 1);
}

template <typename T>
void GptCompute<T>::Impl::MoeExpertsDown(const LayerParams& lp, LayerActs& a) {
  ForEachExpert(a, [&](int e, int64_t first, int64_t count) {
    if (count > 0)
      Linear(lp, ExpertTensor(config, e, 2), a.moe_y + first * C, a.hmid + first * I, nullptr, I, C, count);
  });
  if (config.shared_expert()) Linear(lp, SharedExpertTensor(config, 2), a.shared_y, a.shared_hmid, nullptr, S, C);
}

template <typename T>
void GptCompute<T>::Impl::MlpDown(const LayerParams& lp, LayerActs& a, int layer, T* out) {
  if (!config.moe_in(layer)) return Linear(lp, kDownW, out, a.hmid, nullptr, Id, C);
  MoeExpertsDown(lp, a);
  ops->MoeCombineForward(out, a.moe_y, a.moe_weights, TokenRows(a), RowSlot(a), N, K, C);
  if (!config.shared_expert()) return;
  if (config.shared_expert_gate) {
    ops->SigmoidGateForward(out, a.shared_y, a.shared_logit, N, C);
  } else {
    ops->Accumulate(out, a.shared_y, N * C);
  }
}

template <typename T>
void GptCompute<T>::Impl::MoeBackwardOut(const LayerParams& lp, LayerActs& a, const T* dout, const std::vector<T*>& g,
                                         kernels::GradMode mode) {
  Ops<T>& o = *ops;
  if (config.shared_expert()) {
    // d of the shared expert's output: dout, or through its gate (in
    // drows, free until the routed experts' gradients below).
    const T* dshared_y = dout;
    if (config.shared_expert_gate) {
      o.Zero(drows, N * C);
      o.Zero(dshared_logit, N);
      o.SigmoidGateBackward(drows, dshared_logit, dout, a.shared_y, a.shared_logit, N, C);
      dshared_y = drows;
    }
    o.Zero(dshared_h, N * S);
    const auto w = static_cast<size_t>(SharedExpertTensor(config, 2));
    LinearBackward(lp, static_cast<int>(w), dshared_h, g[w], nullptr, dshared_y, a.shared_hmid, S, C, mode);
  }
  o.Zero(drows, M * C);
  o.Zero(dweights, N * K);
  o.MoeCombineBackward(drows, dweights, dout, a.moe_y, a.moe_weights, RowToken(a), RowSlot(a), M, C);
  o.Zero(dh, M * I);
  ForEachExpert(a, [&](int e, int64_t first, int64_t count) {
    const int w = ExpertTensor(config, e, 2);
    if (count == 0) return ZeroIfSet(mode, {g[static_cast<size_t>(w)]}, int64_t{I} * C);  // no rows: no gradient
    LinearBackward(lp, w, dh + first * I, g[static_cast<size_t>(w)], nullptr, drows + first * C, a.hmid + first * I, I,
                   C, mode, count);
  });
}

template <typename T>
void GptCompute<T>::Impl::MoeBackwardIn(const LayerParams& lp, LayerActs& a, const std::vector<T*>& g,
                                        kernels::GradMode mode) {
  Ops<T>& o = *ops;
  o.Zero(dgate, M * I);
  o.Zero(dup, M * I);
  o.GluBackward(dgate, dup, a.gate, a.up, dh, M * I, config.mlp_glu);
  o.Zero(drows, M * C);  // d of the experts' inputs
  ForEachExpert(a, [&](int e, int64_t first, int64_t count) {
    for (int which = 0; which < 2; ++which) {
      const auto w = static_cast<size_t>(ExpertTensor(config, e, which));
      if (count == 0) {
        ZeroIfSet(mode, {g[w]}, int64_t{I} * C);
        continue;
      }
      const T* d = (which == 0 ? dgate : dup) + first * I;
      LinearBackward(lp, static_cast<int>(w), drows + first * C, g[w], nullptr, d, a.moe_x + first * C, C, I, mode,
                     count);
    }
  });
  o.Zero(dbuf_c, N * C);  // d ln2
  o.GatherRowsBackward(dbuf_c, drows, TokenRows(a), N, K, C);
  o.Zero(drouter, N * E);
  o.MoeRouteBackward(drouter, dweights, a.moe_probs, a.moe_experts, aux_ready ? aux_dprobs : nullptr, N,
                     config.routing());
  const int router = RouterIndex(config);
  LinearBackward(lp, router, dbuf_c, g[static_cast<size_t>(router)], nullptr, drouter, MlpInput(a), C, E, mode);
  // The selection bias only chooses: no gradient (kAdd adds none).
  if (config.router_bias) ZeroIfSet(mode, {g[static_cast<size_t>(RouterBiasIndex(config))]}, E);
  if (!config.shared_expert()) return;
  // dgate and dup: the routed experts' are done with.
  GatedMlpInBackward(lp, a, g, mode, SharedExpertTensor(config, 0), SharedExpertTensor(config, 1), a.shared_gate,
                     a.shared_up, dshared_h, S);
  if (config.shared_expert_gate) {
    const auto w = static_cast<size_t>(SharedGateIndex(config));
    LinearBackward(lp, static_cast<int>(w), dbuf_c, g[w], nullptr, dshared_logit, MlpInput(a), C, 1, mode);
  }
}

template <typename T>
void GptCompute<T>::Impl::GatedMlpIn(const LayerParams& lp, const LayerActs& a, int gate_w, int up_w, T* gate, T* up,
                                     T* hmid, int width) {
  Linear(lp, gate_w, gate, MlpInput(a), nullptr, C, width);
  Linear(lp, up_w, up, MlpInput(a), nullptr, C, width);
  ops->GluForward(hmid, gate, up, N * width, config.mlp_glu);
}

template <typename T>
void GptCompute<T>::Impl::GatedMlpInBackward(const LayerParams& lp, const LayerActs& a, const std::vector<T*>& g,
                                             kernels::GradMode mode, int gate_w, int up_w, const T* gate, const T* up,
                                             const T* dhid, int width) {
  Ops<T>& o = *ops;
  o.Zero(dgate, N * width);
  o.Zero(dup, N * width);
  o.GluBackward(dgate, dup, gate, up, dhid, N * width, config.mlp_glu);
  LinearBackward(lp, gate_w, dbuf_c, g[static_cast<size_t>(gate_w)], nullptr, dgate, MlpInput(a), C, width, mode);
  LinearBackward(lp, up_w, dbuf_c, g[static_cast<size_t>(up_w)], nullptr, dup, MlpInput(a), C, width, mode);
}

namespace {

// The cos and sin tables [T, rot/2] of the rotary embedding `rope` over
// rot columns, in double, with HF's "linear", "llama3", "longrope" or
// "yarn" frequency rescaling when configured.
void RopeTables(const RopeConfig& rope, int rot, int seq_len, std::vector<double>* cos, std::vector<double>* sin) {
  const int half = rot / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv_freq[i] = 1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / rot);
  if (rope.linear) {
    for (double& f : inv_freq) f /= rope.factor;
  }
  if (rope.longrope) {
    const std::vector<double>& ext = seq_len > rope.original_max_position ? rope.long_factor : rope.short_factor;
    for (int i = 0; i < half; ++i) inv_freq[i] /= ext[static_cast<size_t>(i)];
  }
  if (rope.llama3) {
    const double pi = 3.14159265358979323846;
    const double old_ctx = rope.original_max_position;
    const double low_wavelen = old_ctx / rope.low_freq_factor;
    const double high_wavelen = old_ctx / rope.high_freq_factor;
    for (double& f : inv_freq) {
      const double wavelen = 2 * pi / f;
      if (wavelen > low_wavelen) {
        f = f / rope.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
        f = (1 - smooth) * f / rope.factor + smooth * f;
      }
    }
  }
  if (rope.yarn) {
    // The dimension whose frequency turns `turns` times over the original
    // positions; between the two bounds the ramp runs from 0 to 1.
    const double pi = 3.14159265358979323846;
    auto dim_of = [&](double turns) {
      return rot * std::log(rope.original_max_position / (turns * 2 * pi)) / (2 * std::log(rope.theta));
    };
    double low = dim_of(rope.beta_fast), high = dim_of(rope.beta_slow);
    if (rope.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(rot - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);  // 1: interpolated
      inv_freq[i] = inv_freq[i] / rope.factor * ramp + inv_freq[i] * (1 - ramp);
    }
  }
  cos->resize(static_cast<size_t>(seq_len) * half);
  sin->resize(cos->size());
  // transformers forms the angle and its cos and sin in fp32 whatever the
  // model's dtype, so do we (fp64 runs then match its fp64 runs too), and
  // scales them by LongRoPE's or YaRN's attention factor in fp32.
  const float scale = static_cast<float>(rope.attention_factor);
  for (int t = 0; t < seq_len; ++t) {
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(static_cast<float>(t) * static_cast<float>(inv_freq[i]));
      (*cos)[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(angle)) * scale;
      (*sin)[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(angle)) * scale;
    }
  }
}

template <typename P>
Status CheckPointers(const std::vector<P>& v, size_t expected, const std::string& what) {
  if (v.size() != expected) {
    return Status::InvalidArgument(what + ": expected " + std::to_string(expected) + " tensors, got " +
                                   std::to_string(v.size()));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == nullptr) return Status::InvalidArgument(what + ": tensor " + std::to_string(i) + " is null");
  }
  return Status::Ok();
}

// A layer's groups run in order: a walk asked from `begin` while group
// `next` is due is refused.
Status CheckNextGroup(const char* what, int layer, int begin, int next) {
  if (begin == next) return Status::Ok();
  return Status::FailedPrecondition(std::string(what) + "(" + std::to_string(layer) + "): groups from " +
                                    std::to_string(begin) + " asked, group " + std::to_string(next) +
                                    " is next (a layer's groups run in order)");
}

// As CheckPointers, for the tensors of groups [begin, end) only (the
// others may be null: a sub-block walk has only its piece's tensors).
template <typename P>
Status CheckGroupPointers(const GptConfig& config, int layer, const std::vector<P>& v, size_t expected, int begin,
                          int end, const std::string& what) {
  if (v.size() != expected) {
    return Status::InvalidArgument(what + ": expected " + std::to_string(expected) + " tensors, got " +
                                   std::to_string(v.size()));
  }
  if (begin < 0 || end > kLayerGroups || begin >= end) {
    return Status::InvalidArgument(what + ": groups [" + std::to_string(begin) + ", " + std::to_string(end) +
                                   ") are not a range of [0, " + std::to_string(kLayerGroups) + ")");
  }
  const std::vector<std::vector<int>> groups = LayerTensorGroups(config, layer);
  for (int g = begin; g < end; ++g) {
    for (int t : groups[static_cast<size_t>(g)]) {
      if (v[static_cast<size_t>(t)] == nullptr) {
        return Status::InvalidArgument(what + ": tensor " + std::to_string(t) + " (group " + std::to_string(g) +
                                       ") is null");
      }
    }
  }
  return Status::Ok();
}

// As CheckGroupPointers for a layer's parameters handed over as values and
// 16-bit matrices: each tensor of the groups is in one of them, and a
// 16-bit one is a layer matrix in kBf16 or kF16, for ops that read those.
template <typename T>
Status CheckLayerParams(const GptConfig& config, int layer, const typename GptCompute<T>::LayerParams& params,
                        bool ops_read16, size_t expected, int begin, int end, const std::string& what) {
  if (params.matrices16.empty()) return CheckGroupPointers(config, layer, params.values, expected, begin, end, what);
  if (params.matrices16.size() != params.values.size()) {
    return Status::InvalidArgument(what + ": " + std::to_string(params.matrices16.size()) + " 16-bit entries for " +
                                   std::to_string(params.values.size()) + " tensors");
  }
  if (!ops_read16) return Status::InvalidArgument(what + ": 16-bit matrices handed to ops that do not read them");
  if (!kernels::cpu::IsWeight16(params.type16)) {
    return Status::InvalidArgument(what + ": 16-bit matrices must be bf16 or f16");
  }
  std::vector<const void*> present(params.values.begin(), params.values.end());
  for (size_t t = 0; t < present.size(); ++t) {
    if (params.matrices16[t] == nullptr) continue;
    if (!IsLayerMatrix(config, static_cast<int>(t))) {
      return Status::InvalidArgument(what + ": tensor " + std::to_string(t) + " is not a matrix; only matrices " +
                                     "may be handed over in 16 bits");
    }
    present[t] = params.matrices16[t];
  }
  return CheckGroupPointers(config, layer, present, expected, begin, end, what);
}

}  // namespace

bool IsLayerMatrix(const GptConfig& config, int tensor) {
  if (config.llama()) {
    return tensor == kQW || tensor == kKW || tensor == kVW || tensor == kOW || tensor == kGateW || tensor == kUpW ||
           tensor == kDownW || (LatentTensors(config) == 3 && tensor == LatentIndex(config) + 2) ||
           (config.moe() && tensor >= MoeExtraIndex(config) && tensor < RoutedLayerTensors(config) &&
            !Fp32RouterTensor(config, tensor));
  }
  return tensor == kQkvW || tensor == kAttProjW || tensor == kFcW || tensor == kFcProjW;
}

template <typename T>
GptCompute<T>::GptCompute(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

template <typename T>
GptCompute<T>::~GptCompute() = default;

template <typename T>
StatusOr<std::unique_ptr<GptCompute<T>>> GptCompute<T>::Create(const GptConfig& config, int batch, Ops<T>* ops,
                                                               Device* device, LayerActivations activations) {
  if (ops == nullptr || device == nullptr) return Status::InvalidArgument("GptCompute: ops and device are required");
  if (batch < 1) return Status::InvalidArgument("GptCompute: batch must be >= 1, got " + std::to_string(batch));
  if (config.vocab_size < 1 || config.seq_len < 1 || config.n_layer < 1 || config.n_head < 1 || config.n_embd < 1 ||
      (config.head_size == 0 && config.n_embd % config.n_head != 0) ||
      config.padded_vocab_size != PaddedVocab(config.vocab_size) || (!config.llama() && config.head_size != 0) ||
      !AscendingLayers(config.sliding_layers, config.n_layer) || config.sliding_window < 0 ||
      config.sliding_layers.empty() != (config.sliding_window == 0)) {
    return Status::InvalidArgument("GptCompute: inconsistent model config " + GptConfigToJson(config));
  }
  if (config.llama() &&
      (config.n_kv_head < 1 || config.n_head % config.n_kv_head != 0 || config.head_dim() < 2 ||
       (!config.mla() && config.head_dim() % 2 != 0) || config.intermediate_size < 1 || config.rope_dims() < 2 ||
       config.rope_dims() % 2 != 0 || config.rope_dims() > config.head_dim() ||
       (config.rope.longrope && (config.rope.short_factor.size() != static_cast<size_t>(config.rope_dims() / 2) ||
                                 config.rope.long_factor.size() != static_cast<size_t>(config.rope_dims() / 2))) ||
       !AscendingLayers(config.no_rope_layers, config.n_layer) ||
       !AscendingLayers(config.local_rope_layers, config.n_layer) || !(config.local_rope_theta >= 0) ||
       !(config.attn_scalar >= 0) || !SoftcapValid(config.attn_softcap) || !SoftcapValid(config.final_softcap) ||
       !MultiplierValid(config.embed_multiplier) || !MultiplierValid(config.residual_multiplier) ||
       !MultiplierValid(config.logits_scaling) || (config.embed_scale && config.embed_multiplier != 1) ||
       (config.sandwich_norms && config.residual_multiplier != 1) ||
       (config.post_norms && (config.sandwich_norms || config.residual_multiplier != 1)) ||
       (config.qk_norm_all_heads && (!config.qk_norm || config.norm_unit_offset)) ||
       (config.rope.linear && !(config.rope.factor > 0)) || (config.rope.yarn && !YarnValid(config.rope)) ||
       config.rope.linear + config.rope.llama3 + config.rope.longrope + config.rope.yarn > 1 ||
       config.padding_token < -1 || config.padding_token >= config.vocab_size ||
       (config.moe() &&
        (config.experts_per_token < 1 || config.experts_per_token > config.n_experts ||
         config.experts_per_token > kernels::cpu::kMaxExpertsPerToken ||
         int64_t{batch} * config.seq_len * config.experts_per_token > std::numeric_limits<int32_t>::max())) ||
       config.n_experts < 0 || config.shared_expert_size < 0 || (config.shared_expert() && !config.moe()) ||
       (config.shared_expert_gate && !config.shared_expert()) ||
       (!config.dense_layers.empty() && (!config.moe() || !AscendingLayers(config.dense_layers, config.n_layer) ||
                                         config.routed_layers() < 1 || config.dense_intermediate_size < 1)))) {
    return Status::InvalidArgument("GptCompute: inconsistent llama-family config " + GptConfigToJson(config));
  }
  // A training choice, not the model's shape: GptConfigToJson (the
  // checkpoints' model identity) leaves it out, so it is named here.
  if (!(config.router_aux_coef >= 0 && std::isfinite(config.router_aux_coef)) ||
      (config.router_aux_coef > 0 &&
       (!config.moe() || config.sigmoid_router() || config.router_bias || config.router_groups > 1))) {
    return Status::InvalidArgument("GptCompute: router_aux_coef " + std::to_string(config.router_aux_coef) +
                                   ": the load-balancing loss takes a finite coefficient >= 0, and experts with a "
                                   "softmax router, no selection bias (router_bias) and no groups");
  }
  // The router's groups: G groups of at least group_best experts each (a
  // group scores by its group_best best), enough candidates for k.
  const int G = config.router_groups, TG = config.router_topk_groups, best = config.router_group_best;
  const bool groups_valid = G >= 1 && G <= kernels::kMaxRouterGroups && TG >= 1 && TG <= G &&
                            (best == 1 || best == 2) &&
                            (G == 1 || (config.moe() && config.n_experts % G == 0 && config.n_experts / G >= best &&
                                        config.experts_per_token <= TG * (config.n_experts / G)));
  const bool norm_min_valid =
      config.router_norm_min == 0 ||
      (config.moe() && config.norm_topk_prob && config.router_norm_min > 0 && std::isfinite(config.router_norm_min));
  if (!groups_valid || (config.sigmoid_router() && !config.moe()) ||
      !(config.routed_scale > 0 && std::isfinite(config.routed_scale)) || (config.routed_scale != 1 && !config.moe()) ||
      (config.sigmoid_router() && !config.router_bias) || (config.router_bias && !config.moe()) || !norm_min_valid ||
      (config.router_fp32 && !config.moe())) {
    return Status::InvalidArgument(
        "GptCompute: router_topk_groups " + std::to_string(TG) + " of router_groups " + std::to_string(G) + " (" +
        std::to_string(config.n_experts) + " experts, " + std::to_string(config.experts_per_token) +
        " a token, groups scored by their best " + std::to_string(best) + "), routed_scale " +
        std::to_string(config.routed_scale) + ", router_bias " + (config.router_bias ? "true" : "false") +
        ", router_norm_min " + std::to_string(config.router_norm_min) +
        ": groups need experts, divide them into groups of at least the best 1 or 2 each scores by "
        "(router_group_best), and hold the experts a token takes; a sigmoid router has a selection bias "
        "(router_bias), which needs experts, as does a router kept in fp32 (router_fp32); "
        "routed_scale is positive, and 1 without experts; router_norm_min is 0, or positive and finite with "
        "normalized weights (norm_topk_prob)");
  }
  // Latent attention: the value heads no wider than the query/key ones
  // (the attention runs them padded to head_size), whole heads of q/k
  // projections without biases or norms of their own.
  const int dr = config.qk_rope_head_dim;
  const bool mla_valid =
      !config.mla() ? config.kv_lora_rank == 0 && config.q_lora_rank == 0 && dr == 0 && config.v_head_dim == 0
                    : config.llama() && config.q_lora_rank >= 0 && config.head_size > 0 && dr >= 2 && dr % 2 == 0 &&
                          dr <= config.head_size && config.v_head_dim >= 1 && config.v_head_dim <= config.head_size &&
                          config.n_kv_head == config.n_head && !config.qkv_bias && !config.qk_norm &&
                          config.no_rope_layers.empty() && config.rope.partial_factor == 1.0 &&
                          config.latent_norm_eps > 0 && std::isfinite(config.latent_norm_eps);
  if (!mla_valid) {
    return Status::InvalidArgument(
        "GptCompute: latent attention's kv_lora_rank " + std::to_string(config.kv_lora_rank) + ", q_lora_rank " +
        std::to_string(config.q_lora_rank) + ", qk_rope_head_dim " + std::to_string(dr) + ", v_head_dim " +
        std::to_string(config.v_head_dim) + " (head_size " + std::to_string(config.head_size) +
        "): all 0 without it; with it (llama family) an even qk_rope_head_dim of 2 or more and a v_head_dim of 1 "
        "or more, neither above head_size, as many key/value heads as heads, a positive latent_norm_eps, no q/k/v "
        "biases, q/k norms, NoPE layers or partial_rotary_factor");
  }
  if (!config.llama() &&
      (config.norm_unit_offset || config.mlp_glu != kernels::Glu::kSilu || config.embed_scale ||
       config.attn_scalar != 0 || config.sandwich_norms || !config.local_rope_layers.empty() || config.post_norms ||
       config.qk_norm_all_heads || config.attn_softcap != 0 || config.final_softcap != 0 ||
       config.padding_token != -1 || config.embed_multiplier != 1 || config.residual_multiplier != 1 ||
       config.logits_scaling != 1 || config.n_experts != 0 || config.shared_expert_size != 0 ||
       config.shared_expert_gate || !config.dense_layers.empty())) {
    return Status::InvalidArgument("GptCompute: Gemma's, Granite's and the experts' fields are for the llama family: " +
                                   GptConfigToJson(config));
  }
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.config = config;
  m.attn_softcap = static_cast<float>(config.attn_softcap);
  m.final_softcap = static_cast<T>(config.final_softcap);
  m.residual_multiplier = static_cast<T>(config.residual_multiplier);
  m.logit_scale = static_cast<T>(1.0 / config.logits_scaling);
  m.B = batch;
  m.ops = ops;
  m.device = device;
  m.C = config.n_embd;
  m.A = config.attn_width();
  m.N = static_cast<int64_t>(batch) * config.seq_len;
  const int64_t N = m.N, C = m.C, L = config.n_layer, Vp = config.padded_vocab_size;
  const int64_t scratch_elems =
      ops->AttentionScratchElems(batch, config.seq_len, m.A, config.n_head, static_cast<float>(config.attn_softcap));
  m.head_rows = std::clamp<int64_t>(kHeadChunkBytes / (2 * Vp * static_cast<int64_t>(sizeof(T))), 1, N);

  ZINF_RETURN_IF_ERROR(m.Alloc(&m.tokens, N, "input tokens"));
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.targets, N, "target tokens"));
  m.x.resize(L + 1);
  m.offload = activations == LayerActivations::kOffload;
  if (m.offload) {
    aio::PinnedPoolOptions host;
    host.buffer_count = 1;
    host.buffer_bytes = (L + 1) * N * C * static_cast<int64_t>(sizeof(T));
    host.name = "activation checkpoints (layer inputs x_0 .. x_L)";
    ZINF_ASSIGN_OR_RETURN(m.host_pool, aio::PinnedPool::Create(host));
    ZINF_ASSIGN_OR_RETURN(m.host_buffer, m.host_pool->TryAcquire());
    m.host_x = reinterpret_cast<T*>(m.host_buffer.data());
    ZINF_ASSIGN_OR_RETURN(m.copies, device->CreateStream());
    std::array<T*, Impl::kSlots> slots{};
    for (int64_t s = 0; s < std::min<int64_t>(L + 1, Impl::kSlots); ++s) {
      ZINF_RETURN_IF_ERROR(m.Alloc(&slots[static_cast<size_t>(s)], N * C, "layer input slot"));
    }
    for (int64_t l = 0; l <= L; ++l) m.x[static_cast<size_t>(l)] = slots[static_cast<size_t>(l % Impl::kSlots)];
  } else {
    for (int64_t l = 0; l <= L; ++l) ZINF_RETURN_IF_ERROR(m.Alloc(&m.x[l], N * C, "layer input x"));
  }
  if (config.llama()) {
    m.hd = config.head_dim();
    m.rot = config.rope_dims();
    m.Ckv = config.n_kv_head * m.hd;
    m.I = config.intermediate_size;
    m.Id = config.dense_width();
    m.mlp_rows = m.N;
    if (config.mla()) {
      m.rq = config.q_lora_rank;
      m.rkv = config.kv_lora_rank;
      m.dn = m.hd - m.rot;
      m.dv_head = config.v_head_dim;
    }
    if (config.moe()) {
      m.E = config.n_experts;
      m.K = config.experts_per_token;
      m.M = m.mlp_rows = m.N * m.K;
      m.host_experts.resize(static_cast<size_t>(m.M));
      m.host_rows.resize(3 * static_cast<size_t>(m.M));
      m.S = config.shared_expert_size;
    }
  }
  m.keep = activations == LayerActivations::kKeep;
  m.acts.resize(m.keep ? static_cast<size_t>(L) : 1);
  for (typename Impl::LayerActs& a : m.acts) ZINF_RETURN_IF_ERROR(m.AllocateLayerActs(&a));
  if (config.llama()) {
    ZINF_RETURN_IF_ERROR(m.AllocateLlama());
    return std::unique_ptr<GptCompute<T>>(new GptCompute<T>(std::move(impl)));
  }
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.attn_scratch, scratch_elems, "attention scratch"));
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.lnf, N * C, "lnf"));
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.lnf_mean, N, "lnf mean"));
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.lnf_rstd, N, "lnf rstd"));
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.logits, m.head_rows * Vp, "logits"));
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.dlogits, m.head_rows * Vp, "logit gradients"));
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.losses, N, "losses"));
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.dres, N * C, "residual gradient"));
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.dbuf_c, N * C, "layer gradient"));
  ZINF_RETURN_IF_ERROR(m.Alloc(&m.dbuf_4c, N * 4 * C, "mlp gradient"));
  return std::unique_ptr<GptCompute<T>>(new GptCompute<T>(std::move(impl)));
}

template <typename T>
Status GptCompute<T>::Impl::AllocateLayerActs(LayerActs* a) {
  const int64_t att_elems = ops->AttentionSavedElems(B, config.seq_len, A, config.n_head);
  const bool llama = config.llama(), pre_norms = !config.post_norms;  // post norms: no ln1, ln2
  if (pre_norms) {
    ZINF_RETURN_IF_ERROR(Alloc(&a->ln1, N * C, llama ? "attention norm" : "ln1"));
    if (!llama) ZINF_RETURN_IF_ERROR(Alloc(&a->ln1_mean, N, "ln1 mean"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->ln1_rstd, N, llama ? "attention norm rstd" : "ln1 rstd"));
  }
  ZINF_RETURN_IF_ERROR(Alloc(&a->qkv, N * 3 * A, "qkv"));
  ZINF_RETURN_IF_ERROR(Alloc(&a->atty, N * A, "attention output"));
  ZINF_RETURN_IF_ERROR(Alloc(&a->att, att_elems, "attention probabilities (or log-sum-exps)"));
  ZINF_RETURN_IF_ERROR(Alloc(&a->mid, N * C, "residual mid"));
  if (pre_norms) {
    ZINF_RETURN_IF_ERROR(Alloc(&a->ln2, N * C, llama ? "mlp norm" : "ln2"));
    if (!llama) ZINF_RETURN_IF_ERROR(Alloc(&a->ln2_mean, N, "ln2 mean"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->ln2_rstd, N, llama ? "mlp norm rstd" : "ln2 rstd"));
  }
  if (!llama) {
    ZINF_RETURN_IF_ERROR(Alloc(&a->fch, N * 4 * C, "mlp hidden"));
    return Alloc(&a->fch_gelu, N * 4 * C, "mlp gelu");
  }
  // The routed rows, or a dense layer's (among routed ones: the larger).
  const int64_t wide = std::max(mlp_rows * I, N * Id);
  ZINF_RETURN_IF_ERROR(Alloc(&a->gate, wide, "mlp gate"));
  ZINF_RETURN_IF_ERROR(Alloc(&a->up, wide, "mlp up"));
  ZINF_RETURN_IF_ERROR(Alloc(&a->hmid, wide, "mlp hidden"));
  if (config.branch_norms()) {
    ZINF_RETURN_IF_ERROR(Alloc(&a->attn_o, N * C, "attention output projection"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->attn_o_rstd, N, "post-attention norm rstd"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->mlp_o, N * C, "mlp output projection"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->mlp_o_rstd, N, "post-mlp norm rstd"));
  }
  if (config.moe()) {
    ZINF_RETURN_IF_ERROR(Alloc(&a->moe_probs, N * E, "router probabilities"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->moe_weights, N * K, "routing weights"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->moe_experts, N * K, "routed experts"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->moe_rows, 3 * M, "expert dispatch"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->moe_x, M * C, "expert inputs"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->moe_y, M * C, "expert outputs"));
    a->moe_offsets.assign(static_cast<size_t>(E) + 1, 0);
  }
  if (config.shared_expert()) {
    ZINF_RETURN_IF_ERROR(Alloc(&a->shared_gate, N * S, "shared expert gate"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->shared_up, N * S, "shared expert up"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->shared_hmid, N * S, "shared expert hidden"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->shared_y, N * C, "shared expert output"));
    if (config.shared_expert_gate) ZINF_RETURN_IF_ERROR(Alloc(&a->shared_logit, N, "shared expert gate logit"));
  }
  if (config.mla()) {
    if (rq > 0) {
      ZINF_RETURN_IF_ERROR(Alloc(&a->q_lat_pre, N * rq, "q latent before its norm"));
      ZINF_RETURN_IF_ERROR(Alloc(&a->q_lat, N * rq, "q latent"));
      ZINF_RETURN_IF_ERROR(Alloc(&a->q_lat_rstd, N, "q latent norm rstd"));
    }
    ZINF_RETURN_IF_ERROR(Alloc(&a->kv_lat_pre, N * rkv, "kv latent before its norm"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->kv_lat, N * rkv, "kv latent"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->kv_lat_rstd, N, "kv latent norm rstd"));
    ZINF_RETURN_IF_ERROR(Alloc(&a->atty_v, N * config.attn_out_width(), "attention values"));
  }
  if (!config.qk_norm) return Status::Ok();
  ZINF_RETURN_IF_ERROR(Alloc(&a->q_pre, N * A, "q before its norm"));
  ZINF_RETURN_IF_ERROR(Alloc(&a->k_pre, N * Ckv, "k before its norm"));
  ZINF_RETURN_IF_ERROR(Alloc(&a->q_rstd, N * A / config.q_norm_width(), "q norm rstd"));
  return Alloc(&a->k_rstd, N * Ckv / config.k_norm_width(), "k norm rstd");
}

// Everything after the tokens, the layer inputs and the layer activations,
// for kLlama.
template <typename T>
Status GptCompute<T>::Impl::AllocateLlama() {
  const int T_ = config.seq_len;
  const int64_t Vp = config.padded_vocab_size;
  const int64_t kv = N * Ckv, wide = std::max(mlp_rows * I, N * Id);
  const int64_t half_table = static_cast<int64_t>(T_) * (rot / 2);
  ZINF_RETURN_IF_ERROR(Alloc(&rope_cos, half_table, "rope cos"));
  ZINF_RETURN_IF_ERROR(Alloc(&rope_sin, half_table, "rope sin"));
  ZINF_RETURN_IF_ERROR(Alloc(&zero_pos, static_cast<int64_t>(T_) * C, "zero positions"));
  ZINF_RETURN_IF_ERROR(Alloc(&dpos, static_cast<int64_t>(T_) * C, "position gradient sink"));
  ZINF_RETURN_IF_ERROR(Alloc(&q, N * A, "q"));
  ZINF_RETURN_IF_ERROR(Alloc(&k, kv, "k"));
  ZINF_RETURN_IF_ERROR(Alloc(&v, kv, "v"));
  ZINF_RETURN_IF_ERROR(
      Alloc(&attn_scratch, ops->AttentionScratchElems(B, T_, A, config.n_head, attn_softcap), "attention scratch"));
  ZINF_RETURN_IF_ERROR(Alloc(&lnf, N * C, "final norm"));
  ZINF_RETURN_IF_ERROR(Alloc(&lnf_rstd, N, "final norm rstd"));
  ZINF_RETURN_IF_ERROR(Alloc(&logits, head_rows * Vp, "logits"));
  ZINF_RETURN_IF_ERROR(Alloc(&dlogits, head_rows * Vp, "logit gradients"));
  ZINF_RETURN_IF_ERROR(Alloc(&losses, N, "losses"));
  ZINF_RETURN_IF_ERROR(Alloc(&dres, N * C, "residual gradient"));
  ZINF_RETURN_IF_ERROR(Alloc(&dbuf_c, N * std::max(C, A), "layer gradient"));
  ZINF_RETURN_IF_ERROR(Alloc(&dh, wide, "mlp hidden gradient"));
  // The routed experts' and then the shared expert's.
  ZINF_RETURN_IF_ERROR(Alloc(&dgate, std::max(wide, N * S), "mlp gate gradient"));
  ZINF_RETURN_IF_ERROR(Alloc(&dup, std::max(wide, N * S), "mlp up gradient"));
  ZINF_RETURN_IF_ERROR(Alloc(&dqkv, N * 3 * A, "qkv gradient"));
  ZINF_RETURN_IF_ERROR(Alloc(&dq_rot, N * A, "rotated q gradient"));
  ZINF_RETURN_IF_ERROR(Alloc(&dq, N * A, "q gradient"));
  ZINF_RETURN_IF_ERROR(Alloc(&dk_rot, kv, "rotated k gradient"));
  ZINF_RETURN_IF_ERROR(Alloc(&dk, kv, "k gradient"));
  ZINF_RETURN_IF_ERROR(Alloc(&dv, kv, "v gradient"));
  if (config.mla()) {
    ZINF_RETURN_IF_ERROR(Alloc(&mla_q, N * A, "latent attention q (its gradient)"));
    ZINF_RETURN_IF_ERROR(Alloc(&mla_kv, N * KvaWidth(), "kv latent projection (its gradient)"));
    ZINF_RETURN_IF_ERROR(Alloc(&mla_kvb, N * KvbWidth(), "kv_b projection (its gradient)"));
    ZINF_RETURN_IF_ERROR(Alloc(&dlat, N * std::max(rq, rkv), "latent gradient"));
    ZINF_RETURN_IF_ERROR(Alloc(&dlat_pre, N * std::max(rq, rkv), "latent gradient before its norm"));
  }
  if (config.moe()) {
    ZINF_RETURN_IF_ERROR(Alloc(&drows, M * C, "expert row gradient"));
    ZINF_RETURN_IF_ERROR(Alloc(&dweights, N * K, "routing weight gradient"));
    ZINF_RETURN_IF_ERROR(Alloc(&drouter, N * E, "router logit gradient"));
    if (config.shared_expert()) ZINF_RETURN_IF_ERROR(Alloc(&dshared_h, N * S, "shared expert hidden gradient"));
    if (config.shared_expert_gate) ZINF_RETURN_IF_ERROR(Alloc(&dshared_logit, N, "shared expert gate gradient"));
    if (config.router_aux_coef > 0) {
      ZINF_RETURN_IF_ERROR(Alloc(&aux_dprobs, E, "load-balancing loss gradient"));
      aux_counts.assign(static_cast<size_t>(E), 0.0);
      aux_probs.assign(static_cast<size_t>(E), 0.0);
      host_probs.resize(static_cast<size_t>(N * E));
      host_aux_dprobs.resize(static_cast<size_t>(E));
    }
  }
  const bool local_rope = config.local_rope_theta > 0 && !config.local_rope_layers.empty();
  if (local_rope) {
    ZINF_RETURN_IF_ERROR(Alloc(&local_cos, half_table, "local rope cos"));
    ZINF_RETURN_IF_ERROR(Alloc(&local_sin, half_table, "local rope sin"));
  }
  const int64_t norm_elems = std::max({C, hd, rq, rkv});
  if (config.norm_unit_offset) {
    ZINF_RETURN_IF_ERROR(Alloc(&ones, norm_elems, "norm unit offsets"));
    ZINF_RETURN_IF_ERROR(Alloc(&norm_w, norm_elems, "norm weights plus one"));
  }
  if (config.branch_norms() || config.residual_multiplier != 1) {
    ZINF_RETURN_IF_ERROR(Alloc(&dpost, N * C, "post norm or branch gradient"));
  }
  if (config.attn_scalar > 0 && config.attn_scalar != hd) {
    q_scale = static_cast<T>(std::sqrt(static_cast<double>(hd) / config.attn_scalar));
  }
  // The tables stay alive until Synchronize: the copies may be queued.
  std::vector<T> tables[4];
  auto upload = [&](const RopeConfig& rope, T* cos_d, T* sin_d, std::vector<T>* cos_t, std::vector<T>* sin_t) {
    std::vector<double> cos64, sin64;
    RopeTables(rope, rot, T_, &cos64, &sin64);
    cos_t->assign(cos64.begin(), cos64.end());
    sin_t->assign(sin64.begin(), sin64.end());
    ops->CopyToDevice(cos_d, cos_t->data(), sizeof(T) * cos_t->size());
    ops->CopyToDevice(sin_d, sin_t->data(), sizeof(T) * sin_t->size());
  };
  upload(config.rope, rope_cos, rope_sin, &tables[0], &tables[1]);
  if (local_rope) {  // Gemma 3's and OLMo 3's: the local base, no scaling
    RopeConfig local;
    local.theta = config.local_rope_theta;
    local.partial_factor = config.rope.partial_factor;
    upload(local, local_cos, local_sin, &tables[2], &tables[3]);
  }
  ops->Zero(zero_pos, static_cast<int64_t>(T_) * C);
  std::vector<T> unit(static_cast<size_t>(norm_elems), T(1));
  if (config.norm_unit_offset) ops->CopyToDevice(ones, unit.data(), sizeof(T) * unit.size());
  return ops->Synchronize();
}

template <typename T>
const GptConfig& GptCompute<T>::config() const {
  return impl_->config;
}
template <typename T>
int GptCompute<T>::batch() const {
  return impl_->B;
}
template <typename T>
int64_t GptCompute<T>::activation_bytes() const {
  return impl_->bytes;
}
template <typename T>
double GptCompute<T>::cross_entropy() const {
  return impl_->cross_entropy;
}
template <typename T>
int64_t GptCompute<T>::host_activation_bytes() const {
  return impl_->host_pool != nullptr ? static_cast<int64_t>(impl_->host_pool->region().size()) : 0;
}
template <typename T>
bool GptCompute<T>::keeps_activations() const {
  return impl_->keep;
}
template <typename T>
Ops<T>& GptCompute<T>::ops() {
  return *impl_->ops;
}

template <typename T>
Status GptCompute<T>::SetBatch(const int32_t* inputs, const int32_t* targets) {
  Impl& m = *impl_;
  if (inputs == nullptr || targets == nullptr) return Status::InvalidArgument("SetBatch: null token array");
  const int V = m.config.vocab_size;
  for (int64_t i = 0; i < m.N; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V) {
      return Status::InvalidArgument("SetBatch: input token " + std::to_string(i) + " is " + std::to_string(inputs[i]) +
                                     ", outside [0, " + std::to_string(V) + ")");
    }
    if (targets[i] < 0 || targets[i] >= V) {
      return Status::InvalidArgument("SetBatch: target token " + std::to_string(i) + " is " +
                                     std::to_string(targets[i]) + ", outside [0, " + std::to_string(V) + ")");
    }
  }
  m.ops->CopyToDevice(m.tokens, inputs, sizeof(int32_t) * m.N);
  m.ops->CopyToDevice(m.targets, targets, sizeof(int32_t) * m.N);
  // The caller's arrays may be gone or rewritten once this returns.
  ZINF_RETURN_IF_ERROR(m.ops->Synchronize());
  m.batch_set = true;
  m.forward_done = -1;
  m.forward_group = 0;
  m.recompute_group = 0;
  m.backward_end = kLayerGroups;
  m.head_backward_done = false;
  m.backward_next = -1;
  m.kept_consumed = false;
  return Status::Ok();
}

template <typename T>
Status GptCompute<T>::EmbedForward(const std::vector<const T*>& embed) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(CheckPointers(embed, m.config.llama() ? 1 : 2, "EmbedForward"));
  if (!m.batch_set) return Status::FailedPrecondition("EmbedForward: no batch (call SetBatch first)");
  // kLlama has no position rows: the encoder adds zeros (x + 0 is x exactly).
  const T* wpe = m.config.llama() ? m.zero_pos : embed[kWpe];
  ZINF_RETURN_IF_ERROR(m.BeforeWritingInput(0));
  m.ops->EncoderForward(m.x[0], m.tokens, embed[kWte], wpe, m.B, m.config.seq_len, m.C);
  if (m.ScalesEmbedding()) m.ops->Scale(m.x[0], m.EmbedScale(), m.N * m.C);
  ZINF_RETURN_IF_ERROR(m.AfterWritingInput(0));
  m.forward_done = 0;
  m.forward_group = 0;
  m.recompute_group = 0;
  m.backward_end = kLayerGroups;
  m.head_backward_done = false;
  m.backward_next = -1;
  m.kept_consumed = false;
  std::fill(m.aux_counts.begin(), m.aux_counts.end(), 0.0);
  std::fill(m.aux_probs.begin(), m.aux_probs.end(), 0.0);
  m.aux_ready = false;
  return Status::Ok();
}

template <typename T>
Status GptCompute<T>::LayerForward(int layer, const std::vector<const T*>& params) {
  ZINF_RETURN_IF_ERROR(CheckPointers(params, impl_->LayerTensorCount(layer), "LayerForward"));
  return LayerForwardGroups(layer, 0, kLayerGroups, params);
}

template <typename T>
Status GptCompute<T>::LayerForwardGroups(int layer, int begin, int end, const std::vector<const T*>& params) {
  return LayerForwardGroups(layer, begin, end, LayerParams{params, {}, ElementType::kBf16});
}

template <typename T>
Status GptCompute<T>::LayerForwardGroups(int layer, int begin, int end, const LayerParams& params) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(CheckLayerParams<T>(m.config, layer, params, m.ops->reads_weights16(), m.LayerTensorCount(layer),
                                           begin, end, "LayerForward"));
  if (layer < 0 || layer >= m.config.n_layer) {
    return Status::InvalidArgument("LayerForward: layer " + std::to_string(layer) + " out of range");
  }
  if (m.forward_done != layer) {
    return Status::FailedPrecondition("LayerForward(" + std::to_string(layer) + "): the input of layer " +
                                      std::to_string(layer) + " has not been computed (forward runs embed, " +
                                      "layers 0..L-1 in order)");
  }
  ZINF_RETURN_IF_ERROR(CheckNextGroup("LayerForward", layer, begin, m.forward_group));
  if (end == kLayerGroups) ZINF_RETURN_IF_ERROR(m.BeforeWritingInput(layer + 1));  // the last group writes x_{l+1}
  for (int g = begin; g < end; ++g) m.ForwardGroup(layer, g, params);
  m.forward_group = end;
  if (end == kLayerGroups) {
    ZINF_RETURN_IF_ERROR(m.AfterWritingInput(layer + 1));
    m.forward_done = layer + 1;
    m.forward_group = 0;
  }
  return Status::Ok();
}

template <typename T>
StatusOr<double> GptCompute<T>::HeadForward(const std::vector<const T*>& head, const T* lm_head, const HeadGrads* grads,
                                            double loss_scale, T* host_logits) {
  Impl& m = *impl_;
  const size_t head_tensors = (m.config.llama() ? 1 : 2) + (m.config.tied_embeddings ? 0 : 1);
  ZINF_RETURN_IF_ERROR(CheckPointers(head, head_tensors, "HeadForward"));
  if (lm_head == nullptr) return Status::InvalidArgument("HeadForward: lm_head is null");
  if (grads != nullptr) {
    ZINF_RETURN_IF_ERROR(CheckPointers(grads->head, head.size(), "HeadForward grads"));
    if (grads->lm_head == nullptr) return Status::InvalidArgument("HeadForward: grads->lm_head is null");
  }
  const int L = m.config.n_layer;
  if (m.forward_done != L) {
    return Status::FailedPrecondition("HeadForward: the forward pass has not reached the head (layer " +
                                      std::to_string(m.forward_done) + " of " + std::to_string(L) + " done)");
  }
  if (grads != nullptr && m.kept_consumed) {
    return Status::FailedPrecondition(
        "HeadForward: a backward has used up the kept activations; run the forward again first");
  }
  Ops<T>& o = *m.ops;
  const int64_t N = m.N, C = m.C;
  const int V = m.config.vocab_size, Vp = m.config.padded_vocab_size;
  const T dloss = static_cast<T>(loss_scale / static_cast<double>(N));
  // Offloaded: a backward since the forward may have loaded an earlier
  // input into x_L's slot (a recompute may run the head again).
  ZINF_RETURN_IF_ERROR(m.LoadInput(L));
  ZINF_RETURN_IF_ERROR(m.KernelsAfter(m.copied_in[static_cast<size_t>(L % Impl::kSlots)]));
  // The final norm's weight (1 + w with norm_unit_offset), kept for its backward.
  const T* lnf_w = m.config.llama() ? m.NormWeight(head[0], m.C) : nullptr;
  if (m.config.llama()) {
    o.RmsNormForward(m.lnf, m.lnf_rstd, m.x[L], lnf_w, N, m.C, m.config.norm_eps);
  } else {
    o.LayerNormForward(m.lnf, m.lnf_mean, m.lnf_rstd, m.x[L], head[kLnfW], head[kLnfB], N, m.C);
  }
  if (grads != nullptr) o.Zero(m.dbuf_c, N * C);  // d lnf
  for (int64_t r0 = 0; r0 < N; r0 += m.head_rows) {
    const int64_t rows = std::min(m.head_rows, N - r0);
    o.MatmulForward(m.logits, m.lnf + r0 * C, lm_head, nullptr, rows, m.C, Vp);
    if (m.logit_scale != T(1)) o.Scale(m.logits, m.logit_scale, rows * Vp);
    if (m.final_softcap > T(0)) o.SoftcapForward(m.logits, m.final_softcap, rows * Vp);
    if (host_logits != nullptr) o.CopyToHost(host_logits + r0 * Vp, m.logits, sizeof(T) * rows * Vp);
    if (grads != nullptr) o.Zero(m.dlogits, rows * Vp);
    o.CrossEntropyForwardBackward(m.losses + r0, grads != nullptr ? m.dlogits : nullptr, m.logits, m.targets + r0, rows,
                                  V, Vp, dloss);
    if (grads != nullptr) {
      if (m.final_softcap > T(0)) o.SoftcapBackward(m.dlogits, m.logits, m.final_softcap, rows * Vp);
      if (m.logit_scale != T(1)) o.Scale(m.dlogits, m.logit_scale, rows * Vp);
      o.MatmulBackward(m.dbuf_c + r0 * C, grads->lm_head, nullptr, m.dlogits, m.lnf + r0 * C, lm_head, rows, m.C, Vp,
                       kernels::GradMode::kAdd);
    }
  }
  if (grads != nullptr) {
    o.Zero(m.dres, N * C);
    if (m.config.llama()) {
      o.RmsNormBackward(m.dres, grads->head[0], m.dbuf_c, m.x[L], lnf_w, m.lnf_rstd, N, m.C);
    } else {
      o.LayerNormBackward(m.dres, grads->head[kLnfW], grads->head[kLnfB], m.dbuf_c, m.x[L], head[kLnfW], m.lnf_mean,
                          m.lnf_rstd, N, m.C);
    }
  }
  // The load-balancing loss, E sum_e f_e P_e over R = L * N rows (L the
  // routed layers): its gradient on each token's probability of expert e
  // is E f_e / R (times the coefficient and loss_scale), the same in every
  // routed layer.
  double aux = 0;
  if (m.config.router_aux_coef > 0) {
    const double R = static_cast<double>(m.config.routed_layers()) * static_cast<double>(N), E = m.E;
    for (int e = 0; e < m.E; ++e) {
      const double f = m.aux_counts[static_cast<size_t>(e)] / R;
      aux += f * (m.aux_probs[static_cast<size_t>(e)] / R);
      m.host_aux_dprobs[static_cast<size_t>(e)] = static_cast<T>(loss_scale * m.config.router_aux_coef * E * f / R);
    }
    aux *= E;
    if (grads != nullptr) o.CopyToDevice(m.aux_dprobs, m.host_aux_dprobs.data(), sizeof(T) * m.host_aux_dprobs.size());
    m.aux_ready = grads != nullptr;
  }
  std::vector<T> losses(static_cast<size_t>(N));
  o.CopyToHost(losses.data(), m.losses, sizeof(T) * N);
  ZINF_RETURN_IF_ERROR(o.Synchronize());
  double sum = 0.0;
  for (T v : losses) sum += static_cast<double>(v);
  m.head_backward_done = grads != nullptr;
  m.backward_next = grads != nullptr ? L - 1 : -1;
  m.forward_group = 0;
  m.recompute_group = 0;
  m.backward_end = kLayerGroups;
  m.cross_entropy = sum / static_cast<double>(N);
  return m.cross_entropy + m.config.router_aux_coef * aux;  // transformers' loss + coef * aux_loss
}

template <typename T>
Status GptCompute<T>::LayerBackward(int layer, const std::vector<const T*>& params, const std::vector<T*>& grads) {
  const size_t n = impl_->LayerTensorCount(layer);
  ZINF_RETURN_IF_ERROR(CheckPointers(params, n, "LayerBackward params"));
  ZINF_RETURN_IF_ERROR(CheckPointers(grads, n, "LayerBackward grads"));
  if (!impl_->keep) ZINF_RETURN_IF_ERROR(LayerRecomputeGroups(layer, 0, kMlpOutGroup, params));
  return LayerBackwardGroups(layer, 0, kLayerGroups, params, grads);
}

template <typename T>
Status GptCompute<T>::Impl::CheckBackwardLayer(int layer, const char* what) const {
  if (layer < 0 || layer >= config.n_layer) {
    return Status::InvalidArgument(std::string(what) + ": layer " + std::to_string(layer) + " out of range");
  }
  if (!head_backward_done || backward_next != layer) {
    return Status::FailedPrecondition(std::string(what) + "(" + std::to_string(layer) +
                                      "): backward runs after HeadForward with grads, layers L-1 down to 0; " +
                                      "expected layer " + std::to_string(backward_next));
  }
  return Status::Ok();
}

template <typename T>
Status GptCompute<T>::LayerRecomputeGroups(int layer, int begin, int end, const std::vector<const T*>& params) {
  return LayerRecomputeGroups(layer, begin, end, LayerParams{params, {}, ElementType::kBf16});
}

template <typename T>
Status GptCompute<T>::LayerRecomputeGroups(int layer, int begin, int end, const LayerParams& params) {
  Impl& m = *impl_;
  if (m.keep) {
    return Status::FailedPrecondition("LayerRecompute(" + std::to_string(layer) +
                                      "): the layers' activations are kept from the forward (nothing to recompute)");
  }
  if (end > kMlpOutGroup) return Status::InvalidArgument("LayerRecompute: groups end at kMlpOutGroup");
  ZINF_RETURN_IF_ERROR(CheckLayerParams<T>(m.config, layer, params, m.ops->reads_weights16(), m.LayerTensorCount(layer),
                                           begin, end, "LayerRecompute params"));
  ZINF_RETURN_IF_ERROR(m.CheckBackwardLayer(layer, "LayerRecompute"));
  ZINF_RETURN_IF_ERROR(CheckNextGroup("LayerRecompute", layer, begin, m.recompute_group));
  if (begin == 0) ZINF_RETURN_IF_ERROR(m.InputForBackward(layer));
  // Recompute this layer's activations from its saved input x_l.
  for (int g = begin; g < end; ++g) m.ForwardGroup(layer, g, params);
  m.recompute_group = end;
  return Status::Ok();
}

template <typename T>
Status GptCompute<T>::LayerBackwardGroups(int layer, int begin, int end, const std::vector<const T*>& params,
                                          const std::vector<T*>& grads, kernels::GradMode mode) {
  return LayerBackwardGroups(layer, begin, end, LayerParams{params, {}, ElementType::kBf16}, grads, mode);
}

template <typename T>
Status GptCompute<T>::LayerBackwardGroups(int layer, int begin, int end, const LayerParams& params,
                                          const std::vector<T*>& grads, kernels::GradMode mode) {
  Impl& m = *impl_;
  const size_t n = m.LayerTensorCount(layer);
  ZINF_RETURN_IF_ERROR(
      CheckLayerParams<T>(m.config, layer, params, m.ops->reads_weights16(), n, begin, end, "LayerBackward params"));
  ZINF_RETURN_IF_ERROR(CheckGroupPointers(m.config, layer, grads, n, begin, end, "LayerBackward grads"));
  ZINF_RETURN_IF_ERROR(m.CheckBackwardLayer(layer, "LayerBackward"));
  if ((!m.keep && m.recompute_group != kMlpOutGroup) || m.backward_end != end) {
    const std::string recompute = m.keep ? ""
                                         : "the recompute must reach group " + std::to_string(kMlpOutGroup) +
                                               " first (at " + std::to_string(m.recompute_group) + ") and ";
    return Status::FailedPrecondition("LayerBackward(" + std::to_string(layer) + "): groups [" + std::to_string(begin) +
                                      ", " + std::to_string(end) + ") asked; " + recompute +
                                      "the backward runs groups down from " + std::to_string(m.backward_end));
  }
  if (m.keep) m.kept_consumed = true;
  for (int g = end - 1; g >= begin; --g) m.BackwardGroup(layer, g, params, grads, mode);
  m.backward_end = begin;
  if (begin == 0) {
    m.backward_next = layer - 1;
    m.recompute_group = 0;
    m.backward_end = kLayerGroups;
  }
  return Status::Ok();
}

template <typename T>
Status GptCompute<T>::EmbedBackward(const std::vector<T*>& grads) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(CheckPointers(grads, m.config.llama() ? 1 : 2, "EmbedBackward"));
  if (!m.head_backward_done || m.backward_next != -1) {
    return Status::FailedPrecondition("EmbedBackward: layers down to 0 must be backwarded first (next expected: " +
                                      std::to_string(m.backward_next) + ")");
  }
  // kLlama: the position gradient the encoder computes goes to a sink.
  if (m.config.llama()) m.ops->Zero(m.dpos, static_cast<int64_t>(m.config.seq_len) * m.C);
  T* dwpe = m.config.llama() ? m.dpos : grads[kWpe];
  // x_0 = s wte[t]: d wte[t] = s d x_0 (dres is consumed here).
  if (m.ScalesEmbedding()) m.ops->Scale(m.dres, m.EmbedScale(), m.N * m.C);
  m.ops->EncoderBackward(grads[kWte], dwpe, m.dres, m.tokens, m.B, m.config.seq_len, m.C, m.config.padding_token);
  m.head_backward_done = false;  // the gradient of x_0 is consumed
  return Status::Ok();
}

template class GptCompute<float>;
template class GptCompute<double>;

}  // namespace zinf::model
