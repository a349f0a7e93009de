// CUDA kernels of the Llama family (contract in cuda_kernels.h). As in
// cuda_kernels.cu: grid-stride elementwise loops, one warp per row for
// RMSNorm, column sums by one thread per channel in row order; no atomics,
// so results are the same run to run.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_kernels.h"

namespace zinf::kernels::cuda {
namespace {

__global__ void RmsNormForwardKernel(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int C,
                                     float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t n = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32; n < N; n += warps) {
    const float* x = inp + n * C;
    float ss = 0.f;
    for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
    ss = WarpSum(ss);
    const float s = rsqrtf(ss / C + eps);
    if (lane == 0) rstd[n] = s;
    for (int c = lane; c < C; c += 32) out[n * C + c] = x[c] * s * weight[c];
  }
}

__global__ void RmsNormBackwardInputKernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                           const float* rstd, int64_t N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t n = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32; n < N; n += warps) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    const float s = rstd[n];
    float gx = 0.f;
    for (int c = lane; c < C; c += 32) gx += d[c] * weight[c] * (x[c] * s);
    gx = WarpSum(gx) / C;
    for (int c = lane; c < C; c += 32) dinp[n * C + c] += s * (d[c] * weight[c] - x[c] * s * gx);
  }
}

// Item j of a (position, head): the pair (j, j + rot/2) for j < rot/2, or
// (2j, 2j + 1) when interleaved; the passing column rot + j - rot/2 after
// them.
__global__ void RopeKernel(float* out, const float* inp, const float* cos, const float* sin, int T, int n_head, int hd,
                           int rot, bool interleaved, int64_t items, bool backward) {
  const int half = rot / 2, per_head = half + (hd - rot);
  const int step = interleaved ? 2 : 1, gap = interleaved ? 1 : half;
  ZINF_GRID_STRIDE(p, items) {
    const int i = static_cast<int>(p % per_head);
    const int64_t nh = p / per_head;  // (position, head)
    const int64_t n = nh / n_head;
    const int64_t base = nh * hd;
    if (i >= half) {
      const int64_t d = base + rot + (i - half);
      if (backward) {
        out[d] += inp[d];
      } else {
        out[d] = inp[d];
      }
      continue;
    }
    const int t = static_cast<int>(n % T);
    const float c = cos[int64_t{t} * half + i], s = sin[int64_t{t} * half + i];
    const int64_t lo = base + int64_t{i} * step, hi = lo + gap;
    const float a = inp[lo], b = inp[hi];
    if (backward) {
      out[lo] += a * c + b * s;
      out[hi] += b * c - a * s;
    } else {
      out[lo] = a * c - b * s;
      out[hi] = b * c + a * s;
    }
  }
}

__global__ void GluForwardKernel(float* out, const float* gate, const float* up, int64_t n, Glu glu) {
  ZINF_GRID_STRIDE(i, n) {
    if (glu.kind == Glu::kClampedSwiglu) {
      const float g = fminf(gate[i], glu.limit), u = fminf(fmaxf(up[i], -glu.limit), glu.limit);
      out[i] = (u + 1.f) * (g / (1.f + expf(-glu.alpha * g)));
      continue;
    }
    const float g = gate[i];
    out[i] = (glu.kind == Glu::kGeluTanh ? GeluTanh(g) : g / (1.f + expf(-g))) * up[i];
  }
}

__global__ void GluBackwardKernel(float* dgate, float* dup, const float* gate, const float* up, const float* dout,
                                  int64_t n, Glu glu) {
  ZINF_GRID_STRIDE(i, n) {
    if (glu.kind == Glu::kClampedSwiglu) {
      const float g = fminf(gate[i], glu.limit), u = fminf(fmaxf(up[i], -glu.limit), glu.limit);
      const float sig = 1.f / (1.f + expf(-glu.alpha * g));
      const float dact = gate[i] <= glu.limit ? sig * (1.f + glu.alpha * g * (1.f - sig)) : 0.f;
      const float dclamp = up[i] >= -glu.limit && up[i] <= glu.limit ? 1.f : 0.f;
      dgate[i] += dout[i] * (u + 1.f) * dact;
      dup[i] += dout[i] * g * sig * dclamp;
      continue;
    }
    const float g = gate[i];
    if (glu.kind == Glu::kGeluTanh) {
      dgate[i] += dout[i] * up[i] * GeluTanhGrad(g);
      dup[i] += dout[i] * GeluTanh(g);
    } else {
      const float sig = 1.f / (1.f + expf(-g));
      dgate[i] += dout[i] * up[i] * (sig * (1.f + g * (1.f - sig)));
      dup[i] += dout[i] * g * sig;
    }
  }
}

__global__ void GqaExpandForwardKernel(float* qkv, const float* q, const float* k, const float* v, int64_t N, int NH,
                                       int NKV, int hd) {
  const int64_t C = int64_t{NH} * hd, Ckv = int64_t{NKV} * hd;
  const int group = NH / NKV;
  ZINF_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    const int64_t src = n * Ckv + (c / hd) / group * hd + c % hd;
    qkv[n * 3 * C + c] = q[i];
    qkv[n * 3 * C + C + c] = k[src];
    qkv[n * 3 * C + 2 * C + c] = v[src];
  }
}

// One thread per element of dk/dv, summing its group's heads in order.
__global__ void GqaExpandBackwardKernel(float* dq, float* dk, float* dv, const float* dqkv, int64_t N, int NH, int NKV,
                                        int hd) {
  const int64_t C = int64_t{NH} * hd, Ckv = int64_t{NKV} * hd;
  const int group = NH / NKV;
  ZINF_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    dq[i] += dqkv[n * 3 * C + c];
    if (c < Ckv) {
      const int64_t kvh = c / hd, j = c % hd;
      float sk = 0.f, sv = 0.f;
      for (int g = 0; g < group; ++g) {
        const int64_t col = (kvh * group + g) * hd + j;
        sk += dqkv[n * 3 * C + C + col];
        sv += dqkv[n * 3 * C + 2 * C + col];
      }
      dk[n * Ckv + c] += sk;
      dv[n * Ckv + c] += sv;
    }
  }
}

// A thread per destination element; summing heads into one (sum_heads:
// the launcher's dst_head 0 with H > 1) it adds them in order (no atomics:
// the CPU's bits).
__global__ void CopyHeadColumnsKernel(float* dst, int64_t dst_ld, int dst_head, const float* src, int64_t src_ld,
                                      int src_head, int64_t N, int H, int width, bool accumulate, bool sum_heads) {
  const int heads_out = sum_heads ? 1 : H;
  ZINF_GRID_STRIDE(i, N * heads_out * width) {
    const int64_t n = i / (int64_t{heads_out} * width);
    const int h = static_cast<int>(i / width % heads_out), c = static_cast<int>(i % width);
    float* d = dst + n * dst_ld + int64_t{h} * dst_head + c;
    if (sum_heads) {
      float sum = *d;
      for (int j = 0; j < H; ++j) sum += src[n * src_ld + int64_t{j} * src_head + c];
      *d = sum;
    } else {
      const float s = src[n * src_ld + int64_t{h} * src_head + c];
      *d = accumulate ? *d + s : s;
    }
  }
}

}  // namespace

Status RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int C, double eps,
                      void* stream) {
  RmsNormForwardKernel<<<GridFor(N, kWarpsPerBlock), kThreads, 0, AsStream(stream)>>>(out, rstd, inp, weight, N, C,
                                                                                      static_cast<float>(eps));
  return LaunchStatus("rmsnorm_forward");
}

Status RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                       const float* rstd, int64_t N, int C, void* stream) {
  cudaStream_t s = AsStream(stream);
  RmsNormBackwardInputKernel<<<GridFor(N, kWarpsPerBlock), kThreads, 0, s>>>(dinp, dout, inp, weight, rstd, N, C);
  ZINF_RETURN_IF_ERROR(LaunchStatus("rmsnorm_backward dinp"));
  // A block of 32 x 32 threads per 32 columns: a thread per column alone
  // walked all N rows (for Qwen3's per-head norms, N * heads of them).
  return LaunchColumnSums(dweight, nullptr, dout, inp, nullptr, rstd, N, C, s, "rmsnorm_backward dweight");
}

Status RopeForward(float* out, const float* inp, const float* cos, const float* sin, int B, int T_, int n_head, int hd,
                   int rot, bool interleaved, void* stream) {
  const int64_t items = int64_t{B} * T_ * n_head * (rot / 2 + hd - rot);
  RopeKernel<<<GridFor(items, kThreads), kThreads, 0, AsStream(stream)>>>(out, inp, cos, sin, T_, n_head, hd, rot,
                                                                          interleaved, items, false);
  return LaunchStatus("rope_forward");
}

Status RopeBackward(float* dinp, const float* dout, const float* cos, const float* sin, int B, int T_, int n_head,
                    int hd, int rot, bool interleaved, void* stream) {
  const int64_t items = int64_t{B} * T_ * n_head * (rot / 2 + hd - rot);
  RopeKernel<<<GridFor(items, kThreads), kThreads, 0, AsStream(stream)>>>(dinp, dout, cos, sin, T_, n_head, hd, rot,
                                                                          interleaved, items, true);
  return LaunchStatus("rope_backward");
}

Status GluForward(float* out, const float* gate, const float* up, int64_t n, Glu glu, void* stream) {
  GluForwardKernel<<<GridFor(n, kThreads), kThreads, 0, AsStream(stream)>>>(out, gate, up, n, glu);
  return LaunchStatus("glu_forward");
}

Status GluBackward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, int64_t n, Glu glu,
                   void* stream) {
  GluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, AsStream(stream)>>>(dgate, dup, gate, up, dout, n, glu);
  return LaunchStatus("glu_backward");
}

Status GqaExpandForward(float* qkv, const float* q, const float* k, const float* v, int64_t N, int NH, int NKV, int hd,
                        void* stream) {
  GqaExpandForwardKernel<<<GridFor(N * NH * hd, kThreads), kThreads, 0, AsStream(stream)>>>(qkv, q, k, v, N, NH, NKV,
                                                                                            hd);
  return LaunchStatus("gqa_expand_forward");
}

Status GqaExpandBackward(float* dq, float* dk, float* dv, const float* dqkv, int64_t N, int NH, int NKV, int hd,
                         void* stream) {
  GqaExpandBackwardKernel<<<GridFor(N * NH * hd, kThreads), kThreads, 0, AsStream(stream)>>>(dq, dk, dv, dqkv, N, NH,
                                                                                             NKV, hd);
  return LaunchStatus("gqa_expand_backward");
}

Status CopyHeadColumns(float* dst, int64_t dst_ld, int dst_head, const float* src, int64_t src_ld, int src_head,
                       int64_t N, int H, int width, bool accumulate, void* stream) {
  const bool sum_heads = dst_head == 0 && H > 1;
  if (sum_heads && !accumulate) {
    return Status::InvalidArgument("copy_head_columns: summing heads into one needs accumulate (cpu_kernels.h)");
  }
  const int64_t items = N * (sum_heads ? 1 : H) * width;
  CopyHeadColumnsKernel<<<GridFor(items, kThreads), kThreads, 0, AsStream(stream)>>>(
      dst, dst_ld, dst_head, src, src_ld, src_head, N, H, width, accumulate, sum_heads);
  return LaunchStatus("copy_head_columns");
}

}  // namespace zinf::kernels::cuda
