// What a frontend needs to serve one request: the engine and the model it serves. The controller
// replaces the whole context when its agents are re-initialised; a request keeps the context it
// started with (shared ownership) until it ends.
#ifndef VAMP_CONTROLLER_SERVING_SERVING_CONTEXT_H_
#define VAMP_CONTROLLER_SERVING_SERVING_CONTEXT_H_

#include <functional>
#include <memory>

#include "controller/frontend/openai_api.h"
#include "tokenizer/tokenizer.h"
#include "controller/serving/serving_engine.h"

namespace vamp {

struct ServingContext {
  std::shared_ptr<ServingEngine> engine;
  ServedModel model;
  std::shared_ptr<const Tokenizer> tokenizer;
};

// The current context, or null while the model is not being served (agents missing or failed).
using ServingContextProvider = std::function<std::shared_ptr<const ServingContext>()>;

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVING_SERVING_CONTEXT_H_
