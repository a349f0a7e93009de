// The reliability matrix: whole training runs of the tiny GPT (parameters and
// optimizer state on NVMe files) under injected and real faults. Every case
// ends either in the reference loss curve, bit for bit, or in a clear error
// that names the file (and offset) or the config key -- never in a silently
// different model.
//
//   1. EIO / a torn write on a swap file mid-run: Step fails naming the file;
//      the last checkpoint resumes and continues the reference curve.
//   2. Short transfers, EAGAIN, EINTR, delays: the curve is unchanged.
//   3. A full disk (a small tmpfs): a checkpoint fails with kNoSpace naming
//      the path, the previous one loads, the next save succeeds once there is
//      room again; swap files on the full disk are refused at start.
//   4. SIGKILL during a checkpoint (a child process, stopped at a stage by a
//      stalling I/O engine): `latest` names the previous checkpoint, which
//      continues the curve, and the resumed run saves again.
//   5. A flipped byte in a swap file between steps: kCorruption naming the
//      file and offset.
//   6. A flipped byte in a checkpoint blob or its manifest: Resume fails with
//      kCorruption naming the file; nothing was loaded.
//   7. An nvme path that is gone (recreated: the curve continues) or that
//      cannot be used (a file, a read-only mount): an error naming the path
//      and the config key.
//
// Faults reach the engine's I/O through EngineOptions::io_engine.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "aio/fault_engine.h"
#include "aio/io_engine.h"
#include "aio/pinned_pool.h"
#include "core/fs.h"
#include "device/device.h"
#include "model/model_test_util.h"
#include "model/trainer.h"
#include "swap/checkpoint.h"
#include "swap/swap_test_util.h"

extern char** environ;

namespace zinf::model {
namespace {

using swap::testing::CorruptFile;
using swap::testing::TempDir;
using testing::StepLosses;

constexpr int kSteps = 6;

Config NvmeConfig(const std::string& root) {
  return testing::TinyTrainingConfig(root, OffloadDevice::kNvme, OffloadDevice::kNvme, /*micro_batch=*/4);
}

struct TrainRun {
  std::unique_ptr<Device> device;
  std::unique_ptr<Trainer> trainer;
  Status status;  // of Trainer::Create
};

TrainRun MakeRun(const Config& config, aio::IoEngine* io = nullptr) {
  TrainRun r;
  r.device = CreateHostDevice(0);
  TrainerOptions o;
  o.model = *LoadGptConfig("tiny");
  o.corpus_bytes = 64 << 10;
  o.hooks.device = r.device.get();
  o.engine.optimizer_threads = 1;
  o.engine.run_id = "reliability";
  o.hooks.io_engine = io;
  auto t = Trainer::Create(config, o);
  r.status = t.status();
  if (t.ok()) r.trainer = std::move(t).value();
  return r;
}

// The unfaulted run's loss curve, computed once per process.
const std::vector<double>& Reference() {
  static const std::vector<double> losses = [] {
    TempDir dir;
    TrainRun r = MakeRun(NvmeConfig(dir.path()));
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    if (!r.trainer) return std::vector<double>{};
    return StepLosses(*r.trainer, kSteps);
  }();
  return losses;
}

std::vector<double> Tail(int from) {
  const std::vector<double>& ref = Reference();
  return std::vector<double>(ref.begin() + from, ref.end());
}

std::vector<double> Head(int n) {
  const std::vector<double>& ref = Reference();
  return std::vector<double>(ref.begin(), ref.begin() + n);
}

// A fresh trainer resumed from `path`, trained to kSteps: its losses.
std::vector<double> ResumeAndTrain(const Config& config, const std::string& path, int64_t want_step) {
  TrainRun r = MakeRun(config);
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  if (!r.trainer) return {};
  Status s = r.trainer->Resume(path);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return {};
  EXPECT_EQ(r.trainer->step(), want_step);
  return StepLosses(*r.trainer, kSteps - static_cast<int>(r.trainer->step()));
}

aio::IoEngineOptions InnerOptions() {
  aio::IoEngineOptions o;
  o.direct_io = aio::DirectIo::kPrefer;
  o.block_size_bytes = 16 << 10;  // many pieces per request: many chances for a fault
  o.queue_depth = 8;
  o.thread_count = 2;
  return o;
}

std::unique_ptr<aio::FaultyEngine> MakeFaulty(const aio::FaultOptions& f) {
  auto e = aio::FaultyEngine::Create(InnerOptions(), f);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

std::string RankDir(const std::string& save_dir) { return save_dir + "/rank-0"; }
std::string StepDir(const std::string& save_dir, int step) {
  char name[32];
  std::snprintf(name, sizeof(name), "/step-%08d", step);
  return RankDir(save_dir) + name;
}

StatusOr<std::string> Latest(const std::string& save_dir) {
  auto engine = aio::CreateIoEngine(InnerOptions());
  if (!engine.ok()) return engine.status();
  aio::PinnedPoolOptions po;
  po.buffer_count = 1;
  po.buffer_bytes = 64 << 10;
  po.pin = false;
  po.name = "reliability test";
  auto pool = aio::PinnedPool::Create(po);
  if (!pool.ok()) return pool.status();
  return swap::ResolveLatest(**engine, **pool, RankDir(save_dir));
}

// The swap files under `dir` (one per path here).
std::string SwapFileIn(const std::string& dir) {
  auto entries = ListDirectory(dir);
  EXPECT_TRUE(entries.ok()) << entries.status().ToString();
  if (!entries.ok()) return "";
  for (const std::string& e : *entries) {
    if (e.size() > 4 && e.compare(e.size() - 4, 4, ".swp") == 0) return dir + "/" + e;
  }
  ADD_FAILURE() << "no swap file in " << dir;
  return "";
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------
// 1. EIO and torn writes on the swap files mid-run.

struct SwapFault {
  const char* name;
  const char* tier;  // "param" or "optim": the swap directory faulted
  double eio_rate;
  double torn_write_rate;
};

TEST(ReliabilityTest, SwapIoErrorMidRunFailsTheStepNamingTheFileAndTheCheckpointResumes) {
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kSteps));
  const SwapFault faults[] = {
      {"parameter read EIO", "param", 1.0, 0.0},
      {"parameter write torn", "param", 0.0, 1.0},
      {"optimizer EIO", "optim", 1.0, 0.0},
      {"optimizer write torn", "optim", 0.0, 1.0},
  };
  for (const SwapFault& fault : faults) {
    SCOPED_TRACE(fault.name);
    TempDir dir;
    const Config config = NvmeConfig(dir.path());
    const std::string swap_dir = dir.Sub(fault.tier);
    aio::FaultOptions f;
    f.seed = 11;
    f.eio_rate = fault.eio_rate;
    f.torn_write_rate = fault.torn_write_rate;
    f.path_filter = swap_dir + "/";
    auto faulty = MakeFaulty(f);
    ASSERT_NE(faulty, nullptr);
    faulty->injector().set_enabled(false);
    {
      TrainRun r = MakeRun(config, faulty.get());
      ASSERT_TRUE(r.status.ok()) << r.status.ToString();
      EXPECT_EQ(StepLosses(*r.trainer, 2), Head(2));
      ASSERT_TRUE(r.trainer->Save(dir.Sub("ckpt")).ok());
      faulty->injector().set_enabled(true);
      // The optimizer update of a step runs under the next step's forward
      // pass, which also writes its new parameters home: a fault there may
      // fail the step after. A step that succeeds must be the reference's.
      auto step = r.trainer->Step();
      for (int k = 0; step.ok() && k < 2; ++k) {
        EXPECT_EQ(step->loss, Reference()[static_cast<size_t>(2 + k)]) << "a step over a failing swap file differs";
        step = r.trainer->Step();
      }
      ASSERT_FALSE(step.ok()) << "steps over a failing swap file succeeded";
      const std::string msg = step.status().ToString();
      ::testing::Test::RecordProperty(fault.name, msg);  // --gtest_output=xml shows what a user would read
      EXPECT_TRUE(step.status().code() == StatusCode::kIoError || step.status().code() == StatusCode::kAborted) << msg;
      EXPECT_TRUE(Contains(msg, swap_dir + "/")) << msg;
      EXPECT_TRUE(Contains(msg, ".swp")) << msg;
      EXPECT_TRUE(Contains(msg, "offset")) << msg;
      // Later steps keep failing (the error is sticky) instead of training on.
      auto again = r.trainer->Step();
      EXPECT_FALSE(again.ok());
      EXPECT_GT(faulty->injector().counts().eio + faulty->injector().counts().torn_writes, 0);
    }  // the failed trainer is torn down with blocks still acquired: no crash, no hang
    // The checkpoint taken before the fault continues the reference curve.
    EXPECT_EQ(ResumeAndTrain(config, dir.Sub("ckpt"), 2), Tail(2));
  }
}

// ---------------------------------------------------------------------------
// 2. Retryable faults change nothing.

TEST(ReliabilityTest, ShortTransfersEagainEintrAndDelaysLeaveTheLossCurveBitIdentical) {
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kSteps));
  TempDir dir;
  const Config config = NvmeConfig(dir.path());
  aio::FaultOptions f;
  f.seed = 5;
  f.short_rate = 0.2;
  f.eagain_rate = 0.1;
  f.eintr_rate = 0.1;
  f.delay_rate = 0.1;
  auto faulty = MakeFaulty(f);
  ASSERT_NE(faulty, nullptr);
  std::vector<double> losses;
  {
    TrainRun r = MakeRun(config, faulty.get());
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    losses = StepLosses(*r.trainer, 3);
    // The checkpoint goes through the same faulty engine.
    auto saved = r.trainer->Save(dir.Sub("ckpt"));
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    for (double l : StepLosses(*r.trainer, kSteps - 3)) losses.push_back(l);
  }
  EXPECT_EQ(losses, Reference());
  const aio::FaultCounts c = faulty->injector().counts();
  EXPECT_GT(c.short_io, 0);
  EXPECT_GT(c.eagain, 0);
  EXPECT_GT(c.eintr, 0);

  // And it loads through a faulty engine too.
  f.seed = 6;
  auto faulty2 = MakeFaulty(f);
  ASSERT_NE(faulty2, nullptr);
  TrainRun r = MakeRun(NvmeConfig(dir.Sub("again")), faulty2.get());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_TRUE(r.trainer->Resume(dir.Sub("ckpt")).ok());
  EXPECT_EQ(StepLosses(*r.trainer, kSteps - 3), Tail(3));
  EXPECT_GT(faulty2->injector().counts().total(), 0);
}

// ---------------------------------------------------------------------------
// 3. A full disk.

// A tmpfs mounted at `path` in a mount namespace of this test's own (so
// nothing shows outside it and the mount dies with the process), or the
// reason it cannot be had (not root, no CAP_SYS_ADMIN, a seccomp profile).
class Tmpfs {
 public:
  Tmpfs(const std::string& path, int64_t size_bytes, bool read_only) : path_(path) {
    static std::string ns_error = [] {
      // Mount namespaces are per thread; a new one affects this thread and
      // the threads it starts from now on, which is all the engine needs.
      if (::unshare(CLONE_NEWNS) != 0) return "unshare(CLONE_NEWNS): " + std::string(std::strerror(errno));
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
        return "making / private: " + std::string(std::strerror(errno));
      }
      return std::string();
    }();
    if (!ns_error.empty()) {
      reason_ = ns_error;
      return;
    }
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      reason_ = "mkdir " + path + ": " + std::strerror(errno);
      return;
    }
    const std::string data = "size=" + std::to_string(size_bytes);
    if (::mount("tmpfs", path.c_str(), "tmpfs", read_only ? MS_RDONLY : 0, data.c_str()) != 0) {
      reason_ = "mount -t tmpfs " + path + ": " + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~Tmpfs() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string path_;
  bool mounted_ = false;
  std::string reason_;
};

// Writes `path` until the filesystem is full.
void FillUp(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << path;
  std::vector<char> chunk(64 << 10, 'x');
  for (;;) {
    const ssize_t n = ::write(fd, chunk.data(), chunk.size());
    if (n > 0) continue;
    ASSERT_EQ(errno, ENOSPC) << std::strerror(errno);
    break;
  }
  // The last pages: write byte by byte until nothing more fits.
  while (::write(fd, chunk.data(), 1) == 1) {
  }
  ::close(fd);
}

TEST(ReliabilityTest, FullDiskMakesACheckpointFailWithNoSpaceAndThePreviousOneLoads) {
  TempDir dir;
  Tmpfs small(dir.Sub("small"), 16 << 20, /*read_only=*/false);
  if (!small.ok()) GTEST_SKIP() << "no small filesystem to fill: " << small.reason();
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kSteps));
  const Config config = NvmeConfig(dir.path());
  const std::string save_dir = dir.Sub("small/ckpt");
  {
    TrainRun r = MakeRun(config);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    StepLosses(*r.trainer, 2);
    ASSERT_TRUE(r.trainer->Save(save_dir).ok());
    FillUp(dir.Sub("small/filler"));
    StepLosses(*r.trainer, 1);
    auto saved = r.trainer->Save(save_dir);
    ASSERT_FALSE(saved.ok());
    ::testing::Test::RecordProperty("checkpoint", saved.status().ToString());
    EXPECT_EQ(saved.status().code(), StatusCode::kNoSpace) << saved.status().ToString();
    EXPECT_TRUE(Contains(saved.status().message(), StepDir(save_dir, 3))) << saved.status().ToString();
    // The failed save left nothing behind, and `latest` still names step 2.
    auto entries = ListDirectory(RankDir(save_dir));
    ASSERT_TRUE(entries.ok());
    EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-00000002"}));
    auto latest = Latest(save_dir);
    ASSERT_TRUE(latest.ok()) << latest.status().ToString();
    EXPECT_EQ(*latest, StepDir(save_dir, 2));

    // Swap files on the full disk are refused at start, naming the path.
    Config on_full = NvmeConfig(dir.path());
    on_full.zero.offload_optimizer.nvme_paths = {dir.Sub("small/optim")};
    TrainRun full = MakeRun(on_full);
    ASSERT_FALSE(full.status.ok());
    ::testing::Test::RecordProperty("swap", full.status.ToString());
    EXPECT_EQ(full.status.code(), StatusCode::kNoSpace) << full.status.ToString();
    EXPECT_TRUE(Contains(full.status.message(), dir.Sub("small/optim"))) << full.status.ToString();

    // With room again the same run saves: one full disk does not end
    // checkpointing for the rest of the run.
    ASSERT_TRUE(RemoveFile(dir.Sub("small/filler")).ok());
    auto retried = r.trainer->Save(save_dir);
    EXPECT_TRUE(retried.ok()) << retried.status().ToString();
  }
  EXPECT_EQ(ResumeAndTrain(config, StepDir(save_dir, 2), 2), Tail(2));
  EXPECT_EQ(ResumeAndTrain(config, save_dir, 3), Tail(3));
}

// ---------------------------------------------------------------------------
// 4. SIGKILL during a checkpoint.

// Forwards to a real engine; once armed, stops the process (signals the
// parent and waits to be killed) when a file whose path contains `needle`
// is opened ("open") or synced ("sync").
class StallingEngine final : public aio::IoEngine {
 public:
  StallingEngine(std::unique_ptr<aio::IoEngine> inner, std::string op, std::string needle, int fd)
      : inner_(std::move(inner)), op_(std::move(op)), needle_(std::move(needle)), fd_(fd) {}
  void Arm() { armed_ = true; }

  std::string_view name() const override { return "stalling"; }
  const aio::IoEngineOptions& options() const override { return inner_->options(); }
  StatusOr<aio::FileId> OpenFile(const std::string& path, const aio::OpenOptions& open) override {
    if (op_ == "open") MaybeStop(path);
    return inner_->OpenFile(path, open);
  }
  Status CloseFile(aio::FileId file) override { return inner_->CloseFile(file); }
  const aio::FileInfo& file_info(aio::FileId file) const override { return inner_->file_info(file); }
  Status RegisterMemory(void* base, size_t bytes) override { return inner_->RegisterMemory(base, bytes); }
  using aio::IoEngine::Submit;
  StatusOr<aio::IoTicket> Submit(aio::IoOp op, std::span<const aio::IoSegment> segments) override {
    return inner_->Submit(op, segments);
  }
  Status Wait(aio::IoTicket ticket) override { return inner_->Wait(ticket); }
  bool IsDone(aio::IoTicket ticket) override { return inner_->IsDone(ticket); }
  Status WaitAll() override { return inner_->WaitAll(); }
  Status Sync(aio::FileId file) override {
    Status s = inner_->Sync(file);
    if (op_ == "sync") MaybeStop(inner_->file_info(file).path);
    return s;
  }
  StatusOr<int64_t> FileSize(aio::FileId file) override { return inner_->FileSize(file); }
  Status Truncate(aio::FileId file, int64_t size_bytes) override { return inner_->Truncate(file, size_bytes); }
  Status Allocate(aio::FileId file, int64_t size_bytes) override { return inner_->Allocate(file, size_bytes); }
  Status sticky_error() const override { return inner_->sticky_error(); }

 private:
  void MaybeStop(const std::string& path) {
    if (!armed_ || path.find(needle_) == std::string::npos) return;
    const char c = 'k';
    if (::write(fd_, &c, 1) != 1) ::_exit(4);
    for (;;) ::pause();  // SIGKILL arrives here
  }
  std::unique_ptr<aio::IoEngine> inner_;
  std::string op_, needle_;
  int fd_;
  bool armed_ = false;
};

constexpr char kChildRoot[] = "ZINF_RELIABILITY_CHILD_ROOT";
constexpr char kChildOp[] = "ZINF_RELIABILITY_CHILD_OP";
constexpr char kChildNeedle[] = "ZINF_RELIABILITY_CHILD_NEEDLE";
constexpr char kChildFd[] = "ZINF_RELIABILITY_CHILD_FD";

// The child of the kill test, run in a fresh process (fork + exec of this
// binary: the parent's OpenMP threads would not survive a bare fork).
// Trains 2 steps, saves, trains 2 more and saves again with the stalling
// engine armed. Exits nonzero on any error before the stop.
TEST(ReliabilityKillChild, DISABLED_TrainAndSave) {
  const char* root = std::getenv(kChildRoot);
  if (root == nullptr) GTEST_SKIP() << "only run by ReliabilityKillTest";
  auto inner = aio::CreateIoEngine(InnerOptions());
  if (!inner.ok()) ::_exit(10);
  StallingEngine engine(std::move(inner).value(), std::getenv(kChildOp), std::getenv(kChildNeedle),
                        std::atoi(std::getenv(kChildFd)));
  TrainRun r = MakeRun(NvmeConfig(root), &engine);
  if (!r.status.ok()) ::_exit(11);
  for (int i = 0; i < 2; ++i) {
    if (!r.trainer->Step().ok()) ::_exit(12);
  }
  if (!r.trainer->Save(std::string(root) + "/ckpt").ok()) ::_exit(13);
  for (int i = 0; i < 2; ++i) {
    if (!r.trainer->Step().ok()) ::_exit(14);
  }
  engine.Arm();
  auto s = r.trainer->Save(std::string(root) + "/ckpt");
  ::_exit(s.ok() ? 15 : 16);  // the stop was never reached
}

struct KillStage {
  const char* name;
  const char* op;
  const char* needle;
  bool renamed;  // the new checkpoint directory is in place (latest not yet moved)
};

void PrintTo(const KillStage& stage, std::ostream* os) { *os << stage.name; }

class ReliabilityKillTest : public ::testing::TestWithParam<KillStage> {};

TEST_P(ReliabilityKillTest, SigkillDuringACheckpointResumesFromTheLatestCompleteOne) {
  const KillStage& stage = GetParam();
  TempDir dir;
  const std::string save_dir = dir.Sub("ckpt");
  const std::string log = dir.Sub("child.log");
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(n, 0);
  exe[n] = '\0';
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  // Everything the child needs is built before fork: only exec follows it.
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) env_storage.emplace_back(*e);
  env_storage.push_back(std::string(kChildRoot) + "=" + dir.path());
  env_storage.push_back(std::string(kChildOp) + "=" + stage.op);
  env_storage.push_back(std::string(kChildNeedle) + "=" + stage.needle);
  env_storage.push_back(std::string(kChildFd) + "=" + std::to_string(fds[1]));
  std::vector<char*> envp;
  for (std::string& s : env_storage) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=ReliabilityKillChild.DISABLED_TrainAndSave";
  std::string disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {exe, filter.data(), disabled.data(), nullptr};
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(log_fd, 0);

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execve(exe, argv, envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  ::close(log_fd);
  pollfd p{fds[0], POLLIN, 0};
  const int ready = ::poll(&p, 1, 120'000);
  char c = 0;
  const bool stopped = ready == 1 && ::read(fds[0], &c, 1) == 1;
  ::close(fds[0]);
  ::kill(pid, SIGKILL);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  std::string child_log;
  {
    std::ifstream in(log);
    child_log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_TRUE(stopped) << "the child never reached the stage; exit status "
                       << (WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1) << "; its output:\n"
                       << child_log;
  ASSERT_TRUE(WIFSIGNALED(wstatus));

  // `latest` still names step 2; step 4 is complete or absent, never partial.
  auto latest = Latest(save_dir);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, StepDir(save_dir, 2));
  EXPECT_EQ(PathExists(StepDir(save_dir, 4)), stage.renamed);

  // The parent resumes from `latest` and continues the identical curve; on
  // the way it saves step 4 again, over whatever the killed run left.
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kSteps));
  const Config config = NvmeConfig(dir.path());
  TrainRun r = MakeRun(config);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_TRUE(r.trainer->Resume(save_dir).ok());
  ASSERT_EQ(r.trainer->step(), 2);
  std::vector<double> losses = StepLosses(*r.trainer, 2);
  auto saved = r.trainer->Save(save_dir);
  EXPECT_TRUE(saved.ok()) << saved.status().ToString();
  for (double l : StepLosses(*r.trainer, kSteps - 4)) losses.push_back(l);
  EXPECT_EQ(losses, Tail(2));
  auto now = Latest(save_dir);
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_EQ(*now, StepDir(save_dir, 4));
  auto entries = ListDirectory(RankDir(save_dir));
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(*entries, (std::vector<std::string>{"latest", "step-00000002", "step-00000004"}));
  EXPECT_EQ(ResumeAndTrain(config, save_dir, 4), Tail(4));
}

INSTANTIATE_TEST_SUITE_P(Stages, ReliabilityKillTest,
                         ::testing::Values(KillStage{"FirstBlobSynced", "sync", "/blob-00000.bin", false},
                                           KillStage{"ManifestSynced", "sync", "/manifest", false},
                                           KillStage{"RenamedBeforeLatest", "open", "/latest.tmp", true}),
                         [](const ::testing::TestParamInfo<KillStage>& p) { return std::string(p.param.name); });

// ---------------------------------------------------------------------------
// 5. A flipped byte in a swap file between steps.

TEST(ReliabilityTest, FlippedByteInASwapFileIsCorruptionNamingTheFileAndOffset) {
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kSteps));
  for (const char* tier : {"param", "optim"}) {
    SCOPED_TRACE(tier);
    TempDir dir;
    TrainRun r = MakeRun(NvmeConfig(dir.path()));
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    StepLosses(*r.trainer, 2);
    // The second step's update is on disk, and no write is in flight.
    ASSERT_TRUE(r.trainer->engine().WaitForUpdate().ok());
    const std::string file = SwapFileIn(dir.Sub(tier));
    ASSERT_FALSE(file.empty());
    // Past the header block: the first extent of the first tensor (the
    // embedding's shard, or the first optimizer sub-group's master weights).
    CorruptFile(file, 4096 + 100);
    // The parameters are read by the next forward pass; the optimizer state
    // by that step's update, whose error the step after meets.
    auto step = r.trainer->Step();
    if (step.ok() && std::string(tier) == "optim") {
      EXPECT_EQ(step->loss, Reference()[2]);
      step = r.trainer->Step();
    }
    ASSERT_FALSE(step.ok()) << "a flipped byte in " << file << " went unnoticed: loss " << step->loss;
    ::testing::Test::RecordProperty(tier, step.status().ToString());
    EXPECT_EQ(step.status().code(), StatusCode::kCorruption) << step.status().ToString();
    EXPECT_TRUE(Contains(step.status().message(), file + " offset 4096")) << step.status().ToString();
  }
}

// ---------------------------------------------------------------------------
// 6. A flipped byte in a checkpoint.

TEST(ReliabilityTest, FlippedByteInACheckpointIsRefusedAndNothingIsLoaded) {
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kSteps));
  TempDir dir;
  const Config config = NvmeConfig(dir.path());
  const std::string save_dir = dir.Sub("ckpt");
  {
    TrainRun r = MakeRun(config);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    StepLosses(*r.trainer, 2);
    ASSERT_TRUE(r.trainer->Save(save_dir).ok());
  }
  const std::string step_dir = StepDir(save_dir, 2);
  struct Damage {
    std::string file;
    int64_t offset;
    std::string expect;  // in the message
  };
  // The blob's chunk crc names the chunk: offset 0 with the default 1 MiB chunks.
  const Damage damages[] = {{step_dir + "/blob-00000.bin", 5000, step_dir + "/blob-00000.bin offset 0"},
                            {step_dir + "/blob-00002.bin", 100, step_dir + "/blob-00002.bin offset 0"},
                            {step_dir + "/manifest", 100, step_dir + "/manifest offset"}};
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.file);
    CorruptFile(d.file, d.offset);
    TrainRun r = MakeRun(config);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    Status s = r.trainer->Resume(save_dir);
    ::testing::Test::RecordProperty(BaseName(d.file), s.ToString());
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), d.expect)) << s.ToString();
    // Nothing was loaded: the trainer is the fresh one and trains the
    // reference curve from the start.
    EXPECT_EQ(r.trainer->step(), 0);
    EXPECT_EQ(StepLosses(*r.trainer, 2), Head(2));
    CorruptFile(d.file, d.offset);  // undo: the flip is an xor
  }
  EXPECT_EQ(ResumeAndTrain(config, save_dir, 2), Tail(2));
}

// ---------------------------------------------------------------------------
// 7. An nvme path that is gone or unusable at resume.

TEST(ReliabilityTest, RemovedNvmePathsAreRecreatedAndTheResumedCurveContinues) {
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kSteps));
  TempDir dir;
  const Config config = NvmeConfig(dir.path());
  {
    TrainRun r = MakeRun(config);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    StepLosses(*r.trainer, 2);
    ASSERT_TRUE(r.trainer->Save(dir.Sub("ckpt")).ok());
  }
  ASSERT_TRUE(RemoveTree(dir.Sub("param")).ok());
  ASSERT_TRUE(RemoveTree(dir.Sub("optim")).ok());
  EXPECT_EQ(ResumeAndTrain(config, dir.Sub("ckpt"), 2), Tail(2));
}

TEST(ReliabilityTest, UnusableNvmePathIsAnErrorNamingThePathAndTheConfigKey) {
  TempDir dir;
  for (const char* tier : {"param", "optim"}) {
    SCOPED_TRACE(tier);
    const std::string key = std::string(tier) == "param" ? "offload_param.nvme_path" : "offload_optimizer.nvme_path";
    // The path is a regular file (a removed mount point left as a file, a typo).
    const std::string path = dir.Sub(std::string(tier) + "-file");
    {
      FILE* f = std::fopen(path.c_str(), "w");
      ASSERT_NE(f, nullptr);
      std::fclose(f);
    }
    Config config = NvmeConfig(dir.path());
    if (std::string(tier) == "param") {
      config.zero.offload_param.nvme_paths = {path};
    } else {
      config.zero.offload_optimizer.nvme_paths = {path};
    }
    TrainRun r = MakeRun(config);
    ASSERT_FALSE(r.status.ok());
    ::testing::Test::RecordProperty(tier, r.status.ToString());
    EXPECT_TRUE(Contains(r.status.message(), path)) << r.status.ToString();
    EXPECT_TRUE(Contains(r.status.message(), key)) << r.status.ToString();
  }
}

TEST(ReliabilityTest, ReadOnlyNvmePathIsAnErrorNamingThePathAndTheConfigKey) {
  TempDir dir;
  Tmpfs ro(dir.Sub("ro"), 64 << 20, /*read_only=*/true);  // room enough: the refusal is for being read-only
  if (!ro.ok()) GTEST_SKIP() << "no read-only filesystem to use: " << ro.reason();
  for (const char* tier : {"param", "optim"}) {
    SCOPED_TRACE(tier);
    const std::string key = std::string(tier) == "param" ? "offload_param.nvme_path" : "offload_optimizer.nvme_path";
    const std::string path = dir.Sub("ro");
    Config config = NvmeConfig(dir.path());
    if (std::string(tier) == "param") {
      config.zero.offload_param.nvme_paths = {path};
    } else {
      config.zero.offload_optimizer.nvme_paths = {path};
    }
    TrainRun r = MakeRun(config);
    ASSERT_FALSE(r.status.ok());
    ::testing::Test::RecordProperty(tier, r.status.ToString());
    EXPECT_TRUE(Contains(r.status.message(), path)) << r.status.ToString();
    EXPECT_TRUE(Contains(r.status.message(), key)) << r.status.ToString();
  }
}

}  // namespace
}  // namespace zinf::model
