#include "engine/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace decoded {
namespace {

constexpr std::string_view kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
// tokenizer.json has (?i:'s|'t|'re|'ve|'m|'ll|'d); llama.cpp spells the case
// variants out, which leaves out Unicode case folding (U+017F folds to s).
constexpr std::string_view kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Letters of the Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee, ...
// blocks, as DeepSeek LLM's tokenizer.json lists them.
constexpr std::string_view kDeepSeekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
    R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";

struct Spec {
  std::string_view name;
  std::vector<std::string_view> regexes;
  bool ignore_merges;
};

const std::vector<Spec>& Specs() {
  static const std::vector<Spec> specs = {
      {"default", {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}, false},
      {"gpt-2", {kGpt2}, false},
      {"phi-2", {kGpt2}, false},  // Phi-2's files name GPT-2's pre-tokenizer so (llama.cpp: GPT2)
      {"llama-bpe", {kLlama3}, true},
      {"glm4", {kLlama3}, true},
      {"qwen2", {kQwen2}, false},
      {"smollm", {R"(\p{N})", kGpt2}, false},
      {"deepseek-llm",
       {R"([\r\n])", kDeepSeekLetters, R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
        R"(\s+$)", R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)", R"(\p{N}+)"},
       false},
  };
  return specs;
}

// Unicode White_Space, as a class body: PCRE2's \s adds U+180E.
constexpr std::string_view kWhiteSpace = R"(\t-\r\x{85}\p{Z})";
// Letters and numbers assigned in Unicode 15.0 and 15.1, which PCRE2 10.42's
// Unicode 14 tables class as unassigned; llama.cpp's tables (15.1) and HF's
// have them.
constexpr std::string_view kLettersSince15 =
    R"(\x{1123F}-\x{11240}\x{11F02}\x{11F04}-\x{11F10}\x{11F12}-\x{11F33}\x{1342F}\x{13441}-\x{13446})"
    R"(\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A}\x{1E030}-\x{1E06D}\x{1E4D0}-\x{1E4EB}\x{2B739})"
    R"(\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
constexpr std::string_view kNumbersSince15 = R"(\x{11F50}-\x{11F59}\x{1D2C0}-\x{1D2D3}\x{1E4F0}-\x{1E4F9})";

// Rewrites \s, \S, \p{L} and \p{N} of a tokenizer pattern into the classes
// described in the header, inside and outside character classes.
absl::StatusOr<std::string> ToPcre2Pattern(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const std::string_view rest = pattern.substr(i + 1);
      std::string expanded;  // the class body that replaces the escape
      bool negated = false;
      size_t consumed = 1;
      if (rest[0] == 's' || rest[0] == 'S') {
        expanded = kWhiteSpace;
        negated = rest[0] == 'S';
      } else if (rest.substr(0, 4) == "p{L}" || rest.substr(0, 4) == "p{N}") {
        expanded.push_back('\\');
        expanded.append(rest.substr(0, 4));
        expanded.append(rest[2] == 'L' ? kLettersSince15 : kNumbersSince15);
        consumed = 4;
      } else {
        out.append(pattern.substr(i, 2));
        ++i;
        continue;
      }
      if (in_class) {
        if (negated) return absl::InternalError("\\S inside a class in " + std::string(pattern));
        out.append(expanded);
      } else {
        out.append(negated ? "[^" : "[");
        out.append(expanded);
        out.push_back(']');
      }
      i += consumed;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* context) const { pcre2_match_context_free(context); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* stack) const { pcre2_jit_stack_free(stack); }
};

// Per-thread match state: PCRE2 match data and JIT stacks may not be shared
// between threads that match at the same time.
struct MatchState {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data{pcre2_match_data_create(16, nullptr)};
  // The JIT's default 32 KiB stack on the machine stack runs out on long
  // whitespace runs; this one grows to 8 MiB.
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack{pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr)};
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> context{pcre2_match_context_create(nullptr)};
  MatchState() { pcre2_jit_stack_assign(context.get(), nullptr, jit_stack.get()); }
};

MatchState& ThreadMatchState() {
  thread_local MatchState state;
  return state;
}

}  // namespace

struct PreTokenizer::Regex {
  std::unique_ptr<pcre2_code, CodeDeleter> code;
};

absl::Span<const std::string_view> PreTokenizer::SupportedNames() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const Spec& s : Specs()) v.push_back(s.name);
    return v;
  }();
  return names;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view name) {
  const Spec* spec = nullptr;
  for (const Spec& s : Specs()) {
    if (s.name == name) spec = &s;
  }
  if (spec == nullptr) {
    std::string supported;
    for (std::string_view n : SupportedNames()) {
      if (!supported.empty()) supported += ", ";
      supported += n;
    }
    return absl::UnimplementedError(absl::StrCat("tokenizer.ggml.pre = \"", std::string(name),
                                                 "\" is not a supported pre-tokenizer (supported: ", supported, ")"));
  }
  std::vector<std::unique_ptr<Regex>> regexes;
  for (std::string_view source : spec->regexes) {
    absl::StatusOr<std::string> pattern = ToPcre2Pattern(source);
    if (!pattern.ok()) return pattern.status();
    int error = 0;
    PCRE2_SIZE offset = 0;
    auto regex = std::make_unique<Regex>();
    regex->code.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern->data()), pattern->size(),
                                    PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error, &offset, nullptr));
    if (regex->code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InternalError(absl::StrCat("pre-tokenizer ", std::string(name), ": pattern ", *pattern, " does not compile at ",
                                              offset, ": ", reinterpret_cast<const char*>(message)));
    }
    // Without JIT (a platform that lacks it) the interpreter gives the same matches, more slowly.
    pcre2_jit_compile(regex->code.get(), PCRE2_JIT_COMPLETE);
    regexes.push_back(std::move(regex));
  }
  return std::unique_ptr<PreTokenizer>(new PreTokenizer(std::string(name), std::move(regexes), spec->ignore_merges));
}

PreTokenizer::PreTokenizer(std::string name, std::vector<std::unique_ptr<Regex>> regexes, bool ignore_merges)
    : name_(std::move(name)), regexes_(std::move(regexes)), ignore_merges_(ignore_merges) {}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>& pieces) const {
  MatchState& state = ThreadMatchState();
  std::vector<std::string_view> current;
  if (!text.empty()) current.push_back(text);
  std::vector<std::string_view> next;
  for (const std::unique_ptr<Regex>& regex : regexes_) {
    next.clear();
    for (std::string_view piece : current) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t gap_start = 0;
      size_t start = 0;
      while (start < piece.size()) {
        const int rc = pcre2_match(regex->code.get(), subject, piece.size(), start, PCRE2_NO_UTF_CHECK,
                                   state.data.get(), state.context.get());
        // No match, or an error (match limits; not reached by these patterns
        // on any input we know): the rest of the piece stays one piece.
        if (rc < 0) break;
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data.get());
        const size_t begin = ovector[0];
        const size_t end = ovector[1];
        if (end == begin) {
          // An empty match separates nothing; step over one code point.
          do {
            ++start;
          } while (start < piece.size() && (static_cast<uint8_t>(piece[start]) & 0xC0) == 0x80);
          continue;
        }
        if (begin > gap_start) next.push_back(piece.substr(gap_start, begin - gap_start));
        next.push_back(piece.substr(begin, end - begin));
        gap_start = start = end;
      }
      if (gap_start < piece.size()) next.push_back(piece.substr(gap_start));
    }
    current.swap(next);
  }
  pieces.insert(pieces.end(), current.begin(), current.end());
}

}  // namespace decoded
