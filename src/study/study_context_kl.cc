#include "study/study_context_kl.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include "eval/logits_file.h"
#include "eval/perplexity.h"
#include "eval/planner.h"
#include "kv/kv_factory.h"
#include "study/study.h"
#include "study/study_resume.h"

namespace kvq {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

bool IsBaseline(const SchemeSpec& s) {
  return s.k_type == "f16" && s.v_type == "f16" && !s.rotate && s.policy.empty();
}

// One (scheme, length) point: the scheme's cache over `windows` windows of
// `length`, against the f16 log-probs in `baseline` (written when the scheme
// is the baseline itself). `on_tokens` follows every forward chunk.
StatusOr<Json> MeasurePoint(LoadedModel& model, const std::string& text, const SchemeSpec& spec,
                            int64_t length, int64_t windows, const ContextKlOptions& o,
                            const std::string& baseline,
                            const std::function<void(int64_t fed, int64_t total)>& on_tokens) {
  const auto start = std::chrono::steady_clock::now();
  const KvCacheOptions cache_options =
      SchemeCacheOptions(spec, length, model.transformer->pool(), o.calibration_path);
  KVQ_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                       MakeKvCache(model.transformer->kv_shape(), cache_options));
  PerplexityOptions p;
  p.context = length;
  p.batch = o.batch;
  p.max_windows = windows;
  const bool is_baseline = IsBaseline(spec);
  if (is_baseline) {
    p.save_logits_path = baseline;
    p.save_logits_f32 = true;  // f16 storage alone would add ~1e-6 nats of KL
  } else {
    p.kl_base_path = baseline;
  }
  KVQ_ASSIGN_OR_RETURN(PerplexityResult r,
                       RunPerplexity(model, *cache, text, p, [&](const PerplexityProgress& q) {
                         if (!q.window_done) on_tokens(q.tokens_fed, q.tokens_total);
                       }));
  Json point = {{"context", length},
                {"windows", r.windows},
                {"positions", r.tokens_scored},
                {"ppl", JsonNumber(r.ppl)},
                {"ppl_error", JsonNumber(r.ppl_error)}};
  if (is_baseline) {
    point["kl_mean"] = 0.0;
    point["kl_p99"] = 0.0;
    point["top1_agreement"] = 1.0;
  } else {
    if (!r.kl) return Status::Error("internal: no KL statistics for " + spec.name);
    point["kl_mean"] = JsonNumber(r.kl->mean);
    point["kl_p99"] = JsonNumber(r.kl->p99);
    point["top1_agreement"] = JsonNumber(r.kl->top1_percent / 100.0);
  }
  point["seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return point;
}

// Whether `path` holds the whole f16 log-probs of `windows` windows of
// `length` tokens, as a run that stopped after its baseline leaves them. The
// reader checks the file's size against its header, so a file cut short by a
// killed run is remade; the scheme runs then check its tokens against theirs.
bool BaselineComplete(const std::string& path, int64_t length, int64_t windows) {
  auto reader = LogitsFileReader::Open(path);  // a missing file is an error here too
  return reader.ok() && (*reader)->header().n_ctx == length &&
         (*reader)->header().n_windows == windows;
}

// The 2-bit scheme (nominal K and V bits at most 2) with the lowest mean KL
// at the longest length every such scheme reached; null if none.
Json Best2Bit(const Json& schemes) {
  int64_t common = -1;
  for (const Json& s : schemes) {
    if (s["baseline"].get<bool>() || s["nominal_bits"].get<int>() > 2 || s["points"].empty()) {
      continue;
    }
    const int64_t longest = s["points"].back()["context"].get<int64_t>();
    common = common < 0 ? longest : std::min(common, longest);
  }
  Json best = nullptr;
  double best_kl = 0;
  for (const Json& s : schemes) {
    if (s["baseline"].get<bool>() || s["nominal_bits"].get<int>() > 2) continue;
    for (const Json& p : s["points"]) {
      if (p["context"].get<int64_t>() != common || !p["kl_mean"].is_number()) continue;
      const double kl = p["kl_mean"].get<double>();
      if (best.is_null() || kl < best_kl) {
        best = s["name"];
        best_kl = kl;
      }
    }
  }
  return best;
}

}  // namespace

int64_t ContextKlWindows(int64_t length, int64_t positions, int64_t text_tokens) {
  const int64_t per_window = std::max<int64_t>(1, length / 2 - 1);
  const int64_t wanted = std::max<int64_t>(1, (positions + per_window - 1) / per_window);
  return std::max<int64_t>(1, std::min(wanted, text_tokens / std::max<int64_t>(length, 1)));
}

Status ValidateContextKl(const LoadedModel& model, int64_t text_tokens, const ContextKlOptions& o) {
  const int64_t model_context = model.transformer->config().max_position_embeddings;
  if (o.lengths.empty()) return Status::Error("context KL: no lengths");
  if (o.positions < 1) return Status::Error("context KL: positions must be >= 1");
  for (int64_t length : o.lengths) {
    if (length < 4 || length % 2 != 0 || length > model_context) {
      return Status::Error("context KL length " + std::to_string(length) +
                           " must be even and in [4, " + std::to_string(model_context) +
                           "] (the model's context)");
    }
    if (length > text_tokens) {
      return Status::Error("context KL length " + std::to_string(length) + " needs " +
                           std::to_string(length) + " tokens of text; the text has " +
                           std::to_string(text_tokens));
    }
  }
  return Status::Ok();
}

// Each scheme's points by length, with its bits per value from the planner.
StatusOr<Json> ContextKlSchemesJson(const LoadedModel& model,
                                    const std::vector<SchemeSpec>& schemes,
                                    const std::vector<int64_t>& lengths, const ContextKlOptions& o,
                                    const std::vector<std::map<int64_t, Json>>& done) {
  Json out_schemes = Json::array();
  const KvShape shape = model.transformer->kv_shape();
  for (size_t s = 0; s < schemes.size(); ++s) {
    KVQ_ASSIGN_OR_RETURN(KvTypePlan plan,
                         PlanKvType(shape, SchemeCacheOptions(schemes[s], lengths.back(), nullptr,
                                                              o.calibration_path)));
    Json points = Json::array();
    for (int64_t length : lengths) points.push_back(done[s].at(length));
    out_schemes.push_back({{"name", schemes[s].name},
                           {"baseline", s == 0},
                           {"nominal_bits", std::max(plan.k_bits, plan.v_bits)},
                           {"bits_per_value", JsonNumber(plan.layout.BytesPerToken() * 8.0 /
                                                         (2.0 * shape.num_layers *
                                                          shape.num_kv_heads * shape.head_dim))},
                           {"points", std::move(points)}});
  }
  return out_schemes;
}

StatusOr<Json> RunContextKlStudy(LoadedModel& model, const std::string& text,
                                 const std::string& text_digest,
                                 const std::vector<SchemeSpec>& schemes, const ContextKlOptions& o,
                                 const std::string& dir,
                                 const std::function<void(const ContextKlProgress&)>& progress) {
  if (schemes.empty() || !IsBaseline(schemes.front())) {
    return Status::Error("internal: context KL schemes must start with f16");
  }
  const int64_t text_tokens = static_cast<int64_t>(PerplexityTokens(model, text).size());
  KVQ_RETURN_IF_ERROR(ValidateContextKl(model, text_tokens, o));
  std::vector<int64_t> lengths = o.lengths;
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  // Not the lengths or schemes: a rerun may add either.
  const Json config = {{"kvq_context_kl_version", 1},
                       {"model", model.path},
                       {"text_sha256", text_digest},
                       {"positions", o.positions},
                       {"batch", o.batch}};
  KVQ_RETURN_IF_ERROR(PrepareResultDir(dir, config));

  std::vector<ResultLog> logs;
  std::vector<std::map<int64_t, Json>> done(schemes.size());
  for (size_t s = 0; s < schemes.size(); ++s) {
    const std::string path =
        (fs::path(dir) / (ResultFileStem(schemes[s].name) + ".jsonl")).string();
    KVQ_ASSIGN_OR_RETURN(ResultLog log, ResultLog::Open(path));
    for (const Json& r : log.records()) done[s][r.value("context", int64_t{-1})] = r;
    logs.push_back(std::move(log));
  }
  ContextKlProgress p;
  p.total = static_cast<int64_t>(lengths.size() * schemes.size());
  for (size_t s = 0; s < schemes.size(); ++s) {
    for (int64_t length : lengths) p.done += done[s].count(length);
  }
  for (int64_t length : lengths) {
    bool missing = false;
    for (const auto& d : done) missing = missing || d.count(length) == 0;
    if (!missing) continue;
    const int64_t windows = ContextKlWindows(length, o.positions, text_tokens);
    // The f16 log-probs are scratch (about positions x vocabulary x 4 bytes;
    // 10 GB for one 32K window of a 152K vocabulary), kept until every scheme
    // has its point at this length, so a resumed run reuses them, and remade
    // when missing. Their name carries the SIMD target: a run resumed on a
    // machine with other instructions remakes its own.
    const std::string baseline =
        (fs::path(dir) / ("f16-" + std::to_string(length) + "-" + SimdTargetName() + ".logprobs"))
            .string();
    for (size_t s = 0; s < schemes.size(); ++s) {
      if (s > 0 && done[s].count(length)) continue;
      if (s == 0 && done[0].count(length) && BaselineComplete(baseline, length, windows)) continue;
      p.length = length;
      p.scheme = schemes[s].name;
      p.tokens_fed = p.tokens_total = 0;
      if (progress) progress(p);
      const auto on_tokens = [&](int64_t fed, int64_t total) {
        p.tokens_fed = fed;
        p.tokens_total = total;
        if (progress) progress(p);
      };
      KVQ_ASSIGN_OR_RETURN(Json point, MeasurePoint(model, text, schemes[s], length, windows, o,
                                                    baseline, on_tokens));
      p.tokens_fed = p.tokens_total = 0;
      if (!done[s].count(length)) {  // the baseline re-ran only to remake its log-probs
        KVQ_RETURN_IF_ERROR(logs[s].Append(point));
        done[s][length] = logs[s].records().back();  // as stamped
        ++p.done;
      }
    }
    std::error_code ignored;
    fs::remove(baseline, ignored);
  }
  if (progress) progress(p);

  KVQ_ASSIGN_OR_RETURN(Json out_schemes, ContextKlSchemesJson(model, schemes, lengths, o, done));
  Json out = {{"lengths", lengths}, {"positions", o.positions}, {"dir", dir}};
  out["best_2bit"] = Best2Bit(out_schemes);
  out["schemes"] = std::move(out_schemes);
  return out;
}

}  // namespace kvq
