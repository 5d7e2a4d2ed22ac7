/* A tokenizer checked against the model it feeds (target.h): a mismatch found at load names
 * both files, instead of "id N outside the vocabulary" when such a token first occurs. */
#include "dspark/target.h"

ds_status ds_target_check_tokenizer(const ds_model_config *cfg, const ds_tokenizer *tok, const char *config_label,
                                    const char *tokenizer_label) {
  if (!cfg || !tok) return DS_FAIL(DS_ERR_ARG, "ds_target_check_tokenizer: NULL argument");
  if (!config_label) config_label = "config.json";
  if (!tokenizer_label) tokenizer_label = "tokenizer.json";
  int64_t n = ds_tokenizer_vocab_size(tok);
  if (n > cfg->vocab_size)
    return DS_FAIL(DS_ERR_FORMAT,
                   "%s has ids up to %lld but %s has vocab_size %lld: the model has no row for ids %lld..%lld "
                   "(a tokenizer of another model?)",
                   tokenizer_label, (long long)(n - 1), config_label, (long long)cfg->vocab_size,
                   (long long)cfg->vocab_size, (long long)(n - 1));
  for (int i = 0; i < cfg->n_eos; i++) {
    int64_t eos = cfg->eos_token_ids[i];
    if (eos < 0 || eos >= cfg->vocab_size)
      return DS_FAIL(DS_ERR_FORMAT, "%s: eos_token_id %lld is outside the vocabulary (vocab_size %lld)", config_label,
                     (long long)eos, (long long)cfg->vocab_size);
    if (eos >= n || !ds_tokenizer_id_to_token(tok, (int32_t)eos))
      return DS_FAIL(DS_ERR_FORMAT, "%s: eos_token_id %lld is not a token of %s (ids 0..%lld)", config_label,
                     (long long)eos, tokenizer_label, (long long)(n - 1));
  }
  return DS_OK;
}
