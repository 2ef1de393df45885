// A Vulkan buffer with its own memory, addressed by the kernels through its
// device address (VK_KHR_buffer_device_address), of one Device::Memory kind.
//
// data() is the host mapping (coherent: writes are visible to the next
// submission without a flush; reads see a finished submission's writes), or
// nullptr for a device-only buffer the host cannot map (a discrete GPU's
// VRAM): Write() then goes through a staging copy. device_address() is what
// kernels and the KV binding table hold.
#ifndef DECODED_ENGINE_VULKAN_VULKAN_BUFFER_H_
#define DECODED_ENGINE_VULKAN_VULKAN_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include <vulkan/vulkan.h>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/vulkan/vulkan_device.h"

namespace decoded::vulkan {

class Buffer final : public DeviceBuffer {
 public:
  // RESOURCE_EXHAUSTED when the device cannot provide `bytes` (or they exceed
  // its largest allocation), naming both. A zero-byte request gets 64 bytes.
  static absl::StatusOr<std::unique_ptr<Buffer>> Create(std::shared_ptr<Device> device, size_t bytes,
                                                        Device::Memory kind = Device::Memory::kUpload);
  ~Buffer() override;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() override { return mapped_; }
  const void* data() const override { return mapped_; }
  size_t size() const override { return size_; }
  uint64_t device_address() const override { return address_; }
  VkBuffer buffer() const { return buffer_; }
  // Host bytes into [offset, offset + bytes): a copy into the mapping, or a
  // staging copy (blocking; for load-time data such as weights).
  absl::Status Write(size_t offset, const void* src, size_t bytes);

 private:
  Buffer() = default;
  std::shared_ptr<Device> device_;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  void* mapped_ = nullptr;
  size_t size_ = 0;
  size_t allocated_ = 0;
  uint32_t heap_ = 0;
  uint64_t address_ = 0;
};

}  // namespace decoded::vulkan

#endif  // DECODED_ENGINE_VULKAN_VULKAN_BUFFER_H_
