#include "agent/tensor_parallel_group.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/cuda_support.h"
#include "engine/runner/comm/tcp_communicator.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace vamp {
namespace {

uint64_t Fnv1a(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

uint64_t GroupFingerprint(const vamp::v1::InitRequest& request) {
  vamp::v1::InitRequest copy = request;
  copy.mutable_parallel()->set_tp_rank(0);
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    copy.SerializeToCodedStream(&coded);
  }
  return Fnv1a(bytes);
}

namespace {

class TcpGroup final : public TensorParallelGroup {
 public:
  explicit TcpGroup(std::unique_ptr<TcpCommunicator> comm) : comm_(std::move(comm)) {}
  Communicator* host_communicator() override { return comm_.get(); }
  void Abort(const absl::Status& reason) override { comm_->Abort(reason); }
  absl::StatusOr<bool> AllRanksOk(bool ok) override {
    float failed = ok ? 0.0f : 1.0f;  // sums of 0/1 are exact in float32
    VAMP_RETURN_IF_ERROR(comm_->AllReduceSum(&failed, 1));
    return failed == 0.0f;
  }

 private:
  const std::unique_ptr<TcpCommunicator> comm_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TensorParallelGroup>> JoinTensorParallelGroup(
    const vamp::v1::InitRequest& request, const AgentEngineOptions& options,
    const std::atomic<bool>& cancel) {
  if (options.device.kind == DeviceSpec::Kind::kCuda) {
    absl::StatusOr<std::unique_ptr<TensorParallelGroup>> group =
        JoinNcclGroup(request, options, cancel);
    if (!group.ok()) return WithPrefix(group.status(), "parallel: ");
    return group;
  }
  TcpCommunicatorOptions o;
  o.rank = request.parallel().tp_rank();
  o.size = request.parallel().tp_size();
  o.address = request.parallel().host_transport_address();
  o.connect_timeout_ms = options.tp_connect_timeout_ms;
  o.io_timeout_ms = options.tp_io_timeout_ms;
  o.group_fingerprint = GroupFingerprint(request);
  o.auth_token = options.auth_token;
  VAMP_LOG(INFO) << "tensor parallelism: rank " << o.rank << " of " << o.size
                 << (o.rank == 0 ? " listening on " : " connecting to ") << o.address;
  absl::StatusOr<std::unique_ptr<TcpCommunicator>> comm = TcpCommunicator::Connect(o, &cancel);
  if (!comm.ok()) return WithPrefix(comm.status(), "parallel: ");
  return std::unique_ptr<TensorParallelGroup>(std::make_unique<TcpGroup>(*std::move(comm)));
}

absl::StatusOr<std::string> CreateCollectiveId(const DeviceSpec& device) {
  if (device.kind != DeviceSpec::Kind::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CreateCollectiveId: this agent runs on ", device.ToString(),
        "; CPU agents all-reduce over TCP (parallel.host_transport_address), not NCCL"));
  }
  absl::StatusOr<std::string> id = CreateNcclUniqueId(device);
  if (!id.ok()) return WithPrefix(id.status(), "CreateCollectiveId: ");
  return id;
}

}  // namespace vamp
