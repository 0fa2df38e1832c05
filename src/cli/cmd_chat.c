/* dsv4 chat: a conversation in the terminal. Each line on stdin is a user turn (or --once
 * gives the single turn); the reply streams to stdout as it is generated. The conversation is kept and re-rendered every turn;
 * the prompt cache resumes each turn from the state the previous one left, so only the new
 * tokens are computed. /reset starts over, /quit (or end of input) leaves. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "cli/cli.h"
#include "core/core.h"
#include "serve/lanes.h"
#include "text/chat.h"
#include "text/dsml.h"
#include "text/tokenizer.h"

static void chat_usage(FILE *f)
{
    fprintf(f, "usage: dsv4 chat [-m DIR] [--tokenizer DIR] [--system TEXT] [--thinking] [--temperature T]\n"
               "                 [--top-p P] [--seed S] [--max-tokens N] [--once TEXT] [model options]\n"
               "  Reads user turns from stdin (one per line) and streams the replies. /reset forgets the\n"
               "  conversation, /quit leaves. Each turn's token counts and speed go to stderr.\n"
               "  --once TEXT: answer TEXT as the only turn, then leave (stdin is not read).\n"
               "  --temperature 0 is greedy decoding (default 0.7).\n"
               "  The tokenizer is read from DIR unless --tokenizer names another.\n%s",
            cli_model_usage());
}

typedef struct chat_opts {
    const char *tokenizer, *system, *once;
    int thinking, max_tokens, have_seed, eos;
    const char *family;        /* the model's: chat format and DSML tags */
    double temperature, top_p;
    uint64_t seed;
} chat_opts;

/* Runs one turn: renders, submits, steps the lanes while printing the reply. Appends the
 * assistant message to msgs. Returns 0, or 1 on an error (printed). */
static int turn(dsv4_lanes *l, dsv4_tokenizer *tok, cJSON *msgs, const chat_opts *o, int interactive)
{
    dsv4_err err = {0};
    cJSON *req = cJSON_CreateObject();
    cJSON_AddItemReferenceToObject(req, "messages", msgs);
    cJSON_AddStringToObject(req, "thinking_mode", o->thinking ? "thinking" : "chat");
    cJSON_AddStringToObject(req, "family", o->family);
    char *text = NULL;
    size_t len = 0;
    int rc = dsv4_chat_render(req, &text, &len, &err);
    cJSON_Delete(req);
    dsv4_ids ids = {0};
    if (!rc)
        rc = dsv4_tokenizer_encode(tok, text, len, &ids, &err);
    free(text);
    dsv4_request *r = rc ? NULL : dsv4_request_new(ids.v, (int)ids.n, &err);
    dsv4_ids_free(&ids);
    if (!r) {
        fprintf(stderr, "dsv4 chat: %s\n", err.msg);
        return 1;
    }
    r->max_tokens = o->max_tokens;
    r->sp.temperature = o->temperature;
    r->sp.top_p = o->top_p;
    r->sp.seed = o->have_seed ? o->seed : (uint64_t)(dsv4_now() * 1e9) * 0x9E3779B97F4A7C15ull;
    r->stop_ids = malloc(sizeof *r->stop_ids);
    if (r->stop_ids)
        r->stop_ids[r->n_stop_ids++] = o->eos;
    if (!r->stop_ids || dsv4_lanes_submit(l, r, &err)) {
        fprintf(stderr, "dsv4 chat: %s\n", r->stop_ids ? err.msg : "out of memory");
        dsv4_request_release(r);
        return 1;
    }
    dsv4_detok dt;
    dsv4_detok_init(&dt, tok, 1);
    dsv4_dsml *p = dsv4_dsml_new_family(o->thinking, !strcmp(o->family, "deepseek_v4"), &err);
    dsv4_dsml_out out, all;
    dsv4_dsml_out_init(&out);
    dsv4_dsml_out_init(&all);
    int n_seen = 0, fin = 0;
    dsv4_sample_out buf[64];
    while (!fin && p) {
        if (dsv4_lanes_step(l, &err) < 0)
            fprintf(stderr, "dsv4 chat: %s\n", err.msg);
        int n = dsv4_request_take(r, n_seen, 64, buf, 0, &fin);
        for (int k = 0; k < n; k++) {
            size_t pl;
            const char *piece = dsv4_detok_push(&dt, buf[k].id, &pl, &err);
            if (piece)
                dsv4_dsml_feed(p, piece, pl, &out, &err);
        }
        n_seen += n;
        if (fin) {
            size_t pl;
            const char *rest = dsv4_detok_flush(&dt, &pl);
            if (rest)
                dsv4_dsml_feed(p, rest, pl, &out, &err);
            dsv4_dsml_finish(p, &out, &err);
        }
        /* reasoning dimmed on a terminal, then the answer */
        if (out.reasoning.n) {
            fputs(interactive ? "\033[2m" : "", stdout);
            fwrite(out.reasoning.p, 1, out.reasoning.n, stdout);
            fputs(interactive ? "\033[0m" : "", stdout);
            dsv4_buf_put(&all.reasoning, out.reasoning.p, out.reasoning.n);
        }
        if (out.content.n) {
            fwrite(out.content.p, 1, out.content.n, stdout);
            dsv4_buf_put(&all.content, out.content.p, out.content.n);
        }
        out.reasoning.n = out.content.n = 0;
        fflush(stdout);
    }
    fputc('\n', stdout);
    fflush(stdout); /* before the speed line on stderr */
    double gen_s = r->t_done - r->t_first;
    fprintf(stderr, "[prompt %d, cached %d, generated %d, %.1f tok/s%s]\n", r->n_prompt, r->n_cached, r->n_out,
            r->n_out > 1 && gen_s > 0 ? (r->n_out - 1) / gen_s : 0.0, fin == DSV4_FINISH_ERROR ? ", error" : "");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", all.content.p ? all.content.p : "");
    if (all.reasoning.n)
        cJSON_AddStringToObject(m, "reasoning_content", all.reasoning.p);
    cJSON_AddItemToArray(msgs, m);
    dsv4_dsml_free(p);
    dsv4_dsml_out_free(&out);
    dsv4_dsml_out_free(&all);
    dsv4_detok_free(&dt);
    int failed = fin == DSV4_FINISH_ERROR;
    dsv4_request_release(r);
    return failed;
}

int dsv4_cmd_chat(int argc, char **argv)
{
    cli_model_opts mo = {0};
    chat_opts o = {.temperature = 0.7, .top_p = 0.95, .max_tokens = 512};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (cli_is_help(a)) {
            chat_usage(stdout);
            return 0;
        }
        if (cli_model_opt(argc, argv, &i, &mo))
            continue;
        if (!strcmp(a, "--thinking")) {
            o.thinking = 1;
            continue;
        }
        if (!v)
            goto bad;
        i++;
        if (!strcmp(a, "--tokenizer"))
            o.tokenizer = v;
        else if (!strcmp(a, "--system"))
            o.system = v;
        else if (!strcmp(a, "--once"))
            o.once = v;
        else if (!strcmp(a, "--temperature") && (o.temperature = strtod(v, &end), !*end) && o.temperature >= 0)
            ;
        else if (!strcmp(a, "--top-p") && (o.top_p = strtod(v, &end), !*end) && o.top_p > 0 && o.top_p <= 1)
            ;
        else if (!strcmp(a, "--max-tokens") && (o.max_tokens = (int)strtol(v, &end, 10), !*end) && o.max_tokens > 0)
            ;
        else if (!strcmp(a, "--seed") && (o.seed = strtoull(v, &end, 10), !*end))
            o.have_seed = 1;
        else
            goto bad;
    }
    if (cli_model_default(&mo, "chat"))
        return 2;
    if (o.once && !*o.once)
        goto bad;
    dsv4_model *m = cli_load(&mo, "chat");
    if (!m)
        return 1;
    dsv4_err err = {0};
    dsv4_tokenizer *tok = dsv4_tokenizer_load(o.tokenizer ? o.tokenizer : mo.dir, &err);
    dsv4_lanes_opts lo = {.n_lanes = 1, .cache_bytes = (size_t)1 << 30, .max_rollback = mo.load.max_rollback};
    /* chat steps the lanes on this thread, where the loader already set the thread count */
    dsv4_lanes *l = tok ? dsv4_lanes_new(m, &lo, &err) : NULL;
    if (!l) {
        fprintf(stderr, "dsv4 chat: %s\n", err.msg);
        dsv4_tokenizer_free(tok);
        dsv4_model_free(m);
        return 1;
    }
    dsv4_model_info mi;
    dsv4_model_get_info(m, &mi);
    o.eos = mi.eos_id;
    o.family = mi.family;
    int interactive = !o.once && isatty(0) && isatty(1);
    cJSON *msgs = cJSON_CreateArray();
    if (o.system) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "role", "system");
        cJSON_AddStringToObject(s, "content", o.system);
        cJSON_AddItemToArray(msgs, s);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    for (int turns = 0; !o.once || turns < 1; turns++) {
        if (o.once) {
            line = strdup(o.once);
            if (!line) {
                rc = 1;
                break;
            }
            n = (ssize_t)strlen(line);
        } else {
            if (interactive) {
                fputs("> ", stdout);
                fflush(stdout);
            }
            if ((n = getline(&line, &cap, stdin)) < 0)
                break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (!n)
            continue;
        if (!strcmp(line, "/quit"))
            break;
        if (!strcmp(line, "/reset")) {
            while (cJSON_GetArraySize(msgs) > (o.system ? 1 : 0))
                cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
            continue;
        }
        cJSON *u = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", line);
        cJSON_AddItemToArray(msgs, u);
        if (turn(l, tok, msgs, &o, interactive)) {
            rc = 1;
            cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
        }
    }
    free(line);
    cJSON_Delete(msgs);
    dsv4_lanes_free(l);
    dsv4_tokenizer_free(tok);
    dsv4_model_free(m);
    return rc;
bad:
    chat_usage(stderr);
    return 2;
}
