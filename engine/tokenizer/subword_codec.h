// What differs between vocabulary kinds (internal to engine/tokenizer/).
//
// Tokenizer owns everything the kinds share: the vocabulary, the piece -> id
// index, special-token splitting (SpecialTokenMatcher), BOS handling,
// control/user-defined/unused rendering, UTF-8 repair of decoded text and the
// chat template. A SubwordCodec supplies the two things a kind decides
// itself: how a run of plain text becomes ids, and which bytes a normal
// (or byte) piece stands for. One file per kind:
//
//   "llama"  sentencepiece_codec.cc   SentencePiece BPE by piece score, "▁"
//                                      for space, <0xXX> byte fallback
//   "gpt2"   byte_level_bpe_codec.cc  regex pre-tokenizer (pre_tokenizer.h),
//                                      GPT-2 byte-to-unicode alphabet, BPE by
//                                      merge rank
//
// Thread-safety: immutable after construction; any thread may call any method.
#ifndef DECODED_ENGINE_TOKENIZER_SUBWORD_CODEC_H_
#define DECODED_ENGINE_TOKENIZER_SUBWORD_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace decoded {

// Piece spelling -> id. Keys view into TokenizerVocab::pieces.
using PieceIndex = absl::flat_hash_map<std::string_view, int32_t>;

class SubwordCodec {
 public:
  virtual ~SubwordCodec() = default;

  // Appends the ids of one run of text that holds no special-token spelling
  // any more (SpecialTokenMatcher has split those out). `after_special`: the
  // run starts the text or directly follows a special token. Any bytes,
  // including invalid UTF-8, are accepted; each kind documents what it does
  // with them.
  virtual void EncodeRun(std::string_view text, bool after_special, std::vector<int32_t>& out) const = 0;

  // The bytes piece `id` stands for; called only for kNormal and kByte
  // pieces (Tokenizer renders the other types itself). May be part of a UTF-8
  // sequence.
  virtual std::string PieceBytes(int32_t id) const = 0;
};

// Both factories keep references to `vocab` and `index`, which must outlive
// the codec (Tokenizer::Impl owns all three). `vocab` is complete and checked
// by Tokenizer::FromVocab (lengths, unique non-empty pieces, special ids).

// SentencePiece. Never fails.
std::unique_ptr<SubwordCodec> MakeSentencePieceCodec(const TokenizerVocab& vocab, const PieceIndex& index);

// Byte-level BPE. INVALID_ARGUMENT naming the key when a merge is malformed
// or names pieces the vocabulary lacks; UNIMPLEMENTED naming `vocab.pre` and
// the supported list for an unknown pre-tokenizer.
absl::StatusOr<std::unique_ptr<SubwordCodec>> MakeByteLevelBpeCodec(const TokenizerVocab& vocab,
                                                                    const PieceIndex& index);

}  // namespace decoded

#endif  // DECODED_ENGINE_TOKENIZER_SUBWORD_CODEC_H_
