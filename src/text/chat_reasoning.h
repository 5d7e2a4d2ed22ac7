/* A generated assistant answer that carries its reasoning inline, "<think>\nR\n</think>\n\nC"
 * (Qwen3 and the templates that copy it), split into reasoning_content and content, so that
 * `dspark regenerate` writes the turn the way such datasets store it. */
#ifndef DSPARK_TEXT_CHAT_REASONING_H
#define DSPARK_TEXT_CHAT_REASONING_H

#include <stddef.h>

/* The rule Qwen3's own template applies to an assistant content holding "</think>":
 *   reasoning = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
 *   content   = text.split('</think>')[-1].lstrip('\n')
 * so that the template re-renders the turn as the target wrote it. Returns 1 and the byte
 * ranges [*r_off, *r_off + *r_len) and [*c_off, *c_off + *c_len) of text; 0 (ranges unset)
 * when text has no "</think>". */
int tk_split_reasoning(const char *text, size_t len, size_t *r_off, size_t *r_len, size_t *c_off, size_t *c_len);

#endif
