#include "controller/http_frontend.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/secret.h"
#include "controller/event_queue.h"
#include "controller/openai_response.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "prometheus/text_serializer.h"

namespace vamp {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void SendError(httplib::Response& res, const absl::Status& status) {
  res.status = HttpStatusFor(status);
  res.set_content(ErrorBody(status), "application/json");
}

class Handler {
 public:
  Handler(HttpFrontendOptions options, ServingContextProvider context)
      : options_(std::move(options)), context_(std::move(context)) {}

  std::string LastError() const { return options_.last_error ? options_.last_error() : ""; }

  bool Authorized(const httplib::Request& req, httplib::Response& res) const {
    if (options_.api_keys.empty()) return true;
    if (BearerMatchesAny(req.get_header_value("Authorization"), options_.api_keys)) return true;
    SendError(res, absl::UnauthenticatedError("a valid API key is required "
                                              "(Authorization: Bearer <key>)"));
    return false;
  }

  void Models(httplib::Response& res) const {
    std::shared_ptr<const ServingContext> ctx = context_();
    Json data = Json::array();
    if (ctx != nullptr) {
      data.push_back({{"id", ctx->model.id},
                      {"object", "model"},
                      {"owned_by", "vamp"},
                      {"max_model_len", ctx->model.max_model_len}});
    }
    res.set_content(Dump({{"object", "list"}, {"data", data}}), "application/json");
  }

  void Health(httplib::Response& res) const {
    std::shared_ptr<const ServingContext> ctx = context_();
    const bool serving = ctx != nullptr && ctx->engine->healthy() && !ctx->engine->draining();
    res.status = serving ? 200 : 503;
    Json body = {{"status", serving ? "serving" : "not serving"}};
    if (!serving && !LastError().empty()) body["error"] = LastError();
    res.set_content(Dump(body), "application/json");
  }

  void Generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    std::shared_ptr<const ServingContext> ctx = context_();
    if (ctx == nullptr) {
      const std::string error = LastError();
      SendError(res, absl::UnavailableError(absl::StrCat(
                         "the model is not being served yet (agents are starting or failed); "
                         "retry later",
                         error.empty() ? "" : absl::StrCat(". Last error: ", error))));
      return;
    }
    absl::StatusOr<ServingRequest> parsed =
        chat ? ParseChatCompletionRequest(req.body, ctx->model, *ctx->tokenizer)
             : ParseCompletionRequest(req.body, ctx->model, *ctx->tokenizer);
    if (!parsed.ok()) {
      SendError(res, parsed.status());
      return;
    }
    const bool stream = parsed->stream;
    const bool include_usage = parsed->include_usage;
    auto queue = std::make_shared<EventQueue>();
    absl::StatusOr<RequestId> id = ctx->engine->Submit(
        *std::move(parsed), [queue](const EngineEvent& e) { queue->Push(e); });
    if (!id.ok()) {
      SendError(res, id.status());
      return;
    }
    auto writer = std::make_shared<OpenAiResponseWriter>(ctx, chat, include_usage, *id,
                                                         UnixSeconds());
    if (!stream) {
      Unary(res, ctx, queue, *id, *writer);
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [ctx, queue, writer, id = *id](size_t, httplib::DataSink& sink) {
          std::optional<EngineEvent> e = queue->Pop(absl::Seconds(1));
          if (!e.has_value()) {
            // Keep-alive comment: also how a vanished client is noticed.
            if (!sink.write(": ping\n\n", 8)) {
              ctx->engine->Abort(id);
              return false;
            }
            return true;
          }
          const std::string out = writer->StreamChunk(*e);
          if (!sink.write(out.data(), out.size())) {
            ctx->engine->Abort(id);
            return false;
          }
          if (e->finished) sink.done();
          return true;
        });
  }

 private:
  void Unary(httplib::Response& res, const std::shared_ptr<const ServingContext>& ctx,
             const std::shared_ptr<EventQueue>& queue, RequestId id,
             OpenAiResponseWriter& writer) {
    const auto deadline = absl::Now() + absl::Seconds(options_.request_timeout_s);
    while (true) {
      std::optional<EngineEvent> e = queue->Pop(absl::Seconds(1));
      if (!e.has_value()) {
        if (absl::Now() > deadline) {
          ctx->engine->Abort(id);
          SendError(res, absl::DeadlineExceededError(absl::StrCat(
                             "the request did not finish within ", options_.request_timeout_s,
                             " s")));
          return;
        }
        continue;
      }
      writer.Append(*e);
      if (!e->finished) continue;
      absl::StatusOr<std::string> body = writer.Finish(*e);
      if (!body.ok()) {
        SendError(res, body.status());
        return;
      }
      res.set_content(*body, "application/json");
      return;
    }
  }

  const HttpFrontendOptions options_;
  const ServingContextProvider context_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(HttpFrontendOptions options,
                                                                 ServingContextProvider context) {
  std::vector<std::string> parts = absl::StrSplit(options.address, absl::MaxSplits(':', 1));
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("http_address '", options.address, "' is not host:port"));
  }
  std::unique_ptr<HttpFrontend> frontend(new HttpFrontend());
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file: give both or neither");
  }
  if (!options.tls_cert_file.empty()) {
    auto tls = std::make_unique<httplib::SSLServer>(options.tls_cert_file.c_str(),
                                                    options.tls_key_file.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tls_cert_file/tls_key_file: cannot load a certificate and key from '",
          options.tls_cert_file, "' and '", options.tls_key_file, "'"));
    }
    frontend->server_ = std::move(tls);
  } else {
    frontend->server_ = std::make_unique<httplib::Server>();
  }
  auto handler = std::make_shared<Handler>(options, std::move(context));
  httplib::Server& s = *frontend->server_;
  s.Post("/v1/completions", [handler](const httplib::Request& req, httplib::Response& res) {
    if (handler->Authorized(req, res)) handler->Generate(req, res, /*chat=*/false);
  });
  s.Post("/v1/chat/completions", [handler](const httplib::Request& req, httplib::Response& res) {
    if (handler->Authorized(req, res)) handler->Generate(req, res, /*chat=*/true);
  });
  s.Get("/v1/models", [handler](const httplib::Request& req, httplib::Response& res) {
    if (handler->Authorized(req, res)) handler->Models(res);
  });
  s.Get("/health", [handler](const httplib::Request&, httplib::Response& res) {
    handler->Health(res);
  });
  s.Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    prometheus::TextSerializer serializer;
    res.set_content(serializer.Serialize(MetricsRegistry()->Collect()),
                    "text/plain; version=0.0.4");
  });
  if (options.metrics_targets) {
    // port_ is set before the server thread starts, so handlers may read it.
    s.Get("/metrics/targets", [targets = options.metrics_targets, f = frontend.get()](
                                  const httplib::Request&, httplib::Response& res) {
      res.set_content(targets(f->port_), "application/json");
    });
  }
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404 && res.body.empty()) {
      SendError(res, absl::NotFoundError(absl::StrCat("no route for ", req.method, " ",
                                                      req.path)));
    }
  });
  if (port == 0) {
    port = s.bind_to_any_port(parts[0]);
  } else if (!s.bind_to_port(parts[0], port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on '", options.address, "' (in use or malformed?)"));
  }
  frontend->port_ = port;
  frontend->thread_ = std::thread([f = frontend.get()] { f->server_->listen_after_bind(); });
  return frontend;
}

HttpFrontend::~HttpFrontend() { Stop(); }

void HttpFrontend::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace vamp
