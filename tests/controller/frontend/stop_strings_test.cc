#include "controller/frontend/stop_strings.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace vamp {
namespace {

// Feeds `pieces` and returns the concatenated output (Finish included unless matched).
std::string Feed(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += m.Next(p);
  out += m.Finish();
  return out;
}

TEST(StopStringMatcherTest, WithoutStopsTextPassesThrough) {
  StopStringMatcher m({});
  EXPECT_EQ(m.Next("abc"), "abc");
  EXPECT_EQ(m.Finish(), "");
  EXPECT_FALSE(m.matched());
}

TEST(StopStringMatcherTest, OutputEndsBeforeTheStopString) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(Feed(m, {"hello E", "ND and more"}), "hello ");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.Next("later"), "");
}

TEST(StopStringMatcherTest, APossibleStartIsHeldBackUntilDecided) {
  StopStringMatcher m({"</stop>"});
  EXPECT_EQ(m.Next("a<"), "a");
  EXPECT_EQ(m.Next("/st"), "");
  EXPECT_EQ(m.Next("x"), "</stx");  // not the stop string after all: released at once
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.Next("</sto"), "");
  EXPECT_EQ(m.Finish(), "</sto");  // the output ended: the tail is text
}

TEST(StopStringMatcherTest, TheEarliestOfSeveralStopsWins) {
  StopStringMatcher m({"world", "lo"});
  EXPECT_EQ(Feed(m, {"hello world"}), "hel");
  StopStringMatcher n({"xyz", "b"});
  EXPECT_EQ(Feed(n, {"a", "b", "xyz"}), "a");
}

TEST(StopStringMatcherTest, HoldsTheLongestPossiblePrefix) {
  StopStringMatcher m({"aab"});
  EXPECT_EQ(m.Next("caa"), "c");
  EXPECT_EQ(m.Next("a"), "a");  // "aaa": only "aa" can still start "aab"
  EXPECT_EQ(m.Next("b"), "");
  EXPECT_TRUE(m.matched());
}

TEST(StopStringMatcherTest, MultiByteStopStrings) {
  StopStringMatcher m({"\xE3\x80\x82"});  // U+3002 IDEOGRAPHIC FULL STOP
  EXPECT_EQ(Feed(m, {"\xE4\xBD\xA0\xE5\xA5\xBD", "\xE3\x80\x82", "\xE5\x86\x8D"}),
            "\xE4\xBD\xA0\xE5\xA5\xBD");
}

TEST(StopStringMatcherTest, EveryPieceSplitGivesTheSameOutput) {
  const std::string text = "one two STOP three";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    StopStringMatcher m({"STOP", "TOPS"});
    EXPECT_EQ(Feed(m, {text.substr(0, cut), text.substr(cut)}), "one two ") << cut;
  }
}

}  // namespace
}  // namespace vamp
