/* The target's forward on the CUDA backend against the cpu backend (issue 14): the same model
 * code run on device memory (weights uploaded at load, workspace and KV cache in backend
 * memory, outputs copied back). Built with the real backend (scripts/gpu-check.sh runs it on a
 * GPU) and with the CPU emulation of CUDA (unit.cuda_emu_target, on every build).
 *   target_device_check MODEL            a model directory or .gguf
 *   target_device_check --tiny DIR       writes a tiny random Qwen3 (q/k norms, GQA, untied
 *                                        head; BF16 layer weights used in place) into DIR first
 * Two sequences (9 and 5 prompt tokens) are prefilled together, capturing the embedding output
 * and layer 0, keeping the final hidden state and every row's logits; then three decode steps
 * of both, logits of one row each. Error: max |device - cpu| / max |cpu| per output; tolerance
 * 1e-4 (fp32 on both sides, summation orders differ). Exit 1 on a failure, 2 without a device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/common.h"
#include "dspark/dtype.h"
#include "dspark/fileio.h"
#include "dspark/rng.h"
#include "dspark/safetensors.h"
#include "dspark/target.h"

#define TOL 1e-4

static int g_fail;

static __attribute__((noreturn)) void die(const char *what) {
  fprintf(stderr, "target_device_check: %s: %s\n", what, ds_last_error());
  exit(1);
}

static void compare(const char *name, const float *got, const float *want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - (double)want[i]);
    num = isnan(d) ? INFINITY : fmax(num, d);
    den = fmax(den, fabs((double)want[i]));
  }
  double err = num / (den > 0 ? den : 1);
  int ok = err <= TOL;
  g_fail += !ok;
  printf("%-36s max_rel_err %.3e  tol %.0e  %s\n", name, err, TOL, ok ? "PASS" : "FAIL");
}

/* A tiny Qwen3: V 97, d 64, 2 layers, 4 query heads over 2 kv heads of 16, intermediate 96. */
static void write_tiny(const char *dir) {
  enum { V = 97, D = 64, L = 2, H = 4, KV = 2, HD = 16, I = 96 };
  if (ds_mkdir_p(dir) != DS_OK) die(dir);
  char path[1024];
  snprintf(path, sizeof path, "%s/config.json", dir);
  const char *cfg = "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 97, "
                    "\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
                    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
                    "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"max_position_embeddings\": 128, "
                    "\"tie_word_embeddings\": false, \"torch_dtype\": \"float32\"}";
  if (ds_write_file_atomic(path, cfg, strlen(cfg)) != DS_OK) die(path);
  ds_rng rng;
  ds_rng_seed(&rng, 7);
  ds_st_writer *w = ds_st_writer_new();
  float *buf = malloc(sizeof(float) * V * D * 2);
  uint16_t *b16 = malloc(sizeof(uint16_t) * I * D * 2);
  if (!w || !buf || !b16) die("out of memory");
  /* name, rows, cols (0: a vector), bf16 */
  struct { const char *name; int64_t rows, cols; int bf16; } t[] = {
      {"self_attn.q_proj.weight", H * HD, D, 1}, {"self_attn.k_proj.weight", KV * HD, D, 1},
      {"self_attn.v_proj.weight", KV * HD, D, 1}, {"self_attn.o_proj.weight", D, H * HD, 1},
      {"self_attn.q_norm.weight", HD, 0, 0},      {"self_attn.k_norm.weight", HD, 0, 0},
      {"mlp.gate_proj.weight", I, D, 1},          {"mlp.up_proj.weight", I, D, 1},
      {"mlp.down_proj.weight", D, I, 1},          {"input_layernorm.weight", D, 0, 0},
      {"post_attention_layernorm.weight", D, 0, 0}};
  char name[128];
  for (int l = -1; l <= L; l++) {
    int n_t = l < 0 || l == L ? 1 : (int)(sizeof t / sizeof *t);
    for (int k = 0; k < n_t; k++) {
      int64_t rows = V, cols = D;
      int bf16 = 0, norm = 0;
      if (l < 0) snprintf(name, sizeof name, "model.embed_tokens.weight");
      else if (l == L) snprintf(name, sizeof name, "lm_head.weight");
      else {
        snprintf(name, sizeof name, "model.layers.%d.%s", l, t[k].name);
        rows = t[k].rows, cols = t[k].cols, bf16 = t[k].bf16, norm = cols == 0;
      }
      int64_t n = rows * (cols ? cols : 1), shape[2] = {rows, cols};
      float scale = l < 0 ? 1.0f : 0.5f / sqrtf((float)(cols ? cols : 1));
      for (int64_t i = 0; i < n; i++)
        buf[i] = norm ? 1.0f + 0.2f * (ds_rng_uniform_f32(&rng) - 0.5f) : scale * (2 * ds_rng_uniform_f32(&rng) - 1);
      ds_status st;
      if (bf16) {
        for (int64_t i = 0; i < n; i++) b16[i] = ds_f32_to_bf16(buf[i]);
        st = ds_st_writer_add(w, name, DS_BF16, 2, shape, b16);
      } else {
        st = ds_st_writer_add(w, name, DS_F32, cols ? 2 : 1, shape, buf);
      }
      if (st != DS_OK) die(name);
    }
  }
  int64_t dshape[1] = {D};
  for (int64_t i = 0; i < D; i++) buf[i] = 1.0f + 0.1f * (ds_rng_uniform_f32(&rng) - 0.5f);
  if (ds_st_writer_add(w, "model.norm.weight", DS_F32, 1, dshape, buf) != DS_OK) die("model.norm.weight");
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if (ds_st_writer_write(w, path) != DS_OK) die(path);
  ds_st_writer_free(w);
  free(buf);
  free(b16);
}

typedef struct {
  float *captured, *hidden, *logits, *step_logits[3];
} results;

/* Prefill of both sequences, then three decode steps; everything the outputs hold, on the host. */
static results run(ds_target *m, const int32_t *a, const int32_t *b) {
  const ds_model_config *c = ds_target_config(m);
  int64_t d = c->hidden_size, V = c->vocab_size, rows = 14;
  results r;
  r.captured = calloc((size_t)(rows * 2 * d), sizeof(float));
  r.hidden = calloc((size_t)(rows * d), sizeof(float));
  r.logits = calloc((size_t)(rows * V), sizeof(float));
  ds_kv_cache *ca, *cb;
  if (ds_kv_cache_new(m, 32, &ca) != DS_OK || ds_kv_cache_new(m, 32, &cb) != DS_OK) die("KV cache");
  ds_target_seq seqs[2] = {{a, 9, ca}, {b, 5, cb}};
  int32_t layers[2] = {-1, 0};
  ds_target_outputs out = {layers, 2, r.captured, r.hidden, NULL, 0, r.logits};
  if (ds_target_forward(m, seqs, 2, &out) != DS_OK) die("prefill");
  for (int s = 0; s < 3; s++) {
    int32_t next[2] = {(int32_t)((a[s] + 11 * s) % V), (int32_t)((b[s] + 5) % V)};
    ds_target_seq step[2] = {{next, 1, ca}, {next + 1, 1, cb}};
    int64_t which = s % 2;
    ds_target_outputs o = {NULL, 0, NULL, NULL, &which, 1, NULL};
    o.logits = r.step_logits[s] = calloc((size_t)V, sizeof(float));
    if (ds_target_forward(m, step, 2, &o) != DS_OK) die("decode step");
  }
  ds_kv_cache_free(ca);
  ds_kv_cache_free(cb);
  return r;
}

int main(int argc, char **argv) {
  const char *model = NULL;
  if (argc == 3 && !strcmp(argv[1], "--tiny")) {
    write_tiny(argv[2]);
    model = argv[2];
  } else if (argc == 2) {
    model = argv[1];
  } else {
    fprintf(stderr, "usage: target_device_check MODEL | --tiny DIR\n");
    return 2;
  }
  const ds_backend *gpu = ds_backend_cuda();
  if (!gpu) {
    fprintf(stderr, "target_device_check: no CUDA backend: %s\n", ds_last_error());
    return 2;
  }
  ds_target *mc, *mg;
  if (ds_target_load(model, ds_backend_cpu(), &mc) != DS_OK) die("load on cpu");
  if (ds_target_load(model, gpu, &mg) != DS_OK) die("load on cuda");
  const ds_model_config *c = ds_target_config(mc);
  int64_t d = c->hidden_size, V = c->vocab_size;
  int32_t a[9], b[5];
  for (int i = 0; i < 9; i++) a[i] = (int32_t)((7 * i + 3) % V);
  for (int i = 0; i < 5; i++) b[i] = (int32_t)((13 * i + 1) % V);
  results rc = run(mc, a, b), rg = run(mg, a, b);
  printf("target_device_check: %s, cuda vs cpu (%s)\n", model, ds_gemm_name());
  compare("prefill captured (embedding, layer 0)", rg.captured, rc.captured, (size_t)(14 * 2 * d));
  compare("prefill final hidden", rg.hidden, rc.hidden, (size_t)(14 * d));
  compare("prefill logits", rg.logits, rc.logits, (size_t)(14 * V));
  char name[64];
  for (int s = 0; s < 3; s++) {
    snprintf(name, sizeof name, "decode step %d logits", s + 1);
    compare(name, rg.step_logits[s], rc.step_logits[s], (size_t)V);
  }
  ds_target_free(mc);
  ds_target_free(mg);
  printf("target_device_check: %s\n", g_fail ? "FAILURES above" : "all passed");
  return g_fail ? 1 : 0;
}
