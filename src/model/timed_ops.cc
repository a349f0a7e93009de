// TimedOps (timed_ops.h).
#include "model/timed_ops.h"

#include <utility>

#include "device/device.h"

namespace zinf::model {

StatusOr<std::unique_ptr<TimedOps>> TimedOps::Create(std::unique_ptr<Ops<float>> inner, Device& device) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<StreamTimer> timer, device.CreateTimer(inner->stream()));
  return std::unique_ptr<TimedOps>(new TimedOps(std::move(inner), std::move(timer)));
}

TimedOps::TimedOps(std::unique_ptr<Ops<float>> inner, std::unique_ptr<StreamTimer> timer)
    : inner_(std::move(inner)), timer_(std::move(timer)) {}

TimedOps::~TimedOps() = default;

template <typename F>
void TimedOps::Timed(const char* op, F&& call) {
  Status before = timer_->Mark();
  call();
  Status after = timer_->Mark();
  if (before.ok() && after.ok()) {
    calls_.push_back(op);
  } else if (mark_error_.ok()) {
    mark_error_ = (before.ok() ? after : before).WithContext(std::string("timing ") + op);
  }
}

StatusOr<KernelTimes> TimedOps::Take() {
  StatusOr<std::vector<double>> stamps = timer_->Collect();
  std::vector<const char*> calls = std::move(calls_);
  calls_.clear();
  Status error = std::exchange(mark_error_, Status::Ok());
  ZINF_RETURN_IF_ERROR(error);
  ZINF_RETURN_IF_ERROR(stamps.status());
  // A failed mark's call is not counted; its error was returned above. So
  // here every call has its two marks, in order.
  if (stamps->size() != 2 * calls.size()) {
    return Status::Internal("timed ops: " + std::to_string(stamps->size()) + " marks for " +
                            std::to_string(calls.size()) + " calls");
  }
  KernelTimes times;
  for (size_t i = 0; i < calls.size(); ++i) times.AddCall(calls[i], (*stamps)[2 * i + 1] - (*stamps)[2 * i]);
  return times;
}

void TimedOps::Zero(float* p, int64_t n) {
  Timed("Zero", [&] { inner_->Zero(p, n); });
}
void TimedOps::CopyToDevice(void* dst, const void* host_src, size_t bytes) {
  Timed("CopyToDevice", [&] { inner_->CopyToDevice(dst, host_src, bytes); });
}
void TimedOps::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  Timed("CopyToHost", [&] { inner_->CopyToHost(host_dst, src, bytes); });
}
void TimedOps::CastIn(float* out, const void* src, ElementType src_type, int64_t n) {
  Timed("CastIn", [&] { inner_->CastIn(out, src, src_type, n); });
}
void TimedOps::EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T_,
                              int C) {
  Timed("EncoderForward", [&] { inner_->EncoderForward(out, tokens, wte, wpe, B, T_, C); });
}
void TimedOps::EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T_, int C,
                               int32_t padding_token) {
  Timed("EncoderBackward", [&] { inner_->EncoderBackward(dwte, dwpe, dout, tokens, B, T_, C, padding_token); });
}
void TimedOps::LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                const float* bias, int64_t N, int C) {
  Timed("LayerNormForward", [&] { inner_->LayerNormForward(out, mean, rstd, inp, weight, bias, N, C); });
}
void TimedOps::LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                 const float* weight, const float* mean, const float* rstd, int64_t N, int C) {
  Timed("LayerNormBackward",
        [&] { inner_->LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C); });
}
void TimedOps::MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
                             int OC) {
  Timed("MatmulForward", [&] { inner_->MatmulForward(out, inp, weight, bias, N, C, OC); });
}
void TimedOps::MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                              const float* weight, int64_t N, int C, int OC, kernels::GradMode mode) {
  Timed("MatmulBackward", [&] { inner_->MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, mode); });
}
void TimedOps::MatmulForward16(float* out, const float* inp, const void* weight, ElementType weight_type,
                               const float* bias, int64_t N, int C, int OC) {
  Timed("MatmulForward16", [&] { inner_->MatmulForward16(out, inp, weight, weight_type, bias, N, C, OC); });
}
void TimedOps::MatmulBackward16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                const void* weight, ElementType weight_type, int64_t N, int C, int OC,
                                kernels::GradMode mode) {
  Timed("MatmulBackward16",
        [&] { inner_->MatmulBackward16(dinp, dweight, dbias, dout, inp, weight, weight_type, N, C, OC, mode); });
}
void TimedOps::AttentionForward(float* out, float* att, float* scratch, const float* qkv, int B, int T_, int C, int NH,
                                int window, float softcap) {
  Timed("AttentionForward", [&] { inner_->AttentionForward(out, att, scratch, qkv, B, T_, C, NH, window, softcap); });
}
void TimedOps::AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                                 const float* att, int B, int T_, int C, int NH, int window, float softcap) {
  Timed("AttentionBackward",
        [&] { inner_->AttentionBackward(dqkv, scratch, dout, qkv, out, att, B, T_, C, NH, window, softcap); });
}
void TimedOps::GeluForward(float* out, const float* inp, int64_t n) {
  Timed("GeluForward", [&] { inner_->GeluForward(out, inp, n); });
}
void TimedOps::GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
  Timed("GeluBackward", [&] { inner_->GeluBackward(dinp, inp, dout, n); });
}
void TimedOps::ResidualForward(float* out, const float* a, const float* b, int64_t n) {
  Timed("ResidualForward", [&] { inner_->ResidualForward(out, a, b, n); });
}
void TimedOps::Accumulate(float* y, const float* x, int64_t n) {
  Timed("Accumulate", [&] { inner_->Accumulate(y, x, n); });
}
void TimedOps::Scale(float* x, float s, int64_t n) {
  Timed("Scale", [&] { inner_->Scale(x, s, n); });
}
void TimedOps::SoftcapForward(float* x, float cap, int64_t n) {
  Timed("SoftcapForward", [&] { inner_->SoftcapForward(x, cap, n); });
}
void TimedOps::SoftcapBackward(float* dx, const float* y, float cap, int64_t n) {
  Timed("SoftcapBackward", [&] { inner_->SoftcapBackward(dx, y, cap, n); });
}
void TimedOps::CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                           int64_t N, int V, int Vp, float dloss) {
  Timed("CrossEntropyForwardBackward",
        [&] { inner_->CrossEntropyForwardBackward(losses, dlogits, logits, targets, N, V, Vp, dloss); });
}
void TimedOps::RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int C,
                              double eps) {
  Timed("RmsNormForward", [&] { inner_->RmsNormForward(out, rstd, inp, weight, N, C, eps); });
}
void TimedOps::RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                               const float* rstd, int64_t N, int C) {
  Timed("RmsNormBackward", [&] { inner_->RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C); });
}
void TimedOps::RopeForward(float* out, const float* inp, const float* cos, const float* sin, int B, int T_, int n_head,
                           int hd, int rot, bool interleaved) {
  Timed("RopeForward", [&] { inner_->RopeForward(out, inp, cos, sin, B, T_, n_head, hd, rot, interleaved); });
}
void TimedOps::RopeBackward(float* dinp, const float* dout, const float* cos, const float* sin, int B, int T_,
                            int n_head, int hd, int rot, bool interleaved) {
  Timed("RopeBackward", [&] { inner_->RopeBackward(dinp, dout, cos, sin, B, T_, n_head, hd, rot, interleaved); });
}
void TimedOps::GluForward(float* out, const float* gate, const float* up, int64_t n, kernels::Glu glu) {
  Timed("GluForward", [&] { inner_->GluForward(out, gate, up, n, glu); });
}
void TimedOps::GluBackward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, int64_t n,
                           kernels::Glu glu) {
  Timed("GluBackward", [&] { inner_->GluBackward(dgate, dup, gate, up, dout, n, glu); });
}
void TimedOps::GqaExpandForward(float* qkv, const float* q, const float* k, const float* v, int64_t N, int NH, int NKV,
                                int hd) {
  Timed("GqaExpandForward", [&] { inner_->GqaExpandForward(qkv, q, k, v, N, NH, NKV, hd); });
}
void TimedOps::GqaExpandBackward(float* dq, float* dk, float* dv, const float* dqkv, int64_t N, int NH, int NKV,
                                 int hd) {
  Timed("GqaExpandBackward", [&] { inner_->GqaExpandBackward(dq, dk, dv, dqkv, N, NH, NKV, hd); });
}
void TimedOps::CopyHeadColumns(float* dst, int64_t dst_ld, int dst_head, const float* src, int64_t src_ld, int src_head,
                               int64_t N, int H, int width, bool accumulate) {
  Timed("CopyHeadColumns",
        [&] { inner_->CopyHeadColumns(dst, dst_ld, dst_head, src, src_ld, src_head, N, H, width, accumulate); });
}
void TimedOps::MoeRouteForward(float* weights, int32_t* experts, float* probs, const float* logits, const float* bias,
                               int64_t N, const kernels::MoeRouting& r) {
  Timed("MoeRouteForward", [&] { inner_->MoeRouteForward(weights, experts, probs, logits, bias, N, r); });
}
void TimedOps::MoeRouteBackward(float* dlogits, const float* dweights, const float* probs, const int32_t* experts,
                                const float* dprobs, int64_t N, const kernels::MoeRouting& r) {
  Timed("MoeRouteBackward", [&] { inner_->MoeRouteBackward(dlogits, dweights, probs, experts, dprobs, N, r); });
}
void TimedOps::GatherRows(float* out, const float* inp, const int32_t* rows, int64_t M, int C) {
  Timed("GatherRows", [&] { inner_->GatherRows(out, inp, rows, M, C); });
}
void TimedOps::GatherRowsBackward(float* dinp, const float* drows, const int32_t* token_rows, int64_t N, int k, int C) {
  Timed("GatherRowsBackward", [&] { inner_->GatherRowsBackward(dinp, drows, token_rows, N, k, C); });
}
void TimedOps::MoeCombineForward(float* out, const float* y, const float* weights, const int32_t* token_rows,
                                 const int32_t* row_slot, int64_t N, int k, int C) {
  Timed("MoeCombineForward", [&] { inner_->MoeCombineForward(out, y, weights, token_rows, row_slot, N, k, C); });
}
void TimedOps::MoeCombineBackward(float* dy, float* dweights, const float* dout, const float* y, const float* weights,
                                  const int32_t* row_token, const int32_t* row_slot, int64_t M, int C) {
  Timed("MoeCombineBackward",
        [&] { inner_->MoeCombineBackward(dy, dweights, dout, y, weights, row_token, row_slot, M, C); });
}
void TimedOps::SigmoidGateForward(float* out, const float* y, const float* logit, int64_t N, int C) {
  Timed("SigmoidGateForward", [&] { inner_->SigmoidGateForward(out, y, logit, N, C); });
}
void TimedOps::SigmoidGateBackward(float* dy, float* dlogit, const float* dout, const float* y, const float* logit,
                                   int64_t N, int C) {
  Timed("SigmoidGateBackward", [&] { inner_->SigmoidGateBackward(dy, dlogit, dout, y, logit, N, C); });
}

}  // namespace zinf::model
