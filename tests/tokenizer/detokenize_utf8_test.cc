// Every way the daemon turns ids into text gives valid UTF-8, and the ways
// agree, on the real Gemma 3 vocabulary (its 256 byte tokens <0x00>..<0xFF>
// can spell any byte sequence):
//   whole    Tokenizer::Detokenize(ids, render_special = false / true), which
//            Engine::Detokenize (the Detokenize RPC) returns;
//   stream   IncrementalDetokenizer::Push per id + Flush (TokenEvent.text);
//   single   Detokenize({id}, false) per id (TokenLogprob.text).
// Validity is judged independently of our scanner: C++ protobuf refuses to
// parse a proto3 `string` field holding invalid UTF-8 (checked below), which
// is exactly how a client fails on a bad reply. The text itself is checked
// against the Table 3-7 oracle applied to the raw bytes (Tokenizer::Decode,
// itself checked against llama.cpp in tokenizer_reference_test).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "proto/decoded.pb.h"
#include "tests/common/model_path.h"
#include "tests/tokenizer/real_tokenizer.h"
#include "tests/tokenizer/utf8_oracle.h"

namespace decoded {
namespace {

using ::decoded::testing::OracleToValidUtf8;
using ::decoded::testing::RealTokenizer;

// Wire bytes of a DetokenizeResponse whose field 1 (proto3 `string text`)
// holds `s`, built by hand so that no serializer check is involved.
std::string DetokenizeResponseWire(const std::string& s) {
  std::string wire = "\x0A";  // field 1, wire type 2 (length-delimited)
  for (uint64_t n = s.size(); ; n >>= 7) {
    if (n < 0x80) {
      wire.push_back(static_cast<char>(n));
      break;
    }
    wire.push_back(static_cast<char>(0x80 | (n & 0x7F)));
  }
  return wire + s;
}

bool ProtobufAcceptsAsString(const std::string& s) {
  v1::DetokenizeResponse response;
  return response.ParseFromString(DetokenizeResponseWire(s)) && response.text() == s;
}

TEST(DetokenizeUtf8Test, ProtobufRejectsIllFormedUtf8InAProto3String) {
  // Well-formed and ill-formed per the Unicode Standard's Table 3-7.
  for (const std::string good : {"", "plain", "\xC2\x80", "\xE2\x82\xAC", "\xED\x9F\xBF", "\xF4\x8F\xBF\xBF"}) {
    EXPECT_TRUE(ProtobufAcceptsAsString(good)) << ::testing::PrintToString(good);
  }
  for (const std::string bad : {"\x80", "\xC0\x80", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                                "\xE2\x82", "a\xFF", "\xF8\x88\x80\x80\x80"}) {
    EXPECT_FALSE(ProtobufAcceptsAsString(bad)) << ::testing::PrintToString(bad);
  }
}

class RealVocabularyTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DECODED_REQUIRE_REAL_MODEL();
    t_ = RealTokenizer();
    ASSERT_NE(t_, nullptr);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      byte_ids_[b] = t_->PieceToId(name);
      ASSERT_GE(byte_ids_[b], 0) << name;
      ASSERT_EQ(t_->type(byte_ids_[b]), TokenType::kByte) << name;
    }
  }

  bool IsSpecial(int32_t id) const {
    const TokenType type = t_->type(id);
    return type == TokenType::kControl || type == TokenType::kUnknown;
  }

  // Checks every path on `ids`; returns the number of failed checks (each
  // also recorded as a test failure, the first few in detail).
  int CheckAllPaths(const std::vector<int32_t>& ids) {
    int failures = 0;
    auto check = [&](bool ok, const char* what) {
      if (ok) return;
      if (++failures_total_ <= 20) ADD_FAILURE() << what << " for ids " << ::testing::PrintToString(ids);
      ++failures;
    };
    absl::StatusOr<std::string> plain = t_->Detokenize(ids, false);
    absl::StatusOr<std::string> rendered = t_->Detokenize(ids, true);
    absl::StatusOr<std::string> raw_plain = t_->Decode(ids, false);
    absl::StatusOr<std::string> raw_rendered = t_->Decode(ids, true);
    if (!plain.ok() || !rendered.ok() || !raw_plain.ok() || !raw_rendered.ok()) {
      check(false, "a decode failed");
      return failures;
    }
    check(ProtobufAcceptsAsString(*plain), "whole text (render_special=false) is not valid UTF-8");
    check(ProtobufAcceptsAsString(*rendered), "whole text (render_special=true) is not valid UTF-8");
    check(*plain == OracleToValidUtf8(*raw_plain), "whole text (render_special=false) differs from the oracle");
    check(*rendered == OracleToValidUtf8(*raw_rendered), "whole text (render_special=true) differs from the oracle");

    IncrementalDetokenizer stream(t_);
    IncrementalDetokenizer stream_rendered(t_, /*render_special=*/true);
    std::string streamed, streamed_rendered;
    bool any_special = false;
    for (int32_t id : ids) {
      any_special |= IsSpecial(id);
      const std::string piece = stream.Push(id);
      check(ProtobufAcceptsAsString(piece), "a streamed piece is not valid UTF-8");
      streamed += piece;
      streamed_rendered += stream_rendered.Push(id);
      const int32_t one[] = {id};
      absl::StatusOr<std::string> single = t_->Detokenize(one, false);
      check(single.ok() && ProtobufAcceptsAsString(*single), "a single token's text is not valid UTF-8");
    }
    const std::string tail = stream.Flush();
    check(ProtobufAcceptsAsString(tail), "the flushed tail is not valid UTF-8");
    streamed += tail;
    streamed_rendered += stream_rendered.Flush();
    check(streamed == *plain, "streamed text differs from Detokenize(render_special=false)");
    check(streamed_rendered == *rendered, "streamed rendered text differs from Detokenize(render_special=true)");
    if (!any_special) check(*rendered == *plain, "render_special changes text without control tokens");
    return failures;
  }

  const Tokenizer* t_ = nullptr;
  int32_t byte_ids_[256];
  int failures_total_ = 0;
};

TEST_F(RealVocabularyTextTest, IssueExamplesFollowTheMaximalSubpartRule) {
  // <0xED><0xA0><0x80>: a surrogate's encoding, three maximal subparts
  // (Table 3-9). <0xE2><0x82> A: a truncated sequence, one (Table 3-11).
  const std::string r = "\xEF\xBF\xBD";
  for (bool render : {false, true}) {
    EXPECT_EQ(t_->Detokenize(std::vector<int32_t>{475, 398, 366}, render).value_or("?"), r + r + r) << render;
    EXPECT_EQ(t_->Detokenize(std::vector<int32_t>{464, 368, 236776}, render).value_or("?"), r + "A") << render;
  }
  EXPECT_EQ(byte_ids_[0xED], 475);
  EXPECT_EQ(byte_ids_[0xE2], 464);
}

TEST_F(RealVocabularyTextTest, RenderedControlTokenEndsAnIncompleteSequence) {
  const int32_t eot = t_->PieceToId("<end_of_turn>");
  ASSERT_GE(eot, 0);
  const std::vector<int32_t> ids = {byte_ids_[0xE2], byte_ids_[0x82], eot, byte_ids_[0xAC]};
  EXPECT_EQ(t_->Detokenize(ids, true).value_or("?"), "\xEF\xBF\xBD<end_of_turn>\xEF\xBF\xBD");
  // Unrendered, the control token adds no text and the sequence completes.
  EXPECT_EQ(t_->Detokenize(ids, false).value_or("?"), "\xE2\x82\xAC");
}

TEST_F(RealVocabularyTextTest, EverySingleByteToken) {
  for (int b = 0; b < 256; ++b) {
    const std::vector<int32_t> ids = {byte_ids_[b]};
    EXPECT_EQ(CheckAllPaths(ids), 0);
    // A lone byte is its character when ASCII, else one incomplete or
    // ill-formed sequence: one U+FFFD.
    const std::string expected = b < 0x80 ? std::string(1, static_cast<char>(b)) : "\xEF\xBF\xBD";
    EXPECT_EQ(t_->Detokenize(ids, false).value_or("?"), expected) << b;
  }
}

TEST_F(RealVocabularyTextTest, EveryPairOfByteTokens) {
  int failures = 0;
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) failures += CheckAllPaths({byte_ids_[a], byte_ids_[b]});
  }
  EXPECT_EQ(failures, 0);
}

TEST_F(RealVocabularyTextTest, RandomIdSequences) {
  std::vector<int32_t> normal, special, user_defined;
  for (int32_t id = 0; id < t_->vocab_size(); ++id) {
    switch (t_->type(id)) {
      case TokenType::kNormal: normal.push_back(id); break;
      case TokenType::kControl:
      case TokenType::kUnknown: special.push_back(id); break;
      case TokenType::kUserDefined: user_defined.push_back(id); break;
      default: break;
    }
  }
  ASSERT_FALSE(normal.empty());
  ASSERT_FALSE(special.empty());
  ASSERT_FALSE(user_defined.empty());
  std::mt19937_64 rng(0x5eed'0005);
  auto pick = [&](const std::vector<int32_t>& v) { return v[rng() % v.size()]; };
  // A code point from a random row of Table 3-7, as byte tokens, sometimes
  // cut short so that truncated sequences meet what follows.
  auto code_point_bytes = [&](std::vector<int32_t>& ids) {
    static constexpr char32_t kRanges[][2] = {{0x80, 0x7FF},     {0x800, 0xD7FF},     {0xE000, 0xFFFF},
                                              {0x10000, 0xFFFFF}, {0x100000, 0x10FFFF}};
    const auto& range = kRanges[rng() % 5];
    const char32_t c = range[0] + static_cast<char32_t>(rng() % (range[1] - range[0] + 1));
    uint8_t bytes[4];
    int n;
    if (c < 0x800) {
      bytes[0] = 0xC0 | (c >> 6), bytes[1] = 0x80 | (c & 0x3F), n = 2;
    } else if (c < 0x10000) {
      bytes[0] = 0xE0 | (c >> 12), bytes[1] = 0x80 | ((c >> 6) & 0x3F), bytes[2] = 0x80 | (c & 0x3F), n = 3;
    } else {
      bytes[0] = 0xF0 | (c >> 18), bytes[1] = 0x80 | ((c >> 12) & 0x3F), bytes[2] = 0x80 | ((c >> 6) & 0x3F);
      bytes[3] = 0x80 | (c & 0x3F), n = 4;
    }
    if (rng() % 3 == 0) n = 1 + static_cast<int>(rng() % (n - 1));
    for (int i = 0; i < n; ++i) ids.push_back(byte_ids_[bytes[i]]);
  };

  constexpr int kSequences = 100'000;
  int failures = 0, with_special = 0;
  std::vector<int32_t> ids;
  for (int s = 0; s < kSequences; ++s) {
    ids.clear();
    const int len = 1 + static_cast<int>(rng() % 12);
    while (static_cast<int>(ids.size()) < len) {
      const int kind = static_cast<int>(rng() % 100);
      if (kind < 35) {
        ids.push_back(byte_ids_[rng() % 256]);
      } else if (kind < 55) {
        code_point_bytes(ids);
      } else if (kind < 80) {
        ids.push_back(pick(normal));
      } else if (kind < 92) {
        ids.push_back(pick(special));
      } else {
        ids.push_back(pick(user_defined));
      }
    }
    for (int32_t id : ids) {
      if (IsSpecial(id)) {
        ++with_special;
        break;
      }
    }
    failures += CheckAllPaths(ids);
  }
  EXPECT_EQ(failures, 0);
  // Both agreement checks must have had work to do.
  EXPECT_GT(with_special, kSequences / 10);
  EXPECT_LT(with_special, kSequences * 9 / 10);
}

}  // namespace
}  // namespace decoded
