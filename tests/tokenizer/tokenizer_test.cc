#include "tokenizer/tokenizer.h"

#include "gtest/gtest.h"
#include "tokenizer/utf8.h"

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
  ChatTemplateInput input;
  input.messages = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(*(*t)->ApplyChatTemplate(input),
            "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n");
  input.add_generation_prompt = false;
  EXPECT_EQ(*(*t)->ApplyChatTemplate(input), "<|system|>\nBe brief.\n<|user|>\nHi\n");
  input.tools_json = R"([{"type": "function", "function": {"name": "f"}}])";
  EXPECT_FALSE((*t)->ApplyChatTemplate(input).ok());
}

TEST(StreamDecoderTest, HoldsSplitCharactersAndMatchesFullDecode) {
  absl::StatusOr<std::unique_ptr<ByteTokenizer>> t = ByteTokenizer::Create(256);
  ASSERT_TRUE(t.ok());
  const std::string text =
      "a\xE2\x82\xAC"
      "b\xF0\x9F\x98\x80\xC3";  // a€b😀 then a cut é
  std::vector<int32_t> ids = (*t)->Encode(text);
  StreamDecoder stream(t->get());
  std::string all;
  std::vector<std::string> chunks;
  for (int32_t id : ids) {
    chunks.push_back(stream.Next({id}));
    EXPECT_TRUE(IsValidUtf8(chunks.back()));
    all += chunks.back();
  }
  EXPECT_EQ(chunks[1], "");  // first byte of €: held
  EXPECT_EQ(chunks[3], "\xE2\x82\xAC");
  all += stream.Finish();
  EXPECT_EQ(all, (*t)->Decode(ids));
  EXPECT_EQ(all,
            "a\xE2\x82\xAC"
            "b\xF0\x9F\x98\x80\xEF\xBF\xBD");
}

TEST(Utf8Test, ReplacesMaximalIllFormedSubpartsLikeWhatwg) {
  EXPECT_EQ(SanitizeUtf8("ok"), "ok");
  EXPECT_EQ(SanitizeUtf8("\x80"), "\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeUtf8("\xE2\x82"), "\xEF\xBF\xBD");  // truncated: one U+FFFD
  EXPECT_EQ(SanitizeUtf8("\xE2\x28\xA1"), "\xEF\xBF\xBD(\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_EQ(IncompleteUtf8Tail("ab\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteUtf8Tail("ab\xF0\x28"), 0u);
  EXPECT_EQ(IncompleteUtf8Tail("ab"), 0u);
}

}  // namespace
}  // namespace vamp
