// A string that remembers which of its bytes came from message fields.
//
// The chat template renderer tags every byte of a rendered prompt as template markup or as data (a message's role
// or content), so the tokenizer can parse special-token spellings only in markup and a user cannot forge a turn by
// typing "<|im_end|>" into their message. The tag travels with string values through the template: concatenation
// and output shift and merge the data ranges, substring operations (slices, strip, split, indexing) keep the ranges
// of the bytes that survive, and any other transformation of a string holding data marks its whole result as data
// (MarkAllIfAny): the conservative side, since data is never parsed for special tokens.
#ifndef DECODED_ENGINE_CHAT_TAINTED_STRING_H_
#define DECODED_ENGINE_CHAT_TAINTED_STRING_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace decoded::jinja {

class TaintedString {
 public:
  // Byte ranges [begin, end) of bytes(): sorted, disjoint, non-empty, and not touching (touching ranges merge).
  using Ranges = std::vector<std::pair<size_t, size_t>>;

  TaintedString() = default;
  // All markup.
  explicit TaintedString(std::string bytes) : bytes_(std::move(bytes)) {}
  // All data.
  static TaintedString Data(std::string bytes);
  // `bytes` is all data when `data` is true, else all markup.
  static TaintedString Derived(std::string bytes, bool data);

  const std::string& bytes() const { return bytes_; }
  const Ranges& data() const { return data_; }
  bool has_data() const { return !data_.empty(); }
  size_t size() const { return bytes_.size(); }
  bool empty() const { return bytes_.empty(); }

  void Append(const TaintedString& other);
  void AppendMarkup(std::string_view s) { bytes_.append(s); }
  // Bytes [begin, end) with their data ranges.
  TaintedString Substr(size_t begin, size_t end) const;
  // Marks every byte as data if any byte is data.
  void MarkAllIfAny();

 private:
  void AddRange(size_t begin, size_t end);

  std::string bytes_;
  Ranges data_;
};

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_TAINTED_STRING_H_
