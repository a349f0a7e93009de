// Training data: token files, a deterministic resumable loader, a byte-level
// tokenizer and the built-in corpus.
//
// Token file format (the layout llm.c's data scripts write, so their .bin
// files load as they are): a header of 256 little-endian int32 — [0] magic,
// [1] version, [2] number of tokens — then that many tokens, little-endian.
// Nothing else may follow. Three kinds are read:
//   magic 20240520 version 1: uint16 tokens (llm.c's GPT-2 files, zinf's own)
//   magic 20240520 version 2: uint32 tokens (zinf's, for vocabularies past
//                             65536 ids: Llama 3, Qwen2)
//   magic 20240801 version 7: uint32 tokens (llm.c's Llama 3 files)
// A file is read in place (Tokens::Map: mapped, its uint16 or uint32 tokens
// read as they are), so a corpus costs page cache, which the kernel can drop,
// not memory the process owns.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::model {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;        // uint16 tokens
inline constexpr int32_t kTokenFileVersion32 = 2;      // uint32 tokens
inline constexpr int32_t kLlmcLlama3Magic = 20240801;  // llm.c's uint32 files
inline constexpr int32_t kLlmcLlama3Version = 7;
inline constexpr int kTokenFileHeaderInts = 256;

// The version WriteTokenFile writes: kAuto takes version 1 when every token
// is below 65536 (half the bytes, and llm.c and older zinf read it), else
// version 2. Readers take both, so the choice never changes what is read.
enum class TokenFileFormat { kAuto, kUint16, kUint32 };

// Writes `tokens` as a token file: into a new temporary file beside `path`,
// fsynced, renamed over `path`, directory fsynced. kInvalidArgument naming
// the index when kUint16 is asked for and a token does not fit 16 bits.
Status WriteTokenFile(const std::string& path, std::span<const uint32_t> tokens,
                      TokenFileFormat format = TokenFileFormat::kAuto);
// Reads and checks a token file. Errors: kNotFound, kCorruption naming the
// file (a header cut short, bad magic, another version, a negative count, a
// size that disagrees with the count: "truncated" when short, "size
// mismatch" when long), and kInvalidArgument naming the token index when a
// token is >= vocab_size (vocab_size 0: no check).
StatusOr<std::vector<uint32_t>> ReadTokenFile(const std::string& path, int64_t vocab_size = 0);
// The bytes per token of a file's (magic, version), or 0 when zinf does not
// read that kind.
int TokenFileTokenBytes(int32_t magic, int32_t version);

static_assert(std::endian::native == std::endian::little, "token files are little-endian, read in place");

// A run of tokens read in place: `count` little-endian tokens of `width`
// bytes (2 or 4) at `data`. Refers, does not own.
struct TokenView {
  const unsigned char* data = nullptr;
  int width = 4;
  int64_t count = 0;

  TokenView() = default;
  TokenView(const unsigned char* d, int w, int64_t n) : data(d), width(w), count(n) {}
  TokenView(std::span<const uint32_t> tokens)  // NOLINT: a span of tokens is a view of them
      : data(reinterpret_cast<const unsigned char*>(tokens.data())),
        width(4),
        count(static_cast<int64_t>(tokens.size())) {}
  TokenView(const std::vector<uint32_t>& tokens) : TokenView(std::span<const uint32_t>(tokens)) {}  // NOLINT
  TokenView(const std::vector<uint32_t>&& tokens) = delete;  // a view of a temporary would dangle

  int64_t size() const { return count; }
  bool empty() const { return count == 0; }
  uint32_t operator[](int64_t i) const {
    if (width == 2) {
      uint16_t t;
      std::memcpy(&t, data + 2 * i, 2);
      return t;
    }
    uint32_t t;
    std::memcpy(&t, data + 4 * i, 4);
    return t;
  }
  TokenView Sub(int64_t begin, int64_t n) const { return {data + begin * width, width, n}; }
};

// Tokens to train on: a token file mapped read-only (Map) or tokens held in
// memory (the built-in corpus). Movable; the views it hands out live as
// long as it does. A mapped file must not shrink or change while it is
// mapped (zinf's writers replace files whole: WriteTokenFile renames a new
// one into place): a truncated file's pages fault (SIGBUS), and one
// rewritten in place changes what is read after its identity was taken.
class Tokens {
 public:
  Tokens();
  explicit Tokens(std::vector<uint32_t> held);
  // Maps and checks a token file: ReadTokenFile's errors, each token checked
  // against vocab_size (0: no check, and no pass over the tokens) as it
  // reads; that one pass takes the identity too.
  static StatusOr<Tokens> Map(const std::string& path, int64_t vocab_size = 0);
  Tokens(Tokens&&) noexcept;
  Tokens& operator=(Tokens&&) noexcept;
  ~Tokens();

  TokenView view() const { return view_; }
  int64_t size() const { return view_.count; }
  // TokenIdentity(view()): the one Map's pass took, else computed now.
  std::string Identity() const;

 private:
  struct Mapping;
  std::vector<uint32_t> held_;
  std::unique_ptr<Mapping> mapping_;
  TokenView view_;
  std::string identity_;  // empty until taken
};

// The data's identity in a checkpoint manifest: "tokens=N crc32c=X", the CRC
// of the tokens as little-endian uint16 when they all fit (what checkpoints
// made before 32-bit token files recorded, so those still resume, whatever
// the file's width), else as uint32 with " width=32" after it.
std::string TokenIdentity(TokenView tokens);

// Bytes are tokens 0..255; kEndOfText separates documents.
class ByteTokenizer {
 public:
  static constexpr uint32_t kEndOfText = 256;
  static constexpr int kVocabSize = 257;
  static std::vector<uint32_t> Encode(std::string_view text);
  // Bytes back; kEndOfText becomes "\n\n"; tokens >= kVocabSize become '?'.
  static std::string Decode(std::span<const uint32_t> tokens);
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
std::vector<uint32_t> BuiltinCorpusTokens(int64_t bytes, uint64_t seed);

// Where a DataLoader is: the epoch and the next global batch within it.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const LoaderPosition&) const = default;
};

// The order a DataLoader visits its samples in.
enum class DataOrder {
  kShuffled,    // a permutation per epoch, deterministic in (seed, epoch)
  kSequential,  // file order: global batch k is tokens [k*W*B*T, (k+1)*W*B*T + 1), as llm.c's loader
};
// "shuffled" | "sequential"; kInvalidArgument naming the value otherwise.
StatusOr<DataOrder> ParseDataOrder(std::string_view name);
const char* DataOrderName(DataOrder order);

// Cuts a token stream into samples of seq_len + 1 tokens (inputs and the
// next-token targets) starting at multiples of seq_len, visits them in
// `order` (shuffled: per epoch, deterministic in seed and epoch), and deals
// each global batch of world_size * batch samples out by rank: rank r gets
// samples [r*batch, (r+1)*batch). A partial last global batch of an epoch is
// skipped. In sequential order a batch is thus batch*seq_len + 1
// consecutive tokens, the next one starting batch*seq_len later (after the
// other ranks' shares), and the epoch wraps to the file's start when the
// next global batch would run past its end. The loader only holds a view:
// `tokens` must outlive it.
class DataLoader {
 public:
  // kInvalidArgument when the stream holds fewer than one global batch.
  static StatusOr<DataLoader> Create(TokenView tokens, int batch, int seq_len, uint64_t seed, int rank = 0,
                                     int world_size = 1, DataOrder order = DataOrder::kShuffled);

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

  TokenView tokens_;
  int batch_ = 0, seq_len_ = 0, rank_ = 0, world_size_ = 1;
  uint64_t seed_ = 0;
  DataOrder data_order_ = DataOrder::kShuffled;
  int64_t num_samples_ = 0;
  std::vector<int64_t> order_;  // this epoch's sample order
  LoaderPosition position_;
};

}  // namespace zinf::model
