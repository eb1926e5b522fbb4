// vamp-bench's report: the paper's numbers are drawn next to the measurements when asked, and
// only then; the measured series keep their own names.
#include "bench/vamp_bench/report.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

RunResult MakeRun(const std::string& config, int32_t sessions, double ttft_p99_s, double tpot_s) {
  RunResult r;
  r.config = config;
  r.sessions = sessions;
  r.stats.ttft_s.count = 10;
  r.stats.ttft_s.p50 = r.stats.ttft_s.p90 = r.stats.ttft_s.p99 = ttft_p99_s;
  r.stats.tpot_s.count = 10;
  r.stats.tpot_s.mean = tpot_s;
  r.server.hit_rate = 0.5;
  return r;
}

const std::string& Svg(const RenderedReport& report, const std::string& name) {
  for (const auto& [file, contents] : report.svgs) {
    if (file == "t-" + name + ".svg") return contents;
  }
  static const std::string none;
  ADD_FAILURE() << "no chart " << name;
  return none;
}

TEST(ReportTest, PaperReferencesAreDrawnWhenAskedAndOnlyThen) {
  const std::vector<RunResult> runs = {
      MakeRun("static", 16, 20.0, 0.100), MakeRun("static", 20, 30.0, 0.120),
      MakeRun("vamp-25", 16, 3.0, 0.130), MakeRun("vamp-25", 20, 3.5, 0.150)};
  ReportSpec spec;
  spec.title = spec.svg_prefix = "t";
  spec.multi_turn_sweep = true;
  RenderedReport with = RenderReport(spec, runs);
  // Table IV's lines, its TPOT cost over the first configuration, Figure 9's static point at 16.
  EXPECT_THAT(Svg(with, "ttft-p90"), HasSubstr("vLLM 26.1 s (paper, 2×H100"));
  EXPECT_THAT(Svg(with, "ttft-p99"), HasSubstr("VAMP-15 3.48 s"));
  EXPECT_THAT(Svg(with, "ttft-p99"), HasSubstr("static (paper Fig. 9, 2×H100 TP2)"));
  EXPECT_THAT(Svg(with, "hit-rate"), HasSubstr("VAMP-15 89.8 %"));
  EXPECT_THAT(Svg(with, "tpot"), HasSubstr("static × 1.311 (the paper's TPOT cost)"));
  // vamp-25's Figure 9 numbers are a range in the text, not points: no series for it.
  EXPECT_THAT(Svg(with, "ttft-p99"), Not(HasSubstr("vamp-25 (paper Fig. 9")));

  spec.paper_reference = false;
  RenderedReport without = RenderReport(spec, runs);
  for (const char* chart : {"ttft-p90", "ttft-p99", "hit-rate", "tpot"}) {
    EXPECT_THAT(Svg(without, chart), Not(HasSubstr("paper"))) << chart;
  }
  // Outside a multi-turn sweep Figure 9 does not apply.
  spec.paper_reference = true;
  spec.multi_turn_sweep = false;
  EXPECT_THAT(Svg(RenderReport(spec, runs), "ttft-p99"), Not(HasSubstr("Fig. 9")));
}

}  // namespace
}  // namespace vamp::bench
