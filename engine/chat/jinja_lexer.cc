#include "engine/chat/jinja_lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_status.h"
#include "engine/chat/jinja_unicode.h"

namespace decoded::jinja {
namespace {

// "\r\n" and "\r" become "\n"; one trailing newline is dropped (keep_trailing_newline=False).
std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHexDigit(char c) { return IsAsciiDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool IsNameChar(char c) { return IsAsciiDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

constexpr std::string_view kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                           "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(NormalizeNewlines(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t bad = 0;
    if (!IsValidUtf8(src_, &bad)) return Error(bad, "the template is not valid UTF-8");
    while (pos_ < src_.size()) {
      absl::Status s = state_ == State::kRoot ? LexRoot() : LexTag();
      if (!s.ok()) return s;
    }
    Emit(TokenType::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  enum class State { kRoot, kBlock, kVariable };

  void LineColumn(size_t offset, int* line, int* column) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t start = *(it - 1);
    *line = static_cast<int>(it - line_starts_.begin());
    *column = static_cast<int>(CodePointCount(std::string_view(src_).substr(start, offset - start))) + 1;
  }

  absl::Status Error(size_t offset, absl::string_view message,
                     absl::StatusCode code = absl::StatusCode::kInvalidArgument) const {
    int line, column;
    LineColumn(std::min(offset, src_.size()), &line, &column);
    return absl::Status(code, absl::StrCat(PositionPrefix(line, column), message));
  }

  Token& Emit(TokenType type, std::string text, size_t offset) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    LineColumn(offset, &t.line, &t.column);
    tokens_.push_back(std::move(t));
    return tokens_.back();
  }

  // Length of the whitespace character at `pos`, or 0.
  size_t SpaceAt(size_t pos) const {
    if (pos >= src_.size()) return 0;
    size_t next = pos;
    const char32_t c = DecodeUtf8At(src_, &next);
    return IsSpace(c) ? next - pos : 0;
  }

  size_t SkipSpace(size_t pos) const {
    while (size_t len = SpaceAt(pos)) pos += len;
    return pos;
  }

  static std::string_view RStripSpace(std::string_view text) {
    size_t end = text.size();
    while (end > 0) {
      size_t start = end - 1;
      while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t p = start;
      if (!IsSpace(DecodeUtf8At(text, &p))) break;
      end = start;
    }
    return text.substr(0, end);
  }

  static bool AllSpace(std::string_view text) {
    if (text.empty()) return false;
    size_t p = 0;
    while (p < text.size()) {
      if (!IsSpace(DecodeUtf8At(text, &p))) return false;
    }
    return true;
  }

  bool StartsWith(size_t pos, std::string_view s) const {
    return pos + s.size() <= src_.size() && src_.compare(pos, s.size(), s) == 0;
  }

  // Jinja's whitespace control of the text before a tag: `sign` is the tag's '-', '+' or 0.
  std::string_view StripBeforeTag(std::string_view text, char sign, bool is_variable) const {
    if (sign == '-') return RStripSpace(text);
    if (sign == '+' || is_variable) return text;
    const size_t newline = text.rfind('\n');
    const size_t l_pos = newline == std::string_view::npos ? 0 : newline + 1;
    if ((l_pos > 0 || line_starting_) && AllSpace(text.substr(l_pos))) return text.substr(0, l_pos);
    return text;
  }

  void EmitData(std::string_view text, size_t offset) {
    if (!text.empty()) Emit(TokenType::kData, std::string(text), offset);
  }

  // The end of "{%[-+]? raw [-]%}" starting at `pos`, or nullopt.
  std::optional<size_t> MatchRawBegin(size_t pos) const {
    size_t p = pos + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = SkipSpace(p);
    if (!StartsWith(p, "raw")) return std::nullopt;
    p = SkipSpace(p + 3);
    if (StartsWith(p, "-%}")) return SkipSpace(p + 3);
    if (StartsWith(p, "%}")) return p + 2;
    return std::nullopt;
  }

  // The start and end of the first "{%[-+]? endraw (+%}|-%}\s*|%}\n?)" at or after `pos`.
  std::optional<std::pair<size_t, size_t>> FindRawEnd(size_t pos, char* sign) const {
    for (size_t i = src_.find("{%", pos); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      *sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) *sign = src_[p++];
      p = SkipSpace(p);
      if (!StartsWith(p, "endraw")) continue;
      p = SkipSpace(p + 6);
      if (StartsWith(p, "+%}")) return std::make_pair(i, p + 3);
      if (StartsWith(p, "-%}")) return std::make_pair(i, SkipSpace(p + 3));
      if (StartsWith(p, "%}")) {
        p += 2;
        if (p < src_.size() && src_[p] == '\n') ++p;
        return std::make_pair(i, p);
      }
    }
    return std::nullopt;
  }

  absl::Status LexRoot() {
    size_t tag = std::string::npos;
    for (size_t i = src_.find('{', pos_); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        tag = i;
        break;
      }
    }
    if (tag == std::string::npos) {
      EmitData(std::string_view(src_).substr(pos_), pos_);
      pos_ = src_.size();
      return absl::OkStatus();
    }
    const char kind = src_[tag + 1];
    const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
    const std::string_view text = std::string_view(src_).substr(pos_, tag - pos_);
    const size_t text_offset = pos_;

    if (kind == '%') {
      if (std::optional<size_t> raw_end = MatchRawBegin(tag)) {
        EmitData(StripBeforeTag(text, sign, false), text_offset);
        line_starting_ = src_[*raw_end - 1] == '\n';
        char end_sign = 0;
        std::optional<std::pair<size_t, size_t>> end = FindRawEnd(*raw_end, &end_sign);
        if (!end) return Error(tag, "missing end of raw directive");
        const std::string_view body = std::string_view(src_).substr(*raw_end, end->first - *raw_end);
        EmitData(StripBeforeTag(body, end_sign, false), *raw_end);
        line_starting_ = src_[end->second - 1] == '\n';
        pos_ = end->second;
        return absl::OkStatus();
      }
    }
    EmitData(StripBeforeTag(text, sign, kind == '{'), text_offset);
    const size_t after = tag + 2 + (sign != 0 ? 1 : 0);
    if (kind == '#') return LexComment(tag, after);
    Emit(kind == '{' ? TokenType::kVariableBegin : TokenType::kBlockBegin, "", tag);
    state_ = kind == '{' ? State::kVariable : State::kBlock;
    line_starting_ = false;
    pos_ = after;
    return absl::OkStatus();
  }

  absl::Status LexComment(size_t tag, size_t after) {
    for (size_t j = after; j < src_.size(); ++j) {
      size_t end = 0;
      if (StartsWith(j, "+#}")) {
        end = j + 3;
      } else if (StartsWith(j, "-#}")) {
        end = SkipSpace(j + 3);
      } else if (StartsWith(j, "#}")) {
        end = j + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      line_starting_ = src_[end - 1] == '\n';
      pos_ = end;
      return absl::OkStatus();
    }
    // Jinja ends silently when nothing follows the opener.
    if (after >= src_.size()) {
      pos_ = src_.size();
      return absl::OkStatus();
    }
    return Error(tag, "missing end of comment tag");
  }

  absl::Status LexTag() {
    if (balance_.empty()) {
      std::optional<size_t> end;
      if (state_ == State::kBlock) {
        if (StartsWith(pos_, "+%}")) {
          end = pos_ + 3;
        } else if (StartsWith(pos_, "-%}")) {
          end = SkipSpace(pos_ + 3);
        } else if (StartsWith(pos_, "%}")) {
          end = pos_ + 2;
          if (*end < src_.size() && src_[*end] == '\n') ++*end;
        }
      } else {
        if (StartsWith(pos_, "-}}")) {
          end = SkipSpace(pos_ + 3);
        } else if (StartsWith(pos_, "}}")) {
          end = pos_ + 2;
        }
      }
      if (end) {
        Emit(state_ == State::kBlock ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", pos_);
        line_starting_ = src_[*end - 1] == '\n';
        pos_ = *end;
        state_ = State::kRoot;
        return absl::OkStatus();
      }
    }
    if (SpaceAt(pos_) > 0) {
      pos_ = SkipSpace(pos_);
      return absl::OkStatus();
    }
    line_starting_ = false;
    const char c = src_[pos_];
    if (IsAsciiDigit(c)) return LexNumber();
    if (IsNameChar(c)) {
      size_t end = pos_;
      while (end < src_.size() && IsNameChar(src_[end])) ++end;
      if (end < src_.size() && static_cast<unsigned char>(src_[end]) >= 0x80) {
        size_t p = end;
        if (IsAlnum(DecodeUtf8At(src_, &p))) {
          return Error(end, "non-ASCII identifiers are not supported", absl::StatusCode::kUnimplemented);
        }
      }
      Emit(TokenType::kName, src_.substr(pos_, end - pos_), pos_);
      pos_ = end;
      return absl::OkStatus();
    }
    if (c == '\'' || c == '"') return LexString();
    for (std::string_view op : kOperators) {
      if (!StartsWith(pos_, op)) continue;
      if (op == "{" || op == "(" || op == "[") {
        balance_.push_back(op == "{" ? '}' : op == "(" ? ')' : ']');
      } else if (op == "}" || op == ")" || op == "]") {
        if (balance_.empty()) return Error(pos_, absl::StrCat("unexpected '", Sv(op), "'"));
        const char expected = balance_.back();
        balance_.pop_back();
        if (expected != op[0]) {
          return Error(pos_, absl::StrCat("unexpected '", Sv(op), "', expected '", std::string(1, expected), "'"));
        }
      }
      Emit(TokenType::kOperator, std::string(op), pos_);
      pos_ += op.size();
      return absl::OkStatus();
    }
    if (static_cast<unsigned char>(c) >= 0x80) {
      size_t p = pos_;
      if (IsAlnum(DecodeUtf8At(src_, &p))) {
        return Error(pos_, "non-ASCII identifiers are not supported", absl::StatusCode::kUnimplemented);
      }
    }
    size_t p = pos_;
    std::string ch;
    AppendUtf8(DecodeUtf8At(src_, &p), &ch);
    return Error(pos_, absl::StrCat("unexpected char ", StringReprOf(ch)));
  }

  static std::string StringReprOf(std::string_view s) { return absl::StrCat("'", Sv(s), "'"); }

  // Digits with single underscores between them ("1_000"); returns the end, or `pos` if no digit.
  size_t MatchDigits(size_t pos) const {
    size_t p = pos;
    if (p >= src_.size() || !IsAsciiDigit(src_[p])) return pos;
    while (p < src_.size() && IsAsciiDigit(src_[p])) ++p;
    while (p + 1 < src_.size() && src_[p] == '_' && IsAsciiDigit(src_[p + 1])) {
      ++p;
      while (p < src_.size() && IsAsciiDigit(src_[p])) ++p;
    }
    return p;
  }

  // Jinja's float_re: digits, then a fraction and/or an exponent; not right after a '.'.
  std::optional<size_t> MatchFloat() const {
    if (pos_ > 0 && src_[pos_ - 1] == '.') return std::nullopt;
    const size_t int_end = MatchDigits(pos_);
    size_t p = int_end;
    bool fraction = false;
    if (p < src_.size() && src_[p] == '.') {
      const size_t frac_end = MatchDigits(p + 1);
      if (frac_end > p + 1) {
        p = frac_end;
        fraction = true;
      }
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      const size_t exp_end = MatchDigits(q);
      if (exp_end > q) return exp_end;
    }
    if (fraction) return p;
    return std::nullopt;
  }

  absl::Status LexNumber() {
    if (std::optional<size_t> end = MatchFloat()) {
      std::string text;
      for (size_t i = pos_; i < *end; ++i) {
        if (src_[i] != '_') text.push_back(src_[i]);
      }
      Token& t = Emit(TokenType::kFloat, text, pos_);
      t.float_value = std::strtod(text.c_str(), nullptr);
      pos_ = *end;
      return absl::OkStatus();
    }
    // Jinja's integer_re alternatives, in order: 0b, 0o, 0x, [1-9](_?\d)*, 0(_?0)*.
    int base = 10;
    size_t p = pos_;
    auto prefixed = [&](char lower, int b, auto is_digit) {
      if (src_[pos_] != '0' || pos_ + 1 >= src_.size() || (src_[pos_ + 1] | 0x20) != lower) return false;
      size_t q = pos_ + 2;
      size_t end = q;
      while (true) {
        size_t r = end;
        if (r < src_.size() && src_[r] == '_') ++r;
        if (r < src_.size() && is_digit(src_[r])) {
          end = r + 1;
        } else {
          break;
        }
      }
      if (end == q) return false;
      base = b;
      p = end;
      return true;
    };
    const bool matched = prefixed('b', 2, [](char c) { return c == '0' || c == '1'; }) ||
                         prefixed('o', 8, [](char c) { return c >= '0' && c <= '7'; }) ||
                         prefixed('x', 16, IsHexDigit);
    if (!matched) {
      const char first = src_[pos_];
      p = pos_ + 1;
      while (true) {
        size_t r = p;
        if (r < src_.size() && src_[r] == '_') ++r;
        const bool ok = r < src_.size() && (first == '0' ? src_[r] == '0' : IsAsciiDigit(src_[r]));
        if (!ok) break;
        p = r + 1;
      }
    }
    std::string digits;
    for (size_t i = pos_ + (base == 10 ? 0 : 2); i < p; ++i) {
      if (src_[i] != '_') digits.push_back(src_[i]);
    }
    errno = 0;
    char* end = nullptr;
    const long long value = std::strtoll(digits.c_str(), &end, base);
    if (errno == ERANGE) {
      return Error(pos_, "integer literals beyond 64 bits are not supported", absl::StatusCode::kUnimplemented);
    }
    Token& t = Emit(TokenType::kInteger, src_.substr(pos_, p - pos_), pos_);
    t.int_value = value;
    pos_ = p;
    return absl::OkStatus();
  }

  absl::Status LexString() {
    const char quote = src_[pos_];
    size_t p = pos_ + 1;
    while (p < src_.size() && src_[p] != quote) {
      if (src_[p] == '\\') ++p;
      ++p;
    }
    if (p >= src_.size()) return Error(pos_, absl::StrCat("unexpected char ", StringReprOf(std::string(1, quote))));
    absl::StatusOr<std::string> value = DecodeString(std::string_view(src_).substr(pos_ + 1, p - pos_ - 1), pos_);
    if (!value.ok()) return value.status();
    Emit(TokenType::kString, *std::move(value), pos_);
    pos_ = p + 1;
    return absl::OkStatus();
  }

  // Python's `raw.encode("ascii", "backslashreplace").decode("unicode-escape")`, which is how Jinja decodes string
  // literals; a backslash before a non-ASCII character therefore stays a backslash followed by its \x/\u escape.
  absl::StatusOr<std::string> DecodeString(std::string_view raw, size_t offset) const {
    std::string ascii;
    size_t p = 0;
    while (p < raw.size()) {
      const char32_t c = DecodeUtf8At(raw, &p);
      if (c < 0x80) {
        ascii.push_back(static_cast<char>(c));
      } else {
        char buf[16];
        if (c <= 0xFF) {
          std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
        } else if (c <= 0xFFFF) {
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
        } else {
          std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
        }
        ascii += buf;
      }
    }
    std::string out;
    auto hex = [&](size_t at, int n, char32_t* value) {
      if (at + n > ascii.size()) return false;
      *value = 0;
      for (int k = 0; k < n; ++k) {
        const char h = ascii[at + k];
        if (!IsHexDigit(h)) return false;
        *value = *value * 16 + static_cast<char32_t>(IsAsciiDigit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      return true;
    };
    for (size_t i = 0; i < ascii.size(); ++i) {
      if (ascii[i] != '\\') {
        out.push_back(ascii[i]);
        continue;
      }
      if (i + 1 >= ascii.size()) return Error(offset, "\\ at end of string");
      const char e = ascii[++i];
      char32_t cp = 0;
      switch (e) {
        case '\n':
          continue;
        case '\\':
        case '\'':
        case '"':
          out.push_back(e);
          continue;
        case 'a':
          out.push_back('\a');
          continue;
        case 'b':
          out.push_back('\b');
          continue;
        case 'f':
          out.push_back('\f');
          continue;
        case 'n':
          out.push_back('\n');
          continue;
        case 'r':
          out.push_back('\r');
          continue;
        case 't':
          out.push_back('\t');
          continue;
        case 'v':
          out.push_back('\v');
          continue;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (!hex(i + 1, n, &cp)) return Error(offset, absl::StrCat("truncated \\", std::string(1, e), " escape"));
          i += n;
          break;
        }
        case 'N':
          return Error(offset, "\\N{...} escapes are not supported", absl::StatusCode::kUnimplemented);
        default:
          if (e >= '0' && e <= '7') {
            cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i + 1 < ascii.size() && ascii[i + 1] >= '0' && ascii[i + 1] <= '7'; ++k) {
              cp = cp * 8 + static_cast<char32_t>(ascii[++i] - '0');
            }
            break;
          }
          out.push_back('\\');
          out.push_back(e);
          continue;
      }
      if (cp > 0x10FFFF) return Error(offset, "illegal Unicode character");
      if (cp >= 0xD800 && cp <= 0xDFFF) {
        return Error(offset, "string literals holding lone surrogates are not supported",
                     absl::StatusCode::kUnimplemented);
      }
      AppendUtf8(cp, &out);
    }
    return out;
  }

  const std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  State state_ = State::kRoot;
  bool line_starting_ = true;
  std::vector<char> balance_;
};

}  // namespace

std::string PositionPrefix(int line, int column) {
  return absl::StrCat("chat template line ", line, ", column ", column, ": ");
}

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source) { return Lexer(source).Run(); }

}  // namespace decoded::jinja
