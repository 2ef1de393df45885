#include "engine/chat/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_unicode.h"

namespace decoded::jinja {
namespace {

absl::Status TooDeep() {
  return absl::FailedPreconditionError(
      absl::StrCat("value nested deeper than ", Limits::kMaxValueDepth, " levels"));
}

// The dict index key of a hashable value: equal Python values (1, 1.0, True) get equal keys.
std::optional<std::string> HashKey(const Value& v, int depth = 0) {
  if (depth > Limits::kMaxValueDepth) return std::nullopt;
  switch (v.kind()) {
    case Kind::kUndefined:  // Jinja's Undefined hashes by type and equals every Undefined
      return std::string("U");
    case Kind::kNone:
      return std::string("N");
    case Kind::kBool:
    case Kind::kInt:
      return absl::StrCat("I", v.int_value());
    case Kind::kFloat: {
      const double d = v.float_value();
      if (std::isfinite(d) && std::floor(d) == d && d >= -9.2e18 && d <= 9.2e18) {
        return absl::StrCat("I", static_cast<int64_t>(d));
      }
      return absl::StrCat("F", FloatRepr(d));
    }
    case Kind::kString:
      return absl::StrCat("S", v.string().size(), ":", v.string().bytes());
    case Kind::kTuple: {
      std::string key = "T(";
      for (const Value& item : v.items()) {
        std::optional<std::string> k = HashKey(item, depth + 1);
        if (!k) return std::nullopt;
        absl::StrAppend(&key, k->size(), ":", *k);
      }
      key += ")";
      return key;
    }
    default:
      return std::nullopt;
  }
}

bool IsHashable(const Value& v, int depth = 0) {
  if (depth > Limits::kMaxValueDepth) return false;
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kString:
      return true;
    case Kind::kTuple:
      return std::all_of(v.items().begin(), v.items().end(),
                         [&](const Value& item) { return IsHashable(item, depth + 1); });
    default:
      return false;
  }
}

bool EqualsAt(const Value& a, const Value& b, int depth);

bool SequenceEquals(const std::vector<Value>& a, const std::vector<Value>& b, int depth) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!EqualsAt(a[i], b[i], depth + 1)) return false;
  }
  return true;
}

bool NumberEquals(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) return a.int_value() == b.int_value();
  if (a.kind() == Kind::kFloat && b.kind() == Kind::kFloat) return a.float_value() == b.float_value();
  const int64_t i = a.is_integral() ? a.int_value() : b.int_value();
  const double d = a.is_integral() ? b.float_value() : a.float_value();
  return static_cast<long double>(i) == static_cast<long double>(d);
}

bool EqualsAt(const Value& a, const Value& b, int depth) {
  if (depth > Limits::kMaxValueDepth) return false;
  if (a.is_number() && b.is_number()) return NumberEquals(a, b);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.string().bytes() == b.string().bytes();
    case Kind::kList:
    case Kind::kTuple:
      return SequenceEquals(a.items(), b.items(), depth);
    case Kind::kRange:
      return SequenceEquals(a.items(), b.items(), depth);
    case Kind::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [key, value] : a.dict().entries()) {
        const Value* other = b.dict().Find(key);
        if (other == nullptr || !EqualsAt(value, *other, depth + 1)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

absl::Status ReprAt(const Value& v, int depth, std::string* out);

absl::Status ReprItems(const std::vector<Value>& items, int depth, std::string* out) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out->append(", ");
    absl::Status s = ReprAt(items[i], depth + 1, out);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReprDict(const Dict& d, int depth, std::string* out) {
  out->push_back('{');
  bool first = true;
  for (const auto& [key, value] : d.entries()) {
    if (!first) out->append(", ");
    first = false;
    absl::Status s = ReprAt(key, depth + 1, out);
    if (!s.ok()) return s;
    out->append(": ");
    s = ReprAt(value, depth + 1, out);
    if (!s.ok()) return s;
  }
  out->push_back('}');
  return absl::OkStatus();
}

absl::Status NoStr(const Value& v) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot convert a ", TypeName(v), " object to a string (Python would print its address)"));
}

absl::Status ReprAt(const Value& v, int depth, std::string* out) {
  if (depth > Limits::kMaxValueDepth) return TooDeep();
  if (out->size() > Limits::kMaxStringBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("repr() longer than the limit of ", Limits::kMaxStringBytes, " bytes"));
  }
  switch (v.kind()) {
    case Kind::kUndefined:
      out->append("Undefined");
      return absl::OkStatus();
    case Kind::kNone:
      out->append("None");
      return absl::OkStatus();
    case Kind::kBool:
      out->append(v.bool_value() ? "True" : "False");
      return absl::OkStatus();
    case Kind::kInt:
      absl::StrAppend(out, v.int_value());
      return absl::OkStatus();
    case Kind::kFloat:
      out->append(FloatRepr(v.float_value()));
      return absl::OkStatus();
    case Kind::kString:
      if (v.html_safe()) {
        absl::StrAppend(out, "Markup(", StringRepr(v.string().bytes()), ")");
      } else {
        out->append(StringRepr(v.string().bytes()));
      }
      return absl::OkStatus();
    case Kind::kList: {
      out->push_back('[');
      absl::Status s = ReprItems(v.items(), depth, out);
      out->push_back(']');
      return s;
    }
    case Kind::kTuple: {
      out->push_back('(');
      absl::Status s = ReprItems(v.items(), depth, out);
      if (v.items().size() == 1) out->push_back(',');
      out->push_back(')');
      return s;
    }
    case Kind::kDict:
      return ReprDict(v.dict(), depth, out);
    case Kind::kDictItems:
    case Kind::kDictKeys:
    case Kind::kDictValues: {
      absl::StrAppend(out, TypeName(v), "([");
      bool first = true;
      for (const auto& [key, value] : v.dict().entries()) {
        if (!first) out->append(", ");
        first = false;
        absl::Status s;
        if (v.kind() == Kind::kDictItems) {
          out->push_back('(');
          s = ReprAt(key, depth + 1, out);
          out->append(", ");
          if (s.ok()) s = ReprAt(value, depth + 1, out);
          out->push_back(')');
        } else {
          s = ReprAt(v.kind() == Kind::kDictKeys ? key : value, depth + 1, out);
        }
        if (!s.ok()) return s;
      }
      out->append("])");
      return absl::OkStatus();
    }
    case Kind::kRange: {
      const RangeSpec& r = v.range();
      absl::StrAppend(out, "range(", r.start, ", ", r.stop);
      if (r.step != 1) absl::StrAppend(out, ", ", r.step);
      out->push_back(')');
      return absl::OkStatus();
    }
    case Kind::kNamespace: {
      out->append("<Namespace ");
      absl::Status s = ReprDict(v.ns().attrs(), depth, out);
      out->push_back('>');
      return s;
    }
    case Kind::kIterator:
    case Kind::kLoop:
    case Kind::kCallable:
      return NoStr(v);
  }
  return NoStr(v);
}

bool HasDataAt(const Value& v, int depth) {
  if (depth > Limits::kMaxValueDepth) return true;
  switch (v.kind()) {
    case Kind::kString:
      return v.string().has_data();
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kRange:
    case Kind::kIterator:
      for (const Value& item : v.items()) {
        if (HasDataAt(item, depth + 1)) return true;
      }
      return false;
    case Kind::kDict:
    case Kind::kDictItems:
    case Kind::kDictKeys:
    case Kind::kDictValues:
      for (const auto& [key, value] : v.dict().entries()) {
        if (HasDataAt(key, depth + 1) || HasDataAt(value, depth + 1)) return true;
      }
      return false;
    case Kind::kNamespace:
      for (const auto& [key, value] : v.ns().attrs().entries()) {
        if (HasDataAt(value, depth + 1)) return true;
      }
      return false;
    default:
      return false;
  }
}

}  // namespace

Value::Value() : kind_(Kind::kUndefined) {
  static const auto* const kGeneric = new StringPtr(std::make_shared<const TaintedString>("None is undefined"));
  data_ = *kGeneric;
}

Value Value::Undefined(std::string message) {
  Value v(Kind::kUndefined);
  v.data_ = std::make_shared<const TaintedString>(std::move(message));
  return v;
}

Value Value::None() { return Value(Kind::kNone); }

Value Value::Bool(bool b) {
  Value v(Kind::kBool);
  v.data_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v(Kind::kInt);
  v.data_ = i;
  return v;
}

Value Value::Float(double f) {
  Value v(Kind::kFloat);
  v.data_ = f;
  return v;
}

Value Value::String(TaintedString s, bool html_safe) {
  Value v(Kind::kString);
  v.html_safe_ = html_safe;
  v.data_ = std::make_shared<const TaintedString>(std::move(s));
  return v;
}

Value Value::Markup(std::string s) { return String(TaintedString(std::move(s))); }

absl::StatusOr<Value> Value::MakeSequence(Kind kind, std::vector<Value> items) {
  auto seq = std::make_shared<Sequence>();
  for (const Value& item : items) seq->depth = std::max(seq->depth, item.depth() + 1);
  if (seq->depth > Limits::kMaxValueDepth) return TooDeep();
  seq->items = std::move(items);
  Value v(kind);
  v.data_ = SequencePtr(std::move(seq));
  return v;
}

absl::StatusOr<Value> Value::List(std::vector<Value> items) { return MakeSequence(Kind::kList, std::move(items)); }

absl::StatusOr<Value> Value::Tuple(std::vector<Value> items) { return MakeSequence(Kind::kTuple, std::move(items)); }

absl::StatusOr<Value> Value::DictOf(Dict dict) {
  if (dict.depth() > Limits::kMaxValueDepth) return TooDeep();
  Value v(Kind::kDict);
  v.data_ = DictPtr(std::make_shared<const Dict>(std::move(dict)));
  return v;
}

Value Value::DictView(Kind view, std::shared_ptr<const Dict> dict) {
  Value v(view);
  v.data_ = DictPtr(std::move(dict));
  return v;
}

Value Value::Range(int64_t start, int64_t stop, int64_t step, std::vector<Value> items) {
  Value v(Kind::kRange);
  v.data_ = RangePtr(std::make_shared<const RangeSpec>(RangeSpec{start, stop, step, std::move(items)}));
  return v;
}

Value Value::Iterator(std::vector<Value> items, std::string type_name) {
  auto state = std::make_shared<IteratorState>();
  state->items = std::move(items);
  state->type_name = std::move(type_name);
  Value v(Kind::kIterator);
  v.data_ = IteratorPtr(std::move(state));
  return v;
}

Value Value::NamespaceObject(std::shared_ptr<Namespace> ns) {
  Value v(Kind::kNamespace);
  v.data_ = NamespacePtr(std::move(ns));
  return v;
}

Value Value::Loop(std::shared_ptr<LoopContext> loop) {
  Value v(Kind::kLoop);
  v.data_ = LoopPtr(std::move(loop));
  return v;
}

Value Value::Function(std::shared_ptr<const Callable> fn) {
  Value v(Kind::kCallable);
  v.data_ = CallablePtr(std::move(fn));
  return v;
}

const std::string& Value::undefined_message() const { return std::get<StringPtr>(data_)->bytes(); }

int64_t Value::int_value() const {
  if (kind_ == Kind::kBool) return std::get<bool>(data_) ? 1 : 0;
  return std::get<int64_t>(data_);
}

double Value::float_value() const {
  if (kind_ == Kind::kFloat) return std::get<double>(data_);
  return static_cast<double>(int_value());
}

const std::vector<Value>& Value::items() const {
  switch (kind_) {
    case Kind::kRange:
      return std::get<RangePtr>(data_)->items;
    case Kind::kIterator:
      return std::get<IteratorPtr>(data_)->items;
    default:
      return std::get<SequencePtr>(data_)->items;
  }
}

int Value::depth() const {
  switch (kind_) {
    case Kind::kList:
    case Kind::kTuple:
      return std::get<SequencePtr>(data_)->depth;
    case Kind::kDict:
      return std::get<DictPtr>(data_)->depth();
    case Kind::kDictItems:
    case Kind::kDictKeys:
    case Kind::kDictValues:
      return std::get<DictPtr>(data_)->depth() + 1;
    case Kind::kIterator: {
      int d = 1;
      for (const Value& item : items()) d = std::max(d, item.depth() + 1);
      return d;
    }
    case Kind::kRange:
    case Kind::kNamespace:
    case Kind::kLoop:
    case Kind::kCallable:
      return 1;
    default:
      return 0;
  }
}

const void* Value::identity() const {
  return std::visit(
      [](const auto& p) -> const void* {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::monostate> || std::is_same_v<T, bool> || std::is_same_v<T, int64_t> ||
                      std::is_same_v<T, double>) {
          return nullptr;
        } else {
          return p.get();
        }
      },
      data_);
}

const Value* Dict::FindLinear(const Value& key) const {
  for (const auto& [k, v] : entries_) {
    if (Equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::Find(const Value& key) const {
  if (entries_.size() <= kIndexAt) return FindLinear(key);
  std::optional<std::string> k = HashKey(key);
  if (!k) return nullptr;
  auto it = index_.find(*k);
  if (it == index_.end()) return nullptr;
  return &entries_[it->second].second;
}

const Value* Dict::FindString(std::string_view key) const {
  if (entries_.size() <= kIndexAt) {
    for (const auto& [k, v] : entries_) {
      if (k.is_string() && k.string().bytes() == key) return &v;
    }
    return nullptr;
  }
  return Find(Value::Markup(std::string(key)));
}

absl::Status Dict::Set(Value key, Value value) {
  if (!IsHashable(key)) {
    return absl::FailedPreconditionError(absl::StrCat("unhashable type: '", TypeName(key), "'"));
  }
  if (entries_.size() < kIndexAt) {
    for (auto& entry : entries_) {
      if (Equals(entry.first, key)) {
        entry.second = std::move(value);
        return absl::OkStatus();
      }
    }
    entries_.emplace_back(std::move(key), std::move(value));
    return absl::OkStatus();
  }
  if (index_.empty()) {
    for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(*HashKey(entries_[i].first), i);
  }
  std::optional<std::string> k = HashKey(key);
  if (!k) return TooDeep();
  auto [it, inserted] = index_.try_emplace(*k, entries_.size());
  if (inserted) {
    entries_.emplace_back(std::move(key), std::move(value));
  } else {
    entries_[it->second].second = std::move(value);
  }
  return absl::OkStatus();
}

int Dict::depth() const {
  int d = 1;
  for (const auto& [key, value] : entries_) d = std::max({d, key.depth() + 1, value.depth() + 1});
  return d;
}

bool LoopContext::Changed(const Value& values) {
  const std::vector<Value>& now = values.items();
  if (has_last_changed_ && SequenceEquals(now, last_changed_, 0)) return false;
  has_last_changed_ = true;
  last_changed_ = now;
  return true;
}

const char* TypeName(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return v.html_safe() ? "Markup" : "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kDictItems:
      return "dict_items";
    case Kind::kDictKeys:
      return "dict_keys";
    case Kind::kDictValues:
      return "dict_values";
    case Kind::kRange:
      return "range";
    case Kind::kIterator:
      return v.iterator().type_name.c_str();
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kLoop:
      return "LoopContext";
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  return absl::StrCat(TypeName(v), " object");
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.bool_value();
    case Kind::kInt:
      return v.int_value() != 0;
    case Kind::kFloat:
      return v.float_value() != 0.0;
    case Kind::kString:
      return !v.string().empty();
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kRange:
      return !v.items().empty();
    case Kind::kDict:
    case Kind::kDictItems:
    case Kind::kDictKeys:
    case Kind::kDictValues:
      return v.dict().size() > 0;
    default:
      return true;
  }
}

bool Equals(const Value& a, const Value& b) { return EqualsAt(a, b, 0); }

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.int_value() < b.int_value();
    const long double x = a.is_integral() ? static_cast<long double>(a.int_value()) : a.float_value();
    const long double y = b.is_integral() ? static_cast<long double>(b.int_value()) : b.float_value();
    return x < y;
  }
  if (a.is_string() && b.is_string()) return a.string().bytes() < b.string().bytes();
  if (a.kind() == b.kind() && a.is_list_or_tuple()) {
    const std::vector<Value>& x = a.items();
    const std::vector<Value>& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return absl::FailedPreconditionError(absl::StrCat("'<' not supported between instances of '", TypeName(a),
                                                    "' and '", TypeName(b), "'"));
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<int64_t>(CodePointCount(v.string().bytes()));
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kRange:
      return static_cast<int64_t>(v.items().size());
    case Kind::kDict:
    case Kind::kDictItems:
    case Kind::kDictKeys:
    case Kind::kDictValues:
      return static_cast<int64_t>(v.dict().size());
    default:
      return absl::FailedPreconditionError(absl::StrCat("object of type '", TypeName(v), "' has no len()"));
  }
}

absl::StatusOr<TaintedString> ToStr(const Value& v) {
  switch (v.kind()) {
    case Kind::kString:
      return v.string();
    case Kind::kUndefined:
      return TaintedString();
    default: {
      std::string out;
      absl::Status s = ReprAt(v, 0, &out);
      if (!s.ok()) return s;
      return TaintedString::Derived(std::move(out), HasData(v));
    }
  }
}

absl::StatusOr<std::string> Repr(const Value& v) {
  std::string out;
  absl::Status s = ReprAt(v, 0, &out);
  if (!s.ok()) return s;
  return out;
}

bool HasData(const Value& v) { return HasDataAt(v, 0); }

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: positional when -4 <= exponent < 16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  size_t pos = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    pos = 1;
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exponent - 1), '0');
      out += digits;
    } else {
      const size_t int_digits = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= int_digits) {
        out += digits;
        out.append(int_digits - digits.size(), '0');
        out += ".0";
      } else {
        out += digits.substr(0, int_digits);
        out += '.';
        out += digits.substr(int_digits);
      }
    }
    return out;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) {
    out.push_back('.');
    out += digits.substr(1);
  }
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  out += exp_buf;
  return out;
}

std::string StringRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back(quote);
  size_t pos = 0;
  char buf[16];
  while (pos < s.size()) {
    const char32_t c = DecodeUtf8At(s, &pos);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x7F || IsPrintable(c)) {
      AppendUtf8(c, &out);
    } else if (c <= 0xFF) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c <= 0xFFFF) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return std::vector<Value>();
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kRange:
      return v.items();
    case Kind::kIterator: {
      IteratorState& it = v.iterator();
      std::vector<Value> rest(it.items.begin() + static_cast<std::ptrdiff_t>(it.position), it.items.end());
      it.position = it.items.size();
      return rest;
    }
    case Kind::kDict:
    case Kind::kDictKeys:
    case Kind::kDictValues:
    case Kind::kDictItems: {
      std::vector<Value> out;
      out.reserve(v.dict().size());
      for (const auto& [key, value] : v.dict().entries()) {
        if (v.kind() == Kind::kDictItems) {
          absl::StatusOr<Value> pair = Value::Tuple({key, value});
          if (!pair.ok()) return pair.status();
          out.push_back(*std::move(pair));
        } else {
          out.push_back(v.kind() == Kind::kDictValues ? value : key);
        }
      }
      return out;
    }
    case Kind::kString: {
      const TaintedString& s = v.string();
      const size_t count = CodePointCount(s.bytes());
      if (count > Limits::kMaxContainerItems) {
        return absl::FailedPreconditionError(absl::StrCat("iterating a string of ", count,
                                                          " characters exceeds the limit of ",
                                                          Limits::kMaxContainerItems, " items"));
      }
      std::vector<Value> out;
      out.reserve(count);
      for (size_t pos = 0; pos < s.size();) {
        const size_t start = pos;
        DecodeUtf8At(s.bytes(), &pos);
        out.push_back(Value::String(s.Substr(start, pos)));
      }
      return out;
    }
    default:
      return absl::FailedPreconditionError(absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

}  // namespace decoded::jinja
