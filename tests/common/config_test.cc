#include "common/config.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

ConfigSchema TestSchema() {
  ConfigSchema s;
  s.Int("max_num_seqs", 256, 1, 4096, "max concurrent sequences")
      .Double("gpu_memory_utilization", 0.9, 0.05, 1.0, "fraction of device memory")
      .String("model", "tiny", "model id")
      .Enum("arbiter", "vamp", {"static", "vamp"}, "memory arbiter")
      .Bool("enable_prefix_caching", true, "reuse KV blocks across requests");
  return s;
}

std::string WriteTemp(const std::string& text) {
  char path[] = "/tmp/vamp_config_test_XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(ConfigTest, DefaultsApplyWhenNothingIsGiven) {
  ConfigSchema schema = TestSchema();
  Config config(schema);
  EXPECT_EQ(config.GetInt("max_num_seqs"), 256);
  EXPECT_DOUBLE_EQ(config.GetDouble("gpu_memory_utilization"), 0.9);
  EXPECT_EQ(config.GetString("arbiter"), "vamp");
  EXPECT_TRUE(config.GetBool("enable_prefix_caching"));
  EXPECT_FALSE(config.IsSet("max_num_seqs"));
}

TEST(ConfigTest, FlagsInAllSpellings) {
  ConfigSchema schema = TestSchema();
  const char* argv[] = {"prog",         "--max-num-seqs=8", "--gpu_memory_utilization", "0.5",
                        "--no-enable-prefix-caching", "--arbiter=static", "positional"};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(schema, 7, argv);
  ASSERT_TRUE(cli.ok()) << cli.status();
  EXPECT_EQ(cli->config.GetInt("max_num_seqs"), 8);
  EXPECT_DOUBLE_EQ(cli->config.GetDouble("gpu_memory_utilization"), 0.5);
  EXPECT_FALSE(cli->config.GetBool("enable_prefix_caching"));
  EXPECT_EQ(cli->config.GetString("arbiter"), "static");
  EXPECT_TRUE(cli->config.IsSet("max_num_seqs"));
  EXPECT_THAT(cli->positional, ::testing::ElementsAre("positional"));
}

TEST(ConfigTest, OutOfRangeNamesFieldAndRange) {
  ConfigSchema schema = TestSchema();
  const char* argv[] = {"prog", "--max_num_seqs=0"};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(schema, 2, argv);
  ASSERT_FALSE(cli.ok());
  EXPECT_EQ(cli.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(cli.status().message(), HasSubstr("'max_num_seqs'"));
  EXPECT_THAT(cli.status().message(), HasSubstr("[1, 4096]"));
}

TEST(ConfigTest, MalformedNumberNamesField) {
  ConfigSchema schema = TestSchema();
  const char* argv[] = {"prog", "--gpu_memory_utilization=lots"};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(schema, 2, argv);
  ASSERT_FALSE(cli.ok());
  EXPECT_THAT(cli.status().message(), HasSubstr("'gpu_memory_utilization'"));
  EXPECT_THAT(cli.status().message(), HasSubstr("'lots' is not a number"));
}

TEST(ConfigTest, EnumListsChoices) {
  ConfigSchema schema = TestSchema();
  const char* argv[] = {"prog", "--arbiter=lru"};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(schema, 2, argv);
  ASSERT_FALSE(cli.ok());
  EXPECT_THAT(cli.status().message(), HasSubstr("'lru' is not one of static, vamp"));
}

TEST(ConfigTest, UnknownFlagAndMissingValue) {
  ConfigSchema schema = TestSchema();
  const char* unknown[] = {"prog", "--max_seqs=3"};
  absl::StatusOr<CommandLine> a = ParseCommandLine(schema, 2, unknown);
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), HasSubstr("unknown flag '--max_seqs'"));
  const char* missing[] = {"prog", "--model"};
  absl::StatusOr<CommandLine> b = ParseCommandLine(schema, 2, missing);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("'--model' needs a value"));
}

TEST(ConfigTest, VersionIsRequestedLikeHelp) {
  ConfigSchema schema = TestSchema();
  const char* argv[] = {"prog", "--version", "--no_such_flag"};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(schema, 3, argv);
  ASSERT_TRUE(cli.ok()) << cli.status();
  EXPECT_TRUE(cli->version_requested);
  EXPECT_FALSE(cli->help_requested);
  EXPECT_THAT(schema.HelpText("prog", "x"), HasSubstr("--version"));
}

TEST(ConfigTest, FileThenFlagsOverride) {
  ConfigSchema schema = TestSchema();
  const std::string path = WriteTemp(R"({"max_num_seqs": 64, "model": "from-file",
                                         "gpu_memory_utilization": 1})");
  const char* argv[] = {"prog", "--config", path.c_str(), "--max_num_seqs=32"};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(schema, 4, argv);
  ASSERT_TRUE(cli.ok()) << cli.status();
  EXPECT_EQ(cli->config.GetInt("max_num_seqs"), 32);
  EXPECT_EQ(cli->config.GetString("model"), "from-file");
  EXPECT_DOUBLE_EQ(cli->config.GetDouble("gpu_memory_utilization"), 1.0);
  std::remove(path.c_str());
}

TEST(ConfigTest, FileErrorsNameFileAndField) {
  ConfigSchema schema = TestSchema();
  const std::string bad_type = WriteTemp(R"({"max_num_seqs": "many"})");
  Config config(schema);
  absl::Status s = LoadConfigFile(bad_type, &config);
  EXPECT_THAT(s.message(), HasSubstr(bad_type));
  EXPECT_THAT(s.message(), HasSubstr("'max_num_seqs': expected an integer"));
  // Nothing accepted before is lost: the default is intact.
  EXPECT_EQ(config.GetInt("max_num_seqs"), 256);

  const std::string unknown = WriteTemp(R"({"max_seqs": 1})");
  EXPECT_THAT(LoadConfigFile(unknown, &config).message(), HasSubstr("unknown config field"));
  const std::string not_json = WriteTemp("max_num_seqs = 3");
  EXPECT_THAT(LoadConfigFile(not_json, &config).message(), HasSubstr("is not valid JSON"));
  EXPECT_EQ(LoadConfigFile("/nonexistent/vamp.json", &config).code(),
            absl::StatusCode::kNotFound);
  for (const auto& p : {bad_type, unknown, not_json}) std::remove(p.c_str());
}

TEST(ConfigTest, HelpListsEveryFieldWithDefaultAndRange) {
  ConfigSchema schema = TestSchema();
  const std::string help = schema.HelpText("prog", "Does things.");
  EXPECT_THAT(help, HasSubstr("--max_num_seqs"));
  EXPECT_THAT(help, HasSubstr("[256, 1..4096]"));
  EXPECT_THAT(help, HasSubstr("one of static|vamp"));
  const char* argv[] = {"prog", "--help", "--max_num_seqs=0"};
  absl::StatusOr<CommandLine> cli = ParseCommandLine(schema, 3, argv);
  ASSERT_TRUE(cli.ok());
  EXPECT_TRUE(cli->help_requested);
}

}  // namespace
}  // namespace vamp
