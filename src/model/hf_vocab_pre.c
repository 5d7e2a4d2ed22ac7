/* The pre-tokenizer name llama.cpp's converter writes (`tokenizer.ggml.pre`) for a Hugging Face
 * tokenizer: convert_hf_to_gguf.py encodes a fixed check text with the tokenizer as transformers
 * loads it (post-processor included), takes the SHA-256 of the id list printed as Python prints
 * a list ("[1, 2, 3]") and looks the digest up in a table of the tokenizers it knows; an unknown
 * digest stops the conversion. The check text and the digests are interoperability data: those
 * of the converter vendored with llama-cpp-python 0.3.36. Where one digest is listed twice the
 * converter keeps the later name, as here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"
#include "model/hf_vocab_internal.h"

/* The converter's check text, UTF-8 (431 bytes). */
static const char k_check_text[] =
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\xf0\x9f\x9a\x80 (normal) \xf0\x9f\x98\xb6"
    "\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f (multiple emojis concatenated) \xe2\x9c\x85 \xf0\x9f"
    "\xa6\x99\xf0\x9f\xa6\x99 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 \xe1\x9e"
    "\x80\xe1\x9e\xb6\xe1\x9e\x93\xe1\x9f\x8b\xe1\x9e\x8f\xe1\x9f\x82\xe1\x9e\x96\xe1\x9e\xb7\xe1"
    "\x9e\x9f\xe1\x9f\x81\xe1\x9e\x9f\xe1\x9e\xa2\xe1\x9e\xb6\xe1\x9e\x85\xf0\x9f\x98\x81 ?\xe6\x88"
    "\x91\xe6\x83\xb3\xe5\x9c\xa8" "apple\xe5\xb7\xa5\xe4\xbd\x9c" "1314151\xe5\xa4\xa9\xef\xbd\x9e"
    " ------======= \xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe \xd0\xbd\xd0\xb0 \xd0\x91\xd1\x8a\xd0\xbb\xd0"
    "\xb3\xd0\xb0\xd1\x80\xd1\x81\xd0\xba\xd0\xb8 ''''''```````\"\"\"\"......!!!!!!?????? I've b"
    "een 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a"
    "'lL";

static const struct {
  const char *sha256, *pre;
} k_known[] = {
    {"b6e8e1518dc4305be2fe39c313ed643381c4da5db34a98f6a04c093f8afbe99b", "chatglm-bpe"},
    {"81d72c7348a9f0ebe86f23298d37debe0a5e71149e29bd283904c02262b27516", "chatglm-bpe"},
    {"a1336059768a55c99a734006ffb02203cd450fed003e9a71886c88acf24fdbc2", "glm4"},
    {"9ca2dd618e8afaf09731a7cf6e2105b373ba6a1821559f258b272fe83e6eb902", "glm4"},
    {"cdf5f35325780597efd76153d4d1c16778f766173908894c04afc20108536267", "glm4"},
    {"1431a23e583c97432bc230bff598d103ddb5a1f89960c8f1d1051aaa944d0b35", "minerva-7b"},
    {"7e57df22b1fe23a7b1e1c7f3dc4e3f96d43a4eb0836d0c6bdc3436d7b2f1c664", "hunyuan"},
    {"bba3b3366b646dbdded5dbc42d59598b849371afc42f7beafa914afaa5b70aa6", "hunyuan-dense"},
    {"e6ddf9c6686791c12d698d34c31ab9be1fea9af5a3d9a6909783ab382198ae1c", "hy_v4"},
    {"a6b57017d60e6edb4d88ecc2845188e0eb333a70357e45dcc9b53964a73bbae6", "falcon-h1"},
    {"60476e1243776c4fb1b993dbd7a5f15ac22f83c80afdf425fa5ae01c8d44ef86", "falcon-h1"},
    {"3eda48b4c4dc7de733d1a8b3e3b4a85243dbbf704da2ee9d42c6beced8897896", "falcon-h1"},
    {"48f8e02c0359c0bbdd82f26909171fac1c18a457bb47573ed1fe3bbb2c1cfd4b", "falcon-h1"},
    {"81212dc7cdb7e0c1074ca62c5aeab0d43c9f52b8a737be7b12a777c953027890", "kimi-k2"},
    {"d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c", "qwen2"},
    {"1444df51289cfa8063b96f0e62b1125440111bc79a52003ea14b6eac7016fd5f", "qwen35"},
    {"66b8d4e19ab16c3bfd89bce5d785fb7e0155e8648708a1f42077cb9fe002c273", "grok-2"},
    {"b3d1dd861f1d4c5c0d2569ce36baf3f90fe8a102db3de50dd71ff860d91be3df", "jina-v2-de"},
    {"0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4", "gpt-2"},
    {"9e454714343b69b99b71795c1d27a68c2a1d15dab111f4d353109f966af29da7", "lfm2"},
    {"846deafc5b0fa786186fa4ae6c7b49903cf2f1d1895bdb80b9120d60be135252", "gemma4"},
    {"0a766d034107bc736a3f2dc4968fd62e54a3570f1454443e0c5a4cc6bd7941ed", "spark2_5"},
    {"0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5", "llama-bpe"},
    {"049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754", "deepseek-llm"},
    {"347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821", "deepseek-coder"},
    {"8aeee3860c56296a157a1fe2fad249ec40aa59b1bb5709f4ade11c4e6fe652ed", "falcon"},
    {"0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f", "jina-v2-en"},
    {"9d032fcbd5501f4a38150912590928bfb36091efb5df11b8e2124b0390e3fb1e", "falcon3"},
    {"8e62295832751ca1e8f92f2226f403dea30dc5165e448b5bfa05af5340c64ec7", "bert-bge-large"},
    {"b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166", "olmo"},
    {"35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34", "starcoder"},
    {"3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454", "gpt-2"},
    {"32d85c31273f8019248f2559fed492d929ea28b17e51d81d3bb36fff23ca72b3", "stablelm2"},
    {"6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff", "refact"},
    {"9c2227e4dd922002fb81bde4fc02b0483ca4f12911410dee2255e4987644e3f8", "command-r"},
    {"d772b220ace2baec124bed8cfafce0ead7d6c38a4b65ef11261cf9d5d62246d1", "tiny_aya"},
    {"52df12b4c8d4176e7481aab4b6e8454d1fd0a210a04a574f6d4e067d10e23c3e", "cohere2moe"},
    {"e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea", "qwen2"},
    {"a8594e3edff7c29c003940395316294b2c623e09894deebbc65f33f1515df79e", "dbrx"},
    {"c7699093ba4255a91e702aa38a596aa81669f3525dae06c2953267dde580f448", "jina-v1-en"},
    {"171aeeedd6fb548d418a7461d053f11b6f1f1fc9b387bd66640d28a4b9f5c643", "jina-v2-es"},
    {"27949a2493fc4a9f53f5b9b029c82689cfbe5d3a1929bb25e043089e28466de6", "jina-v2-de"},
    {"a023e9fdc5a11f034d3ef515b92350e56fb2af1f66c6b6811a4444ea9bf8763d", "jina-v5-nano"},
    {"c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d", "smaug-bpe"},
    {"c7ea5862a53e4272c035c8238367063e2b270d51faa48c0f09e9d5b54746c360", "poro-chat"},
    {"7967bfa498ade6b757b064f31e964dddbb80f8f9a4d68d4ba7998fcf281c531a", "jina-v2-code"},
    {"7fc505bd3104ca1083b150b17d088b59534ede9bde81f0dd2090967d7fe52cee", "viking"},
    {"b53802fb28e26d645c3a310b34bfe07da813026ec7c7716883404d5e0f8b1901", "jais"},
    {"bc5108ee1eb6a3d600cadd065f63190fbd0554dbc9e4bbd6a0d977970afc8d2a", "jais-2"},
    {"7b3e7548e4308f52a76e8229e4e6cc831195d0d1df43aed21ac6c93da05fec5f", "codeshell"},
    {"63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e", "tekken"},
    {"855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249", "smollm"},
    {"3c30d3ad1d6b64202cd222813e7736c2db6e1bd6d67197090fc1211fbc612ae7", "bloom"},
    {"bc01ce58980e1db43859146dc51b1758b3b88729b217a74792e9f8d43e479d21", "gpt3-finnish"},
    {"4e2b24cc4770243d65a2c9ec19770a72f08cffc161adbb73fcbb6b7dd45a0aae", "exaone"},
    {"fcace8b9cac38ce847670c970cd5892031a753a1ef381abd1d9af00f713da085", "phi-2"},
    {"60824e3c0d9401f89943cbb2fff727f0e2d4c545ba4df2d6e4f09a6db0f5b450", "chameleon"},
    {"8b5a93ed704057481f240da0be7e7dca721d7f8f4755263b6807227a2cbeae65", "roberta-bpe"},
    {"ad851be1dba641f2e3711822f816db2c265f788b37c63b4e1aeacb9ee92de8eb", "gigachat"},
    {"d4c8f286ea6b520b3d495c4455483cfa2302c0cfcd4be05d781b6a8a0a7cdaf1", "megrez"},
    {"877081d19cf6996e2c4ff0e1236341e9b7bde288f5311a56a937f0afbbb3aeb5", "deepseek-v3"},
    {"b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5", "deepseek-r1-qwen"},
    {"ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e", "gpt-4o"},
    {"7dec86086fcc38b66b7bc1575a160ae21cf705be7718b9d5598190d7c12db76f", "superbpe"},
    {"1994ffd01900cfb37395608534236ecd63f2bd5995d6cb1004dda1af50240f15", "trillion"},
    {"96a5f08be6259352137b512d4157e333e21df7edd3fcd152990608735a65b224", "bailingmoe"},
    {"d353350c764d8c3b39c763113960e4fb4919bea5fbf208a0e3b22e8469dc7406", "llama4"},
    {"0e9433cbbb161f89e264eb32e8e64bfe69e834973ffca5d41d3948a604a3e2a3", "pixtral"},
    {"d5f1dd6f980fec569fb218a81a7658ac45fc56b38c5a0adeb1c232fbe04ef5ec", "seed-coder"},
    {"b0a6b1c0bd5998ebd9df08611efde34a4ff03faed45ae09c43e6b31ebd4b94cf", "a.x-4.0"},
    {"f6791d196f87ce6b56a7d234be618e0d58f8cda3549416635b2bebcd22cd95c4", "midm-2.0"},
    {"169bf0296a13c4d9b7672313f749eb36501d931022de052aad6e36f2bf34dd51", "lfm2"},
    {"2085e1638f6c377a0aa4ead21b27bb4cb941bf800df86ed391011769c1758dfb", "exaone4"},
    {"a1e163ecab2e718a4c829d1148b6e86824ec36163bb71941c3dca9cd5ac25756", "mellum"},
    {"a0b64b4385f123663873756336c085744376d015ff328bb1d901598f63c44152", "modern-bert"},
    {"49fc0303c9e0d2c2c565c510f64b2d9b271276acdcdadff733249eda9f7d59df", "afmoe"},
    {"9b1be57e70d20d9501b2b3186e792d81181ae36ada3903c26f9fea418cf87206", "bailingmoe2"},
    {"53e325976a6e142379c19b09afcae354f2f496f147afa8f9e189a33fe4e3024e", "granite-docling"},
    {"f4f37b6c8eb9ea29b3eac6bb8c8487c5ab7885f8d8022e67edc1c68ce8403e95", "minimax-m2"},
    {"4a2e2abae11ca2b86d570fc5b44be4d5eb5e72cc8f22dd136a94b37da83ab665", "kormo"},
    {"9d70134b369a70e5735009b6de918f7581b5211f7c074d1f89f753aea8248af1", "youtu"},
    {"16389f0a1f51ee53e562ffd51c371dc508639ab0e4261502071836e50e223e91", "solar-open"},
    {"6c81ce329e0802883b22eabab0d3fa48357337ef1ecb45443828bf1f6254833f", "exaone-moe"},
    {"d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4", "qwen35"},
    {"b4b8ca1f9769494fbd956ebc4c249de6131fb277a4a3345a7a92c7dd7a55808d", "joyai-llm"},
    {"e4d54df1ebc1f2b91acd986c5b51aa50837d5faf7c7398e73c1f9e9ee5d19869", "kanana2"},
    {"862f827721df956049dff5ca81a57f29e575280bc622e290d3bf4e35eca29015", "f2llmv2"},
    {"62f6fb0a6fd5098caeabb19b07a5c1099cafc8b9c40eab6ea89ece4ec02fbc57", "sarvam-moe"},
    {"f728162c1315c26e40249849799b4ba3fe584c32084b4795b03eb295e63cb5af", "talkie"},
    {"36f3066e97b7f3994b379aaacde306c1444c6ae84e81a5ae3cd2b7ed3b8c42d4", "minicpm5"},
    {"f241072145675bf8322086f115aebad05e9f869557a238bf2150a2a417d1bf60", "granite-embed-multi-97m"},
    {"789696f5946cc0fc59371f39f6097cafed196b3acded6140432f26bbb1ae1669", "granite-embed-multi-311m"},
    {"9dcf830ee9990cdbf78cc523a5f7bd9ad8f3f9890c2d3581d2785ad10f07049d", "mellum2"},
    {"972da7b59cec44d1f0a490a86c96df53859e486e481563e5dddac155013d87ac", "laguna"},
    {"653660222fb704f61cbf2b618a8ae6502b7f8b20c980f9a5de07ed78e13319cd", "ufakzeka"},
};

/* The ids as Python's str(list) prints them, hashed. */
static ds_status ids_digest(const ds_ids *ids, char hex[65]) {
  size_t cap = 2 + ids->len * 13, n = 0;
  char *s = malloc(cap);
  if (!s) return DS_FAIL(DS_ERR_NOMEM, "check-text ids (%zu)", ids->len);
  s[n++] = '[';
  for (size_t i = 0; i < ids->len; i++) n += (size_t)snprintf(s + n, cap - n, i ? ", %d" : "%d", (int)ids->ids[i]);
  s[n++] = ']';
  ds_sha256_hex(s, n, hex);
  free(s);
  return DS_OK;
}

ds_status hfv_pre_name(const ds_tokenizer *tok, const char *label, const char *klass, const char **pre,
                       char hex[65]) {
  ds_ids ids = {0};
  *pre = NULL;
  ds_status st = ds_tokenizer_encode(tok, k_check_text, sizeof k_check_text - 1, 1, &ids);
  if (st == DS_OK) st = ids_digest(&ids, hex);
  ds_ids_free(&ids);
  if (st != DS_OK) return st;
  for (size_t i = 0; i < sizeof k_known / sizeof k_known[0]; i++)
    if (!strcmp(k_known[i].sha256, hex)) *pre = k_known[i].pre;
  if (*pre) return DS_OK;
  return DS_FAIL(DS_ERR_UNSUPPORTED,
                 "%s: its BPE pre-tokenizer is not one llama.cpp's converter can name: the ids of the converter's "
                 "check text (encoded by the tokenizer as transformers loads it, %s) hash to %s, none of the %zu "
                 "tokenizers convert_hf_to_gguf.py knows (get_vocab_base_pre), so llama.cpp could not tell how to "
                 "split text for this vocabulary; its converter refuses it too",
                 label, klass, hex, sizeof k_known / sizeof k_known[0]);
}

size_t hfv_known_pre_count(void) { return sizeof k_known / sizeof k_known[0]; }
