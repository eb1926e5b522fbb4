#include "kernels/cuda/gemm.h"

#include <cublas_v2.h>

#include <climits>
#include <map>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"

namespace vamp::kernels::cuda {
namespace {

absl::Status BlasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasGetStatusName(status), " (",
                                          cublasGetStatusString(status), ")"));
}

// This thread's cuBLAS handles, one per device. Thread-local storage is destroyed at thread exit,
// which for the main thread comes before the CUDA runtime's own teardown.
class ThreadHandles {
 public:
  ~ThreadHandles() {
    for (auto& [device, handle] : handles_) cublasDestroy(handle);
  }

  absl::StatusOr<cublasHandle_t> Get() {
    int device = 0;
    if (absl::Status s = internal::CudaStatus(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) {
      return s;
    }
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    cublasHandle_t handle = nullptr;
    if (absl::Status s = BlasStatus(cublasCreate(&handle), "cublasCreate"); !s.ok()) return s;
    // Pedantic: plain float32 FMA arithmetic, never TF32, so the CPU twin stays the reference.
    if (absl::Status s =
            BlasStatus(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
        !s.ok()) {
      cublasDestroy(handle);
      return s;
    }
    handles_.emplace(device, handle);
    return handle;
  }

 private:
  std::map<int, cublasHandle_t> handles_;  // thread-local: no lock needed
};

absl::StatusOr<cublasHandle_t> HandleFor(cudaStream_t stream) {
  thread_local ThreadHandles handles;
  absl::StatusOr<cublasHandle_t> handle = handles.Get();
  if (!handle.ok()) return handle.status();
  if (absl::Status s = BlasStatus(cublasSetStream(*handle, stream), "cublasSetStream"); !s.ok()) {
    return s;
  }
  return handle;
}

bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

absl::Status CheckShape(const char* name, int64_t lda, int64_t ldw, int64_t ldc, int64_t m,
                        int64_t n, int64_t k) {
  if (!FitsInt(m) || !FitsInt(n) || !FitsInt(k) || !FitsInt(lda) || !FitsInt(ldw) ||
      !FitsInt(ldc)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": sizes or strides outside cuBLAS's int range (m ", m, ", n ", n,
                     ", k ", k, ", lda ", lda, ", ldw ", ldw, ", ldc ", ldc, ")"));
  }
  if (lda < k || ldw < k || ldc < n) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": strides shorter than rows (lda ", lda,
                                                   ", ldw ", ldw, " vs k ", k, "; ldc ", ldc,
                                                   " vs n ", n, ")"));
  }
  return absl::OkStatus();
}

// Row-major c[m, n] = a[m, k] x w[n, k]^T is, in cuBLAS's column-major view, the n x m matrix
// c^T = w^T(op T of the column-major k x n "w") x a^T (column-major k x m "a").
absl::Status SgemmRowMajor(cublasHandle_t handle, const float* a, int64_t lda, const float* w,
                           int64_t ldw, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k) {
  const float alpha = 1.0f;
  const float beta = 0.0f;
  return BlasStatus(
      cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                  static_cast<int>(k), &alpha, w, static_cast<int>(ldw), a, static_cast<int>(lda),
                  &beta, c, static_cast<int>(ldc)),
      "cublasSgemm");
}

}  // namespace

absl::Status Gemm(const float* a, int64_t lda, const float* w, int64_t ldw, float* c, int64_t ldc,
                  int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (absl::Status s = CheckShape("Gemm", lda, ldw, ldc, m, n, k); !s.ok()) return s;
  if (m == 0 || n == 0) return absl::OkStatus();
  absl::StatusOr<cublasHandle_t> handle = HandleFor(stream);
  if (!handle.ok()) return handle.status();
  return SgemmRowMajor(*handle, a, lda, w, ldw, c, ldc, m, n, k);
}

absl::Status ExpertGemm(const float* a, int64_t lda, const float* const* expert_weights,
                        int64_t weight_offset, int64_t ldw, const int32_t* expert_offsets,
                        int64_t num_experts, float* c, int64_t ldc, int64_t n, int64_t k,
                        cudaStream_t stream) {
  if (absl::Status s = CheckShape("ExpertGemm", lda, ldw, ldc, expert_offsets[num_experts], n, k);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<cublasHandle_t> handle = HandleFor(stream);
  if (!handle.ok()) return handle.status();
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t begin = expert_offsets[e];
    const int64_t rows = expert_offsets[e + 1] - begin;
    if (rows <= 0) continue;
    if (expert_weights[e] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("ExpertGemm: expert ", e, " has ", rows, " rows but no weights"));
    }
    if (absl::Status s =
            SgemmRowMajor(*handle, a + begin * lda, lda, expert_weights[e] + weight_offset, ldw,
                          c + begin * ldc, ldc, rows, n, k);
        !s.ok()) {
      return absl::InternalError(absl::StrCat("ExpertGemm expert ", e, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace vamp::kernels::cuda
