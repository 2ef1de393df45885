// Validation of UTF-8 text: where a byte string stops being well-formed and
// why.
//
// The rule is RFC 3629 section 4 (the same as Unicode 15 Table 3-7): every
// code point is encoded in its shortest form (no overlongs), U+D800..U+DFFF
// (surrogates) are never encoded, and nothing above U+10FFFF is. Protobuf
// enforces this rule on proto3 `string` fields, so text that passes here
// also passes protobuf's parser.
//
// Pure functions: no allocation, safe from any thread.
#ifndef DECODED_ENGINE_UTF8_VALIDATION_H_
#define DECODED_ENGINE_UTF8_VALIDATION_H_

#include <cstddef>
#include <optional>
#include <string_view>

namespace decoded {

// Why a sequence is ill-formed.
enum class Utf8Defect {
  kStrayContinuation,  // 0x80..0xBF where a sequence should start
  kTruncated,          // a lead byte not followed by enough continuation bytes
  kOverlong,           // a code point encoded in more bytes than it needs
  kSurrogate,          // an encoded U+D800..U+DFFF
  kAboveMax,           // a code point above U+10FFFF
  kNeverUsedByte,      // 0xF8..0xFF, which no UTF-8 sequence contains
};

struct Utf8Error {
  // The first byte of the first ill-formed sequence: also the length of the
  // longest prefix of the text that is well-formed UTF-8.
  size_t offset;
  Utf8Defect defect;
};

// The first ill-formed sequence of `text`, or nullopt when all of it is
// well-formed UTF-8 (the empty string is).
std::optional<Utf8Error> FindInvalidUtf8(std::string_view text);

// Describes the defect as a phrase about the byte at Utf8Error::offset,
// e.g. "begins a sequence that is cut short".
std::string_view Utf8DefectDescription(Utf8Defect defect);

}  // namespace decoded

#endif  // DECODED_ENGINE_UTF8_VALIDATION_H_
