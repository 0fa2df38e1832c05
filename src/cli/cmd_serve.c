/* dsv4 serve: the OpenAI-compatible HTTP server (src/serve/http.c) from the command line. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "serve/http.h"

static void serve_usage(FILE *f)
{
    fprintf(f, "usage: dsv4 serve [-m DIR] [--tokenizer DIR] [--host 127.0.0.1] [--port 8080] [--lanes N] [--api-key K]\n"
               "                  [--name NAME] [--cache-mb MB] [--queue N] [model options]\n"
               "  Serves DIR over an OpenAI-compatible API: /v1/completions, /v1/chat/completions, /v1/models,\n"
               "  /tokenize, /detokenize, /health, /metrics. --port 0 takes any free port (the log names it).\n"
               "  The tokenizer is read from DIR unless --tokenizer names another folder or tokenizer.json.\n"
               "  SIGTERM or SIGINT cancels what is in flight and exits.\n%s", cli_model_usage());
}

int dsv4_cmd_serve(int argc, char **argv)
{
    dsv4_server_opts o = {.port = 8080};
    cli_model_opts mo = {0};
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
            o.api_key = v;
        else if (!strcmp(a, "--name"))
            o.model_name = v;
        else if (!strcmp(a, "--port") && (o.port = (int)strtol(v, &end, 10), !*end) && o.port >= 0 && o.port < 65536)
            ;
        else if (!strcmp(a, "--lanes") && (o.n_lanes = (int)strtol(v, &end, 10), !*end) && o.n_lanes > 0 && o.n_lanes <= 256)
            ;
        else if (!strcmp(a, "--queue") && (o.queue_max = (int)strtol(v, &end, 10), !*end) && o.queue_max > 0)
            ;
        else if (!strcmp(a, "--cache-mb")) {
            long mb = strtol(v, &end, 10);
            if (*end || mb <= 0)
                goto bad;
            o.cache_bytes = (size_t)mb << 20;
        } else
            goto bad;
    }
    if (cli_model_default(&mo, "serve"))
        return 2;
    o.model_dir = mo.dir;
    o.load = mo.load;
    /* the server waits for these with sigwait: block them before any thread starts */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    dsv4_err err = {0};
    if (dsv4_serve(&o, &err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        return 1;
    }
    return 0;
bad:
    serve_usage(stderr);
    return 2;
}
