#include "engine/chat/jinja_operators.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_methods.h"
#include "engine/chat/jinja_status.h"
#include "engine/chat/jinja_unicode.h"

namespace decoded::jinja {
namespace {

absl::Status Unsupported(std::string_view op, const Value& a, const Value& b) {
  return absl::FailedPreconditionError(absl::StrCat("unsupported operand type(s) for ", Sv(op), ": '", TypeName(a),
                                                    "' and '", TypeName(b), "'"));
}

absl::Status Overflow() {
  return absl::FailedPreconditionError(
      "integer overflow (Python integers are unbounded; this renderer's are 64-bit)");
}

absl::Status ZeroDivision(absl::string_view message) { return absl::FailedPreconditionError(message); }

// Python's float divmod: the floor quotient and a remainder with the divisor's sign.
void FloatDivMod(double x, double y, double* floordiv, double* mod) {
  *mod = std::fmod(x, y);
  double div = (x - *mod) / y;
  if (*mod != 0) {
    if ((y < 0) != (*mod < 0)) {
      *mod += y;
      div -= 1.0;
    }
  } else {
    *mod = std::copysign(0.0, y);
  }
  if (div != 0) {
    *floordiv = std::floor(div);
    if (div - *floordiv > 0.5) *floordiv += 1.0;
  } else {
    *floordiv = std::copysign(0.0, x / y);
  }
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t count, Budget& budget) {
  if (count < 0) count = 0;
  if (seq.is_string()) {
    const TaintedString& s = seq.string();
    const size_t n = static_cast<size_t>(count);
    if (!s.empty() && n > Limits::kMaxStringBytes / s.size()) return budget.ChargeString(Limits::kMaxStringBytes + 1);
    absl::Status st = budget.ChargeString(s.size() * n);
    if (!st.ok()) return st;
    if (!s.has_data()) {
      std::string out;
      out.reserve(s.size() * n);
      for (size_t i = 0; i < n; ++i) out += s.bytes();
      return Value::String(TaintedString(std::move(out)), seq.html_safe());
    }
    TaintedString out;
    for (size_t i = 0; i < n; ++i) out.Append(s);
    return Value::String(std::move(out), seq.html_safe());
  }
  const std::vector<Value>& items = seq.items();
  const size_t n = static_cast<size_t>(count);
  if (!items.empty() && n > Limits::kMaxContainerItems / items.size()) {
    return budget.ChargeItems(Limits::kMaxContainerItems + 1);
  }
  absl::Status st = budget.ChargeItems(items.size() * n);
  if (!st.ok()) return st;
  std::vector<Value> out;
  out.reserve(items.size() * n);
  for (size_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.kind() == Kind::kList ? Value::List(std::move(out)) : Value::Tuple(std::move(out));
}

absl::StatusOr<Value> Add(const Value& a, const Value& b, Budget& budget) {
  if (a.is_integral() && b.is_integral()) {
    int64_t r;
    if (__builtin_add_overflow(a.int_value(), b.int_value(), &r)) return Overflow();
    return Value::Int(r);
  }
  if (a.is_number() && b.is_number()) return Value::Float(a.float_value() + b.float_value());
  if (a.is_string() && b.is_string()) {
    absl::Status st = budget.ChargeString(a.string().size() + b.string().size());
    if (!st.ok()) return st;
    // markupsafe.Markup.__add__/__radd__: the plain operand is HTML-escaped and the result is Markup.
    const bool safe = a.html_safe() || b.html_safe();
    auto part = [&](const Value& v) {
      if (!safe || v.html_safe()) return v.string();
      return TaintedString::Derived(HtmlEscape(v.string().bytes()), v.string().has_data());
    };
    TaintedString out = part(a);
    out.Append(part(b));
    return Value::String(std::move(out), safe);
  }
  if (a.kind() == b.kind() && a.is_list_or_tuple()) {
    absl::Status st = budget.ChargeItems(a.items().size() + b.items().size());
    if (!st.ok()) return st;
    std::vector<Value> out = a.items();
    out.insert(out.end(), b.items().begin(), b.items().end());
    return a.kind() == Kind::kList ? Value::List(std::move(out)) : Value::Tuple(std::move(out));
  }
  if (a.is_string() || a.is_list_or_tuple()) {
    return absl::FailedPreconditionError(absl::StrCat("can only concatenate ", TypeName(a), " (not \"",
                                                      TypeName(b), "\") to ", TypeName(a)));
  }
  return Unsupported("+", a, b);
}

absl::StatusOr<Value> Multiply(const Value& a, const Value& b, Budget& budget) {
  if (a.is_integral() && b.is_integral()) {
    int64_t r;
    if (__builtin_mul_overflow(a.int_value(), b.int_value(), &r)) return Overflow();
    return Value::Int(r);
  }
  if (a.is_number() && b.is_number()) return Value::Float(a.float_value() * b.float_value());
  const bool a_seq = a.is_string() || a.is_list_or_tuple();
  const bool b_seq = b.is_string() || b.is_list_or_tuple();
  if (a_seq && b.is_integral()) return Repeat(a, b.int_value(), budget);
  if (b_seq && a.is_integral()) return Repeat(b, a.int_value(), budget);
  if (a_seq || b_seq) {
    return absl::FailedPreconditionError(
        absl::StrCat("can't multiply sequence by non-int of type '", TypeName(a_seq ? b : a), "'"));
  }
  return Unsupported("*", a, b);
}

absl::StatusOr<Value> Power(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral() && b.int_value() >= 0) {
    int64_t base = a.int_value();
    int64_t exp = b.int_value();
    int64_t result = 1;
    while (exp > 0) {
      if (exp & 1) {
        if (__builtin_mul_overflow(result, base, &result)) return Overflow();
      }
      exp >>= 1;
      if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return Overflow();
    }
    return Value::Int(result);
  }
  const double x = a.float_value();
  const double y = b.float_value();
  if (x == 0 && y < 0) return ZeroDivision("0.0 cannot be raised to a negative power");
  if (x < 0 && std::floor(y) != y) {
    return absl::FailedPreconditionError("a negative number raised to a fractional power is complex (unsupported)");
  }
  const double r = std::pow(x, y);
  if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) {
    return absl::FailedPreconditionError("(34, 'Numerical result out of range')");
  }
  return Value::Float(r);
}

absl::Status OrderError(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  return absl::FailedPreconditionError(absl::StrCat("'", Sv(op), "' not supported between instances of '",
                                                    TypeName(a), "' and '", TypeName(b), "'"));
}

bool Orderable(const Value& a, const Value& b) {
  return (a.is_number() && b.is_number()) || (a.is_string() && b.is_string()) ||
         (a.kind() == b.kind() && a.is_list_or_tuple());
}

// Python's slice.indices(length) for bounds given as optional ints.
struct SliceBounds {
  int64_t start, stop, step, count;
};

absl::StatusOr<SliceBounds> ResolveSlice(const Value& start, const Value& stop, const Value& step, int64_t length) {
  auto bound = [](const Value& v, const char* what) -> absl::StatusOr<std::optional<int64_t>> {
    if (v.is_none() || v.is_undefined()) return std::optional<int64_t>();
    if (!v.is_integral()) {
      return absl::FailedPreconditionError(
          absl::StrCat("slice indices must be integers or None (", what, " is ", TypeName(v), ")"));
    }
    return std::optional<int64_t>(v.int_value());
  };
  absl::StatusOr<std::optional<int64_t>> b0 = bound(start, "start");
  if (!b0.ok()) return b0.status();
  absl::StatusOr<std::optional<int64_t>> b1 = bound(stop, "stop");
  if (!b1.ok()) return b1.status();
  absl::StatusOr<std::optional<int64_t>> b2 = bound(step, "step");
  if (!b2.ok()) return b2.status();
  const int64_t st = b2->value_or(1);
  if (st == 0) return absl::FailedPreconditionError("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0) {
      x += length;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= length) {
      x = st < 0 ? length - 1 : length;
    }
    return x;
  };
  SliceBounds r;
  r.step = st;
  r.start = clamp(*b0, st < 0 ? length - 1 : 0);
  r.stop = clamp(*b1, st < 0 ? -1 : length);
  if (st > 0) {
    r.count = r.stop > r.start ? (r.stop - r.start + st - 1) / st : 0;
  } else {
    r.count = r.start > r.stop ? (r.start - r.stop - st - 1) / (-st) : 0;
  }
  return r;
}

std::string ElementRepr(const Value& key) {
  absl::StatusOr<std::string> r = Repr(key);
  return r.ok() ? *r : std::string(TypeName(key));
}

Value NoElement(const Value& obj, const Value& key) {
  if (key.is_string()) {
    return Value::Undefined(
        absl::StrCat("'", ObjectTypeRepr(obj), "' has no attribute ", StringRepr(key.string().bytes())));
  }
  return Value::Undefined(absl::StrCat(ObjectTypeRepr(obj), " has no element ", ElementRepr(key)));
}

absl::StatusOr<Value> LoopAttribute(const Value& loop_value, std::string_view name) {
  LoopContext& loop = loop_value.loop();
  const int64_t index0 = static_cast<int64_t>(loop.index0());
  const int64_t length = static_cast<int64_t>(loop.items().size());
  if (name == "index") return Value::Int(index0 + 1);
  if (name == "index0") return Value::Int(index0);
  if (name == "revindex") return Value::Int(length - index0);
  if (name == "revindex0") return Value::Int(length - index0 - 1);
  if (name == "first") return Value::Bool(index0 == 0);
  if (name == "last") return Value::Bool(index0 == length - 1);
  if (name == "length") return Value::Int(length);
  if (name == "depth") return Value::Int(1);
  if (name == "depth0") return Value::Int(0);
  if (name == "previtem") {
    if (index0 == 0) return Value::Undefined("there is no previous item");
    return loop.items()[static_cast<size_t>(index0 - 1)];
  }
  if (name == "nextitem") {
    if (index0 + 1 >= length) return Value::Undefined("there is no next item");
    return loop.items()[static_cast<size_t>(index0 + 1)];
  }
  if (std::optional<Value> method = LookupMethod(loop_value, name)) return *method;
  return Value::Undefined(absl::StrCat("'LoopContext object' has no attribute ", StringRepr(name)));
}

}  // namespace

absl::Status UndefinedError(const Value& undefined) {
  return absl::FailedPreconditionError(undefined.undefined_message());
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<Value> Arithmetic(std::string_view op, const Value& a, const Value& b, Budget& budget) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (op == "+") return Add(a, b, budget);
  if (op == "*") return Multiply(a, b, budget);
  if (op == "**") {
    if (!a.is_number() || !b.is_number()) return Unsupported("** or pow()", a, b);
    return Power(a, b);
  }
  if (op == "%" && a.is_string()) {
    return absl::FailedPreconditionError("printf-style string formatting (str % value) is not supported");
  }
  if (!a.is_number() || !b.is_number()) return Unsupported(op, a, b);
  const bool ints = a.is_integral() && b.is_integral();
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.int_value(), b.int_value(), &r)) return Overflow();
      return Value::Int(r);
    }
    return Value::Float(a.float_value() - b.float_value());
  }
  if (op == "/") {
    if (b.float_value() == 0) return ZeroDivision(ints ? "division by zero" : "float division by zero");
    return Value::Float(a.float_value() / b.float_value());
  }
  if (op == "//" || op == "%") {
    if (ints) {
      const int64_t x = a.int_value();
      const int64_t y = b.int_value();
      if (y == 0) return ZeroDivision(op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) {
        if (op == "%") return Value::Int(0);
        return Overflow();
      }
      int64_t q = x / y;
      int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        q -= 1;
        r += y;
      }
      return Value::Int(op == "//" ? q : r);
    }
    const double y = b.float_value();
    if (y == 0) return ZeroDivision(op == "//" ? "float floor division by zero" : "float modulo");
    double div, mod;
    FloatDivMod(a.float_value(), y, &div, &mod);
    return Value::Float(op == "//" ? div : mod);
  }
  return absl::InternalError(absl::StrCat("unknown operator ", Sv(op)));
}

absl::StatusOr<Value> Negate(const Value& v) {
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_integral()) {
    if (v.int_value() == std::numeric_limits<int64_t>::min()) return Overflow();
    return Value::Int(-v.int_value());
  }
  if (v.kind() == Kind::kFloat) return Value::Float(-v.float_value());
  return absl::FailedPreconditionError(absl::StrCat("bad operand type for unary -: '", TypeName(v), "'"));
}

absl::StatusOr<Value> Positive(const Value& v) {
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_integral()) return Value::Int(v.int_value());
  if (v.kind() == Kind::kFloat) return v;
  return absl::FailedPreconditionError(absl::StrCat("bad operand type for unary +: '", TypeName(v), "'"));
}

absl::StatusOr<Value> Concat(const std::vector<Value>& parts, Budget& budget) {
  TaintedString out;
  for (const Value& part : parts) {
    absl::StatusOr<TaintedString> s = ToStr(part);
    if (!s.ok()) return s.status();
    absl::Status st = budget.ChargeAppend(out.size() + s->size(), s->size());
    if (!st.ok()) return st;
    out.Append(*s);
  }
  return Value::String(std::move(out));
}

absl::StatusOr<bool> Compare(std::string_view op, const Value& a, const Value& b) {
  if (op == "==") return Equals(a, b);
  if (op == "!=") return !Equals(a, b);
  if (op == "in") return Contains(b, a);
  if (op == "notin") {
    absl::StatusOr<bool> in = Contains(b, a);
    if (!in.ok()) return in.status();
    return !*in;
  }
  if (!Orderable(a, b)) return OrderError(op, a, b);
  if (a.is_number()) {
    // Exact for 64-bit ints (long double has a 64-bit mantissa); false against NaN, as in Python.
    const long double x = a.is_integral() ? static_cast<long double>(a.int_value()) : a.float_value();
    const long double y = b.is_integral() ? static_cast<long double>(b.int_value()) : b.float_value();
    if (op == "<") return x < y;
    if (op == ">") return x > y;
    if (op == "<=") return x <= y;
    return x >= y;
  }
  absl::StatusOr<bool> r = op == "<" || op == ">=" ? Less(a, b) : Less(b, a);
  if (!r.ok()) return r.status();
  return op == "<" || op == ">" ? *r : !*r;
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (!item.is_string()) {
        return absl::FailedPreconditionError(absl::StrCat("'in <string>' requires string as left operand, not ",
                                                          TypeName(item)));
      }
      return container.string().bytes().find(item.string().bytes()) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kRange:
    case Kind::kDictValues:
    case Kind::kDictItems: {
      absl::StatusOr<std::vector<Value>> items = Iterate(container);
      if (!items.ok()) return items.status();
      for (const Value& v : *items) {
        if (Equals(v, item)) return true;
      }
      return false;
    }
    case Kind::kIterator: {
      IteratorState& it = container.iterator();
      while (it.position < it.items.size()) {
        if (Equals(it.items[it.position++], item)) return true;
      }
      return false;
    }
    case Kind::kDict:
    case Kind::kDictKeys: {
      const bool hashable = item.is_undefined() || item.is_number() || item.is_string() || item.is_none() ||
                            item.kind() == Kind::kTuple;
      if (!hashable) return absl::FailedPreconditionError(absl::StrCat("unhashable type: '", TypeName(item), "'"));
      return container.dict().Find(item) != nullptr;
    }
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Kind::kUndefined:
      return UndefinedError(obj);
    case Kind::kNamespace: {
      const Value* v = obj.ns().attrs().FindString(name);
      if (v != nullptr) return *v;
      return Value::Undefined(absl::StrCat("'Namespace object' has no attribute ", StringRepr(name)));
    }
    case Kind::kLoop:
      return LoopAttribute(obj, name);
    default:
      break;
  }
  if (name.size() > 4 && name.substr(0, 2) == "__" && name.substr(name.size() - 2) == "__") {
    return Value::Undefined(absl::StrCat("access to attribute ", StringRepr(name), " of '", TypeName(obj),
                                         "' object is unsafe."));
  }
  if (std::optional<Value> method = LookupMethod(obj, name)) return *method;
  if (obj.kind() == Kind::kDict) {
    const Value* v = obj.dict().FindString(name);
    if (v != nullptr) return *v;
  }
  return Value::Undefined(absl::StrCat("'", ObjectTypeRepr(obj), "' has no attribute ", StringRepr(name)));
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::kUndefined:
      return UndefinedError(obj);
    case Kind::kString:
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kRange: {
      if (!key.is_integral()) break;
      const bool is_str = obj.is_string();
      const int64_t length = is_str ? static_cast<int64_t>(CodePointCount(obj.string().bytes()))
                                    : static_cast<int64_t>(obj.items().size());
      int64_t i = key.int_value();
      if (i < 0) i += length;
      if (i < 0 || i >= length) return NoElement(obj, key);
      if (is_str) {
        const std::string& bytes = obj.string().bytes();
        const size_t begin = ByteOffsetOf(bytes, static_cast<size_t>(i));
        size_t end = begin;
        DecodeUtf8At(bytes, &end);
        return Value::String(obj.string().Substr(begin, end), obj.html_safe());
      }
      return obj.items()[static_cast<size_t>(i)];
    }
    case Kind::kDict: {
      const Value* v = obj.dict().Find(key);
      if (v != nullptr) return *v;
      break;
    }
    default:
      break;
  }
  if (key.is_string()) {
    const std::string& name = key.string().bytes();
    if (obj.kind() == Kind::kNamespace || obj.kind() == Kind::kLoop) return GetAttr(obj, name);
    if (!(name.size() > 4 && name.substr(0, 2) == "__")) {
      if (std::optional<Value> method = LookupMethod(obj, name)) return *method;
    }
  }
  return NoElement(obj, key);
}

absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step,
                               Budget& budget) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_string()) {
    const TaintedString& s = obj.string();
    const std::string& bytes = s.bytes();
    absl::StatusOr<SliceBounds> b = ResolveSlice(start, stop, step, static_cast<int64_t>(CodePointCount(bytes)));
    if (!b.ok()) return b.status();
    if (b->count == 0) return Value::String(TaintedString(), obj.html_safe());
    const size_t first = ByteOffsetOf(bytes, static_cast<size_t>(b->start));
    if (b->step == 1) {
      const size_t last = first + ByteOffsetOf(std::string_view(bytes).substr(first), static_cast<size_t>(b->count));
      return Value::String(s.Substr(first, last), obj.html_safe());
    }
    // Walk from the first selected code point, forward or backward, taking every |step|-th one.
    std::string out;
    size_t pos = first;
    for (int64_t k = 0; k < b->count; ++k) {
      size_t end = pos;
      DecodeUtf8At(bytes, &end);
      out.append(bytes, pos, end - pos);
      if (k + 1 == b->count) break;
      if (b->step > 0) {
        for (int64_t j = 0; j < b->step; ++j) DecodeUtf8At(bytes, &pos);
      } else {
        for (int64_t j = 0; j < -b->step; ++j) DecodeUtf8Before(bytes, &pos);
      }
    }
    absl::Status st = budget.ChargeString(out.size());
    if (!st.ok()) return st;
    return Value::String(TaintedString::Derived(std::move(out), s.has_data()), obj.html_safe());
  }
  if (obj.is_list_or_tuple() || obj.kind() == Kind::kRange) {
    const std::vector<Value>& items = obj.items();
    absl::StatusOr<SliceBounds> b = ResolveSlice(start, stop, step, static_cast<int64_t>(items.size()));
    if (!b.ok()) return b.status();
    std::vector<Value> out;
    out.reserve(static_cast<size_t>(b->count));
    for (int64_t k = 0, i = b->start; k < b->count; ++k, i += b->step) out.push_back(items[static_cast<size_t>(i)]);
    if (obj.kind() == Kind::kRange) {
      const RangeSpec& r = obj.range();
      const int64_t new_start = r.start + b->start * r.step;
      const int64_t new_step = r.step * b->step;
      return Value::Range(new_start, new_start + b->count * new_step, new_step, std::move(out));
    }
    return obj.kind() == Kind::kList ? Value::List(std::move(out)) : Value::Tuple(std::move(out));
  }
  // Jinja compiles `x[a:b]` as a plain Python subscription (no fallback to Undefined).
  if (obj.kind() == Kind::kDict) return absl::FailedPreconditionError("unhashable type: 'slice'");
  return absl::FailedPreconditionError(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
}

}  // namespace decoded::jinja
