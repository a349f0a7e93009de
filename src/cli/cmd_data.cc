// zinf data encode | corpus | info: make and inspect token files (the llm.c
// layout: 256 int32 header, uint16 or uint32 tokens) with a model's tokenizer
// (model/tokenizer.h) or the byte tokenizer.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/units.h"
#include "model/data.h"
#include "model/tokenizer.h"

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

// The documents of one input: a .jsonl file's lines' "text" fields (blank
// lines skipped), any other file whole, as bytes.
Status ReadDocuments(const std::string& path, std::vector<std::string>& docs) {
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadText(path));
  if (path.size() < 6 || path.compare(path.size() - 6, 6, ".jsonl") != 0) {
    docs.push_back(std::move(text));
    return Status::Ok();
  }
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    if (j.is_discarded()) return Status::InvalidArgument(where + "not a JSON value");
    if (!j.is_object() || !j.contains("text")) return Status::InvalidArgument(where + "no \"text\" field");
    if (!j["text"].is_string()) return Status::InvalidArgument(where + "\"text\" is not a string");
    docs.push_back(j["text"].get<std::string>());
  }
  return Status::Ok();
}

int RunEncode(const std::vector<std::string>& args) {
  constexpr char kName[] = "data encode";
  auto flags = Flags::Parse(args, {"input", "output", "tokenizer", "eos"});
  if (!flags.ok()) return Fail(kName, flags.status(), 2);
  const std::vector<std::string> inputs = flags->GetAll("input");
  const auto output = flags->Get("output");
  if (inputs.empty() || !output || !flags->positionals().empty()) {
    return Fail(kName, Status::InvalidArgument("give --input TEXT|FILE.jsonl (one or more) and --output TOKENS.bin"),
                2);
  }
  std::unique_ptr<model::Tokenizer> tokenizer;
  if (const auto dir = flags->Get("tokenizer")) {
    auto t = model::Tokenizer::Load(*dir, flags->GetOr("eos", ""));
    if (!t.ok()) return Fail(kName, t.status().WithContext("--tokenizer"), 2);
    tokenizer = std::move(t).value();
  } else if (flags->Has("eos")) {
    return Fail(kName, Status::InvalidArgument("--eos needs --tokenizer (the byte tokenizer's is 256)"), 2);
  }
  std::vector<uint32_t> tokens;
  int64_t documents = 0;
  for (const std::string& path : inputs) {
    std::vector<std::string> docs;
    if (Status st = ReadDocuments(path, docs); !st.ok()) return Fail(kName, st);
    for (const std::string& doc : docs) {
      if (tokenizer) {
        auto ids = tokenizer->Encode(doc);
        if (!ids.ok())
          return Fail(kName, ids.status().WithContext(path + ", document " + std::to_string(documents + 1)));
        tokens.insert(tokens.end(), ids->begin(), ids->end());
        tokens.push_back(tokenizer->eos_id());
      } else {
        const std::vector<uint32_t> ids = ByteTokenizer::Encode(doc);
        tokens.insert(tokens.end(), ids.begin(), ids.end());
        tokens.push_back(ByteTokenizer::kEndOfText);
      }
      ++documents;
    }
  }
  if (Status st = model::WriteTokenFile(*output, tokens); !st.ok()) return Fail(kName, st);
  const bool wide = std::any_of(tokens.begin(), tokens.end(), [](uint32_t t) { return t > 0xFFFF; });
  if (tokenizer) {
    std::printf("%s: %zu tokens from %lld documents (%s, vocabulary %lld, end of text %u %s; version %d)\n",
                output->c_str(), tokens.size(), static_cast<long long>(documents), tokenizer->description().c_str(),
                static_cast<long long>(tokenizer->vocab_size()), tokenizer->eos_id(), tokenizer->eos_token().c_str(),
                wide ? 2 : 1);
  } else {
    std::printf("%s: %zu tokens from %lld documents (byte tokenizer, vocabulary %d)\n", output->c_str(), tokens.size(),
                static_cast<long long>(documents), ByteTokenizer::kVocabSize);
  }
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
  // Read in place, twice over (the largest id, then a bit per id up to
  // it): nothing sized by the token count is held.
  auto mapped = model::Tokens::Map(path);
  if (!mapped.ok()) return Fail(kName, mapped.status());
  const model::TokenView tokens = mapped->view();
  int64_t max_token = -1, end_of_text = 0;
  for (int64_t i = 0; i < tokens.size(); ++i) {
    max_token = std::max<int64_t>(max_token, tokens[i]);
    end_of_text += tokens[i] == ByteTokenizer::kEndOfText;
  }
  std::vector<bool> seen(static_cast<size_t>(max_token + 1), false);
  int64_t distinct = 0;
  for (int64_t i = 0; i < tokens.size(); ++i) {
    auto bit = seen[tokens[i]];
    distinct += !bit;
    bit = true;
  }
  std::printf("%s\n", path.c_str());
  std::printf("  tokens: %lld\n", static_cast<long long>(tokens.size()));
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

ZINF_COMMAND({"data encode", "turn text or JSONL files into a token file (a model's tokenizer, or bytes)",
              "data encode --input FILE [--input FILE2 ...] --output TOKENS.bin [--tokenizer DIR|tokenizer.json]\n"
              "            [--eos TOKEN]\n"
              "  Each input is documents: a FILE.jsonl has one per line (its \"text\" field; blank lines\n"
              "  skipped), any other file is one document, read as bytes. Each document is encoded and\n"
              "  followed by the end-of-text token; documents are concatenated in the order given.\n"
              "  --tokenizer DIR   a Hugging Face model folder: its tokenizer.model (SentencePiece, as\n"
              "                    Llama 2 and Mistral ship) or else its tokenizer.json (byte-level BPE\n"
              "                    as GPT-2, Llama 3 and Qwen2 use); or a tokenizer.json file. The\n"
              "                    end-of-text token is tokenizer_config.json's eos_token, else the one\n"
              "                    the post-processor appends, else <|endoftext|>; --eos names another.\n"
              "                    Special tokens written in the text become their ids, as HF encodes.\n"
              "  without           the byte tokenizer: bytes are tokens 0..255, end of text 256\n"
              "                    (train with a vocabulary of 257).\n"
              "  The output is a token file in llm.c's layout (256 int32 header: magic 20240520,\n"
              "  version, count; then the tokens): version 1 (uint16) when every id fits 16 bits,\n"
              "  else version 2 (uint32); written to a new file, fsynced and renamed over TOKENS.bin.",
              RunEncode});

ZINF_COMMAND({"data corpus", "write the built-in generated corpus as a token file",
              "data corpus --output TOKENS.bin [--bytes 2M] [--seed 1]\n"
              "  Generates --bytes of English-like short stories from zinf's fixed grammar\n"
              "  (deterministic in --seed, no download) and writes them byte-tokenized, documents\n"
              "  separated by the end-of-text token 256 (vocabulary 257).",
              RunCorpus});

ZINF_COMMAND({"data info", "check a token file; print its token count, distinct and largest token",
              "data info TOKENS.bin\n"
              "  Reads and checks a token file (llm.c layout: version 1 uint16 or 2 uint32 tokens;\n"
              "  llm.c's Llama 3 files, magic 20240801, too) and prints the number of tokens, how many\n"
              "  distinct tokens it holds and the largest one (a model's vocabulary must exceed it).",
              RunInfo});

}  // namespace
}  // namespace zinf::cli
