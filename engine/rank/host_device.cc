#include <memory>
#include <string>
#include <utility>

#include "common/status_macros.h"
#include "engine/memory/host_backend.h"
#include "engine/rank/device.h"

namespace vamp {
namespace {

class HostDevice final : public Device {
 public:
  explicit HostDevice(HostDeviceOptions options) : options_(std::move(options)) {}

  std::string name() const override { return "cpu"; }
  bool is_cuda() const override { return false; }
  absl::Status Activate(bool) override { return absl::OkStatus(); }

  absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateMemoryBackend() override {
    VAMP_ASSIGN_OR_RETURN(
        std::unique_ptr<HostMemoryBackend> backend,
        HostMemoryBackend::Create(options_.page_bytes, options_.memory_bytes, options_.populate));
    return std::unique_ptr<MemoryBackend>(std::move(backend));
  }

  std::unique_ptr<InFlightFence> CreateFence() override {
    return std::make_unique<CallbackFence>([] { return absl::OkStatus(); });
  }

  absl::StatusOr<std::unique_ptr<RankExperts>> CreateExperts(
      ExpertStore* store, const ExpertShardLayout& layout) override {
    VAMP_ASSIGN_OR_RETURN(std::unique_ptr<ExpertStoreWeights> weights,
                          ExpertStoreWeights::Create(store, layout, options_.staging));
    return std::unique_ptr<RankExperts>(std::make_unique<HostRankExperts>(std::move(weights)));
  }

  absl::StatusOr<DeviceModel> CreateModel(CausalLm* host_model, const RunnerConfig&, DType,
                                          DeviceAllReduce*, RankExperts&) override {
    DeviceModel out;  // the runner runs the host model itself
    host_model->ForEachWeight([&](absl::string_view, absl::Span<const float> data) {
      out.weight_bytes += data.size() * sizeof(float);
    });
    return out;
  }

  absl::StatusOr<KvCacheView> KvView(const KvRegion& region, int num_decoder_layers) override {
    return HostKvRegionView(region, num_decoder_layers);
  }

 private:
  const HostDeviceOptions options_;
};

}  // namespace

std::unique_ptr<Device> CreateHostDevice(HostDeviceOptions options) {
  return std::make_unique<HostDevice>(std::move(options));
}

}  // namespace vamp
