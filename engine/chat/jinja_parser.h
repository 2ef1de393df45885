// Parser for the Jinja subset of chat templates: tokens (jinja_lexer.h) to a syntax tree (jinja_ast.h).
//
// The grammar and operator precedence are jinja2.parser.Parser's (Jinja 3.1): conditional expressions, or, and,
// not, comparisons (chained; in, not in), + -, ~, * / // %, **, unary - +, then filters and `is` tests binding
// tighter than any binary operator, then postfix . [] (). Statements: if/elif/else, for (with else, inline `if`),
// set (= and block form, tuple and namespace targets), macro, call blocks, filter blocks, with, print,
// break/continue (the loopcontrols extension) and Hugging Face's generation/endgeneration.
//
// Reported at parse time as UNIMPLEMENTED (with the position): unsupported filters and tests, the Python methods
// this renderer lacks, include/import/from/extends/block/autoescape, recursive for loops, *args/**kwargs in calls,
// and the globals cycler/joiner/lipsum.
#ifndef DECODED_ENGINE_CHAT_JINJA_PARSER_H_
#define DECODED_ENGINE_CHAT_JINJA_PARSER_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_ast.h"

namespace decoded::jinja {

// INVALID_ARGUMENT "chat template line L, column C: ..." for malformed templates, and for nesting deeper than
// 128 levels (a parenthesis costs two: expression and operand), which bounds the parser's and interpreter's
// recursion on hostile input; real templates nest a few levels. UNIMPLEMENTED
// "chat template line L, column C: filter 'x' is not supported" for valid Jinja outside the subset.
absl::StatusOr<std::unique_ptr<const Template>> ParseTemplate(std::string_view source);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_PARSER_H_
