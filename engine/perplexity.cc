#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"

namespace decoded {

absl::StatusOr<PerplexityResult> Perplexity(const Model& model, absl::Span<const int32_t> tokens, int32_t n_ctx,
                                            Executor& executor) {
  if (n_ctx < 4 || n_ctx > model.info().context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("perplexity window ", n_ctx, " must be in [4, ", model.info().context_length, "]"));
  }
  const int64_t windows = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (windows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("perplexity needs at least one window of ", n_ctx, " tokens, got ", tokens.size()));
  }
  const int32_t vocab = model.info().vocab_size;
  const int32_t first = n_ctx / 2;
  PerplexityResult r;
  std::vector<int32_t> window(static_cast<size_t>(n_ctx));
  for (int64_t w = 0; w < windows; ++w) {
    std::copy_n(tokens.begin() + w * n_ctx, n_ctx, window.begin());
    if (const int32_t bos = model.tokenizer().prompt_bos_id(); bos >= 0) window[0] = bos;
    auto ctx = model.NewContext(n_ctx);
    if (!ctx.ok()) return ctx.status();
    double window_nll = 0;
    for (int32_t c = 0; c < n_ctx; c += kMaxPrefillChunk) {
      const int32_t n = std::min(kMaxPrefillChunk, n_ctx - c);
      auto logits = (*ctx)->Prefill(absl::MakeConstSpan(window).subspan(c, n), /*all_logits=*/true, executor);
      if (!logits.ok()) return logits.status();
      for (int32_t j = 0; j < n; ++j) {
        const int32_t i = c + j;  // the row predicts token i + 1
        if (i < first || i + 1 >= n_ctx) continue;
        const float* row = logits->data() + static_cast<int64_t>(j) * vocab;
        // log-softmax in double: the sum over the vocabulary is the error
        // that matters at these scales.
        const float mx = *std::max_element(row, row + vocab);
        double z = 0;
        for (int32_t v = 0; v < vocab; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
        window_nll += -(static_cast<double>(row[window[static_cast<size_t>(i + 1)]]) - mx - std::log(z));
      }
    }
    const int64_t scored = n_ctx - 1 - first;
    r.nll += window_nll;
    r.scored += scored;
    r.window_ppl.push_back(std::exp(window_nll / static_cast<double>(scored)));
    ++r.windows;
  }
  r.ppl = std::exp(r.nll / static_cast<double>(r.scored));
  return r;
}

}  // namespace decoded
