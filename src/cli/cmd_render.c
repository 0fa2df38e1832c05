/* dsv4 render: chat requests to prompt text, one per line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "cli/cli.h"
#include "text/chat.h"

int cmd_render(int argc, char **argv)
{
    if (argc > 1 && cli_is_help(argv[1])) {
        printf("usage: dsv4 render\n"
               "  Reads one chat request per line on stdin and writes the DeepSeek-V4.1 prompt of each as one\n"
               "  JSON string per line. A request: {\"messages\": [...], \"thinking_mode\": \"chat\"|\"thinking\",\n"
               "  \"reasoning_effort\": null|\"low\"|\"high\"|\"xhigh\"|\"max\"|1..100, \"drop_thinking\": bool,\n"
               "  \"add_generation_prompt\": bool, \"continue_final_message\": bool}. Messages are OpenAI shaped;\n"
               "  tools go on the system message (or top-level \"tools\", attached to a first system message),\n"
               "  tool results are role \"tool\". Defaults: thinking, effort high, drop_thinking and the\n"
               "  generation prompt on. \"family\": \"deepseek_v4\" renders the older V4 (0731) format.\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: dsv4 render < requests.jsonl  (see dsv4 render -h)\n");
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int rc = 0;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)n)
            continue;
        cJSON *req = cJSON_ParseWithLength(line, (size_t)n);
        if (!cJSON_IsObject(req)) {
            cJSON_Delete(req);
            fprintf(stderr, "dsv4 render: line %ld is not a JSON object\n", lineno);
            rc = 1;
            break;
        }
        dsv4_err err = {0};
        char *out;
        size_t len;
        int r = dsv4_chat_render(req, &out, &len, &err);
        cJSON_Delete(req);
        if (r) {
            fprintf(stderr, "dsv4 render: line %ld: %s\n", lineno, err.msg);
            rc = 1;
            break;
        }
        cli_json_string_write(stdout, out, len);
        putchar('\n');
        free(out);
    }
    free(line);
    return rc;
}
