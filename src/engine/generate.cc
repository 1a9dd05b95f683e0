#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "base/threads.h"
#include "engine/chat_template.h"

namespace kvq {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

size_t CompleteUtf8Prefix(std::string_view bytes) {
  // Walk back over at most 3 continuation bytes to the last lead byte and
  // check whether its sequence is complete.
  const size_t n = bytes.size();
  size_t i = n;
  int continuation = 0;
  while (i > 0 && continuation < 4 && (static_cast<uint8_t>(bytes[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++continuation;
  }
  if (i == 0) return continuation == 0 ? 0 : n;  // only continuation bytes: pass through
  const uint8_t lead = static_cast<uint8_t>(bytes[i - 1]);
  int needed;
  if (lead < 0x80) {
    needed = 0;
  } else if ((lead & 0xE0) == 0xC0) {
    needed = 1;
  } else if ((lead & 0xF0) == 0xE0) {
    needed = 2;
  } else if ((lead & 0xF8) == 0xF0) {
    needed = 3;
  } else {
    return n;  // invalid lead byte: nothing to wait for
  }
  return continuation >= needed ? n : i - 1;
}

StatusOr<std::vector<int32_t>> BuildPrompt(const LoadedModel& model, const std::string& prompt,
                                           bool chat) {
  const Tokenizer& tok = *model.tokenizer;
  std::string text = prompt;
  EncodeOptions options;
  options.add_special = true;
  if (chat) {
    KVQ_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::FromJinja(tok.chat_template()));
    text = tmpl.Render({{"user", prompt}}, /*add_generation_prompt=*/true);
    options.parse_special = true;  // the template's markers are special tokens
    if (!tmpl.bos_text.empty()) options.add_special = false;  // BOS is in the text
  }
  std::vector<int32_t> ids = tok.Encode(text, options);
  if (ids.empty()) return Status::Error("the prompt is empty");
  return ids;
}

namespace {

// The whole prompt in one Forward, or, batch-invariant, in the server's
// chunks (InvariantPromptChunk); logits: the last token's.
Status Prefill(Transformer& transformer, KvCache& cache, SeqId seq,
               const std::vector<int32_t>& prompt, const GenerateOptions& options,
               std::vector<float>* logits) {
  if (!options.batch_invariant) return transformer.Forward({{seq, prompt, false}}, cache, logits);
  if (options.prefill_chunk < 1) return Status::Error("the prefill chunk must be at least 1");
  const int64_t n = static_cast<int64_t>(prompt.size());
  for (int64_t begin = 0, end = 0; begin < n; begin = end) {
    end = begin + InvariantPromptChunk(begin, n, options.prefill_chunk);
    std::vector<int32_t> chunk(prompt.begin() + begin, prompt.begin() + end);
    KVQ_RETURN_IF_ERROR(transformer.Forward({{seq, std::move(chunk), false}}, cache, logits,
                                            /*observer=*/nullptr, BatchArith::kInvariant));
  }
  return Status::Ok();
}

}  // namespace

Status Generate(LoadedModel& model, KvCache& cache, const std::string& prompt,
                const GenerateOptions& options,
                const std::function<void(std::string_view)>& on_text, GenerateStats* stats) {
  Transformer& transformer = *model.transformer;
  const Tokenizer& tok = *model.tokenizer;
  const int64_t vocab = transformer.config().vocab_size;
  KVQ_ASSIGN_OR_RETURN(std::vector<int32_t> prompt_ids, BuildPrompt(model, prompt, options.chat));
  const SeqId seq = 0;
  KVQ_RETURN_IF_ERROR(cache.AddSequence(seq));
  struct Release {
    KvCache& cache;
    ~Release() { cache.ReleaseSequence(0); }
  } release{cache};
  const int64_t capacity = cache.Capacity(seq);
  if (static_cast<int64_t>(prompt_ids.size()) > capacity) {
    return Status::Error("the prompt has " + std::to_string(prompt_ids.size()) +
                         " tokens, more than the context of " + std::to_string(capacity));
  }
  // Tokens that end generation: EOS, and the end-of-turn marker in chat.
  std::vector<int32_t> stop_ids;
  if (tok.eos_id() >= 0) stop_ids.push_back(tok.eos_id());
  for (const char* marker : {"<|im_end|>", "<|eot_id|>", "<|endoftext|>"}) {
    const int32_t id = tok.PieceToId(marker);
    if (id >= 0) stop_ids.push_back(id);
  }

  GenerateStats local;
  local.prompt_tokens = static_cast<int64_t>(prompt_ids.size());
  local.weight_bytes_per_token = transformer.WeightBytesPerToken();
  std::vector<float> logits;
  Sampler sampler(options.sampling);
  const BatchArith arith = options.batch_invariant ? BatchArith::kInvariant : BatchArith::kFastest;
  auto start = std::chrono::steady_clock::now();
  KVQ_RETURN_IF_ERROR(Prefill(transformer, cache, seq, prompt_ids, options, &logits));
  local.prefill_seconds = SecondsSince(start);

  std::string pending;  // decoded bytes not yet emitted (incomplete UTF-8)
  double kv_bytes_read = 0;
  local.stop_reason = "length";
  start = std::chrono::steady_clock::now();
  while (local.generated_tokens < options.max_new_tokens) {
    const int32_t next = sampler.Sample(logits.data(), vocab);
    bool is_stop = false;
    for (int32_t id : stop_ids) is_stop |= id == next;
    if (options.stop_at_eos && is_stop) {
      local.stop_reason = "eos";
      break;
    }
    ++local.generated_tokens;
    pending += tok.Decode(std::span<const int32_t>(&next, 1));
    const size_t ready = CompleteUtf8Prefix(pending);
    if (ready > 0 && on_text) on_text(std::string_view(pending).substr(0, ready));
    pending.erase(0, ready);
    if (local.generated_tokens == options.max_new_tokens) break;
    if (cache.Capacity(seq) < 1) {
      local.stop_reason = "context";
      break;
    }
    kv_bytes_read += static_cast<double>(cache.BytesUsed());
    KVQ_RETURN_IF_ERROR(
        transformer.Forward({{seq, {next}, false}}, cache, &logits, /*observer=*/nullptr, arith));
  }
  if (!pending.empty() && on_text) on_text(pending);
  local.decode_seconds = SecondsSince(start);
  local.kv_bytes_final = static_cast<int64_t>(cache.BytesUsed());
  const int64_t decode_steps = std::max<int64_t>(local.generated_tokens - 1, 1);
  local.kv_bytes_per_token = kv_bytes_read / static_cast<double>(decode_steps);
  local.peak_rss_bytes = PeakRssBytes();
  if (stats != nullptr) *stats = local;
  return Status::Ok();
}

}  // namespace kvq
