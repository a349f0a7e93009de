// CUDA kernels of the reference GPT (fp32): the GPU twins of cpu_kernels.h.
//
// Plain C++: no CUDA type appears here, so code compiled by the host
// compiler (model/cuda_ops.cc, tests) can call them. A stream is a
// cudaStream_t passed as `void*` (nullptr is the legacy default stream);
// every pointer is a device pointer on the current CUDA device unless named
// `host_`. Compiled only when the CUDA Toolkit is found (ZINF_HAVE_CUDA_KERNELS).
//
// Semantics, layouts and accumulation rules are exactly those of the
// function of the same name in kernels::cpu (see cpu_kernels.h): forward
// kernels overwrite their outputs, backward kernels ACCUMULATE (+=) into
// every gradient they write (the CPU matmuls' GradMode::kSet is not here:
// CudaOps zeroes, then adds). Results agree with the CPU reference up to
// float rounding (the order of additions differs); nothing here is atomic,
// so every kernel is deterministic run to run.
//
// Errors: every function only enqueues work and returns the launch's status
// (cudaGetLastError after each launch, or the cuBLAS status) as kInternal
// naming the kernel; a fault while the work runs shows up at the next
// stream synchronisation. Callers keep the first error (CudaOps makes it
// sticky). Sizes are validated (kInvalidArgument) where cuBLAS needs int.
//
// Thread-safety: the free functions are safe from any thread (they use no
// state of their own); a CudaBlas is driven by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/cpu_kernels.h"
#include "zinf/status.h"

namespace zinf::kernels::cuda {

// The CUDA device current on the calling thread, and setting it (the runtime
// launches kernels on the calling thread's current device).
StatusOr<int> GetDevice();
Status SetDevice(int ordinal);

// A cuBLAS handle bound to one stream; every matmul of the functions below
// that take a CudaBlas runs on that stream. Matmuls compute in fp32
// (CUBLAS_COMPUTE_32F); with allow_tf32 cuBLAS may use TF32 tensor cores
// (faster, ~1e-3 relative error, no longer close to the CPU reference).
// Created on the calling thread's current device; used on that device only.
class CudaBlas {
 public:
  static StatusOr<std::unique_ptr<CudaBlas>> Create(void* stream, bool allow_tf32 = false);
  ~CudaBlas();
  CudaBlas(const CudaBlas&) = delete;
  CudaBlas& operator=(const CudaBlas&) = delete;

  void* stream() const { return stream_; }
  bool allow_tf32() const { return allow_tf32_; }
  void* handle() const { return handle_; }  // cublasHandle_t

 private:
  CudaBlas(void* handle, void* stream, bool allow_tf32) : handle_(handle), stream_(stream), allow_tf32_(allow_tf32) {}
  void* handle_;
  void* stream_;
  bool allow_tf32_;
};

// p[0..n) = 0.
Status Zero(float* p, int64_t n, void* stream);

// out[i] = (float) src[i]; src (a device pointer) of type src_type: kF32,
// kF16, kBf16 or kF64.
Status CastIn(float* out, const void* src, ElementType src_type, int64_t n, void* stream);

// Encoder (embedding). Tokens must be < the rows of wte (not checked on the
// device: a bad token reads or writes out of bounds).
Status EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T_, int C,
                      void* stream);
// dwte[tokens[b,t], :] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. Deterministic,
// no atomics: each (vocabulary row group, channel) of dwte is owned by one
// thread that adds the positions in order n = 0..N-1, as the CPU loop does.
// dwte's row of `padding_token` (-1: none) gets nothing, as on the CPU.
Status EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T_, int C,
                       int32_t padding_token, void* stream);

Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                        int64_t N, int C, void* stream);
Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int64_t N, int C, void* stream);

// cuBLAS GEMMs on blas.stream(); the bias add and the dbias column sums are
// kernels of their own. N, C, OC must fit in int.
Status MatmulForward(CudaBlas& blas, float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                     int C, int OC);
Status MatmulBackward(CudaBlas& blas, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, int64_t N, int C, int OC);
// The bias kernels the matmuls use: out[n, :] += bias; dbias += sum_n
// dout[n, :] (rows summed in order, as ColumnSums in cuda_kernels.cu).
Status AddBias(float* out, const float* bias, int64_t N, int OC, void* stream);
Status AddBiasGradient(float* dbias, const float* dout, int64_t N, int OC, void* stream);

// ---- 16-bit compute (cuda_gemm16.cu) ----------------------------------------
//
// The GPU's bf16 / fp16 mode: a linear layer's matmuls on tensor cores
// through cuBLASLt, with the weight in the engine's 16-bit type read as it
// is (no fp32 copy of it), the fp32 operand (inp, dout) rounded to the same
// type into scratch first (to nearest, ties to even: RoundTo16), fp32
// accumulation (CUBLAS_COMPUTE_32F) and fp32 results; so activations, norms,
// softmax and the gradient handed to the engine stay fp32.
//
// CPU reference: kernels::cpu::RoundTo16 on the operand, then
// cpu::MatmulForward16 / MatmulBackward16 with the same 16-bit weight. The
// product of two 16-bit floats is exact in fp32, so the two differ only in
// the order of the fp32 sums (the tests state the tolerance).

// A cuBLASLt handle bound to one stream, with a device workspace of
// kLtWorkspaceBytes the caller allocates and keeps alive (cuBLAS's advice
// for Hopper is 32 MiB) and a cache of the algorithm cuBLASLt's heuristic
// picks per shape and alignment (asked once per shape). Driven by one
// thread at a time, on the device current when it was created.
inline constexpr int64_t kLtWorkspaceBytes = int64_t{32} << 20;
class CudaLt {
 public:
  static StatusOr<std::unique_ptr<CudaLt>> Create(void* stream, void* workspace);
  ~CudaLt();
  CudaLt(const CudaLt&) = delete;
  CudaLt& operator=(const CudaLt&) = delete;
  void* stream() const { return stream_; }

  struct Impl;  // cuda_gemm16.cu
  Impl& impl() { return *impl_; }

 private:
  CudaLt(std::unique_ptr<Impl> impl, void* stream);
  std::unique_ptr<Impl> impl_;
  void* stream_;
};

// out[i] = src[i] rounded to `type` (kBf16 or kF16; to nearest, ties to
// even; fp16 overflows to +-Inf), as 16-bit values: the twin of
// zinf::FloatToBf16 / FloatToHalf (core/half.h), bit for bit but for NaN
// payloads.
Status CastTo16(void* out, const float* src, ElementType type, int64_t n, void* stream);

// Bytes of 16-bit operand scratch one MatmulForward16 / MatmulBackward16 of
// these sizes needs (the backward rounds dout and inp: N x (C + OC)
// elements), each part aligned to 256 bytes. Plain arithmetic, so planners
// of builds without CUDA use it too.
inline int64_t Matmul16ScratchBytes(int64_t N, int64_t C, int64_t OC) {
  auto up = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  return up(N * C * 2) + up(N * OC * 2);
}

// out [N, OC] = round16(inp) [N, C] @ weight^T + bias, weight [OC, C] of
// `type` (kBf16 or kF16). dinp += round16(dout) @ weight; dweight +=
// round16(dout)^T @ round16(inp); dbias += sum_n dout (fp32, unrounded);
// dbias may be null. `scratch`: Matmul16ScratchBytes(N, C, OC) bytes of
// device memory, 256-byte aligned, not in use by queued work of another
// stream. N, C, OC must fit in int.
Status MatmulForward16(CudaLt& lt, float* out, const float* inp, const void* weight, ElementType type,
                       const float* bias, int64_t N, int C, int OC, void* scratch);
Status MatmulBackward16(CudaLt& lt, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const void* weight, ElementType type, int64_t N, int C, int OC, void* scratch);

// Attention. Scratch (shared by forward and backward) holds
// AttentionScratchElems(B, T_, C, NH, softcap) floats laid out as
//   q, k, v, dq, dk, dv, dy   7 x [B, NH, T, hs]   (B*T*C each)
//   datt                      [B, NH, T, T]        (backward only)
//   scores                    [B, NH, T, T]        (backward, softcap > 0 only)
// Forward: q, k, v = permute(qkv); att = causal softmax(q k^T / sqrt(hs))
// over the keys each query sees (`window` and `softcap` as in
// cpu_kernels.h: 0 none) (batched GEMM straight into att, softmax in
// place); y = att @ v into the dy slot; out = unpermute(y). Backward: dy =
// permute(dout); datt = dy v^T; dv = att^T dy; with a softcap, the scores
// again; dpreatt = softmax (and cap) backward (in place in datt); dq =
// dpreatt k / sqrt(hs); dk = dpreatt^T q / sqrt(hs); dqkv += unpermute.
// C % NH == 0. `sinks` [NH] (or null) joins each row's softmax as
// cpu_kernels.h says; the backward's `dsinks` (with sinks, else null) [NH]
// += their gradient, from each row's 1 - sum of its probabilities (the
// terms in the dq slot before dq), summed per head in a fixed order.
int64_t AttentionScratchElems(int B, int T_, int C, int NH, float softcap);
Status AttentionForward(CudaBlas& blas, float* out, float* att, float* scratch, const float* qkv, int B, int T_, int C,
                        int NH, int window, float softcap, const float* sinks = nullptr);
Status AttentionBackward(CudaBlas& blas, float* dqkv, float* scratch, const float* dout, const float* qkv,
                         const float* att, int B, int T_, int C, int NH, int window, float softcap,
                         float* dsinks = nullptr);

// Fused causal attention on tensor cores (cuda_flash_attention.cu), the
// 16-bit compute mode's: the same maths as AttentionForward/Backward with
// q, k, v, dout and the probabilities rounded to bf16 for the matmuls
// (fp32 accumulation; scores, softmax and its statistics in fp32), and no
// T x T array anywhere. The forward saves each row's log-sum-exp of the
// scaled scores, lse [B, NH, T], in place of the probabilities; the
// backward recomputes them from it and needs the forward's `out` too
// (dout . out per row, into `scratch`: FlashAttentionScratchElems floats).
// dqkv += as AttentionBackward; the same bits run to run (no atomics).
// A sliding `window` skips the tiles wholly outside it; a `softcap` caps
// the scaled scores as AttentionForward does.
// FlashAttentionSupported: the head size C / NH is 16, 32, 64 or 128 and
// device `ordinal` has the shared memory for it; the calls return
// kInvalidArgument for other head sizes.
inline bool FlashAttentionHeadSize(int hs) { return hs == 16 || hs == 32 || hs == 64 || hs == 128; }
bool FlashAttentionSupported(int C, int NH, int ordinal);
inline int64_t FlashAttentionScratchElems(int B, int T_, int NH) { return static_cast<int64_t>(B) * NH * T_; }
Status FlashAttentionForward(float* out, float* lse, const float* qkv, int B, int T_, int C, int NH, int window,
                             float softcap, void* stream);
Status FlashAttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T_, int C, int NH, int window, float softcap, void* stream);

Status GeluForward(float* out, const float* inp, int64_t n, void* stream);
Status GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n, void* stream);

// out = a + b (out may alias a or b).
Status ResidualForward(float* out, const float* a, const float* b, int64_t n, void* stream);
// y += x.
Status Accumulate(float* y, const float* x, int64_t n, void* stream);
// x *= s.
Status Scale(float* x, float s, int64_t n, void* stream);
// x = cap * tanh(x / cap); dx *= 1 - (y / cap)^2 (cpu_kernels.h SoftcapForward/Backward). cap > 0.
Status SoftcapForward(float* x, float cap, int64_t n, void* stream);
Status SoftcapBackward(float* dx, const float* y, float cap, int64_t n, void* stream);

// One thread block per row; padding columns V..Vp-1 of dlogits untouched.
// dlogits may be null (forward only).
Status CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   int64_t N, int V, int Vp, float dloss, void* stream);

// Llama family (cuda_decoder_kernels.cu): the twins of the kernels::cpu
// functions of the same names. RMSNorm gives one warp to a row (dweight:
// column sums in 32 x 32-thread tiles, the same order every run); the rest
// are elementwise.
Status RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int C, double eps,
                      void* stream);
Status RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                       const float* rstd, int64_t N, int C, void* stream);
Status RopeForward(float* out, const float* inp, const float* cos, const float* sin, int B, int T_, int n_head, int hd,
                   int rot, bool interleaved, void* stream);
Status RopeBackward(float* dinp, const float* dout, const float* cos, const float* sin, int B, int T_, int n_head,
                    int hd, int rot, bool interleaved, void* stream);
Status GluForward(float* out, const float* gate, const float* up, int64_t n, Glu glu, void* stream);
Status GluBackward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, int64_t n, Glu glu,
                   void* stream);
Status GqaExpandForward(float* qkv, const float* q, const float* k, const float* v, int64_t N, int NH, int NKV, int hd,
                        void* stream);
Status GqaExpandBackward(float* dq, float* dk, float* dv, const float* dqkv, int64_t N, int NH, int NKV, int hd,
                         void* stream);
Status CopyHeadColumns(float* dst, int64_t dst_ld, int dst_head, const float* src, int64_t src_ld, int src_head,
                       int64_t N, int H, int width, bool accumulate, void* stream);

// The mixture-of-experts kernels (cuda_moe_kernels.cu), contracts as the
// CPU functions of the same names: a thread per token routes it (softmax
// or sigmoid, the bias, groups and selection in fp32), gathers and
// combines are elementwise (a token's rows summed in their order), a warp
// per row forms the weights' dots.
Status MoeRouteForward(float* weights, int32_t* experts, float* probs, const float* logits, const float* bias,
                       int64_t N, const MoeRouting& r, void* stream);
Status MoeRouteBackward(float* dlogits, const float* dweights, const float* probs, const int32_t* experts,
                        const float* dprobs, int64_t N, const MoeRouting& r, void* stream);
Status GatherRows(float* out, const float* inp, const int32_t* rows, int64_t M, int C, void* stream);
Status GatherRowsBackward(float* dinp, const float* drows, const int32_t* token_rows, int64_t N, int k, int C,
                          void* stream);
Status MoeCombineForward(float* out, const float* y, const float* weights, const int32_t* token_rows,
                         const int32_t* row_slot, int64_t N, int k, int C, void* stream);
Status MoeCombineBackward(float* dy, float* dweights, const float* dout, const float* y, const float* weights,
                          const int32_t* row_token, const int32_t* row_slot, int64_t M, int C, void* stream);
Status SigmoidGateForward(float* out, const float* y, const float* logit, int64_t N, int C, void* stream);
Status SigmoidGateBackward(float* dy, float* dlogit, const float* dout, const float* y, const float* logit, int64_t N,
                           int C, void* stream);

}  // namespace zinf::kernels::cuda
