// The reference GPT: a decoder-only transformer in the style of GPT-2.
//
//   x0      = wte[tokens] + wpe[positions]                       (embed block)
//   x_{l+1} = x_l + attn(ln1(x_l)); x_{l+1} += mlp(ln2(.))       (layer blocks)
//   loss    = mean cross-entropy(lnf(x_L) @ lm_head^T, targets)  (head block)
//
// with pre-LayerNorm blocks, causal multi-head attention, a GELU MLP of
// width 4C, and the head either tied to wte or its own weight.
//
// The model is cut into the engine's blocks: block 0 "embed" {wte [Vp, C],
// wpe [T, C]}, blocks 1..L "layer.<i>" (the 12 tensors of LayerTensor, in
// that order) and block L+1 "head" {lnf.weight, lnf.bias[, lm_head [Vp, C]
// when untied]}. GptCompute runs one block at a time on parameters it is
// handed (the engine's gathered block, cast to T) and never holds them, so
// a training loop acquires a block, computes, and releases it.
//
// Activation checkpointing (LayerActivations::kRecompute): the forward
// pass keeps only each layer's input x_l ([B*T, C] per layer);
// LayerBackward recomputes the layer's forward from x_l into one layer's
// worth of scratch, then runs its backward. So activation memory is (L + 1)
// * B*T*C plus one layer and the logits, whatever the depth. kOffload
// (DeepSpeed's cpu_checkpointing) keeps those inputs in pinned host memory
// instead: the device holds three of them, each x_l is copied out as the
// forward writes it and back ahead of its layer's backward, on a copy
// stream of its own, so the device's activation memory no longer grows
// with the depth. kKeep gives every layer its own activations, kept from
// the forward: no recompute, for L - 1 more layers' worth of memory. The
// kernels are deterministic and the copies exact, so all three give the
// same bits. The head computes the logits (and their gradient) in
// chunks of positions, at most 64 MiB for both, so a large vocabulary does
// not cost B*T*Vp elements twice.
//
// Kernels are queued on the Ops (asynchronous on CUDA): only SetBatch and
// HeadForward synchronise. Call ops().Synchronize() before handing a
// block's parameters or gradients back to the engine.
//
// Thread-safety: one thread drives a GptCompute (and its Ops).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/ops.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::model {

// The decoder families GptCompute runs. kGpt2 is the model described above;
// kLlama (Llama, Qwen2, Qwen3, Phi-3, Mistral checkpoints) replaces LayerNorm by RMSNorm
// (no biases), learned positions by rotary embeddings (rotate-half) on q and
// k, the GELU MLP by SwiGLU (down(silu(gate(x)) * up(x)), no biases), and
// multi-head by grouped-query attention (n_kv_head key/value heads); q, k, v
// and o are separate weights, q/k/v with biases when qkv_bias (Qwen2). The
// heads may be wider or narrower than n_embd / n_head (head_size: Qwen3,
// Mistral-Nemo), so q and the attention's output are n_head * head_dim()
// wide (attn_width()); with qk_norm (Qwen3) q and k go through an RMSNorm
// over each head (weights [head_dim]) before RoPE.
//
// Gemma's variations on kLlama (GptConfig's Gemma fields): RMSNorm
// weights used as 1 + w (norm_unit_offset), GELU in the gated MLP (GeGLU:
// mlp_glu), the embedding scaled by sqrt(n_embd) (embed_scale), attention
// scores scaled by attn_scalar^-1/2 rather than head_dim^-1/2, and Gemma
// 2/3's sandwich norms (sandwich_norms, GLM-4's too): the attention's and
// the MLP's outputs each go through an RMSNorm of their own before they
// join the residual stream; OLMo 2 has those output norms alone (post_norms), and
// its q/k norms span all heads. Granite scales the embedding, each layer's branches and
// the logits by constants (embed_multiplier, residual_multiplier,
// logits_scaling). Gemma 2 caps the attention's scores and the logits by
// tanh (attn_softcap, final_softcap); Gemma 3's and OLMo 3's sliding
// layers turn q and k by a RoPE of their own base (local_rope_theta).
enum class ModelFamily { kGpt2, kLlama };

// Rotary embedding frequencies over the first rot = int(hd *
// partial_factor) columns of a head: inv_freq_i = theta^(-2i/rot), rescaled
// by the `llama3` rule when llama3 is set (HF's rope_type "llama3"), or by
// LongRoPE (rope_type "longrope": Phi-3's 128k models, Phi-4-mini) when
// longrope is set: divided by short_factor[i] while the sequence is within
// original_max_position, by long_factor[i] beyond it, and cos and sin
// multiplied by attention_factor; or divided by factor when linear is set
// (rope_type "linear": Gemma 3's global layers); or by YaRN when yarn is set
// (rope_type "yarn": Qwen3's and OLMo 3's long contexts): the frequencies
// that turn fewer than beta_slow times over original_max_position divided
// by factor, those that turn more than beta_fast times kept, a linear ramp
// over the dimensions between (their bounds floored and ceiled when
// truncate), and cos and sin multiplied by attention_factor.
struct RopeConfig {
  double theta = 10000.0;
  double partial_factor = 1.0;
  bool linear = false;
  bool llama3 = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position = 8192;
  bool longrope = false;
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
  bool yarn = false;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  // The pairs turned together: (i, i + rot/2) (Llama's layout), or (2i,
  // 2i + 1) when interleaved (GPT-J's: Helium, GLM).
  bool interleaved = false;
};

struct GptConfig {
  int vocab_size = 257;         // tokens 0..vocab_size-1 (bytes + end-of-text)
  int padded_vocab_size = 320;  // rows of wte / lm_head: vocab_size rounded up to 64
  int seq_len = 64;             // T: positions (rows of wpe)
  int n_layer = 2;
  int n_head = 4;
  int n_embd = 64;              // C; a multiple of n_head
  bool tied_embeddings = true;  // lm_head is wte

  // kLlama only (kGpt2 ignores them, and refuses the Gemma fields below;
  // the sliding window is both's).
  ModelFamily family = ModelFamily::kGpt2;
  int n_kv_head = 0;          // key/value heads; divides n_head
  int intermediate_size = 0;  // the gated MLP's width
  bool qkv_bias = false;      // q/k/v projections have biases (Qwen2)
  int head_size = 0;          // width of a head; 0: n_embd / n_head
  bool qk_norm = false;       // RMSNorm of q and k before RoPE, per head (Qwen3; qk_norm_all_heads: OLMo 2's)
  double norm_eps = 1e-5;     // RMSNorm epsilon
  RopeConfig rope;
  // Layers (0-based, ascending) whose attention has no rotary embedding
  // (SmolLM3's NoPE layers); empty: every layer's has one.
  std::vector<int> no_rope_layers;
  // Layers (0-based, ascending) whose attention slides: each query sees
  // the sliding_window keys up to itself (Mistral, Phi-3, Gemma's local
  // layers; HF's q - k < sliding_window); the rest see every earlier key.
  // A window of seq_len or more is no window: the loader keeps none.
  int sliding_window = 0;
  std::vector<int> sliding_layers;
  // Gemma (kLlama only; see ModelFamily).
  bool norm_unit_offset = false;               // every RMSNorm multiplies by 1 + w
  kernels::Glu mlp_glu = kernels::Glu::kSilu;  // the gated MLP's activation
  bool embed_scale = false;                    // x_0 = embed_tokens[t] * float(sqrt(n_embd))
  double attn_scalar = 0;                      // scores scaled by attn_scalar^-1/2; 0: head_dim()
  bool sandwich_norms = false;                 // post-attention and post-MLP norms (Gemma 2, 3; GLM-4)
  // OLMo 2 (kLlama): no norm before the attention or the MLP; their outputs
  // go through an RMSNorm of their own before joining the residual stream,
  // with the weights at kAttnNormW and kMlpNormW (post_norms; not with
  // sandwich_norms or residual_multiplier). With qk_norm, q's and k's
  // norms span all their heads at once (qk_norm_all_heads: weights
  // [attn_width()] and [n_kv_head * head_dim()], not [head_dim()]).
  bool post_norms = false;
  bool qk_norm_all_heads = false;
  // Gemma 2's softcaps, 0: none. attn_softcap: every layer's scaled scores
  // s become attn_softcap * tanh(s / attn_softcap) before the softmax
  // (attn_logit_softcapping); final_softcap: the logits likewise before the
  // loss (final_logit_softcapping), and the logits a caller is given are
  // the capped ones.
  double attn_softcap = 0;
  double final_softcap = 0;
  // Granite's multipliers, 1: none. The embedding times embed_multiplier
  // (embedding_multiplier; not with embed_scale), each attention's and
  // MLP's output times residual_multiplier as it joins the residual stream
  // (not with sandwich_norms), the logits divided by logits_scaling (before
  // any final_softcap). Granite's attention_multiplier m is attn_scalar =
  // 1 / m^2.
  double embed_multiplier = 1;
  double residual_multiplier = 1;
  double logits_scaling = 1;
  // Layers (0-based, ascending) whose RoPE has base local_rope_theta and
  // no scaling (Gemma 3's and OLMo 3's sliding_attention layers, whether
  // or not their window is kept); 0 or no layers: every layer uses `rope`.
  double local_rope_theta = 0;
  std::vector<int> local_rope_layers;
  // kLlama: the token whose embedding row gets no gradient from the input
  // side (transformers' nn.Embedding padding_idx, from pad_token_id; a tied
  // head still trains it); -1: none.
  int padding_token = -1;
  // Multi-head latent attention (DeepSeek-V2's and V3's; kLlama,
  // kv_lora_rank > 0):
  // keys and values come out of a latent of kv_lora_rank columns per token
  // (kv_a_proj_with_mqa, which also gives qk_rope_head_dim columns of one
  // key part shared by every head; the latent's RMSNorm kv_a_layernorm;
  // kv_b_proj up to each head's unrotated key part and its value of
  // v_head_dim), q through one of q_lora_rank (q_a_proj, its RMSNorm
  // q_a_layernorm, q_b_proj; 0: q_proj from the input). A head's q and k
  // are head_size wide, the unrotated part first, the qk_rope_head_dim
  // rotated columns last; o_proj reads n_head * v_head_dim. n_kv_head is
  // n_head.
  int kv_lora_rank = 0;
  int q_lora_rank = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  double latent_norm_eps = 1e-6;  // the latents' RMSNorms' (transformers' default, not rms_norm_eps)
  // Mixture of experts (kLlama; Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE,
  // GLM-4.5, dots.llm1, ERNIE 4.5), 0: none. With n_experts > 0 every layer's MLP but
  // dense_layers' (below) is sparse: a router (a linear map C ->
  // n_experts, no bias) scores each token, the softmax's experts_per_token
  // largest (or another router's choice: router_scoring, router_bias) choose its
  // experts and weigh their outputs (divided by their sum when
  // norm_topk_prob), and each expert is a gated MLP of width
  // intermediate_size (the experts' width, HF's moe_intermediate_size).
  int n_experts = 0;
  int experts_per_token = 0;
  bool norm_topk_prob = false;
  // The router's scores (kernels::MoeRouting): a softmax over the experts
  // (above), or with kSigmoid (DeepSeek-V3's and GLM-4.5's router) a
  // sigmoid of each logit. With router_groups > 1 the experts are chosen
  // within the router_topk_groups of router_groups groups whose
  // router_group_best best choices sum highest (n_group, topk_group;
  // DeepSeek-V3's two with its sigmoid, V2's one with its softmax).
  // router_fp32: the router's weight is kept in fp32 (never a 16-bit layer
  // matrix, exported as F32), as transformers keeps DeepSeek-V2's; always
  // so with router_bias. With router_bias (always
  // with kSigmoid; ERNIE 4.5's softmax) the experts are chosen by score +
  // a selection bias, a [E] tensor after the router's weight
  // (transformers' e_score_correction_bias, not trained there: loaded and
  // saved, its gradient 0, never decayed), and weighted by their scores
  // alone. Normalized (norm_topk_prob), the weights are divided by their
  // sum, or router_norm_min where the sum is smaller (ERNIE's
  // moe_norm_min); then multiplied by routed_scale (routed_scaling_factor).
  kernels::MoeScoring router_scoring = kernels::MoeScoring::kSoftmax;
  int router_groups = 1;
  int router_topk_groups = 1;
  int router_group_best = 2;
  bool router_fp32 = false;
  bool router_bias = false;
  double router_norm_min = 0;
  double routed_scale = 1;
  // A shared expert beside the routed ones (Qwen2-MoE's gated one,
  // GLM-4.5's ungated), 0: none: a gated
  // MLP of width shared_expert_size that every token goes through, its
  // output added to the routed experts' sum; with shared_expert_gate
  // first multiplied by sigmoid(x . g), g a [1, C] weight (transformers'
  // shared_expert_gate).
  int shared_expert_size = 0;
  bool shared_expert_gate = false;
  // With experts, the layers (0-based, ascending) whose MLP is dense
  // instead (Qwen-MoE's mlp_only_layers and decoder_sparse_step, GLM-4.5's
  // first_k_dense_replace): a gated
  // MLP of width dense_intermediate_size, no router, no experts.
  std::vector<int> dense_layers;
  int dense_intermediate_size = 0;
  // The router's load-balancing loss (transformers' output_router_logits,
  // router_aux_loss_coef), 0: none. Each forward adds router_aux_coef * E *
  // sum_e f_e P_e to the loss: f_e the (layer, token) rows that chose
  // expert e over the L * N rows (the f_e sum to K), P_e its mean
  // probability over them (the Switch Transformer's loss, as transformers
  // computes it per forward). Only P carries a gradient.
  double router_aux_coef = 0;

  bool llama() const { return family == ModelFamily::kLlama; }
  bool moe() const { return n_experts > 0; }
  bool mla() const { return kv_lora_rank > 0; }
  bool shared_expert() const { return shared_expert_size > 0; }
  bool sigmoid_router() const { return router_scoring == kernels::MoeScoring::kSigmoid; }
  // The routing kernels' parameters.
  kernels::MoeRouting routing() const {
    return {.E = n_experts,
            .k = experts_per_token,
            .normalize = norm_topk_prob,
            .scoring = router_scoring,
            .groups = router_groups,
            .topk_groups = router_topk_groups,
            .group_best = router_group_best,
            .scale = routed_scale,
            .norm_min = router_norm_min};
  }
  // Whether layer `layer`'s MLP is routed (moe() and not a dense layer).
  bool moe_in(int layer) const;
  int routed_layers() const { return moe() ? n_layer - static_cast<int>(dense_layers.size()) : 0; }
  // A dense MLP's width: intermediate_size, or with experts
  // dense_intermediate_size (0 without dense layers).
  int dense_width() const { return !moe() ? intermediate_size : dense_layers.empty() ? 0 : dense_intermediate_size; }
  // Whether the attention's and the MLP's outputs are normed before they
  // join the residual stream (Gemma 2 and 3, OLMo 2).
  bool branch_norms() const { return sandwich_norms || post_norms; }
  // Widths of q's and k's norm weights (qk_norm).
  int q_norm_width() const { return qk_norm_all_heads ? attn_width() : head_dim(); }
  int k_norm_width() const { return qk_norm_all_heads ? n_kv_head * head_dim() : head_dim(); }
  int head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }
  // Columns of a head the rotary embedding turns (the rest pass).
  int rope_dims() const { return mla() ? qk_rope_head_dim : static_cast<int>(head_dim() * rope.partial_factor); }
  // rope_dims() in layer `layer`, 0 in a layer without RoPE.
  int rope_dims_in(int layer) const;
  // The attention's window in layer `layer`: sliding_window, or 0 (none).
  int window_in(int layer) const;
  // Whether layer `layer` turns q and k by the local RoPE (local_rope_theta).
  bool local_rope_in(int layer) const;
  // Width of q and of the attention's output (and of o_proj's input but
  // with latent attention: attn_out_width()): n_embd unless head_size says
  // otherwise.
  int attn_width() const { return n_head * head_dim(); }
  // What o_proj reads: the heads' values (attn_width() but with latent
  // attention's v_head_dim).
  int attn_out_width() const { return mla() ? n_head * v_head_dim : attn_width(); }
  // Latent attention's projection widths: kv_a_proj_with_mqa's output (the
  // kv latent and the shared rotated key part) and kv_b_proj's (each head's
  // unrotated key part and its value); 0 without it.
  int kv_a_width() const { return mla() ? kv_lora_rank + qk_rope_head_dim : 0; }
  int64_t kv_b_width() const { return mla() ? int64_t{n_head} * (head_dim() - qk_rope_head_dim + v_head_dim) : 0; }
  int64_t NumParameters() const;  // including the vocabulary padding rows
  // The parameters a token's forward multiplies by: NumParameters less,
  // in each routed layer, the experts it is not sent to (E - K of them).
  int64_t ActiveParameters() const;
};

// Parses a model config: a JSON object with keys vocab_size, seq_len,
// n_layer, n_head, n_embd (integers > 0, n_embd % n_head == 0) and
// tied_embeddings (bool, default true); padded_vocab_size is derived.
// Errors (kInvalidArgument) name `source` and the key; unknown keys are errors.
StatusOr<GptConfig> ParseGptConfig(const std::string& json_text, const std::string& source);
// `name_or_path`: a built-in name (BuiltinGptConfigNames) or a JSON file.
StatusOr<GptConfig> LoadGptConfig(const std::string& name_or_path);
// "tiny" (tests), "demo" (make demo), "small", "gpt2-124m" (GPT-2 small shape, T 1024, vocab 50257).
std::vector<std::string> BuiltinGptConfigNames();
std::string GptConfigToJson(const GptConfig& config);
// What a model's one-line description says after its heads: " (latent
// attention: kv rank R, q rank Q)" with mla(), else nothing.
std::string AttentionNote(const GptConfig& config);

enum EmbedTensor { kWte = 0, kWpe = 1 };
enum LayerTensor {
  kLn1W = 0,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttProjW,
  kAttProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kLayerTensors
};
enum HeadTensor { kLnfW = 0, kLnfB = 1, kLmHead = 2 };
// kLlama blocks: embed {embed_tokens [Vp, C]}; layer.<i> in this order
// (the biases only with qkv_bias, then q_norm and k_norm [q_norm_width(),
// k_norm_width()] only with qk_norm: QNormIndex, then the post-attention
// and post-MLP norms [C] only with sandwich_norms: PostNormIndex; with
// post_norms those two norms are kAttnNormW and kMlpNormW, and there are
// no input norms); head {norm.weight[, lm_head [Vp, C]]}. q_proj is [A, C]
// and o_proj [C, A], A = attn_width().
// With latent attention (mla()) kQW is q_proj [A, C] or q_a_proj
// [q_lora_rank, C], kKW kv_a_proj_with_mqa [kv_lora_rank +
// qk_rope_head_dim, C], kVW kv_b_proj [n_head * (head_size - qk_rope_head_dim
// + v_head_dim), kv_lora_rank], kOW o_proj [C, attn_out_width()], and
// kv_a_layernorm [kv_lora_rank] (then with q_lora_rank q_a_layernorm and
// q_b_proj [A, q_lora_rank]) sit at LatentIndex.
enum LlamaLayerTensor {
  kAttnNormW = 0,
  kQW,
  kKW,
  kVW,
  kOW,
  kMlpNormW,
  kGateW,
  kUpW,
  kDownW,
  kQB,
  kKB,
  kVB,
};
// Index of q_norm.weight in a kLlama layer with qk_norm; k_norm.weight follows.
inline int QNormIndex(const GptConfig& c) { return c.qkv_bias ? kVB + 1 : kDownW + 1; }
// Index of kv_a_layernorm in a kLlama layer with latent attention (after
// q_norm and k_norm's place); with q_lora_rank q_a_layernorm and q_b_proj
// follow.
inline int LatentIndex(const GptConfig& c) { return QNormIndex(c) + (c.qk_norm ? 2 : 0); }
inline int LatentTensors(const GptConfig& c) { return !c.mla() ? 0 : c.q_lora_rank > 0 ? 3 : 1; }
// Index of the post-attention norm in a kLlama layer with sandwich_norms
// (after q_norm and k_norm, or the latent attention's tensors, when there
// are); the post-MLP norm follows. (kMlpNormW is then the MLP's input
// norm, Gemma's pre_feedforward_layernorm.)
inline int PostNormIndex(const GptConfig& c) { return LatentIndex(c) + LatentTensors(c); }
// A kLlama layer's tensors after the ones above: with n_experts > 0,
// experts 1 .. n_experts - 1's gate, up and down weights (expert 0's are
// kGateW, kUpW, kDownW: ExpertTensor), then the router's (RouterIndex)
// and with router_bias its selection bias [E] (RouterBiasIndex),
// then with a shared expert its gate, up and down weights
// (SharedExpertTensor) and with shared_expert_gate that gate's weight
// (SharedGateIndex).
inline int MoeExtraIndex(const GptConfig& c) { return PostNormIndex(c) + (c.sandwich_norms ? 2 : 0); }
// Expert e's gate (which 0), up (1) or down (2) weight in a kLlama MoE layer.
inline int ExpertTensor(const GptConfig& c, int e, int which) {
  return e == 0 ? kGateW + which : MoeExtraIndex(c) + 3 * (e - 1) + which;
}
inline int RouterIndex(const GptConfig& c) { return MoeExtraIndex(c) + 3 * (c.n_experts - 1); }
inline int RouterBiasIndex(const GptConfig& c) { return RouterIndex(c) + 1; }
// The router's tensors: its weight, and with router_bias its bias.
inline int RouterTensors(const GptConfig& c) { return c.router_bias ? 2 : 1; }
// The shared expert's gate (which 0), up (1) or down (2) weight.
inline int SharedExpertTensor(const GptConfig& c, int which) { return RouterIndex(c) + RouterTensors(c) + which; }
inline int SharedGateIndex(const GptConfig& c) { return SharedExpertTensor(c, 3); }
// The number of tensors in a routed kLlama layer, and in kLlama layer
// `layer` (a dense one's stop at MoeExtraIndex).
inline int RoutedLayerTensors(const GptConfig& c) {
  return c.shared_expert() ? SharedGateIndex(c) + (c.shared_expert_gate ? 1 : 0) : RouterIndex(c) + RouterTensors(c);
}
inline int LlamaLayerTensors(const GptConfig& c, int layer) {
  return c.moe_in(layer) ? RoutedLayerTensors(c) : MoeExtraIndex(c);
}
// Index of the untied lm_head in the head block (kLmHead for kGpt2).
inline int LmHeadIndex(const GptConfig& c) { return c.llama() ? 1 : kLmHead; }

// A layer's tensors in groups, in the order its forward pass uses them:
// the first norm, the q/k/v projections (with the attention after them),
// the attention's output projection, the second norm, the MLP's input
// projection(s) (fc; gate and up), its output projection (fc_proj; down).
// The backward uses them in reverse. A layer fetched in pieces
// (fetch_layout.h) has whole, consecutive groups in each piece.
enum LayerGroup { kNorm1Group = 0, kQkvGroup, kAttnOutGroup, kNorm2Group, kMlpInGroup, kMlpOutGroup, kLayerGroups };
// The tensor indices (LayerTensor or LlamaLayerTensor) of each group of
// layer `layer` (with post_norms the norm groups are empty: each norm
// weight is in the group of the output it norms; a dense layer among
// routed ones has a dense layer's MLP groups).
std::vector<std::vector<int>> LayerTensorGroups(const GptConfig& config, int layer);
// Whether layer tensor `tensor` (spec order) is a matrix the layer reads
// only through its linear maps (the ones GptCompute takes in 16 bits; not
// the weight of a router with a selection bias, which transformers keeps
// in fp32 for GLM-4.5, DeepSeek-V3 and ERNIE 4.5, nor its bias).
bool IsLayerMatrix(const GptConfig& config, int tensor);

inline constexpr BlockId kEmbedBlock = 0;
inline BlockId LayerBlock(int layer) { return static_cast<BlockId>(1 + layer); }
inline BlockId HeadBlock(const GptConfig& c) { return static_cast<BlockId>(1 + c.n_layer); }

// The engine's blocks, in the order above. Biases and LayerNorm weights
// have TensorSpec::decay off (the HF Trainer's grouping), and so do the
// frozen tensors.
std::vector<BlockSpec> GptBlockSpecs(const GptConfig& config);
// Whether a block tensor is frozen: a buffer the model reads that training
// must not change (a router's selection bias, untrained in
// transformers). Its gradient is always 0 and it is never decayed (not by
// WeightDecayOn::kAll either), so Adam and AdamW leave its bits as they are.
bool IsFrozenTensor(const TensorSpec& tensor);
// Whether tensor `tensor` of layer `layer` is one transformers keeps in
// fp32 whatever the model's dtype (the weight and selection bias of a
// router with one: GLM-4.5's, DeepSeek-V3's and ERNIE 4.5's
// _keep_in_fp32_modules): an export writes it
// F32. (With bf16 on, the engine's 16-bit working copy still rounds it for
// the forward: docs/model.md.)
bool KeptInFp32(const GptConfig& config, int layer, int tensor);
// A model's random initial fp32 weights. GPT-2's scheme: normal(0, 0.02), the
// two residual projections scaled by 1/sqrt(2L), LayerNorm weights 1,
// biases 0, padding rows of wte 0; Llama's: normal(0, 0.02) matrices, norm
// weights 1 (0 where used as 1 + w), biases 0. Given the config, each
// value is a function of (seed, block, tensor, element index) alone: standard normals in
// pairs by Marsaglia's polar method, each pair from its own SplitMix64
// stream (a counter's hash), so any range of a tensor comes out the same
// bits whichever ranges, threads or ranks compute it, and no block need be
// held whole in RAM. Immutable once made: Fill and Block may be called
// from any thread.
class RandomInit {
 public:
  RandomInit(const GptConfig& config, uint64_t seed);
  // Elements [first, first + count) of tensor `tensor` of `block`
  // (GptBlockSpecs order) into out[0, count), on OpenMP's threads.
  void Fill(BlockId block, size_t tensor, int64_t first, int64_t count, float* out) const;
  // The block's tensors whole, one array per tensor in spec order.
  std::vector<std::vector<float>> Block(BlockId block) const;

 private:
  struct Rule {
    uint64_t key = 0;  // the tensor's stream
    int64_t numel = 0;
    int64_t drawn = 0;  // elements [0, drawn) normal(0, std) ...
    double std = 0.0;
    float fill = 0.0f;  // ... the rest this
  };
  std::vector<std::vector<Rule>> rules_;  // [block][tensor]
};
// RandomInit(config, seed).Block(block).
std::vector<std::vector<float>> InitBlockWeights(const GptConfig& config, BlockId block, uint64_t seed);

// Whether a layer's backward recomputes its activations (from layer inputs
// kept on the device, or in pinned host memory: kOffload) or finds them
// kept (see the file comment).
enum class LayerActivations { kRecompute, kKeep, kOffload };

template <typename T>
class GptCompute {
 public:
  // Gradients of the head: the head block's tensors (lnf; lm_head when
  // untied, in head[kLmHead]) and the lm_head weight the loss used (the head
  // block's, or the embed block's wte gradient when tied).
  struct HeadGrads {
    std::vector<T*> head;
    T* lm_head = nullptr;
  };

  // Allocates activations for micro-batches of `batch` sequences of
  // config.seq_len tokens on `device` (kOutOfMemory past its budget); with
  // kOffload also the layer inputs' pinned host memory and a copy stream of
  // `device`. `ops` and `device` are not owned and must outlive this object.
  static StatusOr<std::unique_ptr<GptCompute>> Create(const GptConfig& config, int batch, Ops<T>* ops, Device* device,
                                                      LayerActivations activations = LayerActivations::kRecompute);
  ~GptCompute();
  GptCompute(const GptCompute&) = delete;
  GptCompute& operator=(const GptCompute&) = delete;

  const GptConfig& config() const;
  int batch() const;
  int64_t activation_bytes() const;       // device bytes this object holds
  double cross_entropy() const;           // the last HeadForward's mean cross-entropy (its loss less the routers')
  int64_t host_activation_bytes() const;  // pinned host bytes (kOffload's layer inputs), else 0
  // LayerActivations::kKeep: the backward skips LayerRecomputeGroups (which
  // then fails with kFailedPrecondition).
  bool keeps_activations() const;

  // The micro-batch: B*T input tokens and B*T targets (host arrays, each <
  // vocab_size; kInvalidArgument otherwise), copied to the device (the
  // arrays may be reused when this returns). Starts a new step: the next
  // call must be EmbedForward. Calls out of the order forward (embed,
  // layers 0..L-1, head) then backward (layers L-1..0, embed) fail with
  // kFailedPrecondition.
  Status SetBatch(const int32_t* inputs, const int32_t* targets);

  // Forward, block by block. Pointers are the block's tensors (device, T)
  // in spec order.
  Status EmbedForward(const std::vector<const T*>& embed);
  Status LayerForward(int layer, const std::vector<const T*>& params);
  // Final LayerNorm, logits and the mean loss over B*T positions (returned;
  // synchronises), plus router_aux_coef times this forward's load-balancing
  // loss with experts (cross_entropy() is the mean alone). `lm_head` is the
  // head's [Vp, C] weight (the head block's kLmHead, or the embed block's
  // wte when tied). With `grads`: also the backward of the head with
  // d(loss)/d(loss_i) = loss_scale / (B*T), accumulating into `grads` and
  // leaving the gradient of x_L for LayerBackward(L-1), and the
  // load-balancing loss's gradient for the routers' backward.
  // With `host_logits` (a host array of B*T*Vp): also the logits, row by row.
  StatusOr<double> HeadForward(const std::vector<const T*>& head, const T* lm_head, const HeadGrads* grads,
                               double loss_scale, T* host_logits = nullptr);

  // Backward, after HeadForward with grads, layers from L-1 down to 0:
  // recomputes the layer's forward from its saved input (unless the
  // activations are kept), then accumulates its parameter gradients into
  // `grads` (spec order) and turns the gradient of x_{l+1} into that of
  // x_l. Kept activations serve one backward: the backward reuses them as
  // gradient buffers, so HeadForward with grads then needs a new forward
  // (kFailedPrecondition otherwise); recomputed ones (layer inputs on the
  // device or offloaded) serve any number.
  Status LayerBackward(int layer, const std::vector<const T*>& params, const std::vector<T*>& grads);
  // The layer walked in groups (LayerTensorGroups), for a layer fetched in
  // pieces: the same kernels in the same order as LayerForward and
  // LayerBackward, which are these calls over all groups, so the results
  // are bit for bit the same however the groups are cut. `params` and
  // `grads` have the layer's tensor count; only the tensors of groups
  // [begin, end) are read (the others may be null).
  //   forward:   LayerForwardGroups over [0, kLayerGroups) in order;
  //   backward:  LayerRecomputeGroups over [0, kMlpOutGroup) in order (the
  //              recompute does not need the last group; none when the
  //              activations are kept), then LayerBackwardGroups from
  //              kLayerGroups down to 0, each call accumulating the
  //              gradients of its groups' tensors (kAdd), or setting them
  //              (kSet: every tensor of the groups is written whole, its
  //              old contents ignored, so the caller need not zero it;
  //              values as cpu_kernels.h's GradMode says).
  // Calls out of that order fail with kFailedPrecondition.
  Status LayerForwardGroups(int layer, int begin, int end, const std::vector<const T*>& params);
  Status LayerRecomputeGroups(int layer, int begin, int end, const std::vector<const T*>& params);
  Status LayerBackwardGroups(int layer, int begin, int end, const std::vector<const T*>& params,
                             const std::vector<T*>& grads, kernels::GradMode mode = kernels::GradMode::kAdd);
  // A layer's parameters with its matrices (IsLayerMatrix) in their 16-bit
  // type, for ops that read them as they are (Ops::reads_weights16): each
  // tensor is in `values` or, a matrix, in `matrices16` (empty, or one
  // entry per tensor, of type `type16`). The same bits as casting the
  // matrices to T and handing everything over in `values`.
  struct LayerParams {
    std::vector<const T*> values;
    std::vector<const void*> matrices16;
    ElementType type16 = ElementType::kBf16;
  };
  Status LayerForwardGroups(int layer, int begin, int end, const LayerParams& params);
  Status LayerRecomputeGroups(int layer, int begin, int end, const LayerParams& params);
  Status LayerBackwardGroups(int layer, int begin, int end, const LayerParams& params, const std::vector<T*>& grads,
                             kernels::GradMode mode = kernels::GradMode::kAdd);
  // Accumulates d wte and d wpe into `grads` (spec order of the embed block).
  Status EmbedBackward(const std::vector<T*>& grads);

  Ops<T>& ops();

  struct Impl;

 private:
  explicit GptCompute(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::model
