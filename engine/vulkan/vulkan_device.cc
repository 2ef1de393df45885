#include "engine/vulkan/vulkan_device.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace decoded::vulkan {
namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

const char* TypeName(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    default: return "other";
  }
}

bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

bool EnvValidation() { return EnvFlag("DECODED_VULKAN_VALIDATION"); }

// Fault injection for tests of the serving path: the submission after the
// first N behaves as if the driver had answered VK_ERROR_DEVICE_LOST. -1: off.
int64_t EnvLoseAfterSubmissions() {
  const char* v = std::getenv("DECODED_VULKAN_LOSE_DEVICE_AFTER_SUBMISSIONS");
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  return *end == '\0' && n >= 0 ? n : -1;
}

bool HasLayer(const char* name) {
  uint32_t n = 0;
  if (vkEnumerateInstanceLayerProperties(&n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkLayerProperties> layers(n);
  if (vkEnumerateInstanceLayerProperties(&n, layers.data()) != VK_SUCCESS) return false;
  for (const auto& l : layers) {
    if (std::strcmp(l.layerName, name) == 0) return true;
  }
  return false;
}

absl::StatusOr<VkInstance> CreateInstance(bool validation) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "decoded";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  const char* layers[] = {kValidationLayer};
  const char* extensions[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
  if (validation) {
    ci.enabledLayerCount = 1;
    ci.ppEnabledLayerNames = layers;
    ci.enabledExtensionCount = 1;
    ci.ppEnabledExtensionNames = extensions;
  }
  VkInstance instance = VK_NULL_HANDLE;
  const VkResult r = vkCreateInstance(&ci, nullptr, &instance);
  if (r != VK_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("no Vulkan driver: vkCreateInstance returned ", static_cast<int>(r)));
  }
  return instance;
}

std::vector<VkPhysicalDevice> PhysicalDevices(VkInstance instance) {
  uint32_t n = 0;
  vkEnumeratePhysicalDevices(instance, &n, nullptr);
  std::vector<VkPhysicalDevice> out(n);
  if (n > 0) vkEnumeratePhysicalDevices(instance, &n, out.data());
  out.resize(n);
  return out;
}

PhysicalDeviceInfo Describe(VkPhysicalDevice pd, int index) {
  VkPhysicalDeviceProperties props;
  vkGetPhysicalDeviceProperties(pd, &props);
  return PhysicalDeviceInfo{index, props.deviceName, TypeName(props.deviceType), props.apiVersion};
}

}  // namespace

absl::StatusOr<std::vector<PhysicalDeviceInfo>> ListDevices() {
  auto instance = CreateInstance(false);
  if (!instance.ok()) return instance.status();
  std::vector<PhysicalDeviceInfo> out;
  const auto devices = PhysicalDevices(*instance);
  for (size_t i = 0; i < devices.size(); ++i) out.push_back(Describe(devices[i], static_cast<int>(i)));
  vkDestroyInstance(*instance, nullptr);
  return out;
}

VKAPI_ATTR VkBool32 VKAPI_CALL Device::OnValidationMessage(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                           VkDebugUtilsMessageTypeFlagsEXT,
                                                           const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                           void* self) {
  static_cast<Device*>(self)->validation_messages_.fetch_add(1);
  std::fprintf(stderr, "decoded: Vulkan validation %s: %s\n",
               (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) ? "error" : "warning",
               data->pMessage != nullptr ? data->pMessage : "");
  return VK_FALSE;
}

absl::StatusOr<std::shared_ptr<Device>> Device::Open(const Options& options) {
  const bool validation = options.validation || EnvValidation();
  if (validation && !HasLayer(kValidationLayer)) {
    return absl::FailedPreconditionError(absl::StrCat("Vulkan validation was asked for but ", kValidationLayer,
                                                      " is not installed (Debian: vulkan-validationlayers)"));
  }
  std::shared_ptr<Device> d(new Device());
  d->lose_after_submissions_ = EnvLoseAfterSubmissions();
  auto instance = CreateInstance(validation);
  if (!instance.ok()) return instance.status();
  d->instance_ = *instance;
  if (validation) {
    VkDebugUtilsMessengerCreateInfoEXT mi{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
    mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    mi.pfnUserCallback = &Device::OnValidationMessage;
    mi.pUserData = d.get();
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(d->instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (create == nullptr || create(d->instance_, &mi, nullptr, &d->messenger_) != VK_SUCCESS) {
      return absl::FailedPreconditionError("cannot install the Vulkan validation messenger");
    }
  }

  const auto devices = PhysicalDevices(d->instance_);
  if (options.index < 0 || options.index >= static_cast<int>(devices.size())) {
    std::vector<std::string> names;
    for (size_t i = 0; i < devices.size(); ++i) {
      names.push_back(absl::StrCat("vulkan:", i, " ", Describe(devices[i], static_cast<int>(i)).name));
    }
    return absl::NotFoundError(absl::StrCat("no Vulkan device ", options.index, ": this machine has ",
                                            devices.size(), devices.empty() ? "" : " (", absl::StrJoin(names, ", "),
                                            devices.empty() ? "" : ")"));
  }
  d->physical_ = devices[static_cast<size_t>(options.index)];
  d->info_ = Describe(d->physical_, options.index);
  if (VK_API_VERSION_MAJOR(d->info_.api_version) == 1 && VK_API_VERSION_MINOR(d->info_.api_version) < 2) {
    return absl::UnimplementedError(absl::StrCat(d->info_.name, " supports Vulkan ",
                                                 VK_API_VERSION_MAJOR(d->info_.api_version), ".",
                                                 VK_API_VERSION_MINOR(d->info_.api_version), "; decoded needs 1.2"));
  }

  // The features every kernel relies on (shaders/common.glsl).
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  f11.pNext = &f12;
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &f11;
  vkGetPhysicalDeviceFeatures2(d->physical_, &f2);
  const struct {
    VkBool32 have;
    const char* name;
  } needed[] = {
      {f2.features.shaderInt64, "shaderInt64"},
      {f2.features.shaderInt16, "shaderInt16"},
      {f11.storageBuffer16BitAccess, "storageBuffer16BitAccess"},
      {f12.storageBuffer8BitAccess, "storageBuffer8BitAccess"},
      {f12.shaderInt8, "shaderInt8"},
      {f12.scalarBlockLayout, "scalarBlockLayout"},
      {f12.bufferDeviceAddress, "bufferDeviceAddress"},
      {f12.timelineSemaphore, "timelineSemaphore"},
  };
  for (const auto& n : needed) {
    if (!n.have) return absl::UnimplementedError(absl::StrCat(d->info_.name, " lacks the Vulkan feature ", n.name));
  }
  // The mat-vec reduces a row's partial sums with subgroup arithmetic.
  VkPhysicalDeviceSubgroupProperties sub{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 sub_props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  sub_props.pNext = &sub;
  vkGetPhysicalDeviceProperties2(d->physical_, &sub_props);
  if (!(sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) ||
      !(sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) || sub.subgroupSize == 0 ||
      64 % sub.subgroupSize != 0) {
    return absl::UnimplementedError(absl::StrCat(d->info_.name, " lacks subgroup arithmetic in compute shaders "
                                                 "with a subgroup size dividing 64 (it reports ", sub.subgroupSize,
                                                 ")"));
  }
  d->subgroup_size_ = sub.subgroupSize;
  d->shared_memory_bytes_ = sub_props.properties.limits.maxComputeSharedMemorySize;
  VkPhysicalDeviceVulkan12Features e12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  e12.storageBuffer8BitAccess = VK_TRUE;
  e12.shaderInt8 = VK_TRUE;
  e12.scalarBlockLayout = VK_TRUE;
  e12.bufferDeviceAddress = VK_TRUE;
  e12.timelineSemaphore = VK_TRUE;
  VkPhysicalDeviceVulkan11Features e11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  e11.storageBuffer16BitAccess = VK_TRUE;
  e11.pNext = &e12;
  VkPhysicalDeviceFeatures2 e2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  e2.features.shaderInt64 = VK_TRUE;
  e2.features.shaderInt16 = VK_TRUE;
  e2.pNext = &e11;

  uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(d->physical_, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> families(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(d->physical_, &nq, families.data());
  bool found = false;
  for (uint32_t i = 0; i < nq && !found; ++i) {
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      d->queue_family_ = i;
      found = true;
    }
  }
  if (!found) return absl::UnimplementedError(absl::StrCat(d->info_.name, " has no compute queue"));

  const float priority = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = d->queue_family_;
  qi.queueCount = 1;
  qi.pQueuePriorities = &priority;
  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.pNext = &e2;
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  if (auto s = d->Check(vkCreateDevice(d->physical_, &di, nullptr, &d->device_), "vkCreateDevice"); !s.ok()) {
    return s;
  }
  {
    absl::MutexLock lock(&d->queue_mu_);
    vkGetDeviceQueue(d->device_, d->queue_family_, 0, &d->queue_);
  }

  // Three kinds of buffer (Device::Memory): device-only ones where the
  // device keeps its own memory, host-written and host-read ones mapped.
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(d->physical_, &mem);
  for (uint32_t h = 0; h < mem.memoryHeapCount; ++h) d->heap_size_[h] = mem.memoryHeaps[h].size;
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  // Scores a type for a kind; -1: unusable for it.
  auto pick = [&](auto score) {
    int best = -1;
    int64_t best_score = -1;
    for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
      const int64_t sc = score(mem.memoryTypes[i].propertyFlags, mem.memoryHeaps[mem.memoryTypes[i].heapIndex].size);
      if (sc > best_score) {
        best = static_cast<int>(i);
        best_score = sc;
      }
    }
    return best;
  };
  const int upload = pick([&](VkMemoryPropertyFlags f, VkDeviceSize) -> int64_t {
    if ((f & host) != host) return -1;
    return (f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) ? 1 : 0;
  });
  const int readback = pick([&](VkMemoryPropertyFlags f, VkDeviceSize) -> int64_t {
    if ((f & host) != host) return -1;
    return (f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT) ? 1 : 0;
  });
  // Device-local of the largest heap; among those, one the host cannot map
  // (a discrete GPU's VRAM rather than its BAR window).
  const int device_only = pick([&](VkMemoryPropertyFlags f, VkDeviceSize heap) -> int64_t {
    if (!(f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) return -1;
    return static_cast<int64_t>(heap >> 20) * 2 + ((f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) ? 0 : 1);
  });
  if (upload < 0) return absl::UnimplementedError(absl::StrCat(d->info_.name, " has no host-visible coherent memory"));
  const int kinds[3] = {device_only >= 0 ? device_only : upload, upload, readback};
  const bool unmapped = options.unmapped_device_memory || EnvFlag("DECODED_VULKAN_UNMAPPED_DEVICE_MEMORY");
  for (int k = 0; k < 3; ++k) {
    d->types_[k] = static_cast<uint32_t>(kinds[k]);
    d->heap_index_[k] = mem.memoryTypes[kinds[k]].heapIndex;
    const bool visible = (mem.memoryTypes[kinds[k]].propertyFlags & host) == host;
    d->mapped_[k] = visible && !(k == static_cast<int>(Memory::kDeviceOnly) && unmapped);
  }
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &m3;
  vkGetPhysicalDeviceProperties2(d->physical_, &p2);
  d->max_allocation_bytes_ = m3.maxMemoryAllocationSize;
  d->pipelines_ = std::make_unique<Pipelines>(*d);
  return d;
}

Device::~Device() {
  if (device_ != VK_NULL_HANDLE) {
    vkDeviceWaitIdle(device_);
    pipelines_.reset();
    vkDestroyDevice(device_, nullptr);
  }
  if (messenger_ != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy != nullptr) destroy(instance_, messenger_, nullptr);
  }
  if (instance_ != VK_NULL_HANDLE) vkDestroyInstance(instance_, nullptr);
}

absl::Status Device::Check(VkResult r, const char* what) {
  if (r == VK_SUCCESS) return absl::OkStatus();
  if (r == VK_ERROR_DEVICE_LOST) {
    lost_.store(true);
    return absl::UnavailableError(absl::StrCat("Vulkan device ", info_.name, " lost (", what, ")"));
  }
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of ",
                                                     r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "device" : "host",
                                                     " memory on ", info_.name));
  }
  return absl::InternalError(absl::StrCat(what, " failed on ", info_.name, ": VkResult ", static_cast<int>(r)));
}

absl::Status Device::Submit(VkCommandBuffer cb, VkSemaphore timeline, uint64_t value) {
  if (lost()) return absl::UnavailableError(absl::StrCat("Vulkan device ", info_.name, " was lost"));
  VkTimelineSemaphoreSubmitInfo ti{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  ti.signalSemaphoreValueCount = 1;
  ti.pSignalSemaphoreValues = &value;
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.pNext = &ti;
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb;
  si.signalSemaphoreCount = 1;
  si.pSignalSemaphores = &timeline;
  absl::MutexLock lock(&queue_mu_);
  if (lose_after_submissions_ >= 0 && submissions_++ >= lose_after_submissions_) {
    return Check(VK_ERROR_DEVICE_LOST, "vkQueueSubmit (DECODED_VULKAN_LOSE_DEVICE_AFTER_SUBMISSIONS)");
  }
  return Check(vkQueueSubmit(queue_, 1, &si, VK_NULL_HANDLE), "vkQueueSubmit");
}

absl::Status Device::CopyToUnmapped(VkBuffer dst, size_t offset, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (lost()) return absl::UnavailableError(absl::StrCat("Vulkan device ", info_.name, " was lost"));
  absl::MutexLock staging(&staging_mu_);
  constexpr size_t kChunk = size_t{64} << 20;
  const size_t chunk = std::min(bytes, kChunk);
  // A host-visible buffer of its own (not a Buffer: that needs a shared_ptr of this device).
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = chunk;
  bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer stage = VK_NULL_HANDLE;
  VkDeviceMemory stage_mem = VK_NULL_HANDLE;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  void* mapped = nullptr;
  auto cleanup = [&] {
    if (fence != VK_NULL_HANDLE) vkDestroyFence(device_, fence, nullptr);
    if (pool != VK_NULL_HANDLE) vkDestroyCommandPool(device_, pool, nullptr);
    if (stage != VK_NULL_HANDLE) vkDestroyBuffer(device_, stage, nullptr);
    if (stage_mem != VK_NULL_HANDLE) vkFreeMemory(device_, stage_mem, nullptr);
  };
  auto fail = [&](absl::Status s) {
    cleanup();
    return s;
  };
  if (auto s = Check(vkCreateBuffer(device_, &bi, nullptr, &stage), "vkCreateBuffer (staging)"); !s.ok()) return fail(s);
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device_, stage, &req);
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = memory_type(Memory::kUpload);
  if (auto s = Check(vkAllocateMemory(device_, &ai, nullptr, &stage_mem), "vkAllocateMemory (staging)"); !s.ok()) {
    return fail(s);
  }
  if (auto s = Check(vkBindBufferMemory(device_, stage, stage_mem, 0), "vkBindBufferMemory (staging)"); !s.ok()) {
    return fail(s);
  }
  if (auto s = Check(vkMapMemory(device_, stage_mem, 0, VK_WHOLE_SIZE, 0, &mapped), "vkMapMemory (staging)"); !s.ok()) {
    return fail(s);
  }
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.queueFamilyIndex = queue_family_;
  if (auto s = Check(vkCreateCommandPool(device_, &pi, nullptr, &pool), "vkCreateCommandPool (staging)"); !s.ok()) {
    return fail(s);
  }
  VkCommandBufferAllocateInfo cai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cai.commandPool = pool;
  cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cai.commandBufferCount = 1;
  VkCommandBuffer cb = VK_NULL_HANDLE;
  if (auto s = Check(vkAllocateCommandBuffers(device_, &cai, &cb), "vkAllocateCommandBuffers (staging)"); !s.ok()) {
    return fail(s);
  }
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  if (auto s = Check(vkCreateFence(device_, &fi, nullptr, &fence), "vkCreateFence (staging)"); !s.ok()) return fail(s);
  for (size_t done = 0; done < bytes; done += chunk) {
    const size_t n = std::min(chunk, bytes - done);
    std::memcpy(mapped, static_cast<const uint8_t*>(src) + done, n);
    if (auto s = Check(vkResetCommandPool(device_, pool, 0), "vkResetCommandPool (staging)"); !s.ok()) return fail(s);
    VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    if (auto s = Check(vkBeginCommandBuffer(cb, &begin), "vkBeginCommandBuffer (staging)"); !s.ok()) return fail(s);
    VkBufferCopy region{0, offset + done, n};
    vkCmdCopyBuffer(cb, stage, dst, 1, &region);
    // Later submissions' kernels read what the copy wrote.
    VkMemoryBarrier after{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    after.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    after.dstAccessMask = VK_ACCESS_SHADER_READ_BIT;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &after, 0,
                         nullptr, 0, nullptr);
    if (auto s = Check(vkEndCommandBuffer(cb), "vkEndCommandBuffer (staging)"); !s.ok()) return fail(s);
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    {
      absl::MutexLock lock(&queue_mu_);
      if (auto s = Check(vkQueueSubmit(queue_, 1, &si, fence), "vkQueueSubmit (staging)"); !s.ok()) return fail(s);
    }
    if (auto s = Check(vkWaitForFences(device_, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences (staging)");
        !s.ok()) {
      return fail(s);
    }
    if (auto s = Check(vkResetFences(device_, 1, &fence), "vkResetFences (staging)"); !s.ok()) return fail(s);
  }
  cleanup();
  staging_copies_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status Device::Wait(VkSemaphore timeline, uint64_t value) {
  VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
  wi.semaphoreCount = 1;
  wi.pSemaphores = &timeline;
  wi.pValues = &value;
  return Check(vkWaitSemaphores(device_, &wi, UINT64_MAX), "vkWaitSemaphores");
}

}  // namespace decoded::vulkan
