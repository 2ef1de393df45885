#include "engine/chat/jinja_unicode.h"

#include <algorithm>
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

std::vector<char32_t> Decode(std::string_view s) {
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) cps.push_back(DecodeUtf8At(s, &pos));
  return cps;
}

constexpr char32_t kCapitalSigma = 0x3A3;

// Unicode's Final_Sigma condition for the capital sigma at cps[i]: a cased letter before it and none after it,
// case-ignorable characters skipped on both sides.
bool IsFinalSigma(const std::vector<char32_t>& cps, size_t i) {
  size_t j = i;
  while (j > 0 && IsCaseIgnorable(cps[j - 1])) --j;
  if (j == 0 || !IsCased(cps[j - 1])) return false;
  size_t k = i + 1;
  while (k < cps.size() && IsCaseIgnorable(cps[k])) ++k;
  return k == cps.size() || !IsCased(cps[k]);
}

// Lowercases cps[i] in the context of the whole string (only the capital sigma depends on it).
void AppendLowerAt(const std::vector<char32_t>& cps, size_t i, std::string* out) {
  if (cps[i] == kCapitalSigma) {
    AppendUtf8(IsFinalSigma(cps, i) ? 0x3C2 : 0x3C3, out);
    return;
  }
  AppendMapped(kLowerMap, cps[i], out);
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

std::vector<size_t> CodePointOffsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) offsets.push_back(i);
  }
  offsets.push_back(s.size());
  return offsets;
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
  const std::vector<char32_t> cps = Decode(s);
  for (size_t i = 0; i < cps.size(); ++i) AppendLowerAt(cps, i, &out);
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
  const std::vector<char32_t> cps = Decode(s);
  bool previous_is_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (previous_is_cased) {
      AppendLowerAt(cps, i, &out);
    } else {
      AppendTitle(cps[i], &out);
    }
    previous_is_cased = IsCased(cps[i]);
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const std::vector<char32_t> cps = Decode(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      AppendTitle(cps[i], &out);
    } else {
      AppendLowerAt(cps, i, &out);
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
