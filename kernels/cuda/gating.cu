#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/gating.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"

namespace vamp::kernels::cuda {
namespace {

using internal::AsFloat;
using internal::FromFloat;

// One block per row, threads striding over its columns (coalesced rows; Qwen3-Next's rows are
// 2048 to 4096 wide), as the other row-wise elementwise kernels.
constexpr int kGateThreads = 256;

// The CPU twin's sigmoid: expf is IEEE-accurate to 2 ulp without fast math, the division exact
// (correctly rounded).
__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// T is the storage type of x and gate (float or __nv_bfloat16); arithmetic is float32.
template <typename T>
__global__ void SigmoidGateKernel(T* x, int64_t x_stride, const T* gate, int64_t gate_stride,
                                  int64_t cols) {
  const int64_t r = blockIdx.x;
  T* xr = x + r * x_stride;
  const T* gr = gate + r * gate_stride;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    xr[c] = FromFloat<T>(AsFloat(xr[c]) * Sigmoid(AsFloat(gr[c])));
  }
}

// T is the storage type of out and y; the gate logit and all arithmetic are float32.
// __fmul_rn / __fadd_rn keep nvcc from fusing the product into the sum: the CPU twin rounds both.
template <typename T>
__global__ void AddSigmoidScaledKernel(T* out, int64_t out_stride, const T* y, int64_t y_stride,
                                       const float* gate, int64_t gate_stride, int64_t cols) {
  const int64_t r = blockIdx.x;
  T* o = out + r * out_stride;
  const T* yr = y + r * y_stride;
  const float s = Sigmoid(gate[r * gate_stride]);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    o[c] = FromFloat<T>(__fadd_rn(AsFloat(o[c]), __fmul_rn(s, AsFloat(yr[c]))));
  }
}

absl::Status CheckSizes(const char* op, int64_t num_rows, int64_t cols) {
  if (num_rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": num_rows ", num_rows, " and cols ", cols, " must be non-negative"));
  }
  if (num_rows > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": num_rows ", num_rows, " exceeds the grid"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchSigmoidGate(T* x, int64_t x_stride, const T* gate, int64_t gate_stride,
                               int64_t num_rows, int64_t cols, cudaStream_t stream,
                               const char* name) {
  if (absl::Status s = CheckSizes("SigmoidGate", num_rows, cols); !s.ok()) return s;
  if (num_rows == 0 || cols == 0) return absl::OkStatus();
  SigmoidGateKernel<T><<<num_rows, kGateThreads, 0, stream>>>(x, x_stride, gate, gate_stride, cols);
  return internal::LaunchStatus(name);
}

template <typename T>
absl::Status LaunchAddSigmoidScaled(T* out, int64_t out_stride, const T* y, int64_t y_stride,
                                    const float* gate, int64_t gate_stride, int64_t num_rows,
                                    int64_t cols, cudaStream_t stream, const char* name) {
  if (absl::Status s = CheckSizes("AddSigmoidScaled", num_rows, cols); !s.ok()) return s;
  if (num_rows == 0 || cols == 0) return absl::OkStatus();
  AddSigmoidScaledKernel<T><<<num_rows, kGateThreads, 0, stream>>>(out, out_stride, y, y_stride,
                                                                   gate, gate_stride, cols);
  return internal::LaunchStatus(name);
}

}  // namespace

absl::Status SigmoidGate(float* x, int64_t x_stride, const float* gate, int64_t gate_stride,
                         int64_t num_rows, int64_t cols, cudaStream_t stream) {
  return LaunchSigmoidGate(x, x_stride, gate, gate_stride, num_rows, cols, stream,
                           "SigmoidGateKernel");
}

absl::Status AddSigmoidScaled(float* out, int64_t out_stride, const float* y, int64_t y_stride,
                              const float* gate, int64_t gate_stride, int64_t num_rows,
                              int64_t cols, cudaStream_t stream) {
  return LaunchAddSigmoidScaled(out, out_stride, y, y_stride, gate, gate_stride, num_rows, cols,
                                stream, "AddSigmoidScaledKernel");
}

absl::Status SigmoidGate(BFloat16* x, int64_t x_stride, const BFloat16* gate, int64_t gate_stride,
                         int64_t num_rows, int64_t cols, cudaStream_t stream) {
  return LaunchSigmoidGate(internal::AsDevice(x), x_stride, internal::AsDevice(gate), gate_stride,
                           num_rows, cols, stream, "SigmoidGateKernel<bf16>");
}

absl::Status AddSigmoidScaled(BFloat16* out, int64_t out_stride, const BFloat16* y,
                              int64_t y_stride, const float* gate, int64_t gate_stride,
                              int64_t num_rows, int64_t cols, cudaStream_t stream) {
  return LaunchAddSigmoidScaled(internal::AsDevice(out), out_stride, internal::AsDevice(y),
                                y_stride, gate, gate_stride, num_rows, cols, stream,
                                "AddSigmoidScaledKernel<bf16>");
}

}  // namespace vamp::kernels::cuda
