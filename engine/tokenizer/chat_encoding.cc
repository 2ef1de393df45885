// Tokenizer::ApplyChatTemplate and EncodeChat: the model's own chat template
// (GGUF tokenizer.chat_template, a Jinja template as in the Hugging Face
// tokenizer_config.json) rendered by engine/chat/chat_template.h, then
// tokenized with control tokens taken from the template's markup only.
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/chat/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"

namespace decoded {

absl::StatusOr<Tokenizer::Impl::RenderedChat> Tokenizer::Impl::RenderChat(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt) const {
  if (chat_template == nullptr) return chat_template_status;
  ChatTemplate::Input input;
  input.messages = messages;
  input.add_generation_prompt = add_generation_prompt;
  if (InRange(vocab.bos_id)) input.bos_token = vocab.pieces[vocab.bos_id];
  if (InRange(vocab.eos_id)) input.eos_token = vocab.pieces[vocab.eos_id];
  absl::StatusOr<ChatTemplate::Output> rendered = chat_template->Render(input);
  if (!rendered.ok()) return rendered.status();
  RenderedChat chat;
  chat.text = std::move(rendered->text);
  // Markup is everything between the data ranges.
  size_t at = 0;
  for (const auto& [begin, end] : rendered->data) {
    if (begin > at) chat.markup.push_back({at, begin});
    at = end;
  }
  if (at < chat.text.size()) chat.markup.push_back({at, chat.text.size()});
  return chat;
}

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                         bool add_generation_prompt) const {
  absl::StatusOr<Impl::RenderedChat> chat = impl_->RenderChat(messages, add_generation_prompt);
  if (!chat.ok()) return chat.status();
  return std::move(chat->text);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeChat(absl::Span<const ChatMessage> messages,
                                                          bool add_generation_prompt,
                                                          bool parse_special_in_content) const {
  absl::StatusOr<Impl::RenderedChat> chat = impl_->RenderChat(messages, add_generation_prompt);
  if (!chat.ok()) return chat.status();
  const SpecialTokenMatcher::Range whole[] = {{0, chat->text.size()}};
  std::vector<SpecialTokenMatcher::Fragment> fragments;
  impl_->specials.SplitWithin(chat->text,
                              parse_special_in_content ? absl::Span<const SpecialTokenMatcher::Range>(whole)
                                                       : absl::Span<const SpecialTokenMatcher::Range>(chat->markup),
                              fragments);
  std::vector<int32_t> ids;
  impl_->EncodeFragments(chat->text, fragments, ids);
  return ids;
}

absl::Status Tokenizer::chat_template_status() const { return impl_->chat_template_status; }
const std::string& Tokenizer::chat_template() const { return impl_->vocab.chat_template; }

}  // namespace decoded
