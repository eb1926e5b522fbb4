#include "kernels/cuda/gemm.h"

#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <vector>

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

// cuBLAS gained cublasGemmGroupedBatchedEx in 12.5.
#if CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 5)
#define VAMP_HAVE_CUBLAS_GROUPED_GEMM 1
#endif

// Math modes per precision (gemm.h): float32 is pedantic (plain float32 FMA arithmetic, never
// TF32), so the CPU twin stays the reference; bfloat16 may use the tensor cores but must reduce
// partial sums in float32.
constexpr cublasMath_t kFloatMath = CUBLAS_PEDANTIC_MATH;
constexpr cublasMath_t kBf16Math = static_cast<cublasMath_t>(
    CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);

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
    handles_.emplace(device, handle);
    return handle;
  }

 private:
  std::map<int, cublasHandle_t> handles_;  // thread-local: no lock needed
};

// This thread's handle for the current device, bound to `stream`, in math mode `math`.
absl::StatusOr<cublasHandle_t> HandleFor(cudaStream_t stream, cublasMath_t math) {
  thread_local ThreadHandles handles;
  absl::StatusOr<cublasHandle_t> handle = handles.Get();
  if (!handle.ok()) return handle.status();
  if (absl::Status s = BlasStatus(cublasSetStream(*handle, stream), "cublasSetStream"); !s.ok()) {
    return s;
  }
  if (absl::Status s = BlasStatus(cublasSetMathMode(*handle, math), "cublasSetMathMode"); !s.ok()) {
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

// The bf16 twin of SgemmRowMajor (same transposition): bf16 inputs, float32 compute, output of
// `c_type` (CUDA_R_16BF or CUDA_R_32F).
absl::Status GemmExRowMajor(cublasHandle_t handle, const BFloat16* a, int64_t lda,
                            const BFloat16* w, int64_t ldw, void* c, cudaDataType_t c_type,
                            int64_t ldc, int64_t m, int64_t n, int64_t k) {
  const float alpha = 1.0f;
  const float beta = 0.0f;
  return BlasStatus(
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                   static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(ldw), a,
                   CUDA_R_16BF, static_cast<int>(lda), &beta, c, c_type, static_cast<int>(ldc),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

absl::Status GemmBf16(const BFloat16* a, int64_t lda, const BFloat16* w, int64_t ldw, void* c,
                      cudaDataType_t c_type, int64_t ldc, int64_t m, int64_t n, int64_t k,
                      cudaStream_t stream) {
  if (absl::Status s = CheckShape("Gemm", lda, ldw, ldc, m, n, k); !s.ok()) return s;
  if (m == 0 || n == 0) return absl::OkStatus();
  absl::StatusOr<cublasHandle_t> handle = HandleFor(stream, kBf16Math);
  if (!handle.ok()) return handle.status();
  return GemmExRowMajor(*handle, a, lda, w, ldw, c, c_type, ldc, m, n, k);
}

#ifdef VAMP_HAVE_CUBLAS_GROUPED_GEMM

// Calls of ExpertGemmGrouped between two uses of one slot (gemm.h): a refill waits for the grouped
// GEMM this many calls back.
constexpr int kGroupedPointerSlots = 4;
// Smallest pointer array allocated (3 per expert: 256 experts' worth), so growth is rare.
constexpr int64_t kMinGroupedPointers = 3 * 256;

// This thread's rings of pointer-array slots, one ring per device (see ExpertGemmGrouped in
// gemm.h). Thread-local: no lock needed.
class GroupedPointerRings {
 public:
  struct Slot {
    void** host = nullptr;       // pinned, filled by the host
    void** device = nullptr;     // read by cuBLAS
    int64_t capacity = 0;        // pointers in each
    cudaEvent_t done = nullptr;  // recorded after the grouped GEMM that last read `device`
  };

  ~GroupedPointerRings() {
    for (auto& [device, ring] : rings_) {
      cudaSetDevice(device);
      for (Slot& slot : ring.slots) {
        if (slot.done != nullptr) {
          cudaEventSynchronize(slot.done);
          cudaEventDestroy(slot.done);
        }
        if (slot.host != nullptr) cudaFreeHost(slot.host);
        if (slot.device != nullptr) cudaFree(slot.device);
      }
    }
  }

  // The next slot of the current device's ring, holding at least `count` pointers, once the grouped
  // GEMM that last read it has finished.
  absl::StatusOr<Slot*> Next(int64_t count) {
    int device = 0;
    if (absl::Status s = internal::CudaStatus(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) {
      return s;
    }
    Ring& ring = rings_[device];
    Slot& slot = ring.slots[ring.next];
    ring.next = (ring.next + 1) % kGroupedPointerSlots;
    if (slot.done == nullptr) {
      if (absl::Status s = internal::CudaStatus(
              cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming), "cudaEventCreate");
          !s.ok()) {
        slot.done = nullptr;
        return s;
      }
    }
    // A never-recorded event counts as complete.
    if (absl::Status s = internal::CudaStatus(cudaEventSynchronize(slot.done),
                                              "cudaEventSynchronize (grouped GEMM pointers)");
        !s.ok()) {
      return s;
    }
    if (slot.capacity < count) {
      if (slot.host != nullptr) cudaFreeHost(slot.host);
      if (slot.device != nullptr) cudaFree(slot.device);
      slot.host = nullptr;
      slot.device = nullptr;
      const int64_t capacity = std::max({count, 2 * slot.capacity, kMinGroupedPointers});
      slot.capacity = 0;
      const size_t bytes = capacity * sizeof(void*);
      if (absl::Status s = internal::CudaStatus(
              cudaMallocHost(reinterpret_cast<void**>(&slot.host), bytes), "cudaMallocHost");
          !s.ok()) {
        slot.host = nullptr;
        return s;
      }
      if (absl::Status s = internal::CudaStatus(
              cudaMalloc(reinterpret_cast<void**>(&slot.device), bytes), "cudaMalloc");
          !s.ok()) {
        slot.device = nullptr;
        return s;
      }
      slot.capacity = capacity;
    }
    return &slot;
  }

 private:
  struct Ring {
    std::array<Slot, kGroupedPointerSlots> slots;
    int next = 0;
  };
  std::map<int, Ring> rings_;
};

#endif  // VAMP_HAVE_CUBLAS_GROUPED_GEMM

// The row-major GEMM of one element type: float32 (cublasSgemm) or bf16 in and out.
absl::Status RowMajorGemm(cublasHandle_t handle, const float* a, int64_t lda, const float* w,
                          int64_t ldw, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k) {
  return SgemmRowMajor(handle, a, lda, w, ldw, c, ldc, m, n, k);
}
absl::Status RowMajorGemm(cublasHandle_t handle, const BFloat16* a, int64_t lda, const BFloat16* w,
                          int64_t ldw, BFloat16* c, int64_t ldc, int64_t m, int64_t n, int64_t k) {
  return GemmExRowMajor(handle, a, lda, w, ldw, c, CUDA_R_16BF, ldc, m, n, k);
}

// ExpertGemm for either element type: one cuBLAS GEMM per expert with rows, in `math` mode.
template <typename T>
absl::Status ExpertGemmT(const T* a, int64_t lda, const T* const* expert_weights,
                         int64_t weight_offset, int64_t ldw, const int32_t* expert_offsets,
                         int64_t num_experts, T* c, int64_t ldc, int64_t n, int64_t k,
                         cublasMath_t math, cudaStream_t stream) {
  if (absl::Status s = CheckShape("ExpertGemm", lda, ldw, ldc, expert_offsets[num_experts], n, k);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<cublasHandle_t> handle = HandleFor(stream, math);
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
            RowMajorGemm(*handle, a + begin * lda, lda, expert_weights[e] + weight_offset, ldw,
                         c + begin * ldc, ldc, rows, n, k);
        !s.ok()) {
      return absl::InternalError(absl::StrCat("ExpertGemm expert ", e, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Gemm(const float* a, int64_t lda, const float* w, int64_t ldw, float* c, int64_t ldc,
                  int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (absl::Status s = CheckShape("Gemm", lda, ldw, ldc, m, n, k); !s.ok()) return s;
  if (m == 0 || n == 0) return absl::OkStatus();
  absl::StatusOr<cublasHandle_t> handle = HandleFor(stream, kFloatMath);
  if (!handle.ok()) return handle.status();
  return SgemmRowMajor(*handle, a, lda, w, ldw, c, ldc, m, n, k);
}

absl::Status ExpertGemm(const float* a, int64_t lda, const float* const* expert_weights,
                        int64_t weight_offset, int64_t ldw, const int32_t* expert_offsets,
                        int64_t num_experts, float* c, int64_t ldc, int64_t n, int64_t k,
                        cudaStream_t stream) {
  return ExpertGemmT(a, lda, expert_weights, weight_offset, ldw, expert_offsets, num_experts, c,
                     ldc, n, k, kFloatMath, stream);
}

absl::Status Gemm(const BFloat16* a, int64_t lda, const BFloat16* w, int64_t ldw, BFloat16* c,
                  int64_t ldc, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  return GemmBf16(a, lda, w, ldw, c, CUDA_R_16BF, ldc, m, n, k, stream);
}

absl::Status Gemm(const BFloat16* a, int64_t lda, const BFloat16* w, int64_t ldw, float* c,
                  int64_t ldc, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  return GemmBf16(a, lda, w, ldw, c, CUDA_R_32F, ldc, m, n, k, stream);
}

absl::Status ExpertGemm(const BFloat16* a, int64_t lda, const BFloat16* const* expert_weights,
                        int64_t weight_offset, int64_t ldw, const int32_t* expert_offsets,
                        int64_t num_experts, BFloat16* c, int64_t ldc, int64_t n, int64_t k,
                        cudaStream_t stream) {
  return ExpertGemmT(a, lda, expert_weights, weight_offset, ldw, expert_offsets, num_experts, c,
                     ldc, n, k, kBf16Math, stream);
}

absl::Status ExpertGemmGrouped(const BFloat16* a, int64_t lda,
                               const BFloat16* const* expert_weights, int64_t weight_offset,
                               int64_t ldw, const int32_t* expert_offsets, int64_t num_experts,
                               BFloat16* c, int64_t ldc, int64_t n, int64_t k,
                               cudaStream_t stream) {
#ifndef VAMP_HAVE_CUBLAS_GROUPED_GEMM
  return absl::UnimplementedError(
      "ExpertGemmGrouped: cublasGemmGroupedBatchedEx needs cuBLAS 12.5 or later");
#else
  if (absl::Status s =
          CheckShape("ExpertGemmGrouped", lda, ldw, ldc, expert_offsets[num_experts], n, k);
      !s.ok()) {
    return s;
  }
  // The experts with rows, by row count (stable: expert order within a count), so that equal
  // counts are adjacent and form one group.
  std::vector<int64_t> experts;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t rows = expert_offsets[e + 1] - expert_offsets[e];
    if (rows <= 0) continue;
    if (expert_weights[e] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("ExpertGemmGrouped: expert ", e, " has ", rows, " rows but no weights"));
    }
    experts.push_back(e);
  }
  if (experts.empty()) return absl::OkStatus();
  auto rows_of = [&](int64_t e) -> int64_t { return expert_offsets[e + 1] - expert_offsets[e]; };
  std::stable_sort(experts.begin(), experts.end(),
                   [&](int64_t x, int64_t y) { return rows_of(x) < rows_of(y); });

  // One group per distinct row count. In cuBLAS's column-major view each problem is
  // SgemmRowMajor's transposition: c^T [n, rows] = (w [n, k] as column-major k x n)^T x a^T.
  std::vector<int> m_array, n_array, group_size;
  for (size_t i = 0; i < experts.size(); ++i) {
    const int64_t rows = rows_of(experts[i]);
    if (i > 0 && rows == rows_of(experts[i - 1])) {
      ++group_size.back();
      continue;
    }
    m_array.push_back(static_cast<int>(n));
    n_array.push_back(static_cast<int>(rows));
    group_size.push_back(1);
  }
  const size_t groups = group_size.size();
  const std::vector<cublasOperation_t> trans_a(groups, CUBLAS_OP_T);
  const std::vector<cublasOperation_t> trans_b(groups, CUBLAS_OP_N);
  const std::vector<int> k_array(groups, static_cast<int>(k));
  const std::vector<int> lda_array(groups, static_cast<int>(ldw));
  const std::vector<int> ldb_array(groups, static_cast<int>(lda));
  const std::vector<int> ldc_array(groups, static_cast<int>(ldc));
  const std::vector<float> alpha(groups, 1.0f);
  const std::vector<float> beta(groups, 0.0f);

  absl::StatusOr<cublasHandle_t> handle = HandleFor(stream, kBf16Math);
  if (!handle.ok()) return handle.status();
  thread_local GroupedPointerRings rings;
  const int64_t problems = static_cast<int64_t>(experts.size());
  absl::StatusOr<GroupedPointerRings::Slot*> slot = rings.Next(3 * problems);
  if (!slot.ok()) return slot.status();
  // Problem order is group order: [A pointers | B pointers | C pointers], `problems` each.
  void** host = (*slot)->host;
  for (int64_t i = 0; i < problems; ++i) {
    const int64_t e = experts[i];
    const int64_t begin = expert_offsets[e];
    host[i] = const_cast<BFloat16*>(expert_weights[e] + weight_offset);
    host[problems + i] = const_cast<BFloat16*>(a + begin * lda);
    host[2 * problems + i] = c + begin * ldc;
  }
  void** device = (*slot)->device;
  if (absl::Status s =
          internal::CudaStatus(cudaMemcpyAsync(device, host, 3 * problems * sizeof(void*),
                                               cudaMemcpyHostToDevice, stream),
                               "cudaMemcpyAsync (grouped GEMM pointers)");
      !s.ok()) {
    return s;
  }
  const absl::Status gemm = BlasStatus(
      cublasGemmGroupedBatchedEx(*handle, trans_a.data(), trans_b.data(), m_array.data(),
                                 n_array.data(), k_array.data(), alpha.data(), device, CUDA_R_16BF,
                                 lda_array.data(), device + problems, CUDA_R_16BF, ldb_array.data(),
                                 beta.data(), device + 2 * problems, CUDA_R_16BF, ldc_array.data(),
                                 static_cast<int>(groups), group_size.data(), CUBLAS_COMPUTE_32F),
      "cublasGemmGroupedBatchedEx");
  // Recorded whatever the GEMM's status: the copy into the slot is in flight either way.
  const absl::Status record =
      internal::CudaStatus(cudaEventRecord((*slot)->done, stream), "cudaEventRecord");
  if (!gemm.ok()) return gemm;
  return record;
#endif  // VAMP_HAVE_CUBLAS_GROUPED_GEMM
}

}  // namespace vamp::kernels::cuda
