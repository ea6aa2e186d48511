// Emulated WAN islands (runtime/launch/islands.h): link specs, the measured rate and delay across
// real network namespaces, their removal on every way a launcher can end, and `loco launch --link`
// end to end. The namespace tests need root (CAP_SYS_ADMIN, CAP_NET_ADMIN), as `--link` does;
// CI runs as root, and they say so when skipped elsewhere.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "cli_util.h"
#include "loco/core/error.h"
#include "loco/core/run_folder.h"
#include "loco/metrics/events.h"
#include "loco/runtime/launch/islands.h"
#include "loco/runtime/launch/link_check.h"
#include "process_util.h"
#include "test_util.h"

namespace loco::runtime {
namespace {

using testing_util::Child;
using testing_util::processes_mentioning;
using testing_util::run_command;
using testing_util::TempDir;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

bool privileged() {
  try {
    check_network_privileges();
    return true;
  } catch (const Error&) {
    return false;
  }
}

#define LOCO_NEEDS_ROOT() \
  if (!privileged()) GTEST_SKIP() << "needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to create network namespaces"

// The network namespace inode of a descriptor or a /proc path ("net:[INODE]").
ino_t namespace_inode(const std::string& path) {
  struct stat s {};
  return ::stat(path.c_str(), &s) == 0 ? s.st_ino : 0;
}

// Every process on the machine that is in, or holds a descriptor of, one of these namespaces.
std::vector<std::string> holders_of(const std::set<ino_t>& namespaces) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code ec;
    if (namespaces.count(namespace_inode(entry.path() / "ns/net"))) out.push_back(pid + " (in it)");
    for (const auto& fd : fs::directory_iterator(entry.path() / "fd", ec)) {
      const auto target = fs::read_symlink(fd.path(), ec).string();
      if (target.rfind("net:[", 0) == 0 && namespaces.count(namespace_inode(fd.path().string()))) out.push_back(pid + " (a descriptor)");
    }
  }
  return out;
}

TEST(LinkSpecTest, ParsesRatesAndDelaysInTcsUnits) {
  const auto spec = LinkSpec::parse("rate=100mbit,delay=50ms");
  EXPECT_DOUBLE_EQ(spec.rate_bps, 100e6);
  EXPECT_DOUBLE_EQ(spec.delay_s, 0.05);
  EXPECT_DOUBLE_EQ(LinkSpec::parse("rate=1gbit").rate_bps, 1e9);
  EXPECT_DOUBLE_EQ(LinkSpec::parse("rate=12.5mbps").rate_bps, 100e6);  // bytes per second, as tc reads "mbps"
  EXPECT_DOUBLE_EQ(LinkSpec::parse("rate=64kbit").rate_bps, 64e3);
  EXPECT_DOUBLE_EQ(LinkSpec::parse("delay=250us").delay_s, 250e-6);
  EXPECT_DOUBLE_EQ(LinkSpec::parse("delay=0.2s").delay_s, 0.2);
  EXPECT_EQ(LinkSpec::parse("rate=100mbit,delay=50ms").describe(), "100 Mbit/s, 50 ms one-way");
  EXPECT_DOUBLE_EQ(LinkSpec::parse("rate=1gbit,cpu=0.45").cpu, 0.45);
  EXPECT_EQ(LinkSpec::parse("delay=50ms,cpu=0.5").describe(), "rate not shaped, 50 ms one-way, 0.5 of a core");
  for (const std::string bad : {"rate=100", "rate=fast", "rate=-1mbit", "delay=50", "speed=1gbit", "rate=100mbit;delay=5ms",
                                "rate=1bit", "rate=101gbit", "rate=1e30bit", "delay=1h", "delay=20s", "", "cpu=0", "cpu=lots", "cpu=0.5cores", "cpu=2000"}) {
    EXPECT_THROW(LinkSpec::parse(bad), ConfigError) << bad;
  }
  try {
    LinkSpec::parse("rate=100mbit,delay=50");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("link delay '50' is not a number with a unit"), std::string::npos) << e.what();
  }
}

TEST(LinkSpecTest, PlansGiveEachWorkerTheDefaultUnlessItsOwnKeysSayOtherwise) {
  const auto plan = LinkPlan::parse({"worker=2,delay=200ms", "rate=100mbit,delay=50ms", "worker=1,rate=10mbit"}, 4);
  EXPECT_TRUE(plan.enabled);
  EXPECT_EQ(plan.all, LinkSpec::parse("rate=100mbit,delay=50ms"));
  EXPECT_EQ(plan.for_worker(0), plan.all);
  EXPECT_EQ(plan.for_worker(1), LinkSpec::parse("rate=10mbit,delay=50ms"));
  EXPECT_EQ(plan.for_worker(2), LinkSpec::parse("rate=100mbit,delay=200ms"));
  EXPECT_FALSE(LinkPlan::parse({}, 4).enabled);
  EXPECT_THROW(LinkPlan::parse({"worker=4,rate=1mbit"}, 4), ConfigError);
  EXPECT_THROW(LinkPlan::parse({"worker=x,rate=1mbit"}, 4), ConfigError);

  // The config's [link] section, with the command line over it.
  LinkSection section;
  section.rate = "1gbit";
  section.delay = "50ms";
  section.workers = "3:rate=10mbit;0:delay=5ms";
  const auto from_config = LinkPlan::from_config(section, {"rate=100mbit"}, 4);
  EXPECT_EQ(from_config.all, LinkSpec::parse("rate=100mbit,delay=50ms"));
  EXPECT_EQ(from_config.for_worker(3), LinkSpec::parse("rate=10mbit,delay=50ms"));
  // A worker's keys over the final default: the command line's rate reaches worker 0 too.
  EXPECT_EQ(from_config.for_worker(0), LinkSpec::parse("rate=100mbit,delay=5ms"));
  section.cpu = 0.45;  // every worker island's CPU share, unless a worker's own keys set another
  const auto with_cpu = LinkPlan::from_config(section, {"worker=1,cpu=0.9"}, 4);
  EXPECT_DOUBLE_EQ(with_cpu.for_worker(0).cpu, 0.45);
  EXPECT_DOUBLE_EQ(with_cpu.for_worker(3).cpu, 0.45);
  EXPECT_DOUBLE_EQ(with_cpu.for_worker(1).cpu, 0.9);
  section.workers = "3=rate=10mbit";
  EXPECT_THROW(LinkPlan::from_config(section, {}, 4), ConfigError);
  EXPECT_FALSE(LinkPlan::from_config(LinkSection{}, {}, 4).enabled);
}

TEST(IslandsTest, ShapedLinkCarriesItsRate) {
  LOCO_NEEDS_ROOT();
  const LinkSpec link = LinkSpec::parse("rate=50mbit");
  Islands islands({link, link});
  // Four seconds at the rate, timed past TCP's slow start. tbf counts whole Ethernet frames, so TCP's
  // payload gets 1448 of every 1514 bytes (95.6%): on an idle machine within 10% of the rate, as the
  // issue asks (`loco link-check` measures it: docs/slow-links.md). Here the bound below is 25%:
  // with the suite's other tests on both cores the sender itself fell 11% behind once (44.3 of 50
  // Mbit/s). What this checks is the shaping: never faster than the link, and about its rate.
  const auto m = measure_link(islands, 1, 0, static_cast<int64_t>(link.rate_bps / 8 * 4));
  EXPECT_GT(m.rate_bps, 0.75 * link.rate_bps);
  EXPECT_LT(m.rate_bps, link.rate_bps * 1.01) << "faster than the link: not shaped";
  // Both directions are shaped: the download of island 1 too.
  const auto back = measure_link(islands, 0, 1, static_cast<int64_t>(link.rate_bps / 8 * 2));
  EXPECT_GT(back.rate_bps, 0.75 * link.rate_bps);
  EXPECT_LT(back.rate_bps, link.rate_bps * 1.01) << "faster than the link: not shaped";
  EXPECT_EQ(islands.frames_dropped(), 0);
}

// The relay is one thread carrying every island's frames: four transfers at once, each on its own
// shaped link with a delay, must each still get the rate, and lose no frame to the relay's queue.
// At 50 Mbit/s each, so that what is checked is the relay's sharing and shaping: at 200 Mbit/s
// each (800 in all through one thread, and the senders and receivers on the same 2 cores) a
// fresh-clone suite once measured 140-153 of the 200, the machine's speed rather than the relay's
// behaviour (its capacity is a benchmark's matter: bench/results/relay.txt).
TEST(IslandsTest, TheRelayCarriesFourFlowsAtOnceEachAtItsRate) {
  LOCO_NEEDS_ROOT();
  const LinkSpec link = LinkSpec::parse("rate=50mbit,delay=10ms");
  Islands islands({link, link, link, link});
  const auto flows = measure_links(islands, {{0, 1}, {1, 2}, {2, 3}, {3, 0}}, static_cast<int64_t>(link.rate_bps / 8 * 3));
  ASSERT_EQ(flows.size(), 4u);
  for (size_t i = 0; i < flows.size(); ++i) {
    // As for one link (ShapedLinkCarriesItsRate): never faster than the link, and about its rate.
    EXPECT_GT(flows[i].rate_bps, 0.75 * link.rate_bps) << "flow " << i;
    EXPECT_LT(flows[i].rate_bps, 1.01 * link.rate_bps) << "flow " << i << ": faster than the link, not shaped";
    EXPECT_NEAR(flows[i].round_trip_s, 0.020, 0.005) << "flow " << i;
  }
  EXPECT_EQ(islands.frames_dropped(), 0);
  EXPECT_GT(islands.frames_relayed(), 0);
}

TEST(IslandsTest, RoundTripIsTwiceTheDelayAndASlowIslandIsSlowToEveryone) {
  LOCO_NEEDS_ROOT();
  Islands islands({LinkSpec::parse("delay=50ms"), LinkSpec::parse("delay=50ms"), LinkSpec::parse("rate=5mbit,delay=150ms")});
  const auto fast = measure_link(islands, 0, 1, 1 << 20);
  EXPECT_NEAR(fast.round_trip_s, 0.100, 0.010);
  // Island 2's one-way delay to the others is (50 + 150) / 2 ms; its link is also the narrow one.
  const auto slow = measure_link(islands, 2, 0, 2 << 20);
  EXPECT_NEAR(slow.round_trip_s, 0.200, 0.020);
  EXPECT_NEAR(slow.rate_bps, 5e6, 0.5e6);
}

// A cut link carries nothing, silently (the chaos soak's island outage): a transfer started while
// island 1 is cut waits, and completes once the link is restored.
TEST(IslandsTest, ACutLinkCarriesNothingUntilItIsRestored) {
  LOCO_NEEDS_ROOT();
  Islands islands({LinkSpec::parse("delay=5ms"), LinkSpec::parse("delay=5ms")});
  islands.set_cut(1, true);
  EXPECT_TRUE(islands.cut(1));
  auto transfer = std::async(std::launch::async, [&] { return measure_link(islands, 0, 1, 1 << 20, 2); });
  EXPECT_EQ(transfer.wait_for(2s), std::future_status::timeout) << "a transfer crossed a cut link";
  const int64_t cut = islands.frames_cut();
  EXPECT_GT(cut, 0) << "the connection's SYNs were not dropped";
  EXPECT_EQ(islands.frames_relayed(), 0);
  islands.set_cut(1, false);
  ASSERT_EQ(transfer.wait_for(30s), std::future_status::ready) << "the transfer did not resume after the link was restored";
  const auto m = transfer.get();
  EXPECT_GT(m.rate_bps, 0);
  EXPECT_GT(islands.frames_relayed(), 0);
  EXPECT_EQ(islands.frames_cut(), cut) << "frames were dropped after the link was restored";
}

TEST(IslandsTest, NamespacesGoWithTheirDescriptorsAndSpawnedProcessesLiveInThem) {
  LOCO_NEEDS_ROOT();
  std::set<ino_t> namespaces;
  {
    Islands islands({LinkSpec{}, LinkSpec{}});
    for (size_t i = 0; i < islands.size(); ++i) namespaces.insert(namespace_inode(fmt::format("/proc/self/fd/{}", islands.netns_fd(i))));
    ASSERT_EQ(namespaces.size(), 2u);
    EXPECT_FALSE(namespaces.count(namespace_inode("/proc/self/ns/net"))) << "the islands are not this process's own network";
    EXPECT_FALSE(holders_of(namespaces).empty());
    EXPECT_EQ(islands.address(0), "10.77.0.1");
    EXPECT_EQ(islands.address(1), "10.77.0.2");
    // The host's own interfaces see nothing of the islands.
    TempDir dir;
    auto host = run_command({"/usr/sbin/ip", "-o", "addr"}, (dir.path() / "ip.log").string(), 30s);
    EXPECT_EQ(host.output.find("10.77."), std::string::npos) << host.output;
  }
  EXPECT_EQ(holders_of(namespaces), std::vector<std::string>{}) << "an island outlived its Islands";
}

// Sixteen islands (bench/wan-scale.sh's largest set): set up, each carrying a flow to the next at
// once through the one relay, and gone with their Islands. The rates of many flows at once are
// benchmarked (bench/results/relay.txt), not timed here: the suite shares the machine's cores.
TEST(IslandsTest, SixteenIslandsAreSetUpCarryFlowsAtOnceAndAreTornDownCleanly) {
  LOCO_NEEDS_ROOT();
  std::set<ino_t> namespaces;
  {
    const LinkSpec link = LinkSpec::parse("rate=100mbit,delay=10ms");
    Islands islands(std::vector<LinkSpec>(16, link));
    ASSERT_EQ(islands.size(), 16u);
    EXPECT_EQ(islands.address(15), "10.77.0.16");
    for (size_t i = 0; i < islands.size(); ++i) namespaces.insert(namespace_inode(fmt::format("/proc/self/fd/{}", islands.netns_fd(i))));
    EXPECT_EQ(namespaces.size(), 16u);
    std::vector<std::pair<size_t, size_t>> ring;
    for (size_t i = 0; i < 16; ++i) ring.emplace_back(i, (i + 1) % 16);
    // 8 MB a flow: the rate is timed over the last 6 MB, of which tbf's 96 KiB burst can pass
    // at once (1.6%; with 1 MB flows a fresh run measured 3.4-4.9% over the rate).
    const auto flows = measure_links(islands, ring, 8 << 20, 5);
    ASSERT_EQ(flows.size(), 16u);
    for (size_t i = 0; i < flows.size(); ++i) {
      EXPECT_NEAR(flows[i].round_trip_s, 0.020, 0.015) << "flow " << i;
      EXPECT_GT(flows[i].rate_bps, 0) << "flow " << i;
      EXPECT_LT(flows[i].rate_bps, link.rate_bps * 1.03) << "flow " << i << " faster than its link: not shaped";
    }
    EXPECT_EQ(islands.relay_error(), "");
  }
  EXPECT_EQ(holders_of(namespaces), std::vector<std::string>{}) << "an island outlived its Islands";
}

TEST(IslandsTest, WithoutPrivilegesTheErrorSaysWhatIsNeeded) {
  TempDir dir;
  auto result = run_command({"/usr/bin/setpriv", "--bounding-set", "-sys_admin,-net_admin", "--", testing_util::loco_binary(), "link-check",
                             "--link", "rate=10mbit"},
                            (dir.path() / "out.log").string(), 60s);
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find("emulated links need root"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("CAP_NET_ADMIN"), std::string::npos) << result.output;
}

class LaunchLinksTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir_->path(), dir_->path() / "data"));
    std::ofstream(dir_->path() / "tiny.toml") << testing_util::tiny_launch_config(2, R"([link]
rate = "20mbit"
delay = "20ms"
)");
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override { LOCO_NEEDS_ROOT(); }
  void TearDown() override {
    EXPECT_TRUE(processes_mentioning(dir_->path().string()).empty()) << "a loco process outlived its test";
  }
  static std::vector<std::string> launch_args(const std::string& name, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {testing_util::loco_binary(), "launch", "--config", (dir_->path() / "tiny.toml").string(),
                                     "--data.dir=" + (dir_->path() / "data").string(),
                                     "--run.dir=" + (dir_->path() / name).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  static std::string log(const std::string& name) { return (dir_->path() / (name + ".log")).string(); }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // The network namespaces of the run's worker processes, once both are training.
  static std::set<ino_t> worker_namespaces(const std::string& name, const std::string& log_path) {
    std::set<ino_t> out;
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (std::chrono::steady_clock::now() < deadline && read(log_path).find("step 5/40") == std::string::npos) {
      std::this_thread::sleep_for(50ms);
    }
    for (pid_t pid : processes_mentioning((dir_->path() / name).string())) {
      const auto text = read(fmt::format("/proc/{}/cmdline", pid));
      if (text.find(std::string("worker") + '\0') != std::string::npos) out.insert(namespace_inode(fmt::format("/proc/{}/ns/net", pid)));
    }
    return out;
  }
  static TempDir* dir_;
};
TempDir* LaunchLinksTest::dir_ = nullptr;

TEST_F(LaunchLinksTest, RunTrainsAcrossIslandsAndLeavesNothingBehind) {
  Child launcher(launch_args("run", {"--link", "worker=1,delay=40ms"}), log("run"));
  const auto islands = worker_namespaces("run", log("run"));
  EXPECT_EQ(islands.size(), 2u) << "each worker on an island of its own";
  EXPECT_FALSE(islands.count(namespace_inode("/proc/self/ns/net")));
  EXPECT_EQ(launcher.wait(240s), 0) << read(log("run"));
  const auto output = read(log("run"));
  EXPECT_NE(output.find("3 emulated islands"), std::string::npos) << output;
  EXPECT_NE(output.find("20 Mbit/s, 20 ms one-way (2 islands); 20 Mbit/s, 40 ms one-way (1 island)"), std::string::npos) << output;
  EXPECT_NE(output.find("coordinator on 10.77.0.1:"), std::string::npos) << output;
  EXPECT_NE(output.find("trained diloco with 2 workers"), std::string::npos) << output;
  EXPECT_EQ(holders_of(islands), std::vector<std::string>{});

  // Each sync carries the round trip its group measured: the link imposes 20 + 40 ms between
  // the two islands. The run's links are kept for `loco report`, which counts what each sync
  // took beyond its bytes in those round trips.
  const RunFolder run(dir_->path() / "run");
  const auto links = read(run.links().string());
  EXPECT_NE(links.find("\"delay_s\": 0.04"), std::string::npos) << links;
  int syncs = 0;
  for (const auto& [time, event] : metrics::read_events(run.metrics())) {
    if (const auto* e = std::get_if<metrics::SyncEvent>(&event)) {
      ++syncs;
      EXPECT_NEAR(e->round_trip_s, 0.060, 0.2 * 0.060) << "round " << e->round;
    }
  }
  EXPECT_GT(syncs, 0);
  const auto report = run_command({testing_util::loco_binary(), "report", run.dir().string()}, log("report"), 60s);
  EXPECT_EQ(report.status, 0) << report.output;
  EXPECT_NE(report.output.find(" RTT |"), std::string::npos) << report.output;
  std::printf("%s", report.output.c_str());  // the measured count, for the record
}

TEST_F(LaunchLinksTest, InterruptedOrKilledLauncherLeavesNoIsland) {
  for (int sig : {SIGINT, SIGKILL}) {
    const std::string name = sig == SIGINT ? "interrupted" : "killed";
    Child launcher(launch_args(name), log(name));
    const auto islands = worker_namespaces(name, log(name));
    ASSERT_EQ(islands.size(), 2u) << read(log(name));
    launcher.signal(sig);
    EXPECT_EQ(launcher.wait(120s), sig == SIGINT ? 130 : 128 + SIGKILL) << read(log(name));
    // A killed launcher's workers are told to stop (SIGTERM) by the kernel; once they have exited
    // (a process on its way out still counts), nothing holds the islands.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while ((!processes_mentioning((dir_->path() / name).string()).empty() || !holders_of(islands).empty()) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(100ms);
    }
    EXPECT_EQ(holders_of(islands), std::vector<std::string>{}) << name;
  }
}

TEST_F(LaunchLinksTest, ABitFlippedOnThePathFailsItsRoundAndTheRunGoesOn) {
  // The relay flips one bit of the first data segment of 4 KiB or more that worker 1 sends to
  // worker 0 (a piece of its outer gradient), keeping the segment's checksum valid, as an attacker
  // on the path would. The run has a join token, so its data plane is authenticated: the receiver
  // refuses the message, the round fails over as for a dead peer, and the run goes on.
  const auto result = run_command(launch_args("tampered", {"--cluster.elastic=true", "--link", "worker=1,tamper=1"}),
                                  log("tampered"), 240s);
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("the relay altered 1 frame(s)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("trained diloco with 2 workers"), std::string::npos) << result.output;
  const RunFolder run(dir_->path() / "tampered");
  double refused_at = -1, last_round_at = -1;
  int failed_rounds = 0;
  for (const auto& [time, event] : metrics::read_events(run.metrics())) {
    if (const auto* e = std::get_if<metrics::CollectiveFailedEvent>(&event)) {
      ++failed_rounds;
      if (e->error.find("failed its authenticated check") != std::string::npos) refused_at = time;
    }
    if (std::holds_alternative<metrics::RoundCompleteEvent>(event)) last_round_at = time;
  }
  ASSERT_GE(refused_at, 0) << "no worker refused the altered message";
  EXPECT_GT(last_round_at, refused_at) << "no round completed after the refusal";
  // The altered message is the only failure: an elastic round completes over a link whose
  // messages take longer than the abort hook's poll (100 ms); before a send's or a receive's wait
  // was watched rather than cut into slices (comm/gloo_group.cpp), every such round failed.
  EXPECT_EQ(failed_rounds, 1) << result.output;
}

TEST_F(LaunchLinksTest, DipacoRunsRefuseLinks) {
  auto result = run_command(launch_args("dipaco", {"--dipaco.levels=1:2,1:2", "--link", "rate=10mbit"}), log("dipaco"), 60s);
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find("not supported for DiPaCo runs"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace loco::runtime
