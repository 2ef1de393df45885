#include "server/model_file_watch.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace decoded::server {
namespace {

// What differs between the file as loaded and as it is now; "" when nothing.
std::string Difference(const struct stat& was, const struct stat& now, bool readable) {
  if (!readable) return "it can no longer be read (removed?)";
  if (now.st_dev != was.st_dev || now.st_ino != was.st_ino) return "it was replaced by another file";
  if (now.st_size != was.st_size) {
    return absl::StrCat("its size changed from ", was.st_size, " to ", now.st_size, " bytes");
  }
  if (now.st_mtim.tv_sec != was.st_mtim.tv_sec || now.st_mtim.tv_nsec != was.st_mtim.tv_nsec) {
    return "it was written to";
  }
  return "";
}

}  // namespace

struct stat StatModelFile(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) st = {};
  return st;
}

ModelFileWatch::ModelFileWatch(std::string path, const struct stat& loaded, absl::Duration interval,
                               std::function<void(const std::string& what, bool in_place)> on_change) {
  thread_ = std::thread([this, path = std::move(path), loaded, interval, on_change = std::move(on_change)] {
    while (!stop_.WaitForNotificationWithTimeout(interval)) {
      struct stat now{};
      const bool readable = ::stat(path.c_str(), &now) == 0;
      const std::string what = Difference(loaded, now, readable);
      if (what.empty()) continue;
      const bool in_place = readable && now.st_dev == loaded.st_dev && now.st_ino == loaded.st_ino;
      on_change(absl::StrCat("the model file ", path, " changed on disk: ", what), in_place);
      return;
    }
  });
}

ModelFileWatch::~ModelFileWatch() {
  stop_.Notify();
  thread_.join();
}

}  // namespace decoded::server
