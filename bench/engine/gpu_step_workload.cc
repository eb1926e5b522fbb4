#include "bench/engine/gpu_step_workload.h"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/engine/gpu_step_bandwidth.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_buffers.h"
#include "engine/memory/cuda_status.h"

namespace vamp::gpu_step_bench {

absl::Status Workload::Fill() {
  const int64_t bs = f_.block_size;
  const int64_t vocab = e_->rank->config.vocab_size;
  // A decoding sequence grows by warmup + steps tokens per point from context + 1 known tokens.
  const int64_t blocks_per_seq = (f_.context + 1 + f_.warmup + f_.steps + bs - 1) / bs;
  const int64_t prefill_blocks = (f_.prefill_tokens + bs - 1) / bs;
  const int64_t snapshot_blocks = e_->rank->runner->snapshot_blocks();
  const int64_t needed = f_.batch * (blocks_per_seq + snapshot_blocks) + prefill_blocks;
  const int64_t have = e_->rank->runner->kv_cache().num_blocks;
  if (needed > have) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the workload needs ", needed, " KV blocks (", f_.batch, " sequences x ", blocks_per_seq,
        " + ", snapshot_blocks, " for its recurrent-state snapshot, + ", prefill_blocks,
        " for the mixed steps' prompt); the pool has ", have,
        ": lower --batch or --context, or raise --gpu_memory_utilization"));
  }
  const int64_t max_len = e_->rank->runner->config().max_model_len;
  if (f_.context + 1 + f_.warmup + f_.steps > max_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("--context ", f_.context, " + ", f_.warmup + f_.steps + 1,
                     " decoded tokens exceed max_model_len ", max_len));
  }
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  int32_t next_block = 0;
  prompts_.resize(f_.batch);
  blocks_.resize(f_.batch);
  snapshots_.assign(f_.batch, {});
  for (int64_t i = 0; i < f_.batch; ++i) {
    prompts_[i].resize(f_.context + 1);
    for (int32_t& t : prompts_[i]) t = token(rng_);
    for (int64_t k = 0; k < blocks_per_seq; ++k) blocks_[i].push_back(next_block++);
    if (snapshot_blocks > 0) {
      snapshots_[i].num_tokens = static_cast<int32_t>(f_.context);
      for (int64_t k = 0; k < snapshot_blocks; ++k) snapshots_[i].block_ids.push_back(next_block++);
    }
  }
  prefill_prompt_.resize(f_.prefill_tokens);
  for (int32_t& t : prefill_prompt_) t = token(rng_);
  for (int64_t k = 0; k < prefill_blocks; ++k) prefill_block_ids_.push_back(next_block++);

  // Prefill the first `context` tokens of every prompt (each sequence samples one token when
  // its prompt is done; the points below re-admit it with its own last prompt token instead).
  const auto start = std::chrono::steady_clock::now();
  std::vector<int64_t> done(f_.batch, 0);
  std::vector<RunnerRequestId> ids(f_.batch, 0);
  int64_t steps = 0, finished = 0;
  while (finished < f_.batch) {
    StepInput in;
    int64_t budget = f_.max_num_batched_tokens;
    for (int64_t i = 0; i < f_.batch && budget > 0; ++i) {
      if (done[i] == f_.context) continue;
      const int64_t n = std::min(f_.context - done[i], budget);
      if (ids[i] == 0) {
        ids[i] = next_id_++;
        NewRequestData nr;
        nr.id = ids[i];
        nr.prompt_token_ids.assign(prompts_[i].begin(), prompts_[i].begin() + f_.context);
        nr.block_ids = blocks_[i];
        nr.sampling.temperature = 0;
        in.new_requests.push_back(std::move(nr));
        live_.push_back(ids[i]);
      } else {
        in.cached_requests.push_back({ids[i], {}, static_cast<int32_t>(done[i]), false});
      }
      ScheduledRequest scheduled;
      scheduled.id = ids[i];
      scheduled.num_tokens = static_cast<int32_t>(n);
      if (done[i] + n == f_.context) scheduled.capture_state = snapshots_[i];
      in.scheduled.push_back(std::move(scheduled));
      budget -= n;
    }
    absl::StatusOr<StepOutput> out = e_->rank->runner->ExecuteStep(in);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat("prefill step ", steps, ": ", out.status().message()));
    }
    for (const ScheduledRequest& s : in.scheduled) {
      const int64_t i = static_cast<int64_t>(std::find(ids.begin(), ids.end(), s.id) - ids.begin());
      done[i] += s.num_tokens;
      if (done[i] == f_.context) ++finished;
    }
    ++steps;
  }
  VAMP_LOG(INFO) << absl::StrFormat(
      "prefilled %d sequences x %d tokens in %d steps, %.1f s (%.0f tokens/s)", f_.batch,
      f_.context, steps, Seconds(start),
      static_cast<double>(f_.batch * f_.context) / Seconds(start));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StepSample>> Workload::Run(bool mixed) {
  std::vector<RunnerRequestId> ids(f_.batch);
  for (RunnerRequestId& id : ids) id = next_id_++;
  std::vector<StepSample> samples;
  const int64_t total = f_.warmup + f_.steps;
  for (int64_t s = 0; s < total; ++s) {
    StepInput in;
    if (s == 0) {
      // Re-admit the batch as prefix-cache hits at exactly `context` tokens.
      in.finished_ids = std::move(live_);
      live_.clear();
      for (int64_t i = 0; i < f_.batch; ++i) {
        NewRequestData nr;
        nr.id = ids[i];
        nr.prompt_token_ids = prompts_[i];
        nr.block_ids = blocks_[i];
        nr.num_computed_tokens = static_cast<int32_t>(f_.context);
        nr.restore_state = snapshots_[i];
        nr.sampling.temperature = 0;
        in.new_requests.push_back(std::move(nr));
        live_.push_back(ids[i]);
      }
    } else {
      for (RunnerRequestId id : ids) {
        in.cached_requests.push_back({id, {}, static_cast<int32_t>(f_.context + s), false});
      }
    }
    for (RunnerRequestId id : ids) in.scheduled.push_back({id, 1});
    if (mixed) {
      // The previous step's prompt is done; a new one arrives.
      if (prefill_id_ != 0) in.finished_ids.push_back(prefill_id_);
      prefill_id_ = next_id_++;
      NewRequestData nr;
      nr.id = prefill_id_;
      nr.prompt_token_ids = prefill_prompt_;
      nr.block_ids = prefill_block_ids_;
      nr.sampling.temperature = 0;
      in.new_requests.push_back(std::move(nr));
      in.scheduled.push_back({prefill_id_, static_cast<int32_t>(f_.prefill_tokens)});
    }
    if (f_.cuda_profiler && s == f_.warmup) {
      VAMP_CUDART_RETURN_IF_ERROR(cudaProfilerStart());
    }
    const CudaStagingStats before = e_->experts->stats();
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<StepOutput> out = e_->rank->runner->ExecuteStep(in);
    const double step_ms = Seconds(start) * 1e3;
    if (!out.ok()) {
      return absl::Status(out.status().code(), absl::StrCat(mixed ? "mixed" : "decode", " step ", s,
                                                            ": ", out.status().message()));
    }
    const int64_t want_tokens = f_.batch + (mixed ? f_.prefill_tokens : 0);
    const size_t want_sampled = static_cast<size_t>(f_.batch + (mixed ? 1 : 0));
    if (out->num_tokens != want_tokens || out->sampled.size() != want_sampled) {
      return absl::InternalError(absl::StrCat(mixed ? "mixed" : "decode", " step ", s, " computed ",
                                              out->num_tokens, " tokens and sampled ",
                                              out->sampled.size(), "; expected ", want_tokens,
                                              " and ", want_sampled));
    }
    if (s < f_.warmup) continue;
    const CudaStagingStats& after = e_->experts->stats();
    StepSample sample;
    sample.step_ms = step_ms;
    sample.forward_ms = out->forward_us / 1e3;
    sample.sample_ms = out->sample_us / 1e3;
    sample.staged_bytes = after.bytes - before.bytes;
    sample.staged_copies =
        after.copies - before.copies + after.routed_layers - before.routed_layers;
    sample.exposed_ms = (after.exposed_us - before.exposed_us) / 1e3;
    samples.push_back(sample);
  }
  if (f_.cuda_profiler) VAMP_CUDART_RETURN_IF_ERROR(cudaProfilerStop());
  if (mixed) {
    // Leave the last prompt for the next point's first step to finish.
    live_.push_back(prefill_id_);
    prefill_id_ = 0;
  }
  return samples;
}

absl::StatusOr<std::vector<PointResult>> MeasurePoints(const Flags& f, GpuEngine& e,
                                                       Workload& workload) {
  const ExpertGeometry& g = e.rank->plan.experts;
  // The largest per-layer copy, for the replay.
  DeviceBuffer scratch;
  if (g.max_groups > 0) {
    VAMP_ASSIGN_OR_RETURN(
        scratch, DeviceBuffer::Allocate(static_cast<uint64_t>(g.max_groups) * g.group_bytes));
  }
  VAMP_ASSIGN_OR_RETURN(CudaStream replay_stream, CudaStream::Create());

  std::vector<PointResult> points;
  for (double ratio : f.ratios) {
    const int64_t groups = GroupsFor(ratio, g);
    const int64_t more = groups - e.rank->memory.page_remapper->offloaded_groups();
    if (more < 0) return absl::InternalError("ratios must ascend");
    if (more > 0) {
      absl::StatusOr<RemapResult> r = e.rank->memory.page_remapper->Offload(more);
      if (!r.ok()) {
        return absl::Status(r.status().code(),
                            absl::StrCat("offloading ", more, " groups for VAMP-r ", ratio, ": ",
                                         r.status().message()));
      }
      VAMP_RETURN_IF_ERROR(e.rank->RefreshKv());
      VAMP_LOG(INFO) << absl::StrFormat(
          "VAMP-r %.2f: offloaded %d more groups in %.1f ms; boundary %d/%d, KV %d -> %d blocks",
          ratio, more, r->total_us / 1e3, r->boundary, g.num_experts, r->kv_blocks_before,
          r->kv_blocks_after);
    }
    const int64_t offloaded = g.num_experts - e.rank->memory.experts->boundary();
    double replay_ms = 0;
    if (offloaded > 0) {
      VAMP_ASSIGN_OR_RETURN(
          replay_ms, ReplayStagingCopies(*e.rank->memory.experts, scratch, replay_stream.get(), 3));
    }
    // Decode points run as CUDA graphs when nothing is staged; the resident point is measured
    // launch by launch as well, to show what the graphs save.
    // With --routed_staging, decode steps again copying only the routed experts (at the resident
    // point the same steps as "decode": nothing is staged; measured so each mode has its own
    // reference).
    struct Variant {
      bool mixed;
      bool graphs;
      bool routed = false;
    };
    std::vector<Variant> variants = {{false, true}, {true, true}};
    if (offloaded == 0) variants.insert(variants.begin(), Variant{false, false});
    if (f.routed_staging) variants.push_back(Variant{false, true, true});
    for (const Variant& v : variants) {
      const bool mixed = v.mixed;
      if (mixed && f.prefill_tokens == 0) continue;
      e.model->set_cuda_graphs(v.graphs);
      e.experts->set_routed_max_tokens(v.routed ? f.batch : 0);
      const CudaGraphStats graphs_before = e.model->graph_stats();
      absl::StatusOr<std::vector<StepSample>> samples = workload.Run(mixed);
      e.model->set_cuda_graphs(true);
      e.experts->set_routed_max_tokens(0);
      if (!samples.ok()) {
        return absl::Status(samples.status().code(),
                            absl::StrCat("VAMP-r ", ratio, ": ", samples.status().message()));
      }
      PointResult p;
      p.mode = mixed      ? "mixed"
               : v.routed ? "decode, routed staging"
               : v.graphs ? "decode"
                          : "decode, CUDA graphs off";
      p.graph_replays = e.model->graph_stats().replays - graphs_before.replays;
      p.ratio = ratio;
      p.groups = groups;
      p.offloaded_experts_per_layer = offloaded;
      p.staged_layers = static_cast<int64_t>(e.experts->staged_layers().size());
      p.offloaded_bytes_per_layer = static_cast<uint64_t>(offloaded) * g.expert_bytes;
      p.tokens_per_step = f.batch + (mixed ? f.prefill_tokens : 0);
      std::vector<double> step, fwd, smp;
      double bytes = 0, copies = 0, exposed = 0;
      for (const StepSample& s : *samples) {
        step.push_back(s.step_ms);
        fwd.push_back(s.forward_ms);
        smp.push_back(s.sample_ms);
        bytes += static_cast<double>(s.staged_bytes);
        copies += static_cast<double>(s.staged_copies);
        exposed += s.exposed_ms;
      }
      p.step_ms = Summarise(step);
      p.forward_ms = Summarise(fwd);
      p.sample_ms = Summarise(smp);
      p.staged_bytes_per_step = bytes / static_cast<double>(samples->size());
      p.copies_per_step = copies / static_cast<double>(samples->size());
      p.exposed_ms_per_step = exposed / static_cast<double>(samples->size());
      p.copies_alone_ms = replay_ms;
      VAMP_LOG(INFO) << absl::StrFormat(
          "VAMP-r %.2f %s: step p50 %.2f ms (forward %.2f, sampling %.2f), %.1f MiB staged per "
          "step in %.1f copies, %.2f ms exposed",
          ratio, p.mode, p.step_ms.p50, p.forward_ms.p50, p.sample_ms.p50,
          p.staged_bytes_per_step / kMiB, p.copies_per_step, p.exposed_ms_per_step);
      points.push_back(p);
    }
  }
  return points;
}

}  // namespace vamp::gpu_step_bench
