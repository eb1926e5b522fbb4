// libFuzzer target: OpenAI-compatible request bodies (/v1/completions, /v1/chat/completions).
// Whatever the bytes, the parsers return a request or an error; they never crash, hang or read
// out of bounds, and every error they return maps to a 4xx with a JSON body.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "controller/frontend/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const vamp::ServedModel model{"tiny", 128, 256};
  static const auto* tokenizer = vamp::ByteTokenizer::Create(256).value().release();
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    absl::StatusOr<vamp::OpenAiRequest> r =
        chat ? vamp::ParseChatCompletionRequest(body, model, *tokenizer)
             : vamp::ParseCompletionRequest(body, model, *tokenizer);
    if (r.ok()) {
      const vamp::RequestLimits limits;
      if (r->prompts.empty() || r->prompts.size() != static_cast<size_t>(r->response.num_prompts) ||
          r->prompts.size() * r->response.n > static_cast<size_t>(limits.max_batch_prompts)) {
        std::abort();  // a batch outside the limits the parser enforces
      }
      for (const std::vector<int32_t>& prompt : r->prompts) {
        if (prompt.empty() || static_cast<int64_t>(prompt.size()) >= model.max_model_len) {
          std::abort();  // accepted a prompt the parser promised to reject
        }
      }
      if (r->response.n < 1 || r->response.n > vamp::RequestLimits{}.max_n ||
          r->response.stop.size() > static_cast<size_t>(vamp::kMaxStopStrings)) {
        std::abort();  // n or stop outside the limits the parser enforces
      }
      for (const std::string& stop : r->response.stop) {
        if (stop.empty()) std::abort();  // an empty stop string would end every output at once
      }
    } else {
      const int http = vamp::HttpStatusFor(r.status());
      if (http < 400 || http >= 500) std::abort();  // bad input must be a client error
      (void)vamp::ErrorBody(r.status());
    }
  }
  return 0;
}
