// Device: what building and running one rank needs from the hardware it runs on, in the style of
// LevelDB's Env. BuildRank (rank.h) assembles a rank the same way on every device; a Device
// supplies the parts that differ: the memory backend, the in-flight fence, the expert weights the
// forward pass reads (and stages), the model the runner runs and the KV cache view.
//
// Implementations: the host (CreateHostDevice, below: host memory backend, CPU reference kernels,
// float32) and CUDA (engine/rank/cuda_device.h, CUDA builds only: VMM pages on one GPU, the device
// model in bfloat16 or float32).
//
// Thread-safety: a Device is used by one thread at a time (the agent serialises its calls).
#ifndef VAMP_ENGINE_RANK_DEVICE_H_
#define VAMP_ENGINE_RANK_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/experts/expert_store.h"
#include "engine/kv/kv_region.h"
#include "engine/memory/fence.h"
#include "engine/memory/memory_backend.h"
#include "engine/model/causal_lm.h"
#include "engine/model/dtype.h"
#include "engine/runner/model_runner.h"
#include "engine/staging/expert_store_weights.h"

namespace vamp {

class DeviceAllReduce;  // engine/runner/cuda/device_all_reduce.h (CUDA builds)

// The expert weights of one rank on its device, over the rank's ExpertStore: the loader writes
// shards through sink(), the forward pass reads pointer tables through weights(). Owned by the
// rank; must be destroyed before the store.
class RankExperts {
 public:
  virtual ~RankExperts() = default;
  virtual ExpertWeightSink& sink() = 0;
  virtual ExpertWeights& weights() = 0;
  // Staging so far: bytes copied, and the time the forward pass waited for copies in µs (on
  // CUDA: the compute stream's exposed staging time, measured on the device).
  virtual StagingStats stats() const = 0;
  // Passes of at most this many tokens copy only the offloaded experts they route to (0: every
  // pass copies the whole offloaded region, as the host device always does).
  virtual int64_t routed_staging_max_tokens() const { return 0; }
};

// What a device runs a loaded model with.
struct DeviceModel {
  // The model the runner runs; null when the runner runs the host model itself.
  std::unique_ptr<CausalLm> model;
  // What the model's non-expert weights occupy on the device, bytes.
  uint64_t weight_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda:N".
  virtual std::string name() const = 0;
  virtual bool is_cuda() const = 0;
  // Makes this device current on the calling thread (CUDA's current device is per thread) and,
  // with `synchronize`, waits until all its work has finished. A no-op on the host.
  virtual absl::Status Activate(bool synchronize) = 0;
  // A memory backend on this device (cheap: it creates no page).
  virtual absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateMemoryBackend() = 0;
  // What PageRemapper waits on before a page is unmapped.
  virtual std::unique_ptr<InFlightFence> CreateFence() = 0;
  // Expert weights over `store` (which must outlive the result), shards laid out as `layout`.
  virtual absl::StatusOr<std::unique_ptr<RankExperts>> CreateExperts(
      ExpertStore* store, const ExpertShardLayout& layout) = 0;
  // The model the runner runs over `host_model` (loaded, its expert store finalised), sized for
  // `runner`, computing in `dtype`; `all_reduce` is the tensor-parallel sum on the device (null
  // for tp_size 1 and on the host, whose runner all-reduces through a Communicator). `experts`
  // must come from this device's CreateExperts; they, `host_model` and `all_reduce` must outlive
  // the result.
  virtual absl::StatusOr<DeviceModel> CreateModel(CausalLm* host_model, const RunnerConfig& runner,
                                                  DType dtype, DeviceAllReduce* all_reduce,
                                                  RankExperts& experts) = 0;
  // The runner's view of `region`'s mapped blocks (device addresses for the device's kernels).
  virtual absl::StatusOr<KvCacheView> KvView(const KvRegion& region, int num_decoder_layers) = 0;
};

struct HostDeviceOptions {
  // The host memory backend (host_backend.h): page size, the memory it reports as the device's
  // (0 = physical RAM), and whether pages are committed when created.
  uint64_t page_bytes = uint64_t{2} << 20;
  uint64_t memory_bytes = 0;
  bool populate = true;
  // Staging of offloaded experts (ExpertStoreWeights).
  StagingOptions staging;
};

// The host: HostMemoryBackend, ExpertStoreWeights (float32 shards), the loaded model run as is.
// Every step (staging copies included) has finished when ExecuteStep returns, and remaps run
// between steps, so its fence never waits.
std::unique_ptr<Device> CreateHostDevice(HostDeviceOptions options);

// The host device's RankExperts, for tests and benches that inspect the staging.
class HostRankExperts final : public RankExperts {
 public:
  explicit HostRankExperts(std::unique_ptr<ExpertStoreWeights> weights)
      : weights_(std::move(weights)) {}
  ExpertWeightSink& sink() override { return *weights_; }
  ExpertWeights& weights() override { return *weights_; }
  StagingStats stats() const override { return weights_->engine().stats(); }
  ExpertStoreWeights& store_weights() { return *weights_; }

 private:
  std::unique_ptr<ExpertStoreWeights> weights_;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RANK_DEVICE_H_
