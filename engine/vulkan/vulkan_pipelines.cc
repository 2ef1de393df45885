#include "engine/vulkan/vulkan_pipelines.h"

#include "absl/strings/str_cat.h"
#include "engine/vulkan/vulkan_device.h"

namespace decoded::vulkan {

Pipelines::~Pipelines() {
  absl::MutexLock lock(&mu_);
  for (VkPipeline p : pipelines_) {
    if (p != VK_NULL_HANDLE) vkDestroyPipeline(device_.device(), p, nullptr);
  }
  if (layout_ != VK_NULL_HANDLE) vkDestroyPipelineLayout(device_.device(), layout_, nullptr);
}

absl::StatusOr<VkPipelineLayout> Pipelines::LayoutLocked() {
  if (layout_ != VK_NULL_HANDLE) return layout_;
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, static_cast<uint32_t>(kPushConstantBytes)};
  VkPipelineLayoutCreateInfo li{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  li.pushConstantRangeCount = 1;
  li.pPushConstantRanges = &range;
  if (auto s = device_.Check(vkCreatePipelineLayout(device_.device(), &li, nullptr, &layout_),
                             "vkCreatePipelineLayout");
      !s.ok()) {
    return s;
  }
  return layout_;
}

absl::StatusOr<VkPipelineLayout> Pipelines::Layout() {
  absl::MutexLock lock(&mu_);
  return LayoutLocked();
}

absl::StatusOr<VkPipeline> Pipelines::Get(Kernel k) {
  absl::MutexLock lock(&mu_);
  VkPipeline& slot = pipelines_[static_cast<size_t>(k)];
  if (slot != VK_NULL_HANDLE) return slot;
  auto layout = LayoutLocked();
  if (!layout.ok()) return layout.status();
  const absl::Span<const uint32_t> code = KernelSpirv(k);
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mi.codeSize = code.size() * sizeof(uint32_t);
  mi.pCode = code.data();
  VkShaderModule module = VK_NULL_HANDLE;
  if (auto s = device_.Check(vkCreateShaderModule(device_.device(), &mi, nullptr, &module), "vkCreateShaderModule");
      !s.ok()) {
    return s;
  }
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = module;
  ci.stage.pName = "main";
  ci.layout = *layout;
  const VkResult r = vkCreateComputePipelines(device_.device(), VK_NULL_HANDLE, 1, &ci, nullptr, &slot);
  vkDestroyShaderModule(device_.device(), module, nullptr);
  if (auto s = device_.Check(r, KernelName(k)); !s.ok()) {
    slot = VK_NULL_HANDLE;
    return s;
  }
  return slot;
}

}  // namespace decoded::vulkan
