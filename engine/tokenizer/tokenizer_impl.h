// Internal state of Tokenizer shared by its .cc files (not a public header).
#ifndef DECODED_ENGINE_TOKENIZER_TOKENIZER_IMPL_H_
#define DECODED_ENGINE_TOKENIZER_TOKENIZER_IMPL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/chat/chat_template.h"
#include "engine/tokenizer/special_token_matcher.h"
#include "engine/tokenizer/subword_codec.h"
#include "engine/tokenizer/tokenizer.h"

namespace decoded {

struct Tokenizer::Impl {
  TokenizerVocab vocab;  // pieces/scores/types always vocab_size long
  // Keys view into vocab.pieces, which never changes after construction.
  PieceIndex piece_to_id;
  // The vocabulary kind's encoding and piece bytes (subword_codec.h); refers
  // to `vocab` and `piece_to_id`.
  std::unique_ptr<const SubwordCodec> codec;
  SpecialTokenMatcher specials;
  std::vector<int32_t> end_of_generation;
  // vocab.chat_template parsed; null when absent or unusable, and then
  // chat_template_status says why (FAILED_PRECONDITION).
  std::unique_ptr<const ChatTemplate> chat_template;
  absl::Status chat_template_status;

  int32_t size() const { return static_cast<int32_t>(vocab.pieces.size()); }
  bool InRange(int32_t id) const { return id >= 0 && id < size(); }
  // INVALID_ARGUMENT naming the first id outside [0, vocab_size) and its position.
  absl::Status CheckIds(absl::Span<const int32_t> ids) const;

  // Appends the ids of `text` split into `fragments` (SpecialTokenMatcher):
  // special fragments as their id, each text run through the codec. No BOS.
  void EncodeFragments(std::string_view text, absl::Span<const SpecialTokenMatcher::Fragment> fragments,
                       std::vector<int32_t>& out) const;

  // A chat rendered by the template, with the byte ranges (sorted, disjoint)
  // that are the template's own markup rather than message content.
  struct RenderedChat {
    std::string text;
    std::vector<SpecialTokenMatcher::Range> markup;
  };
  absl::StatusOr<RenderedChat> RenderChat(absl::Span<const ChatMessage> messages,
                                          bool add_generation_prompt) const;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_TOKENIZER_TOKENIZER_IMPL_H_
