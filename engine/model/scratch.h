// Reusable host scratch for the CPU models: a step's buffers grow to the largest step seen and
// are kept, so steady-state steps allocate nothing.
#ifndef VAMP_ENGINE_MODEL_SCRATCH_H_
#define VAMP_ENGINE_MODEL_SCRATCH_H_

#include <cstddef>
#include <vector>

namespace vamp {

// `v` holds at least `n` elements afterwards (never shrinks); returns its data. Contents past the
// previous size are value-initialised, earlier ones are left as they were.
template <typename T>
T* GrowScratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace vamp

#endif  // VAMP_ENGINE_MODEL_SCRATCH_H_
