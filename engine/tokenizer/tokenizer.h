// Tokenizer built from a GGUF vocabulary (`tokenizer.ggml.*` keys).
//
// Supports the SentencePiece-style vocabulary (`tokenizer.ggml.model` =
// "llama": Gemma, Llama 1/2): pieces with scores, "▁" (U+2581) for spaces,
// byte-fallback pieces <0xXX>, and control / user-defined special tokens
// (<bos>, <start_of_turn>, ...), matched in text when `parse_special` is set.
// Encoding follows SentencePiece BPE: characters are merged greedily by the
// highest-scoring adjacent pair that is itself a vocabulary piece; characters
// that are no piece fall back to their UTF-8 bytes.
//
// Thread-safety: immutable after construction; any thread may call any method.
#ifndef DECODED_ENGINE_TOKENIZER_TOKENIZER_H_
#define DECODED_ENGINE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace decoded {

class GgufFile;

// GGUF `tokenizer.ggml.token_type` values (llama.cpp llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3,
  kUserDefined = 4, kUnused = 5, kByte = 6,
};

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"/"model"
  std::string content;
};

class Tokenizer {
 public:
  // INVALID_ARGUMENT naming the key if the vocabulary is missing or
  // inconsistent (array lengths differ, special ids out of range);
  // UNIMPLEMENTED for tokenizer models other than "llama".
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);

  // Text -> token ids. A BOS is prepended when `add_bos` is set and the model
  // asks for it (tokenizer.ggml.add_bos_token) *and* the text does not already
  // start with the BOS token (no double BOS). Control tokens are only produced
  // from their literal spelling when `parse_special` is set.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos, bool parse_special) const;

  // The bytes a token stands for: "▁" -> " ", <0xXX> -> that byte, control
  // tokens -> "" unless `render_special`. Bytes may be part of a UTF-8 sequence.
  std::string TokenBytes(int32_t id, bool render_special = false) const;

  // Concatenated TokenBytes. INVALID_ARGUMENT on an id outside [0, vocab_size).
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool render_special = false) const;

  // Renders chat turns in the model's turn format (Gemma:
  // "<start_of_turn>user\n...<end_of_turn>\n", assistant role spelled "model",
  // system text folded into the first user turn), optionally ending with the
  // opening of the model's turn. INVALID_ARGUMENT on an unknown role.
  absl::StatusOr<std::string> ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                bool add_generation_prompt) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  // Ids that end generation: EOS, <end_of_turn>/<eot> when the vocabulary has them.
  const std::vector<int32_t>& end_of_generation_ids() const;
  bool IsEndOfGeneration(int32_t id) const;
  TokenType type(int32_t id) const;
  const std::string& piece(int32_t id) const;  // raw vocabulary spelling

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
 public:
  ~Tokenizer();
};

// Turns a stream of token ids into text without ever emitting a split UTF-8
// code point: bytes of an incomplete sequence are held back until it
// completes. Invalid sequences are emitted as U+FFFD. Not thread-safe.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  // Text that became complete with `id` (may be empty).
  std::string Push(int32_t id);
  // Whatever is still held back, invalid bytes replaced by U+FFFD.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_TOKENIZER_TOKENIZER_H_
