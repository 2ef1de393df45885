// Well-formed UTF-8: the rule as data (Utf8LeadOf), and validation that says
// where a byte string stops being well-formed and why.
//
// The rule is RFC 3629 section 4 (the same as the Unicode Standard's Table
// 3-7): every code point is encoded in its shortest form (no overlongs),
// U+D800..U+DFFF (surrogates) are never encoded, and nothing above U+10FFFF
// is. Protobuf enforces this rule on proto3 `string` fields, so text that
// passes here also passes protobuf's parser. The tokenizer's U+FFFD repair
// (engine/tokenizer/utf8.h) reads the same rule from Utf8LeadOf.
//
// Pure functions: no allocation, safe from any thread.
#ifndef DECODED_ENGINE_UTF8_VALIDATION_H_
#define DECODED_ENGINE_UTF8_VALIDATION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace decoded {

// What the rule allows for a sequence that starts with a given byte.
struct Utf8Lead {
  // Bytes in the sequence: 1 for ASCII, 2..4 after a lead byte, 0 for a byte
  // that starts no sequence (80..C1, F5..FF).
  int length;
  // The range of the second byte when length >= 2. E0, ED, F0 and F4 narrow
  // it (no overlongs, no surrogates, nothing above U+10FFFF); every other
  // continuation byte lies in 80..BF.
  uint8_t second_lo;
  uint8_t second_hi;
};

constexpr Utf8Lead Utf8LeadOf(uint8_t byte) {
  if (byte < 0x80) return {1, 0, 0};
  if (byte < 0xC2) return {0, 0, 0};
  if (byte < 0xE0) return {2, 0x80, 0xBF};
  if (byte == 0xE0) return {3, 0xA0, 0xBF};
  if (byte == 0xED) return {3, 0x80, 0x9F};
  if (byte < 0xF0) return {3, 0x80, 0xBF};
  if (byte == 0xF0) return {4, 0x90, 0xBF};
  if (byte < 0xF4) return {4, 0x80, 0xBF};
  if (byte == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

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
