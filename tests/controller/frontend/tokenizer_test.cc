#include "controller/frontend/tokenizer.h"

#include "gtest/gtest.h"

namespace vamp {
namespace {

TEST(ByteTokenizerTest, RoundTripsBytesAndDropsNonByteIds) {
  absl::StatusOr<std::unique_ptr<ByteTokenizer>> t = ByteTokenizer::Create(300, 3);
  ASSERT_TRUE(t.ok());
  std::vector<int32_t> ids = (*t)->Encode("Hé!");
  EXPECT_EQ(ids, (std::vector<int32_t>{3 + 'H', 3 + 0xC3, 3 + 0xA9, 3 + '!'}));
  ids.push_back(1);    // below the byte range: dropped
  ids.push_back(299);  // above it: dropped
  EXPECT_EQ((*t)->Decode(ids), "Hé!");
  EXPECT_FALSE(ByteTokenizer::Create(255).ok());
  EXPECT_FALSE(ByteTokenizer::Create(300, 50).ok());
}

TEST(ByteTokenizerTest, ChatTemplateIsDocumentedLayout) {
  absl::StatusOr<std::unique_ptr<ByteTokenizer>> t = ByteTokenizer::Create(256);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->ApplyChatTemplate({{"system", "Be brief."}, {"user", "Hi"}}),
            "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n");
}

}  // namespace
}  // namespace vamp
