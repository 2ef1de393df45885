// Tokenizer::ApplyChatTemplate and EncodeChat: the Gemma turn format.
//
// Reference: the chat_template of google/gemma-3-*-it (tokenizer_config.json):
//   {{ bos_token }}  -- left to the caller (Encode(add_bos), the serving
//                       layer), so it is never doubled
//   system message -> first_user_prefix = content + "\n\n"
//   each turn: "<start_of_turn>" + (assistant ? "model" : role) + "\n"
//              + (first turn ? first_user_prefix : "") + content | trim
//              + "<end_of_turn>\n"
//   add_generation_prompt: "<start_of_turn>model\n"
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"

namespace decoded {
namespace {

// Jinja's `trim` on ASCII whitespace.
std::string_view Trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  const size_t end = s.find_last_not_of(kSpace);
  return s.substr(begin, end - begin + 1);
}

}  // namespace

absl::StatusOr<Tokenizer::Impl::RenderedChat> Tokenizer::Impl::RenderChat(
    absl::Span<const ChatMessage> messages, bool add_generation_prompt) const {
  if (start_of_turn_id < 0 || end_of_turn_id < 0) {
    return absl::UnimplementedError(
        "no chat template for this vocabulary (it lacks <start_of_turn>/<end_of_turn>)");
  }
  const std::string& open = vocab.pieces[start_of_turn_id];
  const std::string& close = vocab.pieces[end_of_turn_id];

  std::string_view system_content;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    if (messages.size() < 2 || messages[1].role != "user") {
      return absl::InvalidArgumentError(
          "messages[0]: a system message must be followed by a user message");
    }
    system_content = messages[0].content;
    first = 1;
  }

  RenderedChat chat;
  std::string& out = chat.text;
  // Markup pieces that touch are one range, so a spelling the template
  // writes in two appends (close + "\n", open + role) still lies inside one.
  auto markup = [&](std::string_view piece) {
    if (!chat.markup.empty() && chat.markup.back().end == out.size()) {
      chat.markup.back().end += piece.size();
    } else {
      chat.markup.push_back({out.size(), out.size() + piece.size()});
    }
    out.append(piece);
  };
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string_view role;
    if (m.role == "user") {
      role = "user";
    } else if (m.role == "assistant" || m.role == "model") {
      role = "model";
    } else if (m.role == "system") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "]: a system message is only allowed first"));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "]: unknown role \"", m.role,
                                                     "\" (expected system, user, assistant or model)"));
    }
    markup(open);
    markup(role);
    markup("\n");
    if (i == first && first == 1) {
      out.append(system_content);
      markup("\n\n");
    }
    out.append(Trim(m.content));
    markup(close);
    markup("\n");
  }
  if (add_generation_prompt) {
    markup(open);
    markup("model\n");
  }
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

}  // namespace decoded
