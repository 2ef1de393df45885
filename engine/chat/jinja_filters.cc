#include "engine/chat/jinja_filters.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/chat/jinja_args.h"
#include "engine/chat/jinja_is_tests.h"
#include "engine/chat/jinja_json.h"
#include "engine/chat/jinja_operators.h"
#include "engine/chat/jinja_status.h"
#include "engine/chat/jinja_strings.h"
#include "engine/chat/jinja_unicode.h"

namespace decoded::jinja {
namespace {

// str(value) for filters that apply soft_str: strings (html-safe ones included) stay as they are.
absl::StatusOr<Value> SoftStr(const Value& v) {
  if (v.is_string()) return v;
  absl::StatusOr<TaintedString> s = ToStr(v);
  if (!s.ok()) return s.status();
  return Value::String(*std::move(s));
}

absl::StatusOr<Value> Generator(std::vector<Value> items, Budget& budget) {
  absl::Status st = budget.ChargeItems(items.size());
  if (!st.ok()) return st;
  return Value::Iterator(std::move(items), "generator");
}

// Jinja's make_attrgetter: "a.b.0" looks up item a, then b, then 0 (digit parts as ints), with getitem.
class AttrGetter {
 public:
  explicit AttrGetter(const Value* attribute) {
    if (attribute == nullptr || attribute->is_none()) return;
    if (!attribute->is_string()) {
      parts_.push_back(*attribute);
      return;
    }
    for (absl::string_view part : absl::StrSplit(attribute->string().bytes(), '.')) {
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
        return c >= '0' && c <= '9';
      });
      if (digits && part.size() < 18) {
        parts_.push_back(Value::Int(std::stoll(std::string(part))));
      } else {
        parts_.push_back(Value::Markup(std::string(part)));
      }
    }
  }

  absl::StatusOr<Value> Get(Value item, const Value* fallback = nullptr) const {
    for (const Value& part : parts_) {
      absl::StatusOr<Value> next = GetItem(item, part);
      if (!next.ok()) return next.status();
      item = *std::move(next);
      if (fallback != nullptr && item.is_undefined()) item = *fallback;
    }
    return item;
  }

 private:
  std::vector<Value> parts_;
};

// Jinja's ignore_case postprocessor for sort/unique/min/max keys.
absl::StatusOr<Value> IgnoreCase(Value v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  return Value::String(TaintedString::Derived(PyLower(v.string().bytes()), v.string().has_data()));
}

// Sorting with Python's `<`; the first comparison error wins.
template <typename T, typename KeyOf>
absl::Status StableSort(std::vector<T>* items, KeyOf key_of, bool reverse) {
  absl::Status error;
  std::stable_sort(items->begin(), items->end(), [&](const T& a, const T& b) {
    if (!error.ok()) return false;
    absl::StatusOr<bool> less = reverse ? Less(key_of(b), key_of(a)) : Less(key_of(a), key_of(b));
    if (!less.ok()) {
      error = less.status();
      return false;
    }
    return *less;
  });
  return error;
}

// ---- string filters ----

absl::StatusOr<Value> CaseFilter(const Value& value, const CallArgs& args, std::string_view name,
                                 std::string (*fn)(std::string_view)) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(name, args, {});
  if (!a.ok()) return a.status();
  absl::StatusOr<Value> s = SoftStr(value);
  if (!s.ok()) return s.status();
  return Value::String(TaintedString::Derived(fn(s->string().bytes()), s->string().has_data()), s->html_safe());
}

absl::StatusOr<Value> FilterUpper(Env&, const Value& v, const CallArgs& args) {
  return CaseFilter(v, args, "upper", PyUpper);
}
absl::StatusOr<Value> FilterLower(Env&, const Value& v, const CallArgs& args) {
  return CaseFilter(v, args, "lower", PyLower);
}
absl::StatusOr<Value> FilterCapitalize(Env&, const Value& v, const CallArgs& args) {
  return CaseFilter(v, args, "capitalize", PyCapitalize);
}

bool IsTitleSeparator(char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsSpace(c); }

// Jinja's title: split on runs of [-\s({[<], then item[0].upper() + item[1:].lower() for every piece.
std::string JinjaTitle(std::string_view s) {
  std::string out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t p = pos;
    const bool sep = IsTitleSeparator(DecodeUtf8At(s, &p));
    size_t end = pos;
    while (end < s.size()) {
      size_t q = end;
      if (IsTitleSeparator(DecodeUtf8At(s, &q)) != sep) break;
      end = q;
    }
    const std::string_view piece = s.substr(pos, end - pos);
    size_t first_end = 0;
    DecodeUtf8At(piece, &first_end);
    out += PyUpper(piece.substr(0, first_end));
    out += PyLower(piece.substr(first_end));
    pos = end;
  }
  return out;
}

absl::StatusOr<Value> FilterTitle(Env&, const Value& v, const CallArgs& args) {
  return CaseFilter(v, args, "title", JinjaTitle);
}

absl::StatusOr<Value> FilterTrim(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("trim", args, {"chars"});
  if (!a.ok()) return a.status();
  absl::StatusOr<std::optional<std::string>> chars = a->StringOrNone(0);
  if (!chars.ok()) return chars.status();
  absl::StatusOr<Value> s = SoftStr(v);
  if (!s.ok()) return s.status();
  return Value::String(PyStrip(s->string(), *chars, StripSide::kBoth), s->html_safe());
}

absl::StatusOr<Value> FilterString(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("string", args, {});
  if (!a.ok()) return a.status();
  return SoftStr(v);
}

absl::StatusOr<Value> FilterSafe(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("safe", args, {});
  if (!a.ok()) return a.status();
  absl::StatusOr<TaintedString> s = ToStr(v);
  if (!s.ok()) return s.status();
  return Value::String(*std::move(s), true);
}

absl::StatusOr<Value> Escape(const Value& v, const CallArgs& args, bool force) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("escape", args, {});
  if (!a.ok()) return a.status();
  if (v.is_string() && v.html_safe() && !force) return v;
  absl::StatusOr<TaintedString> s = ToStr(v);
  if (!s.ok()) return s.status();
  return Value::String(TaintedString::Derived(HtmlEscape(s->bytes()), s->has_data()), true);
}

absl::StatusOr<Value> FilterEscape(Env&, const Value& v, const CallArgs& args) { return Escape(v, args, false); }
absl::StatusOr<Value> FilterForceEscape(Env&, const Value& v, const CallArgs& args) { return Escape(v, args, true); }

absl::StatusOr<Value> FilterReplace(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("replace", args, {"old", "new", "count"}, 2);
  if (!a.ok()) return a.status();
  absl::StatusOr<TaintedString> s = ToStr(v);
  if (!s.ok()) return s.status();
  absl::StatusOr<TaintedString> old_part = ToStr(*a->Get(0));
  if (!old_part.ok()) return old_part.status();
  absl::StatusOr<TaintedString> new_part = ToStr(*a->Get(1));
  if (!new_part.ok()) return new_part.status();
  int64_t count = -1;
  if (a->Has(2) && !a->Get(2)->is_none()) {
    absl::StatusOr<int64_t> c = a->Int(2, -1);
    if (!c.ok()) return c.status();
    count = *c;
  }
  // Reuse str.replace's size accounting through the method.
  CallArgs method_args;
  method_args.positional = {Value::String(*old_part), Value::String(*new_part), Value::Int(count)};
  absl::StatusOr<Value> method = GetAttr(Value::String(*s), "replace");
  if (!method.ok()) return method.status();
  return method->callable().Call(env, std::move(method_args));
}

absl::StatusOr<Value> FilterIndent(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("indent", args, {"width", "first", "blank"});
  if (!a.ok()) return a.status();
  std::string indention = "    ";
  if (const Value* w = a->Get(0)) {
    if (w->is_string()) {
      indention = w->string().bytes();
    } else if (w->is_integral()) {
      indention.assign(static_cast<size_t>(std::clamp<int64_t>(w->int_value(), 0, Limits::kMaxStringBytes)), ' ');
    } else {
      return TypeError(absl::StrCat("can't multiply sequence by non-int of type '", TypeName(*w), "'"));
    }
  }
  absl::StatusOr<bool> first = a->Bool(1, false);
  if (!first.ok()) return first.status();
  absl::StatusOr<bool> blank = a->Bool(2, false);
  if (!blank.ok()) return blank.status();
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_string()) {
    return TypeError(absl::StrCat("unsupported operand type(s) for +=: '", TypeName(v), "' and 'str'"));
  }
  TaintedString s = v.string();
  s.AppendMarkup("\n");
  const std::vector<TaintedString> lines = PySplitLines(s, false);
  absl::Status st = env.budget->ChargeString(s.size() + lines.size() * indention.size());
  if (!st.ok()) return st;
  TaintedString out;
  if (*first) out.AppendMarkup(indention);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out.AppendMarkup("\n");
      if (*blank || !lines[i].empty()) out.AppendMarkup(indention);
    }
    out.Append(lines[i]);
  }
  return Value::String(std::move(out), v.html_safe());
}

absl::StatusOr<Value> FilterCenter(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("center", args, {"width"});
  if (!a.ok()) return a.status();
  absl::StatusOr<int64_t> width = a->Int(0, 80);
  if (!width.ok()) return width.status();
  absl::StatusOr<Value> s = SoftStr(v);
  if (!s.ok()) return s.status();
  absl::Status st = env.budget->ChargeString(static_cast<size_t>(std::clamp<int64_t>(*width, 0, INT64_MAX)));
  if (!st.ok()) return st;
  return Value::String(PyPad(s->string(), *width, " ", PadSide::kCenter), s->html_safe());
}

absl::StatusOr<Value> FilterTruncate(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("truncate", args, {"length", "killwords", "end", "leeway"});
  if (!a.ok()) return a.status();
  absl::StatusOr<int64_t> length = a->Int(0, 255);
  if (!length.ok()) return length.status();
  absl::StatusOr<bool> killwords = a->Bool(1, false);
  if (!killwords.ok()) return killwords.status();
  absl::StatusOr<std::string> end = a->String(2, "...");
  if (!end.ok()) return end.status();
  int64_t leeway = 5;  // the truncate.leeway policy's default
  if (a->Has(3) && !a->Get(3)->is_none()) {
    absl::StatusOr<int64_t> l = a->Int(3, 5);
    if (!l.ok()) return l.status();
    leeway = *l;
  }
  const int64_t end_len = static_cast<int64_t>(CodePointCount(*end));
  if (*length < end_len) return TypeError(absl::StrCat("expected length >= ", end_len, ", got ", *length));
  if (leeway < 0) return TypeError(absl::StrCat("expected leeway >= 0, got ", leeway));
  JINJA_ASSIGN_OR_RETURN(const int64_t len, Length(v));
  if (len <= *length + leeway) return v;
  if (!v.is_string()) {
    return absl::FailedPreconditionError(absl::StrCat("truncate of a ", TypeName(v), " is not supported"));
  }
  const TaintedString& s = v.string();
  TaintedString head = s.Substr(0, ByteOffsetOf(s.bytes(), static_cast<size_t>(*length - end_len)));
  if (!*killwords) {
    const size_t space = head.bytes().rfind(' ');
    if (space != std::string::npos) head = head.Substr(0, space);
  }
  head.AppendMarkup(*end);
  return Value::String(std::move(head));
}

absl::StatusOr<Value> FilterWordCount(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("wordcount", args, {});
  if (!a.ok()) return a.status();
  absl::StatusOr<TaintedString> s = ToStr(v);
  if (!s.ok()) return s.status();
  int64_t words = 0;
  bool in_word = false;
  size_t p = 0;
  while (p < s->size()) {
    const char32_t c = DecodeUtf8At(s->bytes(), &p);
    const bool word = c == '_' || IsAlnum(c);
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value::Int(words);
}

// ---- numbers ----

// Python's int() and float() also read non-ASCII decimal digits ('٣' is 3); this renderer does not.
absl::Status CheckNoUnicodeDigits(std::string_view s, const char* what) {
  size_t p = 0;
  while (p < s.size()) {
    const char32_t c = DecodeUtf8At(s, &p);
    if (c >= 0x80 && IsDigit(c)) {
      return absl::FailedPreconditionError(absl::StrCat(what, "() of non-ASCII digits is not supported"));
    }
  }
  return absl::OkStatus();
}

// Python's float(str): surrounding whitespace, sign, digits with single underscores, inf/nan.
absl::StatusOr<std::optional<double>> ParsePyFloat(std::string_view text) {
  const TaintedString t = PyStrip(TaintedString(std::string(text)), std::nullopt, StripSide::kBoth);
  std::string s = t.bytes();
  JINJA_RETURN_IF_ERROR(CheckNoUnicodeDigits(s, "float"));
  if (s.empty() || !IsAscii(s)) return std::nullopt;
  std::string lower = PyLower(s);
  std::string_view body = lower;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  if (body == "inf" || body == "infinity" || body == "nan") return std::strtod(lower.c_str(), nullptr);
  std::string clean;
  bool digit_before = false;
  bool any_digit = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (!digit_before || i + 1 >= s.size() || !(s[i + 1] >= '0' && s[i + 1] <= '9')) return std::nullopt;
      continue;
    }
    digit_before = c >= '0' && c <= '9';
    any_digit = any_digit || digit_before;
    if (!digit_before && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-') return std::nullopt;
    clean.push_back(c);
  }
  if (!any_digit) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

// Python's int(str, base) for base 2..36; nullopt when not a valid literal. FAILED_PRECONDITION beyond 64 bits.
absl::StatusOr<std::optional<int64_t>> ParsePyInt(std::string_view text, int64_t base) {
  const TaintedString t = PyStrip(TaintedString(std::string(text)), std::nullopt, StripSide::kBoth);
  std::string_view s = t.bytes();
  JINJA_RETURN_IF_ERROR(CheckNoUnicodeDigits(s, "int"));
  if (!IsAscii(s)) return std::optional<int64_t>();
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.size() > 2 && s[0] == '0') {
    const char p = static_cast<char>(s[1] | 0x20);
    if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2)) {
      s.remove_prefix(2);
      if (!s.empty() && s[0] == '_') s.remove_prefix(1);
    }
  }
  if (s.empty()) return std::optional<int64_t>();
  unsigned __int128 value = 0;
  bool digit_before = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (!digit_before || i + 1 >= s.size() || s[i + 1] == '_') return std::optional<int64_t>();
      digit_before = false;
      continue;
    }
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') {
      d = (c | 0x20) - 'a' + 10;
    } else {
      return std::optional<int64_t>();
    }
    if (d >= base) return std::optional<int64_t>();
    value = value * static_cast<unsigned>(base) + static_cast<unsigned>(d);
    if (value > (static_cast<unsigned __int128>(1) << 63)) {
      return absl::FailedPreconditionError("integer overflow (this renderer's integers are 64-bit)");
    }
    digit_before = true;
  }
  if (!negative && value == (static_cast<unsigned __int128>(1) << 63)) {
    return absl::FailedPreconditionError("integer overflow (this renderer's integers are 64-bit)");
  }
  const int64_t r = negative ? -static_cast<int64_t>(value - 1) - 1 : static_cast<int64_t>(value);
  return std::optional<int64_t>(r);
}

absl::StatusOr<std::optional<int64_t>> FloatToInt(double d) {
  if (!std::isfinite(d)) return std::optional<int64_t>();
  const double t = std::trunc(d);
  if (t >= 9.2233720368547758e18 || t < -9.2233720368547758e18) {
    return absl::FailedPreconditionError("integer overflow (this renderer's integers are 64-bit)");
  }
  return std::optional<int64_t>(static_cast<int64_t>(t));
}

absl::StatusOr<Value> FilterInt(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("int", args, {"default", "base"});
  if (!a.ok()) return a.status();
  const Value fallback = a->Has(0) ? *a->Get(0) : Value::Int(0);
  absl::StatusOr<int64_t> base = a->Int(1, 10);
  if (!base.ok()) return base.status();
  if (v.is_undefined()) return UndefinedError(v);  // Undefined.__int__ raises
  if (v.is_integral()) return Value::Int(v.int_value());
  if (v.kind() == Kind::kFloat) {
    absl::StatusOr<std::optional<int64_t>> i = FloatToInt(v.float_value());
    if (!i.ok()) return i.status();
    return *i ? Value::Int(**i) : fallback;
  }
  if (v.is_string()) {
    if (*base < 2 || *base > 36) return absl::FailedPreconditionError("int(): only bases 2 to 36 are supported");
    absl::StatusOr<std::optional<int64_t>> i = ParsePyInt(v.string().bytes(), *base);
    if (!i.ok()) return i.status();
    if (*i) return Value::Int(**i);
    JINJA_ASSIGN_OR_RETURN(std::optional<double> d, ParsePyFloat(v.string().bytes()));
    if (d) {
      absl::StatusOr<std::optional<int64_t>> j = FloatToInt(*d);
      if (!j.ok()) return j.status();
      if (*j) return Value::Int(**j);
    }
  }
  return fallback;
}

absl::StatusOr<Value> FilterFloat(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("float", args, {"default"});
  if (!a.ok()) return a.status();
  const Value fallback = a->Has(0) ? *a->Get(0) : Value::Float(0.0);
  if (v.is_undefined()) return UndefinedError(v);  // Undefined.__float__ raises
  if (v.is_number()) return Value::Float(v.float_value());
  if (v.is_string()) {
    JINJA_ASSIGN_OR_RETURN(std::optional<double> d, ParsePyFloat(v.string().bytes()));
    if (d) return Value::Float(*d);
  }
  return fallback;
}

absl::StatusOr<Value> FilterAbs(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("abs", args, {});
  if (!a.ok()) return a.status();
  if (v.is_integral()) {
    if (v.int_value() == INT64_MIN) return absl::FailedPreconditionError("integer overflow");
    return Value::Int(v.int_value() < 0 ? -v.int_value() : v.int_value());
  }
  if (v.kind() == Kind::kFloat) return Value::Float(std::fabs(v.float_value()));
  return TypeError(absl::StrCat("bad operand type for abs(): '", TypeName(v), "'"));
}

absl::StatusOr<Value> FilterRound(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("round", args, {"precision", "method"});
  if (!a.ok()) return a.status();
  absl::StatusOr<int64_t> precision = a->Int(0, 0);
  if (!precision.ok()) return precision.status();
  absl::StatusOr<std::string> method = a->String(1, "common");
  if (!method.ok()) return method.status();
  if (*method != "common" && *method != "ceil" && *method != "floor") {
    return TypeError("method must be common, ceil or floor");
  }
  if (!v.is_number()) return TypeError(absl::StrCat("type ", TypeName(v), " doesn't define __round__ method"));
  if (*precision < 0 || *precision > 300) {
    return absl::FailedPreconditionError("round(): precisions outside 0..300 are not supported");
  }
  if (*method == "common") {
    if (v.is_integral()) return Value::Int(v.int_value());
    const double x = v.float_value();
    if (!std::isfinite(x)) return v;
    // printf rounds the exact binary value half-to-even, as Python's round() does.
    const int digits = static_cast<int>(*precision);
    const int size = std::snprintf(nullptr, 0, "%.*f", digits, x);
    std::string buf(static_cast<size_t>(size) + 1, '\0');
    std::snprintf(buf.data(), buf.size(), "%.*f", digits, x);
    return Value::Float(std::strtod(buf.c_str(), nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(*precision));
  const double scaled = v.float_value() * scale;
  const double r = *method == "ceil" ? std::ceil(scaled) : std::floor(scaled);
  return Value::Float(r / scale);
}

// ---- sequences ----

absl::StatusOr<Value> FilterLength(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("length", args, {});
  if (!a.ok()) return a.status();
  absl::StatusOr<int64_t> n = Length(v);
  if (!n.ok()) return n.status();
  return Value::Int(*n);
}

absl::StatusOr<Value> FilterList(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("list", args, {});
  if (!a.ok()) return a.status();
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  absl::Status st = env.budget->ChargeItems(items->size());
  if (!st.ok()) return st;
  return Value::List(*std::move(items));
}

absl::StatusOr<Value> FilterFirst(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("first", args, {});
  if (!a.ok()) return a.status();
  if (v.kind() == Kind::kIterator) {
    IteratorState& it = v.iterator();
    if (it.position < it.items.size()) return it.items[it.position++];
    return Value::Undefined("No first item, sequence was empty.");
  }
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value::Undefined("No first item, sequence was empty.");
  return items->front();
}

absl::StatusOr<Value> FilterLast(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("last", args, {});
  if (!a.ok()) return a.status();
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kString:
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kRange:
    case Kind::kDict:
    case Kind::kDictItems:
    case Kind::kDictKeys:
    case Kind::kDictValues: {
      absl::StatusOr<std::vector<Value>> items = Iterate(v);
      if (!items.ok()) return items.status();
      if (items->empty()) return Value::Undefined("No last item, sequence was empty.");
      return items->back();
    }
    default:
      return TypeError(absl::StrCat("'", TypeName(v), "' object is not reversible"));
  }
}

absl::StatusOr<Value> FilterReverse(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("reverse", args, {});
  if (!a.ok()) return a.status();
  if (v.is_string()) {
    const std::string& bytes = v.string().bytes();
    std::string out;
    out.reserve(bytes.size());
    for (size_t end = bytes.size(); end > 0;) {
      size_t start = end;
      DecodeUtf8Before(bytes, &start);
      out.append(bytes, start, end - start);
      end = start;
    }
    return Value::String(TaintedString::Derived(std::move(out), v.string().has_data()), v.html_safe());
  }
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return TypeError("argument must be iterable");
  std::reverse(items->begin(), items->end());
  absl::Status st = env.budget->ChargeItems(items->size());
  if (!st.ok()) return st;
  switch (v.kind()) {
    case Kind::kIterator:
      return Value::List(*std::move(items));
    case Kind::kList:
      return Value::Iterator(*std::move(items), "list_reverseiterator");
    case Kind::kRange:
      return Value::Iterator(*std::move(items), "range_iterator");
    case Kind::kDict:
    case Kind::kDictKeys:
      return Value::Iterator(*std::move(items), "dict_reversekeyiterator");
    case Kind::kDictItems:
      return Value::Iterator(*std::move(items), "dict_reverseitemiterator");
    case Kind::kDictValues:
      return Value::Iterator(*std::move(items), "dict_reversevalueiterator");
    default:
      return Value::Iterator(*std::move(items), "reversed");
  }
}

absl::StatusOr<Value> FilterJoin(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("join", args, {"d", "attribute"});
  if (!a.ok()) return a.status();
  TaintedString sep;
  if (const Value* d = a->Get(0)) {
    absl::StatusOr<TaintedString> s = ToStr(*d);
    if (!s.ok()) return s.status();
    sep = *std::move(s);
  }
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  const AttrGetter getter(a->Get(1));
  TaintedString out;
  for (size_t i = 0; i < items->size(); ++i) {
    absl::StatusOr<Value> item = getter.Get((*items)[i]);
    if (!item.ok()) return item.status();
    absl::StatusOr<TaintedString> s = ToStr(*item);
    if (!s.ok()) return s.status();
    absl::Status st = env.budget->ChargeAppend(out.size() + s->size() + sep.size(), s->size() + sep.size());
    if (!st.ok()) return st;
    if (i > 0) out.Append(sep);
    out.Append(*s);
    if (!st.ok()) return st;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterDefault(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("default", args, {"default_value", "boolean"});
  if (!a.ok()) return a.status();
  absl::StatusOr<bool> boolean = a->Bool(1, false);
  if (!boolean.ok()) return boolean.status();
  if (v.is_undefined() || (*boolean && !Truthy(v))) return a->Has(0) ? *a->Get(0) : Value::Markup("");
  return v;
}

absl::StatusOr<Value> FilterItems(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("items", args, {});
  if (!a.ok()) return a.status();
  if (v.is_undefined()) return Value::Iterator({}, "generator");
  if (v.kind() != Kind::kDict) return TypeError("Can only get item pairs from a mapping.");
  absl::StatusOr<std::vector<Value>> items = Iterate(Value::DictView(Kind::kDictItems, v.dict_ptr()));
  if (!items.ok()) return items.status();
  return Generator(*std::move(items), *env.budget);
}

absl::StatusOr<Value> FilterDictSort(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("dictsort", args, {"case_sensitive", "by", "reverse"});
  if (!a.ok()) return a.status();
  absl::StatusOr<bool> case_sensitive = a->Bool(0, false);
  if (!case_sensitive.ok()) return case_sensitive.status();
  absl::StatusOr<std::string> by = a->String(1, "key");
  if (!by.ok()) return by.status();
  absl::StatusOr<bool> reverse = a->Bool(2, false);
  if (!reverse.ok()) return reverse.status();
  if (*by != "key" && *by != "value") return TypeError("You can only sort by either \"key\" or \"value\"");
  if (v.is_undefined()) return UndefinedError(v);
  if (v.kind() != Kind::kDict) return TypeError(absl::StrCat("'", TypeName(v), "' object has no attribute 'items'"));
  struct Entry {
    Value pair, key;
  };
  std::vector<Entry> entries;
  for (const auto& [key, value] : v.dict().entries()) {
    absl::StatusOr<Value> pair = Value::Tuple({key, value});
    if (!pair.ok()) return pair.status();
    absl::StatusOr<Value> k = IgnoreCase(*by == "key" ? key : value, *case_sensitive);
    if (!k.ok()) return k.status();
    entries.push_back({*std::move(pair), *std::move(k)});
  }
  absl::Status st = StableSort(&entries, [](const Entry& e) -> const Value& { return e.key; }, *reverse);
  if (!st.ok()) return st;
  std::vector<Value> out;
  for (Entry& e : entries) out.push_back(std::move(e.pair));
  st = env.budget->ChargeItems(out.size());
  if (!st.ok()) return st;
  return Value::List(std::move(out));
}

// Keys of comma-separated attributes ("age,name") as a tuple, compared like Python lists.
absl::StatusOr<Value> MultiKey(const Value& item, const Value* attribute, bool case_sensitive) {
  if (attribute == nullptr || attribute->is_none()) {
    absl::StatusOr<Value> k = IgnoreCase(item, case_sensitive);
    if (!k.ok()) return k.status();
    return Value::List({*std::move(k)});
  }
  std::vector<Value> keys;
  if (attribute->is_string()) {
    for (absl::string_view part : absl::StrSplit(attribute->string().bytes(), ',')) {
      const Value part_value = Value::Markup(std::string(part));
      absl::StatusOr<Value> k = AttrGetter(&part_value).Get(item);
      if (!k.ok()) return k.status();
      absl::StatusOr<Value> folded = IgnoreCase(*std::move(k), case_sensitive);
      if (!folded.ok()) return folded.status();
      keys.push_back(*std::move(folded));
    }
  } else {
    absl::StatusOr<Value> k = AttrGetter(attribute).Get(item);
    if (!k.ok()) return k.status();
    absl::StatusOr<Value> folded = IgnoreCase(*std::move(k), case_sensitive);
    if (!folded.ok()) return folded.status();
    keys.push_back(*std::move(folded));
  }
  return Value::List(std::move(keys));
}

absl::StatusOr<Value> FilterSort(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("sort", args, {"reverse", "case_sensitive", "attribute"});
  if (!a.ok()) return a.status();
  absl::StatusOr<bool> reverse = a->Bool(0, false);
  if (!reverse.ok()) return reverse.status();
  absl::StatusOr<bool> case_sensitive = a->Bool(1, false);
  if (!case_sensitive.ok()) return case_sensitive.status();
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  std::vector<std::pair<Value, Value>> keyed;  // (key, item)
  for (const Value& item : *items) {
    absl::StatusOr<Value> key = MultiKey(item, a->Get(2), *case_sensitive);
    if (!key.ok()) return key.status();
    keyed.emplace_back(*std::move(key), item);
  }
  absl::Status st = StableSort(&keyed, [](const auto& e) -> const Value& { return e.first; }, *reverse);
  if (!st.ok()) return st;
  std::vector<Value> out;
  for (auto& e : keyed) out.push_back(std::move(e.second));
  st = env.budget->ChargeItems(out.size());
  if (!st.ok()) return st;
  return Value::List(std::move(out));
}

absl::StatusOr<Value> FilterUnique(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("unique", args, {"case_sensitive", "attribute"});
  if (!a.ok()) return a.status();
  absl::StatusOr<bool> case_sensitive = a->Bool(0, false);
  if (!case_sensitive.ok()) return case_sensitive.status();
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  const AttrGetter getter(a->Get(1));
  Dict seen;
  std::vector<Value> out;
  for (const Value& item : *items) {
    absl::StatusOr<Value> key = getter.Get(item);
    if (!key.ok()) return key.status();
    absl::StatusOr<Value> folded = IgnoreCase(*std::move(key), *case_sensitive);
    if (!folded.ok()) return folded.status();
    if (seen.Find(*folded) != nullptr) continue;
    absl::Status st = seen.Set(*folded, Value::None());
    if (!st.ok()) return st;
    out.push_back(item);
  }
  return Generator(std::move(out), *env.budget);
}

absl::StatusOr<Value> MinMax(const Value& v, const CallArgs& args, bool max) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(max ? "max" : "min", args, {"case_sensitive", "attribute"});
  if (!a.ok()) return a.status();
  absl::StatusOr<bool> case_sensitive = a->Bool(0, false);
  if (!case_sensitive.ok()) return case_sensitive.status();
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  const AttrGetter getter(a->Get(1));
  std::optional<Value> best, best_key;
  for (const Value& item : *items) {
    absl::StatusOr<Value> key = getter.Get(item);
    if (!key.ok()) return key.status();
    absl::StatusOr<Value> folded = IgnoreCase(*std::move(key), *case_sensitive);
    if (!folded.ok()) return folded.status();
    bool better = !best.has_value();
    if (!better) {
      absl::StatusOr<bool> less = max ? Less(*best_key, *folded) : Less(*folded, *best_key);
      if (!less.ok()) return less.status();
      better = *less;
    }
    if (better) {
      best = item;
      best_key = *std::move(folded);
    }
  }
  return *best;
}

absl::StatusOr<Value> FilterMax(Env&, const Value& v, const CallArgs& args) { return MinMax(v, args, true); }
absl::StatusOr<Value> FilterMin(Env&, const Value& v, const CallArgs& args) { return MinMax(v, args, false); }

absl::StatusOr<Value> FilterSum(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("sum", args, {"attribute", "start"});
  if (!a.ok()) return a.status();
  Value total = a->Has(1) ? *a->Get(1) : Value::Int(0);
  if (total.is_string()) return TypeError("sum() can't sum strings [use ''.join(seq) instead]");
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  const AttrGetter getter(a->Get(0));
  for (const Value& item : *items) {
    absl::StatusOr<Value> x = getter.Get(item);
    if (!x.ok()) return x.status();
    absl::StatusOr<Value> next = Arithmetic("+", total, *x, *env.budget);
    if (!next.ok()) return next.status();
    total = *std::move(next);
  }
  return total;
}

absl::StatusOr<Value> FilterBatch(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("batch", args, {"linecount", "fill_with"}, 1);
  if (!a.ok()) return a.status();
  absl::StatusOr<int64_t> linecount = a->Int(0, 1);
  if (!linecount.ok()) return linecount.status();
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  std::vector<Value> batches;
  std::vector<Value> current;
  for (const Value& item : *items) {
    if (static_cast<int64_t>(current.size()) == *linecount) {
      absl::StatusOr<Value> batch = Value::List(std::move(current));
      if (!batch.ok()) return batch.status();
      batches.push_back(*std::move(batch));
      current.clear();
    }
    current.push_back(item);
  }
  if (!current.empty()) {
    const Value* fill = a->Get(1);
    if (fill != nullptr && !fill->is_none()) {
      while (static_cast<int64_t>(current.size()) < *linecount) current.push_back(*fill);
    }
    absl::StatusOr<Value> batch = Value::List(std::move(current));
    if (!batch.ok()) return batch.status();
    batches.push_back(*std::move(batch));
  }
  return Generator(std::move(batches), *env.budget);
}

absl::StatusOr<Value> FilterAttr(Env&, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("attr", args, {"name"}, 1);
  if (!a.ok()) return a.status();
  absl::StatusOr<std::string> name = a->String(0, "");
  if (!name.ok()) return name.status();
  if (v.kind() == Kind::kDict) {
    // A dict's keys are not attributes: only its methods are.
    if (*name == "get" || *name == "items" || *name == "keys" || *name == "values" || *name == "copy") {
      return GetAttr(v, *name);
    }
    return Value::Undefined(absl::StrCat("'dict object' has no attribute ", StringRepr(*name)));
  }
  return GetAttr(v, *name);
}

absl::StatusOr<Value> FilterMap(Env& env, const Value& v, const CallArgs& args) {
  if (!Truthy(v)) return Value::Iterator({}, "generator");
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  std::vector<Value> out;
  out.reserve(items->size());
  if (args.positional.empty()) {
    const Value* attribute = nullptr;
    const Value* fallback = nullptr;
    for (const auto& [name, value] : args.keywords) {
      if (name == "attribute") {
        attribute = &value;
      } else if (name == "default") {
        fallback = &value;
      } else {
        return TypeError(absl::StrCat("Unexpected keyword argument '", name, "'"));
      }
    }
    if (attribute == nullptr) return TypeError("map requires a filter argument");
    const AttrGetter getter(attribute);
    const bool use_fallback = fallback != nullptr && !fallback->is_none();
    for (const Value& item : *items) {
      absl::StatusOr<Value> x = getter.Get(item, use_fallback ? fallback : nullptr);
      if (!x.ok()) return x.status();
      out.push_back(*std::move(x));
    }
    return Generator(std::move(out), *env.budget);
  }
  const Value& name = args.positional[0];
  if (!name.is_string()) return TypeError("map: the filter name must be a string");
  const FilterFn filter = FindFilter(name.string().bytes());
  if (filter == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("map: filter '", name.string().bytes(), "' is not supported"));
  }
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keywords = args.keywords;
  for (const Value& item : *items) {
    absl::StatusOr<Value> x = filter(env, item, rest);
    if (!x.ok()) return x.status();
    out.push_back(*std::move(x));
  }
  return Generator(std::move(out), *env.budget);
}

absl::StatusOr<Value> SelectOrReject(Env& env, const Value& v, const CallArgs& args, bool select, bool attr) {
  if (!Truthy(v)) return Value::Iterator({}, "generator");
  size_t next = 0;
  std::optional<AttrGetter> getter;
  if (attr) {
    if (args.positional.empty()) return TypeError("Missing parameter for attribute name");
    getter.emplace(&args.positional[0]);
    next = 1;
  }
  TestFn test = nullptr;
  CallArgs test_args;
  if (next < args.positional.size()) {
    const Value& name = args.positional[next];
    if (!name.is_string()) return TypeError("select/reject: the test name must be a string");
    test = FindTest(name.string().bytes());
    if (test == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("test '", name.string().bytes(), "' is not supported"));
    }
    test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next) + 1,
                                args.positional.end());
    test_args.keywords = args.keywords;
  }
  absl::StatusOr<std::vector<Value>> items = Iterate(v);
  if (!items.ok()) return items.status();
  std::vector<Value> out;
  for (const Value& item : *items) {
    Value subject = item;
    if (getter) {
      absl::StatusOr<Value> x = getter->Get(item);
      if (!x.ok()) return x.status();
      subject = *std::move(x);
    }
    bool pass;
    if (test != nullptr) {
      absl::StatusOr<bool> r = test(env, subject, test_args);
      if (!r.ok()) return r.status();
      pass = *r;
    } else {
      pass = Truthy(subject);
    }
    if (pass == select) out.push_back(item);
  }
  return Generator(std::move(out), *env.budget);
}

absl::StatusOr<Value> FilterSelect(Env& env, const Value& v, const CallArgs& args) {
  return SelectOrReject(env, v, args, true, false);
}
absl::StatusOr<Value> FilterReject(Env& env, const Value& v, const CallArgs& args) {
  return SelectOrReject(env, v, args, false, false);
}
absl::StatusOr<Value> FilterSelectAttr(Env& env, const Value& v, const CallArgs& args) {
  return SelectOrReject(env, v, args, true, true);
}
absl::StatusOr<Value> FilterRejectAttr(Env& env, const Value& v, const CallArgs& args) {
  return SelectOrReject(env, v, args, false, true);
}

absl::StatusOr<Value> FilterToJson(Env& env, const Value& v, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  if (!a.ok()) return a.status();
  JsonOptions options;
  absl::StatusOr<bool> ensure_ascii = a->Bool(0, false);
  if (!ensure_ascii.ok()) return ensure_ascii.status();
  options.ensure_ascii = *ensure_ascii;
  if (const Value* indent = a->Get(1); indent != nullptr && !indent->is_none()) {
    if (indent->is_string()) {
      options.indent = indent->string().bytes();
    } else if (indent->is_integral()) {
      options.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(indent->int_value(), 0, 1 << 20)), ' ');
    } else {
      return TypeError(absl::StrCat("indent must be an int or str, not ", TypeName(*indent)));
    }
  }
  if (const Value* sep = a->Get(2); sep != nullptr && !sep->is_none()) {
    if (!sep->is_list_or_tuple() || sep->items().size() != 2 || !sep->items()[0].is_string() ||
        !sep->items()[1].is_string()) {
      return TypeError("separators must be a pair of strings");
    }
    options.item_separator = sep->items()[0].string().bytes();
    options.key_separator = sep->items()[1].string().bytes();
  }
  absl::StatusOr<bool> sort_keys = a->Bool(3, false);
  if (!sort_keys.ok()) return sort_keys.status();
  options.sort_keys = *sort_keys;
  absl::StatusOr<std::string> json = JsonDumps(v, options, *env.budget);
  if (!json.ok()) return json.status();
  return Value::String(TaintedString::Derived(*std::move(json), HasData(v)));
}

const absl::flat_hash_map<std::string_view, FilterFn>& Filters() {
  static const auto* const filters = new absl::flat_hash_map<std::string_view, FilterFn>{
      {"abs", FilterAbs},
      {"attr", FilterAttr},
      {"batch", FilterBatch},
      {"capitalize", FilterCapitalize},
      {"center", FilterCenter},
      {"count", FilterLength},
      {"d", FilterDefault},
      {"default", FilterDefault},
      {"dictsort", FilterDictSort},
      {"e", FilterEscape},
      {"escape", FilterEscape},
      {"first", FilterFirst},
      {"float", FilterFloat},
      {"forceescape", FilterForceEscape},
      {"indent", FilterIndent},
      {"int", FilterInt},
      {"items", FilterItems},
      {"join", FilterJoin},
      {"last", FilterLast},
      {"length", FilterLength},
      {"list", FilterList},
      {"lower", FilterLower},
      {"map", FilterMap},
      {"max", FilterMax},
      {"min", FilterMin},
      {"reject", FilterReject},
      {"rejectattr", FilterRejectAttr},
      {"replace", FilterReplace},
      {"reverse", FilterReverse},
      {"round", FilterRound},
      {"safe", FilterSafe},
      {"select", FilterSelect},
      {"selectattr", FilterSelectAttr},
      {"sort", FilterSort},
      {"string", FilterString},
      {"sum", FilterSum},
      {"title", FilterTitle},
      {"tojson", FilterToJson},
      {"trim", FilterTrim},
      {"truncate", FilterTruncate},
      {"unique", FilterUnique},
      {"upper", FilterUpper},
      {"wordcount", FilterWordCount},
  };
  return *filters;
}

}  // namespace

FilterFn FindFilter(std::string_view name) {
  auto it = Filters().find(name);
  return it == Filters().end() ? nullptr : it->second;
}

bool IsJinjaFilterName(std::string_view name) {
  static const auto* const unsupported = new absl::flat_hash_set<std::string_view>{
      "filesizeformat", "format", "groupby", "pprint", "random", "slice", "striptags", "urlencode", "urlize",
      "wordwrap", "xmlattr"};
  return FindFilter(name) != nullptr || unsupported->contains(name);
}

}  // namespace decoded::jinja
