#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/tokenizer/real_tokenizer.h"
#include "tests/tokenizer/test_vocab.h"
#include "tests/tokenizer/utf8_oracle.h"

namespace decoded {
namespace {

using ::decoded::testing::ByteId;
using ::decoded::testing::MakeTokenizer;
using ::decoded::testing::OracleToValidUtf8;

constexpr TokenType kN = TokenType::kNormal;

std::vector<std::string> PushAll(const Tokenizer& t, const std::vector<int32_t>& ids) {
  IncrementalDetokenizer d(&t);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(d.Push(id));
  out.push_back(d.Flush());
  return out;
}

TEST(IncrementalDetokenizerTest, EmojiSplitAcrossByteTokensIsEmittedWhole) {
  auto t = MakeTokenizer({{"a", -1, kN}});
  // U+1F600 = F0 9F 98 80.
  EXPECT_EQ(PushAll(*t, {262, ByteId(0xF0), ByteId(0x9F), ByteId(0x98), ByteId(0x80), 262}),
            (std::vector<std::string>{"a", "", "", "", "\xF0\x9F\x98\x80", "a", ""}));
}

TEST(IncrementalDetokenizerTest, CjkSplitAcrossByteTokensIsEmittedWhole) {
  auto t = MakeTokenizer({{"a", -1, kN}});
  // U+4E2D = E4 B8 AD.
  EXPECT_EQ(PushAll(*t, {ByteId(0xE4), ByteId(0xB8), ByteId(0xAD)}),
            (std::vector<std::string>{"", "", "\xE4\xB8\xAD", ""}));
}

TEST(IncrementalDetokenizerTest, InvalidBytesBecomeReplacementCharacters) {
  auto t = MakeTokenizer({{"a", -1, kN}});
  const std::string kFffd = "\xEF\xBF\xBD";
  // A stray continuation byte, then a lead byte interrupted by 'a'.
  EXPECT_EQ(PushAll(*t, {ByteId(0x80), ByteId(0xE4), 262}),
            (std::vector<std::string>{kFffd, "", kFffd + "a", ""}));
  // Overlong C0 80 and surrogate ED A0 80 are invalid too.
  EXPECT_EQ(PushAll(*t, {ByteId(0xC0), ByteId(0x80)}), (std::vector<std::string>{kFffd, kFffd, ""}));
  EXPECT_EQ(PushAll(*t, {ByteId(0xED), ByteId(0xA0)}), (std::vector<std::string>{"", kFffd + kFffd, ""}));
}

TEST(IncrementalDetokenizerTest, FlushReplacesAnUnfinishedSequence) {
  auto t = MakeTokenizer({{"a", -1, kN}});
  EXPECT_EQ(PushAll(*t, {262, ByteId(0xF0), ByteId(0x9F)}),
            (std::vector<std::string>{"a", "", "", "\xEF\xBF\xBD"}));
}

TEST(IncrementalDetokenizerTest, RealVocabularyStreamNeverSplitsACodePoint) {
  DECODED_REQUIRE_REAL_MODEL();
  const Tokenizer* t = ::decoded::testing::RealTokenizer();
  ASSERT_NE(t, nullptr);
  const std::string text = "Rare 𠜎𠝹 and emoji 👨‍👩‍👧‍👦🤖 with 中文 and ünïcödé.";
  const std::vector<int32_t> ids = t->Encode(text, true, false);
  int byte_tokens = 0;
  for (int32_t id : ids) byte_tokens += t->type(id) == TokenType::kByte;
  ASSERT_GT(byte_tokens, 0) << "the text should exercise byte fallback";
  IncrementalDetokenizer d(t);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = d.Push(id);
    EXPECT_EQ(OracleToValidUtf8(piece), piece) << "after id " << id;
    all += piece;
  }
  all += d.Flush();
  EXPECT_EQ(all, text);
}

}  // namespace
}  // namespace decoded
