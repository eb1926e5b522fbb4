// StreamTransport over gRPC: Serving.Generate on the callback API. gRPC runs each stream's
// reactor on its own threads; what a reactor learns goes through an inbox that the owning event
// loop drains (one wake-up per burst), so the client's events run on the loop thread as they do
// for HTTP. Arrival times are taken on the gRPC thread, when the message is read.
#include <event2/event.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/vamp_bench/stream_transport.h"
#include "vamp/v1/serving.grpc.pb.h"

namespace vamp::bench {
namespace {

class GrpcStreamTransport;

// One Generate call. The transport owns it and destroys it on the loop thread, once OnDone has
// reported (or, at CancelAll, once every stream's OnDone has).
class GenerateStream final : public grpc::ClientReadReactor<vamp::v1::GenerateResponse> {
 public:
  GenerateStream(GrpcStreamTransport* transport, uint64_t id) : transport_(transport), id_(id) {}
  grpc::ClientContext* context() { return &context_; }
  vamp::v1::GenerateRequest* request() { return &request_; }
  void Begin() {
    StartRead(&response_);
    StartCall();
  }
  // The idle timeout cancelled it (loop thread; read in OnDone after the cancellation).
  void MarkIdle() { idle_.store(true); }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  GrpcStreamTransport* const transport_;
  const uint64_t id_;
  grpc::ClientContext context_;
  vamp::v1::GenerateRequest request_;
  vamp::v1::GenerateResponse response_;
  bool finished_ = false;  // a response with finished = true arrived (gRPC thread only)
  std::string error_;      // what that response said went wrong
  std::atomic<bool> idle_{false};
};

class GrpcStreamTransport final : public StreamTransport {
 public:
  GrpcStreamTransport(event_base* base, const TransportOptions& options) : options_(options) {
    grpc::ChannelArguments args;
    // A connection of its own (not the process-wide subchannel another loop's channel would
    // share), so streams spread over loops as HTTP connections do.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channel_ =
        grpc::CreateCustomChannel(absl::StrCat(options.endpoint.host, ":", options.endpoint.port),
                                  grpc::InsecureChannelCredentials(), args);
    stub_ = vamp::v1::Serving::NewStub(channel_);
    wake_ = event_new(base, -1, 0, &GrpcStreamTransport::OnWake, this);
    idle_check_ = event_new(base, -1, EV_PERSIST, &GrpcStreamTransport::OnIdleCheck, this);
    const timeval second{1, 0};
    event_add(idle_check_, &second);
  }

  ~GrpcStreamTransport() override {
    CancelAll();
    event_free(idle_check_);
    event_free(wake_);
  }

  absl::Status Start(const std::vector<int32_t>& prompt, int32_t max_tokens,
                     StreamEvents events) override {
    const uint64_t id = next_id_++;
    auto stream = std::make_unique<GenerateStream>(this, id);
    vamp::v1::GenerateRequest* r = stream->request();
    r->set_model(options_.model);
    r->mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    r->mutable_stop()->set_max_tokens(max_tokens);
    r->mutable_stop()->set_ignore_eos(true);
    if (!options_.endpoint.api_key.empty()) {
      stream->context()->AddMetadata("authorization",
                                     absl::StrCat("Bearer ", options_.endpoint.api_key));
    }
    GenerateStream* raw = stream.get();
    open_[id] = Open{std::move(stream), std::move(events), SecondsSince(options_.start)};
    {
      absl::MutexLock lock(&mu_);
      ++running_;
    }
    stub_->async()->Generate(raw->context(), raw->request(), raw);
    raw->Begin();
    return absl::OkStatus();
  }

  void CancelAll() override {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    // Streams are destroyed only on this thread, so each is alive while it is cancelled.
    for (auto& [id, open] : open_) open.stream->context()->TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int64_t* running) { return *running == 0; }, &running_));
    inbox_.clear();
    open_.clear();
  }

  // ---- Called by the streams, on gRPC threads ----
  // `done`: the stream's last word (from OnDone); it touches nothing of the stream afterwards.
  void Post(uint64_t id, std::vector<int32_t> ids, double at_s, int32_t cached, bool done,
            std::string error) {
    absl::MutexLock lock(&mu_);
    if (done) --running_;
    if (closing_) return;
    const bool was_empty = inbox_.empty();
    inbox_.push_back(Message{id, std::move(ids), at_s, cached, done, std::move(error)});
    if (was_empty) event_active(wake_, EV_TIMEOUT, 0);
  }
  double now_s() const { return SecondsSince(options_.start); }

 private:
  struct Message {
    uint64_t id;
    std::vector<int32_t> ids;
    double at_s;
    int32_t cached;  // -1: not said
    bool done;
    std::string error;
  };
  // An open stream as the loop thread sees it.
  struct Open {
    std::unique_ptr<GenerateStream> stream;
    StreamEvents events;
    double last_heard_s = 0;  // for the idle timeout
  };

  static void OnWake(evutil_socket_t, short, void* arg) {
    static_cast<GrpcStreamTransport*>(arg)->Drain();
  }
  static void OnIdleCheck(evutil_socket_t, short, void* arg) {
    static_cast<GrpcStreamTransport*>(arg)->CancelIdle();
  }

  void Drain() {
    std::deque<Message> batch;
    {
      absl::MutexLock lock(&mu_);
      batch.swap(inbox_);
    }
    for (Message& m : batch) {
      auto it = open_.find(m.id);
      if (it == open_.end()) continue;
      Open& open = it->second;
      open.last_heard_s = m.at_s;
      if (!m.ids.empty()) open.events.on_tokens(m.ids, m.at_s);
      if (m.cached >= 0) open.events.on_cached(m.cached);
      if (m.done) {
        StreamEvents events = std::move(open.events);
        open_.erase(it);  // OnDone has reported: the stream is no longer gRPC's
        events.on_done(m.error);
      }
    }
  }

  // A stream the server has not answered for idle_timeout_s is cancelled; its OnDone reports it.
  void CancelIdle() {
    const double now = now_s();
    for (auto& [id, open] : open_) {
      if (now - open.last_heard_s < options_.idle_timeout_s) continue;
      open.stream->MarkIdle();
      open.stream->context()->TryCancel();
      open.last_heard_s = now;  // once per timeout
    }
  }

  const TransportOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<vamp::v1::Serving::Stub> stub_;
  event* wake_ = nullptr;
  event* idle_check_ = nullptr;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Open> open_;  // loop thread only

  absl::Mutex mu_;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;  // streams whose OnDone has not reported
  std::deque<Message> inbox_ ABSL_GUARDED_BY(mu_);
};

void GenerateStream::OnReadDone(bool ok) {
  if (!ok) return;  // the stream is over; OnDone follows
  const double at_s = transport_->now_s();
  std::vector<int32_t> ids(response_.token_ids().begin(), response_.token_ids().end());
  int32_t cached = -1;
  if (response_.finished()) {
    finished_ = true;
    if (response_.has_usage()) cached = response_.usage().cached_prompt_tokens();
    if (response_.finish_reason() == vamp::v1::FINISH_REASON_ERROR) {
      error_ = response_.error_message().empty() ? "the server failed the request"
                                                 : response_.error_message();
    } else if (response_.finish_reason() == vamp::v1::FINISH_REASON_ABORTED) {
      error_ = "the server aborted the request";
    }
  }
  if (!ids.empty() || cached >= 0) transport_->Post(id_, std::move(ids), at_s, cached, false, "");
  StartRead(&response_);
}

void GenerateStream::OnDone(const grpc::Status& status) {
  std::string error = error_;
  if (idle_.load()) {
    error = "the server sent nothing within the request timeout";
  } else if (!status.ok()) {
    error = absl::StrCat("gRPC ", status.error_code(), ": ", status.error_message());
  } else if (!finished_ && error.empty()) {
    error = "stream ended without a finished response";
  }
  // The last use of this stream: the loop thread may destroy it as soon as this is posted.
  GrpcStreamTransport* transport = transport_;
  const uint64_t id = id_;
  transport->Post(id, {}, transport->now_s(), -1, true, std::move(error));
}

}  // namespace

std::unique_ptr<StreamTransport> NewGrpcStreamTransport(event_base* base,
                                                        const TransportOptions& options) {
  return std::make_unique<GrpcStreamTransport>(base, options);
}

}  // namespace vamp::bench
