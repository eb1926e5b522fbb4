#include "controller/server/serving_service.h"

#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_auth.h"
#include "common/grpc_server.h"

namespace vamp {
namespace {

constexpr char kApiKeyRequired[] =
    "a valid API key is required (metadata 'authorization: Bearer <key>')";

vamp::v1::FinishReason ToProto(FinishReason r, bool error) {
  if (error) return vamp::v1::FINISH_REASON_ERROR;
  switch (r) {
    case FinishReason::kStop:
      return vamp::v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return vamp::v1::FINISH_REASON_LENGTH;
    case FinishReason::kAbort:
      return vamp::v1::FINISH_REASON_ABORTED;
    case FinishReason::kNone:
      break;
  }
  return vamp::v1::FINISH_REASON_UNSPECIFIED;
}

// One Generate call. The engine's sink and the reactor share it; it outlives whichever ends
// first, and the reactor pointer is cleared once gRPC is done with the call.
class GenerateCall : public grpc::ServerWriteReactor<vamp::v1::GenerateResponse> {
 public:
  struct Shared {
    absl::Mutex mu;
    GenerateCall* call ABSL_GUARDED_BY(mu) = nullptr;
  };

  GenerateCall(std::shared_ptr<const ServingContext> ctx, std::string request_id)
      : ctx_(std::move(ctx)), request_id_(std::move(request_id)),
        shared_(std::make_shared<Shared>()) {
    absl::MutexLock lock(&shared_->mu);
    shared_->call = this;
  }

  void Begin(ServingRequest request) {
    std::shared_ptr<Shared> shared = shared_;
    absl::StatusOr<RequestId> id = ctx_->engine->Submit(
        std::move(request), [shared](const EngineEvent& e) {
          absl::MutexLock lock(&shared->mu);
          if (shared->call != nullptr) shared->call->OnEvent(e);
        });
    if (!id.ok()) {
      Finish(ToGrpcStatus(id.status()));
      return;
    }
    absl::MutexLock lock(&mu_);
    engine_id_ = *id;
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    writing_ = false;
    if (!ok) {
      if (!finished_ && engine_id_ != 0) ctx_->engine->Abort(engine_id_);
      if (!done_called_) {
        done_called_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading"));
      }
      return;
    }
    WriteNextLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (!finished_ && engine_id_ != 0) ctx_->engine->Abort(engine_id_);
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->call = nullptr;
    }
    delete this;
  }

 private:
  // Called with shared_->mu held (engine thread).
  void OnEvent(const EngineEvent& e) {
    vamp::v1::GenerateResponse r;
    r.set_request_id(request_id_);
    r.mutable_token_ids()->Add(e.token_ids.begin(), e.token_ids.end());
    r.set_time_since_arrival_us(e.micros_since_arrival);
    if (e.finished) {
      r.set_finished(true);
      r.set_finish_reason(ToProto(e.finish_reason, !e.error.empty()));
      r.set_error_message(e.error);
      r.mutable_usage()->set_prompt_tokens(e.prompt_tokens);
      r.mutable_usage()->set_completion_tokens(e.completion_tokens);
      r.mutable_usage()->set_cached_prompt_tokens(e.cached_prompt_tokens);
    }
    absl::MutexLock lock(&mu_);
    if (e.finished) finished_ = true;
    queue_.push_back(std::move(r));
    WriteNextLocked();
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || done_called_) return;
    if (!queue_.empty()) {
      writing_ = true;
      StartWrite(&queue_.front());
    } else if (finished_) {
      done_called_ = true;
      Finish(grpc::Status::OK);
    }
  }

  const std::shared_ptr<const ServingContext> ctx_;
  const std::string request_id_;
  std::shared_ptr<Shared> shared_;
  absl::Mutex mu_;
  RequestId engine_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<vamp::v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_called_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status FieldError(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

}  // namespace

absl::StatusOr<ServingRequest> FromGenerateRequest(const vamp::v1::GenerateRequest& request,
                                                   const ServedModel& model) {
  if (!request.model().empty() && request.model() != model.id) {
    return absl::NotFoundError(absl::StrCat("model: '", request.model(),
                                            "' is not served here (available: '", model.id, "')"));
  }
  ServingRequest out;
  if (request.prompt_token_ids().empty()) return FieldError("prompt_token_ids", "must not be empty");
  for (int i = 0; i < request.prompt_token_ids_size(); ++i) {
    const int32_t t = request.prompt_token_ids(i);
    if (t < 0 || t >= model.vocab_size) {
      return FieldError("prompt_token_ids", absl::StrCat("token id ", t, " at index ", i,
                                                         " is outside the vocabulary [0, ",
                                                         model.vocab_size, ")"));
    }
    out.prompt_token_ids.push_back(t);
  }
  const int64_t prompt = request.prompt_token_ids_size();
  if (prompt >= model.max_model_len) {
    return FieldError("prompt_token_ids",
                      absl::StrCat("is ", prompt, " tokens; the model's context is ",
                                   model.max_model_len, " and one must be left for output"));
  }
  const auto& sp = request.sampling();
  if (sp.temperature() < 0) return FieldError("sampling.temperature", "must be >= 0");
  if (sp.top_p() < 0 || sp.top_p() > 1) return FieldError("sampling.top_p", "must be in [0, 1]");
  if (sp.top_k() < 0) return FieldError("sampling.top_k", "must be >= 0");
  out.sampling.temperature = sp.temperature();
  out.sampling.top_p = sp.top_p() == 0 ? 1.0f : sp.top_p();
  out.sampling.top_k = sp.top_k();
  out.sampling.min_p = sp.min_p();
  out.sampling.presence_penalty = sp.presence_penalty();
  out.sampling.frequency_penalty = sp.frequency_penalty();
  out.sampling.repetition_penalty = sp.repetition_penalty() == 0 ? 1.0f : sp.repetition_penalty();
  if (sp.has_seed()) out.sampling.seed = sp.seed();
  const auto& stop = request.stop();
  if (stop.max_tokens() < 0) return FieldError("stop.max_tokens", "must be >= 0 (0 = default)");
  if (stop.max_tokens() > 0) {
    if (prompt + stop.max_tokens() > model.max_model_len) {
      return FieldError("stop.max_tokens",
                        absl::StrCat(stop.max_tokens(), " output tokens do not fit after a ",
                                     prompt, "-token prompt in ", model.max_model_len));
    }
    out.sampling.max_tokens = stop.max_tokens();
  }
  out.sampling.stop_token_ids.assign(stop.stop_token_ids().begin(), stop.stop_token_ids().end());
  out.sampling.ignore_eos = stop.ignore_eos();
  out.sampling.min_tokens = stop.min_tokens();
  out.cache_salt = request.cache_salt();
  out.priority = request.priority();
  if (absl::Status s = out.sampling.Validate(); !s.ok()) return s;
  return out;
}

bool ServingService::Authorized(const grpc::CallbackServerContext* context) const {
  return api_keys_.empty() || CallPresentsBearerOfAny(*context, api_keys_);
}

grpc::ServerWriteReactor<vamp::v1::GenerateResponse>* ServingService::Generate(
    grpc::CallbackServerContext* context, const vamp::v1::GenerateRequest* request) {
  std::shared_ptr<const ServingContext> ctx = context_();
  auto* call = new GenerateCall(ctx, request->request_id());
  // Before anything else, so an unauthenticated caller learns nothing about the model's state.
  if (!Authorized(context)) {
    call->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kApiKeyRequired));
    return call;
  }
  if (ctx == nullptr) {
    call->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "the model is not being served yet; retry later"));
    return call;
  }
  absl::StatusOr<ServingRequest> parsed = FromGenerateRequest(*request, ctx->model);
  if (!parsed.ok()) {
    call->Finish(ToGrpcStatus(parsed.status()));
    return call;
  }
  call->Begin(*std::move(parsed));
  return call;
}

grpc::ServerUnaryReactor* ServingService::ListModels(grpc::CallbackServerContext* context,
                                                     const vamp::v1::ListModelsRequest*,
                                                     vamp::v1::ListModelsResponse* response) {
  if (!Authorized(context)) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, kApiKeyRequired));
    return reactor;
  }
  std::shared_ptr<const ServingContext> ctx = context_();
  if (ctx != nullptr) {
    vamp::v1::ModelInfo* m = response->add_models();
    m->set_id(ctx->model.id);
    m->set_architecture("qwen3_moe");
    m->set_max_model_len(ctx->model.max_model_len);
    m->set_vocab_size(ctx->model.vocab_size);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace vamp
