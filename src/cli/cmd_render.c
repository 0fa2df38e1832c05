/* dsv4 render: chat requests to prompt text, one per line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "cli/cli.h"
#include "core/core.h"
#include "text/chat.h"
#include "text/jinja.h"

static char *slurp(const char *path) { return dsv4_read_file(path, NULL, NULL); }

/* A token given in tokenizer_config.json as a string or as {"content": ...}. */
static const char *token_text(const cJSON *t)
{
    if (cJSON_IsString(t))
        return t->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(t, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

/* The template from a file, or from a folder's tokenizer_config.json (its "chat_template", the
 * "default" one of a list), with bos_token/eos_token added to *vars. */
static char *load_template(const char *path, cJSON *vars)
{
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", path);
    char *text = slurp(cfg);
    if (!text)
        return slurp(path);
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template"), *e;
    char *out = NULL;
    if (cJSON_IsArray(ct))
        cJSON_ArrayForEach(e, ct)
        {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default"))
                ct = cJSON_GetObjectItemCaseSensitive(e, "template");
        }
    if (cJSON_IsString(ct)) {
        size_t k = strlen(ct->valuestring);
        out = malloc(k + 1);
        if (out)
            memcpy(out, ct->valuestring, k + 1);
    }
    const char *names[] = {"bos_token", "eos_token"};
    for (int i = 0; i < 2; i++) {
        const char *v = token_text(cJSON_GetObjectItemCaseSensitive(j, names[i]));
        if (v)
            cJSON_AddStringToObject(vars, names[i], v);
    }
    cJSON_Delete(j);
    return out;
}

typedef struct render_ctx {
    const char *tmpl;  /* a shipped chat template's text, or NULL for the release encoder */
    cJSON *vars;       /* defaults merged into each request */
} render_ctx;

/* One request object: the rendered prompt as a JSON string. */
static int render_line(void *ctx, const char *line, size_t n, long lineno)
{
    const render_ctx *c = ctx;
    cJSON *req = cJSON_ParseWithLength(line, n);
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        fprintf(stderr, "dsv4 render: line %ld is not a JSON object\n", lineno);
        return 1;
    }
    dsv4_err err = {0};
    char *out;
    size_t len;
    const cJSON *v;
    cJSON_ArrayForEach(v, c->vars) if (!cJSON_GetObjectItemCaseSensitive(req, v->string))
        cJSON_AddItemToObject(req, v->string, cJSON_Duplicate(v, 1));
    int r = c->tmpl ? dsv4_jinja_render(c->tmpl, req, &out, &len, &err) : dsv4_chat_render(req, &out, &len, &err);
    cJSON_Delete(req);
    if (r) {
        fprintf(stderr, "dsv4 render: line %ld: %s\n", lineno, err.msg);
        return 1;
    }
    cli_json_string_write(stdout, out, len);
    putchar('\n');
    free(out);
    return 0;
}

int dsv4_cmd_render(int argc, char **argv)
{
    const char *jinja = NULL;
    if (argc > 2 && !strcmp(argv[1], "--jinja")) {
        jinja = argv[2];
        argc -= 2;
        argv += 2;
    }
    if (argc > 1 && cli_is_help(argv[1])) {
        printf("usage: dsv4 render\n"
               "  Reads one chat request per line on stdin and writes the DeepSeek-V4.1 prompt of each as one\n"
               "  JSON string per line. A request: {\"messages\": [...], \"thinking_mode\": \"chat\"|\"thinking\",\n"
               "  \"reasoning_effort\": null|\"low\"|\"high\"|\"xhigh\"|\"max\"|1..100, \"drop_thinking\": bool,\n"
               "  \"add_generation_prompt\": bool, \"continue_final_message\": bool}. Messages are OpenAI shaped;\n"
               "  tools go on the system message (or top-level \"tools\", attached to a first system message),\n"
               "  tool results are role \"tool\". Defaults: thinking, effort high, drop_thinking and the\n"
               "  generation prompt on. \"family\": \"deepseek_v4\" renders the older V4 (0731) format.\n"
               "usage: dsv4 render --jinja FILE|DIR\n"
               "  Renders a Jinja chat template instead (a file, or DIR/tokenizer_config.json's chat_template,\n"
               "  whose bos_token and eos_token are then defined too): each line is the template's variables.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: dsv4 render [--jinja FILE|DIR] < requests.jsonl  (see dsv4 render -h)\n");
        return 2;
    }
    cJSON *vars = cJSON_CreateObject();
    char *tmpl = jinja ? load_template(jinja, vars) : NULL;
    if (jinja && !tmpl) {
        fprintf(stderr, "dsv4 render: no chat template in %s\n", jinja);
        cJSON_Delete(vars);
        return 1;
    }
    render_ctx c = {tmpl, vars};
    int rc = cli_lines(render_line, &c);
    free(tmpl);
    cJSON_Delete(vars);
    return rc;
}
