#include "common/metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/metrics_scrape.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, ExposerServesRegistryAndPromtoolAcceptsIt) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& steps = prometheus::BuildCounter()
                    .Name("vamp_test_steps_total")
                    .Help("Scheduler steps run")
                    .Register(*registry);
  steps.Add({{"rank", "0"}}).Increment(3);
  prometheus::BuildGauge()
      .Name("vamp_test_kv_pool_bytes")
      .Help("Bytes mapped into the KV region")
      .Register(*registry)
      .Add({})
      .Set(2 * 1024 * 1024);
  prometheus::BuildHistogram()
      .Name("vamp_test_remap_duration_seconds")
      .Help("Time to apply one remap")
      .Register(*registry)
      .Add({}, LatencyBucketsSeconds())
      .Observe(0.0004);

  absl::StatusOr<std::unique_ptr<MetricsExposer>> exposer =
      MetricsExposer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  absl::StatusOr<std::string> body = testing::ScrapeMetrics((*exposer)->port());
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("vamp_test_steps_total{rank=\"0\"} 3"));
  EXPECT_THAT(*body, HasSubstr("vamp_test_kv_pool_bytes 2097152"));
  EXPECT_THAT(*body, HasSubstr("vamp_test_remap_duration_seconds_bucket{le=\"0.0005\"} 1"));
  absl::Status check = testing::PromtoolCheckMetrics(*body);
  if (absl::IsUnavailable(check)) GTEST_SKIP() << check;
  EXPECT_TRUE(check.ok()) << check;
}

TEST(MetricsTest, PromtoolRejectsBadNames) {
  // Guards the guard: a counter without _total must be flagged, or the check above proves nothing.
  absl::Status check = testing::PromtoolCheckMetrics(
      "# HELP vamp_bad_counter Bad\n# TYPE vamp_bad_counter counter\nvamp_bad_counter 1\n");
  if (absl::IsUnavailable(check)) GTEST_SKIP() << check;
  EXPECT_FALSE(check.ok());
}

TEST(MetricsTest, BindFailureIsAClearError) {
  absl::StatusOr<std::unique_ptr<MetricsExposer>> exposer =
      MetricsExposer::Start("256.0.0.1:80");
  ASSERT_FALSE(exposer.ok());
  EXPECT_THAT(exposer.status().message(), HasSubstr("cannot serve /metrics on '256.0.0.1:80'"));
}

}  // namespace
}  // namespace vamp
