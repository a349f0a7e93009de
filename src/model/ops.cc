// CpuOps: the Ops interface over kernels/cpu_kernels.h, and CreateOps, which
// picks CPU or CUDA Ops for a Device.
//
// On the host device "device memory" is host memory, so CpuOps dereferences
// the pointers it is given and every call finishes before it returns;
// Synchronize has nothing to wait for and nothing can fail. Given a host
// Stream, CpuOps queues them on it instead, as CUDA queues its kernels.
#include "model/ops.h"

#include <cstring>
#include <type_traits>

#include "core/check.h"
#include "device/device.h"

#if defined(ZINF_HAVE_CUDA_KERNELS)
#include "model/cuda_ops.h"
#endif

namespace zinf::model {
namespace {

namespace k = kernels::cpu;

// The kernels on the calling thread or, given a host device Stream, queued
// on it and run by its worker thread in order: the host device with a GPU's
// asynchrony, so that the callers' path behind a stream (ops.h: stream())
// runs, and is checked, on machines without a GPU. Queued, as on CUDA, the
// arguments are taken at the call and the memory they point to must stay
// valid until the work has run; the copies wait for it, and the copies and
// Zero go through the stream's own CopyAsync and MemsetAsync, which check
// the device pointers. Queued kernels use the OpenMP team size of the
// thread that queued them.
template <typename T>
class CpuOps final : public Ops<T> {
 public:
  explicit CpuOps(std::unique_ptr<Stream> stream = nullptr) : stream_(std::move(stream)) {}
  ~CpuOps() override {
    if (stream_) stream_->Synchronize().IgnoreError();  // queued work uses this object
  }

  std::string name() const override {
    return std::string(sizeof(T) == 4 ? "cpu-f32" : "cpu-f64") + (stream_ ? "-stream" : "");
  }

  void Zero(T* p, int64_t n) override {
    if (n <= 0) return;
    const size_t bytes = sizeof(T) * static_cast<size_t>(n);
    if (!stream_) {
      std::memset(p, 0, bytes);
      return;
    }
    Note(stream_->MemsetAsync(p, 0, bytes).WithContext("Zero"));
  }
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    Copy(dst, host_src, bytes, CopyDirection::kHostToDevice, "CopyToDevice");
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    Copy(host_dst, src, bytes, CopyDirection::kDeviceToHost, "CopyToHost");
  }
  void CastIn(T* out, const void* src, ElementType src_type, int64_t n) override {
    Run([=] { k::CastIn(out, src, src_type, n); });
  }

  void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C) override {
    Run([=] { k::EncoderForward(out, tokens, wte, wpe, B, T_, C); });
  }
  void EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C,
                       int32_t padding_token) override {
    Run([=] { k::EncoderBackward(dwte, dwpe, dout, tokens, B, T_, C, padding_token); });
  }
  void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N,
                        int C) override {
    Run([=] { k::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C); });
  }
  void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                         const T* rstd, int64_t N, int C) override {
    Run([=] { k::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C); });
  }
  void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int C, int OC) override {
    Run([=] { k::MatmulForward(out, inp, weight, bias, N, C, OC); });
  }
  void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N, int C,
                      int OC, kernels::GradMode mode) override {
    Run([=] { k::MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, mode); });
  }
  // float reads bf16 and f16 weights as they are; the fp64 checks cast.
  bool reads_weights16() const override { return std::is_same_v<T, float>; }
  void MatmulForward16(T* out, const T* inp, const void* weight, ElementType weight_type, const T* bias, int64_t N,
                       int C, int OC) override {
    if constexpr (std::is_same_v<T, float>) {
      Run([=] { k::MatmulForward16(out, inp, static_cast<const uint16_t*>(weight), weight_type, bias, N, C, OC); });
    } else {
      Ops<T>::MatmulForward16(out, inp, weight, weight_type, bias, N, C, OC);
    }
  }
  void MatmulBackward16(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const void* weight,
                        ElementType weight_type, int64_t N, int C, int OC, kernels::GradMode mode) override {
    if constexpr (std::is_same_v<T, float>) {
      Run([=] {
        k::MatmulBackward16(dinp, dweight, dbias, dout, inp, static_cast<const uint16_t*>(weight), weight_type, N, C,
                            OC, mode);
      });
    } else {
      Ops<T>::MatmulBackward16(dinp, dweight, dbias, dout, inp, weight, weight_type, N, C, OC, mode);
    }
  }
  // The fused attention (cpu_kernels.h FusedAttentionForward): it keeps
  // each row's log-sum-exp, B*NH*T; the backward's scratch is one value
  // per row too (its D).
  int64_t AttentionScratchElems(int B, int T_, int /*C*/, int NH, float /*softcap*/) const override {
    return static_cast<int64_t>(B) * NH * T_;
  }
  int64_t AttentionSavedElems(int B, int T_, int /*C*/, int NH) const override {
    return static_cast<int64_t>(B) * NH * T_;
  }
  void AttentionForward(T* out, T* att, T* /*scratch*/, const T* qkv, int B, int T_, int C, int NH, int window,
                        float softcap) override {
    Run([=] { k::FusedAttentionForward(out, att, qkv, B, T_, C, NH, window, softcap); });
  }
  void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* out, const T* att, int B, int T_,
                         int C, int NH, int window, float softcap) override {
    Run([=] { k::FusedAttentionBackward(dqkv, scratch, dout, qkv, out, att, B, T_, C, NH, window, softcap); });
  }
  void GeluForward(T* out, const T* inp, int64_t n) override {
    Run([=] { k::GeluForward(out, inp, n); });
  }
  void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) override {
    Run([=] { k::GeluBackward(dinp, inp, dout, n); });
  }
  void ResidualForward(T* out, const T* a, const T* b, int64_t n) override {
    Run([=] { k::ResidualForward(out, a, b, n); });
  }
  void Accumulate(T* y, const T* x, int64_t n) override {
    Run([=] { k::Accumulate(y, x, n); });
  }
  void Scale(T* x, T s, int64_t n) override {
    Run([=] { k::Scale(x, s, n); });
  }
  void SoftcapForward(T* x, T cap, int64_t n) override {
    Run([=] { k::SoftcapForward(x, cap, n); });
  }
  void SoftcapBackward(T* dx, const T* y, T cap, int64_t n) override {
    Run([=] { k::SoftcapBackward(dx, y, cap, n); });
  }
  void CrossEntropyForwardBackward(T* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N, int V,
                                   int Vp, T dloss) override {
    Run([=] { k::CrossEntropyForwardBackward(losses, dlogits, logits, targets, N, V, Vp, dloss); });
  }

  void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int C, double eps) override {
    Run([=] { k::RmsNormForward(out, rstd, inp, weight, N, C, eps); });
  }
  void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int64_t N,
                       int C) override {
    Run([=] { k::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C); });
  }
  void RopeForward(T* out, const T* inp, const T* cos, const T* sin, int B, int T_, int n_head, int hd, int rot,
                   bool interleaved) override {
    Run([=] { k::RopeForward(out, inp, cos, sin, B, T_, n_head, hd, rot, interleaved); });
  }
  void RopeBackward(T* dinp, const T* dout, const T* cos, const T* sin, int B, int T_, int n_head, int hd, int rot,
                    bool interleaved) override {
    Run([=] { k::RopeBackward(dinp, dout, cos, sin, B, T_, n_head, hd, rot, interleaved); });
  }
  void GluForward(T* out, const T* gate, const T* up, int64_t n, kernels::Glu glu) override {
    Run([=] { k::GluForward(out, gate, up, n, glu); });
  }
  void GluBackward(T* dgate, T* dup, const T* gate, const T* up, const T* dout, int64_t n, kernels::Glu glu) override {
    Run([=] { k::GluBackward(dgate, dup, gate, up, dout, n, glu); });
  }
  void GqaExpandForward(T* qkv, const T* q, const T* k, const T* v, int64_t N, int NH, int NKV, int hd) override {
    Run([=] { k::GqaExpandForward(qkv, q, k, v, N, NH, NKV, hd); });
  }
  void GqaExpandBackward(T* dq, T* dk, T* dv, const T* dqkv, int64_t N, int NH, int NKV, int hd) override {
    Run([=] { k::GqaExpandBackward(dq, dk, dv, dqkv, N, NH, NKV, hd); });
  }
  void CopyHeadColumns(T* dst, int64_t dst_ld, int dst_head, const T* src, int64_t src_ld, int src_head, int64_t N,
                       int H, int width, bool accumulate) override {
    Run([=] { k::CopyHeadColumns(dst, dst_ld, dst_head, src, src_ld, src_head, N, H, width, accumulate); });
  }
  void MoeRouteForward(T* weights, int32_t* experts, T* probs, const T* logits, const T* bias, int64_t N,
                       const kernels::MoeRouting& r) override {
    Run([=] { k::MoeRouteForward(weights, experts, probs, logits, bias, N, r); });
  }
  void MoeRouteBackward(T* dlogits, const T* dweights, const T* probs, const int32_t* experts, const T* dprobs,
                        int64_t N, const kernels::MoeRouting& r) override {
    Run([=] { k::MoeRouteBackward(dlogits, dweights, probs, experts, dprobs, N, r); });
  }
  void GatherRows(T* out, const T* inp, const int32_t* rows, int64_t M, int C) override {
    Run([=] { k::GatherRows(out, inp, rows, M, C); });
  }
  void GatherRowsBackward(T* dinp, const T* drows, const int32_t* token_rows, int64_t N, int k, int C) override {
    Run([=] { k::GatherRowsBackward(dinp, drows, token_rows, N, k, C); });
  }
  void MoeCombineForward(T* out, const T* y, const T* weights, const int32_t* token_rows, const int32_t* row_slot,
                         int64_t N, int k, int C) override {
    Run([=] { k::MoeCombineForward(out, y, weights, token_rows, row_slot, N, k, C); });
  }
  void MoeCombineBackward(T* dy, T* dweights, const T* dout, const T* y, const T* weights, const int32_t* row_token,
                          const int32_t* row_slot, int64_t M, int C) override {
    Run([=] { k::MoeCombineBackward(dy, dweights, dout, y, weights, row_token, row_slot, M, C); });
  }
  void SigmoidGateForward(T* out, const T* y, const T* logit, int64_t N, int C) override {
    Run([=] { k::SigmoidGateForward(out, y, logit, N, C); });
  }
  void SigmoidGateBackward(T* dy, T* dlogit, const T* dout, const T* y, const T* logit, int64_t N, int C) override {
    Run([=] { k::SigmoidGateBackward(dy, dlogit, dout, y, logit, N, C); });
  }

  Status Synchronize() override {
    if (stream_) Note(stream_->Synchronize().WithContext("CpuOps::Synchronize"));
    Status first = std::move(first_error_);
    first_error_ = Status::Ok();
    return first;
  }
  void* stream() override { return stream_.get(); }  // how the host device names its streams (RecordOn)

 private:
  // Runs `kernel` here, or queues it on the stream.
  template <typename F>
  void Run(F&& kernel) {
    if (!stream_) {
      kernel();
      return;
    }
    Note(stream_->LaunchHostFunc([threads = k::Threads(), kernel = std::forward<F>(kernel)] {
      if (k::Threads() != threads) k::SetThreads(threads);
      kernel();
    }));
  }
  // A synchronous copy.
  void Copy(void* dst, const void* src, size_t bytes, CopyDirection dir, const char* what) {
    if (!stream_) {
      if (bytes > 0) std::memcpy(dst, src, bytes);
      return;
    }
    Note(stream_->CopyAsync(dst, src, bytes, dir).WithContext(what));
    Note(stream_->Synchronize().WithContext(what));
  }
  // Keeps the first error for Synchronize.
  void Note(Status s) {
    if (!s.ok() && first_error_.ok()) first_error_ = std::move(s);
  }

  std::unique_ptr<Stream> stream_;  // null: on the calling thread
  Status first_error_;
};

}  // namespace

template <typename T>
void Ops<T>::MatmulForward16(T*, const T*, const void*, ElementType, const T*, int64_t, int, int) {
  ZINF_CHECK_MSG(false, "Ops::MatmulForward16 on ops that do not read 16-bit weights (reads_weights16)");
}

template <typename T>
void Ops<T>::MatmulBackward16(T*, T*, T*, const T*, const T*, const void*, ElementType, int64_t, int, int,
                              kernels::GradMode) {
  ZINF_CHECK_MSG(false, "Ops::MatmulBackward16 on ops that do not read 16-bit weights (reads_weights16)");
}

template class Ops<float>;
template class Ops<double>;

template <typename T>
std::unique_ptr<Ops<T>> CreateCpuOps() {
  return std::make_unique<CpuOps<T>>();
}

template std::unique_ptr<Ops<float>> CreateCpuOps<float>();
template std::unique_ptr<Ops<double>> CreateCpuOps<double>();

StatusOr<std::unique_ptr<Ops<float>>> CreateOps(Device& device, bool compute16, bool host_stream) {
  switch (device.kind()) {
    case DeviceKind::kHost: {
      if (!host_stream) return CreateCpuOps<float>();
      ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream());
      return std::unique_ptr<Ops<float>>(new CpuOps<float>(std::move(stream)));
    }
    case DeviceKind::kCuda:
#if defined(ZINF_HAVE_CUDA_KERNELS)
      return CreateCudaOps(device, compute16);
#else
      (void)compute16;
      return Status::Unavailable("CreateOps: device " + device.name() +
                                 " is a CUDA device, but this build has no CUDA kernels");
#endif
  }
  return Status::Internal("CreateOps: unknown device kind");
}

}  // namespace zinf::model
