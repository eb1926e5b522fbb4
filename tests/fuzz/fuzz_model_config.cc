// libFuzzer target: config.json parsing must turn any input into a config or an error naming
// the problem, never crash (AddressSanitizer) or throw.
#include <cstddef>
#include <cstdint>

#include "engine/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = vamp::ParseModelConfig(absl::string_view(reinterpret_cast<const char*>(data), size),
                                       "fuzz/config.json");
  if (config.ok()) {
    // Derived quantities of an accepted config must be computable without overflow traps.
    const vamp::ModelShape shape = config->ToModelShape(2);
    (void)shape;
    for (int l = 0; l < config->num_hidden_layers; ++l) (void)config->IsMoeLayer(l);
  }
  return 0;
}
