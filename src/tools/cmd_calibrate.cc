// kvq calibrate: the offline calibration file KVQuant's nuq codecs and
// vLLM's calibrated fp8 (fp8_e4m3-tcal) and OSCAR's oscar2 read
// (--kv-calibration), and its export for vLLM and transformers
// (docs/export.md). eval/calibrate.h describes what is computed,
// kv/kv_calibration.h the file.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/threads.h"
#include "engine/loaded_model.h"
#include "eval/calibrate.h"
#include "eval/kv_export.h"
#include "io/mapped_file.h"
#include "tools/commands.h"
#include "tools/model_arg.h"

namespace kvq {
namespace {

struct CalibrateFlags {
  std::string model;
  std::string file;
  std::string output;
  std::vector<int> bits{2, 3, 4};
  int64_t tokens = 4096;
  int64_t context = 512;
  int64_t outliers = 1;
  bool qnorm = false;
  std::string weights = "q2";
  std::string fisher;
  std::string rotation = "qqt_sst";
  int threads = 0;
  std::vector<std::string> export_args;  // --export STACK FILE
  std::string export_stack;              // "vllm" or "hf"
  std::string export_path;
  std::string export_type = "hf-quanto-int4";
  std::string command;
};

// --export: vllm writes the fp8 k_scale/v_scale tensors; hf the
// QuantizedCacheConfig of --export-type with the calibration's provenance.
int Export(const CalibrateFlags& flags, const KvCalibration& c, const std::string& model) {
  if (flags.export_stack == "vllm") {
    const Status saved = SaveVllmKvScales(c, flags.export_path);
    if (!saved.ok()) return CommandError("calibrate", saved.message());
    std::printf("vLLM fp8 KV scales (model.layers.N.self_attn.k_scale / v_scale) -> %s\n",
                flags.export_path.c_str());
    return 0;
  }
  KvExportInput in;
  in.k_type = in.v_type = flags.export_type;
  in.num_layers = c.num_layers;
  in.model = model;
  in.command = flags.command;
  auto json = HfCacheExportJson(in);
  if (!json.ok()) return CommandError("calibrate", json.status().message());
  const Status written = WriteTextFile(flags.export_path, *json);
  if (!written.ok()) return CommandError("calibrate", written.message());
  std::printf("transformers QuantizedCacheConfig for %s -> %s\n", flags.export_type.c_str(),
              flags.export_path.c_str());
  return 0;
}

int RunCalibrateCommand(const CalibrateFlags& flags) {
  auto text = ReadTextFile(flags.file);
  if (!text.ok()) return CommandError("calibrate", text.status().message());
  const int threads = flags.threads > 0 ? flags.threads : AvailableThreads();
  auto loaded = LoadModel(flags.model, threads);
  if (!loaded.ok()) return CommandError("calibrate", loaded.status().message());
  CalibrateOptions options;
  options.bits = flags.bits;
  options.tokens = flags.tokens;
  options.context = flags.context;
  options.outlier_percent = flags.outliers;
  options.qnorm = flags.qnorm;
  options.weights = flags.weights;
  options.fisher_path = flags.fisher;
  options.rotation = flags.rotation;
  auto result = CalibrateKv(*loaded, *text, options);
  if (!result.ok()) return CommandError("calibrate", result.status().message());
  const Status saved = SaveKvCalibration(result->calibration, flags.output);
  if (!saved.ok()) return CommandError("calibrate", saved.message());
  const KvCalibration& c = result->calibration;
  std::printf(
      "kvq calibrate: %s: %lld windows of %lld tokens (%lld calibrated tokens), bits %s, "
      "%lld%% outliers, method %s%s -> %s\n",
      loaded->path.c_str(), static_cast<long long>(result->windows),
      static_cast<long long>(flags.context), static_cast<long long>(c.tokens), c.BitsList().c_str(),
      static_cast<long long>(c.outlier_percent), c.method.c_str(), c.qnorm ? ", Q-Norm" : "",
      flags.output.c_str());
  std::printf("  OSCAR rotations: %s\n",
              c.rotation_objective.empty() ? "none" : c.rotation_objective.c_str());
  for (const auto& [bits, books] : c.codebooks) {
    const int64_t levels = int64_t{1} << bits;
    for (bool is_v : {false, true}) {
      const std::vector<float>& l = is_v ? books.v : books.k;
      std::printf("  nuq%d %s layer 0 levels:", bits, is_v ? "V" : "K");
      for (int64_t j = 0; j < levels; ++j) std::printf(" %.3f", l[static_cast<size_t>(j)]);
      std::printf("\n");
    }
  }
  std::printf("  fp8 per-tensor scales (amax / 448), layer 0: K %.6g, V %.6g\n",
              static_cast<double>(c.fp8_k_scale[0]), static_cast<double>(c.fp8_v_scale[0]));
  return flags.export_stack.empty() ? 0 : Export(flags, c, loaded->path);
}

}  // namespace

void RegisterCalibrateCommand(CLI::App& app, CommandContext& ctx) {
  auto flags = std::make_shared<CalibrateFlags>();
  CLI::App* cmd =
      app.add_subcommand("calibrate",
                         "Offline calibration for KVQuant and OSCAR caches (kvquant2/3/4, oscar2 "
                         "--kv-calibration FILE)");
  cmd->footer(
      "Runs the model over the text in windows of --ctx tokens and writes, per layer, the\n"
      "pre-RoPE key channel ranges (outlier thresholds) and sensitivity-weighted k-means\n"
      "codebooks for each --bits (safetensors; tensor names in kv/kv_calibration.h).\n"
      "Key channels are weighted by the expected squared query component they multiply\n"
      "(gradient-free; eval/calibrate.h), values uniformly. Also OSCAR's rotation per\n"
      "(layer, KV head) for oscar2 (--rotation; head_dim a power of two).");
  AddModelOption(*cmd, &flags->model);
  cmd->add_option("-f,--file", flags->file, "Calibration text")->required();
  cmd->add_option("-o,--output", flags->output, "Calibration file to write")->required();
  cmd->add_option("--bits", flags->bits, "Bit widths to make codebooks for (default 2,3,4)")
      ->delimiter(',')
      ->check(CLI::Range(2, 4));
  cmd->add_option("--tokens", flags->tokens, "Calibration tokens, in whole windows (default 4096)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("-c,--ctx", flags->context, "Window length in tokens (default 512)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--outliers", flags->outliers,
                  "Percent of each channel beyond the outlier thresholds (default 1)")
      ->check(CLI::Range(int64_t{0}, int64_t{10}));
  cmd->add_flag("--qnorm", flags->qnorm,
                "Q-Norm: shift and scale the levels so dequantized values keep the calibration "
                "mean and standard deviation");
  cmd->add_option("--weights", flags->weights,
                  "k-means weights: q2 (keys by expected squared query component, default) or "
                  "uniform")
      ->check(CLI::IsMember({"q2", "uniform"}));
  cmd->add_option("--fisher", flags->fisher,
                  "Squared gradients per K/V element from tools/train/kvquant_fisher.py (same "
                  "text, --tokens, --ctx) to weight the k-means with (KVQuant's Fisher weights)");
  cmd->add_option("--rotation", flags->rotation,
                  "OSCAR rotations fitted from: qqt_sst (K from the queries' covariance, V from "
                  "the attention-weighted value covariance; OSCAR's choice, default), ktk_vtv "
                  "(the rows' own covariances) or none")
      ->check(CLI::IsMember({"qqt_sst", "ktk_vtv", "none"}));
  cmd->add_option("-t,--threads", flags->threads, "Threads (default: all cores)")
      ->check(ThreadsCheck());
  auto* exp = cmd->add_option("--export", flags->export_args,
                              "STACK FILE: also export for another stack: vllm (the per-layer "
                              "fp8 k_scale/v_scale as checkpoint tensors, safetensors) or hf "
                              "(transformers' QuantizedCacheConfig of --export-type, JSON); "
                              "docs/export.md")
                  ->expected(2);
  cmd->add_option("--export-type", flags->export_type,
                  "Cache type (or scheme) the hf export describes (default hf-quanto-int4)")
      ->needs(exp);
  cmd->callback([flags, &ctx] {
    if (!flags->export_args.empty()) {
      flags->export_stack = flags->export_args[0];
      flags->export_path = flags->export_args[1];
      if (flags->export_stack != "vllm" && flags->export_stack != "hf") {
        std::fprintf(stderr, "kvq calibrate: --export %s: the stacks are vllm and hf\n",
                     flags->export_stack.c_str());
        ctx.exit_code = 1;
        return;
      }
    }
    flags->command = "kvq calibrate" + (flags->model.empty() ? "" : " -m " + flags->model) +
                     " -f " + flags->file + " -o " + flags->output + " --tokens " +
                     std::to_string(flags->tokens) + " -c " + std::to_string(flags->context);
    ctx.exit_code = RunCalibrateCommand(*flags);
  });
}

}  // namespace kvq
