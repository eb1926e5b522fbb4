#include "bench/engine/gpu_step_bandwidth.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "bench/engine/gpu_step_common.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_status.h"

namespace vamp::gpu_step_bench {

namespace {

// Two CUDA events timing work on a stream.
class CudaEventPair {
 public:
  CudaEventPair() = default;
  CudaEventPair(const CudaEventPair&) = delete;
  CudaEventPair& operator=(const CudaEventPair&) = delete;
  ~CudaEventPair() {
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
  }
  absl::Status Init() {
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventCreate(&start_));
    VAMP_CUDART_RETURN_IF_ERROR(cudaEventCreate(&stop_));
    return absl::OkStatus();
  }
  // Milliseconds of the work `enqueue` puts on `stream`, median of `reps` after one untimed run.
  absl::StatusOr<double> TimeMs(cudaStream_t stream, int reps,
                                const std::function<absl::Status()>& enqueue) {
    std::vector<double> ms;
    for (int r = -1; r < reps; ++r) {
      VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(start_, stream));
      VAMP_RETURN_IF_ERROR(enqueue());
      VAMP_CUDART_RETURN_IF_ERROR(cudaEventRecord(stop_, stream));
      VAMP_CUDART_RETURN_IF_ERROR(cudaEventSynchronize(stop_));
      float elapsed = 0;
      VAMP_CUDART_RETURN_IF_ERROR(cudaEventElapsedTime(&elapsed, start_, stop_));
      if (r >= 0) ms.push_back(elapsed);
    }
    return Summarise(ms).p50;
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace

absl::StatusOr<Bandwidths> MeasureBandwidths(const Flags& f, int64_t vocab) {
  Bandwidths b;
  cudaDeviceProp prop{};
  VAMP_CUDART_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, f.cuda_device));
  b.device_name = prop.name;
  b.device_memory_bytes = prop.totalGlobalMem;
  VAMP_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  CudaEventPair timer;
  VAMP_RETURN_IF_ERROR(timer.Init());

  b.hbm_copy_bytes = f.hbm_copy_bytes;
  {
    VAMP_ASSIGN_OR_RETURN(DeviceBuffer src, DeviceBuffer::Allocate(f.hbm_copy_bytes));
    VAMP_ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Allocate(f.hbm_copy_bytes));
    VAMP_CUDART_RETURN_IF_ERROR(cudaMemsetAsync(src.data(), 1, src.bytes(), stream.get()));
    VAMP_CUDART_RETURN_IF_ERROR(cudaMemsetAsync(dst.data(), 0, dst.bytes(), stream.get()));
    VAMP_ASSIGN_OR_RETURN(const double ms, timer.TimeMs(stream.get(), f.bandwidth_reps, [&] {
      return CudaRuntimeStatus(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(),
                                               cudaMemcpyDeviceToDevice, stream.get()),
                               "cudaMemcpyAsync (device to device)");
    }));
    b.hbm_gbps = 2.0 * static_cast<double>(f.hbm_copy_bytes) / (ms * 1e6);
  }
  {
    VAMP_ASSIGN_OR_RETURN(PinnedBuffer host, PinnedBuffer::Allocate(f.h2d_copy_bytes));
    VAMP_ASSIGN_OR_RETURN(DeviceBuffer dev, DeviceBuffer::Allocate(f.h2d_copy_bytes));
    std::fill(host.data(), host.data() + host.bytes(), uint8_t{1});
    std::vector<uint64_t> sizes;
    for (uint64_t s : {uint64_t{2} << 20, uint64_t{18} << 20, uint64_t{64} << 20}) {
      if (s < f.h2d_copy_bytes) sizes.push_back(s);
    }
    sizes.push_back(f.h2d_copy_bytes);
    for (uint64_t size : sizes) {
      VAMP_ASSIGN_OR_RETURN(const double ms, timer.TimeMs(stream.get(), f.bandwidth_reps, [&] {
        return CudaRuntimeStatus(
            cudaMemcpyAsync(dev.data(), host.data(), size, cudaMemcpyHostToDevice, stream.get()),
            "cudaMemcpyAsync (pinned host to device)");
      }));
      b.h2d_gbps.emplace_back(size, static_cast<double>(size) / (ms * 1e6));
    }
    b.h2d_peak_gbps = b.h2d_gbps.back().second;
  }
  {
    // Float32 logits of one row per sequence into a pageable vector (host-side sampling's copy).
    b.logits_bytes = static_cast<uint64_t>(f.batch) * static_cast<uint64_t>(vocab) * 4;
    VAMP_ASSIGN_OR_RETURN(DeviceBuffer dev, DeviceBuffer::Allocate(b.logits_bytes));
    std::vector<uint8_t> host(b.logits_bytes, 0);
    VAMP_ASSIGN_OR_RETURN(b.logits_d2h_ms, timer.TimeMs(stream.get(), f.bandwidth_reps, [&] {
      return CudaRuntimeStatus(cudaMemcpyAsync(host.data(), dev.data(), b.logits_bytes,
                                               cudaMemcpyDeviceToHost, stream.get()),
                               "cudaMemcpyAsync (device to pageable host)");
    }));
  }
  VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(stream.get()));
  return b;
}

absl::StatusOr<double> ReplayStagingCopies(const ExpertStore& store, const DeviceBuffer& scratch,
                                           cudaStream_t stream, int reps) {
  std::vector<ExpertStore::HostRange> ranges;
  for (int layer : store.geometry().eligible_layers) {
    const ExpertStore::HostRange r = store.OffloadedHostRange(layer);
    if (r.bytes == 0) continue;
    if (r.bytes > scratch.bytes()) {
      return absl::InternalError(absl::StrCat("layer ", layer, " stages ", r.bytes,
                                              " bytes, more than the ", scratch.bytes(),
                                              "-byte scratch buffer"));
    }
    ranges.push_back(r);
  }
  if (ranges.empty()) return 0.0;
  CudaEventPair timer;
  VAMP_RETURN_IF_ERROR(timer.Init());
  return timer.TimeMs(stream, reps, [&]() -> absl::Status {
    for (const ExpertStore::HostRange& r : ranges) {
      VAMP_CUDART_RETURN_IF_ERROR(
          cudaMemcpyAsync(scratch.data(), r.data, r.bytes, cudaMemcpyHostToDevice, stream));
    }
    return absl::OkStatus();
  });
}

}  // namespace vamp::gpu_step_bench
