#include "engine/vulkan/vulkan_device.h"

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

bool EnvValidation() {
  const char* v = std::getenv("DECODED_VULKAN_VALIDATION");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

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

  // Every buffer is mapped: the memory must be host-visible and coherent.
  // Device-local as well where the device has it (integrated GPUs, lavapipe,
  // discrete GPUs with resizable BAR); system memory otherwise.
  VkPhysicalDeviceMemoryProperties mem;
  vkGetPhysicalDeviceMemoryProperties(d->physical_, &mem);
  const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  int best = -1;
  for (uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = mem.memoryTypes[i].propertyFlags;
    if ((f & host) != host) continue;
    const bool local = f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    if (best < 0 || (local && !d->memory_device_local_)) {
      best = static_cast<int>(i);
      d->memory_device_local_ = local;
    }
  }
  if (best < 0) return absl::UnimplementedError(absl::StrCat(d->info_.name, " has no host-visible coherent memory"));
  d->memory_type_ = static_cast<uint32_t>(best);
  d->heap_bytes_ = mem.memoryHeaps[mem.memoryTypes[best].heapIndex].size;
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

absl::Status Device::Wait(VkSemaphore timeline, uint64_t value) {
  VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
  wi.semaphoreCount = 1;
  wi.pSemaphores = &timeline;
  wi.pValues = &value;
  return Check(vkWaitSemaphores(device_, &wi, UINT64_MAX), "vkWaitSemaphores");
}

}  // namespace decoded::vulkan
