// CudaOps (see cuda_ops.h): a thin layer over kernels/cuda_kernels.h that
// binds every call to the Ops' stream and keeps the first error.
#include "model/cuda_ops.h"

#if defined(ZINF_HAVE_CUDA_KERNELS)

#include <string>
#include <utility>

#include "device/device.h"
#include "kernels/cuda_kernels.h"

namespace zinf::model {
namespace {

namespace k = kernels::cuda;

class CudaOps final : public Ops<float> {
 public:
  // `lt` and `workspace` (a CudaLt's): the 16-bit compute mode; null for fp32.
  CudaOps(Device* device, int ordinal, std::unique_ptr<Stream> stream, std::unique_ptr<k::CudaBlas> blas,
          std::unique_ptr<k::CudaLt> lt, void* workspace)
      : device_(*device),
        ordinal_(ordinal),
        stream_(std::move(stream)),
        blas_(std::move(blas)),
        lt_(std::move(lt)),
        workspace_(workspace),
        s_(stream_->native_handle()) {}
  ~CudaOps() override {
    // The stream's destructor waits for queued work; the cuBLAS handles must
    // go first (they may hold work on the stream), then the stream, then
    // the memory the work used.
    k::SetDevice(ordinal_).IgnoreError();
    stream_->Synchronize().IgnoreError();
    blas_.reset();
    lt_.reset();
    stream_.reset();
    for (void* p : {scratch16_, workspace_}) {
      if (p != nullptr) device_.Free(p);
    }
  }

  std::string name() const override { return lt_ ? "cuda-16" : "cuda-f32"; }

  void Zero(float* p, int64_t n) override {
    Run([&] { return k::Zero(p, n, s_); });
  }
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    if (!Note(Enter())) return;
    if (!Note(stream_->CopyAsync(dst, host_src, bytes, CopyDirection::kHostToDevice).WithContext("CopyToDevice"))) {
      return;
    }
    Note(stream_->Synchronize().WithContext("CopyToDevice"));
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    if (!Note(Enter())) return;
    if (!Note(stream_->CopyAsync(host_dst, src, bytes, CopyDirection::kDeviceToHost).WithContext("CopyToHost"))) {
      return;
    }
    Note(stream_->Synchronize().WithContext("CopyToHost"));
  }
  void CastIn(float* out, const void* src, ElementType src_type, int64_t n) override {
    Run([&] { return k::CastIn(out, src, src_type, n, s_); });
  }

  void EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T_,
                      int C) override {
    Run([&] { return k::EncoderForward(out, tokens, wte, wpe, B, T_, C, s_); });
  }
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T_, int C,
                       int32_t padding_token) override {
    Run([&] { return k::EncoderBackward(dwte, dwpe, dout, tokens, B, T_, C, padding_token, s_); });
  }
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                        int64_t N, int C) override {
    Run([&] { return k::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, s_); });
  }
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int64_t N, int C) override {
    Run([&] { return k::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, s_); });
  }
  void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
                     int OC) override {
    Run([&] { return k::MatmulForward(*blas_, out, inp, weight, bias, N, C, OC); });
  }
  void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, int64_t N, int C, int OC, kernels::GradMode mode) override {
    ZeroIfSet(mode, dweight, dbias, C, OC);
    Run([&] { return k::MatmulBackward(*blas_, dinp, dweight, dbias, dout, inp, weight, N, C, OC); });
  }
  bool reads_weights16() const override { return lt_ != nullptr; }
  void MatmulForward16(float* out, const float* inp, const void* weight, ElementType weight_type, const float* bias,
                       int64_t N, int C, int OC) override {
    void* scratch = Scratch16(k::Matmul16ScratchBytes(N, C, OC));
    if (scratch == nullptr) return;
    Run([&] { return k::MatmulForward16(*lt_, out, inp, weight, weight_type, bias, N, C, OC, scratch); });
  }
  void MatmulBackward16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const void* weight, ElementType weight_type, int64_t N, int C, int OC,
                        kernels::GradMode mode) override {
    ZeroIfSet(mode, dweight, dbias, C, OC);  // before the scratch: with N = 0 there is none
    void* scratch = Scratch16(k::Matmul16ScratchBytes(N, C, OC));
    if (scratch == nullptr) return;
    Run([&] {
      return k::MatmulBackward16(*lt_, dinp, dweight, dbias, dout, inp, weight, weight_type, N, C, OC, scratch);
    });
  }
  // The 16-bit mode's attention is the fused bf16 kernel where the head size
  // has one (kernels::cuda::FlashAttentionSupported); the rest the
  // unfused fp32 kernels.
  int64_t AttentionScratchElems(int B, int T_, int C, int NH, float softcap) const override {
    return Flash(C, NH) ? k::FlashAttentionScratchElems(B, T_, NH) : k::AttentionScratchElems(B, T_, C, NH, softcap);
  }
  int64_t AttentionSavedElems(int B, int T_, int C, int NH) const override {
    return Flash(C, NH) ? static_cast<int64_t>(B) * NH * T_ : AttentionProbabilityElems(B, T_, NH);
  }
  void AttentionForward(float* out, float* att, float* scratch, const float* qkv, int B, int T_, int C, int NH,
                        int window, float softcap) override {
    if (Flash(C, NH)) {
      Run([&] { return k::FlashAttentionForward(out, att, qkv, B, T_, C, NH, window, softcap, s_); });
      return;
    }
    Run([&] { return k::AttentionForward(*blas_, out, att, scratch, qkv, B, T_, C, NH, window, softcap); });
  }
  void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                         const float* att, int B, int T_, int C, int NH, int window, float softcap) override {
    if (Flash(C, NH)) {
      Run([&] {
        return k::FlashAttentionBackward(dqkv, scratch, dout, qkv, out, att, B, T_, C, NH, window, softcap, s_);
      });
      return;
    }
    Run([&] { return k::AttentionBackward(*blas_, dqkv, scratch, dout, qkv, att, B, T_, C, NH, window, softcap); });
  }
  void GeluForward(float* out, const float* inp, int64_t n) override {
    Run([&] { return k::GeluForward(out, inp, n, s_); });
  }
  void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    Run([&] { return k::GeluBackward(dinp, inp, dout, n, s_); });
  }
  void ResidualForward(float* out, const float* a, const float* b, int64_t n) override {
    Run([&] { return k::ResidualForward(out, a, b, n, s_); });
  }
  void Accumulate(float* y, const float* x, int64_t n) override {
    Run([&] { return k::Accumulate(y, x, n, s_); });
  }
  void Scale(float* x, float s, int64_t n) override {
    Run([&] { return k::Scale(x, s, n, s_); });
  }
  void SoftcapForward(float* x, float cap, int64_t n) override {
    Run([&] { return k::SoftcapForward(x, cap, n, s_); });
  }
  void SoftcapBackward(float* dx, const float* y, float cap, int64_t n) override {
    Run([&] { return k::SoftcapBackward(dx, y, cap, n, s_); });
  }
  void CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   int64_t N, int V, int Vp, float dloss) override {
    Run([&] { return k::CrossEntropyForwardBackward(losses, dlogits, logits, targets, N, V, Vp, dloss, s_); });
  }

  void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int C,
                      double eps) override {
    Run([&] { return k::RmsNormForward(out, rstd, inp, weight, N, C, eps, s_); });
  }
  void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                       const float* rstd, int64_t N, int C) override {
    Run([&] { return k::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C, s_); });
  }
  void RopeForward(float* out, const float* inp, const float* cos, const float* sin, int B, int T_, int n_head, int hd,
                   int rot, bool interleaved) override {
    Run([&] { return k::RopeForward(out, inp, cos, sin, B, T_, n_head, hd, rot, interleaved, s_); });
  }
  void RopeBackward(float* dinp, const float* dout, const float* cos, const float* sin, int B, int T_, int n_head,
                    int hd, int rot, bool interleaved) override {
    Run([&] { return k::RopeBackward(dinp, dout, cos, sin, B, T_, n_head, hd, rot, interleaved, s_); });
  }
  void GluForward(float* out, const float* gate, const float* up, int64_t n, kernels::Glu glu) override {
    Run([&] { return k::GluForward(out, gate, up, n, glu, s_); });
  }
  void GluBackward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, int64_t n,
                   kernels::Glu glu) override {
    Run([&] { return k::GluBackward(dgate, dup, gate, up, dout, n, glu, s_); });
  }
  void GqaExpandForward(float* qkv, const float* q, const float* k, const float* v, int64_t N, int NH, int NKV,
                        int hd) override {
    Run([&] { return k::GqaExpandForward(qkv, q, k, v, N, NH, NKV, hd, s_); });
  }
  void GqaExpandBackward(float* dq, float* dk, float* dv, const float* dqkv, int64_t N, int NH, int NKV,
                         int hd) override {
    Run([&] { return k::GqaExpandBackward(dq, dk, dv, dqkv, N, NH, NKV, hd, s_); });
  }
  void CopyHeadColumns(float* dst, int64_t dst_ld, int dst_head, const float* src, int64_t src_ld, int src_head,
                       int64_t N, int H, int width, bool accumulate) override {
    Run([&] { return k::CopyHeadColumns(dst, dst_ld, dst_head, src, src_ld, src_head, N, H, width, accumulate, s_); });
  }
  void MoeRouteForward(float* weights, int32_t* experts, float* probs, const float* logits, const float* bias,
                       int64_t N, const kernels::MoeRouting& r) override {
    Run([&] { return k::MoeRouteForward(weights, experts, probs, logits, bias, N, r, s_); });
  }
  void MoeRouteBackward(float* dlogits, const float* dweights, const float* probs, const int32_t* experts,
                        const float* dprobs, int64_t N, const kernels::MoeRouting& r) override {
    Run([&] { return k::MoeRouteBackward(dlogits, dweights, probs, experts, dprobs, N, r, s_); });
  }
  void GatherRows(float* out, const float* inp, const int32_t* rows, int64_t M, int C) override {
    Run([&] { return k::GatherRows(out, inp, rows, M, C, s_); });
  }
  void GatherRowsBackward(float* dinp, const float* drows, const int32_t* token_rows, int64_t N, int k,
                          int C) override {
    Run([&] { return k::GatherRowsBackward(dinp, drows, token_rows, N, k, C, s_); });
  }
  void MoeCombineForward(float* out, const float* y, const float* weights, const int32_t* token_rows,
                         const int32_t* row_slot, int64_t N, int k, int C) override {
    Run([&] { return k::MoeCombineForward(out, y, weights, token_rows, row_slot, N, k, C, s_); });
  }
  void MoeCombineBackward(float* dy, float* dweights, const float* dout, const float* y, const float* weights,
                          const int32_t* row_token, const int32_t* row_slot, int64_t M, int C) override {
    Run([&] { return k::MoeCombineBackward(dy, dweights, dout, y, weights, row_token, row_slot, M, C, s_); });
  }
  void SigmoidGateForward(float* out, const float* y, const float* logit, int64_t N, int C) override {
    Run([&] { return k::SigmoidGateForward(out, y, logit, N, C, s_); });
  }
  void SigmoidGateBackward(float* dy, float* dlogit, const float* dout, const float* y, const float* logit, int64_t N,
                           int C) override {
    Run([&] { return k::SigmoidGateBackward(dy, dlogit, dout, y, logit, N, C, s_); });
  }

  void* stream() override { return s_; }
  Status Synchronize() override {
    if (Note(Enter())) Note(stream_->Synchronize().WithContext("CudaOps::Synchronize"));
    Status first = std::move(first_error_);
    first_error_ = Status::Ok();
    return first;
  }

 private:
  // Makes the Ops' device current on the calling thread (the runtime
  // launches kernels on the current device, and the caller may have
  // switched it).
  Status Enter() { return k::SetDevice(ordinal_); }

  // kSet on the CUDA kernels, which add (cuda_kernels.h): the weight's and
  // bias's gradients zeroed on the stream first, then added to (cuBLAS with
  // beta 0 would save the read, but may pick another algorithm, hence other
  // bits, than the accumulating call: left for a session that can measure
  // it on a GPU).
  void ZeroIfSet(kernels::GradMode mode, float* dweight, float* dbias, int C, int OC) {
    if (mode != kernels::GradMode::kSet) return;
    if (dweight != nullptr) Zero(dweight, int64_t{OC} * C);
    if (dbias != nullptr) Zero(dbias, OC);
  }

  // The 16-bit operand scratch, at least `bytes`: grown (never shrunk) on
  // the device once the work queued on the old one is done, so it reaches
  // the largest matmul's size in the first step (ModelWorkingSetBytes
  // counts it). Null after an error (kept).
  void* Scratch16(int64_t bytes) {
    if (bytes <= scratch16_bytes_) return scratch16_;
    if (!Note(Enter())) return nullptr;
    if (scratch16_ != nullptr) {
      if (!Note(stream_->Synchronize().WithContext("CudaOps 16-bit scratch"))) return nullptr;
      device_.Free(scratch16_);
      scratch16_ = nullptr;
      scratch16_bytes_ = 0;
    }
    StatusOr<void*> p = device_.Allocate(static_cast<size_t>(bytes));
    if (!Note(p.status().WithContext("CudaOps: 16-bit matmul operands (" + std::to_string(bytes) + " bytes)"))) {
      return nullptr;
    }
    scratch16_ = *p;
    scratch16_bytes_ = bytes;
    return scratch16_;
  }

  // Whether the attention of this head shape runs fused (16-bit mode, a
  // head size with a kernel that fits the device's shared memory).
  bool Flash(int C, int NH) const { return lt_ != nullptr && k::FlashAttentionSupported(C, NH, ordinal_); }

  // Keeps the first error; true when `st` is OK.
  bool Note(const Status& st) {
    if (st.ok()) return true;
    if (first_error_.ok()) first_error_ = st;
    return false;
  }
  // Runs `call` (a kernel launch returning Status) on the Ops' device and
  // keeps the first error.
  template <typename F>
  void Run(F&& call) {
    if (Note(Enter())) Note(call());
  }

  Device& device_;
  const int ordinal_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<k::CudaBlas> blas_;
  std::unique_ptr<k::CudaLt> lt_;  // 16-bit compute; null in fp32 mode
  void* workspace_;                // lt_'s (kLtWorkspaceBytes of device memory)
  void* scratch16_ = nullptr;      // Scratch16
  int64_t scratch16_bytes_ = 0;
  void* const s_;  // stream_->native_handle(): a cudaStream_t
  Status first_error_;
};

}  // namespace

StatusOr<std::unique_ptr<Ops<float>>> CreateCudaOps(Device& device, bool compute16) {
  if (device.kind() != DeviceKind::kCuda) {
    return Status::InvalidArgument("CreateCudaOps: " + device.name() + " is not a CUDA device");
  }
  // CreateStream makes the device's ordinal current on this thread, so the
  // cuBLAS handles below are created on it too.
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream());
  ZINF_ASSIGN_OR_RETURN(int ordinal, k::GetDevice());
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<k::CudaBlas> blas, k::CudaBlas::Create(stream->native_handle()));
  std::unique_ptr<k::CudaLt> lt;
  void* workspace = nullptr;
  if (compute16) {
    auto w = device.Allocate(static_cast<size_t>(k::kLtWorkspaceBytes));
    if (!w.ok()) return w.status().WithContext("CreateCudaOps: the cuBLASLt workspace");
    workspace = *w;
    auto created = k::CudaLt::Create(stream->native_handle(), workspace);
    if (!created.ok()) {
      device.Free(workspace);
      return created.status();
    }
    lt = std::move(created).value();
  }
  return std::unique_ptr<Ops<float>>(
      new CudaOps(&device, ordinal, std::move(stream), std::move(blas), std::move(lt), workspace));
}

}  // namespace zinf::model

#endif  // ZINF_HAVE_CUDA_KERNELS
