// The loco binary end to end on a tiny corpus: prepare -> train -> interrupt (SIGINT) -> resume ->
// eval -> generate, and the errors a user sees for bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "loco/core/files.h"
#include "loco/data/tokenizer.h"
#include "process_util.h"
#include "test_util.h"
#include "cli_util.h"

namespace loco {
namespace {

using testing_util::run_command;
using testing_util::TempDir;

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_NO_FATAL_FAILURE(testing_util::prepare_tiny_dataset(dir_->path(), data()));
    std::ofstream(config()) << R"([model]
context = 32
layers = 2
width = 32
heads = 2
[optim]
lr = 0.003
warmup_steps = 5
[train]
steps = 150
batch_size = 4
threads = 1
device = "cpu"
log_every = 1
[eval]
every = 50
windows = 8
[checkpoint]
every = 50
)";
  }
  static void TearDownTestSuite() { delete dir_; }

  static fs::path data() { return dir_->path() / "data"; }
  static fs::path config() { return dir_->path() / "tiny.toml"; }
  static std::string log(const std::string& name) { return (dir_->path() / (name + ".log")).string(); }
  static std::vector<std::string> train_args(const std::string& run) {
    return {testing_util::loco_binary(), "train", "--config", config().string(), "--data.dir=" + data().string(),
            "--run.dir", (dir_->path() / run).string()};
  }
  // Runs a command that must fail as bad input: exit status 1 and a message containing `fragment`.
  static void expect_refused(const std::vector<std::string>& argv, const std::string& name, const std::string& fragment) {
    const auto result = run_command(argv, log(name));
    EXPECT_EQ(result.status, 1) << result.output;
    EXPECT_NE(result.output.find(fragment), std::string::npos) << result.output;
  }
  static std::vector<double> losses(const std::string& run) {
    std::vector<double> out;
    std::ifstream in(dir_->path() / run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["event"] == "train") out.push_back(j["loss"].get<double>());
    }
    return out;
  }
  static size_t count_events(const std::string& run, const std::string& kind) {
    size_t n = 0;
    std::ifstream in(dir_->path() / run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) n += nlohmann::json::parse(line)["event"] == kind;
    return n;
  }

  static TempDir* dir_;
};
TempDir* CliTest::dir_ = nullptr;

TEST_F(CliTest, PrepareWritesManifest) {
  auto manifest = nlohmann::json::parse(read_file(data() / "manifest.json", "test"));
  EXPECT_EQ(manifest["vocab_size"], 320);
  EXPECT_GT(manifest["val_unigram_entropy"].get<double>(), 1.0);
}

TEST_F(CliTest, InterruptedRunResumesToTheSameLosses) {
  auto straight = run_command(train_args("straight"), log("straight"));
  ASSERT_EQ(straight.status, 0) << straight.output;
  EXPECT_NE(straight.output.find("val_unigram_entropy"), std::string::npos) << straight.output;
  // A finished run says what to do next (report, eval, generate), each a command that runs as printed.
  int steps = 0;
  for (size_t at = straight.output.find("next: "); at != std::string::npos; at = straight.output.find("next: ", at + 1)) {
    const auto next = testing_util::printed_command(straight.output.substr(at), "next: ");
    ASSERT_GE(next.size(), 2u);
    auto ran = run_command(next, log("next-" + next[1]));
    EXPECT_EQ(ran.status, 0) << straight.output.substr(at, 120) << "\n" << ran.output;
    ++steps;
  }
  EXPECT_EQ(steps, 3) << straight.output;
  // The same command again: the run finished, and it says so, and where (issue #68).
  auto again = run_command(train_args("straight"), log("straight-again"));
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("finished already"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find((dir_->path() / "straight" / "checkpoints").string()), std::string::npos) << again.output;
  // The default model (GELU) cannot be written in Hugging Face's Llama format: the refusal says
  // which options make one that can.
  expect_refused({testing_util::loco_binary(), "export", "--checkpoint", (dir_->path() / "straight").string(), "--hf",
                  (dir_->path() / "straight-hf").string()},
                 "export-gelu", "hint: train with --model.norm=rmsnorm --model.position=rope --model.mlp=swiglu");

  // Freeze the run once it has logged a few steps, queue a SIGINT, let it go: it finishes the step
  // in flight, checkpoints and exits 130. (SIGSTOP first makes the interruption land mid-run for sure.)
  testing_util::Child child(train_args("interrupted"), log("interrupted"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (count_events("interrupted", "train") < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  child.signal(SIGSTOP);
  const size_t logged = count_events("interrupted", "train");
  ASSERT_GE(logged, 3u);
  ASSERT_LT(logged, 150u) << "the run finished before it could be interrupted";
  child.signal(SIGINT);
  child.signal(SIGCONT);
  ASSERT_EQ(child.wait(std::chrono::seconds(120)), 130) << read_file(log("interrupted"), "test");
  const size_t stopped_at = losses("interrupted").size();
  EXPECT_LT(stopped_at, 150u);

  // The hint, run as printed, needs nothing but the run folder.
  const auto hint = testing_util::printed_command(read_file(log("interrupted"), "test"), "continue with: ");
  ASSERT_EQ(hint, (std::vector<std::string>{testing_util::loco_binary(), "train", "--resume",
                                            "--run.dir=" + (dir_->path() / "interrupted").string()}))
      << read_file(log("interrupted"), "test");
  auto resumed = run_command(hint, log("resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("at step {}", stopped_at)), std::string::npos) << resumed.output;
  EXPECT_EQ(losses("interrupted"), losses("straight")) << "resumed run must log bit-identical losses";
  // Without --config: only --resume with a run folder that holds a run's config will do.
  expect_refused({testing_util::loco_binary(), "train", "--train.steps=5"}, "no-config", "--config is required");
  expect_refused({testing_util::loco_binary(), "launch", "--resume", "--run.dir=" + (dir_->path() / "nothing-here").string()},
                 "no-saved-config", "no run was started there");
}

// A command line CLI11 cannot parse is bad input like any other: exit status 1 (not CLI11's own
// 105, 106, ...), with the message naming the option; --help is no error.
TEST_F(CliTest, CommandLineErrorsExitWithStatusOne) {
  expect_refused({testing_util::loco_binary(), "launch", "--config", config().string(), "--workers", "many"}, "bad-number",
                 "--workers");
  expect_refused({testing_util::loco_binary()}, "no-command", "subcommand");
  expect_refused({testing_util::loco_binary(), "prepare", "--vocab-size", "1024"}, "missing-option", "--corpus");
  EXPECT_EQ(run_command({testing_util::loco_binary(), "train", "--help"}, log("help")).status, 0);
}

TEST_F(CliTest, EvalAndGenerate) {
  auto trained = run_command(train_args("for-eval"), log("for-eval"));
  ASSERT_EQ(trained.status, 0) << trained.output;
  const auto run = (dir_->path() / "for-eval").string();
  auto eval = run_command({testing_util::loco_binary(), "eval", "--checkpoint", run}, log("eval"));
  ASSERT_EQ(eval.status, 0) << eval.output;
  EXPECT_NE(eval.output.find("val_loss"), std::string::npos);
  EXPECT_NE(eval.output.find("(step 150)"), std::string::npos) << eval.output;

  auto gen = run_command({testing_util::loco_binary(), "generate", "--checkpoint", run, "--prompt", "the cat", "--max-new-tokens",
                          "12", "--seed", "3"}, log("generate"));
  ASSERT_EQ(gen.status, 0) << gen.output;
  EXPECT_EQ(gen.output.rfind("the cat", 0), 0u) << gen.output;
  EXPECT_GT(gen.output.size(), std::string("the cat\n").size());
  auto again = run_command({testing_util::loco_binary(), "generate", "--checkpoint", run, "--prompt", "the cat", "--max-new-tokens",
                            "12", "--seed", "3"}, log("generate2"));
  EXPECT_EQ(again.output, gen.output) << "same seed, same text";
}

TEST_F(CliTest, DatasetWithAnotherTokenizerIsRefused) {
  auto trained = run_command(train_args("for-mismatch"), log("for-mismatch"));
  ASSERT_EQ(trained.status, 0) << trained.output;
  const auto other = (dir_->path() / "other-data").string();
  auto prepared = run_command({testing_util::loco_binary(), "prepare", "--corpus", (dir_->path() / "corpus").string(), "--out", other,
                               "--vocab-size", "300"}, log("other-prepare"));
  ASSERT_EQ(prepared.status, 0) << prepared.output;
  const auto run = (dir_->path() / "for-mismatch").string();
  expect_refused({testing_util::loco_binary(), "eval", "--checkpoint", run, "--data", other}, "mismatch-eval", "was trained with tokenizer");
  expect_refused({testing_util::loco_binary(), "generate", "--checkpoint", run, "--data", other}, "mismatch-gen", "was trained with tokenizer");
}

TEST_F(CliTest, ConfigurationDocsListEveryKey) {
  // docs/configuration.md embeds `loco config --reference`; this keeps the two from drifting.
  auto reference = run_command({testing_util::loco_binary(), "config", "--reference"}, log("reference"));
  ASSERT_EQ(reference.status, 0);
  const auto docs = read_file(testing_util::source_dir() / "docs" / "configuration.md", "test");
  EXPECT_NE(docs.find(reference.output), std::string::npos)
      << "docs/configuration.md is out of date: paste the output of `loco config --reference` into it";
}

TEST_F(CliTest, BadInputGetsClearErrors) {
  expect_refused({testing_util::loco_binary(), "prepare", "--corpus", "no-such-corpus", "--out", (dir_->path() / "x").string()}, "bad1",
                 "unknown corpus 'no-such-corpus'");

  auto args = train_args("bad-key");
  args.push_back("--train.stpes=3");
  expect_refused(args, "bad2", "did you mean 'train.steps'");
  EXPECT_FALSE(fs::exists(dir_->path() / "bad-key")) << "nothing may be written for an invalid config";

  expect_refused({testing_util::loco_binary(), "eval", "--checkpoint", (dir_->path() / "nothing-here").string()}, "bad3", "nothing-here");

  auto no_command = run_command({testing_util::loco_binary()}, log("bad4"));
  EXPECT_NE(no_command.status, 0);
}

// DiPaCo's plan: `loco plan` prints the modules and paths of a config's levels (the vocabulary
// taken from the dataset, as training would), and the training commands refuse dipaco.levels,
// which this version plans but does not train, writing nothing.
TEST_F(CliTest, PlanPrintsTheModulesAndTrainingRefusesWhatItCannotTrain) {
  const std::string data_dir = "--data.dir=" + data().string();
  auto plan = run_command({testing_util::loco_binary(), "plan", "--config", config().string(), data_dir, "--dipaco.levels=1:2,1:3"}, log("plan"));
  EXPECT_EQ(plan.status, 0) << plan.output;
  EXPECT_NE(plan.output.find("6 paths, 6 modules"), std::string::npos) << plan.output;
  EXPECT_NE(plan.output.find("| 2 | blocks 1 | chosen | 3 |"), std::string::npos) << plan.output;

  expect_refused({testing_util::loco_binary(), "plan", "--config", config().string(), data_dir}, "plan-dense", "sets no dipaco.levels");
  // The paper's 16x16 as docs/dipaco.md plans it: its vocabulary is given, so no dataset is read.
  auto paper = run_command({testing_util::loco_binary(), "plan", "--config",
                            (testing_util::source_dir() / "configs" / "dipaco-16x16.toml").string()}, log("plan-16x16"));
  EXPECT_EQ(paper.status, 0) << paper.output;
  EXPECT_NE(paper.output.find("256 paths"), std::string::npos) << paper.output;

  expect_refused({testing_util::loco_binary(), "plan", "--config", config().string(), data_dir, "--dipaco.levels=1:2"}, "plan-misfit",
                 "spans 1 blocks but the model has 2");

  auto args = train_args("dipaco");
  args.push_back("--dipaco.levels=1:2,1:2");
  expect_refused(args, "plan-train", "a DiPaCo run trains its paths as tasks");
  EXPECT_FALSE(fs::exists(dir_->path() / "dipaco"));
}

// DiPaCo's routing of the training documents: every path gets documents, balanced, the folder is
// written whole, a second routing refuses rather than overwrite, and product routing needs a square.
TEST_F(CliTest, RouteAssignsEveryPathItsDocumentsOnce) {
  const std::string data_dir = "--data.dir=" + data().string();
  const std::string run_dir = "--run.dir=" + (dir_->path() / "routed").string();
  std::vector<std::string> args{testing_util::loco_binary(), "route", "--config", config().string(), data_dir, run_dir, "--dipaco.levels=1:2,1:2"};
  auto routed = run_command(args, log("route"));
  ASSERT_EQ(routed.status, 0) << routed.output;
  EXPECT_NE(routed.output.find("to 4 paths (balanced k-means)"), std::string::npos) << routed.output;
  const auto paths = nlohmann::json::parse(read_file(dir_->path() / "routed" / "routing" / "paths.json", "test"));
  std::vector<int64_t> seen;
  size_t smallest = SIZE_MAX, largest = 0;
  for (const auto& p : paths["paths"]) {
    const auto docs = p["documents"].get<std::vector<int64_t>>();
    seen.insert(seen.end(), docs.begin(), docs.end());
    smallest = std::min(smallest, docs.size()), largest = std::max(largest, docs.size());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_TRUE(std::adjacent_find(seen.begin(), seen.end()) == seen.end()) << "a document routed twice";
  EXPECT_GE(smallest, 1u);
  EXPECT_LE(largest - smallest, 1u) << "balanced: path sizes differ by at most one";
  EXPECT_TRUE(fs::exists(dir_->path() / "routed" / "routing" / "router.safetensors"));
  EXPECT_TRUE(fs::exists(dir_->path() / "routed" / "routing" / "clusters.md"));

  expect_refused(args, "route-again", "already holds a routing");

  // Overlapping shards: every document in exactly 2 paths, its balanced one among them.
  auto overlapping = args;
  overlapping[5] = "--run.dir=" + (dir_->path() / "routed-top2").string();
  overlapping.push_back("--dipaco.top_n=2");
  auto top2 = run_command(overlapping, log("route-top2"));
  ASSERT_EQ(top2.status, 0) << top2.output;
  EXPECT_NE(top2.output.find("each to its 2 nearest paths"), std::string::npos) << top2.output;
  const auto paths2 = nlohmann::json::parse(read_file(dir_->path() / "routed-top2" / "routing" / "paths.json", "test"));
  std::map<int64_t, std::vector<int64_t>> routes;
  for (size_t p = 0; p < paths2["paths"].size(); ++p) {
    for (auto d : paths2["paths"][p]["documents"].get<std::vector<int64_t>>()) routes[d].push_back(static_cast<int64_t>(p));
    for (auto d : paths["paths"][p]["documents"].get<std::vector<int64_t>>()) {
      const auto docs = paths2["paths"][p]["documents"].get<std::vector<int64_t>>();
      EXPECT_NE(std::find(docs.begin(), docs.end(), d), docs.end()) << "document " << d << " left its balanced path " << p;
    }
  }
  EXPECT_EQ(routes.size(), seen.size());
  for (const auto& [doc, in] : routes) {
    EXPECT_EQ(in.size(), 2u) << "document " << doc;
    if (in.size() == 2) EXPECT_NE(in[0], in[1]);
  }

  expect_refused({testing_util::loco_binary(), "route", "--config", config().string(), data_dir,
                  "--run.dir=" + (dir_->path() / "routed-product").string(), "--dipaco.levels=1:2,1:3",
                  "--dipaco.routing=product"},
                 "route-product", "makes 6");
}


// loco tokenize: a model folder's tokenizer turns a text into the ids the library gives, each id's
// piece decodes back to its part of the text; a dataset folder's tokenizer is its own; a folder
// without a tokenizer is named.
TEST_F(CliTest, TokenizeShowsTheIdsAndPiecesOfAText) {
  const fs::path fixture = testing_util::source_dir() / "tests/data/fixtures/qwen2_tokenizer";
  const std::string text = "Hello, world! Tokenizers split text.";
  const auto r = run_command({testing_util::loco_binary(), "tokenize", "--tokenizer", fixture.string(), "--json", text},
                             log("tokenize"));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto out = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  const auto expected = data::Tokenizer::load_model_tokenizer(fixture).encode(text);
  EXPECT_EQ(out.at("ids").get<std::vector<int32_t>>(), expected);
  std::string joined;
  for (const auto& piece : out.at("pieces")) joined += piece.get<std::string>();
  EXPECT_EQ(joined, text);
  EXPECT_EQ(out.at("tokenizer").at("type"), "byte-level-bpe");
  EXPECT_EQ(out.at("tokenizer").at("eos_id"), 856);

  const auto dataset = run_command({testing_util::loco_binary(), "tokenize", "--tokenizer", data().string(), "the text"},
                                   log("tokenize-dataset"));
  ASSERT_EQ(dataset.status, 0) << dataset.output;
  EXPECT_NE(dataset.output.find("sentencepiece-bpe"), std::string::npos) << dataset.output;
  EXPECT_NE(dataset.output.find("pieces: ["), std::string::npos) << dataset.output;

  const auto none = run_command({testing_util::loco_binary(), "tokenize", "--tokenizer", dir_->path().string(), "x"},
                                log("tokenize-none"));
  EXPECT_EQ(none.status, 1);
  EXPECT_NE(none.output.find("holds neither a tokenizer.model nor a tokenizer.json"), std::string::npos) << none.output;
}

// The worked example of docs/hugging-face.md, small. A Llama-architecture model with a byte-level
// BPE tokenizer is trained a little and exported as a Hugging Face folder: the stand-in for a
// user's model. A corpus is tokenized with the folder's tokenizer; configs/llama-example.toml
// continues the model from the folder with Streaming DiLoCo (2 workers); loco export --hf hands it
// back with its tokenizer.
TEST_F(CliTest, TheLlamaExampleContinuesAHuggingFaceModelWithStreamingDiLoCo) {
  const fs::path dir = dir_->path() / "llama";
  const fs::path fixture = testing_util::source_dir() / "tests/data/fixtures/qwen2_tokenizer";
  const std::string example = (testing_util::source_dir() / "configs/llama-example.toml").string();
  auto command = [&](std::vector<std::string> args, const std::string& name) {
    if (args[1] == "train" || args[1] == "launch") {
      for (const char* small : {"--model.context=32", "--model.width=32", "--model.heads=4", "--model.kv_heads=2",
                                "--model.mlp_hidden=48", "--train.batch_size=4", "--train.device=cpu",
                                "--train.steps=20", "--train.log_every=1", "--eval.every=10", "--eval.windows=8",
                                "--checkpoint.every=10", "--cluster.timeout_s=20", "--cluster.join_timeout_s=30"}) {
        args.push_back(small);
      }
    }
    const auto result = run_command(args, log("llama-" + name));
    EXPECT_EQ(result.status, 0) << result.output;
    return result.status == 0;
  };
  ASSERT_TRUE(command({testing_util::loco_binary(), "prepare", "--corpus", (dir_->path() / "corpus").string(), "--tokenizer",
                       fixture.string(), "--out", (dir / "base-data").string()}, "prepare-base"));
  ASSERT_TRUE(command({testing_util::loco_binary(), "train", "--config", example, "--data.dir=" + (dir / "base-data").string(),
                       "--run.dir=" + (dir / "base").string(), "--train.init_from=", "--sync.algorithm=none",
                       "--cluster.workers=1", "--optim.lr=3e-3"}, "base"));
  ASSERT_TRUE(command({testing_util::loco_binary(), "export", "--checkpoint", (dir / "base").string(), "--hf", (dir / "base-hf").string()},
                      "export-base"));
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(dir / "base-hf" / name)) << name;
  }
  EXPECT_EQ(read_file(dir / "base-hf" / "tokenizer.json", "test"), read_file(fixture / "tokenizer.json", "test"));
  // Its tokenizer_config.json as the model's was (padding token, class and all), not three keys of loco's.
  const auto settings = nlohmann::json::parse(read_file(fixture / "tokenizer_config.json", "test"));
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "base-hf" / "tokenizer_config.json", "test")), settings);
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "base-hf" / "config.json", "test"))["eos_token_id"], 856);

  // A model made for more positions than the run's context: the export gives the folder's back.
  auto base_config = nlohmann::json::parse(read_file(dir / "base-hf" / "config.json", "test"));
  EXPECT_EQ(base_config["max_position_embeddings"], 32);
  base_config["max_position_embeddings"] = 4096;
  write_file_atomic(dir / "base-hf" / "config.json", base_config.dump(2), "test");

  // The user's side: their corpus in the model's tokens, then the example's config from the folder.
  ASSERT_TRUE(command({testing_util::loco_binary(), "prepare", "--corpus", (dir_->path() / "corpus").string(), "--tokenizer",
                       (dir / "base-hf").string(), "--seed", "7", "--out", (dir / "data").string()}, "prepare"));
  // A dataset tokenized by another tokenizer of the same size is refused, naming both (before, only
  // the vocabulary's size was compared): two ordinary tokens trade ids.
  const fs::path other = dir / "other-tokenizer";
  fs::create_directories(other);
  auto tokenizer = nlohmann::json::parse(read_file(fixture / "tokenizer.json", "test"));
  auto& vocab = tokenizer["model"]["vocab"];
  const auto a = vocab.at("a"), b = vocab.at("b");
  vocab["a"] = b;
  vocab["b"] = a;
  write_file_atomic(other / "tokenizer.json", tokenizer.dump(), "test");
  fs::copy_file(fixture / "tokenizer_config.json", other / "tokenizer_config.json");
  ASSERT_TRUE(command({testing_util::loco_binary(), "prepare", "--corpus", (dir_->path() / "corpus").string(), "--tokenizer",
                       other.string(), "--out", (dir / "other-data").string()}, "prepare-other"));
  const auto refused = run_command({testing_util::loco_binary(), "train", "--config", example, "--data.dir=" + (dir / "other-data").string(),
                                    "--run.dir=" + (dir / "other-run").string(), "--train.init_from=" + (dir / "base-hf").string(),
                                    "--cluster.workers=1", "--model.context=32", "--model.width=32", "--model.heads=4",
                                    "--model.kv_heads=2", "--model.mlp_hidden=48", "--train.device=cpu"},
                                   log("llama-other"));
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.output.find("was tokenized by tokenizer"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("not by the folder's (tokenizer.json "), std::string::npos) << refused.output;

  ASSERT_TRUE(command({testing_util::loco_binary(), "launch", "--config", example, "--data.dir=" + (dir / "data").string(),
                       "--run.dir=" + (dir / "run").string(), "--train.init_from=" + (dir / "base-hf").string(),
                       "--cluster.workers=2", "--sync.inner_steps=4"}, "launch"));
  ASSERT_TRUE(command({testing_util::loco_binary(), "export", "--checkpoint", (dir / "run").string(), "--hf", (dir / "out").string()},
                      "export"));
  EXPECT_TRUE(fs::exists(dir / "out" / "tokenizer.json"));
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "out" / "tokenizer_config.json", "test")), settings);
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "out" / "config.json", "test"))["max_position_embeddings"], 4096)
      << "the folder's, not model.context (32)";
  // It started from the model, not from scratch: its first loss is the base's last, not a random model's.
  const auto base = losses("llama/base"), continued = losses("llama/run");
  ASSERT_FALSE(base.empty());
  ASSERT_FALSE(continued.empty());
  EXPECT_LT(continued.front(), base.front() - 0.3) << "base " << base.front() << " to " << base.back();
  EXPECT_LT(continued.back(), continued.front()) << "and it trains on";
}

}  // namespace
}  // namespace loco
