// Teacher-forced agreement of a model with llama.cpp's recorded greedy decode
// (tests/data/*_llamacpp.json from tools/gen_llamacpp_reference.py and
// tools/gen_llamacpp_family_reference.py): for each case, prefill the prompt,
// then feed llama.cpp's tokens through the held plan (D2) and compare every
// step's argmax (noise-aware: a different argmax is allowed only where both
// llama.cpp's top-1/top-2 gap and our margin are within `noise`) and the
// recorded top logits of the first steps.
#ifndef DECODED_TESTS_COMMON_LLAMACPP_AGREEMENT_H_
#define DECODED_TESTS_COMMON_LLAMACPP_AGREEMENT_H_

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/cpu/cpu_executor.h"
#include "engine/decode_driver.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace decoded::testing {

struct Agreement {
  int steps = 0;
  int exact_argmax = 0;
  int violations = 0;  // steps failing the noise-aware rules
  double mean_abs = 0;
  double max_abs = 0;
  std::vector<std::string> notes;
};

class LlamaCppComparator {
 public:
  // `noise`: the top-1/top-2 gap below which a different argmax is allowed.
  LlamaCppComparator(const DecodeModel& model, const nlohmann::json& ref, double noise)
      : model_(model), ref_(ref), noise_(noise) {}

  Agreement Run() {
    CpuExecutor ex(2);
    Agreement a;
    double sum_abs = 0;
    int n_abs = 0;
    for (const auto& c : ref_["cases"]) {
      const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
      const auto want = c["generated_ids"].get<std::vector<int32_t>>();
      const auto gaps = c["top1_top2_gap"].get<std::vector<double>>();
      const DecodeDims& d = model_.dims();
      auto kv = KvCache::Create(model_.backend(), d.n_layers, d.kv_layout(), 128);
      EXPECT_TRUE(kv.ok());
      auto first = forward_with_kv_context(model_, **kv, prompt, false, ex);
      EXPECT_TRUE(first.ok()) << first.status();
      if (!first.ok()) return a;
      std::vector<float> logits = *first;
      DecodeSession session;
      for (size_t step = 0; step < want.size(); ++step) {
        if (step < c["top_logits"].size()) {
          for (const auto& pair : c["top_logits"][step]["top"]) {
            const double diff = std::abs(logits[pair[0].get<size_t>()] - pair[1].get<double>());
            sum_abs += diff;
            ++n_abs;
            a.max_abs = std::max(a.max_abs, diff);
          }
        }
        const int32_t ours = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        const int32_t theirs = want[step];
        const double margin = logits[static_cast<size_t>(ours)] - logits[static_cast<size_t>(theirs)];
        ++a.steps;
        if (ours == theirs) {
          ++a.exact_argmax;
        } else {
          const bool ok = gaps[step] <= noise_ && margin <= noise_;
          if (!ok) ++a.violations;
          a.notes.push_back(c["name"].get<std::string>() + " step " + std::to_string(step) + ": ours " +
                            std::to_string(ours) + " llama.cpp " + std::to_string(theirs) + " (llama.cpp gap " +
                            std::to_string(gaps[step]) + ", our margin " + std::to_string(margin) + ")" +
                            (ok ? "" : "  <-- beyond the noise floor"));
        }
        if (step + 1 == want.size()) break;
        // Teacher-forced: continue with llama.cpp's token.
        auto next = forward_with_kv_context_persistent(model_, **kv, session, theirs, ex);
        EXPECT_TRUE(next.ok()) << next.status();
        if (!next.ok()) return a;
        logits.assign(next->begin(), next->end());
      }
    }
    a.mean_abs = n_abs ? sum_abs / n_abs : 0;
    return a;
  }

 private:
  const DecodeModel& model_;
  const nlohmann::json& ref_;
  const double noise_;
};

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_LLAMACPP_AGREEMENT_H_
