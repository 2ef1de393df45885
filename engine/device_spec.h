// The --device choice: which backend runs a model's plans.
//
//   cpu         the CPU backend (engine/cpu), the default
//   vulkan      the first Vulkan device (engine/vulkan), in the loader's order
//   vulkan:N    Vulkan device N of that order (`vulkaninfo --summary` lists it)
//
// Each call returns a new backend, for one model (it holds that model's
// device copies of the weights: engine/vulkan/vulkan_backend.h); backends on
// the same Vulkan device share one VkDevice and its compiled pipelines.
#ifndef DECODED_ENGINE_DEVICE_SPEC_H_
#define DECODED_ENGINE_DEVICE_SPEC_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/backend.h"

namespace decoded {

struct DeviceOptions {
  // Vulkan: enable the Khronos validation layer and count what it reports
  // (Backend::validation_messages); FAILED_PRECONDITION when it is not installed.
  bool validation = false;
};

// Opens the backend `device` names. Errors, each naming what there is:
//   INVALID_ARGUMENT  not one of the spellings above ("cuda", "vulkan:x");
//   UNIMPLEMENTED     a Vulkan device in a build without the Vulkan backend;
//   NOT_FOUND         vulkan:N past the devices the machine has;
//   UNAVAILABLE       no Vulkan loader or driver at all;
//   UNIMPLEMENTED     the device lacks a feature the kernels need.
absl::StatusOr<std::shared_ptr<Backend>> OpenBackend(std::string_view device, const DeviceOptions& options = {});

// The spellings this build accepts, for messages and --help: "cpu, vulkan, vulkan:N".
std::string DeviceSpellings();

}  // namespace decoded

#endif  // DECODED_ENGINE_DEVICE_SPEC_H_
