// Tokenizer behaviour on small hand-built vocabularies; expected ids follow
// from the SentencePiece BPE rules stated in tokenizer.h, worked by hand.
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/test_vocab.h"

namespace decoded {
namespace {

using ::decoded::testing::ByteId;
using ::decoded::testing::kFirstExtra;
using ::decoded::testing::MakeTokenizer;
using ::decoded::testing::MakeVocab;
using Ids = std::vector<int32_t>;

constexpr TokenType kN = TokenType::kNormal;
constexpr TokenType kU = TokenType::kUserDefined;

TEST(TokenizerCoreTest, HighestScoringPairMergesFirst) {
  // a=262 b=263 c=264 ab=265 bc=266
  auto bc_wins = MakeTokenizer({{"a", -1, kN}, {"b", -1, kN}, {"c", -1, kN}, {"ab", -2, kN}, {"bc", -1, kN}});
  EXPECT_EQ(bc_wins->Encode("abc", false, false), (Ids{262, 266}));
  auto ab_wins = MakeTokenizer({{"a", -1, kN}, {"b", -1, kN}, {"c", -1, kN}, {"ab", -1, kN}, {"bc", -2, kN}});
  EXPECT_EQ(ab_wins->Encode("abc", false, false), (Ids{265, 264}));
}

TEST(TokenizerCoreTest, EqualScoresMergeTheLeftmostPair) {
  // "aaa": pairs (0,1) and (1,2) both spell "aa"; the left one merges.
  auto t = MakeTokenizer({{"a", -1, kN}, {"aa", -1, kN}});
  EXPECT_EQ(t->Encode("aaa", false, false), (Ids{263, 262}));
}

TEST(TokenizerCoreTest, MergesChainThroughIntermediatePieces) {
  // he=265 ll=266 hell=267 hello=268 -- "hello" needs hell + o.
  auto t = MakeTokenizer({{"h", -5, kN}, {"e", -5, kN}, {"l", -5, kN}, {"he", -1, kN},
                          {"ll", -1, kN}, {"hell", -2, kN}, {"hello", -3, kN}, {"o", -5, kN}});
  EXPECT_EQ(t->Encode("hello", false, false), (Ids{kFirstExtra + 6}));
  // Without "hell" the chain stops at he + ll + o.
  auto no_hell = MakeTokenizer({{"h", -5, kN}, {"e", -5, kN}, {"l", -5, kN}, {"he", -1, kN},
                                {"ll", -1, kN}, {"hello", -3, kN}, {"o", -5, kN}});
  EXPECT_EQ(no_hell->Encode("hello", false, false), (Ids{265, 266, 268}));
}

TEST(TokenizerCoreTest, SpacesBecomeTheSpaceMarker) {
  auto t = MakeTokenizer({{"\xE2\x96\x81", -1, kN}, {"a", -1, kN}, {"\xE2\x96\x81" "a", -1, kN}});
  EXPECT_EQ(t->Encode("a a", false, false), (Ids{263, 264}));
  EXPECT_EQ(t->Encode(" ", false, false), (Ids{262}));
  EXPECT_EQ(*t->Decode({263, 264}), "a a");
}

TEST(TokenizerCoreTest, SpacePrefixOnlyWhenTheVocabularyAsksForIt) {
  const std::vector<testing::PieceSpec> pieces = {{"\xE2\x96\x81" "a", -1, kN}, {"a", -2, kN}};
  EXPECT_EQ(MakeTokenizer(pieces, false)->Encode("a", false, false), (Ids{263}));
  auto prefixed = MakeTokenizer(pieces, true);
  EXPECT_EQ(prefixed->Encode("a", false, false), (Ids{262}));
  // The decoder drops the space the encoder added.
  EXPECT_EQ(*prefixed->Decode({262}), "a");
}

TEST(TokenizerCoreTest, CharactersWithoutPiecesFallBackToUtf8Bytes) {
  auto t = MakeTokenizer({{"a", -1, kN}});
  // U+00E9 is C3 A9; U+1F600 is F0 9F 98 80.
  EXPECT_EQ(t->Encode("a\xC3\xA9", false, false), (Ids{262, ByteId(0xC3), ByteId(0xA9)}));
  EXPECT_EQ(t->Encode("\xF0\x9F\x98\x80", false, false),
            (Ids{ByteId(0xF0), ByteId(0x9F), ByteId(0x98), ByteId(0x80)}));
  EXPECT_EQ(*t->Decode({262, ByteId(0xC3), ByteId(0xA9)}), "a\xC3\xA9");
}

TEST(TokenizerCoreTest, ControlTokensAreSplitOutOnlyWithParseSpecial) {
  auto t = MakeTokenizer({{"<", -1, kN}, {"x", -1, kN}});
  EXPECT_EQ(t->Encode("x<eos>", false, true), (Ids{263, 1}));
  const Ids plain = t->Encode("x<eos>", false, false);
  for (int32_t id : plain) EXPECT_NE(id, 1);
  EXPECT_EQ(plain.front(), 263);
}

TEST(TokenizerCoreTest, ControlPiecesAreNeverMergedFromPlainText) {
  // "<e" + "os>" would merge into <eos> if control pieces were mergeable.
  auto t = MakeTokenizer({{"<e", -1, kN}, {"os>", -1, kN}, {"<", -3, kN}, {"e", -3, kN},
                          {"o", -3, kN}, {"s", -3, kN}, {">", -3, kN}, {"os", -2, kN}});
  EXPECT_EQ(t->Encode("<eos>", false, false), (Ids{262, 263}));
}

TEST(TokenizerCoreTest, UserDefinedTokensAreAlwaysSplitOut) {
  // "\n\n"=262 user-defined, "a"=263.
  auto t = MakeTokenizer({{"\n\n", 0, kU}, {"a", -1, kN}});
  EXPECT_EQ(t->Encode("a\n\na", false, false), (Ids{263, 262, 263}));
  EXPECT_EQ(*t->Decode({263, 262, 263}), "a\n\na");
}

TEST(TokenizerCoreTest, LongerSpecialSpellingsWinOverShorterOnes) {
  // "\n"=262, "\n\n"=263, "\n\n\n"=264, all user-defined.
  auto t = MakeTokenizer({{"\n", 0, kU}, {"\n\n", 0, kU}, {"\n\n\n", 0, kU}});
  EXPECT_EQ(t->Encode("\n\n\n\n\n", false, false), (Ids{264, 263}));
  EXPECT_EQ(t->Encode("\n\n\n\n", false, false), (Ids{264, 262}));
}

TEST(TokenizerCoreTest, BosIsAddedOnceOnly) {
  auto t = MakeTokenizer({{"x", -1, kN}});
  EXPECT_EQ(t->Encode("x", true, false), (Ids{2, 262}));
  EXPECT_EQ(t->Encode("", true, false), (Ids{2}));
  EXPECT_EQ(t->Encode("", false, false), (Ids{}));
  EXPECT_EQ(t->Encode("<bos>x", true, true), (Ids{2, 262}));
  // Only a BOS at the very start counts.
  EXPECT_EQ(t->Encode("x<bos>", true, true), (Ids{2, 262, 2}));
}

TEST(TokenizerCoreTest, BosIsNotAddedWhenTheVocabularyDoesNotAsk) {
  TokenizerVocab v = MakeVocab({{"x", -1, kN}});
  v.add_bos = false;
  auto t = Tokenizer::FromVocab(std::move(v));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->Encode("x", true, false), (Ids{262}));
}

TEST(TokenizerCoreTest, DecodeRendersControlTokensOnlyWhenAsked) {
  auto t = MakeTokenizer({{"x", -1, kN}});
  EXPECT_EQ(*t->Decode({2, 4, 262, 5, 1}), "x");
  EXPECT_EQ(*t->Decode({2, 4, 262, 5, 1}, true), "<bos><start_of_turn>x<end_of_turn><eos>");
}

TEST(TokenizerCoreTest, DecodeRejectsOutOfRangeIds) {
  auto t = MakeTokenizer({{"x", -1, kN}});
  EXPECT_EQ(t->Decode({262, 263}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Decode({-1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerCoreTest, EndOfGenerationIdsAreEosAndEndOfTurn) {
  auto t = MakeTokenizer({{"x", -1, kN}});
  EXPECT_EQ(t->end_of_generation_ids(), (Ids{1, 5}));
  EXPECT_TRUE(t->IsEndOfGeneration(5));
  EXPECT_FALSE(t->IsEndOfGeneration(4));
  EXPECT_EQ(t->PieceToId("<end_of_turn>"), 5);
  EXPECT_EQ(t->PieceToId("nope"), -1);
}

TEST(TokenizerCoreTest, InconsistentVocabulariesAreRejectedNamingTheKey) {
  auto expect_error = [](TokenizerVocab v, const std::string& key) {
    auto t = Tokenizer::FromVocab(std::move(v));
    ASSERT_FALSE(t.ok()) << key;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(t.status().message()).find(key), std::string::npos) << t.status();
  };
  TokenizerVocab v = MakeVocab({{"x", -1, kN}});
  v.scores.pop_back();
  expect_error(v, "tokenizer.ggml.scores");
  v = MakeVocab({{"x", -1, kN}});
  v.types.push_back(TokenType::kNormal);
  expect_error(v, "tokenizer.ggml.token_type");
  v = MakeVocab({{"x", -1, kN}, {"x", -1, kN}});
  expect_error(v, "tokenizer.ggml.tokens");
  v = MakeVocab({{"", -1, kN}});
  expect_error(v, "tokenizer.ggml.tokens");
  v = MakeVocab({});
  v.bos_id = 100000;
  expect_error(v, "tokenizer.ggml.bos_token_id");
  v = MakeVocab({});
  v.eos_id = -7;
  expect_error(v, "tokenizer.ggml.eos_token_id");
  expect_error(TokenizerVocab{}, "tokenizer.ggml.tokens");
}

}  // namespace
}  // namespace decoded
