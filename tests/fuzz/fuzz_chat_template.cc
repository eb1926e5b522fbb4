// libFuzzer target: the chat-template engine. Whatever the template source, Compile returns a
// template or an error; a template that compiles renders a fixed conversation (system, user,
// assistant with reasoning and a tool call, tool result, tools) to text or an error, bounded in
// time and output, never crashing.
#include <cstddef>
#include <cstdint>

#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json* vars =
      new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris? 你好 🎉"},
      {"role": "assistant", "content": "", "reasoning_content": "call it",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true, "enable_thinking": false,
    "bos_token": "", "eos_token": "<|im_end|>"})"));
  const absl::string_view source(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<vamp::ChatTemplate>> t =
      vamp::ChatTemplate::Compile(source, "fuzz");
  if (!t.ok()) return 0;
  (void)(*t)->Render(*vars);
  return 0;
}
