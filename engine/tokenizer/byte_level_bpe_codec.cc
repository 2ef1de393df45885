// Byte-level BPE vocabularies (tokenizer.ggml.model = "gpt2": GPT-2, Llama 3,
// Qwen2, SmolLM, DeepSeek, GLM-4, ...), as llama.cpp's llm_tokenizer_bpe and
// HF tokenizers' ByteLevel + BPE do it:
//
//   1. ill-formed UTF-8 is repaired (ToValidUtf8PerByte, utf8.h);
//   2. the pre-tokenizer (tokenizer.ggml.pre) splits the text into words;
//   3. each byte of a word becomes its character of the GPT-2 byte-to-unicode
//      alphabet (bytes_to_unicode: printable Latin-1 bytes map to themselves,
//      the other 68 to U+0100.. in byte order), i.e. the piece spelling it;
//   4. within a word, the adjacent pair with the lowest merge rank
//      (tokenizer.ggml.merges index; leftmost on ties) merges, until no pair
//      has a merge. With ignore_merges, a word that is a piece as a whole is
//      taken without merging.
//
// A byte whose alphabet character is no piece (SmolLM2 has none for 0x04,
// 0xF1, ...) yields no id, as in llama.cpp and HF. Pieces map back to bytes
// through the inverse alphabet; a piece with a
// character outside it renders as its own UTF-8 spelling (HF's ByteLevel
// decoder does the same).
#include <array>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/subword_codec.h"
#include "engine/tokenizer/utf8.h"
#include "engine/utf8_validation.h"

namespace decoded {
namespace {

// The byte-level alphabet's largest code point: U+0100 + 67.
constexpr uint32_t kAlphabetEnd = 0x100 + 68;

// bytes_to_unicode(): the code point that spells each byte.
std::array<uint32_t, 256> ByteToCodePoint() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 0x100;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : next++;
  }
  return map;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    // The alphabet stays below U+0800: two bytes.
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Merge {
  int32_t rank;
  int32_t result;
};

class ByteLevelBpeCodec final : public SubwordCodec {
 public:
  ByteLevelBpeCodec(const TokenizerVocab& vocab, const PieceIndex& index, std::unique_ptr<PreTokenizer> pre)
      : vocab_(vocab), index_(index), pre_(std::move(pre)) {}

  // Reads the alphabet and the merges; see MakeByteLevelBpeCodec for errors.
  absl::Status Init();

  void EncodeRun(std::string_view text, bool after_special, std::vector<int32_t>& out) const override;
  std::string PieceBytes(int32_t id) const override;

 private:
  void EncodeWord(std::string_view word, std::vector<int32_t>& out) const;

  const TokenizerVocab& vocab_;
  const PieceIndex& index_;
  std::unique_ptr<PreTokenizer> pre_;
  std::array<std::string, 256> byte_spelling_;  // the alphabet character of each byte, UTF-8
  std::array<int32_t, 256> byte_id_;            // the piece spelled by it, -1 if none
  std::array<int16_t, kAlphabetEnd> byte_of_;   // code point -> byte, -1 outside the alphabet
  absl::flat_hash_map<uint64_t, Merge> merges_;  // PairKey(left id, right id)
};

absl::Status ByteLevelBpeCodec::Init() {
  byte_of_.fill(-1);
  const std::array<uint32_t, 256> code_points = ByteToCodePoint();
  for (int b = 0; b < 256; ++b) {
    AppendUtf8(code_points[b], byte_spelling_[b]);
    byte_of_[code_points[b]] = static_cast<int16_t>(b);
    auto it = index_.find(byte_spelling_[b]);
    byte_id_[b] = it == index_.end() ? -1 : it->second;
  }

  merges_.reserve(vocab_.merges.size());
  for (size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
    const std::string& merge = vocab_.merges[rank];
    // "left right"; as in llama.cpp, the separator is the first space after
    // the first character (byte-level pieces spell a space as U+0120).
    const size_t space = merge.find(' ', 1);
    const std::string_view left = std::string_view(merge).substr(0, space);
    const std::string_view right =
        space == std::string::npos ? std::string_view() : std::string_view(merge).substr(space + 1);
    if (space == std::string::npos || right.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.ggml.merges[", rank, "] \"", merge, "\" is not two pieces separated by a space"));
    }
    auto left_it = index_.find(left);
    auto right_it = index_.find(right);
    auto result_it = index_.find(std::string(left) + std::string(right));
    if (left_it == index_.end() || right_it == index_.end() || result_it == index_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.merges[", rank, "] \"", merge,
                                                     "\" names a piece that tokenizer.ggml.tokens lacks"));
    }
    // A repeated pair keeps its first (best) rank, as in llama.cpp.
    merges_.try_emplace(PairKey(left_it->second, right_it->second),
                        Merge{static_cast<int32_t>(rank), result_it->second});
  }
  return absl::OkStatus();
}

void ByteLevelBpeCodec::EncodeRun(std::string_view text, bool after_special, std::vector<int32_t>& out) const {
  std::string repaired;
  if (FindInvalidUtf8(text).has_value()) {
    repaired = ToValidUtf8PerByte(text);
    text = repaired;
  }
  std::vector<std::string_view> words;
  pre_->Split(text, words);
  for (std::string_view word : words) EncodeWord(word, out);
}

void ByteLevelBpeCodec::EncodeWord(std::string_view word, std::vector<int32_t>& out) const {
  if (pre_->ignore_merges()) {
    std::string spelled;
    for (char c : word) spelled += byte_spelling_[static_cast<uint8_t>(c)];
    if (auto it = index_.find(spelled); it != index_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    if (const int32_t id = byte_id_[static_cast<uint8_t>(word[0])]; id >= 0) out.push_back(id);
    return;
  }

  // A byte without a piece stays a symbol (-1) that merges with nothing and
  // is dropped at the end: it still keeps its neighbours apart, as in
  // llama.cpp (HF drops it first and may merge across it).
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;  // -1 at the end of the word
  };
  std::vector<Symbol> symbols(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    symbols[i] = {byte_id_[static_cast<uint8_t>(word[i])], static_cast<int32_t>(i) - 1,
                  i + 1 < word.size() ? static_cast<int32_t>(i) + 1 : -1};
  }

  struct Candidate {
    int32_t rank;
    int32_t left;   // symbol index
    int32_t right;  // symbol index
    int32_t left_id;
    int32_t right_id;
  };
  // Lowest rank first; the leftmost pair on equal ranks (llama.cpp and HF agree).
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  auto try_add = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const int32_t right = symbols[left].next;
    if (symbols[left].id < 0 || symbols[right].id < 0) return;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, right, symbols[left].id, symbols[right].id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) try_add(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    // Stale: either side has merged since. A symbol's id only ever grows into
    // longer pieces, so equal ids at the same, still adjacent, places mean the
    // pair is unchanged.
    if (left.id != c.left_id || left.next != c.right || symbols[c.right].id != c.right_id) continue;
    Symbol& right = symbols[c.right];
    left.id = merges_.find(PairKey(c.left_id, c.right_id))->second.result;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    right.id = -1;
    try_add(left.prev);
    try_add(c.left);
  }
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    if (symbols[i].id >= 0) out.push_back(symbols[i].id);
  }
}

std::string ByteLevelBpeCodec::PieceBytes(int32_t id) const {
  const std::string& piece = vocab_.pieces[id];
  // llama.cpp renders byte-typed pieces of a byte-level vocabulary as nothing.
  if (vocab_.types[id] == TokenType::kByte) return "";
  std::string bytes;
  bytes.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    const uint8_t b0 = static_cast<uint8_t>(piece[i]);
    uint32_t cp = kAlphabetEnd;  // outside unless decoded below
    size_t n = 1;
    if (b0 < 0x80) {
      cp = b0;
    } else if (b0 >= 0xC2 && b0 <= 0xDF && i + 1 < piece.size() &&
               (static_cast<uint8_t>(piece[i + 1]) & 0xC0) == 0x80) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(piece[i + 1]) & 0x3Fu);
      n = 2;
    }
    if (cp >= kAlphabetEnd || byte_of_[cp] < 0) return piece;
    bytes.push_back(static_cast<char>(byte_of_[cp]));
    i += n;
  }
  return bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SubwordCodec>> MakeByteLevelBpeCodec(const TokenizerVocab& vocab,
                                                                    const PieceIndex& index) {
  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre = PreTokenizer::Create(vocab.pre);
  if (!pre.ok()) return pre.status();
  auto codec = std::make_unique<ByteLevelBpeCodec>(vocab, index, *std::move(pre));
  if (absl::Status s = codec->Init(); !s.ok()) return s;
  return std::unique_ptr<SubwordCodec>(std::move(codec));
}

}  // namespace decoded
