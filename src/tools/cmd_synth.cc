// kvq synth: write a model with seeded random weights and real shapes.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "io/gguf.h"
#include "model/synth.h"
#include "model/tensor_names.h"
#include "tools/commands.h"

namespace kvq {
namespace {

struct SynthArgs {
  std::string preset;
  std::string vocab;
  std::string out;
  std::string format = "gguf";
  std::string dtype = "f32";
  std::string tokenizer_dir;
  uint64_t seed = 0;
  bool list = false;
};

Status RunSynth(const SynthArgs& a) {
  if (a.list) {
    for (const SynthPreset& p : SynthPresets()) std::printf("%-16s %s\n", p.name, p.description);
    return Status::Ok();
  }
  if (a.preset.empty() || a.out.empty()) {
    return Status::Error("--preset and -o are required (see --list-presets)");
  }
  KVQ_ASSIGN_OR_RETURN(SynthPreset preset, FindSynthPreset(a.preset));
  SynthOptions options;
  options.seed = a.seed;
  options.name = std::string("kvq-synth-") + preset.name;
  if (a.dtype == "f32")
    options.dtype = DType::kF32;
  else if (a.dtype == "f16")
    options.dtype = DType::kF16;
  else if (a.dtype == "bf16")
    options.dtype = DType::kBF16;
  else if (a.dtype == "q8_0")
    options.dtype = DType::kQ8_0;
  else
    return Status::Error("unknown --dtype '" + a.dtype + "' (f32, f16, bf16, q8_0)");

  std::unique_ptr<GgufFile> vocab;
  if (!a.vocab.empty()) {
    KVQ_ASSIGN_OR_RETURN(vocab, GgufFile::Open(a.vocab));
  }
  const auto start = std::chrono::steady_clock::now();
  ModelConfig config = preset.config;
  if (a.format == "gguf") {
    config.vocab_size = 257;  // what WriteSynthGguf uses without a vocabulary
    if (vocab) {
      const GgufValue* tokens = vocab->Find("tokenizer.ggml.tokens");
      if (tokens != nullptr) config.vocab_size = static_cast<int64_t>(tokens->elements.size());
    }
    if (!vocab) {
      std::fprintf(stderr, "note: no --vocab given; using a 257-token byte-level vocabulary\n");
    }
    KVQ_RETURN_IF_ERROR(WriteSynthGguf(config, vocab.get(), options, a.out));
  } else if (a.format == "hf") {
    if (vocab) {
      const GgufValue* tokens = vocab->Find("tokenizer.ggml.tokens");
      if (tokens == nullptr || tokens->type != GgufType::kArray) {
        return Status::Error(a.vocab + ": no tokenizer.ggml.tokens: not a vocabulary file");
      }
      config.vocab_size = static_cast<int64_t>(tokens->elements.size());
    }
    KVQ_RETURN_IF_ERROR(WriteSynthHfFolder(config, options, a.out));
    if (!a.tokenizer_dir.empty()) {
      namespace fs = std::filesystem;
      for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
        std::error_code ec;
        fs::copy_file(fs::path(a.tokenizer_dir) / f, fs::path(a.out) / f,
                      fs::copy_options::overwrite_existing, ec);
        if (ec) {
          return Status::Error((fs::path(a.tokenizer_dir) / f).string() +
                               ": cannot copy: " + ec.message());
        }
      }
    }
  } else {
    return Status::Error("unknown --format '" + a.format + "' (gguf, hf)");
  }
  int64_t params = 0;
  for (const ExpectedTensor& t : ExpectedTensors(config)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    params += n;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %s %s, %.1fM parameters, %s, seed %llu (%.1f s)\n", a.out.c_str(),
              preset.name, a.format == "hf" ? "Hugging Face folder" : "GGUF", params / 1e6,
              a.dtype.c_str(), static_cast<unsigned long long>(a.seed), seconds);
  return Status::Ok();
}

}  // namespace

void RegisterSynthCommand(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<SynthArgs>();
  CLI::App* cmd = app.add_subcommand(
      "synth", "Write a model with seeded random weights and the shapes of a real one");
  cmd->add_option("--preset", args->preset, "Model shapes (see --list-presets)");
  cmd->add_option("--vocab", args->vocab,
                  "Vocabulary GGUF whose tokenizer.* keys are copied (default: a built-in "
                  "257-token byte-level vocabulary)");
  cmd->add_option("-o,--output", args->out, "Output .gguf file, or folder with --format hf");
  cmd->add_option("--seed", args->seed, "Random seed (default 0)");
  cmd->add_option("--dtype", args->dtype,
                  "Storage type of 2-D weights: f32, f16, bf16, q8_0 (default f32; norms and "
                  "biases stay f32)");
  cmd->add_option("--format", args->format, "gguf or hf (Hugging Face folder) (default gguf)");
  cmd->add_option("--tokenizer", args->tokenizer_dir,
                  "With --format hf: folder whose tokenizer.json and tokenizer_config.json are "
                  "copied in");
  cmd->add_flag("--list-presets", args->list, "List presets and exit");
  cmd->callback([&ctx, args] {
    Status st = RunSynth(*args);
    if (!st.ok()) {
      ctx.exit_code = CommandError("synth", st.message());
    }
  });
}

}  // namespace kvq
