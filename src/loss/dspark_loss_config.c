/* The DSpark loss's configuration, decay, pair names and result accumulation: the leaf that
 * both the whole-batch driver (dspark_loss.c) and the row core (dspark_loss_rows.c) use. */
#include <math.h>
#include <string.h>

#include "dspark/dspark_loss.h"

ds_dspark_loss_config ds_dspark_loss_config_default(void) {
  ds_dspark_loss_config c;
  memset(&c, 0, sizeof c);
  c.alpha_ce = 0.1;
  c.alpha_l1 = 0.9;
  c.alpha_conf = 1.0;
  c.decay_gamma = 4.0;
  c.decay = DS_DSPARK_DECAY_DEEPSPEC;
  c.chunk_rows = 128;
  c.has_teacher = 1;
  c.has_conf = 1;
  return c;
}

ds_status ds_dspark_loss_config_check(const ds_dspark_loss_config *cfg) {
  if (!cfg) return DS_FAIL(DS_ERR_ARG, "dspark loss: config is NULL");
  const double a[3] = {cfg->alpha_ce, cfg->alpha_l1, cfg->alpha_conf};
  const char *names[3] = {"alpha_ce", "alpha_l1", "alpha_conf"};
  for (int i = 0; i < 3; i++)
    if (!isfinite(a[i]) || a[i] < 0.0)
      return DS_FAIL(DS_ERR_ARG, "dspark loss: %s = %g must be finite and >= 0", names[i], a[i]);
  if (!isfinite(cfg->decay_gamma))
    return DS_FAIL(DS_ERR_ARG, "dspark loss: decay_gamma = %g is not finite", cfg->decay_gamma);
  if (cfg->decay != DS_DSPARK_DECAY_DEEPSPEC && cfg->decay != DS_DSPARK_DECAY_PAPER)
    return DS_FAIL(DS_ERR_ARG, "dspark loss: unknown decay mode %d", (int)cfg->decay);
  if (cfg->chunk_rows < 1)
    return DS_FAIL(DS_ERR_ARG, "dspark loss: chunk_rows = %lld must be >= 1", (long long)cfg->chunk_rows);
  return DS_OK;
}

double ds_dspark_loss_decay(const ds_dspark_loss_config *cfg, int64_t k, int64_t g) {
  if (cfg->decay == DS_DSPARK_DECAY_PAPER) return exp(-(double)k / (double)g);
  if (cfg->decay_gamma <= 0.0) return 1.0;
  return exp(-(double)k / cfg->decay_gamma);
}

const char *ds_dspark_pair_name(int pair) {
  static const char *const names[DS_DSPARK_PAIR_COUNT] = {"loss", "ce", "l1", "confidence", "accept_rate", "tau"};
  return pair >= 0 && pair < DS_DSPARK_PAIR_COUNT ? names[pair] : NULL;
}

void ds_dspark_loss_result_add(ds_dspark_loss_result *acc, const ds_dspark_loss_result *x) {
  acc->numerator += x->numerator;
  acc->num_tokens += x->num_tokens;
  acc->W += x->W;
  for (int i = 0; i < DS_DSPARK_PAIR_COUNT; i++) {
    acc->pair[i][0] += x->pair[i][0];
    acc->pair[i][1] += x->pair[i][1];
    acc->pair_present[i] |= x->pair_present[i];
  }
}
