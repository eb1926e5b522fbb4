// Clocks. All durations inside VAMP are in microseconds (int64) or seconds (double) and say so in
// their names. Code that needs time takes a Clock so tests and the simulator can drive it.
#ifndef VAMP_COMMON_CLOCK_H_
#define VAMP_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace vamp {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time in microseconds since an arbitrary origin.
  virtual int64_t NowMicros() const = 0;
  double NowSeconds() const { return static_cast<double>(NowMicros()) * 1e-6; }
};

// The process's monotonic clock (std::chrono::steady_clock).
class SteadyClock final : public Clock {
 public:
  int64_t NowMicros() const override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // A process-wide instance; never destroyed.
  static const SteadyClock& Get() {
    static const SteadyClock* clock = new SteadyClock();
    return *clock;
  }
};

// Microseconds of the process's monotonic clock since `start` (for timings reported in µs).
inline double MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

// A clock that moves only when told to (tests, the simulator's virtual time). Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_micros = 0) : now_micros_(start_micros) {}
  int64_t NowMicros() const override { return now_micros_.load(std::memory_order_acquire); }
  void AdvanceMicros(int64_t delta) { now_micros_.fetch_add(delta, std::memory_order_acq_rel); }
  void SetMicros(int64_t t) { now_micros_.store(t, std::memory_order_release); }

 private:
  std::atomic<int64_t> now_micros_;
};

}  // namespace vamp

#endif  // VAMP_COMMON_CLOCK_H_
