// kvq's harness around llama.cpp (the independent reference implementation).
// Built by scripts/build_llama_cpp.sh against the llama.cpp library compiled
// from the node-llama-cpp bundle; used by tests and benchmarks, never linked
// into kvq itself.
//
//   harness load MODEL.gguf
//       loads every tensor, prints "ok n_vocab=… n_layer=… desc=…"
//   harness logits MODEL.gguf OUT.bin [--decode] [--threads N] [--fa-off] TOKEN...
//       runs the tokens as one sequence and writes the logits of every
//       position: magic "KVQLOGIT", uint32 n_tokens, uint32 n_vocab, then
//       n_tokens*n_vocab little-endian f32. --decode feeds one token per
//       llama_decode call (the KV-cache path); default is one batch (prefill).
//   harness greedy MODEL.gguf N [--threads N] [--fa-off] TOKEN...
//       prefills the prompt tokens (f16 KV cache, llama.cpp's default), then
//       decodes N tokens greedily; prints one line per generated token:
//       "<token> <top-1 logit> <top-2 logit>" (the gap tells a near-tie).
//   --fa-off (logits, greedy, dump) turns llama.cpp's flash attention off
//       (default: llama.cpp's auto, on for the CPU): the same math in another
//       order, which measures llama.cpp's own run-to-run spread.
//   harness dequant MODEL.gguf OUT.bin NAME FIRST_ROW ROWS [NAME FIRST_ROW ROWS]...
//       decodes the given rows of each named tensor with ggml's own
//       to_float (its type traits) and writes: magic "KVQDEQNT", uint32
//       n_requests, then per request uint32 ggml type, int64 cols, and
//       ROWS*cols little-endian f32.
//   harness quantize TYPE_ID ROWS COLS OUT.bin
//       quantizes random values with ggml's own quantizer (ggml type id) and
//       writes "KVQQUANT", int64 row bytes, the ROWS rows of blocks, then
//       their ROWS*COLS f32 values decoded by ggml's to_float: a test of
//       every type, including those no shipped model uses.
//   harness quantize-input TYPE_ID COLS IN.f32 OUT.bin
//       quantizes the rows of IN.f32 (little-endian f32, a multiple of COLS
//       values) twice: with ggml's reference quantizer (the type traits'
//       from_float_ref) and with the CPU backend's from_float, the one
//       llama.cpp's cache writer (ggml_set_rows) uses. Writes "KVQQROWS",
//       int64 row bytes, the reference blocks, the CPU blocks, then the CPU
//       blocks decoded by ggml's to_float (ROWS*COLS f32): kvq's cache codecs
//       are compared with both on the same input.
//   harness dump MODEL.gguf OUT.bin [--threads N] [--f16-cache] [--fa-off] [--names a,b,...]
//       TOKEN...
//       runs the tokens as one batch (f32 KV cache unless --f16-cache) and
//       writes every named intermediate tensor of the graph that is f32 and
//       contiguous (llama.cpp's eval callback; names such as attn_norm-3,
//       Vcur-3, kqv_out-3, ffn_out-3, l_out-3, result_norm, result_output),
//       or only those listed in --names: magic "KVQDUMP1", uint32 count, then
//       per tensor uint32 name length, the name, int64 ne[4] (ggml order,
//       ne[0] fastest) and the f32 values. A layer-by-layer bisect against
//       kvq's own intermediates (tools/llamacpp/compare_intermediates.py).
//   harness vecdot [ROWS COLS]
//       ggml's CPU matrix-vector speed per weight type on a random matrix
//       (default 576 x 1536) small enough to stay in L2: x quantized to the
//       type's vec_dot_type once, then one vec_dot per row; best of 7 runs
//       of 200, thread CPU time, one thread. Compared with kvq's MatvecL2
//       rows of bench/ops_bench.cc (see ops/matvec.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"

namespace {

void QuietLog(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

int Usage() {
  std::fprintf(
      stderr,
      "usage: harness load MODEL.gguf\n"
      "       harness logits MODEL.gguf OUT.bin [--decode] [--threads N] [--fa-off] "
      "TOKEN...\n"
      "       harness greedy MODEL.gguf N [--threads N] [--fa-off] TOKEN...\n"
      "       harness dequant MODEL.gguf OUT.bin NAME FIRST_ROW ROWS...\n"
      "       harness quantize TYPE_ID ROWS COLS OUT.bin\n"
      "       harness quantize-input TYPE_ID COLS IN.f32 OUT.bin\n"
      "       harness dump MODEL.gguf OUT.bin [--threads N] [--f16-cache] [--fa-off] [--names a,b] "
      "TOKEN...\n"
      "       harness vecdot [ROWS COLS]\n");
  return 2;
}

llama_model* LoadModel(const char* path) {
  llama_model_params params = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(path, params);
  if (model == nullptr) std::fprintf(stderr, "harness: llama.cpp failed to load %s\n", path);
  return model;
}

// One batch holds the whole prompt (n_ctx tokens), so a prompt runs in one
// forward call as kvq's does.
llama_context_params WholePromptParams(uint32_t n_ctx, int threads, bool fa_off) {
  llama_context_params cparams = llama_context_default_params();
  cparams.n_ctx = n_ctx;
  cparams.n_batch = n_ctx;
  cparams.n_ubatch = n_ctx;
  cparams.n_threads = threads;
  cparams.n_threads_batch = threads;
  if (fa_off) cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  return cparams;
}

int Load(const char* path) {
  llama_model* model = LoadModel(path);
  if (model == nullptr) return 1;
  char desc[256];
  llama_model_desc(model, desc, sizeof(desc));
  std::printf("ok n_vocab=%d n_layer=%d desc=%s\n",
              llama_vocab_n_tokens(llama_model_get_vocab(model)), llama_model_n_layer(model), desc);
  llama_model_free(model);
  return 0;
}

int Logits(int argc, char** argv) {
  if (argc < 5) return Usage();
  const char* model_path = argv[2];
  const char* out_path = argv[3];
  bool decode_one_by_one = false;
  bool fa_off = false;
  int threads = 2;
  std::vector<llama_token> tokens;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--decode") == 0) {
      decode_one_by_one = true;
    } else if (std::strcmp(argv[i], "--fa-off") == 0) {
      fa_off = true;
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      tokens.push_back(static_cast<llama_token>(std::atoi(argv[i])));
    }
  }
  if (tokens.empty()) return Usage();
  llama_model* model = LoadModel(model_path);
  if (model == nullptr) return 1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const int n_tokens = static_cast<int>(tokens.size());

  llama_context_params cparams =
      WholePromptParams(static_cast<uint32_t>(n_tokens < 64 ? 64 : n_tokens), threads, fa_off);
  // f32 cache: the comparison is about the forward pass, not cache rounding.
  cparams.type_k = GGML_TYPE_F32;
  cparams.type_v = GGML_TYPE_F32;
  llama_context* ctx = llama_init_from_model(model, cparams);
  if (ctx == nullptr) {
    std::fprintf(stderr, "harness: cannot create context\n");
    llama_model_free(model);
    return 1;
  }
  std::vector<float> logits(static_cast<size_t>(n_tokens) * n_vocab);
  const int step = decode_one_by_one ? 1 : n_tokens;
  llama_batch batch = llama_batch_init(step, 0, 1);
  int status = 0;
  for (int start = 0; start < n_tokens && status == 0; start += step) {
    batch.n_tokens = step;
    for (int j = 0; j < step; ++j) {
      batch.token[j] = tokens[start + j];
      batch.pos[j] = start + j;
      batch.n_seq_id[j] = 1;
      batch.seq_id[j][0] = 0;
      batch.logits[j] = 1;
    }
    if (llama_decode(ctx, batch) != 0) {
      std::fprintf(stderr, "harness: llama_decode failed at position %d\n", start);
      status = 1;
      break;
    }
    for (int j = 0; j < step; ++j) {
      const float* row = llama_get_logits_ith(ctx, j);
      std::memcpy(&logits[static_cast<size_t>(start + j) * n_vocab], row, sizeof(float) * n_vocab);
    }
  }
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  if (status != 0) return status;

  FILE* out = std::fopen(out_path, "wb");
  if (out == nullptr) {
    std::fprintf(stderr, "harness: cannot write %s\n", out_path);
    return 1;
  }
  const uint32_t header[2] = {static_cast<uint32_t>(n_tokens), static_cast<uint32_t>(n_vocab)};
  std::fwrite("KVQLOGIT", 1, 8, out);
  std::fwrite(header, sizeof(uint32_t), 2, out);
  std::fwrite(logits.data(), sizeof(float), logits.size(), out);
  return std::fclose(out) == 0 ? 0 : 1;
}

// The two largest logits of a row: (argmax, top-1, top-2).
void TopTwo(const float* row, int n, int* best, float* top1, float* top2) {
  *best = 0;
  *top1 = row[0];
  *top2 = -INFINITY;
  for (int i = 1; i < n; ++i) {
    if (row[i] > *top1) {
      *top2 = *top1;
      *top1 = row[i];
      *best = i;
    } else if (row[i] > *top2) {
      *top2 = row[i];
    }
  }
}

int Greedy(int argc, char** argv) {
  if (argc < 5) return Usage();
  const char* model_path = argv[2];
  const int n_generate = std::atoi(argv[3]);
  int threads = 2;
  bool fa_off = false;
  std::vector<llama_token> tokens;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fa-off") == 0) {
      fa_off = true;
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      tokens.push_back(static_cast<llama_token>(std::atoi(argv[i])));
    }
  }
  if (tokens.empty() || n_generate < 1) return Usage();
  llama_model* model = LoadModel(model_path);
  if (model == nullptr) return 1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const int n_prompt = static_cast<int>(tokens.size());
  llama_context_params cparams =
      WholePromptParams(static_cast<uint32_t>(n_prompt + n_generate + 16), threads, fa_off);
  llama_context* ctx = llama_init_from_model(model, cparams);
  if (ctx == nullptr) {
    std::fprintf(stderr, "harness: cannot create context\n");
    llama_model_free(model);
    return 1;
  }
  llama_batch batch = llama_batch_init(n_prompt, 0, 1);
  int status = 0;
  int pos = 0;
  int n_in = n_prompt;
  for (int step = 0; step < n_generate && status == 0; ++step) {
    batch.n_tokens = n_in;
    for (int j = 0; j < n_in; ++j) {
      batch.token[j] = tokens[pos + j];
      batch.pos[j] = pos + j;
      batch.n_seq_id[j] = 1;
      batch.seq_id[j][0] = 0;
      batch.logits[j] = j == n_in - 1;
    }
    if (llama_decode(ctx, batch) != 0) {
      std::fprintf(stderr, "harness: llama_decode failed at position %d\n", pos);
      status = 1;
      break;
    }
    pos += n_in;
    int best;
    float top1, top2;
    TopTwo(llama_get_logits_ith(ctx, n_in - 1), n_vocab, &best, &top1, &top2);
    std::printf("%d %.6f %.6f\n", best, top1, top2);
    tokens.push_back(best);
    n_in = 1;
  }
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return status;
}

// Reads rows [first, first + rows) of tensor `name` straight from the file
// and decodes them with ggml's to_float; appends type, cols and values.
bool DequantRows(FILE* file, gguf_context* gguf, ggml_context* meta, const char* name,
                 int64_t first, int64_t rows, std::vector<char>* out) {
  const int64_t id = gguf_find_tensor(gguf, name);
  const ggml_tensor* t = ggml_get_tensor(meta, name);
  if (id < 0 || t == nullptr) {
    std::fprintf(stderr, "harness: no tensor '%s'\n", name);
    return false;
  }
  const int64_t cols = t->ne[0];
  const int64_t total_rows = ggml_nelements(t) / cols;
  const ggml_type_traits* traits = ggml_get_type_traits(t->type);
  if (first < 0 || rows <= 0 || first + rows > total_rows ||
      (traits->to_float == nullptr && t->type != GGML_TYPE_F32)) {
    std::fprintf(stderr, "harness: bad rows %lld+%lld of '%s' (%lld rows, type %s)\n",
                 static_cast<long long>(first), static_cast<long long>(rows), name,
                 static_cast<long long>(total_rows), ggml_type_name(t->type));
    return false;
  }
  const size_t row_bytes = ggml_row_size(t->type, cols);
  std::vector<uint8_t> raw(row_bytes * static_cast<size_t>(rows));
  const long offset =
      static_cast<long>(gguf_get_data_offset(gguf) + gguf_get_tensor_offset(gguf, id) +
                        row_bytes * static_cast<size_t>(first));
  if (std::fseek(file, offset, SEEK_SET) != 0 ||
      std::fread(raw.data(), 1, raw.size(), file) != raw.size()) {
    std::fprintf(stderr, "harness: cannot read '%s'\n", name);
    return false;
  }
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    if (t->type == GGML_TYPE_F32) {  // ggml has no to_float for f32 itself
      std::memcpy(values.data() + r * cols, raw.data() + r * row_bytes, row_bytes);
    } else {
      traits->to_float(raw.data() + r * row_bytes, values.data() + r * cols, cols);
    }
  }
  const uint32_t type = static_cast<uint32_t>(t->type);
  const char* p = reinterpret_cast<const char*>(&type);
  out->insert(out->end(), p, p + sizeof(type));
  p = reinterpret_cast<const char*>(&cols);
  out->insert(out->end(), p, p + sizeof(cols));
  p = reinterpret_cast<const char*>(values.data());
  out->insert(out->end(), p, p + values.size() * sizeof(float));
  return true;
}

int Dequant(int argc, char** argv) {
  if (argc < 7 || (argc - 4) % 3 != 0) return Usage();
  ggml_context* meta = nullptr;
  gguf_init_params params = {/*no_alloc=*/true, &meta};
  gguf_context* gguf = gguf_init_from_file(argv[2], params);
  if (gguf == nullptr) {
    std::fprintf(stderr, "harness: ggml cannot read %s\n", argv[2]);
    return 1;
  }
  FILE* file = std::fopen(argv[2], "rb");
  std::vector<char> out;
  bool ok = file != nullptr;
  const uint32_t requests = static_cast<uint32_t>((argc - 4) / 3);
  for (int i = 4; ok && i + 2 < argc; i += 3) {
    ok = DequantRows(file, gguf, meta, argv[i], std::atoll(argv[i + 1]), std::atoll(argv[i + 2]),
                     &out);
  }
  if (file != nullptr) std::fclose(file);
  gguf_free(gguf);
  ggml_free(meta);
  if (!ok) return 1;
  FILE* f = std::fopen(argv[3], "wb");
  if (f == nullptr) {
    std::fprintf(stderr, "harness: cannot write %s\n", argv[3]);
    return 1;
  }
  std::fwrite("KVQDEQNT", 1, 8, f);
  std::fwrite(&requests, sizeof(requests), 1, f);
  std::fwrite(out.data(), 1, out.size(), f);
  return std::fclose(f) == 0 ? 0 : 1;
}

int Quantize(int argc, char** argv) {
  if (argc != 6) return Usage();
  const int type_id = std::atoi(argv[2]);
  const int64_t rows = std::atoll(argv[3]), cols = std::atoll(argv[4]);
  if (type_id < 0 || type_id >= GGML_TYPE_COUNT || rows <= 0 || cols <= 0) return Usage();
  const auto type = static_cast<ggml_type>(type_id);
  const ggml_type_traits* traits = ggml_get_type_traits(type);
  if (traits->to_float == nullptr || cols % ggml_blck_size(type) != 0) {
    std::fprintf(stderr, "harness: cannot quantize %s rows of %lld\n", ggml_type_name(type),
                 static_cast<long long>(cols));
    return 1;
  }
  // Values of varied magnitude per row, some rows with a large outlier.
  std::mt19937 rng(static_cast<uint32_t>(type_id));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(r % 13) - 8);
    for (int64_t c = 0; c < cols; ++c) values[r * cols + c] = scale * dist(rng);
    if (r % 3 == 0) values[r * cols + (r * 7) % cols] = 40.0f * scale;
  }
  const int64_t row_bytes = static_cast<int64_t>(ggml_row_size(type, cols));
  std::vector<uint8_t> blocks(static_cast<size_t>(rows * row_bytes));
  ggml_quantize_chunk(type, values.data(), blocks.data(), 0, rows, cols, nullptr);
  std::vector<float> decoded(values.size());
  for (int64_t r = 0; r < rows; ++r) {
    traits->to_float(blocks.data() + r * row_bytes, decoded.data() + r * cols, cols);
  }
  FILE* f = std::fopen(argv[5], "wb");
  if (f == nullptr) return 1;
  std::fwrite("KVQQUANT", 1, 8, f);
  std::fwrite(&row_bytes, sizeof(row_bytes), 1, f);
  std::fwrite(blocks.data(), 1, blocks.size(), f);
  std::fwrite(decoded.data(), sizeof(float), decoded.size(), f);
  return std::fclose(f) == 0 ? 0 : 1;
}

int QuantizeInput(int argc, char** argv) {
  if (argc != 6) return Usage();
  const int type_id = std::atoi(argv[2]);
  const int64_t cols = std::atoll(argv[3]);
  if (type_id < 0 || type_id >= GGML_TYPE_COUNT || cols <= 0) return Usage();
  const auto type = static_cast<ggml_type>(type_id);
  const ggml_type_traits* traits = ggml_get_type_traits(type);
  const ggml_type_traits_cpu* cpu = ggml_get_type_traits_cpu(type);
  if (traits->to_float == nullptr || traits->from_float_ref == nullptr ||
      cpu->from_float == nullptr || cols % ggml_blck_size(type) != 0) {
    std::fprintf(stderr, "harness: cannot quantize %s rows of %lld\n", ggml_type_name(type),
                 static_cast<long long>(cols));
    return 1;
  }
  FILE* in = std::fopen(argv[4], "rb");
  if (in == nullptr) {
    std::fprintf(stderr, "harness: cannot read %s\n", argv[4]);
    return 1;
  }
  std::vector<float> values;
  float chunk[4096];
  size_t got;
  while ((got = std::fread(chunk, sizeof(float), 4096, in)) > 0) {
    values.insert(values.end(), chunk, chunk + got);
  }
  std::fclose(in);
  if (values.empty() || values.size() % static_cast<size_t>(cols) != 0) {
    std::fprintf(stderr, "harness: %s holds %zu floats, not rows of %lld\n", argv[4], values.size(),
                 static_cast<long long>(cols));
    return 1;
  }
  const int64_t rows = static_cast<int64_t>(values.size()) / cols;
  const int64_t row_bytes = static_cast<int64_t>(ggml_row_size(type, cols));
  std::vector<uint8_t> ref(static_cast<size_t>(rows * row_bytes));
  std::vector<uint8_t> blocks(ref.size());
  std::vector<float> decoded(values.size());
  for (int64_t r = 0; r < rows; ++r) {
    traits->from_float_ref(values.data() + r * cols, ref.data() + r * row_bytes, cols);
    cpu->from_float(values.data() + r * cols, blocks.data() + r * row_bytes, cols);
    traits->to_float(blocks.data() + r * row_bytes, decoded.data() + r * cols, cols);
  }
  FILE* f = std::fopen(argv[5], "wb");
  if (f == nullptr) return 1;
  std::fwrite("KVQQROWS", 1, 8, f);
  std::fwrite(&row_bytes, sizeof(row_bytes), 1, f);
  std::fwrite(ref.data(), 1, ref.size(), f);
  std::fwrite(blocks.data(), 1, blocks.size(), f);
  std::fwrite(decoded.data(), sizeof(float), decoded.size(), f);
  return std::fclose(f) == 0 ? 0 : 1;
}

// What the eval callback collects: the tensors asked for (all when empty),
// in graph order, as raw f32 with their shape.
struct DumpState {
  std::vector<std::string> names;
  std::string blob;
  uint32_t count = 0;
};

bool Wanted(const DumpState& d, const char* name) {
  if (d.names.empty()) return name[0] != '\0';
  return std::find(d.names.begin(), d.names.end(), name) != d.names.end();
}

bool DumpCallback(ggml_tensor* t, bool ask, void* user) {
  auto* d = static_cast<DumpState*>(user);
  const bool want = t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && Wanted(*d, t->name);
  if (ask) return want;
  if (!want) return true;
  const uint32_t len = static_cast<uint32_t>(std::strlen(t->name));
  d->blob.append(reinterpret_cast<const char*>(&len), sizeof(len));
  d->blob.append(t->name, len);
  for (int i = 0; i < 4; ++i) {
    const int64_t ne = t->ne[i];
    d->blob.append(reinterpret_cast<const char*>(&ne), sizeof(ne));
  }
  const size_t bytes = ggml_nbytes(t);
  const size_t at = d->blob.size();
  d->blob.resize(at + bytes);
  ggml_backend_tensor_get(t, &d->blob[at], 0, bytes);
  ++d->count;
  return true;
}

int Dump(int argc, char** argv) {
  if (argc < 5) return Usage();
  const char* model_path = argv[2];
  const char* out_path = argv[3];
  int threads = 2;
  bool f16_cache = false;
  bool fa_off = false;
  DumpState state;
  std::vector<llama_token> tokens;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--f16-cache") == 0) {
      f16_cache = true;
    } else if (std::strcmp(argv[i], "--fa-off") == 0) {
      fa_off = true;
    } else if (std::strcmp(argv[i], "--names") == 0 && i + 1 < argc) {
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) state.names.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    } else {
      tokens.push_back(static_cast<llama_token>(std::atoi(argv[i])));
    }
  }
  if (tokens.empty()) return Usage();
  llama_model* model = LoadModel(model_path);
  if (model == nullptr) return 1;
  const int n_tokens = static_cast<int>(tokens.size());
  llama_context_params cparams =
      WholePromptParams(static_cast<uint32_t>(n_tokens < 64 ? 64 : n_tokens), threads, fa_off);
  cparams.type_k = f16_cache ? GGML_TYPE_F16 : GGML_TYPE_F32;
  cparams.type_v = cparams.type_k;
  cparams.cb_eval = DumpCallback;
  cparams.cb_eval_user_data = &state;
  llama_context* ctx = llama_init_from_model(model, cparams);
  if (ctx == nullptr) {
    std::fprintf(stderr, "harness: cannot create context\n");
    llama_model_free(model);
    return 1;
  }
  llama_batch batch = llama_batch_init(n_tokens, 0, 1);
  batch.n_tokens = n_tokens;
  for (int j = 0; j < n_tokens; ++j) {
    batch.token[j] = tokens[j];
    batch.pos[j] = j;
    batch.n_seq_id[j] = 1;
    batch.seq_id[j][0] = 0;
    batch.logits[j] = 1;
  }
  const int status = llama_decode(ctx, batch) != 0 ? 1 : 0;
  if (status != 0) std::fprintf(stderr, "harness: llama_decode failed\n");
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  if (status != 0) return status;
  FILE* out = std::fopen(out_path, "wb");
  if (out == nullptr) {
    std::fprintf(stderr, "harness: cannot write %s\n", out_path);
    return 1;
  }
  std::fwrite("KVQDUMP1", 1, 8, out);
  std::fwrite(&state.count, sizeof(state.count), 1, out);
  std::fwrite(state.blob.data(), 1, state.blob.size(), out);
  return std::fclose(out) == 0 ? 0 : 1;
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int VecDot(int argc, char** argv) {
  const int64_t rows = argc >= 4 ? std::atoll(argv[2]) : 576;
  const int64_t cols = argc >= 4 ? std::atoll(argv[3]) : 1536;
  if (rows <= 0 || cols <= 0 || cols % 256 != 0) return Usage();
  ggml_cpu_init();
  const ggml_type types[] = {GGML_TYPE_F16,  GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,
                             GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_IQ4_NL, GGML_TYPE_Q2_K,
                             GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,   GGML_TYPE_Q6_K};
  std::vector<float> x(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(rows));
  std::vector<float> wf(static_cast<size_t>(rows * cols));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-0.05f, 0.05f);
  for (float& v : wf) v = dist(rng);
  for (ggml_type t : types) {
    const size_t row_bytes = ggml_row_size(t, cols);
    std::vector<uint8_t> w(row_bytes * static_cast<size_t>(rows));
    ggml_quantize_chunk(t, wf.data(), w.data(), 0, rows, cols, nullptr);
    const ggml_type_traits_cpu* traits = ggml_get_type_traits_cpu(t);
    const ggml_type xt = traits->vec_dot_type;
    std::vector<uint8_t> xq(ggml_row_size(xt, cols));
    const auto run = [&] {
      const void* xp = x.data();
      if (xt != GGML_TYPE_F32) {
        ggml_get_type_traits_cpu(xt)->from_float(x.data(), xq.data(), cols);
        xp = xq.data();
      }
      for (int64_t r = 0; r < rows; ++r) {
        traits->vec_dot(static_cast<int>(cols), &y[r], 0, w.data() + r * row_bytes, 0, xp, 0, 1);
      }
    };
    for (int i = 0; i < 50; ++i) run();
    double best = 1e30;
    for (int rep = 0; rep < 7; ++rep) {
      const double t0 = ThreadCpuSeconds();
      for (int i = 0; i < 200; ++i) run();
      best = std::min(best, (ThreadCpuSeconds() - t0) / 200);
    }
    std::printf("vecdot %s x %s %lldx%lld: %.2f Gweights/s %.2f GB/s\n", ggml_type_name(t),
                ggml_type_name(xt), static_cast<long long>(rows), static_cast<long long>(cols),
                static_cast<double>(rows * cols) / best / 1e9,
                static_cast<double>(w.size()) / best / 1e9);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || (argc < 3 && std::strcmp(argv[1], "vecdot") != 0)) return Usage();
  llama_log_set(QuietLog, nullptr);
  llama_backend_init();
  int rc;
  if (std::strcmp(argv[1], "load") == 0) {
    rc = Load(argv[2]);
  } else if (std::strcmp(argv[1], "logits") == 0) {
    rc = Logits(argc, argv);
  } else if (std::strcmp(argv[1], "greedy") == 0) {
    rc = Greedy(argc, argv);
  } else if (std::strcmp(argv[1], "dequant") == 0) {
    rc = Dequant(argc, argv);
  } else if (std::strcmp(argv[1], "quantize") == 0) {
    rc = Quantize(argc, argv);
  } else if (std::strcmp(argv[1], "quantize-input") == 0) {
    rc = QuantizeInput(argc, argv);
  } else if (std::strcmp(argv[1], "dump") == 0) {
    rc = Dump(argc, argv);
  } else if (std::strcmp(argv[1], "vecdot") == 0) {
    rc = VecDot(argc, argv);
  } else {
    rc = Usage();
  }
  llama_backend_free();
  return rc;
}
