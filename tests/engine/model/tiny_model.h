// Shared helpers of the engine tests: where the tiny qwen3_moe checkpoint and its HF transformers
// goldens are (tests/data/make_tiny_qwen3_moe.py), and an in-memory safetensors writer for
// building good and bad checkpoints.
#ifndef VAMP_TESTS_ENGINE_MODEL_TINY_MODEL_H_
#define VAMP_TESTS_ENGINE_MODEL_TINY_MODEL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace vamp::testing {

inline std::string TestDataDir() {
  if (const char* env = std::getenv("VAMP_TEST_DATA"); env != nullptr && *env != '\0') return env;
  return VAMP_TEST_DATA_FALLBACK;
}

// The source tree (tests/data lives in it).
inline std::string SourceDir() {
  if (const char* env = std::getenv("VAMP_SOURCE_DIR"); env != nullptr && *env != '\0') return env;
  return std::string(VAMP_TEST_DATA_FALLBACK) + "/../..";
}

inline std::string TinyModelDir() { return TestDataDir() + "/tiny-qwen3-moe"; }
inline std::string TinyFusedModelDir() { return TestDataDir() + "/tiny-qwen3-moe-fused"; }

// A scratch directory private to this test process (ctest runs cases as parallel processes, and
// other users' runs may share /tmp).
// Removed when the process exits.
inline std::string ScratchDir() {
  struct Dir {
    std::string path = ::testing::TempDir() + "/vamp_engine_test_" + std::to_string(::getpid());
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Dir dir;
  return dir.path;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The goldens: prompts, 16-token greedy continuations and the logits of every prompt position
// (HF transformers float32 on the CPU; `logits_file` names another set of logits for the same
// prompts, e.g. tiny-qwen3-moe-goldens-bf16.safetensors, HF in bfloat16 on a GPU; `meta_file`
// another model's goldens, e.g. tiny-qwen3-next-goldens.json).
struct Goldens {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> continuations;
  std::vector<std::vector<float>> logits;  // [len(prompt) * vocab] each
  int64_t vocab = 0;
};

inline Goldens LoadGoldens(const std::string& logits_file = "tiny-qwen3-moe-goldens.safetensors",
                           const std::string& meta_file = "tiny-qwen3-moe-goldens.json") {
  Goldens g;
  const auto meta = nlohmann::json::parse(ReadFile(TestDataDir() + "/" + meta_file));
  for (const auto& p : meta["prompts"]) g.prompts.push_back(p.get<std::vector<int32_t>>());
  for (const auto& c : meta["greedy_continuations"]) {
    g.continuations.push_back(c.get<std::vector<int32_t>>());
  }
  auto file = SafetensorsFile::Open(TestDataDir() + "/" + logits_file);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return g;
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    const TensorInfo* t = (*file)->Find("logits_" + std::to_string(i));
    EXPECT_NE(t, nullptr);
    if (t == nullptr) return g;
    g.vocab = t->shape[1];
    std::vector<float> v(t->num_elements);
    std::vector<DimRange> ranges = {{0, t->shape[0]}, {0, t->shape[1]}};
    EXPECT_TRUE(ReadTensorSliceAsFloat(*t, ranges, v.data()).ok());
    g.logits.push_back(std::move(v));
  }
  return g;
}

// The golden tolerance: |got - want| <= 1e-4 * max(1, |want|), elementwise.
inline ::testing::AssertionResult LogitsMatch(const float* got, const float* want, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double tol = 1e-4 * std::max(1.0, std::abs(static_cast<double>(want[i])));
    if (!(std::abs(static_cast<double>(got[i]) - want[i]) <= tol)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Builds safetensors file images in memory.
class SafetensorsBuilder {
 public:
  void Add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           const void* data, size_t bytes) {
    nlohmann::json entry;
    entry["dtype"] = dtype;
    entry["shape"] = shape;
    entry["data_offsets"] = {data_.size(), data_.size() + bytes};
    header_[name] = entry;
    data_.append(static_cast<const char*>(data), bytes);
  }
  void AddF32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    Add(name, "F32", std::move(shape), v.data(), v.size() * sizeof(float));
  }
  nlohmann::json& header() { return header_; }
  std::string& data() { return data_; }

  // The file image, with the header as given (tests edit it to lie).
  std::string Build() const { return BuildWithHeader(header_.dump()); }
  std::string BuildWithHeader(const std::string& header) const {
    std::string out(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
    return out + header + data_;
  }

 private:
  nlohmann::json header_ = nlohmann::json::object();
  std::string data_;
};

}  // namespace vamp::testing

#endif  // VAMP_TESTS_ENGINE_MODEL_TINY_MODEL_H_
