// The safetensors reader: valid files, slices and conversions, and every kind of bad header.
#include "engine/model/safetensors.h"

#include <cstring>

#include "gtest/gtest.h"
#include "kernels/cpu/copy.h"
#include "tests/engine/model/tiny_model.h"

namespace vamp {
namespace {

using testing::SafetensorsBuilder;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(const std::string& bytes) {
  return SafetensorsFile::FromBuffer(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                     "test.safetensors");
}

TEST(SafetensorsTest, ReadsTensorsSlicesAndMetadata) {
  SafetensorsBuilder b;
  std::vector<float> m(3 * 4 * 5);
  for (size_t i = 0; i < m.size(); ++i) m[i] = float(i);
  b.AddF32("m", {3, 4, 5}, m);
  std::vector<uint16_t> bf(6);
  const std::vector<float> bf_src = {1, 2, 3, -4, 0.5, 8};
  kernels::cpu::FloatToBf16(bf_src.data(), 6, bf.data());
  b.Add("bf", "BF16", {2, 3}, bf.data(), 12);
  const std::vector<uint16_t> half = {0x3C00, 0x4000, 0xC400};  // 1, 2, -4
  b.Add("half", "F16", {3}, half.data(), 6);
  b.Add("scalar", "F32", {}, m.data(), 4);
  b.Add("empty", "F32", {0, 7}, nullptr, 0);
  b.header()["__metadata__"] = {{"format", "pt"}};
  const std::string bytes = b.Build();
  auto f = Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  ASSERT_EQ((*f)->tensors().size(), 5u);
  const TensorInfo* t = (*f)->Find("m");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(t->num_bytes, 240);
  EXPECT_EQ((*f)->Find("nope"), nullptr);

  // Slice [1:3, 2:4, 1:4].
  std::vector<float> out(2 * 2 * 3);
  const DimRange r[] = {{1, 3}, {2, 4}, {1, 4}};
  ASSERT_TRUE(ReadTensorSliceAsFloat(*t, r, out.data()).ok());
  std::vector<float> want;
  for (int i = 1; i < 3; ++i)
    for (int j = 2; j < 4; ++j)
      for (int k = 1; k < 4; ++k) want.push_back(float(i * 20 + j * 5 + k));
  EXPECT_EQ(out, want);

  std::vector<float> bfo(3);
  const DimRange rb[] = {{1, 2}, {0, 3}};
  ASSERT_TRUE(ReadTensorSliceAsFloat(*(*f)->Find("bf"), rb, bfo.data()).ok());
  EXPECT_EQ(bfo, (std::vector<float>{-4, 0.5, 8}));
  std::vector<float> ho(3);
  const DimRange rh[] = {{0, 3}};
  ASSERT_TRUE(ReadTensorSliceAsFloat(*(*f)->Find("half"), rh, ho.data()).ok());
  EXPECT_EQ(ho, (std::vector<float>{1, 2, -4}));
  float s = -1;
  ASSERT_TRUE(ReadTensorSliceAsFloat(*(*f)->Find("scalar"), {}, &s).ok());
  EXPECT_EQ(s, 0.0f);

  // Out-of-shape slices and a wrong rank are errors naming the tensor.
  const DimRange bad[] = {{0, 4}, {0, 4}, {0, 5}};
  auto st = ReadTensorSliceAsFloat(*t, bad, out.data());
  EXPECT_NE(std::string(st.message()).find("tensor 'm'"), std::string::npos) << st;
  const DimRange two[] = {{0, 1}, {0, 1}};
  EXPECT_FALSE(ReadTensorSliceAsFloat(*t, two, out.data()).ok());
}

TEST(SafetensorsTest, UnalignedDataIsReadCorrectly) {
  // A header length that is not a multiple of 4 leaves F32 data unaligned in the mapping.
  SafetensorsBuilder b;
  const std::vector<float> v = {1.5f, -2.25f, 3.0f};
  b.AddF32("v", {3}, v);
  std::string header = b.header().dump();
  header += std::string((4 - (8 + header.size()) % 4) % 4 + 1, ' ');  // trailing padding
  const std::string bytes = b.BuildWithHeader(header);
  auto f = Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<float> out(3);
  const DimRange r[] = {{0, 3}};
  ASSERT_TRUE(ReadTensorSliceAsFloat(*(*f)->Find("v"), r, out.data()).ok());
  EXPECT_EQ(out, v);
}

// Each case: a file image and a substring its error must contain.
TEST(SafetensorsTest, BadFilesAreErrorsNamingTheProblem) {
  auto good = [] {
    SafetensorsBuilder b;
    b.AddF32("a", {2, 2}, {1, 2, 3, 4});
    b.AddF32("b", {3}, {5, 6, 7});
    return b;
  };
  std::vector<std::pair<std::string, std::string>> cases;
  cases.emplace_back(std::string("\x05\0\0", 3), "truncated: 3 bytes");
  {
    std::string huge(8, '\0');
    huge[6] = 1;  // 2^48 bytes of header
    cases.emplace_back(huge + "{}", "exceeds the limit");
  }
  {
    auto b = good();
    std::string bytes = b.Build();
    bytes[0] = static_cast<char>(bytes[0] + 100);  // header longer than the file
    cases.emplace_back(bytes.substr(0, 8 + b.header().dump().size() + 20),
                       "truncated: header length");
  }
  cases.emplace_back(good().BuildWithHeader("{\"a\": "), "not valid JSON");
  cases.emplace_back(good().BuildWithHeader("[1, 2]"), "not a JSON object");
  {
    auto b = good();
    b.header()["a"]["data_offsets"] = {0, 1000};
    cases.emplace_back(b.Build(), "tensor 'a': data_offsets end 1000 is past the data section");
  }
  {
    auto b = good();
    b.header()["a"]["shape"] = {2, 3};  // 24 bytes claimed for a 16-byte range
    cases.emplace_back(b.Build(), "tensor 'a': shape [2, 3] of F32 needs 24 bytes");
  }
  {
    auto b = good();
    b.header()["b"]["data_offsets"] = {8, 20};  // overlaps a
    b.header()["b"]["shape"] = {3};
    cases.emplace_back(b.Build(), "overlap");
  }
  {
    auto b = good();
    b.header()["a"]["data_offsets"] = {16, 0};
    cases.emplace_back(b.Build(), "tensor 'a': data_offsets [16, 0] are reversed");
  }
  {
    auto b = good();
    b.header()["a"]["dtype"] = "F128";
    cases.emplace_back(b.Build(), "tensor 'a': unknown dtype 'F128'");
  }
  {
    auto b = good();
    b.header()["a"]["shape"] = {-2, -2};
    cases.emplace_back(b.Build(), "tensor 'a': shape entries must be non-negative");
  }
  {
    auto b = good();
    b.header()["a"]["shape"] = {1ull << 62, 1ull << 62};
    cases.emplace_back(b.Build(), "tensor 'a': element count overflows");
  }
  {
    auto b = good();
    b.header()["a"]["shape"] = {1ull << 62};
    cases.emplace_back(b.Build(), "tensor 'a': byte size overflows");
  }
  {
    auto b = good();
    b.header()["a"]["data_offsets"] = {0};
    cases.emplace_back(b.Build(), "tensor 'a': 'data_offsets' must be an array [begin, end]");
  }
  {
    auto b = good();
    b.header()["a"]["extra"] = 1;
    cases.emplace_back(b.Build(), "tensor 'a': unknown field 'extra'");
  }
  {
    auto b = good();
    b.header()["a"].erase("dtype");
    cases.emplace_back(b.Build(), "tensor 'a': missing or non-string 'dtype'");
  }
  {
    auto b = good();
    b.header()["__metadata__"] = {{"k", 1}};
    cases.emplace_back(b.Build(), "'__metadata__' entry 'k' is not a string");
  }
  {
    auto b = good();
    b.header()["a"]["shape"] = {2.0, 2.0};
    cases.emplace_back(b.Build(), "tensor 'a': shape entries must be non-negative integers");
  }
  for (const auto& [bytes, expect] : cases) {
    auto f = Parse(bytes);
    ASSERT_FALSE(f.ok()) << expect;
    EXPECT_NE(std::string(f.status().message()).find(expect), std::string::npos)
        << "want '" << expect << "', got: " << f.status();
    EXPECT_NE(std::string(f.status().message()).find("test.safetensors"), std::string::npos);
  }
}

TEST(SafetensorsTest, OpenMapsFilesAndRejectsMissingOrTinyOnes) {
  auto f = SafetensorsFile::Open(testing::TinyModelDir() + "/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_NE((*f)->Find("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ((*f)->Find("model.embed_tokens.weight")->shape, (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(SafetensorsFile::Open("/nonexistent.safetensors").status().code(),
            absl::StatusCode::kNotFound);
  const std::string tiny = testing::ScratchDir() + "/tiny.safetensors";
  testing::WriteFile(tiny, "abc");
  auto t = SafetensorsFile::Open(tiny);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("truncated"), std::string::npos);
}

}  // namespace
}  // namespace vamp
