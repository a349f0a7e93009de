// 16-bit matmuls on tensor cores (contract in cuda_kernels.h).
//
// Design. A linear layer's three GEMMs (forward, dinp, dweight) go to
// cuBLASLt with A and B in the 16-bit type, C and D in fp32 and fp32
// compute; the fp32 operand is rounded into scratch by one elementwise
// kernel first. Row-major matrices are handed to cuBLASLt as the
// column-major transposes they are (RowMajorGemm16 below), as cuda_kernels.cu
// does for cuBLAS. cuBLASLt's heuristic is asked once per shape, transpose
// and alignment of the pointers (it must not pick a kernel assuming more
// alignment than the tensors have: a layer's tensors sit in the engine's
// flat block at 2-byte granularity); its answer and the GEMM's descriptors
// are cached in the CudaLt, so a later call only launches.
// Results are deterministic run to run: the algorithm is fixed per shape and
// alignment (buffers allocated in the same order get the same), and no
// split-K reduction with atomics is asked for.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_kernels.h"

namespace zinf::kernels::cuda {

namespace {

Status LtError(cublasStatus_t st, const std::string& what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Internal("cublasLt " + what + ": " + cublasLtGetStatusName(st) + ": " + cublasLtGetStatusString(st));
}

__device__ __forceinline__ void Round16(__nv_bfloat16* out, float x) { *out = __float2bfloat16_rn(x); }
__device__ __forceinline__ void Round16(__half* out, float x) { *out = __float2half_rn(x); }

template <typename T16>
__global__ void CastTo16Kernel(T16* out, const float* src, int64_t n) {
  ZINF_GRID_STRIDE(i, n) Round16(out + i, src[i]);
}

// One GEMM's cuBLASLt descriptors (RAII) and the algorithm the heuristic
// picked for them: made at a shape's first call, reused after.
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo = {};
  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
};

}  // namespace

struct CudaLt::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  // (trans_a, trans_b, M, N, K, type, lda, ldb, ldc, alignment of A, B, C)
  // -> its descriptors and algorithm.
  std::map<std::array<int64_t, 12>, std::unique_ptr<GemmPlan>> plans;
  ~Impl() {
    plans.clear();  // descriptors before the handle
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

namespace {

Status Check16(ElementType type, const char* what) {
  if (type == ElementType::kBf16 || type == ElementType::kF16) return Status::Ok();
  return Status::InvalidArgument(std::string("cuda ") + what + ": the 16-bit type must be bf16 or f16");
}

Status CheckInt(int64_t v, const char* what) {
  if (v >= 0 && v <= INT_MAX) return Status::Ok();
  return Status::InvalidArgument(std::string("cuda 16-bit matmul: ") + what + " = " + std::to_string(v) +
                                 " does not fit cuBLASLt's int");
}

// The largest power of two (at most 256) dividing the address: what
// cuBLASLt may assume of the pointer.
int64_t AlignmentOf(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int64_t align = 256;
  while (align > 1 && a % static_cast<uintptr_t>(align) != 0) align /= 2;
  return align;
}

// Row-major C [M, N] (fp32, leading dim ldc) = op(A) [M, K] op(B) [K, N] +
// beta * C, A and B 16-bit of `type` with row lengths lda and ldb as stored.
// Column-major, that is C^T = op(B)^T op(A)^T: cuBLASLt's first operand is
// B, its second A, with the same transpose flags.
Status RowMajorGemm16(CudaLt& lt, bool trans_a, bool trans_b, int M, int N, int K, const void* A, int lda,
                      const void* B, int ldb, float beta, float* C, int ldc, ElementType type, const char* name) {
  CudaLt::Impl& impl = lt.impl();
  const std::array<int64_t, 12> key = {
      trans_a,        trans_b,       M, N, K, static_cast<int64_t>(type), lda, ldb, ldc, AlignmentOf(A),
      AlignmentOf(B), AlignmentOf(C)};
  std::unique_ptr<GemmPlan>& plan = impl.plans[key];
  if (plan == nullptr) {
    auto made = std::make_unique<GemmPlan>();
    GemmPlan& g = *made;
    const cudaDataType_t t16 = type == ElementType::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    ZINF_RETURN_IF_ERROR(LtError(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), name));
    ZINF_RETURN_IF_ERROR(
        LtError(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)), name));
    ZINF_RETURN_IF_ERROR(
        LtError(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)), name));
    // Stored row-major [rows, cols] with row length ld is column-major
    // [cols, rows] with leading dimension ld.
    const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    ZINF_RETURN_IF_ERROR(LtError(cublasLtMatrixLayoutCreate(&g.a, t16, b_cols, b_rows, ldb), name));
    ZINF_RETURN_IF_ERROR(LtError(cublasLtMatrixLayoutCreate(&g.b, t16, a_cols, a_rows, lda), name));
    ZINF_RETURN_IF_ERROR(LtError(cublasLtMatrixLayoutCreate(&g.c, CUDA_R_32F, N, M, ldc), name));

    Preference pref;
    ZINF_RETURN_IF_ERROR(LtError(cublasLtMatmulPreferenceCreate(&pref.p), name));
    const uint64_t workspace = kLtWorkspaceBytes;
    ZINF_RETURN_IF_ERROR(LtError(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                      &workspace, sizeof(workspace)),
                                 name));
    // cuBLASLt's first operand is B, its second A.
    const uint32_t align_a = static_cast<uint32_t>(key[10]), align_b = static_cast<uint32_t>(key[9]),
                   align_c = static_cast<uint32_t>(key[11]);
    for (auto [attr, value] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
                               std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}}) {
      ZINF_RETURN_IF_ERROR(LtError(cublasLtMatmulPreferenceSetAttribute(pref.p, attr, &value, sizeof(value)), name));
    }
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    ZINF_RETURN_IF_ERROR(LtError(
        cublasLtMatmulAlgoGetHeuristic(impl.handle, g.op, g.a, g.b, g.c, g.c, pref.p, 1, &result, &found), name));
    if (found == 0) {
      return Status::Internal(std::string("cublasLt ") + name + ": no algorithm for " + std::to_string(M) + " x " +
                              std::to_string(N) + " x " + std::to_string(K));
    }
    g.algo = result.algo;
    plan = std::move(made);
  }
  const GemmPlan& g = *plan;
  const float alpha = 1.0f;
  return LtError(cublasLtMatmul(impl.handle, g.op, &alpha, B, g.a, A, g.b, &beta, C, g.c, C, g.c, &g.algo,
                                impl.workspace, kLtWorkspaceBytes, AsStream(lt.stream())),
                 name);
}

}  // namespace

CudaLt::CudaLt(std::unique_ptr<Impl> impl, void* stream) : impl_(std::move(impl)), stream_(stream) {}
CudaLt::~CudaLt() = default;

StatusOr<std::unique_ptr<CudaLt>> CudaLt::Create(void* stream, void* workspace) {
  if (workspace == nullptr) return Status::InvalidArgument("CudaLt: needs a device workspace");
  auto impl = std::make_unique<Impl>();
  ZINF_RETURN_IF_ERROR(LtError(cublasLtCreate(&impl->handle), "create"));
  impl->workspace = workspace;
  return std::unique_ptr<CudaLt>(new CudaLt(std::move(impl), stream));
}

Status CastTo16(void* out, const float* src, ElementType type, int64_t n, void* stream) {
  ZINF_RETURN_IF_ERROR(Check16(type, "cast_to_16"));
  if (n <= 0) return Status::Ok();
  const unsigned grid = GridFor(n, kThreads);
  if (type == ElementType::kBf16) {
    CastTo16Kernel<<<grid, kThreads, 0, AsStream(stream)>>>(static_cast<__nv_bfloat16*>(out), src, n);
  } else {
    CastTo16Kernel<<<grid, kThreads, 0, AsStream(stream)>>>(static_cast<__half*>(out), src, n);
  }
  return LaunchStatus("cast_to_16");
}

Status MatmulForward16(CudaLt& lt, float* out, const float* inp, const void* weight, ElementType type,
                       const float* bias, int64_t N, int C, int OC, void* scratch) {
  ZINF_RETURN_IF_ERROR(Check16(type, "matmul_forward16"));
  ZINF_RETURN_IF_ERROR(CheckInt(N, "N"));
  if (N == 0 || OC <= 0) return Status::Ok();
  if (C <= 0) {  // an empty sum, as MatmulForward: the bias alone
    ZINF_RETURN_IF_ERROR(
        CudaError(cudaMemsetAsync(out, 0, static_cast<size_t>(N * OC) * sizeof(float), AsStream(lt.stream())),
                  "matmul_forward16 zero"));
    return AddBias(out, bias, N, OC, lt.stream());
  }
  void* inp16 = scratch;
  ZINF_RETURN_IF_ERROR(CastTo16(inp16, inp, type, N * C, lt.stream()));
  // out [N, OC] = inp16 [N, C] @ weight^T, weight stored [OC, C].
  ZINF_RETURN_IF_ERROR(RowMajorGemm16(lt, false, true, static_cast<int>(N), OC, C, inp16, C, weight, C, 0.0f, out, OC,
                                      type, "matmul_forward16"));
  return AddBias(out, bias, N, OC, lt.stream());
}

Status MatmulBackward16(CudaLt& lt, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const void* weight, ElementType type, int64_t N, int C, int OC, void* scratch) {
  ZINF_RETURN_IF_ERROR(Check16(type, "matmul_backward16"));
  ZINF_RETURN_IF_ERROR(CheckInt(N, "N"));
  if (N == 0 || OC <= 0 || C <= 0) return Status::Ok();
  const int n = static_cast<int>(N);
  void* inp16 = scratch;
  void* dout16 = static_cast<char*>(scratch) + Matmul16ScratchBytes(N, C, 0);  // after inp16's part
  ZINF_RETURN_IF_ERROR(CastTo16(dout16, dout, type, N * OC, lt.stream()));
  ZINF_RETURN_IF_ERROR(CastTo16(inp16, inp, type, N * C, lt.stream()));
  // dinp [N, C] += dout16 [N, OC] @ weight [OC, C].
  if (dinp != nullptr) {
    ZINF_RETURN_IF_ERROR(RowMajorGemm16(lt, false, false, n, C, OC, dout16, OC, weight, C, 1.0f, dinp, C, type,
                                        "matmul_backward16 dinp"));
  }
  // dweight [OC, C] += dout16^T [OC, N] @ inp16 [N, C].
  if (dweight != nullptr) {
    ZINF_RETURN_IF_ERROR(RowMajorGemm16(lt, true, false, OC, C, n, dout16, OC, inp16, C, 1.0f, dweight, C, type,
                                        "matmul_backward16 dweight"));
  }
  return AddBiasGradient(dbias, dout, N, OC, lt.stream());
}

}  // namespace zinf::kernels::cuda
