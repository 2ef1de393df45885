// Splits text at the literal spellings of special tokens before BPE.
//
// Semantics (llama.cpp tokenizer_st_partition): spellings are tried longest
// first; each spelling claims its leftmost non-overlapping occurrences inside
// text not yet claimed, then the next shorter spelling runs on what is left.
// Equal-length spellings are tried in ascending id order. Implemented with a
// byte trie walked from each text position (cost ~ text length x match
// depth), never a scan over all special tokens.
//
// Thread-safety: immutable after the Add() calls; Split() is const.
#ifndef DECODED_ENGINE_TOKENIZER_SPECIAL_TOKEN_MATCHER_H_
#define DECODED_ENGINE_TOKENIZER_SPECIAL_TOKEN_MATCHER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace decoded {

class SpecialTokenMatcher {
 public:
  SpecialTokenMatcher();

  // Registers `spelling` (non-empty) for token `id`. `always`: matched even
  // when the caller does not ask for special parsing (user-defined tokens);
  // otherwise only with parse_special (control and unknown tokens).
  void Add(std::string_view spelling, int32_t id, bool always);

  struct Fragment {
    int32_t id;      // token id, or -1 for a run of plain text
    size_t begin;    // byte range in the text
    size_t end;
  };
  // Replaces `out` with the text's fragments in order (no empty text runs).
  void Split(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

  // A byte range [begin, end) of the text.
  struct Range {
    size_t begin;
    size_t end;
  };
  // As Split, but a control or unknown spelling matches only where it lies
  // wholly inside one of `special_ranges` (sorted, disjoint), so text outside
  // them (e.g. chat message content) can never yield such a token, nor take
  // part in one. User-defined spellings match anywhere, as in Split.
  void SplitWithin(std::string_view text, absl::Span<const Range> special_ranges,
                   std::vector<Fragment>& out) const;

 private:
  int32_t Child(int32_t node, uint8_t byte) const;

  std::array<int32_t, 256> root_children_;
  absl::flat_hash_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> node
  std::vector<int32_t> terminal_id_;              // per node, -1 if none
  std::vector<bool> terminal_always_;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_TOKENIZER_SPECIAL_TOKEN_MATCHER_H_
