#include "engine/chat/jinja_is_tests.h"

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_args.h"
#include "engine/chat/jinja_filters.h"
#include "engine/chat/jinja_operators.h"
#include "engine/chat/jinja_unicode.h"

namespace decoded::jinja {
namespace {

absl::StatusOr<bool> NoArgs(std::string_view name, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(name, args, {});
  if (!a.ok()) return a.status();
  return true;
}

#define JINJA_UNARY_TEST(fn, name, expr)                                       \
  absl::StatusOr<bool> fn(Env&, const Value& v, const CallArgs& args) {        \
    absl::StatusOr<bool> ok = NoArgs(name, args);                              \
    if (!ok.ok()) return ok.status();                                          \
    return (expr);                                                             \
  }

JINJA_UNARY_TEST(TestDefined, "defined", !v.is_undefined())
JINJA_UNARY_TEST(TestUndefined, "undefined", v.is_undefined())
JINJA_UNARY_TEST(TestNone, "none", v.is_none())
JINJA_UNARY_TEST(TestBoolean, "boolean", v.kind() == Kind::kBool)
JINJA_UNARY_TEST(TestFalse, "false", v.kind() == Kind::kBool && !v.bool_value())
JINJA_UNARY_TEST(TestTrue, "true", v.kind() == Kind::kBool && v.bool_value())
JINJA_UNARY_TEST(TestInteger, "integer", v.kind() == Kind::kInt)
JINJA_UNARY_TEST(TestFloat, "float", v.kind() == Kind::kFloat)
JINJA_UNARY_TEST(TestNumber, "number", v.is_number())
JINJA_UNARY_TEST(TestString, "string", v.is_string())
JINJA_UNARY_TEST(TestMapping, "mapping", v.kind() == Kind::kDict)
// iter() succeeds on these (Undefined and the loop object define __iter__).
JINJA_UNARY_TEST(TestIterable, "iterable",
                 v.is_undefined() || v.is_string() || v.is_list_or_tuple() || v.kind() == Kind::kDict ||
                     v.kind() == Kind::kDictItems || v.kind() == Kind::kDictKeys ||
                     v.kind() == Kind::kDictValues || v.kind() == Kind::kRange || v.kind() == Kind::kIterator ||
                     v.kind() == Kind::kLoop)
// len() and __getitem__ both exist.
JINJA_UNARY_TEST(TestSequence, "sequence",
                 v.is_undefined() || v.is_string() || v.is_list_or_tuple() || v.kind() == Kind::kDict ||
                     v.kind() == Kind::kRange)
// Undefined and the loop object define __call__.
JINJA_UNARY_TEST(TestCallable, "callable",
                 v.kind() == Kind::kCallable || v.is_undefined() || v.kind() == Kind::kLoop)

#undef JINJA_UNARY_TEST

absl::StatusOr<Value> OneArg(std::string_view name, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(name, args, {"other"}, 1);
  if (!a.ok()) return a.status();
  return *a->Get(0);
}

absl::StatusOr<bool> Parity(Env& env, const Value& v, const CallArgs& args, std::string_view name, int64_t want) {
  absl::StatusOr<bool> ok = NoArgs(name, args);
  if (!ok.ok()) return ok.status();
  absl::StatusOr<Value> r = Arithmetic("%", v, Value::Int(2), *env.budget);
  if (!r.ok()) return r.status();
  return Equals(*r, Value::Int(want));
}

absl::StatusOr<bool> TestOdd(Env& env, const Value& v, const CallArgs& args) { return Parity(env, v, args, "odd", 1); }
absl::StatusOr<bool> TestEven(Env& env, const Value& v, const CallArgs& args) {
  return Parity(env, v, args, "even", 0);
}

absl::StatusOr<bool> TestDivisibleBy(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<Value> num = OneArg("divisibleby", args);
  if (!num.ok()) return num.status();
  absl::StatusOr<Value> r = Arithmetic("%", v, *num, *env.budget);
  if (!r.ok()) return r.status();
  return Equals(*r, Value::Int(0));
}

absl::StatusOr<bool> CaseTest(const Value& v, const CallArgs& args, std::string_view name, bool upper) {
  absl::StatusOr<bool> ok = NoArgs(name, args);
  if (!ok.ok()) return ok.status();
  absl::StatusOr<TaintedString> s = ToStr(v);
  if (!s.ok()) return s.status();
  return upper ? PyIsUpper(s->bytes()) : PyIsLower(s->bytes());
}

absl::StatusOr<bool> TestLower(Env&, const Value& v, const CallArgs& args) { return CaseTest(v, args, "lower", false); }
absl::StatusOr<bool> TestUpper(Env&, const Value& v, const CallArgs& args) { return CaseTest(v, args, "upper", true); }

absl::StatusOr<bool> TestSameAs(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<Value> other = OneArg("sameas", args);
  if (!other.ok()) return other.status();
  const Value& o = *other;
  if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
  if (v.kind() == Kind::kBool || o.kind() == Kind::kBool) {
    return v.kind() == Kind::kBool && o.kind() == Kind::kBool && v.bool_value() == o.bool_value();
  }
  if (v.kind() == Kind::kInt && o.kind() == Kind::kInt && v.int_value() == o.int_value() && v.int_value() >= -5 &&
      v.int_value() <= 256) {
    return true;
  }
  if (v.is_number() || o.is_number() || v.is_string() || o.is_string() || v.is_undefined() || o.is_undefined()) {
    if (v.kind() != o.kind()) return false;
    return absl::FailedPreconditionError(absl::StrCat(
        "'is sameas' on two ", TypeName(v), " values depends on Python's object caching (unsupported)"));
  }
  return v.identity() == o.identity();
}

absl::StatusOr<bool> TestIn(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<Value> seq = OneArg("in", args);
  if (!seq.ok()) return seq.status();
  return Contains(*seq, v);
}

absl::StatusOr<bool> TestFilter(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<bool> ok = NoArgs("filter", args);
  if (!ok.ok()) return ok.status();
  return v.is_string() && IsJinjaFilterName(v.string().bytes());
}

absl::StatusOr<bool> TestTest(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<bool> ok = NoArgs("test", args);
  if (!ok.ok()) return ok.status();
  return v.is_string() && IsJinjaTestName(v.string().bytes());
}

template <const char* kOp>
absl::StatusOr<bool> TestCompare(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<Value> other = OneArg(kOp, args);
  if (!other.ok()) return other.status();
  return Compare(kOp, v, *other);
}

constexpr char kEq[] = "==";
constexpr char kNe[] = "!=";
constexpr char kLt[] = "<";
constexpr char kLe[] = "<=";
constexpr char kGt[] = ">";
constexpr char kGe[] = ">=";

const absl::flat_hash_map<std::string_view, TestFn>& Tests() {
  static const auto* const tests = new absl::flat_hash_map<std::string_view, TestFn>{
      {"defined", TestDefined},
      {"undefined", TestUndefined},
      {"none", TestNone},
      {"boolean", TestBoolean},
      {"false", TestFalse},
      {"true", TestTrue},
      {"integer", TestInteger},
      {"float", TestFloat},
      {"number", TestNumber},
      {"string", TestString},
      {"mapping", TestMapping},
      {"iterable", TestIterable},
      {"sequence", TestSequence},
      {"callable", TestCallable},
      {"sameas", TestSameAs},
      {"odd", TestOdd},
      {"even", TestEven},
      {"divisibleby", TestDivisibleBy},
      {"lower", TestLower},
      {"upper", TestUpper},
      {"in", TestIn},
      {"filter", TestFilter},
      {"test", TestTest},
      {"==", TestCompare<kEq>},
      {"eq", TestCompare<kEq>},
      {"equalto", TestCompare<kEq>},
      {"!=", TestCompare<kNe>},
      {"ne", TestCompare<kNe>},
      {"<", TestCompare<kLt>},
      {"lt", TestCompare<kLt>},
      {"lessthan", TestCompare<kLt>},
      {"<=", TestCompare<kLe>},
      {"le", TestCompare<kLe>},
      {">", TestCompare<kGt>},
      {"gt", TestCompare<kGt>},
      {"greaterthan", TestCompare<kGt>},
      {">=", TestCompare<kGe>},
      {"ge", TestCompare<kGe>},
  };
  return *tests;
}

}  // namespace

TestFn FindTest(std::string_view name) {
  auto it = Tests().find(name);
  return it == Tests().end() ? nullptr : it->second;
}

bool IsJinjaTestName(std::string_view name) { return FindTest(name) != nullptr || name == "escaped"; }

}  // namespace decoded::jinja
