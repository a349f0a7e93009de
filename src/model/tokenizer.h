// Tokenizers of Hugging Face model folders, for `zinf data encode`.
//
// Two kinds, chosen by what the folder ships:
//  * tokenizer.model: SentencePiece (Llama 2, Mistral), through the
//    sentencepiece library itself.
//  * tokenizer.json (model.type "BPE"): byte-level BPE as GPT-2, Llama 3 and
//    Qwen2 use, and BPE with byte fallback as transformers converts
//    SentencePiece models (Llama 2, Mistral, TinyLlama). Supported parts,
//    everything else refused by name:
//      normalizer      null, NFC (through ICU), Prepend, Replace with a
//                      String pattern, or a Sequence of them (applied to
//                      each stretch of text between added tokens)
//      pre_tokenizer   ByteLevel (with GPT-2's regex when use_regex, and
//                      add_prefix_space), Split with a Regex or String
//                      pattern and behavior Isolated, Metaspace
//                      (replacement, prepend_scheme always / first / never
//                      or the older add_prefix_space, split), or a
//                      Sequence of them; regexes run on PCRE2 with UTF and
//                      UCP, so \p{L}, \p{N} and \s are Unicode classes
//      model           BPE with vocab and merges (strings "a b" or pairs),
//                      ignore_merges, unk_token, fuse_unk, byte_fallback (a
//                      character outside the vocabulary becomes its UTF-8
//                      bytes' <0xNN> tokens); no dropout, no
//                      continuing_subword_prefix / end_of_word_suffix
//      added_tokens    matched in the text before anything else
//                      (leftmost, longest first; lstrip / rstrip honoured)
//
// Encode gives the ids of the text alone, as HF's encode(text,
// add_special_tokens=False) does: no BOS; documents end with eos_id(),
// which the caller appends. The end-of-sequence token comes from
// tokenizer_config.json's eos_token, else from a special token the
// post-processor's template appends after the sequence, else from an added
// token "<|endoftext|>" (GPT-2, whose tokenizer.json names none).
//
// Thread-safety: Encode keeps a cache of encoded words; one thread uses a
// Tokenizer at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::model {

class Tokenizer {
 public:
  // `path`: a folder (tokenizer.model, else tokenizer.json, with
  // tokenizer_config.json beside it when there is one) or a tokenizer.json
  // file. kNotFound when neither file is there; kInvalidArgument naming the
  // file and the key for a part this reader does not implement; `eos`
  // non-empty names the end-of-sequence token instead (kInvalidArgument
  // when the vocabulary lacks it).
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path, const std::string& eos = "");
  virtual ~Tokenizer() = default;

  // The ids of `text` (UTF-8; kInvalidArgument naming the byte offset of
  // the first bad sequence otherwise).
  virtual StatusOr<std::vector<uint32_t>> Encode(std::string_view text) = 0;
  // One more than the largest id the tokenizer can produce.
  virtual int64_t vocab_size() const = 0;
  uint32_t eos_id() const { return eos_id_; }
  const std::string& eos_token() const { return eos_token_; }
  // "byte-level BPE (<file>)", "BPE with byte fallback (<file>)" or
  // "SentencePiece (<file>)".
  const std::string& description() const { return description_; }

 protected:
  uint32_t eos_id_ = 0;
  std::string eos_token_;
  std::string description_;
};

}  // namespace zinf::model
