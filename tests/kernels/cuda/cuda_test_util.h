// Shared fixture and helpers of the CUDA kernel tests: every test compares a CUDA kernel with its
// CPU twin (kernels/cpu/) on the same random inputs, and skips when no CUDA device is present.
#ifndef VAMP_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define VAMP_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cuda {

#define VAMP_ASSERT_OK(expr)                       \
  do {                                             \
    const absl::Status _st = (expr);               \
    ASSERT_TRUE(_st.ok()) << #expr << ": " << _st; \
  } while (0)

#define VAMP_ASSERT_CUDA(expr)                                                     \
  do {                                                                             \
    const cudaError_t _err = (expr);                                               \
    ASSERT_EQ(_err, cudaSuccess) << #expr << ": " << cudaGetErrorName(_err) << " " \
                                 << cudaGetErrorString(_err);                      \
  } while (0)

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Counts elements with |got - want| > tol * max(1, |want|) (NaN counts) and reports the first.
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::abs(g - w) <= tol * std::max(1.0, std::abs(w)) || (g == w);
    if (!ok && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ; first at "
                     << first << ": got " << got[first] << ", want " << want[first];
}

// bfloat16 results: one bf16 ulp (2^-7) relative to the value.
inline constexpr double kBf16Tol = 1.0 / 128;

inline std::vector<BFloat16> RandomBf16(size_t n, uint32_t seed, float scale = 1.0f) {
  const std::vector<float> f = RandomFloats(n, seed, scale);
  std::vector<BFloat16> out(n);
  ToBFloat16(absl::MakeConstSpan(f), out.data());
  return out;
}

inline std::vector<float> Widen(const std::vector<BFloat16>& v) {
  std::vector<float> out(v.size());
  ToFloat(absl::MakeConstSpan(v), out.data());
  return out;
}

inline void ExpectBf16Close(const std::vector<BFloat16>& got, const std::vector<BFloat16>& want,
                            const std::string& what) {
  ExpectClose(Widen(got), Widen(want), kBf16Tol, what);
}

// Fixture: a stream and device allocations freed at the end of the test. SetUp skips the test
// when the CUDA runtime finds no device (no driver, or no GPU).
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device (" << cudaGetErrorName(err) << ", count " << count << ")";
    }
    VAMP_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << "a kernel failed asynchronously";
      EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    }
    for (void* p : allocations_) EXPECT_EQ(cudaFree(p), cudaSuccess);
  }

  // A device copy of `host` (owned by the fixture), complete when this returns, so temporaries
  // may be passed. On failure the test fails and null returns.
  template <typename T>
  T* Upload(const std::vector<T>& host) {
    T* dev = Alloc<T>(host.size());
    if (dev != nullptr) CopyToDevice(dev, host.data(), host.size());
    return dev;
  }

  // Copies on the test's stream and waits: a plain cudaMemcpy from pageable memory may return
  // before its DMA lands, and the legacy default stream does not order the non-blocking stream.
  template <typename T>
  void CopyToDevice(T* dev, const T* host, size_t n) {
    if (n == 0) return;
    cudaError_t err = cudaMemcpyAsync(dev, host, n * sizeof(T), cudaMemcpyHostToDevice, stream_);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
    EXPECT_EQ(err, cudaSuccess) << "upload: " << cudaGetErrorName(err) << " "
                                << cudaGetErrorString(err);
  }

  template <typename T>
  T* Alloc(size_t n) {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T));
    EXPECT_EQ(err, cudaSuccess) << "cudaMalloc(" << n * sizeof(T)
                                << "): " << cudaGetErrorString(err);
    if (err != cudaSuccess) return nullptr;
    allocations_.push_back(p);
    return static_cast<T*>(p);
  }

  // Waits for the stream, then copies n elements back (the test fails if either step fails).
  template <typename T>
  std::vector<T> Download(const T* dev, size_t n) {
    std::vector<T> host(n);
    cudaError_t err = cudaStreamSynchronize(stream_);
    EXPECT_EQ(err, cudaSuccess) << "kernel execution: " << cudaGetErrorName(err) << " "
                                << cudaGetErrorString(err);
    if (err != cudaSuccess || n == 0) return host;
    err = cudaMemcpyAsync(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost, stream_);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream_);
    EXPECT_EQ(err, cudaSuccess) << "download: " << cudaGetErrorName(err) << " "
                                << cudaGetErrorString(err);
    return host;
  }

  cudaStream_t stream_ = nullptr;

 private:
  std::vector<void*> allocations_;
};

}  // namespace vamp::kernels::cuda

#endif  // VAMP_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
