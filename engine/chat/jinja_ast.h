// The syntax tree of a parsed chat template (the node set of jinja2.nodes that the supported subset needs).
//
// Nodes are immutable after parsing and shared by every render of the template. Each node records the line and
// column where it starts, for error messages. Filters and tests are resolved to their implementations at parse
// time, so an unsupported one is reported when the model loads, not when a request renders.
#ifndef DECODED_ENGINE_CHAT_JINJA_AST_H_
#define DECODED_ENGINE_CHAT_JINJA_AST_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat/jinja_filters.h"
#include "engine/chat/jinja_is_tests.h"
#include "engine/chat/jinja_value.h"

namespace decoded::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  kLiteral,   // value
  kName,      // name
  kList,      // items
  kTuple,     // items
  kDict,      // items: key, value, key, value, ...
  kGetAttr,   // object . name
  kGetItem,   // object [ index ]; index may be a kSlice
  kSlice,     // [start]:[stop][:step]; absent parts are null
  kCall,      // callee ( args, keywords )
  kFilter,    // operand | name ( args, keywords ); operand null inside {% filter %} and block set
  kTest,      // operand is name ( args, keywords )
  kNot,       // not operand
  kNegate,    // - operand
  kPlus,      // + operand
  kBinary,    // left op right, op one of + - * / // % **
  kConcat,    // items joined with ~
  kCompare,   // first (op operand)+, op one of == != < <= > >= in notin
  kAnd,       // left and right
  kOr,        // left or right
  kCondition,  // then if test [else otherwise]
};

struct Keyword {
  std::string name;
  ExprPtr value;
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int column = 0;

  Value value;                  // kLiteral
  std::string name;             // kName, kGetAttr (attribute), kFilter, kTest, kBinary (operator)
  ExprPtr object;               // kGetAttr, kGetItem, kCall (callee), kFilter/kTest/unary (operand)
  ExprPtr index;                // kGetItem
  ExprPtr start, stop, step;    // kSlice
  ExprPtr left, right;          // kBinary, kAnd, kOr
  ExprPtr test, then, otherwise;  // kCondition
  std::vector<ExprPtr> items;   // kList, kTuple, kDict, kConcat, call arguments
  std::vector<Keyword> keywords;  // kCall, kFilter, kTest
  std::vector<std::pair<std::string, ExprPtr>> comparisons;  // kCompare: (operator, operand) after `object`
  FilterFn filter = nullptr;    // kFilter
  TestFn is_test = nullptr;     // kTest
};

// An assignment target: a name, a tuple of names (`for k, v in ...`, `set a, b = ...`), or a namespace attribute.
struct Target {
  std::vector<std::string> names;  // one name unless `is_tuple`
  bool is_tuple = false;
  std::string attribute;  // non-empty: `names[0].attribute` (namespace assignment)
  int line = 0;
};

enum class StmtKind {
  kText,        // text
  kPrint,       // expr
  kIf,          // expr, body, else_body (elif chains nest in else_body)
  kFor,         // target, expr (iterable), condition (inline if), body, else_body
  kSet,         // target = expr
  kSetBlock,    // target = body rendered, through `expr` (a filter chain with null operand) when present
  kMacro,       // name, params, body
  kCallBlock,   // expr (the call), params (of the caller), body
  kFilterBlock,  // expr (filter chain with null innermost operand), body
  kWith,        // targets = values, body
  kBreak,
  kContinue,
  kGeneration,  // Hugging Face's {% generation %}: renders body unchanged
};

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind;
  int line = 0;

  std::string text;      // kText; kMacro name
  ExprPtr expr;          // kPrint, kIf test, kFor iterable, kSet value, kSetBlock/kFilterBlock filter, kCallBlock call
  ExprPtr condition;     // kFor inline `if`
  Target target;         // kFor, kSet, kSetBlock
  Body body;
  Body else_body;        // kIf, kFor
  std::vector<Param> params;  // kMacro, kCallBlock
  std::vector<std::pair<Target, ExprPtr>> with_assignments;  // kWith
  // kMacro: whether the body reads `varargs`, `kwargs`, `caller` (Jinja accepts extra arguments only then).
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
};

struct Template {
  Body body;
};

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_AST_H_
