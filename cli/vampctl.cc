// vampctl: the operator's command line for vamp-controller, over gRPC.
//
// Exit codes: 0 success, 2 bad arguments, 3 cannot reach the controller, 4 the controller
// answered with an error (or reported NOT_SERVING for `health`).
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_auth.h"
#include "common/secret.h"
#include "common/version.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "vamp/v1/admin.grpc.pb.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;
constexpr int kExitServerError = 4;

constexpr char kUsage[] =
    "Usage: vampctl [--endpoint HOST:PORT] [-o table|json] [--timeout SECONDS] COMMAND\n"
    "       (every option also as --option=value)\n"
    "\n"
    "Administers a running vamp-controller over gRPC.\n"
    "\n"
    "Commands:\n"
    "  health          whether the controller serves: grpc.health.v1, and not draining, as\n"
    "                  HTTP /health says (exit 4 if not)\n"
    "  status          version, model, uptime, policy, KV pool, queue, every rank's agent and\n"
    "                  metrics addresses and its memory\n"
    "  policy get      the memory arbiter and offload cap in force\n"
    "  policy set KEY=VALUE...   arbiter=static|vamp, restore=on|off (the cap needs a restart)\n"
    "  coefficients get          the cost model's coefficients\n"
    "  coefficients set KEY=VALUE...   alpha, tau_steps, t_prefill_us_per_token, t_overhead_us,\n"
    "                  t_sched_us, t_queue_us, c_eff_us, offload_step_groups\n"
    "  offload N       move N expert groups per layer into the KV cache on every rank now\n"
    "  restore N       give N groups back to the experts (waits until their KV blocks are free)\n"
    "  drain           stop admitting requests; running ones finish\n"
    "  undrain         admit requests again after a drain\n"
    "  decisions [N]   the N most recent memory-arbiter decisions [20]\n"
    "\n"
    "Options:\n"
    "  --endpoint HOST:PORT  controller Admin address [$VAMPCTL_ENDPOINT or 127.0.0.1:50052]\n"
    "  --token-file FILE     admin token file [$VAMPCTL_TOKEN_FILE]\n"
    "  --ca_file FILE        PEM CA to verify a controller that serves TLS (its --tls_cert_file)\n"
    "                        [$VAMPCTL_CA_FILE]; without, plaintext\n"
    "  -o, --output FORMAT   table (default) or json\n"
    "  --timeout SECONDS     per-call deadline [5]\n"
    "  -h, --help            print this help\n"
    "      --version         print the version\n"
    "\n"
    "Exit codes: 0 ok, 2 bad arguments, 3 controller unreachable, 4 server error.\n";

struct Options {
  std::string endpoint;
  std::string output = "table";
  double timeout_seconds = 5;
  std::string token;
  std::string ca_file;
  std::string command;
  std::vector<std::string> args;
};

int UsageError(const std::string& message) {
  std::fprintf(stderr, "vampctl: %s\nRun 'vampctl --help' for usage.\n", message.c_str());
  return kExitUsage;
}

// The channel was connected before the call (see Run), so every error here is the server's.
int RpcError(const std::string& what, const grpc::Status& status, const std::string& endpoint) {
  std::fprintf(stderr, "vampctl: %s failed (%s from %s): %s\n", what.c_str(),
               status.error_code() == grpc::StatusCode::UNAVAILABLE ? "unavailable" : "error",
               endpoint.c_str(), status.error_message().c_str());
  return kExitServerError;
}

const Options* g_options = nullptr;

void SetDeadline(grpc::ClientContext* context, double seconds) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
  if (g_options != nullptr) vamp::AddBearerMetadata(context, g_options->token);
}

void PrintJson(const google::protobuf::Message& m) {
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  print.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &json, print);
  std::cout << json;
}

// Parses a positive count argument; -1 when absent or malformed.
int CountArg(const Options& options, size_t i, int fallback) {
  if (options.args.size() <= i) return fallback;
  char* end = nullptr;
  const long v = std::strtol(options.args[i].c_str(), &end, 10);
  if (end == options.args[i].c_str() || *end != '\0' || v < 1 || v > 1000000) return -1;
  return static_cast<int>(v);
}

int Remap(const Options& options, const std::shared_ptr<grpc::Channel>& channel, bool offload) {
  const int n = CountArg(options, 0, -1);
  if (n < 1) return UsageError(std::string(offload ? "offload" : "restore") +
                               " needs a positive number of groups");
  auto stub = vamp::v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  // A restore waits for its KV blocks to drain: allow longer than a plain query.
  SetDeadline(&context, std::max(options.timeout_seconds, 120.0));
  vamp::v1::ForceRemapRequest request;
  request.set_num_groups(n);
  vamp::v1::ForceRemapResponse response;
  grpc::Status status = offload ? stub->ForceOffload(&context, request, &response)
                                : stub->ForceRestore(&context, request, &response);
  if (!status.ok()) return RpcError(offload ? "ForceOffload" : "ForceRestore", status,
                                    options.endpoint);
  if (options.output == "json") {
    PrintJson(response);
  } else {
    std::cout << absl::StrFormat("%s %d group(s): %d offloaded now, KV pool %d blocks\n",
                                 offload ? "offloaded" : "restored", n,
                                 response.offloaded_groups(), response.kv_blocks());
  }
  return kExitOk;
}

int Drain(const Options& options, const std::shared_ptr<grpc::Channel>& channel, bool undrain) {
  auto stub = vamp::v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context, options.timeout_seconds);
  vamp::v1::DrainRequest request;
  request.set_undrain(undrain);
  vamp::v1::DrainResponse response;
  grpc::Status status = stub->Drain(&context, request, &response);
  if (!status.ok()) return RpcError(undrain ? "Undrain" : "Drain", status, options.endpoint);
  if (options.output == "json") {
    PrintJson(response);
  } else {
    std::cout << absl::StrFormat("%s: %d running, %d waiting\n",
                                 undrain ? "admitting requests" : "draining", response.running(),
                                 response.waiting());
  }
  return kExitOk;
}

int Decisions(const Options& options, const std::shared_ptr<grpc::Channel>& channel) {
  const int n = CountArg(options, 0, 20);
  if (n < 1) return UsageError("decisions takes a positive count");
  auto stub = vamp::v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context, options.timeout_seconds);
  vamp::v1::ListDecisionsRequest request;
  request.set_limit(n);
  vamp::v1::ListDecisionsResponse response;
  grpc::Status status = stub->ListDecisions(&context, request, &response);
  if (!status.ok()) return RpcError("ListDecisions", status, options.endpoint);
  if (options.output == "json") {
    PrintJson(response);
    return kExitOk;
  }
  // Tax-model decisions show both sides of their comparison (µs over the window); the paper
  // model's its four costs.
  std::cout << absl::StrFormat(
      "%-8s %-22s %6s %10s %10s %10s %10s %6s %7s %7s %11s %11s %9s %6s %7s %7s\n", "step",
      "action", "gap", "C_c us", "C_e us", "C_p us", "C_b us", "groups", "evicted", "preempt",
      "tax us", "value us", "ghost tok", "weight", "TPOT +", "queue s");
  auto cost = [](double us) { return us < 0 ? std::string("-") : absl::StrFormat("%.0f", us); };
  for (const auto& d : response.decisions()) {
    std::cout << absl::StrFormat(
        "%-8d %-22s %6d %10s %10s %10s %10s %6d %7d %7d %11s %11s %9s %6s %7s %7s\n", d.step_id(),
        d.action(), d.gap_blocks(), cost(d.cost_evict_us()), cost(d.cost_offload_us()),
        cost(d.cost_preempt_us()), cost(d.cost_combined_us()), d.groups(), d.evicted_blocks(),
        d.preempted_requests(), d.tax_evaluated() ? cost(d.tax_us()) : "-",
        d.tax_evaluated() ? cost(d.value_us()) : "-",
        d.tax_evaluated() ? absl::StrFormat("%.0f", d.ghost_tokens()) : "-",
        d.tax_evaluated() ? absl::StrFormat("%.3g", d.ttft_weight()) : "-",
        d.tax_evaluated() ? absl::StrFormat("%.0f%%", 100 * d.tpot_overhead()) : "-",
        d.tax_evaluated() ? absl::StrFormat("%.2f", d.mean_queue_seconds()) : "-");
  }
  return kExitOk;
}

// KEY=VALUE arguments after the sub-command (options.args[1..]).
bool ParseAssignments(const Options& options, std::vector<std::pair<std::string, std::string>>* out,
                      std::string* error) {
  for (size_t i = 1; i < options.args.size(); ++i) {
    const std::string& a = options.args[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == a.size()) {
      *error = "'" + a + "' is not KEY=VALUE";
      return false;
    }
    out->emplace_back(a.substr(0, eq), a.substr(eq + 1));
  }
  if (out->empty()) {
    *error = "nothing to set (give KEY=VALUE arguments)";
    return false;
  }
  return true;
}

void PrintPolicy(const Options& options, const vamp::v1::Policy& p) {
  if (options.output == "json") {
    PrintJson(p);
  } else {
    std::cout << absl::StrFormat("arbiter            %s\nmax offload ratio  %.2f\nrestore            %s\n",
                                 p.arbiter(), p.max_offload_ratio(),
                                 p.restore_enabled() ? "on" : "off");
  }
}

int PolicySet(const Options& options, const std::shared_ptr<grpc::Channel>& channel) {
  std::vector<std::pair<std::string, std::string>> sets;
  std::string error;
  if (!ParseAssignments(options, &sets, &error)) return UsageError("policy set: " + error);
  auto stub = vamp::v1::Admin::NewStub(channel);
  vamp::v1::Policy policy;
  {
    grpc::ClientContext context;
    SetDeadline(&context, options.timeout_seconds);
    grpc::Status status = stub->GetPolicy(&context, {}, &policy);
    if (!status.ok()) return RpcError("GetPolicy", status, options.endpoint);
  }
  for (const auto& [key, value] : sets) {
    if (key == "arbiter") {
      policy.set_arbiter(value);
    } else if (key == "restore" && (value == "on" || value == "off")) {
      policy.set_restore_enabled(value == "on");
    } else {
      return UsageError("policy set: '" + key + "=" + value +
                        "' is not arbiter=static|vamp or restore=on|off");
    }
  }
  grpc::ClientContext context;
  SetDeadline(&context, options.timeout_seconds);
  vamp::v1::Policy response;
  grpc::Status status = stub->SetPolicy(&context, policy, &response);
  if (!status.ok()) return RpcError("SetPolicy", status, options.endpoint);
  PrintPolicy(options, response);
  return kExitOk;
}

int Coefficients(const Options& options, const std::shared_ptr<grpc::Channel>& channel) {
  const bool set = options.args.size() >= 1 && options.args[0] == "set";
  if (options.args.empty() || (options.args[0] != "get" && !set) ||
      (!set && options.args.size() > 1)) {
    return UsageError("coefficients takes 'get' or 'set KEY=VALUE...'");
  }
  std::vector<std::pair<std::string, std::string>> sets;
  std::string error;
  if (set && !ParseAssignments(options, &sets, &error)) {
    return UsageError("coefficients set: " + error);
  }
  auto stub = vamp::v1::Admin::NewStub(channel);
  vamp::v1::CostCoefficients c;
  {
    grpc::ClientContext context;
    SetDeadline(&context, options.timeout_seconds);
    grpc::Status status = stub->GetCoefficients(&context, {}, &c);
    if (!status.ok()) return RpcError("GetCoefficients", status, options.endpoint);
  }
  if (set) {
    const google::protobuf::Descriptor* d = c.GetDescriptor();
    const google::protobuf::Reflection* r = c.GetReflection();
    for (const auto& [key, value] : sets) {
      const google::protobuf::FieldDescriptor* f = d->FindFieldByName(key);
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (f == nullptr) return UsageError("coefficients set: unknown coefficient '" + key + "'");
      if (end == value.c_str() || *end != '\0') {
        return UsageError("coefficients set: " + key + "='" + value + "' is not a number");
      }
      if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT32) {
        r->SetInt32(&c, f, static_cast<int32_t>(v));
      } else {
        r->SetDouble(&c, f, v);
      }
    }
    grpc::ClientContext context;
    SetDeadline(&context, options.timeout_seconds);
    vamp::v1::CostCoefficients response;
    grpc::Status status = stub->SetCoefficients(&context, c, &response);
    if (!status.ok()) return RpcError("SetCoefficients", status, options.endpoint);
    c = response;
  }
  if (options.output == "json") {
    PrintJson(c);
    return kExitOk;
  }
  const google::protobuf::Descriptor* d = c.GetDescriptor();
  const google::protobuf::Reflection* r = c.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    std::cout << absl::StrFormat("%-24s %s\n", f->name(),
                                 f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT32
                                     ? absl::StrCat(r->GetInt32(c, f))
                                     : absl::StrFormat("%g", r->GetDouble(c, f)));
  }
  return kExitOk;
}

int PolicyGet(const Options& options, const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = vamp::v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context, options.timeout_seconds);
  vamp::v1::Policy response;
  grpc::Status status = stub->GetPolicy(&context, {}, &response);
  if (!status.ok()) return RpcError("GetPolicy", status, options.endpoint);
  PrintPolicy(options, response);
  return kExitOk;
}

int Health(const Options& options, const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(&context, options.timeout_seconds);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return RpcError("health check", status, options.endpoint);
  bool serving = response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  // A draining controller answers health checks but admits nothing, and HTTP /health says 503:
  // say the same. Without the Admin token the status is unknown; the health answer stands.
  if (serving) {
    auto admin = vamp::v1::Admin::NewStub(channel);
    grpc::ClientContext status_context;
    SetDeadline(&status_context, options.timeout_seconds);
    vamp::v1::GetStatusResponse state;
    if (admin->GetStatus(&status_context, {}, &state).ok() && state.draining()) {
      serving = false;
      name = "NOT_SERVING";
    }
  }
  const bool draining =
      !serving && response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  if (options.output == "json") {
    std::cout << "{\"status\": \"" << name << "\", \"draining\": " << (draining ? "true" : "false")
              << "}\n";
  } else {
    std::cout << name << (draining ? " (draining)" : "") << "\n";
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
    PrintJson(response);
    return kExitOk;
  }
  std::cout << absl::StrFormat(
      "version        %s\nmodel          %s\nuptime         %.1f s\nserving        %s\n"
      "draining       %s\npolicy         %s\noffload ratio  %.3f (%d groups)\n",
      response.version(), response.model(), response.uptime_seconds(),
      response.serving() ? "yes" : "no", response.draining() ? "yes" : "no", response.policy(),
      response.offload_ratio(), response.offloaded_groups());
  if (!response.last_error().empty()) {
    std::cout << "last error     " << response.last_error() << "\n";
  }
  const auto& kv = response.kv_pool();
  std::cout << absl::StrFormat(
      "kv pool        %d blocks (%d used, %d cached free, %d free), block %d tokens, hit %.1f%%\n"
      "queue          %d running, %d waiting, %d preempted, %d finished\n",
      kv.total_blocks(), kv.used_blocks(), kv.cached_free_blocks(), kv.uncached_free_blocks(),
      kv.block_size(), 100 * kv.prefix_cache_hit_ratio(), response.queue().running(),
      response.queue().waiting(), response.queue().preempted(), response.queue().finished_total());
  if (kv.snapshots() > 0 || kv.state_captures_total() > 0) {
    std::cout << absl::StrFormat(
        "state          %d snapshots in %d blocks, %d captures (%d skipped for want of blocks)\n",
        kv.snapshots(), kv.snapshot_blocks(), kv.state_captures_total(),
        kv.state_captures_skipped_total());
  }
  if (response.agents_size() == 0) {
    std::cout << "agents         none registered\n";
  } else {
    std::cout << absl::StrFormat("%-5s %-24s %-24s %s\n", "rank", "agent address",
                                 "metrics address", "state");
    for (const auto& a : response.agents()) {
      std::cout << absl::StrFormat("%-5d %-24s %-24s %s\n", a.rank(), a.agent_address(),
                                   a.metrics_address().empty() ? "-" : a.metrics_address(),
                                   a.gone() ? "gone" : "registered");
    }
  }
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
    options.endpoint = "127.0.0.1:50052";
  }
  std::string token_file;
  if (const char* env = std::getenv("VAMPCTL_TOKEN_FILE"); env != nullptr) token_file = env;
  if (const char* env = std::getenv("VAMPCTL_CA_FILE"); env != nullptr) options.ca_file = env;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    // --option=value is --option value.
    std::optional<std::string> inline_value;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    auto value = [&]() -> const std::string* {
      if (inline_value.has_value()) return &*inline_value;
      if (i + 1 >= args.size()) return nullptr;
      return &args[++i];
    };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return kExitOk;
    } else if (a == "--version") {
      std::cout << "vampctl " << vamp::kVersion << "\n";
      return kExitOk;
    } else if (a == "--endpoint" || a == "-o" || a == "--output" || a == "--timeout" ||
               a == "--token-file" || a == "--ca_file" || a == "--ca-file") {
      const std::string* v = value();
      if (v == nullptr) return UsageError("option " + a + " needs a value");
      if (a == "--endpoint") {
        options.endpoint = *v;
      } else if (a == "--token-file") {
        token_file = *v;
      } else if (a == "--ca_file" || a == "--ca-file") {
        options.ca_file = *v;
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
      options.args.push_back(a);
    }
  }
  if (!token_file.empty()) {
    // Read and validated as the controller reads its own: a token it would refuse to load could
    // never match, and one with a newline would make gRPC reject (and print) the metadata.
    absl::StatusOr<std::string> token = vamp::ReadSecretFile(token_file, "--token-file");
    if (!token.ok()) return UsageError(std::string(token.status().message()));
    options.token = *std::move(token);
  }
  g_options = &options;
  if (options.output != "table" && options.output != "json") {
    return UsageError("--output: '" + options.output + "' is not one of table, json");
  }
  if (options.command.empty()) return UsageError("no command given");
  static const char* const kCommands[] = {"health",  "status",    "policy",
                                          "offload", "restore",   "drain",
                                          "undrain", "decisions", "coefficients"};
  if (std::find(std::begin(kCommands), std::end(kCommands), options.command) ==
      std::end(kCommands)) {
    return UsageError("unknown command '" + options.command + "'");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.ca_file.empty()) {
    std::ifstream in(options.ca_file, std::ios::binary);
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!in || tls.pem_root_certs.empty()) {
      return UsageError("--ca_file: cannot read a PEM certificate from '" + options.ca_file + "'");
    }
    credentials = grpc::SslCredentials(tls);
  }
  auto channel = grpc::CreateChannel(options.endpoint, credentials);
  // Fail fast: a refused connection (or a failed TLS handshake) shows as TRANSIENT_FAILURE at
  // once, while WaitForConnected alone would retry it until the timeout.
  const auto deadline =
      std::chrono::system_clock::now() +
      std::chrono::microseconds(static_cast<int64_t>(options.timeout_seconds * 1e6));
  for (grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
       state != GRPC_CHANNEL_READY; state = channel->GetState(/*try_to_connect=*/true)) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
      std::fprintf(stderr, "vampctl: cannot reach %s (connection refused or failed%s)\n",
                   options.endpoint.c_str(),
                   options.ca_file.empty() ? "; a TLS controller needs --ca_file" : "");
      return kExitUnreachable;
    }
    if (!channel->WaitForStateChange(state, deadline)) {
      std::fprintf(stderr, "vampctl: cannot reach %s (no connection within %g s)\n",
                   options.endpoint.c_str(), options.timeout_seconds);
      return kExitUnreachable;
    }
  }
  const bool variadic = options.command == "policy" || options.command == "coefficients";
  const size_t max_args =
      options.command == "offload" || options.command == "restore" || options.command == "decisions"
          ? 1
          : 0;
  if (!variadic && options.args.size() > max_args) {
    return UsageError("unexpected argument '" + options.args[max_args] + "'");
  }
  if (options.command == "health") return Health(options, channel);
  if (options.command == "status") return Status(options, channel);
  if (options.command == "offload") return Remap(options, channel, /*offload=*/true);
  if (options.command == "restore") return Remap(options, channel, /*offload=*/false);
  if (options.command == "drain") return Drain(options, channel, /*undrain=*/false);
  if (options.command == "undrain") return Drain(options, channel, /*undrain=*/true);
  if (options.command == "decisions") return Decisions(options, channel);
  if (options.command == "coefficients") return Coefficients(options, channel);
  if (options.command == "policy") {
    if (!options.args.empty() && options.args[0] == "set") return PolicySet(options, channel);
    if (options.args.size() != 1 || options.args[0] != "get") {
      return UsageError("policy takes 'get' or 'set KEY=VALUE...'");
    }
    return PolicyGet(options, channel);
  }
  return UsageError("unknown command '" + options.command + "'");
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
