#include "common/secret.h"

#include <unistd.h>

#include <fstream>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string WriteFile(const std::string& name, const std::string& content) {
  const std::string path =
      ::testing::TempDir() + "/secret_test_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(SecretTest, ReadsOneTrimmedLine) {
  for (const std::string& content :
       {std::string("tok-12345678"), std::string("tok-12345678\n"),
        std::string("  tok-12345678  \r\n\n"), std::string("\ntok-12345678\n")}) {
    absl::StatusOr<std::string> s = ReadSecretFile(WriteFile("ok", content), "field");
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, "tok-12345678");
  }
}

TEST(SecretTest, BadFilesNameFieldAndPathNeverTheContent) {
  struct Case {
    std::string name, content, why;
  };
  for (const Case& c :
       std::vector<Case>{{"two_lines", "hunter2-hunter2\nhunter3-hunter3\n", "more than one line"},
                         {"non_ascii", "hunter2-\xc3\xa9-hunter2", "printable ASCII"},
                         {"space", "hunter2 hunter2", "printable ASCII"},
                         {"short", "hunter2", "8 to 4096"},
                         {"long", std::string(5000, 'h'), "8 to 4096"},
                         {"empty", " \n", "is empty"}}) {
    const std::string path = WriteFile(c.name, c.content);
    absl::StatusOr<std::string> s = ReadSecretFile(path, "config field 'auth_token_file'");
    ASSERT_FALSE(s.ok()) << c.name;
    const std::string message(s.status().message());
    EXPECT_THAT(message, HasSubstr("config field 'auth_token_file'")) << c.name;
    EXPECT_THAT(message, HasSubstr(path)) << c.name;
    EXPECT_THAT(message, HasSubstr(c.why)) << c.name;
    EXPECT_THAT(message, Not(HasSubstr("hunter"))) << c.name;
  }
  absl::StatusOr<std::string> missing = ReadSecretFile("/nonexistent/token", "--token-file");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("--token-file: cannot read"));
}

TEST(SecretTest, KeyListsSkipCommentsAndNameTheBadLine) {
  absl::StatusOr<std::vector<std::string>> keys = ReadSecretListFile(
      WriteFile("keys", "# clients\nkey-aaaaaaaa\n\n  key-bbbbbbbb \n"), "api_key_file");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, (std::vector<std::string>{"key-aaaaaaaa", "key-bbbbbbbb"}));
  absl::StatusOr<std::vector<std::string>> bad =
      ReadSecretListFile(WriteFile("bad_keys", "key-aaaaaaaa\nkey-\x01-hunter2\n"), "api_key_file");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(bad.status().message(), Not(HasSubstr("hunter")));
  EXPECT_FALSE(ReadSecretListFile(WriteFile("no_keys", "# none\n"), "api_key_file").ok());
}

TEST(SecretTest, Compares) {
  EXPECT_TRUE(SecretEquals("abcdefgh", "abcdefgh"));
  EXPECT_FALSE(SecretEquals("abcdefgX", "abcdefgh"));
  EXPECT_FALSE(SecretEquals("abcdefg", "abcdefgh"));
  EXPECT_FALSE(SecretEquals("abcdefghi", "abcdefgh"));
  EXPECT_FALSE(SecretEquals("", "abcdefgh"));
  EXPECT_TRUE(BearerMatches("Bearer abcdefgh", "abcdefgh"));
  EXPECT_FALSE(BearerMatches("abcdefgh", "abcdefgh"));
  EXPECT_FALSE(BearerMatches("Bearer abcdefgh ", "abcdefgh"));
  EXPECT_FALSE(BearerMatches("Basic abcdefgh", "abcdefgh"));
  const std::vector<std::string> keys = {"key-one-1", "key-two-2"};
  EXPECT_TRUE(BearerMatchesAny("Bearer key-two-2", keys));
  EXPECT_FALSE(BearerMatchesAny("Bearer key-three", keys));
  EXPECT_FALSE(BearerMatchesAny("", keys));
}

TEST(SecretTest, GeneratesValidDistinctTokens) {
  std::set<std::string> seen;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<std::string> s = GenerateSecret();
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->size(), 64u);
    EXPECT_TRUE(ValidateSecret(*s).ok());
    seen.insert(*s);
  }
  EXPECT_EQ(seen.size(), 8u);
}

}  // namespace
}  // namespace vamp
