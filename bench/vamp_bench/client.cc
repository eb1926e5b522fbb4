#include "bench/vamp_bench/client.h"

#include <event2/event.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace vamp::bench {

namespace {

timeval After(double seconds) {
  seconds = std::max(0.0, seconds);
  timeval tv;
  tv.tv_sec = static_cast<time_t>(std::floor(seconds));
  tv.tv_usec = static_cast<suseconds_t>((seconds - std::floor(seconds)) * 1e6);
  return tv;
}

// The sessions of one event loop, run on one thread. Every member is touched only there.
class Shard {
 public:
  Shard(const workload::Workload& w, std::vector<int32_t> sessions, const ClientOptions& o,
        BenchClock::time_point start, ClientProgress* progress)
      : workload_(w), options_(o), start_(start), progress_(progress) {
    for (int32_t s : sessions) {
      auto state = std::make_unique<SessionState>();
      state->shard = this;
      state->index = s;
      pending_turns_ += static_cast<int64_t>(w.sessions[s].turns.size());
      sessions_.push_back(std::move(state));
    }
  }

  void Run() {
    std::unique_ptr<event_base, decltype(&event_base_free)> base(event_base_new(),
                                                                 &event_base_free);
    base_ = base.get();
    TransportOptions t;
    t.path = options_.path;
    t.model = options_.model;
    t.idle_timeout_s = options_.request_timeout_s;
    t.start = start_;
    if (options_.protocol == StreamProtocol::kGrpc) {
      t.endpoint = options_.grpc_endpoint;
      t.endpoint.api_key = options_.endpoint.api_key;
      transport_ = NewGrpcStreamTransport(base_, t);
    } else {
      t.endpoint = options_.endpoint;
      transport_ = NewHttpStreamTransport(base_, t);
    }
    for (auto& s : sessions_) {
      if (workload_.sessions[s->index].turns.empty()) continue;
      Schedule(s.get(), workload_.sessions[s->index].start_s +
                            workload_.sessions[s->index].turns[0].arrival_offset_s);
    }
    if (options_.max_duration_s > 0) {
      const timeval tv = After(options_.max_duration_s - SecondsSince(start_));
      event_base_once(base_, -1, EV_TIMEOUT, &Shard::OnCutOff, this, &tv);
    }
    if (pending_turns_ > 0) event_base_dispatch(base_);
    // Cut off: whatever is still in flight is unfinished.
    transport_->CancelAll();
    transport_.reset();
    base_ = nullptr;
  }

  std::vector<RequestRecord>& records() { return records_; }
  bool cut_off() const { return cut_off_; }

 private:
  struct SessionState {
    Shard* shard = nullptr;
    int32_t index = 0;
    size_t next_turn = 0;
    std::vector<int32_t> history;
  };
  struct Live {
    SessionState* session = nullptr;
    size_t record = 0;
    double last_token_s = -1;
    std::vector<int32_t> output_ids;
  };

  static void OnDue(evutil_socket_t, short, void* arg) {
    auto* s = static_cast<SessionState*>(arg);
    s->shard->Issue(s);
  }
  static void OnCutOff(evutil_socket_t, short, void* arg) {
    auto* shard = static_cast<Shard*>(arg);
    shard->cut_off_ = true;
    event_base_loopbreak(shard->base_);
  }

  void Schedule(SessionState* s, double at_s) {
    const timeval tv = After(at_s - SecondsSince(start_));
    event_base_once(base_, -1, EV_TIMEOUT, &Shard::OnDue, s, &tv);
  }

  void TurnEnded() {
    if (--pending_turns_ == 0) event_base_loopexit(base_, nullptr);
  }

  void Issue(SessionState* s) {
    if (cut_off_) return;
    const workload::Session& session = workload_.sessions[s->index];
    const size_t k = s->next_turn++;
    const workload::Turn& turn = session.turns[k];
    std::vector<int32_t> prompt;
    if (turn.extends_history) prompt = std::move(s->history);
    s->history.clear();
    prompt.insert(prompt.end(), turn.new_tokens.begin(), turn.new_tokens.end());
    const bool has_next = k + 1 < session.turns.size();
    if (has_next && session.turns[k + 1].extends_history) s->history = prompt;
    if (has_next && !session.turns[k + 1].after_previous) {
      Schedule(s, session.start_s + session.turns[k + 1].arrival_offset_s);
    }

    RequestRecord record;
    record.session = s->index;
    record.turn = static_cast<int32_t>(k);
    record.prompt_tokens = static_cast<int32_t>(prompt.size());
    record.issue_s = SecondsSince(start_);
    const size_t index = records_.size();
    records_.push_back(std::move(record));
    progress_->issued.fetch_add(1, std::memory_order_relaxed);

    auto live = std::make_shared<Live>();
    live->session = s;
    live->record = index;
    StreamEvents events;
    events.on_tokens = [this, live](const std::vector<int32_t>& ids, double at_s) {
      OnTokens(*live, ids, at_s);
    };
    events.on_cached = [this, live](int32_t cached) {
      records_[live->record].cached_tokens = cached;
    };
    events.on_done = [this, live](const std::string& error) { Finish(*live, error); };
    if (absl::Status started = transport_->Start(prompt, turn.output_tokens, std::move(events));
        !started.ok()) {
      Finish(*live, std::string(started.message()));
    }
  }

  void OnTokens(Live& live, const std::vector<int32_t>& ids, double at_s) {
    RequestRecord& r = records_[live.record];
    if (r.first_token_s < 0) {
      r.first_token_s = at_s;
    } else {
      r.inter_token_s.push_back(at_s - live.last_token_s);
    }
    live.last_token_s = at_s;
    r.output_tokens += static_cast<int32_t>(ids.size());
    progress_->output_tokens.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
    live.output_ids.insert(live.output_ids.end(), ids.begin(), ids.end());
  }

  void Finish(Live& live, const std::string& error) {
    const bool ok = error.empty();
    RequestRecord& r = records_[live.record];
    r.finish_s = SecondsSince(start_);
    r.ok = ok;
    r.error = error;
    (ok ? progress_->completed : progress_->failed).fetch_add(1, std::memory_order_relaxed);
    SessionState* s = live.session;
    const workload::Session& session = workload_.sessions[s->index];
    const size_t k = static_cast<size_t>(r.turn);
    if (k + 1 < session.turns.size()) {
      const workload::Turn& next = session.turns[k + 1];
      if (ok && next.extends_history) {
        s->history.insert(s->history.end(), live.output_ids.begin(), live.output_ids.end());
      }
      if (next.after_previous) {
        Schedule(s,
                 std::max(session.start_s + next.arrival_offset_s, r.finish_s + next.think_time_s));
      }
    }
    TurnEnded();
  }

  const workload::Workload& workload_;
  const ClientOptions& options_;
  const BenchClock::time_point start_;
  ClientProgress* const progress_;
  std::vector<std::unique_ptr<SessionState>> sessions_;
  std::vector<RequestRecord> records_;
  event_base* base_ = nullptr;
  std::unique_ptr<StreamTransport> transport_;
  int64_t pending_turns_ = 0;
  bool cut_off_ = false;
};

}  // namespace

absl::StatusOr<ClientRun> RunWorkload(const workload::Workload& workload,
                                      const ClientOptions& options, BenchClock::time_point start) {
  if (options.loops < 1) return absl::InvalidArgumentError("loops must be >= 1");
  if (options.request_timeout_s <= 0) {
    return absl::InvalidArgumentError("request_timeout_s must be > 0");
  }
  InitLibevent();
  const int32_t loops = std::min<int32_t>(
      options.loops, std::max<int32_t>(1, static_cast<int32_t>(workload.sessions.size())));
  std::vector<std::vector<int32_t>> deal(loops);
  for (size_t i = 0; i < workload.sessions.size(); ++i) {
    deal[i % loops].push_back(static_cast<int32_t>(i));
  }
  ClientProgress progress;
  progress.turns_total = workload.NumTurns();
  std::vector<std::unique_ptr<Shard>> shards;
  for (int32_t i = 0; i < loops; ++i) {
    shards.push_back(std::make_unique<Shard>(workload, deal[i], options, start, &progress));
  }

  absl::Mutex mu;
  bool done = false;
  std::thread progress_thread;
  if (options.progress) {
    progress_thread = std::thread([&] {
      int64_t last_tokens = 0;
      absl::MutexLock lock(&mu);
      while (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(1))) {
        const int64_t tokens = progress.output_tokens.load();
        const int64_t issued = progress.issued.load();
        const int64_t completed = progress.completed.load();
        const int64_t failed = progress.failed.load();
        std::string line =
            absl::StrFormat("[%6.1fs] turns %d/%d done, %d in flight, %d failed, %d tok/s",
                            SecondsSince(start), completed, progress.turns_total.load(),
                            issued - completed - failed, failed, tokens - last_tokens);
        last_tokens = tokens;
        if (options.progress_extra) absl::StrAppend(&line, " | ", options.progress_extra());
        std::fprintf(stderr, "%s\n", line.c_str());
      }
    });
  }
  std::vector<std::thread> threads;
  for (auto& shard : shards) threads.emplace_back([s = shard.get()] { s->Run(); });
  for (std::thread& t : threads) t.join();
  {
    absl::MutexLock lock(&mu);
    done = true;
  }
  if (progress_thread.joinable()) progress_thread.join();

  ClientRun run;
  run.duration_s = SecondsSince(start);
  for (auto& shard : shards) {
    run.cut_off = run.cut_off || shard->cut_off();
    for (RequestRecord& r : shard->records()) run.records.push_back(std::move(r));
  }
  std::sort(run.records.begin(), run.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.issue_s < b.issue_s; });
  for (const workload::Session& s : workload.sessions) {
    run.turns_per_session.push_back(static_cast<int32_t>(s.turns.size()));
  }
  return run;
}

}  // namespace vamp::bench
