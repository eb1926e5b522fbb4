// TcpCommunicator: all-reduce across ranks in threads of one process over loopback TCP (the agents
// use it across processes): bit-identical rank-order sums, and failures (mismatched collectives,
// dead peers, aborts, wrong tokens or groups) that end in errors, never hangs.
#include "engine/runner/comm/tcp_communicator.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/free_port.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

TcpCommunicatorOptions Options(int rank, int size, int port) {
  TcpCommunicatorOptions o;
  o.rank = rank;
  o.size = size;
  o.address = absl::StrCat("127.0.0.1:", port);
  o.connect_timeout_ms = 10000;
  o.io_timeout_ms = 10000;
  o.group_fingerprint = 42;
  o.auth_token = "t";
  return o;
}

// Connects `size` ranks in threads; options edited per rank by `edit`.
std::vector<absl::StatusOr<std::unique_ptr<TcpCommunicator>>> ConnectAll(
    int size, const std::function<void(TcpCommunicatorOptions&)>& edit = nullptr) {
  const int port = testing::PickFreePort();
  std::vector<std::future<absl::StatusOr<std::unique_ptr<TcpCommunicator>>>> futures;
  for (int r = size - 1; r >= 0; --r) {  // peers first: they retry until rank 0 listens
    TcpCommunicatorOptions o = Options(r, size, port);
    if (edit) edit(o);
    futures.push_back(std::async(std::launch::async, [o] { return TcpCommunicator::Connect(o); }));
  }
  std::vector<absl::StatusOr<std::unique_ptr<TcpCommunicator>>> out(size);
  for (int i = 0; i < size; ++i) out[size - 1 - i] = futures[i].get();
  return out;
}

TEST(TcpCommunicatorTest, AllReduceSumsInRankOrderOnEveryRank) {
  for (int size : {2, 3}) {
    auto comms = ConnectAll(size);
    for (auto& c : comms) ASSERT_TRUE(c.ok()) << c.status();
    const int64_t n = 100000;  // 400 KB: more than one socket buffer
    std::vector<std::vector<float>> data(size, std::vector<float>(n));
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < n; ++i) data[r][i] = std::sin(i * 0.1f + r) * 1e3f;
    }
    std::vector<std::vector<float>> want = data;
    for (int round = 0; round < 3; ++round) {
      std::vector<float> sum = want[0];
      for (int r = 1; r < size; ++r) {
        for (int64_t i = 0; i < n; ++i) sum[i] += want[r][i];
      }
      for (int r = 0; r < size; ++r) want[r] = sum;
    }
    std::vector<std::thread> threads;
    std::vector<absl::Status> status(size);
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        for (int round = 0; round < 3 && status[r].ok(); ++round) {
          status[r] = (*comms[r])->AllReduceSum(data[r].data(), n);
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(status[r].ok()) << status[r];
      EXPECT_EQ(0, std::memcmp(data[r].data(), want[0].data(), n * sizeof(float))) << r;
      EXPECT_EQ((*comms[r])->rank(), r);
      EXPECT_EQ((*comms[r])->size(), size);
    }
  }
}

TEST(TcpCommunicatorTest, MismatchedCollectivesFailOnEveryRank) {
  auto comms = ConnectAll(2);
  for (auto& c : comms) ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> a(4), b(5);
  auto f = std::async(std::launch::async, [&] { return (*comms[1])->AllReduceSum(b.data(), 5); });
  absl::Status s0 = (*comms[0])->AllReduceSum(a.data(), 4);
  absl::Status s1 = f.get();
  EXPECT_THAT(std::string(s0.message()), HasSubstr("mismatch"));
  EXPECT_THAT(std::string(s1.message()), HasSubstr("mismatch"));
  // Broken for good.
  EXPECT_FALSE((*comms[0])->AllReduceSum(a.data(), 4).ok());
}

TEST(TcpCommunicatorTest, DeadPeerAndAbortFailPromptly) {
  auto comms = ConnectAll(2);
  for (auto& c : comms) ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> a(4);
  const auto start = std::chrono::steady_clock::now();
  comms[1]->reset();  // rank 1 dies
  absl::Status s = (*comms[0])->AllReduceSum(a.data(), 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  auto more = ConnectAll(2);
  for (auto& c : more) ASSERT_TRUE(c.ok()) << c.status();
  auto waiting =
      std::async(std::launch::async, [&] { return (*more[0])->AllReduceSum(a.data(), 4); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  (*more[0])->Abort(absl::CancelledError("shutting down"));
  EXPECT_EQ(waiting.get().code(), absl::StatusCode::kCancelled);
}

TEST(TcpCommunicatorTest, OneDeadRankFailsEveryOtherRankPromptly) {
  auto comms = ConnectAll(3);
  for (auto& c : comms) ASSERT_TRUE(c.ok()) << c.status();
  comms[2]->reset();  // rank 2 dies; rank 1 waits on rank 0, which fails on rank 2
  std::vector<float> a(1000), b(1000);
  const auto start = std::chrono::steady_clock::now();
  auto f1 =
      std::async(std::launch::async, [&] { return (*comms[1])->AllReduceSum(b.data(), 1000); });
  absl::Status s0 = (*comms[0])->AllReduceSum(a.data(), 1000);
  absl::Status s1 = f1.get();
  EXPECT_FALSE(s0.ok());
  EXPECT_FALSE(s1.ok());
  // Well under the 10 s I/O timeout: failures cascade by closing connections.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST(TcpCommunicatorTest, HandshakeRefusesWrongTokenOrGroup) {
  auto wrong_token = ConnectAll(2, [](TcpCommunicatorOptions& o) {
    if (o.rank == 1) o.auth_token = "x";
  });
  ASSERT_FALSE(wrong_token[0].ok());
  EXPECT_EQ(wrong_token[0].status().code(), absl::StatusCode::kPermissionDenied);
  ASSERT_FALSE(wrong_token[1].ok());
  EXPECT_THAT(std::string(wrong_token[1].status().message()), HasSubstr("auth token"));

  auto wrong_group = ConnectAll(2, [](TcpCommunicatorOptions& o) {
    if (o.rank == 1) o.group_fingerprint = 43;
  });
  ASSERT_FALSE(wrong_group[0].ok());
  EXPECT_THAT(std::string(wrong_group[0].status().message()), HasSubstr("different InitRequest"));
  EXPECT_FALSE(wrong_group[1].ok());
}

TEST(TcpCommunicatorTest, MissingPeersAndBadAddressesFail) {
  TcpCommunicatorOptions o = Options(0, 2, testing::PickFreePort());
  o.connect_timeout_ms = 300;
  auto alone = TcpCommunicator::Connect(o);
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(alone.status().message()), HasSubstr("0 of 1 peer ranks"));

  TcpCommunicatorOptions peer = Options(1, 2, testing::PickFreePort());
  peer.connect_timeout_ms = 300;
  auto unreachable = TcpCommunicator::Connect(peer);
  EXPECT_EQ(unreachable.status().code(), absl::StatusCode::kDeadlineExceeded);

  TcpCommunicatorOptions bad = Options(1, 2, 0);
  bad.address = "no-port";
  EXPECT_THAT(std::string(TcpCommunicator::Connect(bad).status().message()),
              HasSubstr("parallel.host_transport_address"));
  bad.address = "127.0.0.1:0";
  EXPECT_FALSE(TcpCommunicator::Connect(bad).ok());
  EXPECT_FALSE(TcpCommunicator::Connect(Options(2, 2, 1)).ok());
  auto single = TcpCommunicator::Connect(Options(0, 1, 0));
  ASSERT_TRUE(single.ok());
  float x = 3;
  EXPECT_TRUE((*single)->AllReduceSum(&x, 1).ok());
  EXPECT_EQ(x, 3);
}

}  // namespace
}  // namespace vamp
