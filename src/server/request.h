// One generation request as the serving engine sees it (token ids, sampling,
// limits), and the channel through which its output travels from the engine
// thread to the HTTP handler thread that waits for it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "server/logprobs.h"

namespace kvq {

struct ServeRequest {
  std::vector<int32_t> prompt;  // token ids, chat template and BOS already applied
  int64_t max_tokens = 16;      // generated tokens at most (>= 1)
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  bool stop_at_eos = true;        // EOS / end-of-turn tokens end the output
  // Log probabilities: -1 = none; n >= 0 = each output token's log
  // probability plus the n most likely alternatives (see logprobs.h).
  int32_t logprobs = -1;
};

// What the engine tells the waiting handler: a piece of text, then exactly
// one final event with the finish reason and token counts.
struct RequestEvent {
  std::string text;  // whole UTF-8 characters; may be empty on the final event
  bool final = false;
  std::string finish_reason;  // "stop", "length", "cancelled", "error" (final only)
  std::string error;          // message when finish_reason == "error"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // With ServeRequest::logprobs >= 0: one entry per token sampled since the
  // previous event, in order. Text is held back (stop strings, incomplete
  // UTF-8) but log probabilities are not, so a token's entry may arrive
  // before its text does. Over a request there is one entry per completion
  // token (an EOS that ends the output is not one).
  std::vector<TokenLogprob> logprobs;
};

// Single producer (engine thread), single consumer (handler thread).
class RequestChannel {
 public:
  void Push(RequestEvent event) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      events_.push_back(std::move(event));
    }
    ready_.notify_one();
  }
  // Moves every pending event into `out`; waits up to `timeout` for one.
  // Returns false on timeout with nothing pending.
  bool Pop(std::vector<RequestEvent>* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [this] { return !events_.empty(); })) return false;
    while (!events_.empty()) {
      out->push_back(std::move(events_.front()));
      events_.pop_front();
    }
    return true;
  }
  // Set by the handler when its client is gone; the engine frees the
  // sequence at its next step.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestEvent> events_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace kvq
