// Ops: the model's kernels on the device it computes on.
//
// One model code path (gpt.cc) calls these; two implementations stand
// behind them:
//   * CpuOps<T>, T = float or double: kernels/cpu_kernels.h on the calling
//     thread (OpenMP inside). Used with the host device, whose "device
//     memory" is host memory, and for the fp64 gradient checks.
//   * CudaOps (T = float): kernels/cuda_kernels.h launched on the Ops' own
//     CUDA stream, cuBLAS for the matmuls. Compiled when the CUDA Toolkit
//     is found; CreateOps picks it when the Device is a CUDA device.
// CreateOps can also queue CpuOps<float>'s calls on a host device Stream
// (its host_stream), so that the host runs the path a GPU takes.
//
// Pointers are device pointers of the Device the Ops were made for. Kernel
// calls are asynchronous on CUDA: they return nothing, and the first error
// (a launch failure, a cuBLAS error) is sticky and returned by
// Synchronize(). The caller must Synchronize before handing buffers the
// kernels write to anyone else, or hand them over behind stream() (the
// engine's Release and ReduceGradients with a stream).
// Semantics, layouts and accumulation rules are those of cpu_kernels.h.
//
// Every method is pure, so that a wrapper (TimedOps) cannot miss one and
// answer with a base class's default; MatmulForward16/Backward16 have a
// definition that fails (for ops that do not read 16-bit weights).
//
// Thread-safety: one thread drives an Ops object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cpu_kernels.h"
#include "zinf/status.h"

namespace zinf {
class Device;
}

namespace zinf::model {

template <typename T>
class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;  // "cpu-f32", "cpu-f64", "cpu-f32-stream", "cuda-f32", "cuda-16"

  // Memory (device pointers; host pointers where named).
  virtual void Zero(T* p, int64_t n) = 0;
  virtual void CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;  // synchronous
  virtual void CastIn(T* out, const void* src, ElementType src_type, int64_t n) = 0;

  virtual void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C) = 0;
  // `padding_token`: the row of dwte that gets nothing (-1: none).
  virtual void EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C,
                               int32_t padding_token) = 0;
  virtual void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N,
                                int C) = 0;
  virtual void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                                 const T* mean, const T* rstd, int64_t N, int C) = 0;
  virtual void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int C, int OC) = 0;
  // `mode`: dweight and dbias added to (kAdd) or set (kSet), as in
  // cpu_kernels.h.
  virtual void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N,
                              int C, int OC, kernels::GradMode mode) = 0;
  // Whether MatmulForward16 / MatmulBackward16 are there: the matmuls with a
  // weight in a 16-bit float type (the engine's parameters, kBf16 or kF16)
  // read as it is, with no T copy of it. CpuOps: the bits of casting it
  // first (CastIn) and calling the T versions. CudaOps in its 16-bit mode:
  // tensor-core matmuls with the fp32 operand rounded to the weight's type
  // too (cuda_ops.h). Callers that get false cast.
  virtual bool reads_weights16() const = 0;
  virtual void MatmulForward16(T* out, const T* inp, const void* weight, ElementType weight_type, const T* bias,
                               int64_t N, int C, int OC) = 0;
  virtual void MatmulBackward16(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const void* weight,
                                ElementType weight_type, int64_t N, int C, int OC, kernels::GradMode mode) = 0;
  // Elements of device scratch AttentionForward / AttentionBackward need
  // (one buffer, shared by both: the caller allocates the max once), with
  // the softcap they will be called with.
  virtual int64_t AttentionScratchElems(int B, int T_, int C, int NH, float softcap) const = 0;
  // Elements of `att`, what AttentionForward keeps for AttentionBackward:
  // the probabilities, B*NH*T*T (CudaOps in fp32), or, where the attention
  // is fused (CpuOps; CudaOps in its 16-bit mode), each row's log-sum-exp,
  // B*NH*T.
  virtual int64_t AttentionSavedElems(int B, int T_, int C, int NH) const = 0;
  // `window`: 0, or a sliding window of that many keys; `softcap`: 0, or
  // the scores' cap (cpu_kernels.h).
  virtual void AttentionForward(T* out, T* att, T* scratch, const T* qkv, int B, int T_, int C, int NH, int window,
                                float softcap) = 0;
  // `out`: what AttentionForward wrote there, unchanged since (the fused
  // backward reads it).
  virtual void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* out, const T* att, int B,
                                 int T_, int C, int NH, int window, float softcap) = 0;
  virtual void GeluForward(T* out, const T* inp, int64_t n) = 0;
  virtual void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) = 0;
  virtual void ResidualForward(T* out, const T* a, const T* b, int64_t n) = 0;
  virtual void Accumulate(T* y, const T* x, int64_t n) = 0;
  virtual void Scale(T* x, T s, int64_t n) = 0;
  // The logits' softcap (cpu_kernels.h SoftcapForward/Backward).
  virtual void SoftcapForward(T* x, T cap, int64_t n) = 0;
  virtual void SoftcapBackward(T* dx, const T* y, T cap, int64_t n) = 0;
  virtual void CrossEntropyForwardBackward(T* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N,
                                           int V, int Vp, T dloss) = 0;

  // Llama family (RMSNorm, RoPE, SwiGLU/GeGLU, the GQA expansion around
  // AttentionForward/Backward), as in cpu_kernels.h.
  virtual void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int C, double eps) = 0;
  virtual void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd,
                               int64_t N, int C) = 0;
  virtual void RopeForward(T* out, const T* inp, const T* cos, const T* sin, int B, int T_, int n_head, int hd, int rot,
                           bool interleaved) = 0;
  virtual void RopeBackward(T* dinp, const T* dout, const T* cos, const T* sin, int B, int T_, int n_head, int hd,
                            int rot, bool interleaved) = 0;
  virtual void GluForward(T* out, const T* gate, const T* up, int64_t n, kernels::Glu glu) = 0;
  virtual void GluBackward(T* dgate, T* dup, const T* gate, const T* up, const T* dout, int64_t n,
                           kernels::Glu glu) = 0;
  virtual void GqaExpandForward(T* qkv, const T* q, const T* k, const T* v, int64_t N, int NH, int NKV, int hd) = 0;
  virtual void GqaExpandBackward(T* dq, T* dk, T* dv, const T* dqkv, int64_t N, int NH, int NKV, int hd) = 0;
  // Multi-head latent attention's splits and joins of head columns.
  virtual void CopyHeadColumns(T* dst, int64_t dst_ld, int dst_head, const T* src, int64_t src_ld, int src_head,
                               int64_t N, int H, int width, bool accumulate) = 0;

  // The mixture-of-experts MLP's routing, gather and combine, as in
  // cpu_kernels.h (the dispatch between them runs on the host).
  virtual void MoeRouteForward(T* weights, int32_t* experts, T* probs, const T* logits, const T* bias, int64_t N,
                               const kernels::MoeRouting& r) = 0;
  virtual void MoeRouteBackward(T* dlogits, const T* dweights, const T* probs, const int32_t* experts, const T* dprobs,
                                int64_t N, const kernels::MoeRouting& r) = 0;
  virtual void GatherRows(T* out, const T* inp, const int32_t* rows, int64_t M, int C) = 0;
  virtual void GatherRowsBackward(T* dinp, const T* drows, const int32_t* token_rows, int64_t N, int k, int C) = 0;
  virtual void MoeCombineForward(T* out, const T* y, const T* weights, const int32_t* token_rows,
                                 const int32_t* row_slot, int64_t N, int k, int C) = 0;
  virtual void MoeCombineBackward(T* dy, T* dweights, const T* dout, const T* y, const T* weights,
                                  const int32_t* row_token, const int32_t* row_slot, int64_t M, int C) = 0;
  virtual void SigmoidGateForward(T* out, const T* y, const T* logit, int64_t N, int C) = 0;
  virtual void SigmoidGateBackward(T* dy, T* dlogit, const T* dout, const T* y, const T* logit, int64_t N, int C) = 0;

  // Waits for every kernel queued so far; returns the first error since the
  // last call (kInternal naming the kernel on CUDA).
  virtual Status Synchronize() = 0;
  // The stream the kernels are queued on, for Engine::Release to follow,
  // as Device::RecordOn takes it: a cudaStream_t on CUDA, the Stream*
  // itself on the host device; null when every call has finished by the
  // time it returns (CpuOps).
  virtual void* stream() = 0;
};

// The attention's probabilities, B*NH*T*T: what the unfused attention keeps
// (Ops::AttentionSavedElems).
inline int64_t AttentionProbabilityElems(int B, int T_, int NH) { return static_cast<int64_t>(B) * NH * T_ * T_; }

// CPU kernels on the calling thread (T = float or double).
template <typename T>
std::unique_ptr<Ops<T>> CreateCpuOps();

// fp32 Ops for `device`: CudaOps on a CUDA device (kUnavailable when this
// build has no CUDA), CpuOps<float> on the host device. `compute16`: on a
// CUDA device, its 16-bit compute mode (cuda_ops.h); the host device's
// CpuOps read 16-bit weights exactly in either case. `host_stream`: on the
// host device, the CpuOps' calls queued on one of its Streams (stream() is
// that Stream, Synchronize waits for it), the same bits with a GPU's
// asynchrony; ignored on a CUDA device, whose kernels always queue.
StatusOr<std::unique_ptr<Ops<float>>> CreateOps(Device& device, bool compute16 = false, bool host_stream = false);

}  // namespace zinf::model
