// The process supervisor behind `loco launch` (runtime/launch/supervisor.h), with real child
// processes (sh) and real signals: lines relayed in order, exits decoded, a stop that escalates to
// SIGKILL for a child that ignores it, the last lines of a child drained after it exited, and an
// island's CPU share (root only).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "loco/runtime/launch/cpu_shares.h"
#include "loco/runtime/launch/supervisor.h"

namespace loco::runtime {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> shell(const std::string& script) { return {"/bin/sh", "-c", script}; }

// Runs the supervisor's loop until every child exited or `limit` passed; returns the lines read.
std::vector<ChildLine> run_until_done(Supervisor& s, std::vector<ChildExit>& exits, std::chrono::seconds limit) {
  std::vector<ChildLine> lines;
  const auto end = std::chrono::steady_clock::now() + limit;
  while (s.alive() > 0 && std::chrono::steady_clock::now() < end) {
    for (auto& line : s.read(50ms)) lines.push_back(std::move(line));
    for (const auto& e : s.reap()) exits.push_back(e);
    s.kill_when_overdue();
  }
  for (auto& line : s.drain()) lines.push_back(std::move(line));
  return lines;
}

TEST(SupervisorTest, RelaysEachChildsLinesAndDecodesItsExit) {
  Supervisor s(2, 10s);
  s.start(0, shell("echo one; echo two >&2; printf 'no newline at the end'; exit 3"));
  s.start(1, shell("kill -TERM $$"));
  std::vector<ChildExit> exits;
  const auto lines = run_until_done(s, exits, 20s);
  ASSERT_EQ(exits.size(), 2u);
  for (const auto& e : exits) EXPECT_EQ(e.code, e.rank == 0 ? 3 : 128 + SIGTERM) << "rank " << e.rank;
  std::vector<std::string> out, err;
  for (const auto& line : lines) {
    ASSERT_EQ(line.rank, 0);
    (line.is_stdout ? out : err).push_back(line.text);
  }
  EXPECT_EQ(out, (std::vector<std::string>{"one", "no newline at the end"}));
  EXPECT_EQ(err, (std::vector<std::string>{"two"}));
  const auto codes = s.exit_codes();
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_EQ(codes[0], 3);
  EXPECT_EQ(codes[1], 128 + SIGTERM);
}

// Secrets reach a child through its environment, not its command line (`ps` shows argv to every
// local user): the child sees the variable, and its /proc/PID/cmdline does not hold the value.
TEST(SupervisorTest, AChildGetsThePlacementsEnvironmentAndNotInItsArgv) {
  Supervisor s(1, 10s);
  Placement placement;
  placement.environment = {{"LOCO_JOIN_TOKEN", "the-secret-value"}};
  s.start(0, shell("echo \"token=$LOCO_JOIN_TOKEN\"; tr '\\0' ' ' < /proc/$$/cmdline; echo"), placement);
  std::vector<ChildExit> exits;
  const auto lines = run_until_done(s, exits, 20s);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].code, 0);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].text, "token=the-secret-value");
  EXPECT_EQ(lines[1].text.find("the-secret-value"), std::string::npos) << lines[1].text;
  EXPECT_EQ(std::getenv("LOCO_JOIN_TOKEN"), nullptr) << "the launcher's own environment is left alone";
}

// The first Ctrl-C asks every child to stop (SIGINT); one that ignores it is killed once the grace
// has passed, and a second Ctrl-C kills at once.
TEST(SupervisorTest, AStopEscalatesToSigkillAfterTheGrace) {
  Supervisor s(2, 1s);
  s.start(0, shell("trap 'echo stopping; exit 130' INT; echo ready; while :; do sleep 0.05; done"));
  s.start(1, shell("trap '' INT; echo ready; while :; do sleep 0.05; done"));
  int ready = 0;
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (ready < 2 && std::chrono::steady_clock::now() < until) {
    for (const auto& line : s.read(50ms)) ready += line.text == "ready";
  }
  ASSERT_EQ(ready, 2);
  EXPECT_TRUE(s.interrupt(1));
  EXPECT_FALSE(s.interrupt(1)) << "the same count again is no new Ctrl-C";
  EXPECT_TRUE(s.stopping());
  std::vector<ChildExit> exits;
  const auto start = std::chrono::steady_clock::now();
  const auto lines = run_until_done(s, exits, 20s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(exits.size(), 2u);
  for (const auto& e : exits) EXPECT_EQ(e.code, e.rank == 0 ? 130 : 128 + SIGKILL) << "rank " << e.rank;
  EXPECT_GE(took, 0.9) << "the child that ignored SIGINT was killed before its grace";
  EXPECT_LT(took, 10.0);
  bool said = false;
  for (const auto& line : lines) said = said || (line.rank == 0 && line.text == "stopping");
  EXPECT_TRUE(said) << "the stopping child's last line was lost";

  Supervisor again(1, 60s);
  again.start(0, shell("trap '' INT; while :; do sleep 0.05; done"));
  std::this_thread::sleep_for(200ms);
  again.interrupt(1);
  again.interrupt(2);  // a second Ctrl-C: killed now, not after the minute's grace
  exits.clear();
  run_until_done(again, exits, 10s);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].code, 128 + SIGKILL);
}

// No child outlives its supervisor.
TEST(SupervisorTest, DestroyingItKillsAndReapsItsChildren) {
  pid_t pid = -1;
  {
    Supervisor s(1, 60s);
    pid = s.start(0, shell("while :; do sleep 0.05; done"));
    EXPECT_EQ(::kill(pid, 0), 0);
  }
  EXPECT_EQ(::kill(pid, 0), -1) << "the child still exists (killed but not reaped, or alive)";
}

TEST(SupervisorTest, AProgramThatCannotStartExits127AndSaysWhy) {
  Supervisor s(1, 10s);
  s.start(0, {"/nonexistent/loco-test-program"});
  std::vector<ChildExit> exits;
  const auto lines = run_until_done(s, exits, 20s);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].code, 127);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().text.find("cannot run /nonexistent/loco-test-program"), std::string::npos) << lines.back().text;
}

// CPU seconds a process has used (utime + stime of /proc/PID/stat).
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// An island's CPU share caps what its processes use: a busy loop in a 0.2-core group uses about a
// fifth of the time that passes (and one beside it, in no group, all of a core).
TEST(SupervisorTest, AChildInACpuShareGetsThatShare) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make CPU control groups";
  CpuShares shares({0.2, 0});
  ASSERT_FALSE(shares.procs_file(0).empty());
  EXPECT_TRUE(shares.procs_file(1).empty());
  Supervisor s(2, 5s);
  const pid_t capped = s.start(0, shell("while :; do :; done"), {-1, shares.procs_file(0)});
  const pid_t free = s.start(1, shell("while :; do :; done"), {-1, shares.procs_file(1)});
  std::this_thread::sleep_for(2s);
  const double capped_s = cpu_seconds(capped), free_s = cpu_seconds(free);
  s.kill_all();
  std::vector<ChildExit> exits;
  run_until_done(s, exits, 10s);
  EXPECT_GT(capped_s, 0.15);
  EXPECT_LT(capped_s, 0.6) << "2 s at 0.2 of a core is 0.4 s";
  EXPECT_GT(free_s, 2 * capped_s);
}

}  // namespace
}  // namespace loco::runtime
