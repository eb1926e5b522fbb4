#include "controller/server/controller_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/secret.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "controller/arbiter/vamp_arbiter.h"
#include "controller/serving/agent_reports.h"
#include "nlohmann/json.hpp"
#include "tokenizer/hf_tokenizer.h"

namespace vamp {
namespace {

void RegisterBuildMetrics() {
  static bool registered = [] {
    auto& registry = *MetricsRegistry();
    prometheus::BuildGauge()
        .Name("vamp_controller_build_info")
        .Help("Always 1; the labels carry the build's version")
        .Register(registry)
        .Add({{"version", kVersion}})
        .Set(1);
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    prometheus::BuildGauge()
        .Name("vamp_controller_start_time_seconds")
        .Help("Unix time at which the controller started")
        .Register(registry)
        .Add({})
        .Set(now);
    return true;
  }();
  (void)registered;
}

// 1 while a full set of agents serves the model: what "agent down" alerts look at when Prometheus
// cannot scrape the agents themselves.
prometheus::Gauge& ServingGauge() {
  static prometheus::Gauge& gauge = prometheus::BuildGauge()
                                        .Name("vamp_controller_serving")
                                        .Help("1 while a full set of agents serves the model")
                                        .Register(*MetricsRegistry())
                                        .Add({});
  return gauge;
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// "host:port" of a listener bound to `bind` ("host:port") on `port`, as others should dial it.
std::string DialAddress(const std::string& bind, int port) {
  std::string host = bind.substr(0, bind.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") host = HostName();
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read '", path, "'"));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.empty())
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is empty"));
  return data;
}

// A loopback port free right now, for the CPU agents' all-reduce rendezvous.
absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  if (port <= 0) return absl::InternalError("no free loopback port");
  return port;
}

}  // namespace

ControllerServer::ControllerServer(const ControllerOptions& options)
    : options_(options), start_micros_(SteadyClock::Get().NowMicros()) {}

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(
    const Config& config, const std::string& self_path, std::function<void()> on_fatal) {
  VAMP_ASSIGN_OR_RETURN(ControllerOptions options, ControllerOptionsFromConfig(config));
  return Start(options, self_path, std::move(on_fatal));
}

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(
    const ControllerOptions& options, const std::string& self_path,
    std::function<void()> on_fatal) {
  std::unique_ptr<ControllerServer> server(new ControllerServer(options));
  ControllerServer* self = server.get();
  server->on_fatal_ = std::move(on_fatal);
  RegisterBuildMetrics();
  ServingGauge().Set(0);
  // Validate what can be validated before anything listens.
  if (options.model_path.empty()) {
    return absl::InvalidArgumentError(
        "model_path: required (a folder with config.json, and *.safetensors unless "
        "load_format=dummy)");
  }
  // The model's own tokenizer and chat template, when its folder has one: a folder whose
  // tokenizer is unusable stops start-up here with the file and field at fault.
  {
    std::error_code ec;
    const std::filesystem::path folder(options.model_path);
    if (std::filesystem::exists(folder / "tokenizer.json", ec)) {
      absl::StatusOr<std::unique_ptr<HfTokenizer>> tokenizer =
          HfTokenizer::FromModelFolder(folder.string());
      if (!tokenizer.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("model_path: the model's tokenizer cannot be used: ",
                         tokenizer.status().message()));
      }
      VAMP_LOG(INFO) << "tokenizer: " << (folder / "tokenizer.json").string() << " ("
                     << (*tokenizer)->max_token_id() + 1 << " ids)";
      server->tokenizer_ = *std::move(tokenizer);
    } else {
      VAMP_LOG(INFO) << "tokenizer: byte-level fallback (no tokenizer.json in "
                     << folder.string() << ")";
    }
  }
  const int spawn = options.spawn_agents;
  // Agents are authenticated by default: a process that registers as a rank receives every
  // prompt of that rank and answers every client, so the token is what stands between anyone
  // who can reach the gRPC port and all traffic.
  if (!options.auth_token_file.empty()) {
    VAMP_ASSIGN_OR_RETURN(server->agent_token_, ReadSecretFile(options.auth_token_file,
                                                               "config field 'auth_token_file'"));
    server->admin_token_ = server->agent_token_;
  } else if (spawn > 0) {
    // Our own agents only: a fresh token they get through their environment. Admin stays as
    // configured (no token: it listens on loopback unless told otherwise).
    VAMP_ASSIGN_OR_RETURN(server->agent_token_, GenerateSecret());
  } else if (options.insecure_no_auth) {
    VAMP_LOG(WARNING) << "--insecure_no_auth: any process that reaches the gRPC port can register "
                         "as an agent and receive every prompt; use --auth_token_file outside "
                         "isolated test setups";
  } else {
    return absl::InvalidArgumentError(
        "config field 'auth_token_file': required when agents are started elsewhere "
        "(spawn_agents=0): give the controller and every vamp-agent the same token file, or pass "
        "--insecure_no_auth to let any process register as an agent");
  }
  HttpFrontendOptions http = options.http;
  http.metrics_targets = [self](int http_port) { return self->MetricsTargetsJson(http_port); };
  http.last_error = [self] { return self->last_error(); };
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (http.server.tls_cert_file.empty() != http.server.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file: give both or neither");
  }
  if (!http.server.tls_cert_file.empty()) {
    VAMP_ASSIGN_OR_RETURN(std::string cert, ReadFile(http.server.tls_cert_file, "tls_cert_file"));
    VAMP_ASSIGN_OR_RETURN(std::string key, ReadFile(http.server.tls_key_file, "tls_key_file"));
    grpc::SslServerCredentialsOptions tls;
    tls.pem_key_cert_pairs.push_back({key, cert});
    credentials = grpc::SslServerCredentials(tls);
  }
  if (!options.api_key_file.empty()) {
    VAMP_ASSIGN_OR_RETURN(http.api_keys,
                          ReadSecretListFile(options.api_key_file, "config field 'api_key_file'"));
  }
  const int world_size = spawn > 0 ? spawn : options.world_size;

  server->registry_ = std::make_unique<AgentRegistry>(world_size, server->agent_token_);
  server->registry_->set_on_change([self] {
    if (absl::Status s = self->WriteMetricsTargetsFile(); !s.ok()) {
      VAMP_LOG(WARNING) << "metrics_targets_file: " << s.message();
    }
  });
  ServingContextProvider context = [self] { return self->Context(); };
  // gRPC Serving is a second door to the same model: the same keys as HTTP.
  server->serving_service_ = std::make_unique<ServingService>(context, http.api_keys);
  AdminBackend admin;
  admin.status = [self](vamp::v1::GetStatusResponse* s) { self->FillStatus(s); };
  admin.context = context;
  admin.configured_policy.set_arbiter(options.arbiter);
  admin.configured_policy.set_max_offload_ratio(options.offload_cap.ratio());
  admin.configured_policy.set_restore_enabled(options.vamp.restore.enabled);
  admin.auth_token = server->admin_token_;
  server->admin_ = std::make_unique<AdminService>(std::move(admin));

  if (!options.metrics_address.empty()) {
    VAMP_ASSIGN_OR_RETURN(server->metrics_, MetricsExposer::Start(options.metrics_address));
  }
  // Agents register on the same port as clients, so with TLS they must speak TLS to it too.
  VAMP_ASSIGN_OR_RETURN(
      server->grpc_,
      GrpcServer::Start(options.grpc_address,
                        {server->serving_service_.get(), server->registry_.get()}, credentials));
  VAMP_ASSIGN_OR_RETURN(
      server->admin_grpc_,
      GrpcServer::Start(options.admin_address, {server->admin_.get()}, credentials));
  VAMP_ASSIGN_OR_RETURN(server->http_, HttpFrontend::Start(http, context));
  // Ready before the first write, so that a registration racing it writes after it.
  server->targets_file_ready_ = true;
  if (absl::Status s = server->WriteMetricsTargetsFile(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics_targets_file: ", s.message()));
  }
  // Until a full set of agents serves the model, health says so.
  server->grpc_->SetServing("vamp.v1.Serving", false);
  // This process, for agents watching their controller (RegisterResponse.health_service).
  server->grpc_->SetServing(server->registry_->health_service(), true);
  VAMP_LOG(INFO) << "vamp-controller " << kVersion << ": HTTP on port " << server->http_port()
                 << ", gRPC on port " << server->grpc_port() << ", Admin on port "
                 << server->admin_port()
                 << (server->metrics_ ? absl::StrCat(", /metrics on port ", server->metrics_port())
                                      : std::string())
                 << "; waiting for " << world_size << " agent(s)";

  if (spawn > 0) {
    std::string binary = options.agent_binary;
    if (binary.empty()) {
      VAMP_ASSIGN_OR_RETURN(binary, AgentLauncher::FindAgentBinary(self_path));
    }
    AgentLauncherOptions launch;
    launch.binary = binary;
    launch.num_agents = spawn;
    launch.args = {"--controller",
                   absl::StrCat("127.0.0.1:", server->grpc_port()),
                   "--listen",
                   "127.0.0.1:0",
                   "--metrics_address",
                   "127.0.0.1:0",
                   "--device",
                   options.agent_device,
                   "--host_memory_bytes",
                   absl::StrCat(options.agent_host_memory_bytes),
                   "--host_page_bytes",
                   absl::StrCat(options.agent_host_page_bytes),
                   "--log_level",
                   options.log.level,
                   "--log_format",
                   options.log.format};
    if (!options.log.file.empty()) {
      // Agents append to the controller's file: every line is one O_APPEND write.
      launch.args.push_back("--log_file");
      launch.args.push_back(options.log.file);
    }
    if (!http.server.tls_cert_file.empty()) {
      // The registration port serves TLS: spawned agents verify it with the same certificate.
      launch.args.push_back("--controller_ca_file");
      launch.args.push_back(http.server.tls_cert_file);
    }
    if (server->agent_token_.empty()) {
      launch.args.push_back("--insecure_no_auth");
    } else {
      launch.env.push_back(absl::StrCat(kAgentAuthTokenEnv, "=", server->agent_token_));
    }
    VAMP_ASSIGN_OR_RETURN(server->launcher_, AgentLauncher::Start(std::move(launch)));
  }
  server->supervisor_ = std::thread([self] { self->Supervise(); });
  return server;
}

ControllerServer::~ControllerServer() { Shutdown(); }

void ControllerServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  if (supervisor_.joinable()) supervisor_.join();
  if (http_ != nullptr) http_->Stop();
  TearDown();
  if (launcher_ != nullptr) launcher_->Stop();
  if (grpc_ != nullptr) grpc_->Shutdown();
  if (admin_grpc_ != nullptr) admin_grpc_->Shutdown();
}

std::shared_ptr<const ServingContext> ControllerServer::Context() const {
  absl::MutexLock lock(&mu_);
  return context_;
}

bool ControllerServer::serving() const {
  std::shared_ptr<const ServingContext> ctx = Context();
  return ctx != nullptr && ctx->engine->healthy();
}

std::string ControllerServer::fatal_error() const {
  absl::MutexLock lock(&mu_);
  return fatal_error_;
}

std::string ControllerServer::last_error() const {
  if (serving()) return "";
  absl::MutexLock lock(&mu_);
  return last_error_;
}

bool ControllerServer::WaitUntilServing(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (serving()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return serving();
}

void ControllerServer::Supervise() {
  int64_t seen = 0;
  absl::Time waiting_since = absl::Now();
  absl::Time last_report = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    // A new registration is normally what brings agents (back); after a while without one the
    // current set is retried, e.g. after a transient step timeout.
    const int64_t after = absl::Now() - waiting_since > absl::Seconds(5) ? -1 : seen;
    std::vector<AgentEndpoint> endpoints;
    std::optional<int64_t> generation =
        registry_->WaitForAll(after, absl::Milliseconds(200), &endpoints);
    if (!generation.has_value()) {
      if (absl::Now() - last_report > absl::Seconds(options_.registration_timeout_s)) {
        VAMP_LOG(WARNING) << "still waiting for agents: " << registry_->registered() << " of "
                          << registry_->world_size() << " registered";
        last_report = absl::Now();
      }
      continue;
    }
    seen = *generation;
    bool permanent = false;
    absl::Status up = BringUp(endpoints, &permanent);
    if (!up.ok()) {
      VAMP_LOG(ERROR) << "cannot serve with the registered agents: " << up;
      {
        absl::MutexLock lock(&mu_);
        last_error_ = std::string(up.message());
      }
      if (permanent && launcher_ != nullptr) {
        // Our own agents, given our own flags, will fail the same way every time: answering 503
        // forever with the reason only in a log helps nobody.
        VAMP_LOG(ERROR) << "stopping: the spawned agents cannot load the model (" << up.message()
                        << "); fix the flags and start again";
        TearDown();
        {
          absl::MutexLock lock(&mu_);
          fatal_error_ = std::string(up.message());
        }
        if (on_fatal_) on_fatal_();
        return;
      }
      waiting_since = absl::Now();
      TearDown();
      MarkUnreachableAgentsGone();
      continue;
    }
    grpc_->SetServing("vamp.v1.Serving", true);
    ServingGauge().Set(1);
    // Serve until the engine fails, an agent re-registers, or we stop.
    while (true) {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      if (!context_->engine->healthy()) {
        last_error_ = "an agent failed; waiting for it to come back";
        break;
      }
      if (registry_->generation() != seen) break;
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
    }
    std::shared_ptr<AgentGroup> failed_group;
    {
      absl::MutexLock lock(&mu_);
      failed_group = group_;
    }
    if (launcher_ != nullptr && failed_group != nullptr && failed_group->missed_step_deadline()) {
      // A spawned agent that misses its step deadline is frozen or hung but keeps its
      // connection, so nothing else would ever replace it: restart our agents.
      VAMP_LOG(ERROR) << "a spawned agent missed its step deadline (step_timeout_s "
                      << options_.step_timeout_s
                      << "); killing the spawned agents so that they restart";
      launcher_->KillAll();
    }
    VAMP_LOG(WARNING) << "agent group changed or failed: re-initialising";
    grpc_->SetServing("vamp.v1.Serving", false);
    ServingGauge().Set(0);
    TearDown();
    if (failed_group != nullptr && !failed_group->healthy()) MarkUnreachableAgentsGone();
    waiting_since = absl::Now();
  }
}

absl::Status ControllerServer::BringUp(const std::vector<AgentEndpoint>& endpoints,
                                       bool* permanent) {
  *permanent = false;
  AgentGroupOptions options;
  options.step_timeout_ms = static_cast<int64_t>(options_.step_timeout_s * 1000);
  options.auth_token = agent_token_;
  VAMP_ASSIGN_OR_RETURN(std::unique_ptr<AgentGroup> group, AgentGroup::Connect(endpoints, options));
  SchedulerConfig scheduler = options_.scheduler;
  vamp::v1::InitRequest init;
  init.set_model_path(options_.model_path);
  init.set_load_format(options_.load_format);
  init.set_dtype(options_.dtype);
  if (endpoints.size() > 1) {
    // Where CPU agents meet; CUDA agents meet through the NCCL unique id the group asks rank 0
    // for (AgentGroup::Init), and ignore this.
    VAMP_ASSIGN_OR_RETURN(int port, FreeLoopbackPort());
    init.mutable_parallel()->set_host_transport_address(absl::StrCat("127.0.0.1:", port));
  }
  vamp::v1::MemorySpec* memory = init.mutable_memory();
  memory->set_gpu_memory_utilization(options_.gpu_memory_utilization);
  memory->set_block_size(scheduler.block_size);
  memory->set_max_offload_ratio(options_.offload_cap.ratio());
  memory->set_max_num_batched_tokens(scheduler.max_num_batched_tokens);
  memory->set_max_num_seqs(scheduler.max_num_seqs);
  VAMP_LOG(INFO) << "initialising " << endpoints.size() << " agent(s) with " << init.model_path()
                 << " (" << init.load_format() << ", dtype " << init.dtype() << ")";
  absl::StatusOr<std::vector<vamp::v1::InitResponse>> initialised = group->Init(init);
  if (!initialised.ok()) {
    *permanent =
        absl::IsInvalidArgument(initialised.status()) || absl::IsNotFound(initialised.status());
    return initialised.status();
  }
  std::vector<vamp::v1::InitResponse> ranks = *std::move(initialised);
  // Nothing is sized from the agents' answers before they are checked: a lying or buggy agent is
  // refused here (and retried when it registers again) instead of crashing the controller.
  VAMP_RETURN_IF_ERROR(CheckInitResponses(init, ranks));
  const vamp::v1::InitResponse& first = ranks.front();
  // Each agent prints its own memory plan; here, one line per rank.
  for (const auto& r : ranks) {
    VAMP_LOG(INFO) << "rank " << r.memory().rank() << " (" << r.memory().device()
                   << "): " << r.memory().kv_blocks() << " KV blocks, up to "
                   << r.memory().max_offload_groups() << " expert groups offloadable";
  }
  if (first.max_position_embeddings() > 0 &&
      scheduler.max_model_len > first.max_position_embeddings()) {
    VAMP_LOG(INFO) << "max_model_len " << scheduler.max_model_len
                   << " exceeds the model's context; using " << first.max_position_embeddings();
    scheduler.max_model_len = first.max_position_embeddings();
  }
  if (first.prefix_caching_unsupported() && scheduler.enable_prefix_caching) {
    VAMP_LOG(WARNING) << "prefix caching off: the model keeps per-request linear-attention state "
                         "and the agents keep no snapshots of it for a prefix-cache hit to restore";
    scheduler.enable_prefix_caching = false;
  }
  if (first.recurrent_state_bytes() > 0) {
    // Snapshots of it live in the KV pool, in as many blocks as the rank that needs most (the
    // pools share block ids).
    int64_t blocks = 0;
    for (const auto& r : ranks) {
      const uint64_t block = r.offload().kv_block_bytes();
      blocks = std::max<int64_t>(
          blocks, static_cast<int64_t>((r.recurrent_state_bytes() + block - 1) / block));
    }
    scheduler.recurrent_state_blocks = static_cast<int32_t>(blocks);
    VAMP_LOG(INFO) << "recurrent state: " << first.recurrent_state_bytes()
                   << " bytes per request on rank 0, in the agents' memory plans outside the KV "
                      "pool; prefix-cache hits resume from snapshots of "
                   << blocks << " KV blocks each"
                   << (scheduler.enable_prefix_caching
                           ? (scheduler.snapshot_outputs ? " (at prompt and output ends)"
                                                         : " (at prompt ends)")
                           : " (prefix caching off: none are taken)");
  }
  ServingEngineOptions engine_options;
  engine_options.scheduler = scheduler;
  engine_options.arbiter = options_.arbiter;
  if (first.eos_token_id() >= 0) engine_options.eos_token_id = first.eos_token_id();
  engine_options.ranks = ranks;
  engine_options.model_name = ServedModelName();
  engine_options.vamp = options_.vamp;
  engine_options.offload_cap = options_.offload_cap;
  auto context = std::make_shared<ServingContext>();
  context->model =
      ServedModel{ServedModelName(), scheduler.max_model_len, first.vocab_size()};
  context->model.prompt_logprobs =
      std::all_of(ranks.begin(), ranks.end(),
                  [](const vamp::v1::InitResponse& r) { return r.prompt_logprobs_supported(); });
  if (tokenizer_ != nullptr) {
    const auto* hf = static_cast<const HfTokenizer*>(tokenizer_.get());
    if (hf->max_token_id() >= first.vocab_size()) {
      *permanent = true;
      return absl::InvalidArgumentError(absl::StrCat(
          "model_path: tokenizer.json has token id ", hf->max_token_id(),
          ", outside the model's vocab_size ", first.vocab_size()));
    }
    context->tokenizer = tokenizer_;
  } else {
    absl::StatusOr<std::unique_ptr<ByteTokenizer>> tokenizer =
        ByteTokenizer::Create(first.vocab_size());
    if (!tokenizer.ok()) return tokenizer.status();
    context->tokenizer = *std::move(tokenizer);
  }
  VAMP_ASSIGN_OR_RETURN(std::unique_ptr<ServingEngine> engine,
                        ServingEngine::Start(group.get(), engine_options));
  context->engine = std::move(engine);
  absl::MutexLock lock(&mu_);
  group_ = std::move(group);
  context_ = std::move(context);
  rank_memory_.clear();
  for (const auto& r : ranks) rank_memory_.push_back(r.memory());
  last_error_.clear();
  VAMP_LOG(INFO) << "serving " << context_->model.id << " with " << endpoints.size() << " agent(s)";
  return absl::OkStatus();
}

void ControllerServer::TearDown() {
  std::shared_ptr<const ServingContext> context;
  std::shared_ptr<AgentGroup> group;
  {
    absl::MutexLock lock(&mu_);
    context = std::move(context_);
    group = std::move(group_);
  }
  if (context != nullptr) context->engine->Stop();
  // The group goes only after the engine stopped using it; requests still holding the context
  // keep the (stopped) engine alive until they end.
}

std::string ControllerServer::ServedModelName() const {
  const std::string& name = options_.served_model_name;
  if (!name.empty()) return name;
  std::string path = options_.model_path;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return base.empty() ? "vamp-model" : base;
}

std::string ControllerServer::MetricsTargetsJson(int http_port) const {
  const std::string replica = options_.replica.empty() ? HostName() : options_.replica;
  nlohmann::json controller_labels = {{"vamp_role", "controller"}, {"replica", replica}};
  std::string controller_address;
  if (metrics_ != nullptr) {
    controller_address = DialAddress(options_.metrics_address, metrics_->port());
  } else {
    controller_address = DialAddress(options_.http.server.address, http_port);
    if (!options_.http.server.tls_cert_file.empty()) controller_labels["__scheme__"] = "https";
  }
  nlohmann::json groups = nlohmann::json::array();
  groups.push_back({{"targets", {controller_address}}, {"labels", controller_labels}});
  for (const AgentRegistry::MetricsTarget& t : registry_->MetricsTargets()) {
    groups.push_back(
        {{"targets", {t.address}},
         {"labels",
          {{"vamp_role", "agent"}, {"rank", std::to_string(t.rank)}, {"replica", replica}}}});
  }
  return groups.dump();
}

absl::Status ControllerServer::WriteMetricsTargetsFile() {
  if (options_.metrics_targets_file.empty() || !targets_file_ready_.load()) {
    return absl::OkStatus();
  }
  absl::MutexLock lock(&targets_file_mu_);
  return WriteFileAtomically(options_.metrics_targets_file,
                             MetricsTargetsJson(http_->port()) + "\n");
}

void ControllerServer::MarkUnreachableAgentsGone() {
  std::vector<AgentRegistry::Registration> agents = registry_->Registrations();
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const AgentRegistry::Registration& a : agents) {
    channels.push_back(grpc::CreateChannel(a.agent_address, grpc::InsecureChannelCredentials()));
    channels.back()->GetState(/*try_to_connect=*/true);  // all connect at once
  }
  // A process that exited refuses at once; a frozen one never completes the HTTP/2 handshake.
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(1);
  for (size_t i = 0; i < agents.size(); ++i) {
    if (!agents[i].gone && !channels[i]->WaitForConnected(deadline)) {
      registry_->MarkGone(agents[i].rank, agents[i].agent_address);
    }
  }
}

void ControllerServer::FillStatus(vamp::v1::GetStatusResponse* status) const {
  status->set_version(kVersion);
  status->set_model(ServedModelName());
  status->set_uptime_seconds(static_cast<double>(SteadyClock::Get().NowMicros() - start_micros_) *
                             1e-6);
  status->set_policy(options_.arbiter);
  status->set_last_error(last_error());
  for (const AgentRegistry::Registration& a : registry_->Registrations()) {
    vamp::v1::AgentEndpointStatus* agent = status->add_agents();
    agent->set_rank(a.rank);
    agent->set_agent_address(a.agent_address);
    agent->set_metrics_address(a.metrics_address);
    agent->set_gone(a.gone);
  }
  std::shared_ptr<const ServingContext> ctx = Context();
  if (ctx != nullptr) ctx->engine->Snapshot(status);
  std::shared_ptr<AgentGroup> group;
  std::vector<vamp::v1::RankMemory> from_init;
  {
    absl::MutexLock lock(&mu_);
    group = group_;
    from_init = rank_memory_;
  }
  // Live figures when the agents answer (they change with every remap), else those from Init.
  // The RPC runs without mu_ so that a slow agent never stalls the frontends.
  absl::StatusOr<std::vector<vamp::v1::GetStatsResponse>> stats =
      group != nullptr ? group->GetStats()
                       : absl::StatusOr<std::vector<vamp::v1::GetStatsResponse>>(
                             absl::UnavailableError("no agents"));
  if (stats.ok()) {
    for (const auto& r : *stats) *status->add_ranks() = r.memory();
  } else {
    for (const auto& r : from_init) *status->add_ranks() = r;
  }
}

}  // namespace vamp
