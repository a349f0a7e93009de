// Token files, the loader, the byte tokenizer and the built-in corpus.
//
// Everything random here (the corpus grammar, the loader's per-epoch order)
// draws from one small integer generator, splitmix64, and never from a
// std::*_distribution: those differ between standard libraries, and the same
// seed must give the same corpus and the same batches on every machine, or a
// resumed run would not continue the run it resumes.
#include "model/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "core/crc32c.h"
#include "core/fs.h"

namespace zinf::model {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): a 64-bit state advanced by a fixed
// odd constant and a strong output mix. Fast, tiny, and the same everywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return Mix(state_);
  }
  // A value in [0, n), n > 0. The modulo bias (< n / 2^64) is irrelevant here.
  uint64_t Below(uint64_t n) { return Next() % n; }
  // True with probability percent / 100.
  bool Chance(int percent) { return Below(100) < static_cast<uint64_t>(percent); }

  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

constexpr int64_t kHeaderBytes = kTokenFileHeaderInts * 4;

void PutLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}
uint32_t GetLe32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// Reads up to `n` bytes at `offset`; returns the count read (short only at
// end of file).
StatusOr<int64_t> ReadAt(int fd, const std::string& path, void* buf, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, static_cast<char*>(buf) + done, static_cast<size_t>(n - done), offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoStatus(errno, "read", path, offset + done, n - done);
    if (got == 0) break;
    done += got;
  }
  return done;
}

}  // namespace

// ---------------------------------------------------------------------------
// Token files

int TokenFileTokenBytes(int32_t magic, int32_t version) {
  if (magic == kTokenFileMagic && version == kTokenFileVersion) return 2;
  if (magic == kTokenFileMagic && version == kTokenFileVersion32) return 4;
  if (magic == kLlmcLlama3Magic && version == kLlmcLlama3Version) return 4;
  return 0;
}

Status WriteTokenFile(const std::string& path, std::span<const uint32_t> tokens, TokenFileFormat format) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::InvalidArgument("token file " + path + ": " + std::to_string(tokens.size()) +
                                   " tokens do not fit the header's int32 count");
  }
  const auto wide = std::find_if(tokens.begin(), tokens.end(), [](uint32_t t) { return t > 0xFFFF; });
  if (format == TokenFileFormat::kUint16 && wide != tokens.end()) {
    return Status::InvalidArgument("token file " + path + ": token " + std::to_string(wide - tokens.begin()) + " is " +
                                   std::to_string(*wide) + ", which does not fit version 1's uint16");
  }
  const bool narrow = format == TokenFileFormat::kUint16 || (format == TokenFileFormat::kAuto && wide == tokens.end());
  const size_t width = narrow ? 2 : 4;
  std::string bytes(static_cast<size_t>(kHeaderBytes) + width * tokens.size(), '\0');
  PutLe32(&bytes[0], static_cast<uint32_t>(kTokenFileMagic));
  PutLe32(&bytes[4], static_cast<uint32_t>(narrow ? kTokenFileVersion : kTokenFileVersion32));
  PutLe32(&bytes[8], static_cast<uint32_t>(tokens.size()));
  char* out = bytes.data() + kHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (size_t b = 0; b < width; ++b) out[width * i + b] = static_cast<char>((tokens[i] >> (8 * b)) & 0xFF);
  }
  return WriteFileAtomic(path, bytes).WithContext("write token file " + path);
}

namespace {

// TokenIdentity a run of tokens at a time: the CRC of the tokens' own bytes
// and, while every id fits 16 bits, of their uint16 bytes (a 32-bit view's
// narrowed a chunk at a time).
class IdentitySum {
 public:
  explicit IdentitySum(int width) : width_(width) {}
  void Add(TokenView run) {
    count_ += run.size();
    own_ = Crc32cExtend(own_, run.data, static_cast<size_t>(run.size() * width_));
    if (width_ == 2 || !fits16_) return;
    chunk_.resize(static_cast<size_t>(2 * run.size()));
    for (int64_t i = 0; i < run.size(); ++i) {
      const uint32_t t = run[i];
      if (t > 0xFFFF) {
        fits16_ = false;
        return;
      }
      chunk_[static_cast<size_t>(2 * i)] = static_cast<unsigned char>(t & 0xFF);
      chunk_[static_cast<size_t>(2 * i + 1)] = static_cast<unsigned char>(t >> 8);
    }
    narrowed_ = Crc32cExtend(narrowed_, chunk_.data(), chunk_.size());
  }
  std::string Finish() const {
    const bool narrow = width_ == 2 || fits16_;
    char text[16];
    std::snprintf(text, sizeof(text), "%08x", width_ == 4 && fits16_ ? narrowed_ : own_);
    return "tokens=" + std::to_string(count_) + " crc32c=" + text + (narrow ? "" : " width=32");
  }
  // Tokens a run: the CRC and the check stay in the cache between them.
  static constexpr int64_t kRun = int64_t{1} << 16;

 private:
  int width_;
  int64_t count_ = 0;
  uint32_t own_ = 0, narrowed_ = 0;
  bool fits16_ = true;
  std::vector<unsigned char> chunk_;
};

}  // namespace

// The file's pages, mapped read-only.
struct Tokens::Mapping {
  void* base = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, bytes);
  }
};

Tokens::Tokens(std::vector<uint32_t> held) : held_(std::move(held)), view_(held_) {}
Tokens::Tokens() = default;
// A vector's buffer moves with it, and the mapping with its pointer: the view
// stays good; the moved-from Tokens is left empty.
Tokens::Tokens(Tokens&& o) noexcept
    : held_(std::move(o.held_)), mapping_(std::move(o.mapping_)), view_(std::exchange(o.view_, TokenView())) {}
Tokens& Tokens::operator=(Tokens&& o) noexcept {
  held_ = std::move(o.held_);
  mapping_ = std::move(o.mapping_);
  view_ = std::exchange(o.view_, TokenView());
  return *this;
}
Tokens::~Tokens() = default;

StatusOr<Tokens> Tokens::Map(const std::string& path, int64_t vocab_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open token file", path);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "stat token file", path);
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument("token file " + path + ": not a regular file");
  const int64_t file_bytes = st.st_size;
  const std::string where = "token file " + path + ": ";
  if (file_bytes < kHeaderBytes) {
    return Status::Corruption(where + "truncated header: " + std::to_string(file_bytes) +
                              " bytes, the header alone is " + std::to_string(kHeaderBytes));
  }
  std::array<unsigned char, 12> head{};
  ZINF_ASSIGN_OR_RETURN(const int64_t got_head, ReadAt(fd, path, head.data(), 12, 0));
  if (got_head != 12) return Status::Corruption(where + "truncated header (the file shrank while being read)");
  const auto magic = static_cast<int32_t>(GetLe32(&head[0]));
  const auto version = static_cast<int32_t>(GetLe32(&head[4]));
  const auto count = static_cast<int32_t>(GetLe32(&head[8]));
  if (magic != kTokenFileMagic && magic != kLlmcLlama3Magic) {
    return Status::Corruption(where + "bad magic " + std::to_string(magic) + " (a token file starts with " +
                              std::to_string(kTokenFileMagic) + ", or " + std::to_string(kLlmcLlama3Magic) +
                              " for llm.c's uint32 files)");
  }
  const int width = TokenFileTokenBytes(magic, version);
  if (width == 0) {
    return Status::Corruption(where + "version " + std::to_string(version) + " of magic " + std::to_string(magic) +
                              " is not supported (" + std::to_string(kTokenFileMagic) + " has 1: uint16 tokens, 2: " +
                              "uint32 tokens; " + std::to_string(kLlmcLlama3Magic) + " has 7: uint32 tokens)");
  }
  if (count < 0) return Status::Corruption(where + "negative token count " + std::to_string(count));
  const int64_t want_bytes = kHeaderBytes + width * static_cast<int64_t>(count);
  const std::string sizes = "the header says " + std::to_string(count) + " tokens of " + std::to_string(width) +
                            " bytes (" + std::to_string(want_bytes) + " bytes in all) but the file has " +
                            std::to_string(file_bytes) + " bytes";
  if (file_bytes < want_bytes) return Status::Corruption(where + "truncated: " + sizes);
  if (file_bytes > want_bytes) return Status::Corruption(where + "size mismatch: " + sizes);
  Tokens t;
  t.mapping_ = std::make_unique<Mapping>();
  t.mapping_->bytes = static_cast<size_t>(file_bytes);
  void* base = ::mmap(nullptr, t.mapping_->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED) return ErrnoStatus(errno, "mmap token file", path);
  t.mapping_->base = base;
  // Read once, front to back (the check), then in the loader's order.
  ::madvise(base, t.mapping_->bytes, MADV_SEQUENTIAL);
  t.view_ = TokenView(static_cast<const unsigned char*>(base) + kHeaderBytes, width, count);
  if (vocab_size > 0) {
    IdentitySum identity(width);
    for (int64_t begin = 0; begin < count; begin += IdentitySum::kRun) {
      const TokenView run = t.view_.Sub(begin, std::min<int64_t>(IdentitySum::kRun, count - begin));
      for (int64_t i = 0; i < run.size(); ++i) {
        const uint32_t token = run[i];
        if (token >= vocab_size) {
          const int64_t at = begin + i;
          return Status::InvalidArgument(where + "token " + std::to_string(at) + " (byte offset " +
                                         std::to_string(kHeaderBytes + width * at) + ") is " + std::to_string(token) +
                                         ", outside the model's vocabulary of " + std::to_string(vocab_size));
        }
      }
      identity.Add(run);
    }
    t.identity_ = identity.Finish();
  }
  ::madvise(base, t.mapping_->bytes, MADV_NORMAL);  // the kernel's readahead adapts to the loader's order
  return t;
}

StatusOr<std::vector<uint32_t>> ReadTokenFile(const std::string& path, int64_t vocab_size) {
  ZINF_ASSIGN_OR_RETURN(Tokens mapped, Tokens::Map(path, vocab_size));
  const TokenView v = mapped.view();
  std::vector<uint32_t> tokens(static_cast<size_t>(v.size()));
  for (int64_t i = 0; i < v.size(); ++i) tokens[static_cast<size_t>(i)] = v[i];
  return tokens;
}

std::string TokenIdentity(TokenView tokens) {
  IdentitySum identity(tokens.width);
  for (int64_t begin = 0; begin < tokens.size(); begin += IdentitySum::kRun) {
    identity.Add(tokens.Sub(begin, std::min<int64_t>(IdentitySum::kRun, tokens.size() - begin)));
  }
  return identity.Finish();
}

std::string Tokens::Identity() const { return identity_.empty() ? TokenIdentity(view_) : identity_; }

// ---------------------------------------------------------------------------
// Byte tokenizer

std::vector<uint32_t> ByteTokenizer::Encode(std::string_view text) {
  std::vector<uint32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::Decode(std::span<const uint32_t> tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (uint32_t t : tokens) {
    if (t < 256) {
      out.push_back(static_cast<char>(t));
    } else if (t == kEndOfText) {
      out += "\n\n";
    } else {
      out.push_back('?');
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Built-in corpus
//
// Short stories from a fixed grammar. Each document is a title line, then one
// paragraph of sentences about one protagonist (name and pronoun kept
// consistent), one object with one adjective (repeated, so a model gains by
// copying from context) and one place. Some facts never change between
// documents (what each animal eats and says), counting runs in order, and the
// words come from small lists: a byte-level model first learns spelling, then
// the sentence frames, then the in-document repetitions, each a drop in loss
// well below the unigram entropy of the bytes (about 4.2 bits).
//
// A document is "Title\nBody\n" followed by one more "\n": documents are
// separated by a blank line, and no document holds "\n\n" itself, so
// BuiltinCorpusTokens can turn each "\n\n" into kEndOfText and Decode turns it
// back.
namespace {

struct Person {
  const char* name;
  const char* subject;     // he / she
  const char* possessive;  // his / her
};
constexpr Person kPeople[] = {
    {"Anna", "she", "her"}, {"Ben", "he", "his"},   {"Clara", "she", "her"}, {"David", "he", "his"},
    {"Emma", "she", "her"}, {"Felix", "he", "his"}, {"Grace", "she", "her"}, {"Henry", "he", "his"},
    {"Iris", "she", "her"}, {"Jack", "he", "his"},  {"Lucy", "she", "her"},  {"Max", "he", "his"},
    {"Nora", "she", "her"}, {"Oscar", "he", "his"}, {"Rosa", "she", "her"},  {"Sam", "he", "his"},
};

struct Animal {
  const char* singular;
  const char* plural;
  const char* food;   // always the same for one animal: a fact to learn
  const char* sound;  // likewise
};
constexpr Animal kAnimals[] = {
    {"cat", "cats", "fish", "meows"},     {"dog", "dogs", "bones", "barks"},
    {"fox", "foxes", "berries", "yelps"}, {"owl", "owls", "mice", "hoots"},
    {"horse", "horses", "hay", "neighs"}, {"rabbit", "rabbits", "carrots", "sniffs"},
    {"duck", "ducks", "bread", "quacks"}, {"frog", "frogs", "flies", "croaks"},
    {"bear", "bears", "honey", "growls"}, {"goat", "goats", "grass", "bleats"},
};

struct Thing {
  const char* singular;
  const char* plural;
};
constexpr Thing kThings[] = {
    {"ball", "balls"}, {"book", "books"},   {"cup", "cups"},       {"kite", "kites"},
    {"box", "boxes"},  {"apple", "apples"}, {"hat", "hats"},       {"key", "keys"},
    {"lamp", "lamps"}, {"map", "maps"},     {"basket", "baskets"}, {"letter", "letters"},
};

constexpr const char* kPlaces[] = {"garden",  "forest", "kitchen", "river", "market",
                                   "library", "school", "park",    "beach", "village"};
constexpr const char* kAdjectives[] = {"red", "blue", "green", "yellow", "small",
                                       "big", "old",  "new",   "shiny",  "heavy"};
constexpr const char* kVerbsPast[] = {"found",   "carried", "painted", "opened", "dropped",
                                      "cleaned", "bought",  "hid",     "washed", "showed"};
constexpr const char* kFeelings[] = {"happy", "sad", "tired", "surprised", "proud", "hungry", "curious", "calm"};
constexpr const char* kTimes[] = {"In the morning", "At noon",     "In the evening",
                                  "At night",       "After lunch", "On Sunday"};
constexpr const char* kWeather[] = {"sunny", "rainy", "windy", "cold", "warm", "quiet"};
constexpr const char* kNumbers[] = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine"};

template <typename T, size_t N>
const T& Pick(SplitMix64& rng, const T (&items)[N]) {
  return items[rng.Below(N)];
}

std::string Capitalized(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

// One story (without the separating blank line).
std::string GenerateDocument(SplitMix64& rng) {
  const Person& hero = Pick(rng, kPeople);
  const Person* pal = &Pick(rng, kPeople);
  while (pal == &hero) pal = &Pick(rng, kPeople);
  const Thing& thing = Pick(rng, kThings);
  const std::string adjective = Pick(rng, kAdjectives);
  const std::string place = Pick(rng, kPlaces);
  const Animal& animal = Pick(rng, kAnimals);
  const std::string name = hero.name;
  const std::string he = hero.subject;
  const std::string his = hero.possessive;
  const std::string obj = thing.singular;

  std::string doc = "The " + adjective + " " + obj + "\n";
  auto sentence = [&doc](const std::string& s) {
    if (doc.back() != '\n') doc += ' ';
    doc += s;
  };
  // Each draw is its own statement: the operands of one expression are
  // evaluated in an unspecified order, and the corpus must not depend on the
  // compiler.
  if (rng.Chance(50)) {
    const std::string time = Pick(rng, kTimes);
    sentence(time + ", " + name + " went to the " + place + ".");
  } else {
    const std::string weather = Pick(rng, kWeather);
    sentence("It was a " + weather + " day in the " + place + ". " + name + " was there.");
  }
  // The protagonist by name or by pronoun, at the start of a sentence.
  auto subject = [&]() { return rng.Chance(40) ? name : Capitalized(he); };
  const int sentences = 3 + static_cast<int>(rng.Below(6));
  for (int i = 0; i < sentences; ++i) {
    const uint64_t kind = rng.Below(9);
    const std::string who = subject();
    switch (kind) {
      case 0: {
        const std::string verb = Pick(rng, kVerbsPast);
        sentence(who + " " + verb + " the " + adjective + " " + obj + ".");
        break;
      }
      case 1: {
        const std::string feeling = Pick(rng, kFeelings);
        sentence(who + " was " + feeling + " because the " + obj + " was " + adjective + ".");
        break;
      }
      case 2:
        sentence("A " + std::string(animal.singular) + " came to the " + place + ". The " + animal.singular + " " +
                 animal.sound + ".");
        break;
      case 3:
        sentence(Capitalized(animal.plural) + " like " + animal.food + ", so " + he + " gave the " + animal.singular +
                 " some " + animal.food + ".");
        break;
      case 4: {
        const int n = 2 + static_cast<int>(rng.Below(8));  // two .. nine
        std::string counting = who + " counted " + kNumbers[n - 1] + " " + thing.plural + ":";
        for (int k = 0; k < n; ++k) counting += std::string(k == 0 ? " " : ", ") + kNumbers[k];
        sentence(counting + ".");
        break;
      }
      case 5: sentence("\"Where is my " + obj + "?\" asked " + name + "."); break;
      case 6:
        sentence(name + " gave the " + obj + " to " + pal->name + ". " + pal->name + " said, \"Thank you, " + name +
                 "!\"");
        break;
      case 7: sentence("\"I like the " + place + ",\" said " + name + "."); break;
      default: {
        const std::string where = Pick(rng, kPlaces);
        sentence(who + " put " + his + " " + obj + " in the " + where + ".");
        break;
      }
    }
  }
  const bool the_end = rng.Chance(50);
  sentence(the_end ? std::string("The end.") : Capitalized(he) + " went home.");
  doc += '\n';
  return doc;
}

}  // namespace

std::string GenerateCorpus(int64_t bytes, uint64_t seed) {
  std::string text;
  if (bytes <= 0) return text;
  text.reserve(static_cast<size_t>(bytes) + 1024);
  SplitMix64 rng(SplitMix64::Mix(seed ^ 0x636F72707573ull));  // "corpus"
  while (static_cast<int64_t>(text.size()) < bytes) {
    text += GenerateDocument(rng);
    text += '\n';
  }
  // Exactly `bytes`: the last document is cut where the budget ends.
  text.resize(static_cast<size_t>(bytes));
  return text;
}

std::vector<uint32_t> BuiltinCorpusTokens(int64_t bytes, uint64_t seed) {
  const std::string text = GenerateCorpus(bytes, seed);
  std::vector<uint32_t> tokens;
  tokens.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' && i + 1 < text.size() && text[i + 1] == '\n') {
      tokens.push_back(ByteTokenizer::kEndOfText);
      ++i;
    } else {
      tokens.push_back(static_cast<unsigned char>(text[i]));
    }
  }
  return tokens;
}

// ---------------------------------------------------------------------------
// DataLoader

StatusOr<DataOrder> ParseDataOrder(std::string_view name) {
  if (name == "shuffled") return DataOrder::kShuffled;
  if (name == "sequential") return DataOrder::kSequential;
  return Status::InvalidArgument("data order must be shuffled or sequential, got '" + std::string(name) + "'");
}

const char* DataOrderName(DataOrder order) { return order == DataOrder::kSequential ? "sequential" : "shuffled"; }

StatusOr<DataLoader> DataLoader::Create(TokenView tokens, int batch, int seq_len, uint64_t seed, int rank,
                                        int world_size, DataOrder order) {
  if (batch <= 0 || seq_len <= 0) {
    return Status::InvalidArgument("data loader: batch " + std::to_string(batch) + " and seq_len " +
                                   std::to_string(seq_len) + " must be positive");
  }
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    return Status::InvalidArgument("data loader: rank " + std::to_string(rank) + " is not in a world of " +
                                   std::to_string(world_size));
  }
  const int64_t samples = tokens.empty() ? 0 : static_cast<int64_t>(tokens.size() - 1) / seq_len;
  const int64_t global = static_cast<int64_t>(batch) * world_size;
  if (samples < global) {
    return Status::InvalidArgument("data loader: " + std::to_string(tokens.size()) + " tokens make " +
                                   std::to_string(samples) + " samples of " + std::to_string(seq_len + 1) +
                                   " tokens, fewer than one global batch of " + std::to_string(global) + " (" +
                                   std::to_string(world_size) + " ranks x batch " + std::to_string(batch) + ")");
  }
  DataLoader loader;
  loader.tokens_ = tokens;
  loader.batch_ = batch;
  loader.seq_len_ = seq_len;
  loader.rank_ = rank;
  loader.world_size_ = world_size;
  loader.seed_ = seed;
  loader.data_order_ = order;
  loader.num_samples_ = samples;
  loader.Shuffle();
  return loader;
}

int64_t DataLoader::batches_per_epoch() const { return num_samples_ / (static_cast<int64_t>(batch_) * world_size_); }

void DataLoader::Shuffle() {
  order_.resize(static_cast<size_t>(num_samples_));
  for (int64_t i = 0; i < num_samples_; ++i) order_[static_cast<size_t>(i)] = i;
  if (data_order_ == DataOrder::kSequential) return;
  // Every rank builds the same permutation: it depends on (seed, epoch) only.
  SplitMix64 rng(SplitMix64::Mix(seed_) ^ SplitMix64::Mix(static_cast<uint64_t>(position_.epoch) + 1));
  for (int64_t i = num_samples_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(i) + 1));
    std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
  }
}

void DataLoader::Next(int32_t* inputs, int32_t* targets) {
  const int64_t first = position_.batch * batch_ * world_size_ + static_cast<int64_t>(rank_) * batch_;
  for (int b = 0; b < batch_; ++b) {
    const int64_t start = order_[static_cast<size_t>(first + b)] * seq_len_;
    const TokenView src = tokens_.Sub(start, seq_len_ + 1);
    int32_t* in = inputs + static_cast<int64_t>(b) * seq_len_;
    int32_t* tg = targets + static_cast<int64_t>(b) * seq_len_;
    for (int t = 0; t < seq_len_; ++t) {
      in[t] = static_cast<int32_t>(src[t]);
      tg[t] = static_cast<int32_t>(src[t + 1]);
    }
  }
  if (++position_.batch == batches_per_epoch()) {
    ++position_.epoch;
    position_.batch = 0;
    Shuffle();
  }
}

Status DataLoader::Seek(LoaderPosition position) {
  if (position.epoch < 0 || position.batch < 0 || position.batch >= batches_per_epoch()) {
    return Status::InvalidArgument("data loader: cannot seek to epoch " + std::to_string(position.epoch) + " batch " +
                                   std::to_string(position.batch) + ": an epoch has " +
                                   std::to_string(batches_per_epoch()) + " batches");
  }
  const bool reshuffle = position.epoch != position_.epoch;
  position_ = position;
  if (reshuffle) Shuffle();
  return Status::Ok();
}

}  // namespace zinf::model
