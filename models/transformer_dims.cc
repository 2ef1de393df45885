#include "models/transformer_dims.h"

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/hparam_bounds.h"

namespace decoded {

absl::Status ReadTransformerDims(const HParams& hp, DecodeDims& d, int32_t* ffn) {
  namespace hb = hparam_bounds;
  auto assign = [](auto& dst, auto v) -> absl::Status {
    if (!v.ok()) return v.status();
    dst = *v;
    return absl::OkStatus();
  };
  // Each read may use the ones before it, so they run in order.
  const std::function<absl::Status()> reads[] = {
      [&] { return assign(d.n_layers, hp.LayerCount("block_count")); },
      [&] { return assign(d.hidden, hp.Int("embedding_length", {1, hb::kMaxWidth})); },
      [&] { return assign(*ffn, hp.Int("feed_forward_length", {1, hb::kMaxWidth})); },
      [&] { return assign(d.n_heads, hp.Int("attention.head_count", {1, hb::kMaxHeads})); },
      [&] {
        return assign(d.n_kv_heads, hp.IntOr("attention.head_count_kv", d.n_heads,
                                             {1, d.n_heads, hp.key("attention.head_count")}));
      },
      [&]() -> absl::Status {
        if (d.n_heads % d.n_kv_heads == 0) return absl::OkStatus();
        return absl::InvalidArgumentError(absl::StrCat(
            "model file: ", hp.key("attention.head_count"), " = ", d.n_heads, " is not a multiple of ",
            hp.key("attention.head_count_kv"), " = ", d.n_kv_heads, " (each KV head serves a whole group)"));
      },
      // RoPE rotates pairs of a head's dimensions: the head size is even.
      [&] {
        return assign(d.head_dim, hp.IntOr("attention.key_length", d.hidden / d.n_heads,
                                           {2, hb::kMaxHeadDim, "", 2}));
      },
      [&]() -> absl::Status {
        auto value_length = hp.IntOr("attention.value_length", d.head_dim, {1, hb::kMaxHeadDim});
        if (!value_length.ok()) return value_length.status();
        if (*value_length == d.head_dim) return absl::OkStatus();
        return absl::InvalidArgumentError(absl::StrCat(
            "model file: ", hp.key("attention.value_length"), " = ", *value_length, " differs from ",
            hp.key("attention.key_length"), " = ", d.head_dim, " (one head size per model)"));
      },
  };
  for (const auto& read : reads) {
    if (absl::Status s = read(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<EmbeddingAndOutput> BindEmbeddingAndOutput(const HParams& hp, const Weights& weights,
                                                          DecodeDims& d) {
  EmbeddingAndOutput out;
  auto emb = hp.Tensor("token_embd.weight", Dim{}, hp.dim("embedding_length", d.hidden));
  if (!emb.ok()) return emb.status();
  out.tok_embd = *emb;
  if (out.tok_embd->rows > hparam_bounds::kMaxVocab) {
    return absl::InvalidArgumentError(absl::StrCat("model file: tensor token_embd.weight has ", out.tok_embd->rows,
                                                   " rows (vocabulary entries), more than the bound ",
                                                   hparam_bounds::kMaxVocab));
  }
  d.vocab = static_cast<int32_t>(out.tok_embd->rows);
  // Optional (llama.cpp's "<arch>.vocab_size"): when present it must agree.
  auto vocab_key = hp.IntOr("vocab_size", d.vocab, {d.vocab, d.vocab, "the rows of token_embd.weight"});
  if (!vocab_key.ok()) return vocab_key.status();
  const Dim vocab{d.vocab, "the vocabulary (rows of token_embd.weight) = " + std::to_string(d.vocab)};
  const Dim hidden = hp.dim("embedding_length", d.hidden);
  if (weights.Find("output.weight") == nullptr) {
    out.output = out.tok_embd;  // tied embedding
  } else {
    auto o = hp.Tensor("output.weight", vocab, hidden);
    if (!o.ok()) return o.status();
    out.output = *o;
  }
  auto norm = hp.Tensor("output_norm.weight", Dim{1, "a norm weight"}, hidden);
  if (!norm.ok()) return norm.status();
  out.output_norm = *norm;
  return out;
}

}  // namespace decoded
