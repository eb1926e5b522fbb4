// Carves one device (or pinned) allocation into aligned sub-ranges, for the GPU models' weight,
// workspace and per-step metadata areas: a sizing pass over a null base tells how many bytes to
// allocate, a second pass over the allocation hands out the same ranges. Ranges start on
// kDeviceAlign-byte boundaries (cuBLAS and vector loads want 256).
#ifndef VAMP_ENGINE_RUNNER_CUDA_DEVICE_CARVER_H_
#define VAMP_ENGINE_RUNNER_CUDA_DEVICE_CARVER_H_

#include <algorithm>
#include <cstdint>

namespace vamp {

inline constexpr uint64_t kDeviceAlign = 256;

class DeviceCarver {
 public:
  // `base` null: a sizing pass (Take returns null).
  explicit DeviceCarver(uint8_t* base) : base_(base) {}

  // The next `elements` T (at least one element's room, so every range has its own address).
  template <typename T>
  T* Take(int64_t elements) {
    const uint64_t at =
        TakeOffset(std::max<int64_t>(elements, 1) * static_cast<int64_t>(sizeof(T)));
    return base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + at);
  }
  // The next `bytes` bytes (at least one), as an offset from the base.
  uint64_t TakeOffset(int64_t bytes) {
    const uint64_t at = used_;
    used_ += static_cast<uint64_t>(std::max<int64_t>(bytes, 1));
    used_ = (used_ + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
    return at;
  }
  uint64_t used() const { return used_; }

 private:
  uint8_t* base_;
  uint64_t used_ = 0;
};

}  // namespace vamp

#endif  // VAMP_ENGINE_RUNNER_CUDA_DEVICE_CARVER_H_
