#include "engine/chat/jinja_methods.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_args.h"
#include "engine/chat/jinja_operators.h"
#include "engine/chat/jinja_status.h"
#include "engine/chat/jinja_strings.h"
#include "engine/chat/jinja_unicode.h"

namespace decoded::jinja {
namespace {

using MethodFn = absl::StatusOr<Value> (*)(Env& env, const Value& self, const CallArgs& args);

struct Method {
  MethodFn fn;
  // Whether the method behaves as for a plain str on a markupsafe.Markup receiver (no string arguments to escape).
  bool markup_ok;
};

class BoundMethod : public Callable {
 public:
  BoundMethod(Value self, std::string name, const Method* method)
      : self_(std::move(self)), name_(std::move(name)), method_(method) {}

  std::string Describe() const override { return absl::StrCat("method ", TypeName(self_), ".", name_); }

  // Markup's methods HTML-escape their string arguments; escaping changes nothing without & < > " '.
  static bool EscapingChangesAny(const CallArgs& args) {
    auto changes = [](const Value& v) {
      return v.is_string() && !v.html_safe() && v.string().bytes().find_first_of("&<>\"'") != std::string::npos;
    };
    for (const Value& v : args.positional) {
      if (changes(v)) return true;
    }
    for (const auto& [name, v] : args.keywords) {
      if (changes(v)) return true;
    }
    return false;
  }

  absl::StatusOr<Value> Call(Env& env, CallArgs args) const override {
    if (method_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(TypeName(self_), ".", name_, "() is not supported"));
    }
    if (self_.is_string() && self_.html_safe() && !method_->markup_ok && EscapingChangesAny(args)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Markup.", name_, "() with arguments holding HTML special characters (a method on a string marked safe) "
          "is not supported"));
    }
    absl::StatusOr<Value> r = method_->fn(env, self_, args);
    if (!r.ok() || !self_.is_string() || !self_.html_safe()) return r;
    // Markup's methods return Markup (a list or tuple of Markup for split and partition).
    if (r->is_string()) return Value::String(r->string(), true);
    if (r->is_list_or_tuple()) {
      std::vector<Value> items;
      for (const Value& item : r->items()) {
        items.push_back(item.is_string() ? Value::String(item.string(), true) : item);
      }
      return r->kind() == Kind::kList ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
    }
    return r;
  }

 private:
  Value self_;
  std::string name_;
  const Method* method_;
};

absl::StatusOr<std::optional<int64_t>> OptionalIndex(const BoundArgs& a, size_t i) {
  const Value* v = a.Get(i);
  if (v == nullptr || v->is_none()) return std::optional<int64_t>();
  if (!v->is_integral()) return TypeError("slice indices must be integers or None");
  return std::optional<int64_t>(v->int_value());
}

// Code points [lo, hi) of `s` (empty when hi <= lo).
std::string_view CodePointRange(std::string_view s, int64_t lo, int64_t hi) {
  if (hi <= lo) return {};
  const size_t begin = ByteOffsetOf(s, static_cast<size_t>(lo));
  const size_t end = begin + ByteOffsetOf(s.substr(begin), static_cast<size_t>(hi - lo));
  return s.substr(begin, end - begin);
}

absl::StatusOr<TaintedString> StringArg(const Value* v, std::string_view method) {
  if (v == nullptr || !v->is_string()) {
    return TypeError(absl::StrCat(Sv(method), "() argument must be str, not ", v ? TypeName(*v) : "nothing"));
  }
  return v->string();
}

// ---- str ----

absl::StatusOr<Value> Strip(const Value& self, const CallArgs& args, StripSide side, std::string_view name) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(name, args, {"chars"});
  if (!a.ok()) return a.status();
  absl::StatusOr<std::optional<std::string>> chars = a->StringOrNone(0);
  if (!chars.ok()) return chars.status();
  return Value::String(PyStrip(self.string(), *chars, side));
}

absl::StatusOr<Value> StrStrip(Env&, const Value& self, const CallArgs& args) {
  return Strip(self, args, StripSide::kBoth, "strip");
}
absl::StatusOr<Value> StrLStrip(Env&, const Value& self, const CallArgs& args) {
  return Strip(self, args, StripSide::kLeft, "lstrip");
}
absl::StatusOr<Value> StrRStrip(Env&, const Value& self, const CallArgs& args) {
  return Strip(self, args, StripSide::kRight, "rstrip");
}

absl::StatusOr<Value> PiecesToList(std::vector<TaintedString> pieces, Budget& budget) {
  absl::Status st = budget.ChargeItems(pieces.size());
  if (!st.ok()) return st;
  std::vector<Value> out;
  out.reserve(pieces.size());
  for (TaintedString& p : pieces) out.push_back(Value::String(std::move(p)));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Split(Env& env, const Value& self, const CallArgs& args, bool from_right) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(from_right ? "rsplit" : "split", args, {"sep", "maxsplit"});
  if (!a.ok()) return a.status();
  absl::StatusOr<std::optional<std::string>> sep = a->StringOrNone(0);
  if (!sep.ok()) return sep.status();
  if (*sep && (*sep)->empty()) return TypeError("empty separator");
  absl::StatusOr<int64_t> maxsplit = a->Int(1, -1);
  if (!maxsplit.ok()) return maxsplit.status();
  return PiecesToList(PySplit(self.string(), *sep, *maxsplit, from_right), *env.budget);
}

absl::StatusOr<Value> StrSplit(Env& env, const Value& self, const CallArgs& args) {
  return Split(env, self, args, false);
}
absl::StatusOr<Value> StrRSplit(Env& env, const Value& self, const CallArgs& args) {
  return Split(env, self, args, true);
}

absl::StatusOr<Value> StrSplitLines(Env& env, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("splitlines", args, {"keepends"});
  if (!a.ok()) return a.status();
  absl::StatusOr<bool> keepends = a->Bool(0, false);
  if (!keepends.ok()) return keepends.status();
  return PiecesToList(PySplitLines(self.string(), *keepends), *env.budget);
}

absl::StatusOr<Value> AffixTest(const Value& self, const CallArgs& args, bool prefix) {
  const char* name = prefix ? "startswith" : "endswith";
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(name, args, {"prefix", "start", "end"}, 1);
  if (!a.ok()) return a.status();
  absl::StatusOr<std::optional<int64_t>> start = OptionalIndex(*a, 1);
  if (!start.ok()) return start.status();
  absl::StatusOr<std::optional<int64_t>> end = OptionalIndex(*a, 2);
  if (!end.ok()) return end.status();
  const std::string& s = self.string().bytes();
  int64_t lo, hi;
  if (!ResolveRange(*start, *end, static_cast<int64_t>(CodePointCount(s)), &lo, &hi)) return Value::Bool(false);
  const std::string_view range = CodePointRange(s, lo, hi);
  std::vector<Value> candidates;
  const Value& arg = *a->Get(0);
  if (arg.is_string()) {
    candidates.push_back(arg);
  } else if (arg.kind() == Kind::kTuple) {
    candidates = arg.items();
  } else {
    return TypeError(absl::StrCat(name, " first arg must be str or a tuple of str, not ", TypeName(arg)));
  }
  if (lo > hi) return Value::Bool(false);
  for (const Value& c : candidates) {
    if (!c.is_string()) {
      return TypeError(absl::StrCat("tuple for ", name, " must only contain str, not ", TypeName(c)));
    }
    const std::string& p = c.string().bytes();
    const bool hit = p.size() <= range.size() &&
                     (prefix ? range.substr(0, p.size()) == p : range.substr(range.size() - p.size()) == p);
    if (hit) return Value::Bool(true);
  }
  return Value::Bool(false);
}

absl::StatusOr<Value> StrStartsWith(Env&, const Value& self, const CallArgs& args) {
  return AffixTest(self, args, true);
}
absl::StatusOr<Value> StrEndsWith(Env&, const Value& self, const CallArgs& args) {
  return AffixTest(self, args, false);
}

absl::StatusOr<Value> CaseMap(const Value& self, const CallArgs& args, std::string_view name,
                              std::string (*fn)(std::string_view)) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(name, args, {});
  if (!a.ok()) return a.status();
  return Value::String(TaintedString::Derived(fn(self.string().bytes()), self.string().has_data()));
}

absl::StatusOr<Value> StrUpper(Env&, const Value& self, const CallArgs& args) {
  return CaseMap(self, args, "upper", PyUpper);
}
absl::StatusOr<Value> StrLower(Env&, const Value& self, const CallArgs& args) {
  return CaseMap(self, args, "lower", PyLower);
}
absl::StatusOr<Value> StrTitle(Env&, const Value& self, const CallArgs& args) {
  return CaseMap(self, args, "title", PyTitle);
}
absl::StatusOr<Value> StrCapitalize(Env&, const Value& self, const CallArgs& args) {
  return CaseMap(self, args, "capitalize", PyCapitalize);
}

absl::StatusOr<Value> StrReplace(Env& env, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("replace", args, {"old", "new", "count"}, 2);
  if (!a.ok()) return a.status();
  absl::StatusOr<TaintedString> old_part = StringArg(a->Get(0), "replace");
  if (!old_part.ok()) return old_part.status();
  absl::StatusOr<TaintedString> new_part = StringArg(a->Get(1), "replace");
  if (!new_part.ok()) return new_part.status();
  absl::StatusOr<int64_t> count = a->Int(2, -1);
  if (!count.ok()) return count.status();
  // Size the result before building it: each replacement may grow the string.
  const std::string& bytes = self.string().bytes();
  const uint64_t limit = *count < 0 ? UINT64_MAX : static_cast<uint64_t>(*count);
  uint64_t matches = 0;
  if (old_part->empty()) {
    matches = std::min<uint64_t>(CodePointCount(bytes) + 1, limit);
  } else {
    for (size_t p = bytes.find(old_part->bytes()); p != std::string::npos && matches < limit;
         p = bytes.find(old_part->bytes(), p + old_part->size())) {
      ++matches;
    }
  }
  const uint64_t size = bytes.size() - matches * old_part->size() + matches * new_part->size();
  absl::Status st = env.budget->ChargeString(static_cast<size_t>(std::min<uint64_t>(size, SIZE_MAX)));
  if (!st.ok()) return st;
  return Value::String(PyReplace(self.string(), *old_part, *new_part, *count));
}

enum class FindMode { kFind, kRFind, kIndex, kRIndex, kCount };

absl::StatusOr<Value> Find(const Value& self, const CallArgs& args, FindMode mode, std::string_view name) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(name, args, {"sub", "start", "end"}, 1);
  if (!a.ok()) return a.status();
  absl::StatusOr<TaintedString> sub = StringArg(a->Get(0), name);
  if (!sub.ok()) return sub.status();
  absl::StatusOr<std::optional<int64_t>> start = OptionalIndex(*a, 1);
  if (!start.ok()) return start.status();
  absl::StatusOr<std::optional<int64_t>> end = OptionalIndex(*a, 2);
  if (!end.ok()) return end.status();
  const std::string& s = self.string().bytes();
  int64_t lo = 0, hi = 0;
  const bool valid = ResolveRange(*start, *end, static_cast<int64_t>(CodePointCount(s)), &lo, &hi) && lo <= hi;
  const std::string& needle = sub->bytes();
  const std::string_view hay = valid ? CodePointRange(s, lo, hi) : std::string_view();
  if (mode == FindMode::kCount) {
    if (!valid) return Value::Int(0);
    if (needle.empty()) return Value::Int(hi - lo + 1);
    int64_t n = 0;
    for (size_t p = hay.find(needle); p != std::string_view::npos; p = hay.find(needle, p + needle.size())) ++n;
    return Value::Int(n);
  }
  int64_t found = -1;
  if (valid) {
    const bool reverse = mode == FindMode::kRFind || mode == FindMode::kRIndex;
    const size_t p = reverse ? hay.rfind(needle) : hay.find(needle);
    if (p != std::string_view::npos) found = lo + static_cast<int64_t>(CodePointCount(hay.substr(0, p)));
  }
  if (found < 0 && (mode == FindMode::kIndex || mode == FindMode::kRIndex)) return TypeError("substring not found");
  return Value::Int(found);
}

absl::StatusOr<Value> StrFind(Env&, const Value& self, const CallArgs& args) {
  return Find(self, args, FindMode::kFind, "find");
}
absl::StatusOr<Value> StrRFind(Env&, const Value& self, const CallArgs& args) {
  return Find(self, args, FindMode::kRFind, "rfind");
}
absl::StatusOr<Value> StrIndex(Env&, const Value& self, const CallArgs& args) {
  return Find(self, args, FindMode::kIndex, "index");
}
absl::StatusOr<Value> StrRIndex(Env&, const Value& self, const CallArgs& args) {
  return Find(self, args, FindMode::kRIndex, "rindex");
}
absl::StatusOr<Value> StrCount(Env&, const Value& self, const CallArgs& args) {
  return Find(self, args, FindMode::kCount, "count");
}

absl::StatusOr<Value> StrJoin(Env& env, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("join", args, {"iterable"}, 1);
  if (!a.ok()) return a.status();
  absl::StatusOr<std::vector<Value>> items = Iterate(*a->Get(0));
  if (!items.ok()) return items.status();
  TaintedString out;
  for (size_t i = 0; i < items->size(); ++i) {
    const Value& item = (*items)[i];
    if (!item.is_string()) {
      return TypeError(absl::StrCat("sequence item ", i, ": expected str instance, ", TypeName(item), " found"));
    }
    if (i > 0) out.Append(self.string());
    // Markup.join escapes the plain items.
    if (self.html_safe() && !item.html_safe()) {
      out.Append(TaintedString::Derived(HtmlEscape(item.string().bytes()), item.string().has_data()));
    } else {
      out.Append(item.string());
    }
    absl::Status st = env.budget->ChargeAppend(out.size(), item.string().size() + self.string().size());
    if (!st.ok()) return st;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> StrFormat(Env& env, const Value& self, const CallArgs& args) {
  const std::string& f = self.string().bytes();
  TaintedString out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  size_t literal_start = 0;
  auto flush = [&](size_t end) {
    if (end > literal_start) out.Append(self.string().Substr(literal_start, end));
  };
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') {
        flush(i + 1);
        literal_start = i + 2;
        ++i;
        continue;
      }
      return TypeError("Single '}' encountered in format string");
    }
    if (c != '{') continue;
    if (i + 1 < f.size() && f[i + 1] == '{') {
      flush(i + 1);
      literal_start = i + 2;
      ++i;
      continue;
    }
    const size_t close = f.find('}', i + 1);
    if (close == std::string::npos) return TypeError("Single '{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    if (field.find('{') != std::string::npos) return TypeError("nested format fields are not supported");
    char conversion = 0;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      if (colon + 1 < field.size()) return TypeError("format specs in str.format fields are not supported");
      field.resize(colon);
    }
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size() || (field[bang + 1] != 's' && field[bang + 1] != 'r')) {
        return TypeError("unknown conversion specifier in format string");
      }
      conversion = field[bang + 1];
      field.resize(bang);
    }
    if (field.find_first_of(".[") != std::string::npos) {
      return TypeError("attribute and index lookups in str.format fields are not supported");
    }
    const Value* arg = nullptr;
    if (field.empty()) {
      if (used_manual) return TypeError("cannot switch from manual field specification to automatic field numbering");
      used_auto = true;
      if (auto_index >= args.positional.size()) return TypeError("Replacement index out of range for positional args");
      arg = &args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      if (used_auto) return TypeError("cannot switch from automatic field numbering to manual field specification");
      used_manual = true;
      const size_t k = std::stoul(field);
      if (k >= args.positional.size()) return TypeError("Replacement index out of range for positional args");
      arg = &args.positional[k];
    } else {
      for (const auto& [name, value] : args.keywords) {
        if (name == field) arg = &value;
      }
      if (arg == nullptr) return TypeError(absl::StrCat("KeyError: '", field, "'"));
    }
    flush(i);
    TaintedString piece;
    if (conversion == 'r') {
      absl::StatusOr<std::string> r = Repr(*arg);
      if (!r.ok()) return r.status();
      piece = TaintedString::Derived(*r, HasData(*arg));
    } else {
      absl::StatusOr<TaintedString> s = ToStr(*arg);
      if (!s.ok()) return s.status();
      piece = *std::move(s);
    }
    if (self.html_safe() && !(arg->is_string() && arg->html_safe())) {
      piece = TaintedString::Derived(HtmlEscape(piece.bytes()), piece.has_data());
    }
    out.Append(piece);
    absl::Status st = env.budget->ChargeAppend(out.size(), piece.size());
    if (!st.ok()) return st;
    literal_start = close + 1;
    i = close;
  }
  flush(f.size());
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Partition(Env&, const Value& self, const CallArgs& args, bool from_right) {
  const char* name = from_right ? "rpartition" : "partition";
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(name, args, {"sep"}, 1);
  if (!a.ok()) return a.status();
  absl::StatusOr<TaintedString> sep = StringArg(a->Get(0), name);
  if (!sep.ok()) return sep.status();
  if (sep->empty()) return TypeError("empty separator");
  const TaintedString& s = self.string();
  const size_t hit = from_right ? s.bytes().rfind(sep->bytes()) : s.bytes().find(sep->bytes());
  if (hit == std::string::npos) {
    if (from_right) return Value::Tuple({Value::Markup(""), Value::Markup(""), self});
    return Value::Tuple({self, Value::Markup(""), Value::Markup("")});
  }
  const size_t after = hit + sep->size();
  return Value::Tuple({Value::String(s.Substr(0, hit)), Value::String(s.Substr(hit, after)),
                       Value::String(s.Substr(after, s.size()))});
}

absl::StatusOr<Value> StrPartition(Env& env, const Value& self, const CallArgs& args) {
  return Partition(env, self, args, false);
}
absl::StatusOr<Value> StrRPartition(Env& env, const Value& self, const CallArgs& args) {
  return Partition(env, self, args, true);
}

absl::StatusOr<Value> RemoveAffix(const Value& self, const CallArgs& args, bool prefix) {
  const char* name = prefix ? "removeprefix" : "removesuffix";
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(name, args, {"affix"}, 1);
  if (!a.ok()) return a.status();
  absl::StatusOr<TaintedString> affix = StringArg(a->Get(0), name);
  if (!affix.ok()) return affix.status();
  const TaintedString& s = self.string();
  const std::string& p = affix->bytes();
  if (p.empty() || p.size() > s.size()) return self;
  if (prefix && s.bytes().compare(0, p.size(), p) == 0) return Value::String(s.Substr(p.size(), s.size()));
  if (!prefix && s.bytes().compare(s.size() - p.size(), p.size(), p) == 0) {
    return Value::String(s.Substr(0, s.size() - p.size()));
  }
  return self;
}

absl::StatusOr<Value> StrRemovePrefix(Env&, const Value& self, const CallArgs& args) {
  return RemoveAffix(self, args, true);
}
absl::StatusOr<Value> StrRemoveSuffix(Env&, const Value& self, const CallArgs& args) {
  return RemoveAffix(self, args, false);
}

absl::StatusOr<Value> Pad(Env& env, const Value& self, const CallArgs& args, PadSide side, std::string_view name) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind(name, args, {"width", "fillchar"}, 1);
  if (!a.ok()) return a.status();
  absl::StatusOr<int64_t> width = a->Int(0, 0);
  if (!width.ok()) return width.status();
  absl::StatusOr<std::string> fill = a->String(1, " ");
  if (!fill.ok()) return fill.status();
  if (CodePointCount(*fill) != 1) return TypeError("The fill character must be exactly one character long");
  absl::Status st = env.budget->ChargeString(static_cast<size_t>(std::max<int64_t>(*width, 0)) * fill->size());
  if (!st.ok()) return st;
  return Value::String(PyPad(self.string(), *width, *fill, side));
}

absl::StatusOr<Value> StrCenter(Env& env, const Value& self, const CallArgs& args) {
  return Pad(env, self, args, PadSide::kCenter, "center");
}
absl::StatusOr<Value> StrLJust(Env& env, const Value& self, const CallArgs& args) {
  return Pad(env, self, args, PadSide::kLeft, "ljust");
}
absl::StatusOr<Value> StrRJust(Env& env, const Value& self, const CallArgs& args) {
  return Pad(env, self, args, PadSide::kRight, "rjust");
}

absl::StatusOr<Value> StrZFill(Env& env, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("zfill", args, {"width"}, 1);
  if (!a.ok()) return a.status();
  absl::StatusOr<int64_t> width = a->Int(0, 0);
  if (!width.ok()) return width.status();
  const TaintedString& s = self.string();
  const int64_t fill = *width - static_cast<int64_t>(CodePointCount(s.bytes()));
  if (fill <= 0) return self;
  absl::Status st = env.budget->ChargeString(static_cast<size_t>(*width));
  if (!st.ok()) return st;
  const bool sign = !s.empty() && (s.bytes()[0] == '+' || s.bytes()[0] == '-');
  TaintedString out = sign ? s.Substr(0, 1) : TaintedString();
  out.AppendMarkup(std::string(static_cast<size_t>(fill), '0'));
  out.Append(s.Substr(sign ? 1 : 0, s.size()));
  return Value::String(std::move(out));
}

template <bool (*Pred)(char32_t)>
absl::StatusOr<Value> StrIsAll(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("is...", args, {});
  if (!a.ok()) return a.status();
  const std::string& s = self.string().bytes();
  if (s.empty()) return Value::Bool(false);
  size_t p = 0;
  while (p < s.size()) {
    if (!Pred(DecodeUtf8At(s, &p))) return Value::Bool(false);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> StrIsUpper(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("isupper", args, {});
  if (!a.ok()) return a.status();
  return Value::Bool(PyIsUpper(self.string().bytes()));
}

absl::StatusOr<Value> StrIsLower(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("islower", args, {});
  if (!a.ok()) return a.status();
  return Value::Bool(PyIsLower(self.string().bytes()));
}

absl::StatusOr<Value> StrIsTitle(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("istitle", args, {});
  if (!a.ok()) return a.status();
  const std::string& s = self.string().bytes();
  bool cased = false, previous_is_cased = false;
  size_t p = 0;
  while (p < s.size()) {
    const char32_t c = DecodeUtf8At(s, &p);
    if (IsUpperChar(c) || IsTitleChar(c)) {
      if (previous_is_cased) return Value::Bool(false);
      previous_is_cased = cased = true;
    } else if (IsLowerChar(c)) {
      if (!previous_is_cased) return Value::Bool(false);
      previous_is_cased = cased = true;
    } else {
      previous_is_cased = false;
    }
  }
  return Value::Bool(cased);
}

absl::StatusOr<Value> StrIsAscii(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("isascii", args, {});
  if (!a.ok()) return a.status();
  return Value::Bool(IsAscii(self.string().bytes()));
}

absl::StatusOr<Value> StrIsPrintable(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("isprintable", args, {});
  if (!a.ok()) return a.status();
  const std::string& s = self.string().bytes();
  size_t p = 0;
  while (p < s.size()) {
    if (!IsPrintable(DecodeUtf8At(s, &p))) return Value::Bool(false);
  }
  return Value::Bool(true);
}

// ---- dict ----

absl::StatusOr<Value> DictGet(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("get", args, {"key", "default"}, 1);
  if (!a.ok()) return a.status();
  const Value* v = self.dict().Find(*a->Get(0));
  if (v != nullptr) return *v;
  return a->Has(1) ? *a->Get(1) : Value::None();
}

template <Kind kView>
absl::StatusOr<Value> DictView(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("items", args, {});
  if (!a.ok()) return a.status();
  return Value::DictView(kView, self.dict_ptr());
}

absl::StatusOr<Value> Copy(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("copy", args, {});
  if (!a.ok()) return a.status();
  return self;
}

// ---- list / tuple ----

absl::StatusOr<Value> SeqCount(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("count", args, {"value"}, 1);
  if (!a.ok()) return a.status();
  int64_t n = 0;
  for (const Value& v : self.items()) n += Equals(v, *a->Get(0)) ? 1 : 0;
  return Value::Int(n);
}

absl::StatusOr<Value> SeqIndex(Env&, const Value& self, const CallArgs& args) {
  absl::StatusOr<BoundArgs> a = BoundArgs::Bind("index", args, {"value", "start", "stop"}, 1);
  if (!a.ok()) return a.status();
  absl::StatusOr<std::optional<int64_t>> start = OptionalIndex(*a, 1);
  if (!start.ok()) return start.status();
  absl::StatusOr<std::optional<int64_t>> stop = OptionalIndex(*a, 2);
  if (!stop.ok()) return stop.status();
  const std::vector<Value>& items = self.items();
  int64_t lo = 0, hi = 0;
  if (ResolveRange(*start, *stop, static_cast<int64_t>(items.size()), &lo, &hi)) {
    for (int64_t i = lo; i < hi; ++i) {
      if (Equals(items[static_cast<size_t>(i)], *a->Get(0))) return Value::Int(i);
    }
  }
  absl::StatusOr<std::string> r = Repr(*a->Get(0));
  return TypeError(absl::StrCat(r.ok() ? *r : "value", " is not in ", TypeName(self)));
}

// ---- loop ----

absl::StatusOr<Value> LoopCycle(Env&, const Value& self, const CallArgs& args) {
  if (!args.keywords.empty()) return TypeError("loop.cycle() takes no keyword arguments");
  if (args.positional.empty()) return TypeError("no items for cycling given");
  return args.positional[self.loop().index0() % args.positional.size()];
}

absl::StatusOr<Value> LoopChanged(Env&, const Value& self, const CallArgs& args) {
  if (!args.keywords.empty()) return TypeError("loop.changed() takes no keyword arguments");
  absl::StatusOr<Value> values = Value::Tuple(args.positional);
  if (!values.ok()) return values.status();
  return Value::Bool(self.loop().Changed(*values));
}

using MethodTable = absl::flat_hash_map<std::string_view, Method>;

const MethodTable& StrMethods() {
  static const auto* const table = new MethodTable{
      {"strip", {StrStrip, false}},
      {"lstrip", {StrLStrip, false}},
      {"rstrip", {StrRStrip, false}},
      {"split", {StrSplit, false}},
      {"rsplit", {StrRSplit, false}},
      {"splitlines", {StrSplitLines, false}},
      {"startswith", {StrStartsWith, true}},
      {"endswith", {StrEndsWith, true}},
      {"upper", {StrUpper, true}},
      {"lower", {StrLower, true}},
      {"title", {StrTitle, true}},
      {"capitalize", {StrCapitalize, true}},
      {"replace", {StrReplace, false}},
      {"find", {StrFind, true}},
      {"rfind", {StrRFind, true}},
      {"index", {StrIndex, true}},
      {"rindex", {StrRIndex, true}},
      {"count", {StrCount, true}},
      {"join", {StrJoin, true}},
      {"format", {StrFormat, true}},
      {"partition", {StrPartition, false}},
      {"rpartition", {StrRPartition, false}},
      {"removeprefix", {StrRemovePrefix, false}},
      {"removesuffix", {StrRemoveSuffix, false}},
      {"center", {StrCenter, false}},
      {"ljust", {StrLJust, false}},
      {"rjust", {StrRJust, false}},
      {"zfill", {StrZFill, false}},
      {"isalpha", {StrIsAll<IsAlpha>, true}},
      {"isalnum", {StrIsAll<IsAlnum>, true}},
      {"isdigit", {StrIsAll<IsDigit>, true}},
      {"isspace", {StrIsAll<IsSpace>, true}},
      {"isupper", {StrIsUpper, true}},
      {"islower", {StrIsLower, true}},
      {"istitle", {StrIsTitle, true}},
      {"isascii", {StrIsAscii, true}},
      {"isprintable", {StrIsPrintable, true}},
  };
  return *table;
}

const MethodTable& DictMethods() {
  static const auto* const table = new MethodTable{
      {"get", {DictGet, true}},
      {"items", {DictView<Kind::kDictItems>, true}},
      {"keys", {DictView<Kind::kDictKeys>, true}},
      {"values", {DictView<Kind::kDictValues>, true}},
      {"copy", {Copy, true}},
  };
  return *table;
}

const MethodTable& ListMethods() {
  static const auto* const table = new MethodTable{
      {"count", {SeqCount, true}},
      {"index", {SeqIndex, true}},
      {"copy", {Copy, true}},
  };
  return *table;
}

const MethodTable& TupleMethods() {
  static const auto* const table = new MethodTable{
      {"count", {SeqCount, true}},
      {"index", {SeqIndex, true}},
  };
  return *table;
}

const MethodTable& LoopMethods() {
  static const auto* const table = new MethodTable{
      {"cycle", {LoopCycle, true}},
      {"changed", {LoopChanged, true}},
  };
  return *table;
}

using NameSet = absl::flat_hash_set<std::string_view>;

// Python 3.11's methods that the immutable sandbox refuses (jinja2.sandbox._mutable_spec).
const NameSet& MutatingMethods(Kind kind) {
  static const auto* const list = new NameSet{"append", "clear", "pop", "reverse", "insert", "sort", "extend",
                                              "remove"};
  static const auto* const dict = new NameSet{"clear", "pop", "popitem", "setdefault", "update"};
  static const auto* const none = new NameSet{};
  if (kind == Kind::kList) return *list;
  if (kind == Kind::kDict) return *dict;
  return *none;
}

// Python 3.11's other methods of str, dict, list, int and float, which this renderer does not implement.
const NameSet& UnsupportedMethods() {
  static const auto* const names = new NameSet{
      "casefold",  "encode",    "expandtabs", "format_map",   "isdecimal",        "isidentifier", "isnumeric",
      "maketrans", "swapcase",  "translate",  "fromkeys",     "as_integer_ratio", "bit_count",    "bit_length",
      "conjugate", "from_bytes", "to_bytes",  "is_integer",   "hex",              "fromhex"};
  return *names;
}

const MethodTable* TableFor(Kind kind) {
  switch (kind) {
    case Kind::kString:
      return &StrMethods();
    case Kind::kDict:
      return &DictMethods();
    case Kind::kList:
      return &ListMethods();
    case Kind::kTuple:
    case Kind::kRange:
      return &TupleMethods();
    case Kind::kLoop:
      return &LoopMethods();
    default:
      return nullptr;
  }
}

}  // namespace

std::optional<Value> LookupMethod(const Value& receiver, std::string_view name) {
  if (MutatingMethods(receiver.kind()).contains(name)) {
    return Value::Undefined(absl::StrCat("access to attribute ", StringRepr(name), " of '", TypeName(receiver),
                                         "' object is unsafe."));
  }
  if (const MethodTable* table = TableFor(receiver.kind())) {
    auto it = table->find(name);
    if (it != table->end()) {
      return Value::Function(std::make_shared<BoundMethod>(receiver, std::string(name), &it->second));
    }
  }
  const bool has_methods = receiver.is_string() || receiver.is_number() || receiver.kind() == Kind::kDict ||
                           receiver.kind() == Kind::kList;
  if (has_methods && UnsupportedMethods().contains(name)) {
    return Value::Function(std::make_shared<BoundMethod>(receiver, std::string(name), nullptr));
  }
  return std::nullopt;
}

bool IsUnsupportedPythonMethod(std::string_view name) { return UnsupportedMethods().contains(name); }

}  // namespace decoded::jinja
