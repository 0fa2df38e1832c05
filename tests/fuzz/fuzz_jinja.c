/* libFuzzer target: the Jinja renderer. The input up to its first NUL byte is the template;
 * after it, a JSON object (when it parses) is the context, else a chat-shaped default. Rendering
 * fails with a message or gives NUL-terminated text of the length it reports. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "text/jinja.h"

static const char default_ctx[] =
    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"tools\": [{\"type\": \"function\", "
    "\"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}], \"messages\": [{\"role\": \"system\", "
    "\"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \" yo \", "
    "\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"content\": \"1\"}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *tmpl = malloc(size + 1);
    memcpy(tmpl, data, size);
    tmpl[size] = 0;
    size_t tl = strlen(tmpl);
    cJSON *ctx = tl < size ? cJSON_Parse(tmpl + tl + 1) : NULL;
    if (!cJSON_IsObject(ctx)) {
        cJSON_Delete(ctx);
        ctx = cJSON_Parse(default_ctx);
    }
    char *out = NULL;
    size_t n = 0;
    dsv4_err err = {0};
    int rc = dsv4_jinja_render(tmpl, ctx, &out, &n, &err);
    if (rc && !err.msg[0])
        abort();
    if (!rc && (!out || out[n] != 0))
        abort();
    free(out);
    cJSON_Delete(ctx);
    free(tmpl);
    return 0;
}
