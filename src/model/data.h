// Training data: token files, a deterministic resumable loader, a byte-level
// tokenizer and the built-in corpus.
//
// Token file format (the layout llm.c's data scripts write, so their .bin
// files load as they are): a header of 256 little-endian int32 — [0] magic
// 20240520, [1] version 1, [2] number of tokens — then that many uint16
// tokens. Nothing else may follow.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::model {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int kTokenFileHeaderInts = 256;

// Writes `tokens` as a token file: into a new temporary file beside `path`,
// fsynced, renamed over `path`, directory fsynced.
Status WriteTokenFile(const std::string& path, std::span<const uint16_t> tokens);
// Reads and checks a token file. Errors: kNotFound, kCorruption naming the
// file (a header cut short, bad magic, another version, a negative count, a
// size that disagrees with the count: "truncated" when short, "size
// mismatch" when long), and kInvalidArgument naming the token index when a
// token is >= vocab_size (vocab_size 0: no check).
StatusOr<std::vector<uint16_t>> ReadTokenFile(const std::string& path, int vocab_size = 0);

// Bytes are tokens 0..255; kEndOfText separates documents.
class ByteTokenizer {
 public:
  static constexpr uint16_t kEndOfText = 256;
  static constexpr int kVocabSize = 257;
  static std::vector<uint16_t> Encode(std::string_view text);
  // Bytes back; kEndOfText becomes "\n\n"; tokens >= kVocabSize become '?'.
  static std::string Decode(std::span<const uint16_t> tokens);
};

// The built-in corpus: exactly `bytes` bytes (none when bytes <= 0) of
// English-like text generated from a small fixed grammar (sentences about a
// handful of subjects, verbs, objects and places, grouped into documents),
// deterministic in `seed` on every platform. Documents are separated by a
// blank line ("\n\n", which no document contains); the last one is cut where
// the budget ends. It has enough structure for a small model's loss to fall
// well below that of a unigram model within a few hundred steps, and needs
// no download.
std::string GenerateCorpus(int64_t bytes, uint64_t seed);
// GenerateCorpus encoded with ByteTokenizer, each "\n\n" (document separator)
// becoming one kEndOfText, so Decode gives the text back exactly.
std::vector<uint16_t> BuiltinCorpusTokens(int64_t bytes, uint64_t seed);

// Where a DataLoader is: the epoch and the next global batch within it.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const LoaderPosition&) const = default;
};

// Cuts a token stream into samples of seq_len + 1 tokens (inputs and the
// next-token targets) starting at multiples of seq_len, visits them in an
// order shuffled per epoch (deterministic in seed and epoch), and deals
// each global batch of world_size * batch samples out by rank: rank r gets
// samples [r*batch, (r+1)*batch). A partial last global batch of an epoch is
// skipped. The loader only holds a view: `tokens` must outlive it.
class DataLoader {
 public:
  // kInvalidArgument when the stream holds fewer than one global batch.
  static StatusOr<DataLoader> Create(std::span<const uint16_t> tokens, int batch, int seq_len, uint64_t seed,
                                     int rank = 0, int world_size = 1);

  // Fills inputs and targets (batch * seq_len each, row-major [batch, seq_len])
  // and advances by one global batch.
  void Next(int32_t* inputs, int32_t* targets);
  LoaderPosition position() const { return position_; }
  // Continues from a position() saved earlier (kInvalidArgument unless
  // epoch >= 0 and 0 <= batch < batches_per_epoch()).
  Status Seek(LoaderPosition position);
  int64_t batches_per_epoch() const;

 private:
  DataLoader() = default;
  void Shuffle();

  std::span<const uint16_t> tokens_;
  int batch_ = 0, seq_len_ = 0, rank_ = 0, world_size_ = 1;
  uint64_t seed_ = 0;
  int64_t num_samples_ = 0;
  std::vector<int64_t> order_;  // this epoch's sample order
  LoaderPosition position_;
};

}  // namespace zinf::model
