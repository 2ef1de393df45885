#include "engine/vulkan/vulkan_backend.h"

#include <atomic>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/vulkan/vulkan_buffer.h"
#include "engine/vulkan/vulkan_executor.h"

namespace decoded::vulkan {
namespace {

std::atomic<int64_t> g_uploaded_weight_bytes{0};
std::atomic<int64_t> g_uploaded_data_bytes{0};

class VulkanBackend final : public Backend, public WeightStore {
 public:
  VulkanBackend(std::shared_ptr<Device> device, const BackendOptions& options)
      : device_(std::move(device)), options_(options) {}
  ~VulkanBackend() override {
    absl::MutexLock lock(&mu_);
    for (const auto& [ptr, buffer] : weights_) g_uploaded_weight_bytes.fetch_sub(static_cast<int64_t>(buffer->size()));
  }

  std::string_view name() const override { return "vulkan"; }
  std::string device_name() const override { return device_->info().name; }

  absl::StatusOr<std::unique_ptr<decoded::Executor>> CreateExecutor(int threads,
                                                                    const std::atomic<int>* lent_threads) override {
    auto e = Executor::Create(device_, threads, lent_threads);
    if (!e.ok()) return e.status();
    return std::unique_ptr<decoded::Executor>(*std::move(e));
  }

  absl::Status CheckSupported(const Graph& graph) const override { return CheckGraphSupported(graph); }

  absl::Status PrepareWeights(const Graph& graph) override {
    for (const Node& n : graph.nodes()) {
      if (n.op != Op::kWeight) continue;
      if (absl::StatusOr<uint64_t> a = Address(*n.weight); !a.ok()) return a.status();
    }
    return absl::OkStatus();
  }

  int64_t allocated_bytes() const override { return device_->allocated_bytes(); }
  int64_t memory_capacity_bytes() const override { return static_cast<int64_t>(device_->heap_bytes()); }
  absl::Status health() const override {
    if (device_->lost()) return absl::UnavailableError(absl::StrCat("Vulkan device ", device_->info().name, " was lost"));
    return absl::OkStatus();
  }
  int64_t validation_messages() const override { return device_->validation_messages(); }
  // Chunks of TiledMatMulMinRows rows or more take the tiled mat-mat.
  bool prefill_depends_on_chunk_rows() const override { return TiledMatMulAvailable(*device_); }

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes, BufferAccess access) override {
    auto b = Buffer::Create(device_, bytes,
                            access == BufferAccess::kDeviceOnly ? Device::Memory::kDeviceOnly : Device::Memory::kUpload);
    if (!b.ok()) return b.status();
    return std::unique_ptr<DeviceBuffer>(*std::move(b));
  }

  void Upload(DeviceBuffer& dst, const void* src, size_t bytes, size_t offset) override {
    // Mapped coherent memory: the next submission sees the bytes. A
    // device-only buffer is written through a staging copy.
    if (dst.data() != nullptr) {
      std::memcpy(static_cast<uint8_t*>(dst.data()) + offset, src, bytes);
    } else if (auto* b = dynamic_cast<Buffer*>(&dst); b != nullptr) {
      b->Write(offset, src, bytes).IgnoreError();  // a lost device fails the next Run
    }
    g_uploaded_data_bytes.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  }

  absl::StatusOr<std::unique_ptr<CompiledPlan>> Compile(Graph graph, MemoryPlan plan,
                                                       const PlanResources& resources) override {
    return CompilePlan(device_, *this, std::move(graph), std::move(plan), resources, options_.plan);
  }

  absl::StatusOr<uint64_t> Address(const WeightTensor& w) override {
    absl::MutexLock lock(&mu_);
    auto it = weights_.find(w.data);
    if (it != weights_.end()) return it->second->device_address();
    const size_t bytes = static_cast<size_t>(w.planes * w.rows) * w.row_bytes;
    auto b = Buffer::Create(device_, bytes, Device::Memory::kDeviceOnly);
    if (!b.ok()) {
      return absl::Status(b.status().code(), absl::StrCat("weight ", w.name, ": ", b.status().message()));
    }
    if (absl::Status s = (*b)->Write(0, w.data, bytes); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("weight ", w.name, ": ", s.message()));
    }
    g_uploaded_weight_bytes.fetch_add(static_cast<int64_t>(bytes));
    const uint64_t address = (*b)->device_address();
    weights_.emplace(w.data, *std::move(b));
    return address;
  }

 private:
  const std::shared_ptr<Device> device_;
  const BackendOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<const uint8_t*, std::unique_ptr<Buffer>> weights_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Backend> CreateBackend(std::shared_ptr<Device> device, const BackendOptions& options) {
  return std::make_unique<VulkanBackend>(std::move(device), options);
}

int64_t UploadedWeightBytes() { return g_uploaded_weight_bytes.load(); }
int64_t UploadedDataBytes() { return g_uploaded_data_bytes.load(std::memory_order_relaxed); }

}  // namespace decoded::vulkan
