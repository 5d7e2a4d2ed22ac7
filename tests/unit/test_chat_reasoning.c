/* tk_split_reasoning: a generated "<think>...</think>" answer split as Qwen3's template splits
 * a content holding "</think>" (the Python expressions in chat_reasoning.h, evaluated here by
 * hand for each case). */
#include <string.h>

#include "test_util.h"
#include "text/chat_reasoning.h"

static void expect_split(const char *text, const char *want_reasoning, const char *want_content) {
  size_t ro = 0, rl = 0, co = 0, cl = 0, n = strlen(text);
  int got = tk_split_reasoning(text, n, &ro, &rl, &co, &cl);
  if (!want_content) {
    EXPECT(got == 0);
    return;
  }
  EXPECT(got == 1);
  if (got != 1) return;
  int ok_r = rl == strlen(want_reasoning) && !memcmp(text + ro, want_reasoning, rl);
  int ok_c = cl == strlen(want_content) && !memcmp(text + co, want_content, cl);
  if (!ok_r || !ok_c)
    fprintf(stderr, "split of \"%s\": reasoning \"%.*s\" (want \"%s\"), content \"%.*s\" (want \"%s\")\n", text,
            (int)rl, text + ro, want_reasoning, (int)cl, text + co, want_content);
  EXPECT(ok_r);
  EXPECT(ok_c);
}

static void test_split(void) {
  expect_split("<think>\nstep one\nstep two\n</think>\n\nThe answer.", "step one\nstep two", "The answer.");
  expect_split("<think>\n\n</think>\n\nHi", "", "Hi");                  /* the empty block of thinking off */
  expect_split("no block at all", NULL, NULL);                          /* nothing to split */
  expect_split("<think>\nunfinished, cut by the length", NULL, NULL);   /* no </think>: left as content */
  expect_split("plain </think>\nrest", "plain ", "rest");                /* no <think>: all before is reasoning */
  expect_split("a<think>\nx</think>b</think>\n\nc", "x", "c");          /* content after the LAST </think> */
  expect_split("<think>\nr\n</think>", "r", "");                       /* empty content */
  expect_split("<think><think>\ninner\n\n</think>\n\n\nC\n", "inner", "C\n"); /* the last <think>; trailing kept */
}

int main(void) {
  TEST_RUN(test_split);
  return TEST_RESULT();
}
