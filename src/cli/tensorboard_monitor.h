// TensorBoard event files, written without TensorFlow: DeepSpeed's
// `tensorboard` section.
//
// An event file is a sequence of TFRecords: uint64 length (little-endian),
// uint32 masked CRC-32C of those 8 bytes, the data, uint32 masked CRC-32C of
// the data (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8). Each record's
// data is a serialized tensorflow.Event protocol buffer; the first one holds
// file_version "brain.Event:2", the others a Summary of scalar values. The
// messages zinf writes use these fields, encoded here by hand (a varint and
// length-delimited writer): Event {double wall_time = 1; int64 step = 2;
// string file_version = 3; Summary summary = 5; SessionLog session_log = 7},
// Summary {repeated Value value = 1}, Value {string tag = 1; float
// simple_value = 2}, SessionLog {SessionStatus status = 1} (START = 1). A
// protobuf library would bring a code generator and the .proto files into the
// build for those few bytes.
//
// A step's record holds StepScalars (run_monitor.h) as floats, with the
// event's step the number of samples trained on (DeepSpeed's x axis); an
// evaluation's record holds Eval/Samples/eval_loss. One record per optimizer
// step and one per evaluation.
//
// Every run writes a new event file (TensorBoard reads a folder's files in
// name order, and the name starts with the time). A resumed run's file opens
// with a SessionLog START event (Event field 7, SessionLog {status = 1}) at
// the step after the checkpoint's: TensorBoard then drops the earlier files'
// points at that step and later ones, which the resumed run writes again.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/run_monitor.h"

namespace zinf::cli {

// TFRecord's masked CRC-32C of `data`.
uint32_t MaskedCrc32c(std::string_view data);
// `data` framed as one TFRecord.
std::string FrameTfRecord(std::string_view data);

// Serialized tensorflow.Event messages.
std::string EncodeFileVersionEvent(double wall_time);
std::string EncodeSessionStartEvent(double wall_time, int64_t step);
std::string EncodeScalarsEvent(double wall_time, int64_t step,
                               const std::vector<std::pair<std::string, float>>& scalars);

class TensorBoardMonitor : public RunMonitor {
 public:
  // Creates `dir` (and its parents) and the event file
  // dir/events.out.tfevents.<seconds since the epoch>.<host name> (with
  // .<pid> added if that exists), and writes the file_version record.
  Status Open(const std::string& dir);
  // Open for a run resumed when `samples` sequences had been trained on: the
  // file also gets the SessionLog START event at samples + 1.
  Status Continue(const std::string& dir, int64_t samples);
  Status OnStep(const StepMetrics& m) override;
  Status OnEval(int64_t step, int64_t samples, double eval_loss) override;
  const std::string& path() const { return file_.path(); }

 private:
  AppendFile file_;
};

}  // namespace zinf::cli
