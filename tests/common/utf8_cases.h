// The UTF-8 definition written as data, for tests of code that validates
// text: the table of well-formed byte sequences (Unicode 15.0 Table 3-7, the
// same set as RFC 3629 section 4), a reference scan that only matches against
// that table, and hand-picked ill-formed and well-formed strings with the
// offsets the definition gives them (defects named in engine/utf8_validation.h's
// vocabulary).
#ifndef DECODED_TESTS_COMMON_UTF8_CASES_H_
#define DECODED_TESTS_COMMON_UTF8_CASES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/utf8_validation.h"

namespace decoded::testing {

// One row of Table 3-7: a sequence of `length` bytes, byte k in [lo[k], hi[k]].
struct WellFormedRow {
  int length;
  uint8_t lo[4];
  uint8_t hi[4];
};

inline constexpr WellFormedRow kWellFormedUtf8[] = {
    {1, {0x00}, {0x7F}},                                  // U+0000..U+007F
    {2, {0xC2, 0x80}, {0xDF, 0xBF}},                      // U+0080..U+07FF
    {3, {0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}},          // U+0800..U+0FFF
    {3, {0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}},          // U+1000..U+CFFF
    {3, {0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}},          // U+D000..U+D7FF
    {3, {0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}},          // U+E000..U+FFFF
    {4, {0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}},  // U+10000..U+3FFFF
    {4, {0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}},  // U+40000..U+FFFFF
    {4, {0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}},  // U+100000..U+10FFFF
};

// Length of the longest prefix of `s` made of whole rows of the table: the
// offset of the first ill-formed sequence, or s.size() when there is none.
inline size_t ReferenceWellFormedPrefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int matched = 0;
    for (const WellFormedRow& row : kWellFormedUtf8) {
      if (i + row.length > s.size()) continue;
      bool in_range = true;
      for (int k = 0; k < row.length && in_range; ++k) {
        const uint8_t b = static_cast<uint8_t>(s[i + k]);
        in_range = b >= row.lo[k] && b <= row.hi[k];
      }
      if (in_range) {
        matched = row.length;
        break;
      }
    }
    if (matched == 0) return i;
    i += matched;
  }
  return s.size();
}

struct IllFormedUtf8Case {
  const char* name;
  std::string bytes;
  size_t offset;  // first byte of the first ill-formed sequence
  Utf8Defect defect;  // what that sequence breaks
};

inline std::vector<IllFormedUtf8Case> IllFormedUtf8Cases() {
  using K = Utf8Defect;
  return {
      {"latin1_e_acute_at_end", "caf\xE9", 3, K::kTruncated},
      {"invalid_byte_at_start", "\xFF" "abc", 0, K::kNeverUsedByte},
      {"stray_continuation_in_middle", "ab\x80" "cd", 2, K::kStrayContinuation},
      {"truncated_2_byte_at_end", "abc\xC3", 3, K::kTruncated},
      {"truncated_3_byte_at_end", "a\xE2\x82", 1, K::kTruncated},
      {"truncated_3_byte_in_middle", "a\xE2\x82z", 1, K::kTruncated},
      {"truncated_4_byte_at_end", "a\xF0\x9F\x98", 1, K::kTruncated},
      {"truncated_4_byte_after_one", "\xF0\x9F" "ab", 0, K::kTruncated},
      {"overlong_2_byte_slash", "\xC0\xAF", 0, K::kOverlong},
      {"overlong_2_byte_c1", "x\xC1\xBF", 1, K::kOverlong},
      {"overlong_3_byte", "x\xE0\x80\xAF", 1, K::kOverlong},
      {"overlong_4_byte", "\xF0\x80\x80\xAF", 0, K::kOverlong},
      {"high_surrogate", "ok\xED\xA0\x80", 2, K::kSurrogate},
      {"low_surrogate", "\xED\xBF\xBF", 0, K::kSurrogate},
      {"above_max_f4", "\xF4\x90\x80\x80", 0, K::kAboveMax},
      {"above_max_f5", "z\xF5\x80\x80\x80", 1, K::kAboveMax},
      {"invalid_after_two_byte_char", "\xC3\xA9\xE9", 2, K::kTruncated},
      {"invalid_after_four_byte_char", "\xF0\x9F\x98\x80\x80", 4, K::kStrayContinuation},
  };
}

// Well-formed strings, including the first and last code point of each
// encoding length and the neighbours of the surrogate range.
inline std::vector<std::string> WellFormedUtf8Cases() {
  return {
      "",
      "plain ASCII",
      "caf\xC3\xA9",                  // café
      "\xC2\x80",                     // U+0080
      "\xDF\xBF",                     // U+07FF
      "\xE0\xA0\x80",                 // U+0800
      "\xED\x9F\xBF",                 // U+D7FF
      "\xEE\x80\x80",                 // U+E000
      "\xEF\xBF\xBF",                 // U+FFFF
      "\xF0\x90\x80\x80",             // U+10000
      "\xF4\x8F\xBF\xBF",             // U+10FFFF
      "\xE2\x82\xAC 5 \xF0\x9F\x98\x80 \xE4\xB8\xAD\xE6\x96\x87",  // € 5 😀 中文
  };
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_UTF8_CASES_H_
