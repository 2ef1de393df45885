#include "engine/chat/chat_template.h"

#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_ast.h"
#include "engine/chat/jinja_eval.h"
#include "engine/chat/jinja_parser.h"
#include "engine/chat/jinja_status.h"
#include "engine/chat/jinja_unicode.h"
#include "engine/chat/jinja_value.h"

namespace decoded {
namespace {

absl::Status CheckUtf8(std::string_view text, std::string_view field) {
  size_t bad = 0;
  if (jinja::IsValidUtf8(text, &bad)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(jinja::Sv(field), " is not valid UTF-8 (byte ", bad, ")"));
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  absl::StatusOr<std::unique_ptr<const jinja::Template>> tpl = jinja::ParseTemplate(source);
  if (!tpl.ok()) return tpl.status();
  return ChatTemplate(std::shared_ptr<const jinja::Template>(*std::move(tpl)));
}

absl::StatusOr<ChatTemplate::Output> ChatTemplate::Render(const Input& input) const {
  using jinja::Value;
  absl::Status status = CheckUtf8(input.bos_token, "bos_token");
  if (status.ok()) status = CheckUtf8(input.eos_token, "eos_token");
  if (!status.ok()) return status;

  std::vector<Value> messages;
  messages.reserve(input.messages.size());
  for (size_t i = 0; i < input.messages.size(); ++i) {
    const ChatMessage& m = input.messages[i];
    status = CheckUtf8(m.role, absl::StrCat("messages[", i, "].role"));
    if (status.ok()) status = CheckUtf8(m.content, absl::StrCat("messages[", i, "].content"));
    if (!status.ok()) return status;
    jinja::Dict dict;
    // Keys are the template's vocabulary (markup); values are the user's (data).
    status = dict.Set(Value::Markup("role"), Value::String(jinja::TaintedString::Data(m.role)));
    if (status.ok()) status = dict.Set(Value::Markup("content"), Value::String(jinja::TaintedString::Data(m.content)));
    if (!status.ok()) return status;
    absl::StatusOr<Value> message = Value::DictOf(std::move(dict));
    if (!message.ok()) return message.status();
    messages.push_back(*std::move(message));
  }
  absl::StatusOr<Value> message_list = Value::List(std::move(messages));
  if (!message_list.ok()) return message_list.status();

  const std::vector<std::pair<std::string, Value>> context = {
      {"messages", *std::move(message_list)},
      {"add_generation_prompt", Value::Bool(input.add_generation_prompt)},
      {"bos_token", Value::Markup(input.bos_token)},
      {"eos_token", Value::Markup(input.eos_token)},
      {"tools", Value::None()},
      {"documents", Value::None()},
  };
  absl::StatusOr<jinja::TaintedString> rendered = jinja::RenderTemplate(*tpl_, context, input.now);
  if (!rendered.ok()) return rendered.status();
  Output out;
  out.text = rendered->bytes();
  out.data = rendered->data();
  return out;
}

}  // namespace decoded
