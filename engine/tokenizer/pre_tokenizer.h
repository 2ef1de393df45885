// Regex pre-tokenizers of byte-level BPE vocabularies: split text into the
// words BPE then merges within, chosen by tokenizer.ggml.pre (internal to
// engine/tokenizer/).
//
// Each pre-tokenizer is an ordered list of regular expressions, llama.cpp's
// list for that name (llama-vocab.cpp, llm_tokenizer_bpe), which are the
// split patterns of the models' tokenizer.json files, rewritten only where
// std::regex needed it. They run in order, each over every piece the previous
// one left: its matches and the text between them become pieces (HF
// tokenizers' Split with behavior "isolated"), empty pieces are dropped. A
// piece is matched on its own, so look-aheads and `$` see its end as the end
// of the text.
//
// Supported names (refused otherwise, naming them):
//   default       llama.cpp's fallback for old files:
//                 [\p{P}$+<=>^~|]+, the GPT-2 regex, \p{N}+, [0-9][0-9][0-9]
//   gpt-2, phi-2  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
//   llama-bpe     Llama 3 (cl100k): contractions, [^\r\n\p{L}\p{N}]?\p{L}+,
//                 \p{N}{1,3}, punctuation runs with trailing newlines,
//                 newline runs, \s+(?!\S), \s+; whole-word pieces skip BPE
//   glm4          the Llama 3 regex; whole-word pieces skip BPE
//   qwen2         the Llama 3 regex with single digits (\p{N})
//   smollm        \p{N} (every digit alone), then the GPT-2 regex
//   deepseek-llm  newlines, Latin/Greek/Cyrillic/... letter runs, ASCII and
//                 fullwidth punctuation runs, trailing whitespace, CJK and
//                 Hangul runs, \p{N}+
// The Llama 3-style contractions ('s, 'LL, ...) ignore ASCII case only, as
// llama.cpp's spelled-out '[sS]... does; the (?i:...) of tokenizer.json also
// folds U+017F LATIN SMALL LETTER LONG S to s. GPT-2's are lowercase only.
//
// Matching is PCRE2 in UTF mode with Unicode properties (UCP), with two
// corrections so that the classes mean what llama.cpp's tables (Unicode
// 15.1) and HF's mean: \s and \S are Unicode White_Space exactly (PCRE2's \s
// also matches U+180E MONGOLIAN VOWEL SEPARATOR), and \p{L} / \p{N} also
// cover the letters and numbers Unicode 15.0 and 15.1 added (Debian 12's
// PCRE2 10.42 has Unicode 14 tables: CJK extensions H and I, Kawi, Nag
// Mundari, Kaktovik numerals, ...). Characters assigned after 15.1 count as
// unassigned (llama.cpp agrees; HF's Oniguruma, with Unicode 16, does not).
//
// Thread-safety: immutable after Create; Split may be called from any thread.
#ifndef DECODED_ENGINE_TOKENIZER_PRE_TOKENIZER_H_
#define DECODED_ENGINE_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace decoded {

class PreTokenizer {
 public:
  // UNIMPLEMENTED naming `name` and the supported names when it is none of
  // them.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(std::string_view name);

  // The names Create accepts, in the order of the table above.
  static absl::Span<const std::string_view> SupportedNames();

  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;
  ~PreTokenizer();

  // Appends the pieces of `text`, which must be valid UTF-8 (the caller
  // repairs it first), as views into `text`, in order; together they are
  // exactly `text`. Cost: linear in the text length for these patterns.
  void Split(std::string_view text, std::vector<std::string_view>& pieces) const;

  // Whether a piece that is itself a vocabulary piece is taken whole, without
  // BPE (llama.cpp's ignore_merges, HF's BPE ignore_merges): llama-bpe, glm4.
  bool ignore_merges() const { return ignore_merges_; }

  const std::string& name() const { return name_; }

 private:
  struct Regex;
  PreTokenizer(std::string name, std::vector<std::unique_ptr<Regex>> regexes, bool ignore_merges);

  std::string name_;
  std::vector<std::unique_ptr<Regex>> regexes_;
  bool ignore_merges_;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_TOKENIZER_PRE_TOKENIZER_H_
