// TimedOps: Ops that time every kernel call on the device itself, by Ops
// method. It is how `wall_clock_breakdown` (DeepSpeed's key) shows where a
// step's device time goes: on a GPU, CUDA events.
//
// Each call is bracketed by two marks of a Device StreamTimer on the inner
// Ops' stream, so a call's time is the stretch its stream spent on that
// call's work (its kernels, or its copy), and the sum over calls is the
// time the device was busy with the model. The rest of a step's wall time
// the stream sat idle: waiting for a fetch, a copy or the host. With Ops
// that run in place (CpuOps on the host device) the marks are the calling
// thread's clock. Marking never waits (two event records a call on CUDA);
// the results come out of Take, which waits for the calls' work. The bits
// computed are the inner Ops' own: every call is passed on unchanged.
//
// Thread-safety: as Ops, one thread drives it (Take included).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/ops.h"

namespace zinf {
class StreamTimer;
}

namespace zinf::model {

struct KernelTime {
  double seconds = 0.0;
  int64_t calls = 0;
};

// The device time of the calls since the last Take.
struct KernelTimes {
  std::map<std::string, KernelTime> by_op;  // Ops method name ("MatmulForward16") -> its calls
  double busy_seconds = 0.0;                // the sum over by_op

  // One call of `op` that took `seconds`.
  void AddCall(const std::string& op, double seconds) {
    KernelTime& t = by_op[op];
    t.seconds += seconds;
    ++t.calls;
    busy_seconds += seconds;
  }
  // Every op's time and calls of `other` (a run's total over its steps).
  void Add(const KernelTimes& other) {
    for (const auto& [op, t] : other.by_op) {
      by_op[op].seconds += t.seconds;
      by_op[op].calls += t.calls;
    }
    busy_seconds += other.busy_seconds;
  }
};

class TimedOps final : public Ops<float> {
 public:
  // Times `inner`'s calls with a StreamTimer on its stream (ops.h: stream()).
  // Errors: the device's CreateTimer.
  static StatusOr<std::unique_ptr<TimedOps>> Create(std::unique_ptr<Ops<float>> inner, Device& device);
  ~TimedOps() override;

  // Waits for the work of the calls since the last Take and returns their
  // times; the next Take starts from here. Errors: a failed mark or
  // collection (the kernels' own errors come from Synchronize).
  StatusOr<KernelTimes> Take();

  std::string name() const override { return inner_->name(); }
  void Zero(float* p, int64_t n) override;
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  void CastIn(float* out, const void* src, ElementType src_type, int64_t n) override;
  void EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T_,
                      int C) override;
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T_, int C,
                       int32_t padding_token) override;
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                        int64_t N, int C) override;
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int64_t N, int C) override;
  void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
                     int OC) override;
  void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, int64_t N, int C, int OC, kernels::GradMode mode) override;
  bool reads_weights16() const override { return inner_->reads_weights16(); }
  void MatmulForward16(float* out, const float* inp, const void* weight, ElementType weight_type, const float* bias,
                       int64_t N, int C, int OC) override;
  void MatmulBackward16(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const void* weight, ElementType weight_type, int64_t N, int C, int OC,
                        kernels::GradMode mode) override;
  int64_t AttentionScratchElems(int B, int T_, int C, int NH, float softcap) const override {
    return inner_->AttentionScratchElems(B, T_, C, NH, softcap);
  }
  int64_t AttentionSavedElems(int B, int T_, int C, int NH) const override {
    return inner_->AttentionSavedElems(B, T_, C, NH);
  }
  void AttentionForward(float* out, float* att, float* scratch, const float* qkv, int B, int T_, int C, int NH,
                        int window, float softcap) override;
  void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                         const float* att, int B, int T_, int C, int NH, int window, float softcap) override;
  void GeluForward(float* out, const float* inp, int64_t n) override;
  void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  void ResidualForward(float* out, const float* a, const float* b, int64_t n) override;
  void Accumulate(float* y, const float* x, int64_t n) override;
  void Scale(float* x, float s, int64_t n) override;
  void SoftcapForward(float* x, float cap, int64_t n) override;
  void SoftcapBackward(float* dx, const float* y, float cap, int64_t n) override;
  void CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   int64_t N, int V, int Vp, float dloss) override;
  void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int C,
                      double eps) override;
  void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                       const float* rstd, int64_t N, int C) override;
  void RopeForward(float* out, const float* inp, const float* cos, const float* sin, int B, int T_, int n_head, int hd,
                   int rot, bool interleaved) override;
  void RopeBackward(float* dinp, const float* dout, const float* cos, const float* sin, int B, int T_, int n_head,
                    int hd, int rot, bool interleaved) override;
  void GluForward(float* out, const float* gate, const float* up, int64_t n, kernels::Glu glu) override;
  void GluBackward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, int64_t n,
                   kernels::Glu glu) override;
  void GqaExpandForward(float* qkv, const float* q, const float* k, const float* v, int64_t N, int NH, int NKV,
                        int hd) override;
  void GqaExpandBackward(float* dq, float* dk, float* dv, const float* dqkv, int64_t N, int NH, int NKV,
                         int hd) override;
  void CopyHeadColumns(float* dst, int64_t dst_ld, int dst_head, const float* src, int64_t src_ld, int src_head,
                       int64_t N, int H, int width, bool accumulate) override;
  void MoeRouteForward(float* weights, int32_t* experts, float* probs, const float* logits, const float* bias,
                       int64_t N, const kernels::MoeRouting& r) override;
  void MoeRouteBackward(float* dlogits, const float* dweights, const float* probs, const int32_t* experts,
                        const float* dprobs, int64_t N, const kernels::MoeRouting& r) override;
  void GatherRows(float* out, const float* inp, const int32_t* rows, int64_t M, int C) override;
  void GatherRowsBackward(float* dinp, const float* drows, const int32_t* token_rows, int64_t N, int k, int C) override;
  void MoeCombineForward(float* out, const float* y, const float* weights, const int32_t* token_rows,
                         const int32_t* row_slot, int64_t N, int k, int C) override;
  void MoeCombineBackward(float* dy, float* dweights, const float* dout, const float* y, const float* weights,
                          const int32_t* row_token, const int32_t* row_slot, int64_t M, int C) override;
  void SigmoidGateForward(float* out, const float* y, const float* logit, int64_t N, int C) override;
  void SigmoidGateBackward(float* dy, float* dlogit, const float* dout, const float* y, const float* logit, int64_t N,
                           int C) override;
  Status Synchronize() override { return inner_->Synchronize(); }
  void* stream() override { return inner_->stream(); }

 private:
  TimedOps(std::unique_ptr<Ops<float>> inner, std::unique_ptr<StreamTimer> timer);
  // `call` between two marks, counted under `op`.
  template <typename F>
  void Timed(const char* op, F&& call);

  std::unique_ptr<Ops<float>> inner_;
  std::unique_ptr<StreamTimer> timer_;  // declared after inner_: gone first, as its stream outlives it
  std::vector<const char*> calls_;      // the op of each call since the last Take
  Status mark_error_;                   // the first failed mark since the last Take
};

}  // namespace zinf::model
