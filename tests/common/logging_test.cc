#include "common/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

timeval FixedTime() {
  timeval tv{};
  tv.tv_sec = 1764588223;  // 2025-12-01T11:23:43Z
  tv.tv_usec = 42;
  return tv;
}

TEST(JsonEscapeTest, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonEscape("plain text"), "plain text");
  EXPECT_EQ(JsonEscape("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(JsonEscape("C:\\path"), "C:\\\\path");
  EXPECT_EQ(JsonEscape("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(JsonEscape(std::string("nul\0x", 5)), "nul\\u0000x");
  EXPECT_EQ(JsonEscape("\x01\x1f\x7f\b\f"), "\\u0001\\u001f\\u007f\\b\\f");
}

TEST(JsonEscapeTest, KeepsValidUtf8AndReplacesInvalidBytes) {
  EXPECT_EQ(JsonEscape("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  // A lone continuation byte, a truncated sequence, an overlong '/', a surrogate, and 0xff.
  EXPECT_EQ(JsonEscape("a\x80z"), "a\\ufffdz");
  EXPECT_EQ(JsonEscape("\xe2\x82"), "\\ufffd\\ufffd");
  EXPECT_EQ(JsonEscape("\xc0\xaf"), "\\ufffd\\ufffd");
  EXPECT_EQ(JsonEscape("\xed\xa0\x80"), "\\ufffd\\ufffd\\ufffd");
  EXPECT_EQ(JsonEscape("\xff"), "\\ufffd");
}

TEST(FormatLogLineTest, JsonLineHasEveryFieldAndEndsWithNewline) {
  const std::string line = FormatLogLine(LogFormat::kJson, LogLevel::kWarning, FixedTime(), 77,
                                         "/src/vamp/controller/x.cc", 12, "disk \"full\"\n");
  EXPECT_EQ(line,
            "{\"ts\":\"2025-12-01T11:23:43.000042Z\",\"level\":\"WARNING\",\"file\":\"x.cc\","
            "\"line\":12,\"tid\":77,\"msg\":\"disk \\\"full\\\"\\n\"}\n");
}

TEST(FormatLogLineTest, TextLineKeepsTheGlogLayout) {
  const std::string line =
      FormatLogLine(LogFormat::kText, LogLevel::kInfo, FixedTime(), 9, "a/b/c.cc", 3, "hello");
  EXPECT_THAT(line, StartsWith("I1201 "));
  EXPECT_THAT(line, HasSubstr(".000042 9 c.cc:3] hello\n"));
}

TEST(LogOptionsTest, ParseLogFormat) {
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_THAT(ParseLogFormat("xml").status().message(), HasSubstr("'xml' is not text or json"));
}

TEST(LogOptionsTest, ConfigureLoggingWritesJsonLinesToTheFile) {
  ConfigSchema schema;
  AddLogConfigFields(schema);
  char path[] = "/tmp/vamp_logging_test_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  const char* argv[] = {"test", "--log_format=json", "--log_file", path};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(schema, 4, argv);
  ASSERT_TRUE(cli.ok()) << cli.status();
  ASSERT_TRUE(ConfigureLogging(LogOptionsFromConfig(cli->config)).ok());
  VAMP_LOG(INFO) << "token \"never\" here\tok";
  VAMP_LOG(DEBUG) << "below the threshold";
  ASSERT_TRUE(SetLogFile("").ok());
  SetLogFormat(LogFormat::kText);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path);
  EXPECT_THAT(text.str(), HasSubstr("\"level\":\"INFO\",\"file\":\"logging_test.cc\""));
  EXPECT_THAT(text.str(), HasSubstr("\"msg\":\"token \\\"never\\\" here\\tok\"}\n"));
  EXPECT_EQ(text.str().find("below the threshold"), std::string::npos);
}

TEST(LogOptionsTest, ConfigureLoggingNamesTheBadField) {
  ConfigSchema schema;
  AddLogConfigFields(schema);
  Config config(schema);
  ASSERT_TRUE(config.SetFromString("log_file", "/nonexistent-dir/vamp.log").ok());
  absl::Status s = ConfigureLogging(LogOptionsFromConfig(config));
  EXPECT_THAT(s.message(), HasSubstr("config field 'log_file'"));
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent-dir/vamp.log"));
  EXPECT_FALSE(config.SetFromString("log_format", "yaml").ok());
}

}  // namespace
}  // namespace vamp
