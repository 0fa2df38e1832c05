/* dsv4 serve: the OpenAI-compatible HTTP server (src/serve/http.c) from the command line. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "serve/draft.h"
#include "serve/lanes.h"
#include "serve/http.h"

static void serve_usage(FILE *f)
{
    fprintf(f, "usage: dsv4 serve [-m DIR] [--tokenizer DIR] [--host 127.0.0.1] [--port 8080] [--lanes N]\n"
               "                  [--api-key-file FILE | --api-key K] [--name NAME] [--cache-mb MB] [--queue N]\n"
               "                  [--max-connections N] [--client-connections N] [--idle-timeout S]\n"
               "                  [--max-score-tokens N] [--draft K] [--drafter lookup|dspark|mtp]\n"
               "                  [--draft-busy-max N] [--draft-row-cost C] [--max-tokens N] [--cors ORIGINS|none]\n"
               "                  [--kv-budget-mb MB] [model options]\n"
               "  Serves DIR over an OpenAI-compatible API: /v1/completions, /v1/chat/completions, /v1/responses,\n"
               "  /v1/models, /tokenize, /detokenize, /health, /metrics. --port 0 takes any free port (the log names it).\n"
               "  The tokenizer is read from DIR unless --tokenizer names another folder or tokenizer.json.\n"
               "  The API key: --api-key-file (its first line), else --api-key (which other users can read\n"
               "  in the process list), else $DSV4_API_KEY; none: no authentication.\n"
               "  Connections: at most --max-connections (%d) open, --client-connections (%d) from one\n"
               "  address (past either, the idlest idle one is closed); idle ones close after\n"
               "  --idle-timeout (%d) seconds. --max-score-tokens (%d): given tokens one request may score.\n"
               "  --draft K: requests that give no \"draft\" propose K tokens a step (0..%d, default 0), by\n"
               "  --drafter: prompt lookup (default), the V4.1 checkpoint's DSpark stages (at most their\n"
               "  block) or the V4 checkpoint's MTP stage; drafts never change a token, only the speed\n"
               "  (docs/draft.md). The policy picks each request's depth from its measured acceptance\n"
               "  (--draft-row-cost C: a verify row's cost as a fraction of a step, default %.2f) and turns\n"
               "  drafting off past --draft-busy-max N busy lanes (default 4; 0: no bound) and while\n"
               "  routed experts are read from host memory.\n"
               "  --max-tokens N: a chat's max_tokens when the request gives none (default %d, at most the\n"
               "  rest of the context). --cors: the browser origins that may call the API: any (the\n"
               "  default, as llama.cpp and vLLM), none, or a comma-separated list (https://app.example).\n"
               "  KV caches: production formats unless --kv exact (docs/kv.md); --kv-budget-mb (default half\n"
               "  of physical memory; on a GPU the device memory the weights left, and at most that) bounds\n"
               "  what the lanes' caches hold: the context each lane is admitted is what fits (logged at\n"
               "  start); a longer request is refused with 400 context_length_exceeded.\n"
               "  SIGTERM or SIGINT cancels what is in flight and exits.\n%s",
            DSV4_DEFAULT_MAX_CONNECTIONS, DSV4_DEFAULT_CLIENT_CONNECTIONS, DSV4_DEFAULT_IDLE_TIMEOUT,
            DSV4_DEFAULT_MAX_SCORE_TOKENS, DSV4_DRAFT_MAX, DSV4_POLICY_ROW_COST, DSV4_DEFAULT_CHAT_MAX_TOKENS,
            cli_model_usage());
}

/* The first line of path (without its line end), malloc'd; NULL with a message when unreadable
 * or empty. */
static char *read_key_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "dsv4 serve: cannot read --api-key-file %s\n", path);
        return NULL;
    }
    char buf[4096];
    char *line = fgets(buf, sizeof buf, f);
    fclose(f);
    size_t n = line ? strcspn(buf, "\r\n") : 0;
    if (!n) {
        fprintf(stderr, "dsv4 serve: --api-key-file %s: the first line is empty\n", path);
        return NULL;
    }
    return strndup(buf, n);
}

int dsv4_cmd_serve(int argc, char **argv)
{
    dsv4_server_opts o = {.port = 8080, .draft_busy_max = 4};
    cli_model_opts mo = {0};
    const char *key_file = NULL, *key_arg = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) {
            serve_usage(stdout);
            return 0;
        }
        if (cli_model_opt(argc, argv, &i, &mo))
            continue;
        if (!v)
            goto bad;
        i++;
        char *end = NULL;
        if (!strcmp(a, "--tokenizer"))
            o.tokenizer = v;
        else if (!strcmp(a, "--host"))
            o.host = v;
        else if (!strcmp(a, "--api-key"))
            key_arg = v;
        else if (!strcmp(a, "--api-key-file"))
            key_file = v;
        else if (!strcmp(a, "--name"))
            o.model_name = v;
        else if (!strcmp(a, "--port") && (o.port = (int)strtol(v, &end, 10), !*end) && o.port >= 0 && o.port < 65536)
            ;
        else if (!strcmp(a, "--lanes") && (o.n_lanes = (int)strtol(v, &end, 10), !*end) && o.n_lanes > 0 && o.n_lanes <= 256)
            ;
        else if (!strcmp(a, "--queue") && (o.queue_max = (int)strtol(v, &end, 10), !*end) && o.queue_max > 0)
            ;
        else if (!strcmp(a, "--max-connections") && (o.max_connections = (int)strtol(v, &end, 10), !*end) &&
                 o.max_connections > 0 && o.max_connections <= 1 << 20)
            ;
        else if (!strcmp(a, "--client-connections") && (o.client_connections = (int)strtol(v, &end, 10), !*end) &&
                 o.client_connections > 0)
            ;
        else if (!strcmp(a, "--idle-timeout") && (o.idle_timeout_s = (int)strtol(v, &end, 10), !*end) && o.idle_timeout_s > 0 &&
                 o.idle_timeout_s <= 86400)
            ;
        else if (!strcmp(a, "--draft") && (o.draft = (int)strtol(v, &end, 10), !*end) && o.draft >= 0 &&
                 o.draft <= DSV4_DRAFT_MAX)
            ;
        else if (!strcmp(a, "--draft-busy-max") && (o.draft_busy_max = (int)strtol(v, &end, 10), !*end) &&
                 o.draft_busy_max >= 0)
            ;
        else if (!strcmp(a, "--draft-row-cost") && (o.draft_row_cost = strtod(v, &end), !*end) && o.draft_row_cost > 0 &&
                 o.draft_row_cost <= 1)
            ;
        else if (!strcmp(a, "--drafter") && (!strcmp(v, "lookup") || !strcmp(v, "dspark") || !strcmp(v, "mtp")))
            o.drafter = !strcmp(v, "dspark") ? DSV4_DRAFTER_DSPARK : !strcmp(v, "mtp") ? DSV4_DRAFTER_MTP : DSV4_DRAFTER_LOOKUP;
        else if (!strcmp(a, "--max-score-tokens") && (o.max_score_tokens = (int)strtol(v, &end, 10), !*end) &&
                 o.max_score_tokens > 0)
            ;
        else if (!strcmp(a, "--max-tokens") && (o.max_tokens = (int)strtol(v, &end, 10), !*end) && o.max_tokens > 0)
            ;
        else if (!strcmp(a, "--cors"))
            o.cors = v;
        else if (!strcmp(a, "--kv-budget-mb")) {
            long mb = strtol(v, &end, 10);
            if (*end || mb <= 0)
                goto bad;
            o.kv_budget = (size_t)mb << 20;
        } else if (!strcmp(a, "--cache-mb")) {
            long mb = strtol(v, &end, 10);
            if (*end || mb <= 0)
                goto bad;
            o.cache_bytes = (size_t)mb << 20;
        } else
            goto bad;
    }
    if (cli_model_default(&mo, "serve"))
        return 2;
    if (mo.gpus > 1) {
        fprintf(stderr, "dsv4 serve: --gpus above 1 is not built: serving from several GPUs needs rank 0 to hand "
                        "each step to the others (docs/multigpu.md); --gpus 1 runs the one-GPU path through NCCL\n");
        return 2;
    }
    if (cli_ranks_start(&mo, "serve"))
        return 1;
    o.model_dir = mo.dir;
    if (!mo.load.kv) /* serving keeps production caches unless told otherwise */
        mo.load.kv = DSV4_KV_AUTO;
    o.load = mo.load;
    o.load.draft_stages = o.drafter != DSV4_DRAFTER_LOOKUP;
    char *file_key = NULL;
    const char *env_key = getenv("DSV4_API_KEY");
    if (key_file) {
        if (!(file_key = read_key_file(key_file)))
            return 1;
        o.api_key = file_key;
    } else {
        o.api_key = key_arg ? key_arg : env_key;
    }
    if (o.api_key && !*o.api_key) {
        fprintf(stderr, "dsv4 serve: the API key is empty (%s); an empty Bearer token would be valid\n",
                key_arg ? "--api-key" : "DSV4_API_KEY");
        return 2;
    }
    /* the server waits for these with sigwait: block them before any thread starts */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    dsv4_err err = {0};
    int rc = dsv4_serve(&o, &err);
    free(file_key);
    if (rc) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        return 1;
    }
    return 0;
bad:
    serve_usage(stderr);
    return 2;
}
