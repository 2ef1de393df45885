// The seam between the device-independent engine (graph, optimizer, decode
// driver, model families) and a compute backend (engine/cpu, engine/vulkan;
// another is a folder beside them, docs/architecture.md "Adding a backend").
// Which one serves is a run-time choice (engine/device.h: --device).
//
// A backend owns device memory (DeviceBuffer), uploads host bytes into it, and
// compiles an optimized Graph into a CompiledPlan whose pointers are resolved
// once: weights, the session's data-node buffers and KV cache, and one arena
// for intermediates. Running a compiled plan allocates nothing.
#ifndef DECODED_ENGINE_BACKEND_H_
#define DECODED_ENGINE_BACKEND_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/graph/graph.h"
#include "engine/graph/optimizer.h"

namespace decoded {

// Host-side symbols bound per step (the symbol KV-write offset path, and
// how many of a held plan's rows the step uses).
struct SymEnv {
  // The KV row each token row of the step writes (one per row).
  absl::Span<const int32_t> kv_pos;
  // A held plan has a bucket's rows (engine/runtime.cc BatchBuckets); a step
  // of fewer fills the rest with padding rows (token 0 at position 0 of a
  // pad cache) whose results nobody reads. The step's real token rows are the
  // first `live_rows`, its real output rows (graph rows after a take_rows)
  // the first `live_outputs`. A backend may skip the rest: the CPU does, so a
  // padding row costs no matmul (every kernel's row arithmetic is the same
  // for any row count, so the live rows' bits do not change).
  static constexpr int32_t kAllRows = -1;
  int32_t live_rows = kAllRows;
  int32_t live_outputs = kAllRows;
};

// A worker's compute resources. Obtained from the backend that runs plans.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual std::string_view backend_name() const = 0;
  virtual int threads() const = 0;
  // Host work on the worker's threads: fn(i) for every i in [0, n), each
  // index once, spread over the threads; returns when all are done. For
  // independent per-session work after a batched step (sampling B rows).
  // The default runs them in order on the calling thread.
  virtual void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
};

// Who touches a buffer's bytes, so a backend can place it.
enum class BufferAccess : int32_t {
  // The host writes or reads them through data(): per-step data, outputs.
  kHost = 0,
  // Only kernels read and write them (the host only through Backend::Upload):
  // KV caches. A GPU backend may put them where the host cannot map (a
  // discrete GPU's own memory), and their data() is then nullptr.
  kDeviceOnly = 1,
};

// Device memory. On CPU: 64-byte aligned host memory; on Vulkan: device
// memory, mapped into the host unless device-only (engine/vulkan/vulkan_buffer.h).
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  // The host view of the bytes; nullptr for a device-only buffer the host
  // cannot map (BufferAccess::kDeviceOnly on a discrete GPU).
  virtual void* data() = 0;
  virtual const void* data() const = 0;
  virtual size_t size() const = 0;
  // The address kernels use for the first byte: what device-resident tables
  // (the KV binding table, engine/kv_rows.h) hold. The host pointer on CPU.
  virtual uint64_t device_address() const { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data())); }
};

// Everything a plan is bound to besides weights: one buffer per DataSlot for
// kInput nodes (nullptr for slots the graph does not use), and the geometry of
// the KV caches its rows will address. Which caches those are is per-step
// data (DataSlot::kKvRows), so no cache is bound at compile time.
struct PlanResources {
  std::array<DeviceBuffer*, static_cast<size_t>(DataSlot::kCount)> inputs{};
  int32_t kv_layers = 0;  // layers of every cache a row may address
  KvLayout kv_layout;     // their row geometry
};

class CompiledPlan {
 public:
  virtual ~CompiledPlan() = default;
  // Runs every scheduled node. INTERNAL if a kernel detected an out-of-range
  // KV write (the driver checks bounds first, so this is a bug, not input).
  // On the symbol offset path, env.kv_pos holds one entry per token row.
  virtual absl::Status Run(Executor& executor, const SymEnv& env) = 0;
  // f32 contents of graph output `i` after Run(); host-visible.
  virtual absl::Span<const float> output(size_t i) const = 0;
  virtual const Graph& graph() const = 0;
  virtual size_t arena_bytes() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu", "vulkan".
  virtual std::string_view name() const = 0;
  // The device plans run on, for people: "cpu", or the GPU's name.
  virtual std::string device_name() const { return std::string(name()); }
  // A worker's executor for this backend's plans: `threads` host threads
  // (>= 1) for the work the backend runs on the host (all of it on CPU;
  // sampling beside a GPU), `lent_threads` as CreateCpuExecutor's.
  // UNAVAILABLE when the device cannot give one (lost, out of queues).
  virtual absl::StatusOr<std::unique_ptr<Executor>> CreateExecutor(int threads,
                                                                   const std::atomic<int>* lent_threads = nullptr) = 0;
  // OK if every node of `graph` has a kernel here; UNIMPLEMENTED naming the
  // first op (and weight type) that has none. A model is checked at load with
  // its one-token decode graph, so an unsupported family is refused before
  // it serves, never at its first token.
  virtual absl::Status CheckSupported(const Graph& graph) const = 0;
  // Makes this backend's copy of every weight `graph` reads, once per
  // process (later plans reuse it): the GGUF's bytes as they are, never
  // dequantized. Called at load with the one-token decode graph, so a model
  // too large for the device is refused before it serves.
  // RESOURCE_EXHAUSTED naming the weight when device memory runs out. A no-op
  // where plans read the weights in host memory (CPU).
  virtual absl::Status PrepareWeights(const Graph& graph) { return absl::OkStatus(); }
  // Bytes of memory this backend's buffers hold now: weights (where it copies
  // them), KV caches, plan arenas and data buffers. On CPU, the buffers'
  // reserved size (pages are committed as they are first written).
  virtual int64_t allocated_bytes() const = 0;
  // Bytes of device memory plans can use (the heap buffers come from); 0 for
  // host memory, which the operating system manages.
  virtual int64_t memory_capacity_bytes() const { return 0; }
  // OK while the device runs plans; UNAVAILABLE once it is lost (e.g.
  // VK_ERROR_DEVICE_LOST): every later Run fails, and a daemon reports
  // NOT_SERVING.
  virtual absl::Status health() const { return absl::OkStatus(); }
  // Whether a prefill chunk's results depend, in the last bits, on how many
  // rows the chunk holds (Vulkan's tiled mat-mat takes chunks of many rows,
  // its mat-vec the others). The scheduler then cuts every prompt into the
  // same chunks whatever the load, so that a session's tokens never depend
  // on which other sessions ran beside it. False where each row's arithmetic
  // is the same in any chunk (CPU).
  virtual bool prefill_depends_on_chunk_rows() const { return false; }
  // Warnings and errors a validation layer reported (Vulkan's Khronos layer,
  // when enabled); 0 where there is none.
  virtual int64_t validation_messages() const { return 0; }
  // RESOURCE_EXHAUSTED when the device cannot provide `bytes`.
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes,
                                                                 BufferAccess access = BufferAccess::kHost) = 0;
  // Copies `bytes` from host memory into `dst` at `offset`. Allocation-free
  // into a host-accessible buffer (every per-step upload); into a device-only
  // one a GPU backend may stage the copy.
  virtual void Upload(DeviceBuffer& dst, const void* src, size_t bytes, size_t offset = 0) = 0;
  // The bytes [offset, offset + bytes) of `buffer` are no longer needed (a
  // free KV block): a host backend gives the whole pages among them back to
  // the operating system (they read as zeros when next touched), so resident
  // memory follows what is in use. A no-op where device memory is the
  // driver's to manage.
  virtual void Discard(DeviceBuffer& buffer, size_t offset, size_t bytes) {}
  // Takes ownership of the graph. INVALID_ARGUMENT if a kInput slot has no
  // buffer or one too small, or a KV node's layer or geometry disagrees with
  // resources.kv_layers / kv_layout.
  virtual absl::StatusOr<std::unique_ptr<CompiledPlan>> Compile(Graph graph, MemoryPlan plan,
                                                               const PlanResources& resources) = 0;
};

// The process-wide CPU backend.
Backend& CpuBackend();

// CpuBackend() as a shared_ptr that owns nothing, for holders that share a
// device backend the same way (Model::Load's options).
std::shared_ptr<Backend> SharedCpuBackend();

}  // namespace decoded

#endif  // DECODED_ENGINE_BACKEND_H_
