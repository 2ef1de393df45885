// The backend a test runs on, by its --device name: "cpu", or "vulkan" (the
// machine's first Vulkan device, lavapipe in CI) opened through the same
// engine/device_spec.h path as the daemon's --device, with the Khronos
// validation layer on so a test can assert it reported nothing.
//
// Without any Vulkan device a "vulkan" test skips, saying so, unless
// DECODED_REQUIRE_VULKAN=1 (scripts/test.sh sets it): then it fails, so CI
// cannot pass by skipping the GPU tests. Link decoded_devices.
#ifndef DECODED_TESTS_COMMON_TEST_BACKEND_H_
#define DECODED_TESTS_COMMON_TEST_BACKEND_H_

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "engine/backend.h"
#include "engine/device_spec.h"
#include "gtest/gtest.h"

namespace decoded::testing {

inline bool VulkanTestsRequired() {
  const char* r = std::getenv("DECODED_REQUIRE_VULKAN");
  return r != nullptr && std::string(r) == "1";
}

// The Vulkan loader unloads the driver and the layer when the last instance
// goes; kept resident, LeakSanitizer can still name them in the blocks these
// uninstrumented libraries keep (tests/lsan.supp). Once per process.
inline void KeepVulkanLibrariesResident() {
  static const bool resident = [] {
    for (const char* lib : {"libvulkan_lvp.so", "libVkLayer_khronos_validation.so"}) {
      dlopen(lib, RTLD_NOW | RTLD_NODELETE);
    }
    return true;
  }();
  (void)resident;
}

// A new backend for one model on `device`, or nullptr with the reason in *why.
inline std::shared_ptr<Backend> OpenTestBackend(std::string_view device, std::string* why) {
  if (device != "cpu") KeepVulkanLibrariesResident();
  DeviceOptions options;
  options.validation = device != "cpu";
  absl::StatusOr<std::shared_ptr<Backend>> b = OpenBackend(device, options);
  // The layer is required where the Vulkan tests are (DECODED_REQUIRE_VULKAN);
  // elsewhere a machine without it still runs them.
  if (!b.ok() && absl::IsFailedPrecondition(b.status()) && !VulkanTestsRequired()) b = OpenBackend(device);
  if (!b.ok()) {
    *why = std::string(b.status().message());
    return nullptr;
  }
  return *std::move(b);
}

}  // namespace decoded::testing

// Opens a backend for `device` into `var`, or skips (fails when Vulkan is required).
#define DECODED_TEST_BACKEND_OR_SKIP(var, device)                                                      \
  std::string var##_why;                                                                               \
  std::shared_ptr<::decoded::Backend> var = ::decoded::testing::OpenTestBackend((device), &var##_why); \
  if (var == nullptr) {                                                                                \
    if (::decoded::testing::VulkanTestsRequired() || std::string_view(device) == "cpu") {              \
      FAIL() << "no backend for " << (device) << ": " << var##_why;                                    \
    }                                                                                                  \
    GTEST_SKIP() << "no Vulkan device on this machine: " << var##_why;                                 \
  }

#endif  // DECODED_TESTS_COMMON_TEST_BACKEND_H_
