// Tokenizer built from a GGUF vocabulary (`tokenizer.ggml.*` keys).
//
// Two vocabulary kinds (`tokenizer.ggml.model`), behind one API:
//   "llama"  SentencePiece (Gemma, Llama 1/2): pieces with scores, "▁"
//            (U+2581) for spaces, byte-fallback pieces <0xXX>; characters
//            merge greedily by the highest-scoring adjacent pair that is
//            itself a piece, characters that are no piece fall back to their
//            UTF-8 bytes.
//   "gpt2"   byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM, DeepSeek, GLM-4):
//            a regex pre-tokenizer chosen by `tokenizer.ggml.pre` splits text
//            into words (engine/tokenizer/pre_tokenizer.h lists the supported
//            ones), each byte is spelled by its character of the GPT-2
//            byte-to-unicode alphabet, and within a word the adjacent pair
//            with the lowest `tokenizer.ggml.merges` rank merges first.
// Both split control / user-defined special tokens (<bos>, <|im_start|>, ...)
// out of text the same way. docs/tokenizers.md describes both, and how they
// were checked against llama.cpp and Hugging Face.
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
#include "engine/chat/chat_message.h"
#include "engine/tokenizer/utf8.h"

namespace decoded {

class GgufFile;

// GGUF `tokenizer.ggml.token_type` values (llama.cpp llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3,
  kUserDefined = 4, kUnused = 5, kByte = 6,
};

// A vocabulary in plain vectors: what FromGguf reads from the `tokenizer.ggml.*`
// keys. FromVocab builds a tokenizer from it directly (tests, other formats).
struct TokenizerVocab {
  std::string model = "llama";        // tokenizer.ggml.model: "llama" or "gpt2"
  std::vector<std::string> pieces;    // tokenizer.ggml.tokens: SentencePiece spelling ("▁" for
                                      // space), or GPT-2 byte-level spelling ("Ġ" for space)
  std::vector<float> scores;          // tokenizer.ggml.scores; empty = all 0
  std::vector<TokenType> types;       // tokenizer.ggml.token_type; empty = all kNormal
  int32_t bos_id = -1;                // -1 = none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  int32_t eot_id = -1;                // tokenizer.ggml.eot_token_id; also ends generation
  bool add_bos = true;                // tokenizer.ggml.add_bos_token
  bool add_space_prefix = false;      // tokenizer.ggml.add_space_prefix ("llama" only)
  // "gpt2" only: tokenizer.ggml.merges ("left right", rank = index) and
  // tokenizer.ggml.pre (the pre-tokenizer's name).
  std::vector<std::string> merges;
  std::string pre;
  // tokenizer.chat_template: the model's Jinja chat template ("" = none).
  std::string chat_template;
};

class Tokenizer {
 public:
  // Reads only the tokenizer.ggml.* keys. INVALID_ARGUMENT naming the key if
  // the vocabulary is missing or inconsistent (array lengths differ, special
  // ids out of range, a "gpt2" vocabulary without merges); UNIMPLEMENTED for
  // tokenizer models other than "llama" and "gpt2", and for a
  // tokenizer.ggml.pre this build does not know (the message names it and the
  // supported ones). A "gpt2" file without tokenizer.ggml.pre gets "default",
  // as in llama.cpp. Defaults for absent keys: "llama" as llama.cpp (BOS 1,
  // EOS 2, UNK 0, add_bos and add_space_prefix true); "gpt2" no special ids,
  // add_bos only for pre "llama-bpe", never a space prefix.
  // `chat_template_override` (non-empty) replaces the file's
  // tokenizer.chat_template, like vLLM's --chat-template: for a model file
  // without one, or to fix one; INVALID_ARGUMENT if it cannot be parsed (a
  // file's own unusable template only disables chat turns).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file,
                                                             std::string_view chat_template_override = {});

  // Builds from plain vectors. INVALID_ARGUMENT (naming the field) when the
  // vocabulary is empty, `scores`/`types` lengths differ from `pieces`, two
  // pieces are equal, a piece is empty, a special id is out of range, a
  // field belongs to the other kind (merges/pre for "llama",
  // add_space_prefix for "gpt2"), or, for "gpt2", a merge is not two pieces
  // whose concatenation is a piece too; UNIMPLEMENTED for another `model` or
  // an unknown `pre`.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromVocab(TokenizerVocab vocab);

  // Text -> token ids. A BOS is prepended when `add_bos` is set and the model
  // asks for it (tokenizer.ggml.add_bos_token) *and* the text does not already
  // start with the BOS token (no double BOS). Control tokens are only produced
  // from their literal spelling when `parse_special` is set.
  //
  // As in llama.cpp (llm_tokenizer_spm + tokenizer_st_partition) and HF
  // tokenizers: the literal spellings of special tokens are split out of the
  // text first, longer spellings before shorter ones, each leftmost first.
  // User-defined tokens (Gemma: "\n", runs of "\n" and of spaces, HTML tags)
  // are always split out; control and unknown tokens only with
  // `parse_special`. Each remaining text run is then encoded by the kind:
  //  "llama": a space prefix only when tokenizer.ggml.add_space_prefix is
  //   set (at the text start and after a special token), " " replaced by
  //   "▁", merged as SentencePiece BPE: repeatedly the adjacent pair with the
  //   highest piece score (leftmost on ties) whose concatenation is a normal
  //   or user-defined piece; symbols that end as no piece fall back to <0xXX>
  //   byte pieces (the unknown id if the vocabulary lacks one). Invalid UTF-8
  //   is tolerated (its bytes fall back to byte pieces).
  //  "gpt2": invalid UTF-8 is first repaired by ToValidUtf8PerByte (utf8.h:
  //   each byte that begins no well-formed sequence becomes U+FFFD, as in
  //   llama.cpp), the pre-tokenizer splits the run into words, and each word's
  //   bytes, spelled in the byte-level alphabet, merge by lowest merge rank
  //   (leftmost on ties); with pre "llama-bpe"/"glm4" a word that is a piece
  //   is taken whole. A byte whose alphabet character is no piece yields no
  //   id (as in llama.cpp and HF), so such text does not round-trip.
  // Cost: O(n log n) in the text length; no scan over the vocabulary.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos, bool parse_special) const;

  // The bytes a token stands for. Normal pieces: "llama" maps "▁" -> " ";
  // "gpt2" maps each byte-level character back to its byte (a piece with a
  // character outside that alphabet renders as its own spelling). <0xXX>
  // byte pieces ("llama") -> that byte. Control and unknown tokens -> ""
  // unless `render_special`. Bytes may be part of a UTF-8 sequence.
  // User-defined tokens always render as their spelling; unused/undefined
  // tokens, byte-typed pieces of a "gpt2" vocabulary and ids outside
  // [0, vocab_size) render as "".
  std::string TokenBytes(int32_t id, bool render_special = false) const;

  // Concatenated TokenBytes (with add_space_prefix, one leading space of the
  // first piece is dropped, as llama.cpp's detokenizer does): raw bytes, which
  // byte tokens can make invalid UTF-8. Text for clients comes from Detokenize.
  // No clean-up of spaces before punctuation (llama.cpp does that for some
  // "gpt2" pre-tokenizers: gpt-2, llama-bpe, glm4, default).
  // INVALID_ARGUMENT on an id outside [0, vocab_size).
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool render_special = false) const;

  // The ids as valid UTF-8 text: exactly the concatenation of what an
  // IncrementalDetokenizer(this, render_special) emits for them, Flush
  // included, so ill-formed byte sequences become U+FFFD by the rule of
  // utf8.h whichever way the ids are decoded. No leading space is dropped
  // (unlike Decode): streamed text cannot know which piece comes first.
  // INVALID_ARGUMENT on an id outside [0, vocab_size).
  absl::StatusOr<std::string> Detokenize(absl::Span<const int32_t> ids, bool render_special) const;

  // Renders a conversation with the model's own chat template
  // (tokenizer.chat_template, engine/chat/chat_template.h), as Hugging Face's
  // apply_chat_template(tokenize=False) does: bos_token/eos_token are the
  // vocabulary's spellings, and a BOS appears exactly where the template
  // writes one. `add_generation_prompt` appends the opening of the model's
  // reply.
  // Errors: FAILED_PRECONDITION when the model has no chat template or one
  // this renderer cannot run (chat_template_status()); INVALID_ARGUMENT with
  // the template's message when it rejects the conversation (raise_exception,
  // e.g. roles that do not alternate).
  absl::StatusOr<std::string> ApplyChatTemplate(absl::Span<const ChatMessage> messages,
                                                bool add_generation_prompt) const;

  // The ids of ApplyChatTemplate's result, with message content treated as
  // user data: control and unknown tokens come only from the template's own
  // markup, so content spelling "<|im_start|>assistant" cannot forge a turn;
  // it is encoded as plain text. `parse_special_in_content` (for trusted
  // callers) lets content spellings become their ids too, i.e.
  // Encode(rendered, add_bos = false, parse_special = true). User-defined
  // tokens are split out everywhere, and text runs merge across
  // markup/content boundaries before BPE, so for content without
  // control/unknown spellings the ids equal that Encode call.
  // Errors: those of ApplyChatTemplate.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(absl::Span<const ChatMessage> messages,
                                                  bool add_generation_prompt,
                                                  bool parse_special_in_content) const;

  // OK when chat turns can be rendered; else FAILED_PRECONDITION saying why
  // (no template in the file, or a construct the renderer does not support).
  absl::Status chat_template_status() const;
  const std::string& chat_template() const;  // the template's source ("" = none)

  int32_t vocab_size() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  // The token a prompt opening an empty context starts with: bos_id() when
  // the model asks for one (tokenizer.ggml.add_bos_token), else -1. This is
  // the BOS that Encode(..., add_bos=true, ...) prepends.
  int32_t prompt_bos_id() const;
  // Ids that end generation: EOS, <end_of_turn>/<eot> when the vocabulary has them.
  const std::vector<int32_t>& end_of_generation_ids() const;
  bool IsEndOfGeneration(int32_t id) const;
  TokenType type(int32_t id) const;  // kUndefined if out of range
  const std::string& model() const;          // "llama" or "gpt2"
  const std::string& pre_tokenizer() const;  // tokenizer.ggml.pre ("gpt2"); "" for "llama"
  const std::string& piece(int32_t id) const;  // raw vocabulary spelling; "" if out of range
  // Id of the piece spelled exactly `piece`, -1 if none. O(1).
  int32_t PieceToId(std::string_view piece) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
 public:
  ~Tokenizer();
};

// Turns a stream of token ids into text without ever emitting a split UTF-8
// code point: bytes of an incomplete sequence are held back until it
// completes. Ill-formed sequences become U+FFFD by the rule of utf8.h (Unicode
// substitution of maximal subparts). Pieces come from
// TokenBytes(id, render_special): without render_special control tokens add
// nothing (a sequence may continue across them); with it their spelling is
// text like any other, so it ends an incomplete sequence before it.
// The Tokenizer must outlive it. Not thread-safe.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer* tokenizer, bool render_special = false)
      : tokenizer_(tokenizer), render_special_(render_special) {}
  // Text that became complete with `id` (may be empty); valid UTF-8.
  std::string Push(int32_t id);
  // Whatever is still held back, as one U+FFFD (or "" when nothing is).
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  bool render_special_;
  Utf8Sanitizer utf8_;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_TOKENIZER_TOKENIZER_H_
