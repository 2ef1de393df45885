// Bounds on one render, so that a hostile chat template cannot hang or exhaust the daemon.
//
// A template is data from a model file, yet Jinja is a language with loops, recursion and string repetition. Every
// render runs against a Budget: work units (one per evaluated node, one per 64 bytes of string built), string and
// container sizes, nesting depths and macro call depth. Exceeding any bound ends the render with
// FAILED_PRECONDITION naming the bound; real chat templates use a tiny fraction of each.
#ifndef DECODED_ENGINE_CHAT_JINJA_BUDGET_H_
#define DECODED_ENGINE_CHAT_JINJA_BUDGET_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace decoded::jinja {

struct Limits {
  static constexpr size_t kMaxStringBytes = size_t{64} << 20;  // any string, the output included
  static constexpr size_t kMaxContainerItems = size_t{1} << 20;
  static constexpr int kMaxValueDepth = 64;        // lists/dicts nested in each other
  static constexpr int kMaxCallDepth = 64;         // macro calls in progress
  static constexpr int kMaxEvalDepth = 1000;       // interpreter recursion (nested expressions, statements, calls)
  static constexpr uint64_t kMaxWork = uint64_t{1} << 25;
  static constexpr uint64_t kBytesPerWorkUnit = 64;
};

class Budget {
 public:
  // One unit per evaluated node.
  absl::Status Step() {
    if (++work_ > Limits::kMaxWork) return Exhausted();
    return absl::OkStatus();
  }
  // A string of `bytes` bytes is about to be built.
  absl::Status ChargeString(size_t bytes) {
    if (bytes > Limits::kMaxStringBytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("string of ", bytes, " bytes exceeds the limit of ", Limits::kMaxStringBytes));
    }
    work_ += bytes / Limits::kBytesPerWorkUnit;
    if (work_ > Limits::kMaxWork) return Exhausted();
    return absl::OkStatus();
  }
  // `added` bytes are about to be appended to a string that then holds `total` bytes.
  absl::Status ChargeAppend(size_t total, size_t added) {
    if (total > Limits::kMaxStringBytes) return ChargeString(total);
    return ChargeString(added);
  }
  // A list, tuple or dict of `items` items is about to be built.
  absl::Status ChargeItems(size_t items) {
    if (items > Limits::kMaxContainerItems) {
      return absl::FailedPreconditionError(
          absl::StrCat("container of ", items, " items exceeds the limit of ", Limits::kMaxContainerItems));
    }
    work_ += items / 8;
    if (work_ > Limits::kMaxWork) return Exhausted();
    return absl::OkStatus();
  }

 private:
  static absl::Status Exhausted() {
    return absl::FailedPreconditionError(
        absl::StrCat("evaluation exceeds the work limit (", Limits::kMaxWork, " steps)"));
  }

  uint64_t work_ = 0;
};

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_BUDGET_H_
