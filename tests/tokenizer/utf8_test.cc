// Utf8Sanitizer / ToValidUtf8 against the Unicode Standard (chapter 3,
// §3.9 "U+FFFD Substitution of Maximal Subparts"): its worked examples are
// written here as data, and the Table 3-7 oracle of utf8_oracle.h checks
// every short sequence over the bytes where the table's ranges change.
#include "engine/tokenizer/utf8.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/tokenizer/utf8_oracle.h"

namespace decoded {
namespace {

using ::decoded::testing::OracleToValidUtf8;

std::string Bytes(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

// Code points -> UTF-8 (only well-formed scalar values are used here).
std::string CodePoints(std::initializer_list<char32_t> cps) {
  std::string s;
  for (char32_t c : cps) {
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      s.push_back(static_cast<char>(0xC0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      s.push_back(static_cast<char>(0xE0 | (c >> 12)));
      s.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      s.push_back(static_cast<char>(0xF0 | (c >> 18)));
      s.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return s;
}

struct StandardExample {
  const char* name;
  std::string input;
  std::string expected;
};

// The Unicode Standard, chapter 3, §3.9: the example under D93b and
// Tables 3-8 to 3-11.
std::vector<StandardExample> StandardExamples() {
  constexpr char32_t R = 0xFFFD;
  return {
      {"D93b example", Bytes({0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2, 0x62, 0x80, 0x63, 0x80, 0xBF, 0x64}),
       CodePoints({0x61, R, R, R, 0x62, R, 0x63, R, R, 0x64})},
      {"Table 3-8 non-shortest forms", Bytes({0xC0, 0xAF, 0xE0, 0x80, 0xBF, 0xF0, 0x81, 0x82, 0x41}),
       CodePoints({R, R, R, R, R, R, R, R, 0x41})},
      {"Table 3-9 surrogates", Bytes({0xED, 0xA0, 0x80, 0xED, 0xBF, 0xBF, 0xED, 0xAF, 0x41}),
       CodePoints({R, R, R, R, R, R, R, R, 0x41})},
      {"Table 3-10 other ill-formed", Bytes({0xF4, 0x91, 0x92, 0x93, 0xFF, 0x41, 0x80, 0xBF, 0x42}),
       CodePoints({R, R, R, R, R, 0x41, R, R, 0x42})},
      {"Table 3-11 truncated", Bytes({0xE1, 0x80, 0xE2, 0xF0, 0x91, 0x92, 0xF1, 0xBF, 0x41}),
       CodePoints({R, R, R, R, 0x41})},
  };
}

TEST(Utf8Test, StandardExamplesSubstituteOneReplacementPerMaximalSubpart) {
  for (const StandardExample& e : StandardExamples()) {
    EXPECT_EQ(ToValidUtf8(e.input), e.expected) << e.name;
  }
}

TEST(Utf8Test, StandardExamplesGiveTheSameTextWhateverTheSplit) {
  // Every way of cutting the input into two or three pieces.
  for (const StandardExample& e : StandardExamples()) {
    const size_t n = e.input.size();
    for (size_t a = 0; a <= n; ++a) {
      for (size_t b = a; b <= n; ++b) {
        Utf8Sanitizer s;
        std::string out;
        s.Append(std::string_view(e.input).substr(0, a), out);
        s.Append(std::string_view(e.input).substr(a, b - a), out);
        s.Append(std::string_view(e.input).substr(b), out);
        s.Finish(out);
        EXPECT_EQ(out, e.expected) << e.name << " split at " << a << ", " << b;
      }
    }
  }
}

TEST(Utf8Test, WellFormedBoundaryCodePointsPassThrough) {
  // The first and last code point of each row of Table 3-7.
  const std::string text = CodePoints({0x00, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xCFFF, 0xD000, 0xD7FF,
                                       0xE000, 0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0xFFFFF, 0x100000, 0x10FFFF});
  EXPECT_EQ(ToValidUtf8(text), text);
}

TEST(Utf8Test, IncompleteSequenceIsHeldUntilItCompletesOrTheStreamEnds) {
  Utf8Sanitizer s;
  std::string out;
  s.Append("a\xF0\x9F", out);  // U+1F600 = F0 9F 98 80, cut after two bytes
  EXPECT_EQ(out, "a");
  EXPECT_TRUE(s.has_pending());
  s.Append("\x98", out);
  EXPECT_EQ(out, "a");
  s.Append("\x80", out);
  EXPECT_EQ(out, "a\xF0\x9F\x98\x80");
  EXPECT_FALSE(s.has_pending());
  s.Append("\xE2\x82", out);
  s.Finish(out);
  EXPECT_EQ(out, "a\xF0\x9F\x98\x80\xEF\xBF\xBD");
  EXPECT_FALSE(s.has_pending());
}

// Every sequence of up to 4 bytes drawn from the bytes where some range of
// Table 3-7 begins or ends (and their neighbours), whole and byte by byte.
TEST(Utf8Test, AllShortSequencesOverRangeEdgesMatchTheTableOracle) {
  const std::vector<uint8_t> edges = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
                                      0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF};
  const size_t k = edges.size();
  int mismatches = 0;
  for (int len = 1; len <= 4; ++len) {
    size_t total = 1;
    for (int i = 0; i < len; ++i) total *= k;
    for (size_t code = 0; code < total; ++code) {
      std::string in;
      for (size_t c = code, i = 0; i < static_cast<size_t>(len); ++i, c /= k) {
        in.push_back(static_cast<char>(edges[c % k]));
      }
      const std::string expected = OracleToValidUtf8(in);
      std::string streamed;
      Utf8Sanitizer s;
      for (char ch : in) s.Append(std::string_view(&ch, 1), streamed);
      s.Finish(streamed);
      const std::string whole = ToValidUtf8(in);
      if (whole != expected || streamed != expected) {
        if (++mismatches <= 10) ADD_FAILURE() << "input bytes " << ::testing::PrintToString(in);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// The encoder's repair (llama.cpp's per-byte rule): worked by hand from
// Table 3-7, and contrasted with the maximal-subpart rule where they differ.
TEST(Utf8PerByteTest, EachByteThatBeginsNoWellFormedSequenceBecomesOneReplacement) {
  const std::string r(kReplacementCharacter);
  EXPECT_EQ(ToValidUtf8PerByte(""), "");
  EXPECT_EQ(ToValidUtf8PerByte(CodePoints({'a', 0xE9, 0x4E2D, 0x1F600})), CodePoints({'a', 0xE9, 0x4E2D, 0x1F600}));
  // A sequence cut short: one U+FFFD per byte (the maximal-subpart rule gives one).
  EXPECT_EQ(ToValidUtf8PerByte(Bytes({0xE4, 0xB8, 'b'})), r + r + "b");
  EXPECT_EQ(ToValidUtf8(Bytes({0xE4, 0xB8, 'b'})), r + "b");
  EXPECT_EQ(ToValidUtf8PerByte(Bytes({'x', 0xF0, 0x9F, 0x98})), "x" + r + r + r);
  // The byte after a broken lead byte starts afresh.
  EXPECT_EQ(ToValidUtf8PerByte(Bytes({0xC3, '(', 0xC3, 0xA9})), r + "(" + CodePoints({0xE9}));
  EXPECT_EQ(ToValidUtf8PerByte(Bytes({0x80, 0xBF, 0xFF, 0xF8})), r + r + r + r);
  // Overlong forms, surrogates and code points above U+10FFFF, which
  // llama.cpp decodes, passes through or aborts on, lose every byte.
  EXPECT_EQ(ToValidUtf8PerByte(Bytes({0xC0, 0xAF})), r + r);
  EXPECT_EQ(ToValidUtf8PerByte(Bytes({0xE0, 0x80, 0xAF})), r + r + r);
  EXPECT_EQ(ToValidUtf8PerByte(Bytes({0xED, 0xA0, 0x80})), r + r + r);
  EXPECT_EQ(ToValidUtf8PerByte(Bytes({0xF4, 0x90, 0x80, 0x80})), r + r + r + r);
  EXPECT_EQ(ToValidUtf8PerByte(Bytes({0xF4, 0x8F, 0xBF, 0xBF})), Bytes({0xF4, 0x8F, 0xBF, 0xBF}));
}

}  // namespace
}  // namespace decoded
