// SentencePiece vocabularies (tokenizer.ggml.model = "llama": Gemma, Llama
// 1/2): characters merge greedily by the highest-scoring adjacent pair that is
// itself a piece; characters that end as no piece fall back to <0xXX> byte
// pieces. Follows llama.cpp's llm_tokenizer_spm.
#include <cstdio>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/subword_codec.h"

namespace decoded {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 "▁"

// Byte length of the UTF-8 sequence a lead byte announces, as llama.cpp's
// unicode_len_utf8 counts it (stray continuation bytes count as 1, 0xF8..0xFF
// as 4), so symbol boundaries match the reference on invalid input too.
size_t Utf8SequenceLength(uint8_t lead) {
  static constexpr size_t kByHighNibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kByHighNibble[lead >> 4];
}

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  size_t size;
};

// Highest score first; on equal scores the leftmost pair (SentencePiece and
// llama.cpp agree on this tie-break).
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class SentencePieceCodec final : public SubwordCodec {
 public:
  SentencePieceCodec(const TokenizerVocab& vocab, const PieceIndex& index) : vocab_(vocab), index_(index) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = index_.find(std::string_view(name));
      byte_ids_[b] = it != index_.end() ? it->second : vocab_.unk_id;
    }
  }

  void EncodeRun(std::string_view text, bool after_special, std::vector<int32_t>& out) const override {
    std::string run;
    if (vocab_.add_space_prefix && after_special) run = " ";
    run.append(text);
    Merge(ReplaceAll(run, " ", kSpaceMarker), out);
  }

  std::string PieceBytes(int32_t id) const override {
    const std::string& piece = vocab_.pieces[id];
    if (vocab_.types[id] != TokenType::kByte) return ReplaceAll(piece, kSpaceMarker, " ");
    // "<0xXX>"; anything else typed as a byte renders as nothing.
    if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return "";
    unsigned value = 0;
    if (std::sscanf(piece.c_str() + 3, "%2x", &value) != 1) return "";
    return std::string(1, static_cast<char>(value));
  }

 private:
  // Whether BPE may merge into the piece: normal and user-defined pieces, as
  // in SentencePiece (control, unknown, unused and byte pieces never come out
  // of a merge, so "<eos>" typed as plain text stays plain text).
  bool Mergeable(int32_t id) const {
    const TokenType t = vocab_.types[id];
    return t == TokenType::kNormal || t == TokenType::kUserDefined;
  }

  // SentencePiece BPE over already escaped text.
  void Merge(std::string_view text, std::vector<int32_t>& out) const;

  const TokenizerVocab& vocab_;
  const PieceIndex& index_;
  int32_t byte_ids_[256];  // <0xXX> piece per byte, unk_id where absent
};

void SentencePieceCodec::Merge(std::string_view text, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t prev;
    int32_t next;
    size_t start;
    size_t n;  // 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offs = 0; offs < text.size();) {
    const size_t n = std::min(Utf8SequenceLength(static_cast<uint8_t>(text[offs])), text.size() - offs);
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, offs + n == text.size() ? -1 : index + 1, offs, n});
    offs += n;
  }

  std::vector<Bigram> storage;
  storage.reserve(symbols.size());
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue(BigramOrder{}, std::move(storage));
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const std::string_view joined = text.substr(symbols[left].start, symbols[left].n + symbols[right].n);
    auto it = index_.find(joined);
    if (it == index_.end() || !Mergeable(it->second)) return;
    queue.push({vocab_.scores[it->second], left, right, joined.size()});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Stale entry: one side has since been merged into something else.
    if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].start, symbols[i].n);
    // A merged symbol is always a piece; a single character may not be.
    auto it = index_.find(piece);
    if (it != index_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (char c : piece) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
  }
}

}  // namespace

std::unique_ptr<SubwordCodec> MakeSentencePieceCodec(const TokenizerVocab& vocab, const PieceIndex& index) {
  return std::make_unique<SentencePieceCodec>(vocab, index);
}

}  // namespace decoded
