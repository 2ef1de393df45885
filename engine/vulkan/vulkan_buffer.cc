#include "engine/vulkan/vulkan_buffer.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace decoded::vulkan {

absl::StatusOr<std::unique_ptr<Buffer>> Buffer::Create(std::shared_ptr<Device> device, size_t bytes,
                                                       Device::Memory kind) {
  // 64-byte granules: every kernel's buffer_reference alignment holds at any
  // offset the optimizer gives (also 64-byte aligned).
  const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  if (rounded > device->max_allocation_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat("a ", bytes, "-byte buffer exceeds the largest allocation of ",
                                                     device->info().name, " (", device->max_allocation_bytes(),
                                                     " bytes)"));
  }
  std::unique_ptr<Buffer> b(new Buffer());
  b->device_ = device;
  b->size_ = bytes;
  VkDevice dev = device->device();
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = rounded;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT |
             VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  if (auto s = device->Check(vkCreateBuffer(dev, &bi, nullptr, &b->buffer_), "vkCreateBuffer"); !s.ok()) return s;
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev, b->buffer_, &req);
  const uint32_t type = device->memory_type(kind);
  const uint32_t heap = device->heap_of(kind);
  if (!(req.memoryTypeBits & (1u << type))) {
    return absl::InternalError(absl::StrCat(device->info().name, ": storage buffers cannot use memory type ", type));
  }
  // The heap is the budget even where the driver would over-commit it
  // (lavapipe's heap is host memory): a model or KV budget beyond it is
  // refused here, not by the operating system's OOM killer later.
  if (device->allocated_bytes(heap) + static_cast<int64_t>(req.size) > static_cast<int64_t>(device->heap_size(heap))) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes on ", device->info().name,
                                                     ": ", device->allocated_bytes(heap), " of its ",
                                                     device->heap_size(heap), "-byte heap are in use"));
  }
  VkMemoryAllocateFlagsInfo fi{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
  fi.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.pNext = &fi;
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = type;
  if (auto s = device->Check(vkAllocateMemory(dev, &ai, nullptr, &b->memory_), "vkAllocateMemory"); !s.ok()) {
    if (absl::IsResourceExhausted(s)) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes on ", device->info().name,
                                                       " (", device->allocated_bytes(heap), " of ",
                                                       device->heap_size(heap), " in use)"));
    }
    return s;
  }
  b->allocated_ = req.size;
  b->heap_ = heap;
  device->AddAllocatedBytes(heap, static_cast<int64_t>(req.size));
  if (auto s = device->Check(vkBindBufferMemory(dev, b->buffer_, b->memory_, 0), "vkBindBufferMemory"); !s.ok()) {
    return s;
  }
  if (device->mapped(kind)) {
    if (auto s = device->Check(vkMapMemory(dev, b->memory_, 0, VK_WHOLE_SIZE, 0, &b->mapped_), "vkMapMemory");
        !s.ok()) {
      return s;
    }
  }
  VkBufferDeviceAddressInfo addr{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
  addr.buffer = b->buffer_;
  b->address_ = vkGetBufferDeviceAddress(dev, &addr);
  return b;
}

Buffer::~Buffer() {
  VkDevice dev = device_->device();
  if (mapped_ != nullptr) vkUnmapMemory(dev, memory_);
  if (buffer_ != VK_NULL_HANDLE) vkDestroyBuffer(dev, buffer_, nullptr);
  if (memory_ != VK_NULL_HANDLE) {
    vkFreeMemory(dev, memory_, nullptr);
    device_->AddAllocatedBytes(heap_, -static_cast<int64_t>(allocated_));
  }
}

absl::Status Buffer::Write(size_t offset, const void* src, size_t bytes) {
  if (offset + bytes > size_) {
    return absl::InternalError(absl::StrCat("a ", bytes, "-byte write at ", offset, " overruns a ", size_, "-byte buffer"));
  }
  if (mapped_ != nullptr) {
    std::memcpy(static_cast<uint8_t*>(mapped_) + offset, src, bytes);
    return absl::OkStatus();
  }
  return device_->CopyToUnmapped(buffer_, offset, src, bytes);
}

}  // namespace decoded::vulkan
