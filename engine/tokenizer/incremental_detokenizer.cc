#include <cstdint>
#include <string>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"

namespace decoded {

std::string IncrementalDetokenizer::Push(int32_t id) {
  std::string out;
  utf8_.Append(tokenizer_->TokenBytes(id, render_special_), out);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out;
  utf8_.Finish(out);
  return out;
}

absl::StatusOr<std::string> Tokenizer::Detokenize(absl::Span<const int32_t> ids, bool render_special) const {
  if (absl::Status s = impl_->CheckIds(ids); !s.ok()) return s;
  IncrementalDetokenizer detok(this, render_special);
  std::string text;
  for (int32_t id : ids) text += detok.Push(id);
  text += detok.Flush();
  return text;
}

}  // namespace decoded
