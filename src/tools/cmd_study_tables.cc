// The terminal tables of `kvq study` (stdout), from the study JSON.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "study/study_report.h"
#include "tools/study_tables.h"

namespace kvq {
namespace {

std::string Num(const nlohmann::json& j, const char* fmt) {
  if (!j.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, j.get<double>());
  return buf;
}

// The schemes no scheme with fewer or as many bits per value beats on KL,
// largest first: the short answer to "which cache?" for this model.
void PrintFront(const nlohmann::json& schemes) {
  std::vector<std::optional<double>> bits, kl;
  for (const auto& r : schemes) {
    auto number = [&](const char* key) -> std::optional<double> {
      if (!r.contains(key) || !r[key].is_number()) return std::nullopt;
      return r[key].get<double>();
    };
    bits.push_back(number("bits_per_value"));
    kl.push_back(number("kl_mean"));
  }
  const std::vector<bool> front = ParetoFront(bits, kl);
  std::vector<size_t> order;
  for (size_t i = 0; i < front.size(); ++i) {
    if (front[i]) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return *bits[a] > *bits[b]; });
  std::string line;
  for (size_t i : order) {
    line += (line.empty() ? "" : ", ") + schemes[i]["name"].get<std::string>() + " (" +
            Num(schemes[i]["bits_per_value"], "%.2f") + ")";
  }
  if (!line.empty()) {
    std::printf("Pareto front, bits/val (no scheme with as few bits has a lower KL): %s\n",
                line.c_str());
  }
}

void PrintStructure(const nlohmann::json& o) {
  if (o.contains("k_bias") && !o["k_bias"]["layer_norms"].empty()) {
    const auto& b = o["k_bias"];
    std::printf("\nk_proj bias norm per layer (%s):\n ",
                b["spike_rule"].get<std::string>().c_str());
    for (const auto& n : b["layer_norms"]) std::printf(" %s", Num(n, "%.3g").c_str());
    std::printf("\n  spike layers: %s%s\n", b["spike_layers"].dump().c_str(),
                b["boundary_spike"].get<bool>() ? " (first/last layer: boundary spike)" : "");
  }
  std::printf("\nAttention sinks (%s)\n", o["sink_detection_rule"].get<std::string>().c_str());
  for (const auto& l : o["layers"]) {
    std::string list;
    int others = 0;
    for (const auto& sk : l["sinks"]) {
      if (sk["position"].get<int64_t>() == 0) continue;
      if (++others <= 4) {
        char buf[96];
        std::snprintf(buf, sizeof(buf), " h%lld@%lld(%.2f)", (long long)sk["head"],
                      (long long)sk["position"], sk["mass"].get<double>());
        list += buf;
      }
    }
    std::printf("  layer %-3lld token-0 mass %s; other sinks: %d%s%s\n", (long long)l["layer"],
                Num(l["sink_mass"], "%.3f").c_str(), others, list.c_str(),
                others > 4 ? " ..." : "");
  }
}

void PrintNeedle(const nlohmann::json& n) {
  std::printf("\nNeedle in a haystack (%lld trials a cell; %s)\n", (long long)n["trials"],
              n["rule"].get<std::string>().c_str());
  std::printf("%s\n", n["statement"].get<std::string>().c_str());
  std::printf("%-22s %-18s %8s %9s\n", "scheme", "task", "context", "correct");
  for (const auto& sc : n["schemes"]) {
    // Sum over depths per (task, context).
    std::vector<std::tuple<std::string, int64_t, int, int>> rows;
    for (const auto& c : sc["cells"]) {
      const std::string task = c["task"];
      const int64_t ctx = c["context"];
      bool found = false;
      for (auto& [t, x, k, m] : rows) {
        if (t == task && x == ctx) {
          k += c["correct"].get<int>();
          m += c["trials"].get<int>();
          found = true;
        }
      }
      if (!found) rows.emplace_back(task, ctx, c["correct"].get<int>(), c["trials"].get<int>());
    }
    for (const auto& [t, x, k, m] : rows) {
      std::printf("%-22s %-18s %8lld %5d/%-4d\n", sc["name"].get<std::string>().c_str(), t.c_str(),
                  (long long)x, k, m);
    }
  }
}

void PrintGsm8k(const nlohmann::json& g) {
  std::printf("\nGSM8K (%lld problems: %s; %s)\n", (long long)g["problems"],
              g["selection"].get<std::string>().c_str(), g["rule"].get<std::string>().c_str());
  std::printf("%-30s %9s %9s %17s %10s\n", "scheme", "correct", "accuracy", "95% Wilson",
              "mean toks");
  for (const auto& sc : g["schemes"]) {
    std::printf("%-30s %4lld/%-4lld %8.1f%% %7.1f%% - %5.1f%% %10.1f\n",
                sc["name"].get<std::string>().c_str(), (long long)sc["correct"],
                (long long)sc["problems"], 100 * sc["accuracy"].get<double>(),
                100 * sc["wilson95_low"].get<double>(), 100 * sc["wilson95_high"].get<double>(),
                sc["mean_generated_tokens"].get<double>());
  }
  if (!g.contains("paired") || g["paired"].empty()) return;
  std::printf("\npaired on the same problems (exact McNemar test)\n");
  std::printf("%-30s %-30s %7s %7s %7s %7s %10s\n", "A", "B", "only A", "only B", "both", "neither",
              "p");
  for (const auto& pair : g["paired"]) {
    std::printf("%-30s %-30s %7lld %7lld %7lld %7lld %10.3g\n",
                pair["a"].get<std::string>().c_str(), pair["b"].get<std::string>().c_str(),
                (long long)pair["only_a_correct"], (long long)pair["only_b_correct"],
                (long long)pair["both_correct"], (long long)pair["neither_correct"],
                pair["mcnemar_exact_p"].get<double>());
  }
}

void PrintContextKl(const nlohmann::json& c) {
  std::printf(
      "\nKL vs f16 by context length (mean KL, nats; about %lld scored positions a length)\n",
      (long long)c["positions"]);
  std::printf("%-30s", "scheme");
  for (const auto& length : c["lengths"]) std::printf(" %10lld", (long long)length);
  std::printf("\n");
  for (const auto& sc : c["schemes"]) {
    std::printf("%-30s", sc["name"].get<std::string>().c_str());
    for (const auto& p : sc["points"]) std::printf(" %10s", Num(p["kl_mean"], "%.3e").c_str());
    std::printf("\n");
  }
  if (c["best_2bit"].is_string()) {
    std::printf("best 2-bit scheme: %s\n", c["best_2bit"].get<std::string>().c_str());
  }
}

void PrintCoreTables(const nlohmann::json& s) {
  std::printf("\nOutliers (captured %lld tokens; channels with mean |x| > 4x the head's median)\n",
              (long long)s["outliers"]["capture_tokens"]);
  std::printf("%-6s %-5s %-24s %-11s %-24s %-10s %s\n", "layer", "head", "K pre-RoPE outliers",
              "consistent", "K post-RoPE outliers", "V outliers", "sink mass");
  for (const auto& l : s["outliers"]["layers"]) {
    const auto& pre = l["k_pre_rope_outlier_channels"];
    for (size_t h = 0; h < pre.size(); ++h) {
      std::printf("%-6lld %-5zu %-24s %-11s %-24s %-10s %s\n", (long long)l["layer"], h,
                  pre[h].dump().c_str(),
                  Num(l["k_pre_rope_outlier_consistency"][h], "%.2f").c_str(),
                  l["k_post_rope_outlier_channels"][h].dump().c_str(),
                  l["v_outlier_channels"][h].dump().c_str(),
                  h == 0 ? Num(l["sink_mass"], "%.3f").c_str() : "");
    }
  }
  const auto& fq = s["fake_quant"];
  PrintStructure(s["outliers"]);
  std::printf(
      "\nFake quantization of the captured K/V (overall; 'as written' = the write-up's formula, "
      "per-channel over the whole sequence; 'corrected' = 2^b-level asymmetric, KIVI's groups "
      "of %lld tokens / channels)\n",
      (long long)fq["kivi_group"]);
  std::printf("%-62s %4s %11s %11s %11s %9s\n", "row", "bits", "score err", "prob KL", "output err",
              "reported");
  for (const auto& r : fq["rows"]) {
    std::printf("%-62s %4d %11s %11s %11s %9s\n", r["name"].get<std::string>().c_str(),
                r["bits"].get<int>(), Num(r["score_rel_error"], "%.4f").c_str(),
                Num(r["prob_kl"], "%.3e").c_str(), Num(r["output_rel_error"], "%.4f").c_str(),
                Num(r["reported_score_rel_error"], "%.3f").c_str());
  }
  std::printf("\nThe write-up's claims on this model (computed from the rows above)\n");
  for (const auto& c : fq["claims"]) {
    std::printf("  %-6s %-9s %s\n", c["holds"].get<bool>() ? "holds" : "FAILS",
                c["family"].get<std::string>().c_str(), c["text"].get<std::string>().c_str());
  }
  std::printf("\nEnd to end with real caches (KL and top-1 vs the f16 cache)\n");
  if (s.contains("calibration") && s["calibration"].is_object()) {
    const auto& c = s["calibration"];
    if (c["source"] == "file") {
      std::printf("KVQuant calibration: %s\n", c["path"].get<std::string>().c_str());
    } else {
      std::printf(
          "KVQuant calibration: %s, %lld tokens (%lld windows of %lld), weights %s, %.1f s\n",
          c["text"].get<std::string>().c_str(), (long long)c["tokens"], (long long)c["windows"],
          (long long)c["context"], c["method"].get<std::string>().c_str(),
          c["seconds"].get<double>());
    }
  }
  std::printf("%-14s %8s %10s %6s %20s %10s %10s %7s %8s\n", "scheme", "bits/val", "bytes/tok",
              "x f16", "PPL", "KL mean", "KL p99", "top-1", "recall");
  for (const auto& r : s["schemes"]) {
    int correct = 0, trials = 0;
    for (const auto& c : r["recall"]) {
      correct += c["correct"].get<int>();
      trials += c["trials"].get<int>();
    }
    const std::string ppl = Num(r["ppl"], "%.3f") + " +/- " + Num(r["ppl_error"], "%.3f");
    std::printf("%-14s %8s %10s %6s %20s %10s %10s %7s %4d/%-3d\n",
                r["name"].get<std::string>().c_str(), Num(r["bits_per_value"], "%.2f").c_str(),
                Num(r["bytes_per_token"], "%.0f").c_str(),
                Num(r["compression_vs_f16"], "%.2f").c_str(), ppl.c_str(),
                Num(r["kl_mean"], "%.2e").c_str(), Num(r["kl_p99"], "%.2e").c_str(),
                Num(r["top1_agreement"], "%.4f").c_str(), correct, trials);
  }
  PrintFront(s["schemes"]);
}

}  // namespace

void PrintStudyTables(const nlohmann::json& s) {
  const auto& m = s["model"];
  std::printf("model: %s (%s, %lld layers, %lld heads / %lld KV heads, head_dim %lld)\n",
              m["path"].get<std::string>().c_str(), m["architecture"].get<std::string>().c_str(),
              (long long)m["layers"], (long long)m["heads"], (long long)m["kv_heads"],
              (long long)m["head_dim"]);
  if (s.contains("outliers")) PrintCoreTables(s);
  if (s.contains("needle")) PrintNeedle(s["needle"]);
  if (s.contains("gsm8k")) PrintGsm8k(s["gsm8k"]);
  if (s.contains("context_kl")) PrintContextKl(s["context_kl"]);
  std::string times;
  const auto& t = s["timings_seconds"];
  for (const char* name : {"capture", "outliers", "fake_quant", "end_to_end", "needle", "gsm8k",
                           "context_kl", "total"}) {
    if (!t.contains(name)) continue;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s%s %.1f s", times.empty() ? "" : ", ", name,
                  t[name].get<double>());
    times += buf;
  }
  std::printf("\ntime: %s\n", times.c_str());
}

}  // namespace kvq
