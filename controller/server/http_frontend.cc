#include "controller/server/http_frontend.h"

#include <atomic>
#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/secret.h"
#include "controller/frontend/openai_api.h"
#include "controller/server/openai_response.h"
#include "nlohmann/json.hpp"
#include "prometheus/text_serializer.h"

namespace vamp {
namespace {

using Json = nlohmann::json;
constexpr char kJson[] = "application/json";

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void SendError(HttpExchange& exchange, const absl::Status& status) {
  exchange.Respond(HttpStatusFor(status), kJson, ErrorBody(status));
}

// The engine's events for one request's choices on their way to its connection's loop. The
// engine thread pushes (never blocks); the loop drains. One Post per burst: `posted` stays true
// until drained.
class PendingEvents {
 public:
  struct Item {
    int index;  // the choice
    EngineEvent event;
  };
  // True when the caller must schedule a drain.
  bool Push(int index, const EngineEvent& event) {
    absl::MutexLock lock(&mu_);
    events_.push_back({index, event});
    const bool schedule = !posted_;
    posted_ = true;
    return schedule;
  }
  std::deque<Item> Take() {
    absl::MutexLock lock(&mu_);
    posted_ = false;
    return std::exchange(events_, {});
  }

 private:
  absl::Mutex mu_;
  std::deque<Item> events_ ABSL_GUARDED_BY(mu_);
  bool posted_ ABSL_GUARDED_BY(mu_) = false;
};

class Handler {
 public:
  Handler(HttpFrontendOptions options, ServingContextProvider context)
      : options_(std::move(options)), context_(std::move(context)) {}

  void set_port(int port) { port_.store(port); }

  // Loop thread.
  void Handle(const std::shared_ptr<HttpExchange>& exchange) {
    const HttpRequest& req = exchange->request();
    const bool get = req.method == "GET";
    const bool post = req.method == "POST";
    if (req.path == "/health" && get) return Health(*exchange);
    if (req.path == "/metrics" && get) {
      prometheus::TextSerializer serializer;
      return exchange->Respond(200, "text/plain; version=0.0.4",
                               serializer.Serialize(MetricsRegistry()->Collect()));
    }
    if (req.path == "/metrics/targets" && get && options_.metrics_targets) {
      return exchange->Respond(200, kJson, options_.metrics_targets(port_.load()));
    }
    const bool completions = req.path == "/v1/completions";
    const bool chat = req.path == "/v1/chat/completions";
    const bool models = req.path == "/v1/models";
    const bool one_model = absl::StartsWith(req.path, "/v1/models/");
    if ((completions || chat) && !post) return MethodNotAllowed(*exchange, "POST");
    if ((models || one_model) && !get) return MethodNotAllowed(*exchange, "GET");
    if (!completions && !chat && !models && !one_model) {
      return SendError(*exchange, absl::NotFoundError(
                                      absl::StrCat("no route for ", req.method, " ", req.path)));
    }
    if (!options_.api_keys.empty() &&
        !BearerMatchesAny(std::string(req.Header("authorization")), options_.api_keys)) {
      return SendError(*exchange, absl::UnauthenticatedError(
                                      "a valid API key is required (Authorization: Bearer <key>)"));
    }
    if (models) return Models(*exchange);
    if (one_model) return Model(*exchange, req.path.substr(sizeof("/v1/models/") - 1));
    Generate(exchange, chat);
  }

 private:
  std::string LastError() const { return options_.last_error ? options_.last_error() : ""; }

  void MethodNotAllowed(HttpExchange& exchange, const char* allowed) {
    const absl::Status status = absl::InvalidArgumentError(
        absl::StrCat(exchange.request().method, " is not allowed on ", exchange.request().path,
                     " (use ", allowed, ")"));
    exchange.Respond(405, kJson, ErrorBody(status), {{"Allow", allowed}});
  }

  static Json ModelObject(const ServedModel& model) {
    return {{"id", model.id},
            {"object", "model"},
            {"created", 0},
            {"owned_by", "vamp"},
            {"max_model_len", model.max_model_len}};
  }

  void Models(HttpExchange& exchange) const {
    std::shared_ptr<const ServingContext> ctx = context_();
    Json data = Json::array();
    if (ctx != nullptr) data.push_back(ModelObject(ctx->model));
    exchange.Respond(200, kJson, Dump({{"object", "list"}, {"data", data}}));
  }

  // GET /v1/models/{id}: the served model, or 404 naming the id (OpenAI's models.retrieve).
  void Model(HttpExchange& exchange, const std::string& id) const {
    std::shared_ptr<const ServingContext> ctx = context_();
    if (ctx == nullptr || ctx->model.id != id) {
      absl::Status status = absl::NotFoundError(absl::StrCat(
          "model '", id, "' does not exist", ctx == nullptr ? " (no model is served yet)" : ""));
      status.SetPayload(kParamPayload, absl::Cord("model"));
      return SendError(exchange, status);
    }
    exchange.Respond(200, kJson, Dump(ModelObject(ctx->model)));
  }

  void Health(HttpExchange& exchange) const {
    std::shared_ptr<const ServingContext> ctx = context_();
    const bool serving = ctx != nullptr && ctx->engine->healthy() && !ctx->engine->draining();
    Json body = {{"status", serving ? "serving" : "not serving"}};
    if (!serving && !LastError().empty()) body["error"] = LastError();
    exchange.Respond(serving ? 200 : 503, kJson, Dump(body));
  }

  // One request of num_prompts x n choices: an engine request each, choice i = prompt_index * n
  // + j running its prompt (the n choices of a prompt share its blocks through the prefix cache),
  // seeded seed + i when a seed is given. A choice that a stop string ended is finished in the
  // engine at once (its KV freed); a client that goes away or a unary request past its deadline
  // aborts them all.
  void Generate(const std::shared_ptr<HttpExchange>& exchange, bool chat) {
    std::shared_ptr<const ServingContext> ctx = context_();
    if (ctx == nullptr) {
      const std::string error = LastError();
      return SendError(*exchange, absl::UnavailableError(absl::StrCat(
                                      "the model is not being served yet (agents are starting or "
                                      "failed); retry later",
                                      error.empty() ? "" : absl::StrCat(". Last error: ", error))));
    }
    const std::string body = exchange->TakeBody();
    absl::StatusOr<OpenAiRequest> parsed =
        chat ? ParseChatCompletionRequest(body, ctx->model, *ctx->tokenizer, options_.limits)
             : ParseCompletionRequest(body, ctx->model, *ctx->tokenizer, options_.limits);
    if (!parsed.ok()) return SendError(*exchange, parsed.status());
    const bool stream = parsed->stream;
    const ResponseOptions response = parsed->response;
    const int choices = response.num_prompts * response.n;
    auto pending = std::make_shared<PendingEvents>();
    // Set after the Submits, on this loop thread; drains run on it too, later.
    auto writer = std::make_shared<std::optional<OpenAiResponseWriter>>();
    auto ids = std::make_shared<std::vector<RequestId>>();
    // The sinks run on the engine thread: queue the event, wake the connection's loop once.
    auto drain = [exchange, pending, writer, ids, stream, engine = ctx->engine]() {
      for (const PendingEvents::Item& item : pending->Take()) {
        // No writer: a later choice's Submit failed and the request was answered with its error.
        if (!exchange->open() || !writer->has_value()) return;
        OpenAiResponseWriter& w = **writer;
        // Late events of a choice that a stop string ended (sent before its abort was seen).
        if (w.choice_done(item.index)) continue;
        if (stream) {
          exchange->Write(w.StreamChunk(item.index, item.event));
        } else {
          w.Append(item.index, item.event);
        }
        // A stop string ended the choice before the engine did: finish it there too.
        if (w.choice_done(item.index) && !item.event.finished) {
          engine->Abort((*ids)[item.index], FinishReason::kStop);
        }
        if (!w.done()) continue;
        if (stream) {
          exchange->End();
          continue;
        }
        absl::StatusOr<std::string> out = w.Finish();
        if (out.ok()) {
          exchange->Respond(200, kJson, *out);
        } else {
          SendError(*exchange, out.status());
        }
      }
    };
    const std::optional<uint64_t> seed = parsed->sampling.seed;
    for (int i = 0; i < choices; ++i) {
      ServingRequest choice{parsed->prompts[i / response.n], parsed->sampling, parsed->cache_salt,
                            parsed->priority};
      if (seed.has_value()) choice.sampling.seed = *seed + static_cast<uint64_t>(i);
      choice.prompt_logprobs = !response.echo_token_ids.empty();
      absl::StatusOr<RequestId> id = ctx->engine->Submit(
          std::move(choice), [exchange, pending, drain, i](const EngineEvent& e) {
            if (pending->Push(i, e)) exchange->Post(drain);
          });
      if (!id.ok()) {
        for (RequestId submitted : *ids) ctx->engine->Abort(submitted);
        return SendError(*exchange, id.status());
      }
      ids->push_back(*id);
    }
    writer->emplace(ctx, response, ids->front(), UnixSeconds());
    // A client that goes away (either kind of request) or a unary request past its deadline
    // frees its sequences in the scheduler (choices already finished are no longer there).
    auto abort_all = [engine = ctx->engine, ids] {
      for (RequestId id : *ids) engine->Abort(id);
    };
    exchange->SetOnClose(abort_all);
    if (stream) {
      exchange->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      return;
    }
    exchange->SetTimer(options_.request_timeout_s,
                       [ex = exchange.get(), abort_all, limit = options_.request_timeout_s] {
                         abort_all();
                         SendError(*ex, absl::DeadlineExceededError(absl::StrCat(
                                            "the request did not finish within ", limit, " s")));
                       });
  }

  const HttpFrontendOptions options_;
  const ServingContextProvider context_;
  std::atomic<int> port_{0};  // set once the server has bound
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(HttpFrontendOptions options,
                                                                 ServingContextProvider context) {
  auto handler = std::make_shared<Handler>(options, std::move(context));
  std::unique_ptr<HttpFrontend> frontend(new HttpFrontend());
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      options.server,
      [handler](std::shared_ptr<HttpExchange> exchange) { handler->Handle(exchange); });
  if (!server.ok()) return server.status();
  frontend->server_ = *std::move(server);
  handler->set_port(frontend->server_->port());
  return frontend;
}

HttpFrontend::~HttpFrontend() { Stop(); }

void HttpFrontend::Stop() {
  if (server_ != nullptr) server_->Stop();
}

}  // namespace vamp
