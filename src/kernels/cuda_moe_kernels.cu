// CUDA kernels of the mixture-of-experts MLP (contract in cuda_kernels.h):
// a thread per token for the routing, grid-stride elementwise loops for
// the gathers and the combine, a warp per dispatched row for the routing
// weights' gradients. No atomics: the same bits run to run.
#include <cuda_runtime.h>

#include "kernels/cpu_kernels.h"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_kernels.h"
#include "kernels/moe_routing_rules.h"

namespace zinf::kernels::cuda {
namespace {

constexpr int kMaxK = cpu::kMaxExpertsPerToken;

// A token's choice scores: its scores plus the selection bias
// (moe_routing_rules.h chooses groups and experts by them).
__device__ float ChoiceScore(const float* p, const float* bias, int e) {
  return p[e] + (bias != nullptr ? bias[e] : 0.f);
}

using routing::Floored;
using routing::NormDivisor;
using routing::NormSum;

__global__ void MoeRouteForwardKernel(float* weights, int32_t* experts, float* probs, const float* logits,
                                      const float* bias, int64_t N, MoeRouting r) {
  const int E = r.E, k = r.k;
  ZINF_GRID_STRIDE(n, N) {
    const float* l = logits + n * E;
    float* p = probs + n * E;
    if (r.scoring == MoeScoring::kSigmoid) {
      for (int e = 0; e < E; ++e) p[e] = 1.f / (1.f + expf(-l[e]));
    } else {
      float max = l[0];
      for (int e = 1; e < E; ++e) max = fmaxf(max, l[e]);
      float sum = 0.f;
      for (int e = 0; e < E; ++e) sum += expf(l[e] - max);
      for (int e = 0; e < E; ++e) p[e] = expf(l[e] - max) / sum;
    }
    const auto score = [p, bias](int e) { return ChoiceScore(p, bias, e); };
    int32_t* ex = experts + n * k;
    routing::ChooseExperts(ex, score, routing::ChooseGroups<float>(score, r), r);
    float total = 0.f;
    for (int j = 0; j < k; ++j) total += p[ex[j]];
    const float D = NormDivisor(total, r);
    const float scale = static_cast<float>(r.scale);
    for (int j = 0; j < k; ++j) weights[n * k + j] = (r.normalize ? p[ex[j]] / D : p[ex[j]]) * scale;
  }
}

__global__ void MoeRouteBackwardKernel(float* dlogits, const float* dweights, const float* probs,
                                       const int32_t* experts, const float* dprobs, int64_t N, MoeRouting r) {
  const int E = r.E, k = r.k;
  const bool sigmoid = r.scoring == MoeScoring::kSigmoid;
  ZINF_GRID_STRIDE(n, N) {
    const float* p = probs + n * E;
    const float* dw = dweights + n * k;
    const int32_t* ex = experts + n * k;
    float total = 0.f, dot = 0.f;
    for (int j = 0; j < k; ++j) {
      total += p[ex[j]];
      dot += dw[j] * p[ex[j]];
    }
    // Where the floor holds the divisor is a constant (no term through the sum).
    const float D = NormDivisor(total, r);
    const float through_sum = Floored(NormSum(total, r), r) ? 0.f : dot / (D * D);
    const float scale = static_cast<float>(r.scale);
    float dv[kMaxK];
    float weighted = 0.f;
    for (int j = 0; j < k; ++j) {
      dv[j] = (r.normalize ? dw[j] / D - through_sum : dw[j]) * scale;
      weighted += p[ex[j]] * dv[j];
    }
    if (dprobs != nullptr) {
      for (int e = 0; e < E; ++e) weighted += p[e] * dprobs[e];
    }
    for (int e = 0; e < E; ++e) {
      float dp = dprobs != nullptr ? dprobs[e] : 0.f;
      for (int j = 0; j < k; ++j) dp += ex[j] == e ? dv[j] : 0.f;
      dlogits[n * E + e] += sigmoid ? p[e] * (1.f - p[e]) * dp : p[e] * (dp - weighted);
    }
  }
}

__global__ void GatherRowsKernel(float* out, const float* inp, const int32_t* rows, int64_t M, int C) {
  ZINF_GRID_STRIDE(i, M * C) out[i] = inp[int64_t{rows[i / C]} * C + i % C];
}

__global__ void GatherRowsBackwardKernel(float* dinp, const float* drows, const int32_t* token_rows, int64_t N, int k,
                                         int C) {
  ZINF_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    float s = dinp[i];
    for (int j = 0; j < k; ++j) s += drows[int64_t{token_rows[n * k + j]} * C + c];
    dinp[i] = s;
  }
}

__global__ void MoeCombineForwardKernel(float* out, const float* y, const float* weights, const int32_t* token_rows,
                                        const int32_t* row_slot, int64_t N, int k, int C) {
  ZINF_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    float s = 0.f;
    for (int j = 0; j < k; ++j) {
      const int64_t r = token_rows[n * k + j];
      s += __fmul_rn(y[r * C + c], weights[row_slot[r]]);
    }
    out[i] = s;
  }
}

__global__ void MoeCombineBackwardRowsKernel(float* dy, const float* dout, const float* weights,
                                             const int32_t* row_token, const int32_t* row_slot, int64_t M, int C) {
  ZINF_GRID_STRIDE(i, M * C) {
    const int64_t r = i / C;
    dy[i] += dout[int64_t{row_token[r]} * C + i % C] * weights[row_slot[r]];
  }
}

__global__ void MoeCombineBackwardWeightsKernel(float* dweights, const float* dout, const float* y,
                                                const int32_t* row_token, const int32_t* row_slot, int64_t M, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32; r < M; r += warps) {
    const float* d = dout + int64_t{row_token[r]} * C;
    float s = 0.f;
    for (int c = lane; c < C; c += 32) s += d[c] * y[r * C + c];
    s = WarpSum(s);
    if (lane == 0) dweights[row_slot[r]] += s;
  }
}

__device__ float SigmoidOf(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void SigmoidGateForwardKernel(float* out, const float* y, const float* logit, int64_t N, int C) {
  ZINF_GRID_STRIDE(i, N * C) { out[i] += __fmul_rn(SigmoidOf(logit[i / C]), y[i]); }
}

// A warp per row: the row's dy and its dot for dlogit.
__global__ void SigmoidGateBackwardKernel(float* dy, float* dlogit, const float* dout, const float* y,
                                          const float* logit, int64_t N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t n = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32; n < N; n += warps) {
    const float s = SigmoidOf(logit[n]);
    float dot = 0.f;
    for (int c = lane; c < C; c += 32) {
      dy[n * C + c] += s * dout[n * C + c];
      dot += dout[n * C + c] * y[n * C + c];
    }
    dot = WarpSum(dot);
    if (lane == 0) dlogit[n] += s * (1.f - s) * dot;
  }
}

}  // namespace

Status MoeRouteForward(float* weights, int32_t* experts, float* probs, const float* logits, const float* bias,
                       int64_t N, const MoeRouting& r, void* stream) {
  MoeRouteForwardKernel<<<GridFor(N, kThreads), kThreads, 0, AsStream(stream)>>>(weights, experts, probs, logits, bias,
                                                                                 N, r);
  return LaunchStatus("moe_route_forward");
}

Status MoeRouteBackward(float* dlogits, const float* dweights, const float* probs, const int32_t* experts,
                        const float* dprobs, int64_t N, const MoeRouting& r, void* stream) {
  MoeRouteBackwardKernel<<<GridFor(N, kThreads), kThreads, 0, AsStream(stream)>>>(dlogits, dweights, probs, experts,
                                                                                  dprobs, N, r);
  return LaunchStatus("moe_route_backward");
}

Status GatherRows(float* out, const float* inp, const int32_t* rows, int64_t M, int C, void* stream) {
  GatherRowsKernel<<<GridFor(M * C, kThreads), kThreads, 0, AsStream(stream)>>>(out, inp, rows, M, C);
  return LaunchStatus("gather_rows");
}

Status GatherRowsBackward(float* dinp, const float* drows, const int32_t* token_rows, int64_t N, int k, int C,
                          void* stream) {
  GatherRowsBackwardKernel<<<GridFor(N * C, kThreads), kThreads, 0, AsStream(stream)>>>(dinp, drows, token_rows, N, k,
                                                                                        C);
  return LaunchStatus("gather_rows_backward");
}

Status MoeCombineForward(float* out, const float* y, const float* weights, const int32_t* token_rows,
                         const int32_t* row_slot, int64_t N, int k, int C, void* stream) {
  MoeCombineForwardKernel<<<GridFor(N * C, kThreads), kThreads, 0, AsStream(stream)>>>(out, y, weights, token_rows,
                                                                                       row_slot, N, k, C);
  return LaunchStatus("moe_combine_forward");
}

Status MoeCombineBackward(float* dy, float* dweights, const float* dout, const float* y, const float* weights,
                          const int32_t* row_token, const int32_t* row_slot, int64_t M, int C, void* stream) {
  cudaStream_t s = AsStream(stream);
  MoeCombineBackwardRowsKernel<<<GridFor(M * C, kThreads), kThreads, 0, s>>>(dy, dout, weights, row_token, row_slot, M,
                                                                             C);
  ZINF_RETURN_IF_ERROR(LaunchStatus("moe_combine_backward dy"));
  MoeCombineBackwardWeightsKernel<<<GridFor(M, kWarpsPerBlock), kThreads, 0, s>>>(dweights, dout, y, row_token,
                                                                                  row_slot, M, C);
  return LaunchStatus("moe_combine_backward dweights");
}

Status SigmoidGateForward(float* out, const float* y, const float* logit, int64_t N, int C, void* stream) {
  SigmoidGateForwardKernel<<<GridFor(N * C, kThreads), kThreads, 0, AsStream(stream)>>>(out, y, logit, N, C);
  return LaunchStatus("sigmoid_gate_forward");
}

Status SigmoidGateBackward(float* dy, float* dlogit, const float* dout, const float* y, const float* logit, int64_t N,
                           int C, void* stream) {
  SigmoidGateBackwardKernel<<<GridFor(N, kWarpsPerBlock), kThreads, 0, AsStream(stream)>>>(dy, dlogit, dout, y, logit,
                                                                                           N, C);
  return LaunchStatus("sigmoid_gate_backward");
}

}  // namespace zinf::kernels::cuda
