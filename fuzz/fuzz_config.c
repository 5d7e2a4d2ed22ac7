/* libFuzzer target for the JSON configuration parsers: the target's config.json and the
 * exported draft's config.json (which goes through the target parser as well). */
#include <stddef.h>
#include <stdint.h>

#include "dspark/draft.h"
#include "dspark/hfconfig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ds_model_config c;
  if (ds_config_parse((const char *)data, size, "fuzz config.json", &c) == DS_OK) {
    /* A config that parses must be usable: sizes the model would allocate from are sane. */
    if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.head_dim <= 0 || c.num_attention_heads % c.num_key_value_heads)
      __builtin_trap();
    (void)ds_config_num_params(&c);
  }
  ds_draft_config d;
  if (ds_draft_config_from_json((const char *)data, size, "fuzz draft config.json", &d) == DS_OK) {
    if (ds_draft_config_check(&d) != DS_OK) __builtin_trap();
  }
  return 0;
}
