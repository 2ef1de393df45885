// Tokenizer::ApplyChatTemplate: the Gemma turn format.
//
// Reference: the chat_template of google/gemma-3-*-it (tokenizer_config.json):
//   {{ bos_token }}  -- left to Encode(add_bos) here, so it is never doubled
//   system message -> first_user_prefix = content + "\n\n"
//   each turn: "<start_of_turn>" + (assistant ? "model" : role) + "\n"
//              + (first turn ? first_user_prefix : "") + content | trim
//              + "<end_of_turn>\n"
//   add_generation_prompt: "<start_of_turn>model\n"
#include <string_view>

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

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                         bool add_generation_prompt) const {
  if (impl_->start_of_turn_id < 0 || impl_->end_of_turn_id < 0) {
    return absl::UnimplementedError(
        "no chat template for this vocabulary (it lacks <start_of_turn>/<end_of_turn>)");
  }
  const std::string& open = impl_->vocab.pieces[impl_->start_of_turn_id];
  const std::string& close = impl_->vocab.pieces[impl_->end_of_turn_id];

  std::string system_prefix;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    if (messages.size() < 2 || messages[1].role != "user") {
      return absl::InvalidArgumentError(
          "messages[0]: a system message must be followed by a user message");
    }
    system_prefix = absl::StrCat(messages[0].content, "\n\n");
    first = 1;
  }

  std::string out;
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
    out.append(open).append(role).append("\n");
    if (i == first) out.append(system_prefix);
    out.append(Trim(m.content)).append(close).append("\n");
  }
  if (add_generation_prompt) out.append(open).append("model\n");
  return out;
}

}  // namespace decoded
