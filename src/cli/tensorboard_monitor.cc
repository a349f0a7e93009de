#include "cli/tensorboard_monitor.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/crc32c.h"
#include "core/fs.h"

namespace zinf::cli {
namespace {

// Protocol buffer wire types.
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void PutKey(std::string& out, int field, int wire_type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

template <typename T>
void PutLittleEndian(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86 and ARM Linux are little-endian, as the format
  out.append(bytes, sizeof(T));
}

void PutBytes(std::string& out, int field, std::string_view bytes) {
  PutKey(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out.append(bytes);
}

// Event fields 1 (wall_time) and 2 (step).
std::string EventHeader(double wall_time, int64_t step) {
  std::string e;
  PutKey(e, 1, kFixed64);
  PutLittleEndian(e, wall_time);
  if (step != 0) {  // proto3: a zero is left out
    PutKey(e, 2, kVarint);
    PutVarint(e, static_cast<uint64_t>(step));
  }
  return e;
}

double WallTime() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t crc = Crc32c(data.data(), data.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameTfRecord(std::string_view data) {
  std::string length;
  PutLittleEndian(length, static_cast<uint64_t>(data.size()));
  std::string out = length;
  PutLittleEndian(out, MaskedCrc32c(length));
  out.append(data);
  PutLittleEndian(out, MaskedCrc32c(data));
  return out;
}

std::string EncodeFileVersionEvent(double wall_time) {
  std::string e = EventHeader(wall_time, 0);
  PutBytes(e, 3, "brain.Event:2");
  return e;
}

std::string EncodeSessionStartEvent(double wall_time, int64_t step) {
  std::string session_log;
  PutKey(session_log, 1, kVarint);  // status
  PutVarint(session_log, 1);        // START
  std::string e = EventHeader(wall_time, step);
  PutBytes(e, 7, session_log);
  return e;
}

std::string EncodeScalarsEvent(double wall_time, int64_t step,
                               const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    PutBytes(v, 1, tag);
    PutKey(v, 2, kFixed32);
    PutLittleEndian(v, value);
    PutBytes(summary, 1, v);
  }
  std::string e = EventHeader(wall_time, step);
  PutBytes(e, 5, summary);
  return e;
}

Status TensorBoardMonitor::Open(const std::string& dir) {
  ZINF_RETURN_IF_ERROR(MakeDirectories(dir));
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  const double now = WallTime();
  const std::string name =
      JoinPath(dir, "events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host);
  Status s = file_.Open(name, /*exclusive=*/true);
  if (!s.ok() && s.sys_errno() == EEXIST) s = file_.Open(name + "." + std::to_string(getpid()), true);
  ZINF_RETURN_IF_ERROR(s);
  return file_.Append(FrameTfRecord(EncodeFileVersionEvent(now)));
}

Status TensorBoardMonitor::Continue(const std::string& dir, int64_t samples) {
  ZINF_RETURN_IF_ERROR(Open(dir));
  return file_.Append(FrameTfRecord(EncodeSessionStartEvent(WallTime(), samples + 1)));
}

Status TensorBoardMonitor::OnStep(const StepMetrics& m) {
  std::vector<std::pair<std::string, float>> scalars;
  for (const auto& [tag, value] : StepScalars(m)) scalars.emplace_back(tag, static_cast<float>(value));
  return file_.Append(FrameTfRecord(EncodeScalarsEvent(WallTime(), m.samples, scalars)));
}

Status TensorBoardMonitor::OnEval(int64_t /*step*/, int64_t samples, double eval_loss) {
  return file_.Append(
      FrameTfRecord(EncodeScalarsEvent(WallTime(), samples, {{kEvalLossTag, static_cast<float>(eval_loss)}})));
}

}  // namespace zinf::cli
