// UTF-8 well-formedness repair: the one rule by which every string the daemon
// sends (streamed token text, top-logprob text, detokenized text, model
// metadata) is made valid UTF-8.
//
// Rule: the Unicode Standard, chapter 3 (§3.9, "U+FFFD Substitution of
// Maximal Subparts"), which WHATWG Encoding's UTF-8 decoder also specifies.
// Well-formed sequences are those of Table 3-7 (no overlong forms, no
// surrogates D800..DFFF, nothing above U+10FFFF). At a byte where no
// well-formed sequence can continue, the maximal subpart (D93b: the longest
// prefix of a well-formed sequence that starts there, or the single byte when
// it starts none) is replaced by one U+FFFD, and scanning resumes at the next
// byte. A stream that ends inside a sequence gets one U+FFFD for it.
//
// Text the byte-level BPE encoder reads is repaired differently, by
// llama.cpp's per-byte rule (ToValidUtf8PerByte below), so that its ids match
// llama.cpp's.
//
// Thread-safety: Utf8Sanitizer holds per-stream state and is not for
// concurrent use; ToValidUtf8 and ToValidUtf8PerByte may be called from any
// thread.
#ifndef DECODED_ENGINE_TOKENIZER_UTF8_H_
#define DECODED_ENGINE_TOKENIZER_UTF8_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace decoded {

// U+FFFD REPLACEMENT CHARACTER in UTF-8.
inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

// Streaming form of the rule: bytes may arrive in pieces split anywhere, and
// the output is the same as for the concatenated input. Output only ever
// holds whole code points, so every piece of output is valid UTF-8 by itself.
class Utf8Sanitizer {
 public:
  // Appends to `out` every code point that `bytes` completes, each maximal
  // subpart of an ill-formed subsequence as U+FFFD. The bytes of a sequence
  // that is still incomplete at the end of `bytes` (at most 3) are held back
  // for the next call.
  void Append(std::string_view bytes, std::string& out);

  // Ends the stream: a held-back incomplete sequence becomes one U+FFFD.
  // The sanitizer is then ready for a new stream.
  void Finish(std::string& out);

  // Whether bytes of an incomplete sequence are held back.
  bool has_pending() const { return held_ > 0; }

 private:
  char seq_[4];          // bytes of the sequence in progress
  uint8_t held_ = 0;     // how many of them are held (0 = between sequences)
  uint8_t length_ = 0;   // the length its lead byte announces
  uint8_t lower_ = 0x80; // allowed range of the next continuation byte
  uint8_t upper_ = 0xBF;
};

// Whole-string form: `bytes` as valid UTF-8, by the rule above.
std::string ToValidUtf8(std::string_view bytes);

// The repair of text *to be encoded* by a byte-level BPE vocabulary, which is
// llama.cpp's (unicode_cpts_from_utf8) wherever that one is sound: scanning
// left to right, a well-formed sequence (Table 3-7) is kept, and any byte
// that does not begin one becomes one U+FFFD, the scan resuming at the next
// byte. So a sequence cut short costs one U+FFFD per byte (C3 "(" -> U+FFFD
// "("; E4 B8 -> two), where the rule above gives one per maximal subpart.
// llama.cpp instead decodes overlong forms (C0 AF as "/"), passes encoded
// surrogates through and aborts on sequences above U+10FFFF; here every byte
// of those becomes U+FFFD too.
std::string ToValidUtf8PerByte(std::string_view bytes);

}  // namespace decoded

#endif  // DECODED_ENGINE_TOKENIZER_UTF8_H_
