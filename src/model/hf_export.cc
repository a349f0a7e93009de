#include "model/hf_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "kernels/cpu_kernels.h"
#include "model/safetensors.h"

namespace zinf::model {
namespace {

// One engine tensor as the folder holds it: a tensor of the folder, or
// rows of one that several fill in turn (HfRowsOf: Phi-3's and GLM's fused
// projections), whose first part carries its name and whole shape; or a
// source tensor outside the model copied as it is (HfCheckpoint::kept:
// block -1, its own dtype).
struct OutTensor {
  BlockId block = 0;
  std::string dtype;  // a kept tensor's, or F32 (KeptInFp32); empty: the export's
  size_t index = 0;   // in the block's GptBlockSpecs order
  std::string name;
  std::vector<int64_t> shape;  // the file's (source) layout, the whole tensor's
  bool transpose = false;      // GPT-2 Conv1D: engine [out, in] -> file [in, out]
  bool first = true;           // the first (or only) part of its tensor
  int64_t bytes = 0;           // this part's
  int64_t tensor_bytes = 0;    // the whole tensor's
  size_t shard = 0;
  int64_t offset = 0;  // in its shard's data section
};

// The tensors in write order (block by block) with their shard and offset.
std::vector<OutTensor> PlanTensors(const GptConfig& model, const HfCheckpoint& names, int element_bytes,
                                   int64_t max_shard_bytes) {
  const std::vector<BlockSpec> specs = GptBlockSpecs(model);
  const BlockId head = HeadBlock(model);
  std::vector<OutTensor> plan;
  int64_t in_shard = 0;
  size_t shard = 0;
  // Appends `o` to the current shard, or to a new one where a tensor's first
  // part would overflow it (a tensor's parts go in one shard, after its first).
  auto place = [&](OutTensor o) {
    if (o.first && in_shard > 0 && in_shard + o.tensor_bytes > max_shard_bytes) {
      ++shard;
      in_shard = 0;
    }
    o.shard = shard;
    o.offset = in_shard;
    in_shard += o.bytes;
    plan.push_back(std::move(o));
  };
  for (BlockId b = 0; b < static_cast<BlockId>(specs.size()); ++b) {
    const std::vector<std::string> n = HfTensorNames(names, b);
    for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
      OutTensor o;
      o.block = b;
      o.index = t;
      o.name = n[t];
      o.shape = specs[b].tensors[t].shape;
      // The vocabulary padding rows are not part of the model.
      const bool vocab_rows = (b == kEmbedBlock && t == 0) || (b == head && static_cast<int>(t) == LmHeadIndex(model));
      if (vocab_rows) o.shape[0] = model.vocab_size;
      o.transpose = !model.llama() && b != kEmbedBlock && b != head && o.shape.size() == 2;
      if (o.transpose) std::swap(o.shape[0], o.shape[1]);
      if (HfBiasAsRow(names, b, t)) o.shape.insert(o.shape.begin(), 1);
      // A biased router's weight and bias stay F32 (as transformers saves them).
      if (b != kEmbedBlock && b != head && KeptInFp32(model, b - 1, static_cast<int>(t))) o.dtype = "F32";
      o.bytes = o.dtype.empty() ? element_bytes : ElementSizeBytes(ElementType::kF32);
      for (int64_t d : o.shape) o.bytes *= d;
      const HfRows rows = HfRowsOf(specs[b], n, t);
      o.first = rows.row == 0;
      o.tensor_bytes = o.bytes;
      if (rows.fused) {  // never transposed nor padded
        o.tensor_bytes = o.bytes / o.shape[0] * rows.rows;
        o.shape[0] = rows.rows;
      }
      place(std::move(o));
    }
  }
  for (const std::string& name : names.kept) {  // after the model's, in name order
    const SafetensorsHeader::Entry& e = names.tensors.at(name).entry;
    OutTensor o;
    o.block = -1;
    o.name = name;
    o.dtype = e.dtype;
    o.shape = e.shape;
    o.bytes = o.tensor_bytes = static_cast<int64_t>(e.end - e.begin);
    place(std::move(o));
  }
  return plan;
}

std::string ShardName(size_t shard, size_t shards) {
  if (shards == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", shard + 1, shards);
  return buf;
}

// The 8-byte length and the JSON header of one shard, padded to 8 bytes.
std::string ShardHeader(const std::vector<OutTensor>& plan, size_t shard, const std::string& dtype) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  for (const OutTensor& o : plan) {
    if (o.shard != shard || !o.first) continue;
    header[o.name] = {{"dtype", o.dtype.empty() ? dtype : o.dtype},
                      {"shape", o.shape},
                      {"data_offsets", {o.offset, o.offset + o.tensor_bytes}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  return out + text;
}

// The tensor's bytes in the file's dtype and layout (GPT-2's Conv1D
// weights transposed), into `bytes` (resized). kInvalidArgument naming the
// tensor when the block reader gave fewer values than the part holds.
Status Encode(const OutTensor& o, const std::vector<float>& w, const std::string& dtype,
              std::vector<std::byte>* bytes) {
  const ElementType type = *SafetensorsFloatType(dtype);  // checked by ExportHfFolder
  const int64_t n = o.bytes / ElementSizeBytes(type);
  if (static_cast<int64_t>(w.size()) < n) {
    return Status::InvalidArgument("export " + o.name + ": the block reader gave " + std::to_string(w.size()) +
                                   " values, the tensor holds " + std::to_string(n));
  }
  bytes->resize(static_cast<size_t>(o.bytes));
  if (!o.transpose) {
    kernels::cpu::CastOut(bytes->data(), type, w.data(), n);
    return Status::Ok();
  }
  // File [in, out] is the transpose of engine [out, in].
  kernels::cpu::TransposeCast(bytes->data(), type, w.data(), ElementType::kF32, o.shape[1], o.shape[0], 0, o.shape[0]);
  return Status::Ok();
}

// Appends to one open file, naming it in errors.
class Appender {
 public:
  Appender() = default;
  Appender(const Appender&) = delete;
  Appender& operator=(const Appender&) = delete;
  ~Appender() { (void)Close(); }
  Status Open(const std::string& path) {
    ZINF_RETURN_IF_ERROR(Close());
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return ErrnoStatus(errno, "open", path);
    path_ = path;
    offset_ = 0;
    return Status::Ok();
  }
  Status Write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoStatus(errno, "write", path_, offset_, static_cast<int64_t>(n));
      p += w;
      n -= static_cast<size_t>(w);
      offset_ += w;
    }
    return Status::Ok();
  }
  Status Close() {
    if (fd_ < 0) return Status::Ok();
    const int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "fsync", path_);
    }
    if (::close(fd) != 0) return ErrnoStatus(errno, "close", path_);
    return Status::Ok();
  }

 private:
  int fd_ = -1;
  std::string path_;
  int64_t offset_ = 0;
};

// `source`: where the kept tensors are read (null: the plan has none).
Status WriteWeights(const std::string& dir, const std::vector<OutTensor>& plan, const std::string& dtype,
                    const BlockReader& read_block, const HfCheckpoint* source) {
  const size_t shards = plan.empty() ? 1 : plan.back().shard + 1;
  Appender file;
  size_t open_shard = shards;  // none yet
  auto to_shard = [&](const OutTensor& o) {
    if (o.shard == open_shard) return Status::Ok();
    open_shard = o.shard;
    ZINF_RETURN_IF_ERROR(file.Open(JoinPath(dir, ShardName(o.shard, shards))));
    const std::string header = ShardHeader(plan, o.shard, dtype);
    return file.Write(header.data(), header.size());
  };
  size_t next = 0;
  std::vector<std::vector<float>> block;  // one block's weights, reused
  std::vector<std::byte> raw;             // one tensor's bytes, reused
  while (next < plan.size()) {
    const BlockId b = plan[next].block;
    if (b < 0) {  // a kept tensor: its bytes as the source has them
      const OutTensor& o = plan[next++];
      const HfCheckpoint::Source& src = source->tensors.at(o.name);
      raw.resize(static_cast<size_t>(o.bytes));
      ZINF_RETURN_IF_ERROR(
          ReadSafetensorsTensor(source->files[src.file], src.entry, raw).WithContext("export " + o.name));
      ZINF_RETURN_IF_ERROR(to_shard(o));
      ZINF_RETURN_IF_ERROR(file.Write(raw.data(), raw.size()));
      continue;
    }
    ZINF_RETURN_IF_ERROR(read_block(b, &block).WithContext("export block " + std::to_string(b)));
    for (; next < plan.size() && plan[next].block == b; ++next) {
      const OutTensor& o = plan[next];
      ZINF_RETURN_IF_ERROR(to_shard(o));
      if (o.index >= block.size()) {
        return Status::InvalidArgument("export " + o.name + ": the block reader gave " + std::to_string(block.size()) +
                                       " tensors of block " + std::to_string(b));
      }
      ZINF_RETURN_IF_ERROR(Encode(o, block[o.index], o.dtype.empty() ? dtype : o.dtype, &raw));
      ZINF_RETURN_IF_ERROR(file.Write(raw.data(), raw.size()));
    }
  }
  ZINF_RETURN_IF_ERROR(file.Close());
  // A folder exported before in the other form: its leftover would be read
  // instead of (or beside) these weights.
  const std::string stale = JoinPath(dir, shards == 1 ? "model.safetensors.index.json" : "model.safetensors");
  ZINF_RETURN_IF_ERROR(RemoveFile(stale));
  if (shards == 1) return Status::Ok();
  nlohmann::ordered_json index;
  int64_t total = 0;
  for (const OutTensor& o : plan) total += o.bytes;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (const OutTensor& o : plan) {
    if (o.first) index["weight_map"][o.name] = ShardName(o.shard, shards);
  }
  return WriteFileAtomic(JoinPath(dir, "model.safetensors.index.json"), index.dump(2) + "\n");
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in.good() && !in.eof()) return Status::Internal("read error in " + path);
  return s.str();
}

// The files a from_pretrained tokenizer (or a multimodal model's processor) may
// read, when the source has them.
Status CopyTokenizerFiles(const std::string& from, const std::string& dir) {
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
        "tokenizer.model", "added_tokens.json", "generation_config.json", "chat_template.jinja", "chat_template.json",
        "preprocessor_config.json", "processor_config.json"}) {
    const std::string src = JoinPath(from, name);
    if (!PathExists(src)) continue;
    ZINF_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(src));
    ZINF_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(dir, name), text));
  }
  return Status::Ok();
}

}  // namespace

std::string Gpt2ConfigJson(const GptConfig& model) {
  nlohmann::ordered_json c;
  c["architectures"] = {"GPT2LMHeadModel"};
  c["model_type"] = "gpt2";
  c["vocab_size"] = model.vocab_size;
  c["n_positions"] = model.seq_len;
  c["n_ctx"] = model.seq_len;
  c["n_embd"] = model.n_embd;
  c["n_layer"] = model.n_layer;
  c["n_head"] = model.n_head;
  c["n_inner"] = nullptr;  // 4 * n_embd
  c["activation_function"] = "gelu_new";
  c["layer_norm_epsilon"] = 1e-5;
  c["resid_pdrop"] = 0.0;
  c["embd_pdrop"] = 0.0;
  c["attn_pdrop"] = 0.0;
  c["tie_word_embeddings"] = model.tied_embeddings;
  // zinf's byte tokenizer ends documents with its last id.
  c["bos_token_id"] = model.vocab_size - 1;
  c["eos_token_id"] = model.vocab_size - 1;
  return c.dump(2) + "\n";
}

Status ExportHfFolder(const std::string& dir, const GptConfig& model, const HfCheckpoint* source,
                      const std::string& dtype, const BlockReader& read_block, int64_t max_shard_bytes) {
  if (!SafetensorsFloatType(dtype)) {
    return Status::InvalidArgument("export: dtype must be F32, BF16 or F16, got '" + dtype + "'");
  }
  if (source != nullptr && source->model.llama() != model.llama()) {
    return Status::InvalidArgument("export: the model is not of its source checkpoint's family");
  }
  ZINF_RETURN_IF_ERROR(MakeDirectories(dir).WithContext("export " + dir));
  // The kept tensors are read from the source's files after the new ones
  // are begun: the source folder itself would be overwritten under them.
  std::error_code same_error;
  const bool into_source = source != nullptr && std::filesystem::equivalent(dir, source->dir, same_error);
  if (into_source && source->files.empty() && HasHfWeights(dir)) {  // a --from-config run's folder
    return Status::InvalidArgument("export " + dir + ": the folder whose config.json the model started from " +
                                   "holds weights of its own, which this export would replace: export to " +
                                   "another folder");
  }
  if (into_source && !source->kept.empty()) {
    return Status::InvalidArgument("export " + dir + ": the source folder itself (its " +
                                   std::to_string(source->kept.size()) +
                                   " vision tensors are copied from its files): export to another folder");
  }
  HfCheckpoint names;  // HfTensorNames needs only the model
  names.model = model;
  const int es = ElementSizeBytes(*SafetensorsFloatType(dtype));
  const std::vector<OutTensor> plan = PlanTensors(model, source != nullptr ? *source : names, es, max_shard_bytes);
  ZINF_RETURN_IF_ERROR(WriteWeights(dir, plan, dtype, read_block, source).WithContext("export " + dir));
  if (source == nullptr) return WriteFileAtomic(JoinPath(dir, "config.json"), Gpt2ConfigJson(model));
  ZINF_ASSIGN_OR_RETURN(std::string config, ReadWholeFile(JoinPath(source->dir, "config.json")));
  ZINF_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(dir, "config.json"), config));
  return CopyTokenizerFiles(source->dir, dir).WithContext("export " + dir);
}

}  // namespace zinf::model
