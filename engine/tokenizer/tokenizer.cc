#include "engine/tokenizer/tokenizer.h"

#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/subword_codec.h"
#include "engine/tokenizer/tokenizer_impl.h"

namespace decoded {
namespace {

// Optional GGUF key: NOT_FOUND yields `fallback`, other errors propagate.
template <typename T>
absl::StatusOr<T> Optional(absl::StatusOr<T> value, T fallback) {
  if (value.ok()) return value;
  if (absl::IsNotFound(value.status())) return fallback;
  return value.status();
}

absl::StatusOr<int32_t> OptionalId(const GgufFile& file, std::string_view key, int32_t fallback) {
  absl::StatusOr<int64_t> v = file.GetInt(key);
  if (!v.ok()) {
    if (absl::IsNotFound(v.status())) return fallback;
    return v.status();
  }
  if (*v < -1 || *v > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(key), " = ", *v, " is not a token id"));
  }
  return static_cast<int32_t>(*v);
}

TokenType ToTokenType(int64_t t) {
  return t >= 0 && t <= static_cast<int64_t>(TokenType::kByte) ? static_cast<TokenType>(t)
                                                               : TokenType::kUndefined;
}

// tokenizer.ggml.token_type (optional). Reads the int32 array straight from
// the parsed metadata: GgufFile::GetIntArray builds an error context per
// element, which costs tens of ms on 262144 entries. Anything unusual goes
// through GetIntArray for its checks and messages.
absl::StatusOr<std::vector<TokenType>> ReadTokenTypes(const GgufFile& file) {
  constexpr std::string_view kKey = "tokenizer.ggml.token_type";
  std::vector<TokenType> types;
  const GgufValue* value = file.Find(kKey);
  if (value == nullptr) return types;
  if (const auto* arr = std::get_if<GgufArray>(&value->value);
      arr != nullptr && arr->elem_type == GgufType::kInt32) {
    types.reserve(arr->values.size());
    bool plain = true;
    for (const GgufValue& v : arr->values) {
      if (const auto* i = std::get_if<int64_t>(&v.value)) {
        types.push_back(ToTokenType(*i));
      } else if (const auto* u = std::get_if<uint64_t>(&v.value)) {
        types.push_back(ToTokenType(static_cast<int64_t>(*u)));
      } else {
        plain = false;
        break;
      }
    }
    if (plain) return types;
    types.clear();
  }
  absl::StatusOr<std::vector<int64_t>> ints = file.GetIntArray(kKey);
  if (!ints.ok()) return ints.status();
  types.reserve(ints->size());
  for (int64_t t : *ints) types.push_back(ToTokenType(t));
  return types;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file,
                                                             std::string_view chat_template_override) {
  absl::StatusOr<std::string> model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.model: ", model.status().message()));
  }
  if (*model != "llama" && *model != "gpt2") {
    return absl::UnimplementedError(absl::StrCat("tokenizer.ggml.model = \"", *model,
                                                 "\" is not supported (supported: llama, gpt2)"));
  }
  const bool bpe = *model == "gpt2";
  TokenizerVocab vocab;
  vocab.model = *model;
  absl::StatusOr<std::vector<std::string>> pieces = file.GetStringArray("tokenizer.ggml.tokens");
  if (!pieces.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.tokens: ", pieces.status().message()));
  }
  vocab.pieces = *std::move(pieces);
  absl::StatusOr<std::vector<float>> scores =
      Optional(file.GetFloatArray("tokenizer.ggml.scores"), std::vector<float>{});
  if (!scores.ok()) return scores.status();
  vocab.scores = *std::move(scores);
  absl::StatusOr<std::vector<TokenType>> types = ReadTokenTypes(file);
  if (!types.ok()) return types.status();
  vocab.types = *std::move(types);
  if (bpe) {
    absl::StatusOr<std::vector<std::string>> merges = file.GetStringArray("tokenizer.ggml.merges");
    if (!merges.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.merges: ", merges.status().message()));
    }
    vocab.merges = *std::move(merges);
    // llama.cpp reads a missing key as "default" (with a warning).
    absl::StatusOr<std::string> pre = Optional(file.GetString("tokenizer.ggml.pre"), std::string("default"));
    if (!pre.ok()) return pre.status();
    vocab.pre = *std::move(pre);
  }
  // The chat template is optional: without one (or with one the renderer
  // cannot run) text and token turns still work; chat turns say why not.
  absl::StatusOr<std::string> chat_template =
      Optional(file.GetString("tokenizer.chat_template"), std::string());
  if (!chat_template.ok()) return chat_template.status();
  vocab.chat_template = chat_template_override.empty() ? *std::move(chat_template)
                                                      : std::string(chat_template_override);
  // SentencePiece defaults are llama.cpp's for vocabularies that omit the
  // keys; byte-level vocabularies get no special id they do not name.
  absl::StatusOr<int32_t> id = OptionalId(file, "tokenizer.ggml.bos_token_id", bpe ? -1 : 1);
  if (!id.ok()) return id.status();
  vocab.bos_id = *id;
  id = OptionalId(file, "tokenizer.ggml.eos_token_id", bpe ? -1 : 2);
  if (!id.ok()) return id.status();
  vocab.eos_id = *id;
  id = OptionalId(file, "tokenizer.ggml.unknown_token_id", bpe ? -1 : 0);
  if (!id.ok()) return id.status();
  vocab.unk_id = *id;
  id = OptionalId(file, "tokenizer.ggml.padding_token_id", -1);
  if (!id.ok()) return id.status();
  vocab.pad_id = *id;
  id = OptionalId(file, "tokenizer.ggml.eot_token_id", -1);
  if (!id.ok()) return id.status();
  vocab.eot_id = *id;
  // llama.cpp: SentencePiece adds a BOS unless told otherwise; byte-level
  // vocabularies only for the Llama 3 pre-tokenizer.
  absl::StatusOr<bool> flag =
      Optional(file.GetBool("tokenizer.ggml.add_bos_token"), !bpe || vocab.pre == "llama-bpe");
  if (!flag.ok()) return flag.status();
  vocab.add_bos = *flag;
  // A byte-level vocabulary carries its spaces in its pieces; llama.cpp's
  // byte-level encoder never prefixes one.
  if (!bpe) {
    flag = Optional(file.GetBool("tokenizer.ggml.add_space_prefix"), true);
    if (!flag.ok()) return flag.status();
    vocab.add_space_prefix = *flag;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = FromVocab(std::move(vocab));
  if (tokenizer.ok() && !chat_template_override.empty()) {
    // Asked for explicitly: a template that cannot run is an error now, not
    // a refusal of every chat turn later.
    if (absl::Status usable = (*tokenizer)->chat_template_status(); !usable.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("chat template override: ", usable.message()));
    }
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(TokenizerVocab vocab) {
  const size_t n = vocab.pieces.size();
  if (vocab.model != "llama" && vocab.model != "gpt2") {
    return absl::UnimplementedError(absl::StrCat("tokenizer.ggml.model = \"", vocab.model,
                                                 "\" is not supported (supported: llama, gpt2)"));
  }
  const bool bpe = vocab.model == "gpt2";
  if (n == 0) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("tokenizer.ggml.tokens has more than 2^31-1 entries");
  }
  if (vocab.scores.empty()) vocab.scores.assign(n, 0.0f);
  if (vocab.types.empty()) vocab.types.assign(n, TokenType::kNormal);
  if (vocab.scores.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.scores has ", vocab.scores.size(),
                                                   " entries, tokenizer.ggml.tokens ", n));
  }
  if (vocab.types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type has ",
                                                   vocab.types.size(), " entries, tokenizer.ggml.tokens ", n));
  }
  if (bpe && vocab.add_space_prefix) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.add_space_prefix applies to \"llama\" vocabularies, not \"gpt2\"");
  }
  if (!bpe && (!vocab.merges.empty() || !vocab.pre.empty())) {
    return absl::InvalidArgumentError(
        "tokenizer.ggml.merges and tokenizer.ggml.pre apply to \"gpt2\" vocabularies, not \"llama\"");
  }
  const int32_t size = static_cast<int32_t>(n);
  const std::pair<const char*, int32_t> special_ids[] = {
      {"tokenizer.ggml.bos_token_id", vocab.bos_id},
      {"tokenizer.ggml.eos_token_id", vocab.eos_id},
      {"tokenizer.ggml.unknown_token_id", vocab.unk_id},
      {"tokenizer.ggml.padding_token_id", vocab.pad_id},
      {"tokenizer.ggml.eot_token_id", vocab.eot_id},
  };
  for (const auto& [key, value] : special_ids) {
    if (value < -1 || value >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " = ", value, " is outside the vocabulary of ", size));
    }
  }

  auto impl = std::make_unique<Impl>();
  impl->vocab = std::move(vocab);
  const TokenizerVocab& v = impl->vocab;
  impl->piece_to_id.reserve(n);
  for (int32_t i = 0; i < size; ++i) {
    const std::string& piece = v.pieces[i];
    if (piece.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.tokens[", i, "] is empty"));
    }
    if (!impl->piece_to_id.emplace(piece, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.tokens[", i, "] \"", piece,
                                                     "\" repeats an earlier piece"));
    }
    const TokenType type = v.types[i];
    if (type == TokenType::kUserDefined) impl->specials.Add(piece, i, /*always=*/true);
    if (type == TokenType::kControl || type == TokenType::kUnknown) {
      impl->specials.Add(piece, i, /*always=*/false);
    }
  }
  if (bpe) {
    absl::StatusOr<std::unique_ptr<SubwordCodec>> codec = MakeByteLevelBpeCodec(v, impl->piece_to_id);
    if (!codec.ok()) return codec.status();
    impl->codec = *std::move(codec);
  } else {
    impl->codec = MakeSentencePieceCodec(v, impl->piece_to_id);
  }

  auto lookup = [&](std::string_view p) {
    auto it = impl->piece_to_id.find(p);
    return it == impl->piece_to_id.end() ? -1 : it->second;
  };
  if (impl->vocab.chat_template.empty()) {
    impl->chat_template_status =
        absl::FailedPreconditionError("the model file has no chat template (tokenizer.chat_template)");
  } else if (absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(impl->vocab.chat_template); parsed.ok()) {
    impl->chat_template = std::make_unique<const ChatTemplate>(*std::move(parsed));
  } else {
    impl->chat_template_status = absl::FailedPreconditionError(
        absl::StrCat("its chat template (tokenizer.chat_template) cannot be rendered: ", parsed.status().message()));
  }
  auto add_eog = [&](int32_t id) {
    if (id < 0) return;
    for (int32_t e : impl->end_of_generation) {
      if (e == id) return;
    }
    impl->end_of_generation.push_back(id);
  };
  add_eog(v.eos_id);
  add_eog(v.eot_id);
  // End-of-turn and end-of-text spellings llama.cpp also treats as ending
  // generation (a subset of its list: the families we serve).
  for (std::string_view p :
       {"<end_of_turn>", "<eot>", "<|eot_id|>", "<|im_end|>", "<|end|>", "<EOT>", "<|endoftext|>"}) {
    add_eog(lookup(p));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

void Tokenizer::Impl::EncodeFragments(std::string_view text,
                                      absl::Span<const SpecialTokenMatcher::Fragment> fragments,
                                      std::vector<int32_t>& out) const {
  bool after_special = true;  // the text start counts as following a special token
  for (const SpecialTokenMatcher::Fragment& f : fragments) {
    if (f.id >= 0) {
      out.push_back(f.id);
      after_special = true;
      continue;
    }
    codec->EncodeRun(text.substr(f.begin, f.end - f.begin), after_special, out);
    after_special = false;
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos, bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  std::vector<SpecialTokenMatcher::Fragment> fragments;
  m.specials.Split(text, parse_special, fragments);

  const bool starts_with_bos = !fragments.empty() && fragments.front().id >= 0 &&
                               fragments.front().id == m.vocab.bos_id;
  if (add_bos && m.vocab.add_bos && m.vocab.bos_id >= 0 && !starts_with_bos) {
    out.push_back(m.vocab.bos_id);
  }
  m.EncodeFragments(text, fragments, out);
  return out;
}

std::string Tokenizer::TokenBytes(int32_t id, bool render_special) const {
  const Impl& m = *impl_;
  if (!m.InRange(id)) return "";
  switch (m.vocab.types[id]) {
    case TokenType::kNormal:
    case TokenType::kByte:
      return m.codec->PieceBytes(id);
    case TokenType::kUserDefined:
      return m.vocab.pieces[id];
    case TokenType::kControl:
    case TokenType::kUnknown:
      return render_special ? m.vocab.pieces[id] : "";
    case TokenType::kUnused:
    case TokenType::kUndefined:
      return "";
  }
  return "";
}

absl::Status Tokenizer::Impl::CheckIds(absl::Span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!InRange(ids[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", ids[i], " at position ", i, " is outside [0, ", size(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids, bool render_special) const {
  if (absl::Status s = impl_->CheckIds(ids); !s.ok()) return s;
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string bytes = TokenBytes(ids[i], render_special);
    // llama.cpp drops the space the encoder prefixed, from the first piece only.
    if (i == 0 && impl_->vocab.add_space_prefix && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
    out += bytes;
  }
  return out;
}

int32_t Tokenizer::vocab_size() const { return impl_->size(); }
int32_t Tokenizer::bos_id() const { return impl_->vocab.bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->vocab.eos_id; }
int32_t Tokenizer::prompt_bos_id() const { return impl_->vocab.add_bos ? impl_->vocab.bos_id : -1; }
const std::vector<int32_t>& Tokenizer::end_of_generation_ids() const { return impl_->end_of_generation; }

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  for (int32_t e : impl_->end_of_generation) {
    if (e == id) return true;
  }
  return false;
}

TokenType Tokenizer::type(int32_t id) const {
  return impl_->InRange(id) ? impl_->vocab.types[id] : TokenType::kUndefined;
}

const std::string& Tokenizer::model() const { return impl_->vocab.model; }
const std::string& Tokenizer::pre_tokenizer() const { return impl_->vocab.pre; }

const std::string& Tokenizer::piece(int32_t id) const {
  static const std::string kEmpty;
  return impl_->InRange(id) ? impl_->vocab.pieces[id] : kEmpty;
}

int32_t Tokenizer::PieceToId(std::string_view piece) const {
  auto it = impl_->piece_to_id.find(piece);
  return it == impl_->piece_to_id.end() ? -1 : it->second;
}

}  // namespace decoded
