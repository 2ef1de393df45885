// The UTF-8 definition as data, for tests of code that validates text: the
// longest well-formed prefix by Table 3-7 of the Unicode Standard (the same
// set as RFC 3629 section 4; the table is tests/tokenizer/utf8_oracle.h's),
// and hand-picked ill-formed and well-formed strings with the offsets the
// definition gives them (defects named in engine/utf8_validation.h's
// vocabulary).
#ifndef DECODED_TESTS_COMMON_UTF8_CASES_H_
#define DECODED_TESTS_COMMON_UTF8_CASES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/utf8_validation.h"
#include "tests/tokenizer/utf8_oracle.h"

namespace decoded::testing {

// Length of the longest prefix of `s` made of whole rows of Table 3-7: the
// offset of the first ill-formed sequence, or s.size() when there is none.
inline size_t ReferenceWellFormedPrefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int whole = 0;
    for (const Table37Row& row : kTable37) {
      if (MatchedPrefix(s.substr(i), row) == row.length) {
        whole = row.length;
        break;
      }
    }
    if (whole == 0) return i;
    i += whole;
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
