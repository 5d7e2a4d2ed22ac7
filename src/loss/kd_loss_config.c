/* The KD loss's configuration and its checks (spec/kd.md section 3), the removed options, the
 * ghost bucket's log-mass, the intermediate-loss balancer, pair names and result accumulation:
 * the leaf that the whole-batch driver (kd_loss.c) and the row core (kd_loss_rows.c) use. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "dspark/kd_loss.h"
#include "dspark/kd_select.h"

ds_kd_loss_config ds_kd_loss_config_default(void) {
  ds_kd_loss_config c;
  memset(&c, 0, sizeof c);
  c.kd_loss_alpha = 1.0;
  c.temperature = 1.0;
  c.top_k = 0;
  c.top_p = 1.0;
  c.min_k = 1;
  c.reverse = 0;
  c.chunk_rows = 128;
  return c;
}

ds_status ds_kd_loss_config_check(const ds_kd_loss_config *cfg, int64_t vocab) {
  if (!cfg) return DS_FAIL(DS_ERR_ARG, "kd loss: config is NULL");
  if (!(cfg->kd_loss_alpha >= 0.0 && cfg->kd_loss_alpha <= 1.0))
    return DS_FAIL(DS_ERR_ARG, "--kd-loss-alpha %g is outside [0, 1] (total = (1 - alpha) lm + alpha kd)",
                   cfg->kd_loss_alpha);
  /* top_k here may be a file's width (kd-loss): a --min-k above it keeps all K */
  DS_TRY(ds_kd_select_check(cfg->top_k, 0, cfg->top_p, cfg->min_k, cfg->temperature, vocab));
  if (cfg->no_ghost && cfg->top_k == 0)
    return DS_FAIL(DS_ERR_ARG, "--no-ghost needs --topk: it renormalizes over the teacher's kept entries");
  if (cfg->chunk_rows < 1)
    return DS_FAIL(DS_ERR_ARG, "--chunk-rows %lld must be >= 1", (long long)cfg->chunk_rows);
  return DS_OK;
}

/* a == b up to '-' vs '_' */
static int same_option(const char *a, const char *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char x = a[i] == '_' ? '-' : a[i], y = b[i] == '_' ? '-' : b[i];
    if (x != y) return 0;
  }
  return 1;
}

ds_status ds_kd_check_removed_option(const char *arg) {
  static const char *const removed[] = {"skip-lm-loss", "kd-loss-scale"};
  if (!arg) return DS_OK;
  const char *name = arg;
  while (*name == '-') name++;
  size_t n = strcspn(name, "=");
  for (int i = 0; i < 2; i++)
    if (n == strlen(removed[i]) && same_option(name, removed[i], n))
      return DS_FAIL(DS_ERR_ARG, "%.*s was removed: %s", (int)(name - arg + n), arg, DS_KD_REMOVED_OPTION_HINT);
  return DS_OK;
}

double ds_kd_ghost_log_mass(double log_kept_mass) {
  double l = log_kept_mass < -DS_KD_GHOST_EPS ? log_kept_mass : -DS_KD_GHOST_EPS; /* NaN stays NaN below */
  if (log_kept_mass != log_kept_mass) return log_kept_mass;
  return log(-expm1(l));
}

ds_status ds_kd_balance_losses(double alpha, double lm, double logits_kd, const double *inter, int64_t n,
                               ds_kd_balance *out) {
  if (!out || n < 0 || (n > 0 && !inter)) return DS_FAIL(DS_ERR_ARG, "kd balancer: NULL output or losses");
  if (!(alpha >= 0.0 && alpha <= 1.0))
    return DS_FAIL(DS_ERR_ARG, "--kd-loss-alpha %g is outside [0, 1] (total = (1 - alpha) lm + alpha kd)", alpha);
  if (!isfinite(lm)) return DS_FAIL(DS_ERR_NUMERIC, "kd balancer: the LM loss is %g", lm);
  if (!isfinite(logits_kd)) return DS_FAIL(DS_ERR_NUMERIC, "kd balancer: the logits KD loss is %g", logits_kd);
  double sum = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(inter[i]))
      return DS_FAIL(DS_ERR_NUMERIC, "kd balancer: intermediate loss %lld is %g", (long long)i, inter[i]);
    sum += inter[i];
  }
  memset(out, 0, sizeof *out);
  double I = n > 0 ? sum / (double)n : 0.0;
  out->intermediate = I;
  out->scale = I > 0.0 ? fabs(logits_kd) / (I > FLT_MIN ? I : FLT_MIN) : 0.0;
  out->kd = logits_kd + I * out->scale;
  out->total = (1.0 - alpha) * lm + alpha * out->kd;
  out->w_lm = 1.0 - alpha;
  out->w_logits_kd = alpha;
  out->w_intermediate = n > 0 ? alpha * out->scale / (double)n : 0.0;
  return DS_OK;
}

const char *ds_kd_pair_name(int pair) {
  static const char *const names[DS_KD_PAIR_COUNT] = {"loss", "kd", "lm"};
  return pair >= 0 && pair < DS_KD_PAIR_COUNT ? names[pair] : NULL;
}

void ds_kd_loss_result_add(ds_kd_loss_result *acc, const ds_kd_loss_result *x) {
  acc->numerator += x->numerator;
  acc->num_tokens += x->num_tokens;
  for (int i = 0; i < DS_KD_PAIR_COUNT; i++) {
    acc->pair[i][0] += x->pair[i][0];
    acc->pair[i][1] += x->pair[i][1];
    acc->pair_present[i] |= x->pair_present[i];
  }
}
