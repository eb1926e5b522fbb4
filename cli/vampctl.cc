// vampctl: the operator's command line for vamp-controller, over gRPC.
//
// Exit codes: 0 success, 2 bad arguments, 3 cannot reach the controller, 4 the controller
// answered with an error (or reported NOT_SERVING for `health`).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "vamp/v1/admin.grpc.pb.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;
constexpr int kExitServerError = 4;

constexpr char kUsage[] =
    "Usage: vampctl [--endpoint HOST:PORT] [-o table|json] [--timeout SECONDS] COMMAND\n"
    "\n"
    "Administers a running vamp-controller over gRPC.\n"
    "\n"
    "Commands:\n"
    "  health    ask grpc.health.v1 whether the controller is serving (exit 4 if not)\n"
    "  status    version, model, uptime, policy and memory split of every rank\n"
    "\n"
    "Options:\n"
    "  --endpoint HOST:PORT  controller address [$VAMPCTL_ENDPOINT or 127.0.0.1:50051]\n"
    "  -o, --output FORMAT   table (default) or json\n"
    "  --timeout SECONDS     per-call deadline [5]\n"
    "  -h, --help            print this help\n"
    "\n"
    "Exit codes: 0 ok, 2 bad arguments, 3 controller unreachable, 4 server error.\n";

struct Options {
  std::string endpoint;
  std::string output = "table";
  double timeout_seconds = 5;
  std::string command;
};

int UsageError(const std::string& message) {
  std::fprintf(stderr, "vampctl: %s\nRun 'vampctl --help' for usage.\n", message.c_str());
  return kExitUsage;
}

int RpcError(const std::string& what, const grpc::Status& status, const std::string& endpoint) {
  const bool unreachable = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  std::fprintf(stderr, "vampctl: %s failed%s: %s\n", what.c_str(),
               unreachable ? (" (cannot reach " + endpoint + ")").c_str() : "",
               status.error_message().c_str());
  return unreachable ? kExitUnreachable : kExitServerError;
}

void SetDeadline(grpc::ClientContext* context, double seconds) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
}

int Health(const Options& options, const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context, options.timeout_seconds);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return RpcError("health check", status, options.endpoint);
  const bool serving =
      response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  const std::string name =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  if (options.output == "json") {
    std::cout << "{\"status\": \"" << name << "\"}\n";
  } else {
    std::cout << name << "\n";
  }
  return serving ? kExitOk : kExitServerError;
}

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f", bytes / (1024.0 * 1024.0)); }

int Status(const Options& options, const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = vamp::v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context, options.timeout_seconds);
  vamp::v1::GetStatusResponse response;
  grpc::Status status = stub->GetStatus(&context, vamp::v1::GetStatusRequest(), &response);
  if (!status.ok()) return RpcError("GetStatus", status, options.endpoint);
  if (options.output == "json") {
    std::string json;
    google::protobuf::util::JsonPrintOptions print;
    print.add_whitespace = true;
    print.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(response, &json, print);
    std::cout << json;
    return kExitOk;
  }
  std::cout << absl::StrFormat(
      "version        %s\nmodel          %s\nuptime         %.1f s\nserving        %s\n"
      "draining       %s\npolicy         %s\noffload ratio  %.3f (%d groups)\n",
      response.version(), response.model(), response.uptime_seconds(),
      response.serving() ? "yes" : "no", response.draining() ? "yes" : "no", response.policy(),
      response.offload_ratio(), response.offloaded_groups());
  const auto& kv = response.kv_pool();
  std::cout << absl::StrFormat(
      "kv pool        %d blocks (%d used, %d cached free, %d free), block %d tokens, hit %.1f%%\n"
      "queue          %d running, %d waiting, %d preempted, %d finished\n",
      kv.total_blocks(), kv.used_blocks(), kv.cached_free_blocks(), kv.uncached_free_blocks(),
      kv.block_size(), 100 * kv.prefix_cache_hit_ratio(), response.queue().running(),
      response.queue().waiting(), response.queue().preempted(), response.queue().finished_total());
  if (response.ranks_size() == 0) {
    std::cout << "ranks          none attached\n";
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-5s %-8s %12s %12s %12s %12s %8s %10s\n", "rank", "device",
                               "experts MiB", "offload MiB", "kv MiB", "staging MiB", "groups",
                               "kv blocks");
  for (const auto& r : response.ranks()) {
    std::cout << absl::StrFormat("%-5d %-8s %12s %12s %12s %12s %4d/%-3d %10d\n", r.rank(),
                                 r.device(), Mib(r.resident_expert_bytes()),
                                 Mib(r.offloaded_expert_bytes()), Mib(r.kv_pool_bytes()),
                                 Mib(r.staging_bytes()), r.offloaded_groups(),
                                 r.max_offload_groups(), r.kv_blocks());
  }
  return kExitOk;
}

int Run(int argc, char** argv) {
  Options options;
  if (const char* env = std::getenv("VAMPCTL_ENDPOINT"); env != nullptr && *env != '\0') {
    options.endpoint = env;
  } else {
    options.endpoint = "127.0.0.1:50051";
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag) -> const std::string* {
      if (i + 1 >= args.size()) return nullptr;
      (void)flag;
      return &args[++i];
    };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return kExitOk;
    } else if (a == "--endpoint" || a == "-o" || a == "--output" || a == "--timeout") {
      const std::string* v = value(a);
      if (v == nullptr) return UsageError("option " + a + " needs a value");
      if (a == "--endpoint") {
        options.endpoint = *v;
      } else if (a == "--timeout") {
        char* end = nullptr;
        options.timeout_seconds = std::strtod(v->c_str(), &end);
        if (end == v->c_str() || *end != '\0' || !(options.timeout_seconds > 0)) {
          return UsageError("--timeout: '" + *v + "' is not a positive number of seconds");
        }
      } else {
        options.output = *v;
      }
    } else if (a.rfind("--", 0) == 0 || (a.size() > 1 && a[0] == '-')) {
      return UsageError("unknown option '" + a + "'");
    } else if (options.command.empty()) {
      options.command = a;
    } else {
      return UsageError("unexpected argument '" + a + "'");
    }
  }
  if (options.output != "table" && options.output != "json") {
    return UsageError("--output: '" + options.output + "' is not one of table, json");
  }
  if (options.command.empty()) return UsageError("no command given");
  auto channel = grpc::CreateChannel(options.endpoint, grpc::InsecureChannelCredentials());
  if (options.command == "health") return Health(options, channel);
  if (options.command == "status") return Status(options, channel);
  return UsageError("unknown command '" + options.command + "'");
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
