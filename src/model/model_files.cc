#include "model/model_files.h"

#include <filesystem>
#include <unordered_map>

#include "model/gguf_config.h"
#include "model/hf_config.h"
#include "model/tensor_names.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

Status CheckTokenizer(const ModelFiles& m) {
  const size_t n = m.tokenizer.tokens.size();
  if (n > static_cast<size_t>(m.config.vocab_size)) {
    return Status::Error(m.source + ": the tokenizer has " + std::to_string(n) +
                         " tokens but the model's vocabulary is " +
                         std::to_string(m.config.vocab_size));
  }
  return Status::Ok();
}

StatusOr<ModelFiles> OpenGguf(const std::string& path) {
  ModelFiles m;
  m.source = path;
  m.format = ModelFormat::kGguf;
  KVQ_ASSIGN_OR_RETURN(m.gguf, GgufFile::Open(path));
  if (m.gguf->tensors().empty()) {
    return Status::Error(path +
                         ": no tensors: vocabulary-only file (use it as --vocab for "
                         "kvq synth, or with kvq tokenize)");
  }
  KVQ_ASSIGN_OR_RETURN(m.config, ModelConfigFromGguf(*m.gguf));
  KVQ_ASSIGN_OR_RETURN(m.tensors, CheckModelTensors(m.config, m.gguf->tensors(), path));
  KVQ_ASSIGN_OR_RETURN(m.tokenizer, TokenizerSpecFromGguf(*m.gguf));
  KVQ_RETURN_IF_ERROR(CheckTokenizer(m));
  return m;
}

StatusOr<ModelFiles> OpenHfFolder(const std::string& dir) {
  ModelFiles m;
  m.source = dir;
  m.format = ModelFormat::kHuggingFace;
  KVQ_ASSIGN_OR_RETURN(m.config, LoadHfConfig((fs::path(dir) / "config.json").string()));
  KVQ_ASSIGN_OR_RETURN(m.safetensors, OpenSafetensorsFolder(dir));
  std::vector<TensorRef> renamed;
  renamed.reserve(m.safetensors.tensors.size());
  for (const TensorRef& t : m.safetensors.tensors) {
    std::optional<std::string> canonical = CanonicalFromHfName(t.name);
    if (!canonical) {
      return Status::Error(
          dir + ": unexpected tensor '" + t.name + "' for " +
          (m.config.arch == Architecture::kQwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
    }
    if (canonical->empty()) continue;  // ignored on purpose
    // Checkpoints sometimes save lm_head even when it is tied to the
    // embedding; tied means the embedding is used, so drop the copy.
    if (*canonical == "output.weight" && m.config.tie_word_embeddings) continue;
    TensorRef r = t;
    r.name = *std::move(canonical);
    renamed.push_back(std::move(r));
  }
  KVQ_ASSIGN_OR_RETURN(m.tensors, CheckModelTensors(m.config, renamed, dir));
  KVQ_ASSIGN_OR_RETURN(m.tokenizer, TokenizerSpecFromHfFolder(dir));
  KVQ_RETURN_IF_ERROR(CheckTokenizer(m));
  return m;
}

}  // namespace

const char* ModelFormatName(ModelFormat format) {
  return format == ModelFormat::kGguf ? "GGUF" : "Hugging Face";
}

const TensorRef* ModelFiles::Find(std::string_view name) const {
  for (const TensorRef& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

StatusOr<std::vector<TensorRef>> CheckModelTensors(const ModelConfig& config,
                                                   const std::vector<TensorRef>& tensors,
                                                   const std::string& source) {
  std::unordered_map<std::string_view, const TensorRef*> by_name;
  for (const TensorRef& t : tensors) by_name.emplace(t.name, &t);
  std::vector<TensorRef> out;
  std::vector<std::string> missing;
  size_t found = 0;
  for (const ExpectedTensor& e : ExpectedTensors(config)) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      if (e.required) missing.push_back(e.name);
      continue;
    }
    ++found;
    const TensorRef& t = *it->second;
    if (t.shape != e.shape) {
      return Status::Error(source + ": tensor '" + e.name + "' has shape " + ShapeString(t.shape) +
                           ", config expects " + ShapeString(e.shape));
    }
    out.push_back(t);
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i)
      list += (i ? ", '" : "'") + missing[i] + "'";
    if (missing.size() > 8) list += ", ... (" + std::to_string(missing.size()) + " in all)";
    return Status::Error(source + ": missing tensor" + (missing.size() > 1 ? "s " : " ") + list);
  }
  if (found != tensors.size()) {
    for (const TensorRef& t : tensors) {
      bool known = false;
      for (const TensorRef& o : out) known = known || o.name == t.name;
      if (!known) {
        return Status::Error(source + ": unexpected tensor '" + t.name + "' (not part of a " +
                             ArchitectureName(config.arch) + " model with this config)");
      }
    }
  }
  return out;
}

int64_t CountParameters(const std::vector<TensorRef>& tensors) {
  int64_t n = 0;
  for (const TensorRef& t : tensors) n += t.NumElements();
  return n;
}

StatusOr<ModelFiles> OpenModel(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return OpenHfFolder(path);
  if (!fs::exists(path, ec)) return Status::Error(path + ": no such file or directory");
  return OpenGguf(path);
}

}  // namespace kvq
