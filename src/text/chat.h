/* chat — renders a conversation into the DeepSeek-V4.1 prompt text (the release encoder's
 * format: <｜System｜>/<｜User｜>/<｜Assistant｜> markers, <think> reasoning, DSML tool calls,
 * <tool_result> blocks), and the Python-compatible JSON the encoder embeds. */
#ifndef DSV4_TEXT_CHAT_H
#define DSV4_TEXT_CHAT_H

#include <stddef.h>
#include <cjson/cJSON.h>
#include "core/err.h"
#include "text/buf.h"

/* request: {"messages": [...], "family": "deepseek_v41" (default) | "deepseek_v4" (the older encoder:
 *           no <｜System｜> marker, DSML tags "<｜DSML｜tool_calls>"/"invoke"/"parameter", effort
 *           null|"high"|"max" where only "max" writes a line), "thinking_mode": "chat"|"thinking" (default "thinking"),
 *           "reasoning_effort": null|"low"|"high"|"xhigh"|"max"|1..100 (null: "high" = 50),
 *           "drop_thinking": bool (default true), "add_generation_prompt": bool (default true),
 *           "continue_final_message": bool (default false), "tools": [...] (optional, attached to
 *           the first message, which must then be a system message)}.
 * Messages are OpenAI shaped: roles system (with optional "tools" and "response_format"),
 * developer, user, assistant ("content", "reasoning_content" or "reasoning", "tool_calls"),
 * tool ("tool_call_id", "content") and latest_reminder; content is a string or a list of text
 * (and image) parts. The prompt starts with BOS. *out is malloc'd, NUL-terminated. */
int dsv4_chat_render(const cJSON *request, char **out, size_t *out_len, dsv4_err *err);

/* Appends v as Python's json.dumps(v, ensure_ascii=False) writes it (", " and ": " separators).
 * Numbers with an integral value are written as integers (cJSON keeps no int/float distinction). */
void dsv4_py_json(dsv4_buf *b, const cJSON *v);

#endif
