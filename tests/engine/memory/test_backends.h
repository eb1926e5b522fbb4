// Shared by the memory, experts and kv suites: every backend-dependent suite is written once and
// instantiated for the host backend (always) and the CUDA backend (skipped without a device).
#ifndef VAMP_TESTS_ENGINE_MEMORY_TEST_BACKENDS_H_
#define VAMP_TESTS_ENGINE_MEMORY_TEST_BACKENDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/memory/memory_backend.h"
#include "engine/memory/model_shape.h"
#include "gtest/gtest.h"

namespace vamp::testing {

enum class TestBackend { kHost, kCuda };

// Host pages are small so the suites stay fast; the CUDA backend uses the device's granularity.
inline constexpr uint64_t kTestHostPageBytes = 64 << 10;

inline std::string TestBackendName(const ::testing::TestParamInfo<TestBackend>& info) {
  return info.param == TestBackend::kHost ? "host" : "cuda";
}

inline absl::StatusOr<std::unique_ptr<MemoryBackend>> MakeTestBackend(TestBackend kind) {
  MemoryBackendOptions options;
  options.kind = kind == TestBackend::kHost ? MemoryBackendOptions::Kind::kHost
                                            : MemoryBackendOptions::Kind::kCuda;
  options.host_page_bytes = kTestHostPageBytes;
  return CreateMemoryBackend(options);
}

// Base fixture: `backend_` is ready in every test body, or the test was skipped because the CUDA
// backend is unavailable here.
class BackendTest : public ::testing::TestWithParam<TestBackend> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<MemoryBackend>> backend = MakeTestBackend(GetParam());
    if (!backend.ok() && GetParam() == TestBackend::kCuda &&
        absl::IsUnavailable(backend.status())) {
      GTEST_SKIP() << "no CUDA device: " << backend.status();
    }
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
  }
  uint64_t page() const { return backend_->page_bytes(); }
  std::unique_ptr<MemoryBackend> backend_;
};

#define VAMP_INSTANTIATE_BACKEND_SUITE(suite)                                                      \
  INSTANTIATE_TEST_SUITE_P(                                                                        \
      Backends, suite,                                                                             \
      ::testing::Values(::vamp::testing::TestBackend::kHost, ::vamp::testing::TestBackend::kCuda), \
      ::vamp::testing::TestBackendName)

// A small MoE shape whose geometry scales with the page: each expert shard is 1.5 pages
// (hidden = page / 512, intermediate 128, bf16), so groups are 2 experts = 3 pages on any
// backend; every layer is MoE and has attention; a KV block (16 tokens, 2 heads of 48) is 6 KiB
// per layer, which does not divide the page, so blocks straddle page boundaries.
inline ModelShape SmallTestShape(uint64_t page_bytes, int num_layers, int64_t num_experts) {
  ModelShape s;
  s.name = "small-test-moe";
  s.hidden_size = static_cast<int64_t>(page_bytes / 512);
  s.moe_intermediate_size = 128;
  s.num_experts = num_experts;
  s.num_experts_per_token = 2;
  s.num_layers = num_layers;
  for (int i = 0; i < num_layers; ++i) {
    s.moe_layers.push_back(i);
    s.attention_layers.push_back(i);
  }
  s.num_q_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 48;
  s.dtype_bytes = 2;
  s.vocab_size = 256;
  return s;
}

// Deterministic pseudo-random bytes for `seed` (splitmix64).
inline std::vector<uint8_t> PatternBytes(uint64_t seed, size_t n) {
  std::vector<uint8_t> out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<uint8_t>(z >> (8 * j));
  }
  return out;
}

}  // namespace vamp::testing

#endif  // VAMP_TESTS_ENGINE_MEMORY_TEST_BACKENDS_H_
