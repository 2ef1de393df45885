// One Vulkan device opened for compute: the instance, the physical device
// `--device vulkan:N` names, its logical device and one compute queue.
//
// Shared (shared_ptr) by everything allocated on it: the backend, buffers,
// plans and executors each keep it alive, so it is destroyed after the last
// of them. Thread-safe: the queue is guarded by a mutex (vkQueueSubmit needs
// external synchronization), everything else is immutable after Open.
//
// Validation: with Options::validation the Khronos validation layer
// (VK_LAYER_KHRONOS_validation, Debian vulkan-validationlayers) is enabled and
// every warning or error it reports is counted and printed to stderr; tests
// assert the count stays zero. DECODED_VULKAN_VALIDATION=1 in the environment
// turns it on for any process.
//
// Fault injection: DECODED_VULKAN_LOSE_DEVICE_AFTER_SUBMISSIONS=N makes every
// submission after the first N fail as VK_ERROR_DEVICE_LOST does, so the
// serving path's handling of a lost GPU is tested on any device.
#ifndef DECODED_ENGINE_VULKAN_VULKAN_DEVICE_H_
#define DECODED_ENGINE_VULKAN_VULKAN_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <vulkan/vulkan.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/vulkan/vulkan_pipelines.h"

namespace decoded::vulkan {

struct PhysicalDeviceInfo {
  int index = 0;
  std::string name;  // VkPhysicalDeviceProperties::deviceName, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
  std::string type;  // "cpu", "discrete", "integrated", "virtual", "other"
  uint32_t api_version = 0;
};

// The Vulkan devices this machine has, in the loader's order (the N of
// vulkan:N). UNAVAILABLE when there is no Vulkan loader or driver at all.
absl::StatusOr<std::vector<PhysicalDeviceInfo>> ListDevices();

class Device {
 public:
  struct Options {
    int index = 0;            // which physical device (ListDevices order)
    bool validation = false;  // enable the Khronos validation layer (also: DECODED_VULKAN_VALIDATION=1)
    // Never map device-only buffers, so that weights go through the staging
    // upload even where device memory is host-visible (lavapipe, integrated
    // GPUs): how the discrete-GPU path is tested on any device (also:
    // DECODED_VULKAN_UNMAPPED_DEVICE_MEMORY=1).
    bool unmapped_device_memory = false;
  };

  // Where a buffer lives, by who touches its bytes (vulkan_buffer.h).
  enum class Memory : int32_t {
    kDeviceOnly = 0,  // only kernels: weights, KV caches, intermediates (a discrete GPU's VRAM)
    kUpload = 1,      // the host writes, kernels read: per-step data, constants, control words
    kReadback = 2,    // kernels write, the host reads: step outputs (host-cached where there is such memory)
  };

  // NOT_FOUND naming the devices there are for an index past them;
  // UNIMPLEMENTED naming the feature when the device lacks one the kernels
  // need (Vulkan 1.2, buffer device address, 8/16-bit storage, int64, int8,
  // int16, scalar block layout, timeline semaphores); FAILED_PRECONDITION if
  // validation was asked for and the layer is not installed.
  static absl::StatusOr<std::shared_ptr<Device>> Open(const Options& options);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  VkDevice device() const { return device_; }
  VkPhysicalDevice physical() const { return physical_; }
  uint32_t queue_family() const { return queue_family_; }
  const PhysicalDeviceInfo& info() const { return info_; }
  // The memory type of each kind: kDeviceOnly the device-local type of the
  // largest heap; kUpload host-visible and coherent, device-local too where
  // there is such a type (integrated GPUs, lavapipe, a discrete GPU's BAR);
  // kReadback host-visible and coherent, host-cached where possible. On
  // lavapipe all three are one type.
  uint32_t memory_type(Memory kind) const { return types_[static_cast<int>(kind)]; }
  // Whether buffers of `kind` are mapped for the host (never kDeviceOnly with
  // Options::unmapped_device_memory, nor where its type is not host-visible).
  bool mapped(Memory kind) const { return mapped_[static_cast<int>(kind)]; }
  uint64_t max_allocation_bytes() const { return max_allocation_bytes_; }
  // The device-only heap: what --kv_budget_mb and the weights share.
  uint64_t heap_bytes() const { return heap_size_[heap_of(Memory::kDeviceOnly)]; }
  uint32_t heap_of(Memory kind) const { return heap_index_[static_cast<int>(kind)]; }
  uint64_t heap_size(uint32_t heap) const { return heap_size_[heap]; }
  // Invocations per subgroup (lavapipe: 8; NVIDIA: 32), a divisor of 64.
  uint32_t subgroup_size() const { return subgroup_size_; }
  // Shared memory one workgroup may declare (maxComputeSharedMemorySize;
  // lavapipe 32 KiB, NVIDIA 48 KiB): whether the tiled mat-mat can run.
  uint32_t shared_memory_bytes() const { return shared_memory_bytes_; }
  // A CPU implementation (lavapipe): few large workgroups beat many small ones.
  bool is_cpu() const { return info_.type == "cpu"; }

  // Submits `cb` to the queue, signalling `timeline` with `value` when done.
  // UNAVAILABLE once the device is lost (lost() turns true).
  absl::Status Submit(VkCommandBuffer cb, VkSemaphore timeline, uint64_t value);
  // Waits until `timeline` reaches `value`.
  absl::Status Wait(VkSemaphore timeline, uint64_t value);
  bool lost() const { return lost_.load(std::memory_order_relaxed); }

  // The kernels' pipelines on this device.
  Pipelines& pipelines() { return *pipelines_; }

  // Device memory held by live buffers (bytes): all heaps, or one.
  int64_t allocated_bytes() const {
    int64_t total = 0;
    for (const auto& h : allocated_) total += h.load(std::memory_order_relaxed);
    return total;
  }
  int64_t allocated_bytes(uint32_t heap) const { return allocated_[heap].load(std::memory_order_relaxed); }
  void AddAllocatedBytes(uint32_t heap, int64_t delta) { allocated_[heap].fetch_add(delta, std::memory_order_relaxed); }

  // Copies host bytes into a buffer that is not mapped, through a staging
  // buffer and a one-off submission on the queue (weights at load; never per
  // token). Blocks until the copy is done.
  absl::Status CopyToUnmapped(VkBuffer dst, size_t offset, const void* src, size_t bytes);
  // Staging copies made (CopyToUnmapped calls that copied bytes).
  int64_t staging_copies() const { return staging_copies_.load(std::memory_order_relaxed); }

  // Warnings and errors the validation layer reported (0 without validation).
  int64_t validation_messages() const { return validation_messages_.load(); }
  bool validation_enabled() const { return messenger_ != VK_NULL_HANDLE; }

  // Maps a failed VkResult onto a status naming `what`; marks the device
  // lost on VK_ERROR_DEVICE_LOST.
  absl::Status Check(VkResult r, const char* what);

 private:
  Device() = default;
  static VKAPI_ATTR VkBool32 VKAPI_CALL OnValidationMessage(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                            VkDebugUtilsMessageTypeFlagsEXT type,
                                                            const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                            void* self);

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  absl::Mutex queue_mu_;
  VkQueue queue_ ABSL_GUARDED_BY(queue_mu_) = VK_NULL_HANDLE;
  int64_t lose_after_submissions_ = -1;  // fault injection (vulkan_device.cc)
  int64_t submissions_ ABSL_GUARDED_BY(queue_mu_) = 0;
  PhysicalDeviceInfo info_;
  uint32_t types_[3] = {0, 0, 0};
  bool mapped_[3] = {true, true, true};
  uint32_t heap_index_[3] = {0, 0, 0};
  uint64_t heap_size_[VK_MAX_MEMORY_HEAPS] = {};
  uint64_t max_allocation_bytes_ = 0;
  absl::Mutex staging_mu_;  // one staging copy at a time
  std::atomic<int64_t> staging_copies_{0};
  uint32_t subgroup_size_ = 0;
  uint32_t shared_memory_bytes_ = 0;
  std::unique_ptr<Pipelines> pipelines_;
  std::atomic<bool> lost_{false};
  std::atomic<int64_t> allocated_[VK_MAX_MEMORY_HEAPS] = {};
  std::atomic<int64_t> validation_messages_{0};
};

}  // namespace decoded::vulkan

#endif  // DECODED_ENGINE_VULKAN_VULKAN_DEVICE_H_
