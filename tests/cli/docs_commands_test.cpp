// Every `build/loco ...` command in the README and docs/ (fenced code blocks), run as written from
// the source folder with LOCO_CHECK_ONLY: its flags exist, its values are in range, its config
// file exists and loads with its overrides. A command that changed under the docs fails here, by
// file and line. (Running them for real needs data, root and minutes each; this is what can rot
// silently: a renamed flag or key, a config that moved.)
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli_util.h"

namespace loco {
namespace {

namespace fs = std::filesystem;

struct DocCommand {
  std::string where;  // file:line
  std::vector<std::string> words;
};

// A shell line's words, as sh splits them: single and double quotes grouped and removed, a
// backslash escaping the next character, and nothing from a comment or a shell operator on.
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '\'' || c == '"') {
      const auto end = line.find(c, i + 1);
      word += line.substr(i + 1, end - i - 1);
      in_word = true;
      if (end == std::string::npos) break;
      i = end;
    } else if (c == '\\' && i + 1 < line.size()) {
      word += line[++i];
      in_word = true;
    } else if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(word), word.clear(), in_word = false;
    } else if ((c == '#' && !in_word) || c == '|' || c == '>' || c == '<' || c == ';' || c == '&') {
      break;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

// The variables the docs' recipes use (Slurm's, torchrun's, $HOME), as a job would set them; any other
// makes the test fail, naming it.
std::string expand_variables(const std::string& word) {
  static const std::map<std::string, std::string> kSet = {{"SLURM_NTASKS", "4"}, {"SLURM_CPUS_PER_TASK", "16"},
                                                          {"SLURM_JOB_ID", "1234"}, {"MASTER_ADDR", "node1"},
                                                          {"MASTER_PORT", "29500"}, {"HOME", "/home/someone"}};
  std::string out;
  for (size_t i = 0; i < word.size(); ++i) {
    if (word[i] != '$') {
      out += word[i];
      continue;
    }
    const bool braced = i + 1 < word.size() && word[i + 1] == '{';
    size_t end = i + 1 + (braced ? 1 : 0);
    while (end < word.size() && (std::isalnum(static_cast<unsigned char>(word[end])) != 0 || word[end] == '_')) ++end;
    const auto name = word.substr(i + 1 + (braced ? 1 : 0), end - i - 1 - (braced ? 1 : 0));
    const auto it = kSet.find(name);
    if (it == kSet.end()) {
      ADD_FAILURE() << "the docs use $" << name << ", which this test does not set";
      return word;
    }
    out += it->second;
    i = end - (braced ? 0 : 1);
  }
  return out;
}

std::vector<DocCommand> documented_commands() {
  const auto source = testing_util::source_dir();
  std::vector<fs::path> files = {source / "README.md"};
  for (const auto& entry : fs::directory_iterator(source / "docs")) {
    if (entry.path().extension() == ".md") files.push_back(entry.path());
  }
  std::vector<DocCommand> out;
  for (const auto& file : files) {
    std::ifstream in(file);
    bool fenced = false;
    std::string line, pending;
    size_t number = 0, first = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.rfind("```", 0) == 0) {
        fenced = !fenced;
        continue;
      }
      if (!fenced) continue;
      if (pending.empty()) {
        const auto start = line.find_first_not_of(' ');
        if (start == std::string::npos || line.compare(start, 11, "build/loco ") != 0) continue;
        first = number;
        line = line.substr(start);
      }
      if (!line.empty() && line.back() == '\\') {  // continued on the next line
        pending += line.substr(0, line.size() - 1) + " ";
        continue;
      }
      pending += line;
      out.push_back({fmt::format("{}:{}", fs::relative(file, source).string(), first), shell_words(pending)});
      pending.clear();
    }
  }
  return out;
}

TEST(DocsCommands, ShellWordsSplitAsShDoes) {
  EXPECT_EQ(shell_words("build/loco generate --prompt 'The quick' --x=\"a b\"  # a comment"),
            (std::vector<std::string>{"build/loco", "generate", "--prompt", "The quick", "--x=a b"}));
  EXPECT_EQ(shell_words("build/loco report runs/a > out.md"), (std::vector<std::string>{"build/loco", "report", "runs/a"}));
  EXPECT_EQ(shell_words("build/loco x a\\ b x#y #comment"), (std::vector<std::string>{"build/loco", "x", "a b", "x#y"}));
  EXPECT_EQ(expand_variables("--run.dir=runs/$SLURM_JOB_ID-${MASTER_PORT}"), "--run.dir=runs/1234-29500");
}

TEST(DocsCommands, EveryLocoCommandInTheReadmeAndDocsParsesAsWritten) {
  const auto commands = documented_commands();
  ASSERT_GE(commands.size(), 40u) << "the docs' commands were not found";
  testing_util::TempDir dir;
  size_t n = 0;
  for (const auto& c : commands) {
    std::vector<std::string> argv = {"/usr/bin/env", "-C", testing_util::source_dir().string(), "LOCO_CHECK_ONLY=1",
                                     testing_util::loco_binary()};
    for (size_t w = 1; w < c.words.size(); ++w) argv.push_back(expand_variables(c.words[w]));
    const auto result = testing_util::run_command(argv, (dir.path() / fmt::format("{}.log", n++)).string(),
                                                  std::chrono::seconds(60));
    EXPECT_EQ(result.status, 0) << c.where << ": " << fmt::format("{}", fmt::join(c.words, " ")) << "\n" << result.output;
  }
}

}  // namespace
}  // namespace loco
