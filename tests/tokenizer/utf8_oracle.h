// A test oracle for U+FFFD substitution, written straight from the Unicode
// Standard's data rather than from engine/tokenizer/utf8.cc: Table 3-7
// ("Well-Formed UTF-8 Byte Sequences") as rows of byte ranges, and definition
// D93b (maximal subpart) applied literally: at each position take the longest
// prefix of the remaining bytes that is a prefix of some row; a whole row is a
// code point, anything shorter (at least one byte) is one U+FFFD.
#ifndef DECODED_TESTS_TOKENIZER_UTF8_ORACLE_H_
#define DECODED_TESTS_TOKENIZER_UTF8_ORACLE_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

namespace decoded::testing {

struct ByteRange {
  uint8_t lo, hi;
};

struct Table37Row {
  int length;
  ByteRange bytes[4];
};

// Unicode Standard, Table 3-7, one row per line.
inline constexpr Table37Row kTable37[] = {
    {1, {{0x00, 0x7F}}},                                          // U+0000..U+007F
    {2, {{0xC2, 0xDF}, {0x80, 0xBF}}},                            // U+0080..U+07FF
    {3, {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}}},              // U+0800..U+0FFF
    {3, {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}}},              // U+1000..U+CFFF
    {3, {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}}},              // U+D000..U+D7FF
    {3, {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}}},              // U+E000..U+FFFF
    {4, {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}}},  // U+10000..U+3FFFF
    {4, {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}}},  // U+40000..U+FFFFF
    {4, {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}}},  // U+100000..U+10FFFF
};

// How many leading bytes of `s` match `row` (at most row.length).
inline int MatchedPrefix(std::string_view s, const Table37Row& row) {
  int n = 0;
  while (n < row.length && n < static_cast<int>(s.size())) {
    const uint8_t b = static_cast<uint8_t>(s[n]);
    if (b < row.bytes[n].lo || b > row.bytes[n].hi) break;
    ++n;
  }
  return n;
}

inline std::string OracleToValidUtf8(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    int best = 0;
    bool whole = false;
    for (const Table37Row& row : kTable37) {
      const int n = MatchedPrefix(s.substr(i), row);
      if (n > best) {
        best = n;
        whole = n == row.length;
      }
    }
    if (whole) {
      out.append(s.substr(i, best));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += std::max(best, 1);
  }
  return out;
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_TOKENIZER_UTF8_ORACLE_H_
