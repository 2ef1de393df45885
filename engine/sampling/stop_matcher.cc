#include <algorithm>
#include <string>
#include <utility>

#include "engine/sampling/sampler.h"

namespace decoded {

StopMatcher::StopMatcher(std::vector<std::string> stop_sequences) : stops_(std::move(stop_sequences)) {
  stops_.erase(std::remove_if(stops_.begin(), stops_.end(), [](const std::string& s) { return s.empty(); }),
               stops_.end());
}

std::string StopMatcher::Push(std::string_view text) {
  if (stopped_) return "";
  held_.append(text);

  // Earliest completed stop sequence wins.
  size_t cut = std::string::npos;
  for (const std::string& stop : stops_) cut = std::min(cut, held_.find(stop));
  if (cut != std::string::npos) {
    std::string out = held_.substr(0, cut);
    held_.clear();
    stopped_ = true;
    return out;
  }

  // Hold back the longest tail of held_ that is a proper prefix of some stop.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    const size_t longest = std::min(stop.size() - 1, held_.size());
    for (size_t len = longest; len > hold; --len) {
      if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace decoded
