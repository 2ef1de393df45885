// Python str semantics on UTF-8 text, for the chat template renderer.
//
// Template values hold UTF-8 bytes, while Jinja (Python) measures, slices and case-maps strings by code point. This
// file is the one place that knows the difference. Character properties and case mappings come from
// jinja_unicode_tables.inc, measured from CPython 3.11's own str methods (Unicode 14.0.0) by
// tools/gen_chat_unicode_tables.py, so lower()/upper()/title()/capitalize()/isspace()/isprintable() agree with
// the Python that renders Hugging Face templates for every code point, SpecialCasing ('ß'.upper() == 'SS') and
// lower()'s final-sigma rule included. Characters assigned after Unicode 14 are treated as Python 3.11 treats them
// (unassigned: no case, not printable).
//
// All functions take valid UTF-8 (checked once where text enters the renderer: the template source and the
// message fields); on invalid input they do not crash but their result is unspecified.
#ifndef DECODED_ENGINE_CHAT_JINJA_UNICODE_H_
#define DECODED_ENGINE_CHAT_JINJA_UNICODE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace decoded::jinja {

// Reads the code point starting at byte `*pos` and advances `*pos` past it.
char32_t DecodeUtf8At(std::string_view s, size_t* pos);
void AppendUtf8(char32_t cp, std::string* out);
// True when `s` is well-formed UTF-8 (no overlongs, surrogates or values above U+10FFFF). On failure `*bad_offset`
// (if given) is the offset of the first byte of the ill-formed sequence.
bool IsValidUtf8(std::string_view s, size_t* bad_offset = nullptr);

bool IsAscii(std::string_view s);
// Python len(): the number of code points.
size_t CodePointCount(std::string_view s);
// Reads the code point ending at byte `*pos` and moves `*pos` back to its start.
char32_t DecodeUtf8Before(std::string_view s, size_t* pos);
// The byte offset of code point `index` (s.size() when index >= CodePointCount(s)). Linear time, constant memory:
// strings can be 64 MiB, so nothing here builds per-character tables.
size_t ByteOffsetOf(std::string_view s, size_t index);

// Character properties, as Python's str methods report them for a one-character string.
bool IsSpace(char32_t cp);      // str.isspace (also what strip()/split() without arguments remove)
bool IsPrintable(char32_t cp);  // str.isprintable (repr() escapes the others)
bool IsAlpha(char32_t cp);
bool IsAlnum(char32_t cp);      // also the regex class \w, with '_'
bool IsDigit(char32_t cp);
bool IsLowerChar(char32_t cp);  // str.islower of the character alone
bool IsUpperChar(char32_t cp);
bool IsTitleChar(char32_t cp);  // titlecase letters (U+01C5 ...), not uppercase ones
bool IsCased(char32_t cp);      // Unicode Cased property
bool IsCaseIgnorable(char32_t cp);

// str.lower(), str.upper(), str.title(), str.capitalize() of valid UTF-8.
std::string PyLower(std::string_view s);
std::string PyUpper(std::string_view s);
std::string PyTitle(std::string_view s);
std::string PyCapitalize(std::string_view s);
// str.isupper() / str.islower(): at least one cased character and all cased characters of that case.
bool PyIsUpper(std::string_view s);
bool PyIsLower(std::string_view s);

// The Unicode version the tables were measured with ("14.0.0").
std::string_view UnicodeVersion();

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_UNICODE_H_
