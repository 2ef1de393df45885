#include "engine/device_spec.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#if DECODED_HAVE_VULKAN
#include <map>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "engine/vulkan/vulkan_backend.h"
#include "engine/vulkan/vulkan_device.h"
#endif

namespace decoded {
namespace {

#if DECODED_HAVE_VULKAN
// One VkDevice per physical device and validation setting in a process, shared
// by every backend opened on it while one lives: its compiled pipelines are
// made once, and two models on one GPU share its queue as they share the GPU.
absl::StatusOr<std::shared_ptr<vulkan::Device>> SharedVulkanDevice(const vulkan::Device::Options& o) {
  static absl::Mutex mu;
  static auto* open = new std::map<std::pair<int, bool>, std::weak_ptr<vulkan::Device>>();
  absl::MutexLock lock(&mu);
  std::weak_ptr<vulkan::Device>& slot = (*open)[{o.index, o.validation}];
  if (std::shared_ptr<vulkan::Device> d = slot.lock()) return d;
  absl::StatusOr<std::shared_ptr<vulkan::Device>> d = vulkan::Device::Open(o);
  if (d.ok()) slot = *d;
  return d;
}
#endif

}  // namespace

std::string DeviceSpellings() {
#if DECODED_HAVE_VULKAN
  return "cpu, vulkan, vulkan:N";
#else
  return "cpu (this build has no Vulkan backend)";
#endif
}

absl::StatusOr<std::shared_ptr<Backend>> OpenBackend(std::string_view device, const DeviceOptions& options) {
  if (device == "cpu") return SharedCpuBackend();
  absl::string_view rest(device.data(), device.size());
  const std::string spec(device);
  if (!absl::ConsumePrefix(&rest, "vulkan")) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device '", spec, "': expected one of ", DeviceSpellings()));
  }
  int index = 0;
  if (!rest.empty()) {
    // One spelling per device: decimal digits, no sign, no leading zero (so
    // "vulkan:01" is not a second name for vulkan:1).
    const bool canonical = absl::ConsumePrefix(&rest, ":") && !rest.empty() &&
                           rest.find_first_not_of("0123456789") == absl::string_view::npos &&
                           (rest.size() == 1 || rest[0] != '0');
    if (!canonical) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown device '", spec, "': expected one of ", DeviceSpellings()));
    }
    if (!absl::SimpleAtoi(rest, &index)) {
      return absl::NotFoundError(absl::StrCat("no Vulkan device ", std::string(rest), " (indices are below 2^31)"));
    }
  }
#if DECODED_HAVE_VULKAN
  vulkan::Device::Options o;
  o.index = index;
  o.validation = options.validation;
  absl::StatusOr<std::shared_ptr<vulkan::Device>> opened = SharedVulkanDevice(o);
  if (!opened.ok()) return opened.status();
  // A backend per call: it holds one model's weights (vulkan_backend.h).
  return std::shared_ptr<Backend>(vulkan::CreateBackend(*std::move(opened)));
#else
  (void)options;
  return absl::UnimplementedError(absl::StrCat("--device ", spec,
                                               ": this build has no Vulkan backend (configure with "
                                               "-DDECODED_VULKAN=ON; needs libvulkan-dev and glslc)"));
#endif
}

}  // namespace decoded
