#include "engine/chat/jinja_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_unicode.h"

namespace decoded::jinja {
namespace {

class Encoder {
 public:
  Encoder(const JsonOptions& options, Budget& budget)
      : options_(options),
        budget_(budget),
        item_separator_(options.item_separator.value_or(options.indent ? "," : ", ")) {}

  absl::Status Encode(const Value& v, int level) {
    if (level > Limits::kMaxValueDepth) return absl::FailedPreconditionError("Circular reference detected");
    if (out_.size() > Limits::kMaxStringBytes) return budget_.ChargeString(out_.size());
    switch (v.kind()) {
      case Kind::kNone:
        out_ += "null";
        return absl::OkStatus();
      case Kind::kBool:
        out_ += v.bool_value() ? "true" : "false";
        return absl::OkStatus();
      case Kind::kInt:
        absl::StrAppend(&out_, v.int_value());
        return absl::OkStatus();
      case Kind::kFloat:
        out_ += FloatText(v.float_value());
        return absl::OkStatus();
      case Kind::kString:
        EncodeString(v.string().bytes());
        return absl::OkStatus();
      case Kind::kList:
      case Kind::kTuple:
        return EncodeArray(v.items(), level);
      case Kind::kDict:
        return EncodeObject(v.dict(), level);
      default:
        return absl::FailedPreconditionError(
            absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
    }
  }

  std::string Take() { return std::move(out_); }

 private:
  static std::string FloatText(double d) {
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    return FloatRepr(d);
  }

  void NewlineIndent(int level) {
    if (!options_.indent) return;
    out_.push_back('\n');
    for (int i = 0; i < level; ++i) out_ += *options_.indent;
  }

  absl::Status EncodeArray(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out_ += "[]";
      return absl::OkStatus();
    }
    out_.push_back('[');
    NewlineIndent(level + 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        out_ += item_separator_;
        NewlineIndent(level + 1);
      }
      absl::Status s = Encode(items[i], level + 1);
      if (!s.ok()) return s;
    }
    NewlineIndent(level);
    out_.push_back(']');
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> KeyText(const Value& key) {
    switch (key.kind()) {
      case Kind::kString:
        return key.string().bytes();
      case Kind::kFloat:
        return FloatText(key.float_value());
      case Kind::kBool:
        return std::string(key.bool_value() ? "true" : "false");
      case Kind::kNone:
        return std::string("null");
      case Kind::kInt:
        return absl::StrCat(key.int_value());
      default:
        return absl::FailedPreconditionError(absl::StrCat(
            "keys must be str, int, float, bool or None, not ", TypeName(key)));
    }
  }

  absl::Status EncodeObject(const Dict& dict, int level) {
    if (dict.size() == 0) {
      out_ += "{}";
      return absl::OkStatus();
    }
    std::vector<const std::pair<Value, Value>*> entries;
    for (const auto& entry : dict.entries()) entries.push_back(&entry);
    if (options_.sort_keys) {
      absl::Status error;
      std::stable_sort(entries.begin(), entries.end(), [&](const auto* a, const auto* b) {
        absl::StatusOr<bool> less = Less(a->first, b->first);
        if (!less.ok()) {
          if (error.ok()) error = less.status();
          return false;
        }
        return *less;
      });
      if (!error.ok()) return error;
    }
    out_.push_back('{');
    NewlineIndent(level + 1);
    bool first = true;
    for (const auto* entry : entries) {
      if (!first) {
        out_ += item_separator_;
        NewlineIndent(level + 1);
      }
      first = false;
      absl::StatusOr<std::string> key = KeyText(entry->first);
      if (!key.ok()) return key.status();
      EncodeString(*key);
      out_ += options_.key_separator;
      absl::Status s = Encode(entry->second, level + 1);
      if (!s.ok()) return s;
    }
    NewlineIndent(level);
    out_.push_back('}');
    return absl::OkStatus();
  }

  void AppendU(unsigned code) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "\\u%04x", code);
    out_ += buf;
  }

  void EncodeString(std::string_view s) {
    out_.push_back('"');
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t start = pos;
      const char32_t c = DecodeUtf8At(s, &pos);
      switch (c) {
        case '"':
          out_ += "\\\"";
          break;
        case '\\':
          out_ += "\\\\";
          break;
        case '\n':
          out_ += "\\n";
          break;
        case '\r':
          out_ += "\\r";
          break;
        case '\t':
          out_ += "\\t";
          break;
        case '\b':
          out_ += "\\b";
          break;
        case '\f':
          out_ += "\\f";
          break;
        default:
          if (c < 0x20) {
            AppendU(c);
          } else if (c < 0x80 || !options_.ensure_ascii) {
            out_.append(s.substr(start, pos - start));
          } else if (c < 0x10000) {
            AppendU(c);
          } else {
            const char32_t v = c - 0x10000;
            AppendU(0xD800 | (v >> 10));
            AppendU(0xDC00 | (v & 0x3FF));
          }
      }
    }
    out_.push_back('"');
  }

  const JsonOptions& options_;
  Budget& budget_;
  const std::string item_separator_;
  std::string out_;
};

}  // namespace

absl::StatusOr<std::string> JsonDumps(const Value& v, const JsonOptions& options, Budget& budget) {
  Encoder encoder(options, budget);
  absl::Status s = encoder.Encode(v, 0);
  if (!s.ok()) return s;
  std::string out = encoder.Take();
  s = budget.ChargeString(out.size());
  if (!s.ok()) return s;
  return out;
}

}  // namespace decoded::jinja
