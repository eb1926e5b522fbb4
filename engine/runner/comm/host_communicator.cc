#include "engine/runner/comm/host_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace vamp {

class HostCommunicatorGroup::Rank final : public Communicator {
 public:
  Rank(HostCommunicatorGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status AllReduceSum(float* data, int64_t count) override {
    return group_->AllReduceSum(rank_, data, count);
  }

 private:
  HostCommunicatorGroup* const group_;
  const int rank_;
  // This rank's sums before they replace its data (reused across calls).
  friend class HostCommunicatorGroup;
  std::vector<float> scratch_;
};

absl::StatusOr<std::unique_ptr<HostCommunicatorGroup>> HostCommunicatorGroup::Create(int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a communicator group needs >= 1 rank, got ", size));
  }
  return std::unique_ptr<HostCommunicatorGroup>(new HostCommunicatorGroup(size));
}

HostCommunicatorGroup::HostCommunicatorGroup(int size)
    : size_(size), buffers_(size, nullptr), counts_(size, 0) {
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(this, r));
}

HostCommunicatorGroup::~HostCommunicatorGroup() = default;

Communicator* HostCommunicatorGroup::rank(int rank) { return ranks_[rank].get(); }

void HostCommunicatorGroup::Abort(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) aborted_ = status.ok() ? absl::AbortedError("aborted") : std::move(status);
}

absl::Status HostCommunicatorGroup::Barrier() {
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) return aborted_;
  const uint64_t generation = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    return absl::OkStatus();
  }
  auto released = [this, generation]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return generation_ != generation || !aborted_.ok();
  };
  mu_.Await(absl::Condition(&released));
  return generation_ != generation ? absl::OkStatus() : aborted_;
}

absl::Status HostCommunicatorGroup::AllReduceSum(int rank, float* data, int64_t count) {
  if (size_ == 1) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    buffers_[rank] = data;
    counts_[rank] = count;
  }
  // 1: every rank has published its buffer.
  if (absl::Status s = Barrier(); !s.ok()) return s;
  std::vector<const float*> sources(size_);
  {
    absl::MutexLock lock(&mu_);
    for (int r = 0; r < size_; ++r) {
      if (counts_[r] != count) {
        aborted_ =
            absl::InternalError(absl::StrCat("all-reduce size mismatch: rank ", r, " has ",
                                             counts_[r], " elements, rank ", rank, " ", count));
        return aborted_;
      }
      sources[r] = buffers_[r];
    }
  }
  std::vector<float>& sum = ranks_[rank]->scratch_;
  sum.resize(count);
  std::memcpy(sum.data(), sources[0], count * sizeof(float));
  for (int r = 1; r < size_; ++r) {
    const float* src = sources[r];
    for (int64_t i = 0; i < count; ++i) sum[i] += src[i];
  }
  // 2: every rank has read every buffer; now each may overwrite its own.
  if (absl::Status s = Barrier(); !s.ok()) return s;
  std::memcpy(data, sum.data(), count * sizeof(float));
  return absl::OkStatus();
}

}  // namespace vamp
