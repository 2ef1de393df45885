// Notices when the served model file changes on disk.
//
// With weights copied into memory (the default), a changed file changes
// nothing the daemon serves; the change is logged once so that an operator
// who replaced the file knows a restart is needed to serve it. With --mmap
// the weights are the file's pages: a file overwritten in place serves other
// weights (garbage, or non-finite logits) and a truncated one raises SIGBUS
// on the next read of a lost page. There the daemon stops serving at once
// (health NOT_SERVING, turns cut) and exits non-zero so that its supervisor
// restarts it on the file as it is now. A file replaced by another (renamed
// over, as deploys do, or removed) leaves the mapped one intact: logged only.
//
// The file counts as changed when stat(2) of its path no longer gives the
// device, inode, size and modification time it had when the load began; in
// place when the device and inode are still the loaded file's.
//
// Thread-safety: the callback runs on the watch's own thread.
#ifndef DECODED_SERVER_MODEL_FILE_WATCH_H_
#define DECODED_SERVER_MODEL_FILE_WATCH_H_

#include <sys/stat.h>

#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace decoded::server {

// stat(2) of `path` now (the identity a later change is measured against);
// st_ino 0 when it cannot be read.
struct stat StatModelFile(const std::string& path);

class ModelFileWatch {
 public:
  // Polls every `interval`; calls `on_change` once, with what changed and
  // whether the loaded file itself changed (in place) rather than its path
  // naming another file now, the first time `path` differs from `loaded`.
  ModelFileWatch(std::string path, const struct stat& loaded, absl::Duration interval,
                 std::function<void(const std::string& what, bool in_place)> on_change);
  ~ModelFileWatch();
  ModelFileWatch(const ModelFileWatch&) = delete;
  ModelFileWatch& operator=(const ModelFileWatch&) = delete;

 private:
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_MODEL_FILE_WATCH_H_
