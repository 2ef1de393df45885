#include "engine/chat/jinja_unicode.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>

namespace decoded::jinja {
namespace {

struct CodePointRange {
  char32_t lo, hi;
};
struct CaseMapping {
  char32_t cp;
  char32_t to[3];  // 0-terminated when shorter than 3
};

#include "engine/chat/jinja_unicode_tables.inc"

template <size_t N>
bool InRanges(const CodePointRange (&table)[N], char32_t cp) {
  const auto* it = std::upper_bound(std::begin(table), std::end(table), cp,
                                    [](char32_t c, const CodePointRange& r) { return c < r.lo; });
  if (it == std::begin(table)) return false;
  --it;
  return cp <= it->hi;
}

template <size_t N>
const CaseMapping* FindMapping(const CaseMapping (&table)[N], char32_t cp) {
  const auto* it = std::lower_bound(std::begin(table), std::end(table), cp,
                                    [](const CaseMapping& m, char32_t c) { return m.cp < c; });
  if (it == std::end(table) || it->cp != cp) return nullptr;
  return it;
}

template <size_t N>
void AppendMapped(const CaseMapping (&table)[N], char32_t cp, std::string* out) {
  const CaseMapping* m = FindMapping(table, cp);
  if (m == nullptr) {
    AppendUtf8(cp, out);
    return;
  }
  for (char32_t c : m->to) {
    if (c == 0) break;
    AppendUtf8(c, out);
  }
}

constexpr char32_t kCapitalSigma = 0x3A3;

// Unicode's Final_Sigma condition for the capital sigma at bytes [begin, end) of `s`: a cased letter before it and
// none after it, case-ignorable characters skipped on both sides.
bool IsFinalSigma(std::string_view s, size_t begin, size_t end) {
  size_t p = begin;
  bool cased_before = false;
  while (p > 0) {
    const char32_t c = DecodeUtf8Before(s, &p);
    if (!IsCaseIgnorable(c)) {
      cased_before = IsCased(c);
      break;
    }
  }
  if (!cased_before) return false;
  p = end;
  while (p < s.size()) {
    const char32_t c = DecodeUtf8At(s, &p);
    if (!IsCaseIgnorable(c)) return !IsCased(c);
  }
  return true;
}

// Lowercases the code point `cp` at bytes [begin, end) of `s` (only the capital sigma depends on its context).
void AppendLowerAt(std::string_view s, size_t begin, size_t end, char32_t cp, std::string* out) {
  if (cp == kCapitalSigma) {
    AppendUtf8(IsFinalSigma(s, begin, end) ? 0x3C2 : 0x3C3, out);
    return;
  }
  AppendMapped(kLowerMap, cp, out);
}

void AppendTitle(char32_t cp, std::string* out) { AppendMapped(kTitleMap, cp, out); }

}  // namespace

char32_t DecodeUtf8At(std::string_view s, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(s[*pos]);
  int len = 1;
  char32_t cp = b0;
  if (b0 >= 0xF0) {
    len = 4;
    cp = b0 & 0x07;
  } else if (b0 >= 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
  } else if (b0 >= 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  }
  if (*pos + len > s.size()) {
    *pos = s.size();
    return 0xFFFD;
  }
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + k]) & 0x3F);
  *pos += len;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view s, size_t* bad_offset) {
  size_t i = 0;
  const size_t n = s.size();
  auto cont = [&](size_t k) { return k < n && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80; };
  while (i < n) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    if (b < 0x80) {
      len = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      len = cont(i + 1) ? 2 : 0;
    } else if (b >= 0xE0 && b <= 0xEF) {
      if (cont(i + 1) && cont(i + 2)) {
        const auto b1 = static_cast<unsigned char>(s[i + 1]);
        const bool overlong = b == 0xE0 && b1 < 0xA0;
        const bool surrogate = b == 0xED && b1 >= 0xA0;
        if (!overlong && !surrogate) len = 3;
      }
    } else if (b >= 0xF0 && b <= 0xF4) {
      if (cont(i + 1) && cont(i + 2) && cont(i + 3)) {
        const auto b1 = static_cast<unsigned char>(s[i + 1]);
        const bool overlong = b == 0xF0 && b1 < 0x90;
        const bool too_big = b == 0xF4 && b1 >= 0x90;
        if (!overlong && !too_big) len = 4;
      }
    }
    if (len == 0) {
      if (bad_offset != nullptr) *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

bool IsAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

char32_t DecodeUtf8Before(std::string_view s, size_t* pos) {
  size_t start = *pos - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t p = start;
  const char32_t c = DecodeUtf8At(s, &p);
  *pos = start;
  return c;
}

size_t ByteOffsetOf(std::string_view s, size_t index) {
  size_t seen = 0;
  size_t i = 0;
  while (i < s.size()) {
    // Eight ASCII bytes at a time where possible.
    uint64_t word;
    if (i + 8 <= s.size() && seen + 8 <= index) {
      std::memcpy(&word, s.data() + i, 8);
      if ((word & 0x8080808080808080ULL) == 0) {
        i += 8;
        seen += 8;
        continue;
      }
    }
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (seen == index) return i;
      ++seen;
    }
    ++i;
  }
  return s.size();
}

bool IsSpace(char32_t cp) { return InRanges(kSpace, cp); }
bool IsPrintable(char32_t cp) { return InRanges(kPrintable, cp); }
bool IsAlpha(char32_t cp) { return InRanges(kAlpha, cp); }
bool IsAlnum(char32_t cp) { return InRanges(kAlnum, cp); }
bool IsDigit(char32_t cp) { return InRanges(kDigit, cp); }
bool IsLowerChar(char32_t cp) { return InRanges(kLowerFlag, cp); }
bool IsUpperChar(char32_t cp) { return InRanges(kUpperFlag, cp); }
bool IsTitleChar(char32_t cp) { return InRanges(kTitleFlag, cp); }
bool IsCased(char32_t cp) { return InRanges(kCased, cp); }
bool IsCaseIgnorable(char32_t cp) { return InRanges(kCaseIgnorable, cp); }

std::string PyLower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (IsAscii(s)) {
    for (char c : s) out.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
    return out;
  }
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t begin = pos;
    const char32_t c = DecodeUtf8At(s, &pos);
    AppendLowerAt(s, begin, pos, c, &out);
  }
  return out;
}

std::string PyUpper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) AppendMapped(kUpperMap, DecodeUtf8At(s, &pos), &out);
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool previous_is_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t begin = pos;
    const char32_t c = DecodeUtf8At(s, &pos);
    if (previous_is_cased) {
      AppendLowerAt(s, begin, pos, c, &out);
    } else {
      AppendTitle(c, &out);
    }
    previous_is_cased = IsCased(c);
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t begin = pos;
    const char32_t c = DecodeUtf8At(s, &pos);
    if (begin == 0) {
      AppendTitle(c, &out);
    } else {
      AppendLowerAt(s, begin, pos, c, &out);
    }
  }
  return out;
}

bool PyIsUpper(std::string_view s) {
  bool cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = DecodeUtf8At(s, &pos);
    if (IsLowerChar(cp) || IsTitleChar(cp)) return false;
    if (IsUpperChar(cp)) cased = true;
  }
  return cased;
}

bool PyIsLower(std::string_view s) {
  bool cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = DecodeUtf8At(s, &pos);
    if (IsUpperChar(cp) || IsTitleChar(cp)) return false;
    if (IsLowerChar(cp)) cased = true;
  }
  return cased;
}

std::string_view UnicodeVersion() { return kUnicodeVersion; }

}  // namespace decoded::jinja
