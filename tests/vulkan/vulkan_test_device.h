// The Vulkan device the tests run on: the machine's first (lavapipe in CI),
// opened once per test binary with the Khronos validation layer on, so every
// test can assert the layer reported nothing.
//
// Without any Vulkan device the tests skip, saying so — unless
// DECODED_REQUIRE_VULKAN=1 (scripts/test.sh sets it), when they fail: CI must
// not pass by skipping the GPU tests.
#ifndef DECODED_TESTS_VULKAN_VULKAN_TEST_DEVICE_H_
#define DECODED_TESTS_VULKAN_VULKAN_TEST_DEVICE_H_

#include <memory>
#include <string>

#include "engine/vulkan/vulkan_device.h"
#include "gtest/gtest.h"
#include "tests/common/test_backend.h"

namespace decoded::testing {

inline bool VulkanRequired() { return VulkanTestsRequired(); }

// The shared device, or nullptr with the reason in *why. Destroyed at exit
// (after every test), so the leak checker sees the driver's objects freed.
inline std::shared_ptr<vulkan::Device> TestVulkanDevice(std::string* why) {
  struct Opened {
    std::shared_ptr<vulkan::Device> device;
    std::string reason;
  };
  static Opened opened = [] {
    Opened o;
    KeepVulkanLibrariesResident();
    // The validation layer is required where the Vulkan tests are
    // (DECODED_REQUIRE_VULKAN); elsewhere a machine without it still runs them.
    auto d = vulkan::Device::Open({.index = 0, .validation = true});
    if (!d.ok() && absl::IsFailedPrecondition(d.status()) && !VulkanRequired()) d = vulkan::Device::Open({.index = 0});
    if (d.ok()) {
      o.device = *std::move(d);
    } else {
      o.reason = std::string(d.status().message());
    }
    return o;
  }();
  *why = opened.reason;
  return opened.device;
}

}  // namespace decoded::testing

// Opens the test device into `var` or skips (fails when required).
#define DECODED_VULKAN_DEVICE_OR_SKIP(var)                                                       \
  std::string var##_why;                                                                         \
  std::shared_ptr<::decoded::vulkan::Device> var = ::decoded::testing::TestVulkanDevice(&var##_why); \
  if (var == nullptr) {                                                                          \
    if (::decoded::testing::VulkanRequired()) FAIL() << "no Vulkan device: " << var##_why;       \
    GTEST_SKIP() << "no Vulkan device on this machine: " << var##_why;                          \
  }

#endif  // DECODED_TESTS_VULKAN_VULKAN_TEST_DEVICE_H_
