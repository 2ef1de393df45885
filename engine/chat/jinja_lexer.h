// Tokenizer for the Jinja subset of chat templates.
//
// Follows jinja2.lexer.Lexer (Jinja 3.1) configured as Hugging Face configures it: default delimiters
// ({{ }}, {% %}, {# #}), trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, no line statements.
// Whitespace control therefore matches Jinja byte for byte:
//   - "\r\n" and "\r" become "\n", and one trailing newline of the source is dropped;
//   - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}", "-#}" strip all after it
//     (whitespace in Python's sense: Unicode White_Space plus \x1c-\x1f);
//   - lstrip_blocks: a block or comment tag preceded on its line only by whitespace drops that whitespace, unless
//     opened with "{%+";
//   - trim_blocks: the first newline after "%}" or "#}" is dropped, unless closed with "+%}";
//   - {% raw %}...{% endraw %} is emitted as text.
// Comments produce no tokens. String literals are decoded as Jinja does (Python's unicode-escape after
// backslash-replacing non-ASCII characters).
#ifndef DECODED_ENGINE_CHAT_JINJA_LEXER_H_
#define DECODED_ENGINE_CHAT_JINJA_LEXER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace decoded::jinja {

enum class TokenType {
  kData,           // template text (already whitespace-controlled)
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,   // text holds the decoded value
  kInteger,  // int_value
  kFloat,    // float_value
  kOperator,  // text: one of + - / // * % ** ~ [ ] ( ) { } == != > >= < <= = . : | , ;
  kEof,
};

struct Token {
  TokenType type;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;    // 1-based
  int column = 1;  // 1-based, in code points
};

// INVALID_ARGUMENT "chat template line L, column C: ..." for malformed input (unterminated comment or string,
// unbalanced brackets, stray characters, invalid UTF-8); UNIMPLEMENTED for valid Jinja this lexer does not take
// (non-ASCII identifiers, integer literals beyond 64 bits, \N{...} escapes).
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source);

// The error message prefix for a position: "chat template line L, column C: ".
std::string PositionPrefix(int line, int column);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_LEXER_H_
