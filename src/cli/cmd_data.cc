// zinf data encode | corpus | info: make and inspect token files for the
// reference GPT trainer (the llm.c layout: 256 int32 header, uint16 tokens).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/units.h"
#include "model/data.h"

namespace zinf::cli {
namespace {

using model::ByteTokenizer;

StatusOr<std::string> ReadText(const std::string& path) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno != 0 ? errno : EIO, "open", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return ErrnoStatus(errno != 0 ? errno : EIO, "read", path);
  return text.str();
}

int RunEncode(const std::vector<std::string>& args) {
  constexpr char kName[] = "data encode";
  auto flags = Flags::Parse(args, {"input", "output"});
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  const std::vector<std::string> inputs = flags->GetAll("input");
  const auto output = flags->Get("output");
  if (inputs.empty() || !output || !flags->positionals().empty()) {
    return Fail(kName, Status::InvalidArgument("give --input TEXT (one or more) and --output TOKENS.bin"), 2);
  }
  std::vector<uint32_t> tokens;
  for (const std::string& path : inputs) {
    auto text = ReadText(path);
    if (!text.ok()) return Fail(kName, text.status());
    const std::vector<uint32_t> doc = ByteTokenizer::Encode(*text);
    tokens.insert(tokens.end(), doc.begin(), doc.end());
    tokens.push_back(ByteTokenizer::kEndOfText);
  }
  if (Status st = model::WriteTokenFile(*output, tokens); !st.ok()) return Fail(kName, st);
  std::printf("%s: %zu tokens from %zu documents (byte tokenizer, vocabulary %d)\n", output->c_str(), tokens.size(),
              inputs.size(), ByteTokenizer::kVocabSize);
  return 0;
}

int RunCorpus(const std::vector<std::string>& args) {
  constexpr char kName[] = "data corpus";
  auto flags = Flags::Parse(args, {"output", "bytes", "seed"});
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  const auto output = flags->Get("output");
  if (!output || !flags->positionals().empty()) {
    return Fail(kName, Status::InvalidArgument("give --output TOKENS.bin"), 2);
  }
  auto bytes = flags->GetInt("bytes", 2 * kMiB);
  if (!bytes.ok()) return Fail(kName, bytes.status(), 2);
  auto seed = flags->GetInt("seed", 1);
  if (!seed.ok()) return Fail(kName, seed.status(), 2);
  if (*bytes <= 0) return Fail(kName, Status::InvalidArgument("--bytes must be positive"), 2);
  if (*seed < 0) return Fail(kName, Status::InvalidArgument("--seed must not be negative"), 2);
  const std::vector<uint32_t> tokens = model::BuiltinCorpusTokens(*bytes, static_cast<uint64_t>(*seed));
  if (Status st = model::WriteTokenFile(*output, tokens); !st.ok()) return Fail(kName, st);
  int64_t documents = 0;
  for (uint32_t t : tokens) documents += t == ByteTokenizer::kEndOfText;
  std::printf("%s: %zu tokens, %lld documents (built-in corpus, %s of text, seed %lld, vocabulary %d)\n",
              output->c_str(), tokens.size(), static_cast<long long>(documents), FormatBytes(*bytes).c_str(),
              static_cast<long long>(*seed), ByteTokenizer::kVocabSize);
  return 0;
}

int RunInfo(const std::vector<std::string>& args) {
  constexpr char kName[] = "data info";
  auto flags = Flags::Parse(args, {});
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  if (flags->positionals().size() != 1) return Fail(kName, Status::InvalidArgument("give one token file"), 2);
  const std::string& path = flags->positionals()[0];
  auto tokens = model::ReadTokenFile(path);
  if (!tokens.ok()) return Fail(kName, tokens.status());
  std::vector<uint32_t> sorted = *tokens;
  std::sort(sorted.begin(), sorted.end());
  const int64_t distinct = std::unique(sorted.begin(), sorted.end()) - sorted.begin();
  const int64_t max_token = tokens->empty() ? -1 : static_cast<int64_t>(sorted[static_cast<size_t>(distinct - 1)]);
  const int64_t end_of_text = std::count(tokens->begin(), tokens->end(), ByteTokenizer::kEndOfText);
  std::printf("%s\n", path.c_str());
  std::printf("  tokens: %zu\n", tokens->size());
  std::printf("  distinct tokens: %lld\n", static_cast<long long>(distinct));
  if (max_token >= 0) {
    std::printf("  max token: %lld (a model needs a vocabulary of at least %lld)\n", static_cast<long long>(max_token),
                static_cast<long long>(max_token + 1));
  }
  if (max_token >= 0 && max_token < ByteTokenizer::kVocabSize) {
    std::printf("  byte tokenizer: fits; %lld end-of-text tokens (%u)\n", static_cast<long long>(end_of_text),
                ByteTokenizer::kEndOfText);
  }
  return 0;
}

ZINF_COMMAND({"data encode", "turn text files into a token file (byte tokenizer)",
              "data encode --input TEXT [--input TEXT2 ...] --output TOKENS.bin\n"
              "  Encodes each input file with the byte tokenizer (bytes are tokens 0..255) as one\n"
              "  document, followed by the end-of-text token 256; the documents are concatenated in\n"
              "  the order given. Blank lines inside a file are kept as bytes. The output is a token\n"
              "  file in llm.c's layout (256 int32 header: magic 20240520, version 1, count; then\n"
              "  uint16 tokens), written to a new file, fsynced and renamed over TOKENS.bin.\n"
              "  Train with a vocabulary of 257.",
              RunEncode});

ZINF_COMMAND({"data corpus", "write the built-in generated corpus as a token file",
              "data corpus --output TOKENS.bin [--bytes 2M] [--seed 1]\n"
              "  Generates --bytes of English-like short stories from zinf's fixed grammar\n"
              "  (deterministic in --seed, no download) and writes them byte-tokenized, documents\n"
              "  separated by the end-of-text token 256 (vocabulary 257).",
              RunCorpus});

ZINF_COMMAND({"data info", "check a token file; print its token count, distinct and largest token",
              "data info TOKENS.bin\n"
              "  Reads and checks a token file (llm.c layout) and prints the number of tokens, how many\n"
              "  distinct tokens it holds and the largest one (a model's vocabulary must exceed it).",
              RunInfo});

}  // namespace
}  // namespace zinf::cli
