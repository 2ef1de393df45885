// Chat templates: the Jinja program a model ships to turn a conversation into its prompt text.
//
// A model's chat template (tokenizer_config.json "chat_template", GGUF "tokenizer.chat_template") is rendered here
// as Hugging Face transformers renders it in apply_chat_template: Jinja 3.1 in an ImmutableSandboxedEnvironment
// with trim_blocks=True, lstrip_blocks=True and the loopcontrols extension; globals raise_exception(message),
// strftime_now(format), namespace(...) and dict(...); a tojson filter that is
// json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys); the
// {% generation %} tag of Hugging Face's AssistantTracker (its body renders unchanged); and the variables
//   messages               list of {"role": ..., "content": ...}
//   add_generation_prompt  bool
//   bos_token, eos_token   the vocabulary's spellings
//   tools, documents       none (apply_chat_template passes None when the caller gives none)
// Any other name (enable_thinking, custom_tools, ...) is undefined, as when a caller does not pass it.
//
// The renderer implements the subset of Jinja that chat templates use (jinja_parser.h, jinja_filters.h,
// jinja_is_tests.h, jinja_methods.h list it) with Python's semantics: str() and repr() of values, int/float
// arithmetic, code-point string indexing and slicing, Unicode case mapping (Unicode 14, as CPython 3.11).
// It differs from Python in these documented ways, each an error rather than different output:
//   - integers are 64-bit (overflow fails; Python's would grow);
//   - values whose Python str() shows a memory address (functions, generators) cannot be printed;
//   - the filters, tests, methods and statements outside the subset fail Parse with UNIMPLEMENTED, even inside an
//     {% if %} branch, where Jinja 3 defers an unknown filter's error until the branch runs (DeepSeek V3.2's
//     `from_json`, which is llama.cpp's, not Jinja's);
//   - printf-style `str % value` formatting, `is sameas` on numbers and strings (which depends on Python's object
//     caching), complex results (`(-1) ** 0.5`), \N{...} escapes and non-ASCII identifiers and digits fail;
//   - slicing a non-sequence fails, as Jinja does at run time; Jinja's compile-time folding of constant
//     expressions (`{{ (0)[1:] }}`) yields Undefined there instead;
//   - strftime_now formats the time in UTC (Python uses the host's local time) and takes the directives
//     a A b B d e h H I j m M p S u w y Y z Z % with the - and _ flags;
//   - one-shot iterators (map, select, ... results) are computed when created, so an error inside one that is never
//     iterated still fails the render.
//
// Each render also reports which bytes of the prompt came from message fields (Output::data), so the tokenizer can
// treat special-token spellings in content as plain text.
//
// Thread safety: a ChatTemplate is immutable after Parse; any number of threads may Render it at once. Copies share
// the parsed program.
#ifndef DECODED_ENGINE_CHAT_CHAT_TEMPLATE_H_
#define DECODED_ENGINE_CHAT_CHAT_TEMPLATE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/chat/chat_message.h"

namespace decoded {

namespace jinja {
struct Template;
}

class ChatTemplate {
 public:
  // Parses a Hugging Face chat template.
  // INVALID_ARGUMENT "chat template line L, column C: ..." for malformed input (including invalid UTF-8);
  // UNIMPLEMENTED "chat template line L, column C: filter 'x' is not supported" (or test, method, statement) for
  // valid Jinja outside the supported subset, so an unusable template is reported when the model loads.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  struct Input {
    absl::Span<const ChatMessage> messages;
    bool add_generation_prompt = false;
    std::string bos_token, eos_token;  // the vocabulary's spellings ("" when absent)
    absl::Time now = absl::Now();      // for strftime_now (formatted in UTC)
  };

  struct Output {
    std::string text;
    // Byte ranges [begin, end) of `text` that came from message fields (role, content): sorted, disjoint, merged
    // (touching ranges are one), non-empty. Everything else is template markup. Bytes derived from a message field
    // by anything but concatenation or taking a part of it (upper(), replace(), tojson, ...) count as data whole.
    std::vector<std::pair<size_t, size_t>> data;
  };

  // Renders the template.
  // INVALID_ARGUMENT with the template's own message when it calls raise_exception (e.g. "Conversation roles must
  // alternate user/assistant/user/assistant/..."), or "messages[i].content is not valid UTF-8 (byte N)";
  // FAILED_PRECONDITION "chat template: <what> (line L)" for an evaluation error (type error, an undefined value
  // used, an unknown function called) or an exceeded limit (64 MiB of text, 64 nested macro calls, a work budget:
  // engine/chat/jinja_budget.h). Never crashes, whatever the template and input.
  absl::StatusOr<Output> Render(const Input& input) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const jinja::Template> tpl) : tpl_(std::move(tpl)) {}

  std::shared_ptr<const jinja::Template> tpl_;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_CHAT_CHAT_TEMPLATE_H_
