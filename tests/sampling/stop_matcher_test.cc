#include <string>
#include <vector>

#include "engine/sampling/sampler.h"
#include "gtest/gtest.h"

namespace decoded {
namespace {

TEST(StopMatcherTest, TextWithoutStopsPassesThrough) {
  StopMatcher m({"###"});
  EXPECT_EQ(m.Push("hello "), "hello ");
  EXPECT_EQ(m.Push("world"), "world");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, PartialMatchIsHeldBackUntilResolved) {
  StopMatcher m({"world!"});
  EXPECT_EQ(m.Push("Hello wor"), "Hello ");
  EXPECT_EQ(m.Push("l"), "");
  EXPECT_EQ(m.Push("x"), "worlx");  // the prefix broke: released
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcherTest, StopAcrossPushesCutsBeforeTheStop) {
  StopMatcher m({"</answer>"});
  EXPECT_EQ(m.Push("42</"), "42");
  EXPECT_EQ(m.Push("ans"), "");
  EXPECT_EQ(m.Push("wer> trailing"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("more"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, StopInsideOnePushReturnsTheTextBeforeIt) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.Push("abc STOP def"), "abc ");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWins) {
  StopMatcher m({"cd", "b"});
  EXPECT_EQ(m.Push("abcd"), "a");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcherTest, OverlappingPrefixesHoldTheLongestCandidate) {
  // "aab" can only start at the second 'a' of "aaa": emit exactly one 'a',
  // and the stop then begins with the held "aa".
  StopMatcher m({"aab"});
  EXPECT_EQ(m.Push("aaa"), "a");
  EXPECT_EQ(m.Push("b"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcherTest, FlushReleasesHeldText) {
  StopMatcher m({"\n\nUser:"});
  EXPECT_EQ(m.Push("done.\n\nUs"), "done.");
  EXPECT_EQ(m.Flush(), "\n\nUs");
}

TEST(StopMatcherTest, EmptyStopSequencesAreIgnored) {
  StopMatcher m({"", "x"});
  EXPECT_EQ(m.Push("abc"), "abc");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcherTest, MultiByteStopIsHeldWholeCodePoints) {
  StopMatcher m({"\xE2\x9C\x85 done"});  // "✅ done"
  EXPECT_EQ(m.Push("ok \xE2\x9C\x85"), "ok ");
  EXPECT_EQ(m.Push(" do"), "");
  EXPECT_EQ(m.Push("ne"), "");
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace decoded
