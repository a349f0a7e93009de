// CPU kernels of the reference GPT: forward and backward of each layer type,
// parallel with OpenMP, for T = float (training on the host device) and
// T = double (the fp64 reference that gradient checks run against).
//
// Layouts are row-major and follow one convention (B batch, T sequence
// length, C channels, NH heads, hs = C / NH head size, V vocabulary, Vp the
// vocabulary padded for alignment, N = B * T positions):
//   activations    [N, C]
//   qkv            [N, 3C]: q, k, v one after the other per position; head h
//                  of q is columns [h*hs, (h+1)*hs)
//   att            [B, NH, T, T]: softmax probabilities, row t holds the
//                  keys t sees, 0..t or its window (the rest are 0)
//   linear weight  [OC, C] (out = inp @ weight^T + bias), bias [OC]
//   logits         [N, Vp]; columns V..Vp-1 are padding and never counted
//
// Backward kernels ACCUMULATE into every gradient they write (+=): the caller
// zeroes gradients once, and a tensor used twice (a tied embedding, the
// residual stream) gathers both contributions; the matmul's weight and bias
// gradients may be set instead (GradMode::kSet), for a caller that knows
// that call is their only one. Forward kernels overwrite.
//
// Thread-safety: pure functions of their arguments; outputs must not alias
// inputs unless stated. The cpu:: kernels run an OpenMP team for large
// enough inputs (small ones stay on the calling thread) and are
// deterministic: the same inputs give the same bits whatever the number of
// threads. The matmuls keep a small packing buffer per calling thread.
#pragma once

#include <cstdint>

#include "zinf/element_type.h"

namespace zinf::kernels {

inline constexpr double kLayerNormEps = 1e-5;

// How a backward kernel writes a parameter's gradient: added to what the
// buffer holds (kAdd, the kernels' convention: a caller zeroes first, or
// accumulates on purpose), or set, the buffer's old contents neither read
// nor kept (kSet: no zeroing pass over a weight-sized buffer, and the
// matmul does not read it). The bits are those of zeroing first and adding:
// each sum starts from +0, so under round-to-nearest it is never -0, and
// storing it equals adding it to a zero.
enum class GradMode { kAdd, kSet };

// The gated MLP's activation, out = act(gate, up): SiLU (SwiGLU: Llama and
// most of its family) or GELU's tanh approximation (GeGLU: Gemma's
// gelu_pytorch_tanh) of the gate times up, or GPT-OSS's clamped SwiGLU
// with its alpha and limit (see GluForward). A kind converts to a Glu, so
// `glu == Glu::kSilu` reads as before.
struct Glu {
  enum Kind { kSilu, kGeluTanh, kClampedSwiglu };
  Kind kind = kSilu;
  float alpha = 0, limit = 0;                 // kClampedSwiglu's (swiglu_alpha, swiglu_limit)
  constexpr Glu(Kind k = kSilu) : kind(k) {}  // NOLINT(google-explicit-constructor): a kind is a Glu
  static constexpr Glu ClampedSwiglu(float alpha, float limit) {
    Glu g(kClampedSwiglu);
    g.alpha = alpha;
    g.limit = limit;
    return g;
  }
  friend constexpr bool operator==(Glu a, Glu b) {
    return a.kind == b.kind && a.alpha == b.alpha && a.limit == b.limit;
  }
  friend constexpr bool operator!=(Glu a, Glu b) { return !(a == b); }
};

// How a mixture-of-experts router turns a token's logits [E] into its k
// experts and their weights (cpu_kernels.h's MoeRouteForward says how).
// Scores: softmax over the row (Qwen-MoE, Mixtral, OLMoE; ERNIE 4.5's
// with a selection bias; DeepSeek-V2's with expert groups) or a sigmoid of
// each logit (DeepSeek-V3's, GLM-4.5's and dots.llm1's routers, with a
// selection bias and expert groups).
enum class MoeScoring { kSoftmax, kSigmoid };
struct MoeRouting {
  int E = 0;               // experts
  int k = 0;               // experts a token is sent to
  bool normalize = false;  // the k weights divided by their sum (norm_topk_prob)
  MoeScoring scoring = MoeScoring::kSoftmax;
  // The experts fall into `groups` groups of E / groups consecutive ones,
  // and a token chooses among the topk_groups groups whose group_best
  // largest choice scores sum highest (n_group, topk_group; DeepSeek-V3
  // sums two, V2 takes the largest alone).
  int groups = 1;
  int topk_groups = 1;
  int group_best = 2;  // 1 or 2
  double scale = 1.0;  // the weights times this (routed_scaling_factor)
  // With `normalize`, the sum divided by is at least this (ERNIE 4.5's
  // moe_norm_min; >= 0 and finite); 0: none.
  double norm_min = 0.0;
};
// The most expert groups a router has.
inline constexpr int kMaxRouterGroups = 64;

namespace cpu {

// Threads the CPU kernels use (OpenMP's team size). Several ranks on one
// machine should split the cores between them rather than each take all.
void SetThreads(int threads);
int Threads();

// The instruction sets the kernels pick from at run time: the widest the
// machine has (the default), or at most `isa` (tests comparing the paths'
// bits). Returns the previous limit.
enum class Isa { kBaseline, kAvx2, kAvx512 };
Isa LimitIsa(Isa isa);

// out[n] = (T) src[n], src of type `src_type`: kF32, kF16, kBf16 or kF64
// (another type is a programmer error: the process aborts). `src` needs no
// alignment.
template <typename T>
void CastIn(T* out, const void* src, ElementType src_type, int64_t n);
// out[n] = src[n] as `out_type`: kF32, kBf16 or kF16 (rounded to nearest
// even, NaNs kept quiet; another type is a programmer error). `out` needs
// no alignment.
void CastOut(void* out, ElementType out_type, const float* src, int64_t n);
// Rows [col0, col1) of the transpose of the [rows, cols] matrix `src` (of
// `src_type`: as CastIn's) in `dst_type` (as CastOut's): dst[(c - col0) *
// rows + r] = src[r * cols + c], through float. By 64 x 64 tiles, each read
// and written in runs within the cache, on the threads; neither pointer
// needs alignment.
void TransposeCast(void* dst, ElementType dst_type, const void* src, ElementType src_type, int64_t rows, int64_t cols,
                   int64_t col0, int64_t col1);

// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]. Tokens must be < the rows of wte.
template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C);
// dwte[tokens[b,t], :] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. The row of
// `padding_token` gets nothing (nn.Embedding's padding_idx; -1: none),
// dwpe every position.
template <typename T>
void EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C,
                     int32_t padding_token = -1);

// Per row of inp [N, C]: mean, rstd = 1/sqrt(var + eps) (saved for backward),
// out = (inp - mean) * rstd * weight + bias.
template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N, int C);
template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                       const T* rstd, int64_t N, int C);

// out [N, OC] = inp [N, C] @ weight^T [C, OC] + bias (bias may be null).
template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int C, int OC);
// dinp += dout @ weight; dweight += dout^T @ inp; dbias += sum_n dout (dbias
// may be null). With GradMode::kSet, dweight and dbias are set (=) instead.
template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N, int C,
                    int OC, GradMode mode = GradMode::kAdd);

// The two above with the weight in a 16-bit float type (`weight_type` kBf16
// or kF16), read as it is: widened while the matmul packs it, so no float
// copy of the weight is made and the results are bit for bit those of
// casting it to float first (CastIn) and calling the float versions.
inline bool IsWeight16(ElementType t) { return t == ElementType::kBf16 || t == ElementType::kF16; }
void MatmulForward16(float* out, const float* inp, const uint16_t* weight, ElementType weight_type, const float* bias,
                     int64_t N, int C, int OC);
void MatmulBackward16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const uint16_t* weight, ElementType weight_type, int64_t N, int C, int OC,
                      GradMode mode = GradMode::kAdd);

// x[i] = x[i] rounded to `type` (kBf16 or kF16, to nearest, ties to even)
// and widened back: what the GPU's 16-bit matmuls (cuda_kernels.h,
// MatmulForward16) make of their fp32 operand, so that RoundTo16 and then
// MatmulForward16 / MatmulBackward16 above are their CPU reference.
void RoundTo16(float* x, int64_t n, ElementType type);

// Causal multi-head self-attention: out [N, C] (heads concatenated), att
// [B, NH, T, T] the softmax of the scores s = q.k / sqrt(hs) over the keys
// query t sees, saved. `window` 0: keys 0..t; else a sliding window of that
// many keys, t - window + 1 .. t (Mistral's, Gemma's local layers: HF's
// q - k < sliding_window; one of T or more is none). window >= 0.
// `softcap` > 0 caps the scores before the softmax, s -> softcap *
// tanh(s / softcap) (Gemma 2's attn_logit_softcapping); 0: none. Every
// attention kernel here and in cuda_kernels.h takes the window and the cap so.
// `sinks` [NH], or null: head h's sink logit joins each of its rows'
// softmax as one more score, with no value (GPT-OSS's attention sinks):
// p_j = exp(s_j - lse), lse = log(exp(sink_h) + sum_j exp(s_j)), so a row's
// probabilities sum to less than one.
template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int B, int T_, int C, int NH, int window, float softcap,
                      const T* sinks = nullptr);
// dqkv += the gradient through the attention. `scratch` holds B*NH*T*T
// elements. With a softcap the scores are recomputed from q and k. With
// sinks, `dsinks` [NH] += their gradient, -sum over the head's rows of
// p_sink * (dout . out), each head's in the rows' order.
template <typename T>
void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int B, int T_, int C, int NH,
                       int window, float softcap, T* dsinks = nullptr);

// The same attention fused, for the host device: per block of 64 queries
// the scores against its keys become probabilities in the thread's cache
// and are multiplied into out; only each row's log-sum-exp is saved, `lse`
// [B, NH, T] (no T x T array). Another summation order than the unfused
// kernels, so other bits (within float rounding of them); the same bits
// whatever the thread count.
template <typename T>
void FusedAttentionForward(T* out, T* lse, const T* qkv, int B, int T_, int C, int NH, int window, float softcap,
                           const T* sinks = nullptr);
// dqkv += the gradient through it, from the forward's `out` and `lse`
// (unchanged since); `scratch` holds B*NH*T elements. The probabilities
// are recomputed twice: per block of queries for dq, per block of keys for
// dk and dv, so that each thread owns what it writes. With sinks (the
// forward's), dsinks [NH] += their gradient as AttentionBackward's.
template <typename T>
void FusedAttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* out, const T* lse, int B, int T_,
                            int C, int NH, int window, float softcap, const T* sinks = nullptr, T* dsinks = nullptr);

// GELU, tanh approximation (as GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename T>
void GeluForward(T* out, const T* inp, int64_t n);
// dinp += gelu'(inp) * dout.
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n);

// out = a + b (out may alias a or b).
template <typename T>
void ResidualForward(T* out, const T* a, const T* b, int64_t n);
// y += x (the residual stream's gradient fan-out).
template <typename T>
void Accumulate(T* y, const T* x, int64_t n);
// x *= s (Gemma's embedding scale, and its gradient's).
template <typename T>
void Scale(T* x, T s, int64_t n);

// Softcapping (Gemma 2's final_logit_softcapping on the logits): x = cap *
// tanh(x / cap) in place, cap > 0.
template <typename T>
void SoftcapForward(T* x, T cap, int64_t n);
// dx *= 1 - (y / cap)^2 = d/dx [cap tanh(x / cap)], from y, what
// SoftcapForward wrote (the gradient through it, in place).
template <typename T>
void SoftcapBackward(T* dx, const T* y, T cap, int64_t n);

// Softmax cross-entropy over the first V of Vp logits per row:
// losses[n] = -log softmax(logits[n])[targets[n]]; when dlogits is not null,
// dlogits[n, v] += (softmax[n, v] - (v == targets[n])) * dloss for v < V (padding
// columns get nothing). dloss is the gradient of the final loss with respect
// to each position's loss (1/N for a mean, times the loss scale under fp16).
template <typename T>
void CrossEntropyForwardBackward(T* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N, int V,
                                 int Vp, T dloss);

// ---- Llama-family kernels (cpu_decoder_kernels.cc) ----

// RMSNorm per row of inp [N, C]: rstd[n] = 1 / sqrt(mean(inp[n]^2) + eps)
// (saved for backward), out = inp * rstd * weight. out may not alias inp.
template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int C, double eps);
template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int64_t N,
                     int C);

// Rotary position embedding, rotate-half layout, on the first `rot` of
// each head's hd columns of x [B*T, n_head * hd] (head h is columns
// [h*hd, (h+1)*hd)); position t of every sequence uses row t of cos and sin
// [T, rot/2]: for i < rot/2,
//   out_i         = x_i cos_ti - x_{i+rot/2} sin_ti
//   out_{i+rot/2} = x_{i+rot/2} cos_ti + x_i sin_ti,
// and out_i = x_i for i >= rot (a partial rotary factor: rot < hd); with
// `interleaved` the pairs are (x_2i, x_2i+1) instead (GPT-J's layout:
// Helium, GLM). out may alias inp (each pair is read before it is
// written). rot is even, 0 <= rot <= hd (0: every column passes, a layer
// without RoPE).
template <typename T>
void RopeForward(T* out, const T* inp, const T* cos, const T* sin, int B, int T_, int n_head, int hd, int rot,
                 bool interleaved);
// dinp += R^T dout (the inverse rotation; dout itself past rot). dinp may not
// alias dout.
template <typename T>
void RopeBackward(T* dinp, const T* dout, const T* cos, const T* sin, int B, int T_, int n_head, int hd, int rot,
                  bool interleaved);

// The gated MLP's middle: out = act(gate) * up, act by `glu`: silu(x) =
// x / (1 + exp(-x)), or GELU (tanh approximation, as GeluForward); or the
// clamped SwiGLU, out = (u + 1) * g * sigmoid(alpha * g) with g =
// min(gate, limit) and u = clamp(up, -limit, limit). Arrays of n.
template <typename T>
void GluForward(T* out, const T* gate, const T* up, int64_t n, Glu glu);
// dgate += dout * d out / d gate; dup += dout * d out / d up (act(gate)
// for the plain kinds). A clamp passes the gradient where its input is
// within the limits, the limits included (torch's clamp).
template <typename T>
void GluBackward(T* dgate, T* dup, const T* gate, const T* up, const T* dout, int64_t n, Glu glu);

// Grouped-query attention around the multi-head AttentionForward/Backward:
// packs q [N, NH*hd], k and v [N, NKV*hd] into qkv [N, 3*NH*hd], query head
// h reading key/value head h / (NH / NKV) (NH % NKV == 0). Overwrites qkv.
template <typename T>
void GqaExpandForward(T* qkv, const T* q, const T* k, const T* v, int64_t N, int NH, int NKV, int hd);
// The adjoint: dq += dqkv's q part; dk and dv += the sum over each key/value
// head's group of query heads (in head order).
template <typename T>
void GqaExpandBackward(T* dq, T* dk, T* dv, const T* dqkv, int64_t N, int NH, int NKV, int hd);

// Columns of heads between row-major matrices (multi-head latent
// attention's splits and joins): for n < N, h < H, c < width,
//   dst[n * dst_ld + h * dst_head + c] = src[n * src_ld + h * src_head + c]
// (+= with `accumulate`). src_head 0 repeats one set of columns for every
// head; dst_head 0 with H > 1 sums the H heads into one, in head order,
// and needs `accumulate` (a check: the CUDA kernel refuses it too). Column offsets ride on the pointers; dst and src do
// not overlap.
template <typename T>
void CopyHeadColumns(T* dst, int64_t dst_ld, int dst_head, const T* src, int64_t src_ld, int src_head, int64_t N, int H,
                     int width, bool accumulate);

// ---- Mixture-of-experts kernels (cpu_moe_kernels.cc) ----
//
// A sparse MLP routes each of N tokens to k of E experts (MoeRouting):
// the router's logits [N, E] give scores p per row (softmax, or a sigmoid
// per logit), a choice score c_e = p_e + bias_e per expert (bias [E]: the
// router's selection bias, transformers' e_score_correction_bias; or
// null, c = p), and the k largest c (descending; ties to the lower
// expert: zinf's rule, torch.topk's order among equals is unspecified),
// among the experts of the chosen groups only when groups > 1, are each
// token's experts [N, k]. Their weights [N, k] are their scores p, divided
// by their sum when `normalize` (Qwen3-MoE's norm_topk_prob, Mixtral's
// always; with kSigmoid by the sum + 1e-20, as transformers; by at least
// norm_min), times `scale`: the bias chooses, it does not weigh. The N * k (token, slot)
// pairs are dispatched into rows grouped by expert (MoeDispatch), each
// expert's rows go through its MLP as one matmul, and the outputs y [N*k,
// C] combine back per token, weighted.

// The most experts a token is routed to (k).
inline constexpr int kMaxExpertsPerToken = 64;

// probs [N, E] = the scores p (kept for the backward; may be logits,
// overwritten row by row), experts and weights [N, k] as above. Computed
// in double, rounded to T; 1 <= k <= E, k <= kMaxExpertsPerToken; with
// groups > 1: groups divides E, E / groups >= group_best, k <= topk_groups
// * E / groups, topk_groups <= groups <= kMaxRouterGroups; norm_min >= 0 and
// finite (callers check them all).
template <typename T>
void MoeRouteForward(T* weights, int32_t* experts, T* probs, const T* logits, const T* bias, int64_t N,
                     const MoeRouting& r);
// dlogits += the routing's adjoint for dweights [N, k] (the experts fixed),
// with dprobs [E] (or null) added to every token's d of each score (the
// load-balancing loss's). The bias gets no gradient: it only chooses.
template <typename T>
void MoeRouteBackward(T* dlogits, const T* dweights, const T* probs, const int32_t* experts, const T* dprobs, int64_t N,
                      const MoeRouting& r);

// The dispatch, on the host: the N * k slots (s = n * k + j: token n's
// j-th expert) ordered by expert, then slot. Row r of the dispatched
// arrays is slot row_slot[r] of token row_token[r]; token n's rows are
// token_rows[n * k .. n * k + k), ascending (so by expert); expert e's rows
// are [offsets[e], offsets[e + 1]) (offsets [E + 1]). Returns false (the
// outputs undefined) when an expert index is outside [0, E).
bool MoeDispatch(const int32_t* experts, int64_t N, int k, int E, int32_t* row_token, int32_t* row_slot,
                 int32_t* token_rows, int64_t* offsets);

// out [M, C]: row r = inp row rows[r] (inp [*, C]).
template <typename T>
void GatherRows(T* out, const T* inp, const int32_t* rows, int64_t M, int C);
// The adjoint of gathering the dispatched rows: dinp[n] += the sum of
// drows' rows token_rows[n * k ..], in that order.
template <typename T>
void GatherRowsBackward(T* dinp, const T* drows, const int32_t* token_rows, int64_t N, int k, int C);

// out [N, C]: row n = 0 + y[r] * weights[row_slot[r]] over token n's rows
// r in token_rows order (ascending experts: transformers' index_add_ loop),
// each product rounded to T before it is added. Overwrites out.
template <typename T>
void MoeCombineForward(T* out, const T* y, const T* weights, const int32_t* token_rows, const int32_t* row_slot,
                       int64_t N, int k, int C);
// dy[r] += dout[row_token[r]] * weights[row_slot[r]]; dweights[row_slot[r]]
// += dot(dout[row_token[r]], y[r]), for the M = N * k rows.
template <typename T>
void MoeCombineBackward(T* dy, T* dweights, const T* dout, const T* y, const T* weights, const int32_t* row_token,
                        const int32_t* row_slot, int64_t M, int C);

// A row's output scaled by a gate of its own: out[n, c] += sigmoid(logit[n])
// * y[n, c], the sigmoid (in double) and the product rounded to T before
// the add (Qwen2-MoE's shared expert joining the routed experts' sum).
template <typename T>
void SigmoidGateForward(T* out, const T* y, const T* logit, int64_t N, int C);
// Its backward: dy[n, c] += s * dout[n, c]; dlogit[n] += s (1 - s)
// dot(dout[n], y[n]), s = sigmoid(logit[n]).
template <typename T>
void SigmoidGateBackward(T* dy, T* dlogit, const T* dout, const T* y, const T* logit, int64_t N, int C);

}  // namespace cpu
}  // namespace zinf::kernels
