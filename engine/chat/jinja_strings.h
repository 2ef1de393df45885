// Python str operations on tainted UTF-8 strings, shared by the str methods and the filters (trim is str.strip,
// indent uses splitlines, center pads ...). Indexes are in code points, as in Python; results that are parts of the
// input keep their data ranges exactly.
#ifndef DECODED_ENGINE_CHAT_JINJA_STRINGS_H_
#define DECODED_ENGINE_CHAT_JINJA_STRINGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/tainted_string.h"

namespace decoded::jinja {

enum class StripSide { kBoth, kLeft, kRight };
// str.strip(chars): Python whitespace when `chars` is nullopt, else any code point of `chars`.
TaintedString PyStrip(const TaintedString& s, const std::optional<std::string>& chars, StripSide side);
// str.split(sep, maxsplit) / str.rsplit: whitespace runs when `sep` is nullopt; `sep` must not be empty.
std::vector<TaintedString> PySplit(const TaintedString& s, const std::optional<std::string>& sep, int64_t maxsplit,
                                   bool from_right);
// str.splitlines(keepends).
std::vector<TaintedString> PySplitLines(const TaintedString& s, bool keepends);
// str.replace(old, new, count); data ranges: all data when any input holds data.
TaintedString PyReplace(const TaintedString& s, const TaintedString& old_part, const TaintedString& new_part,
                        int64_t count);
// str.center / ljust / rjust with a one-code-point fill.
enum class PadSide { kCenter, kLeft, kRight };
TaintedString PyPad(const TaintedString& s, int64_t width, std::string_view fill, PadSide side);

// Resolves Python's optional [start, end] code point bounds of find/count/startswith against a string of `length`
// code points; false when the range is empty in Python's sense (start beyond the length).
bool ResolveRange(std::optional<int64_t> start, std::optional<int64_t> end, int64_t length, int64_t* lo,
                  int64_t* hi);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_STRINGS_H_
