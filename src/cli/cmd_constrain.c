/* dsv4 constrain: constrained decoding without the server. Compiles a grammar (any JSON
 * object, a JSON Schema, or a forced DSML tool call), then matches a text against it
 * (--check), or generates a reply under it with a model, or times the token mask against the
 * model's decode step (--bench). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "cli/cli.h"
#include "core/core.h"
#include "serve/sampler.h"
#include "text/grammar.h"
#include "text/tokenizer.h"
#include "text/tokmask.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsv4 constrain (--json-object | --json-schema FILE | --tools FILE [--tool NAME]) [options]\n"
            "  --json-object      any JSON object (response_format json_object)\n"
            "  --json-schema FILE a JSON Schema (response_format json_schema; its \"schema\" member if FILE wraps\n"
            "                     one, as a json_schema object or a tests/fixtures/schemas case does)\n"
            "  --tools FILE       an OpenAI tools array: a forced DSML tool call (tool_choice \"required\"),\n"
            "                     or of the one named by --tool NAME\n"
            "  --thinking         the reply starts with free reasoning closed by </think>\n"
            "  --v4               the V4 (0731) DSML tags\n"
            "  --max-ws N         whitespace bytes between JSON tokens (default 8)\n"
            "Modes:\n"
            "  --check FILE       print \"match\" or \"no match\" for FILE's text (exit 0 / 1); no model\n"
            "  (default)          generate: prints the reply text\n"
            "  --bench            mask cost per token (cold and cached) against the decode step, over a\n"
            "                     generated reply\n"
            "Generation options:\n"
            "  --tokenizer PATH   tokenizer.json or its folder (default: the model folder)\n"
            "  --prompt TEXT      prompt text, tokenized as is (no chat template); default: the BOS id\n"
            "  -n N               tokens at most (default 64)\n"
            "  --temperature T    0: greedy (default 1)\n"
            "  --seed S           draw key (default 0)\n%s",
            cli_model_usage());
}

typedef struct copts {
    const char *schema, *tools, *tool, *check, *tokenizer, *prompt;
    int json_object, bench, n;
    double temperature;
    unsigned long long seed;
    dsv4_grammar_opts g;
} copts;

static dsv4_grammar *compile(const copts *o, dsv4_err *err)
{
    if (o->json_object)
        return dsv4_grammar_json_object(&o->g, err);
    const char *path = o->schema ? o->schema : o->tools;
    char *text = dsv4_read_file(path, NULL, err);
    if (!text)
        return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j)
        return dsv4_fail(err, DSV4_E_FORMAT, "%s is not JSON", path), NULL;
    dsv4_grammar *g;
    if (o->schema) {
        const cJSON *s = j;
        const cJSON *inner = cJSON_GetObjectItemCaseSensitive(j, "schema");
        if (cJSON_IsObject(inner)) /* "schema" is no JSON Schema keyword: a wrapper around one */
            s = inner;
        g = dsv4_grammar_json_schema(s, &o->g, err);
    } else
        g = dsv4_grammar_tool_call(j, o->tool, &o->g, err);
    cJSON_Delete(j);
    return g;
}

static int check(const copts *o, dsv4_grammar *g)
{
    dsv4_err err = {0};
    size_t n = 0;
    char *text = dsv4_read_file(o->check, &n, &err);
    if (!text) {
        fprintf(stderr, "dsv4 constrain: %s\n", err.msg);
        return 2;
    }
    int ok = dsv4_grammar_matches(g, text, n);
    printf(ok ? "match\n" : "no match\n");
    free(text);
    return ok ? 0 : 1;
}

/* One generation: forward, mask, sample, advance. Fills ids; returns the count or -1. */
static int generate(dsv4_model *m, dsv4_constraint *c, const int32_t *prompt, int n_prompt, const copts *o, int eos,
                    int32_t *ids, dsv4_err *err)
{
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    dsv4_seq *s = dsv4_seq_new(m, err);
    float *lg = malloc((size_t)info.vocab_size * sizeof *lg);
    dsv4_sampler smp;
    int made = -1;
    if (!s || !lg || dsv4_sampler_init(&smp, info.vocab_size, prompt, n_prompt, err)) {
        if (!err->code)
            dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        goto out;
    }
    dsv4_sample_params sp;
    dsv4_sample_params_default(&sp);
    sp.temperature = o->temperature;
    sp.seed = o->seed;
    const int32_t *feed = prompt;
    int n_feed = n_prompt;
    made = 0;
    while (made < o->n) {
        dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &feed, .n_ids = &n_feed, .logits = lg};
        if (dsv4_forward(m, &b, err)) {
            made = -1;
            break;
        }
        sp.allow = dsv4_constraint_next_mask(c, err);
        dsv4_sample_out so;
        if (!sp.allow || dsv4_sample(&smp, &sp, lg, dsv4_seq_len(s), &so, err) ||
            dsv4_constraint_accept(c, so.id, err)) {
            made = -1;
            break;
        }
        dsv4_sampler_accept(&smp, so.id);
        ids[made++] = so.id;
        if (so.id == eos)
            break;
        feed = &ids[made - 1];
        n_feed = 1;
    }
    dsv4_sampler_free(&smp);
out:
    free(lg);
    dsv4_seq_free(s);
    return made;
}

/* Times the masks along ids by a fresh constraint (cache: masks kept; 0: every mask walked):
 * the total and the slowest mask, in seconds, and how many came from the cache. */
static int time_masks(const copts *o, const dsv4_vocab_trie *v, const int32_t *eos, const int32_t *ids, int n, int cache,
                      double *secs, double *worst, uint64_t *hits, dsv4_err *err)
{
    dsv4_grammar *g = compile(o, err);
    dsv4_constraint *c = g ? dsv4_constraint_new(g, v, eos, 1, cache, err) : NULL;
    if (!c)
        return -1;
    double t = 0, w = 0;
    for (int i = 0; i < n; i++) {
        double t0 = dsv4_now();
        const uint64_t *mask = dsv4_constraint_next_mask(c, err);
        double dt = dsv4_now() - t0;
        t += dt;
        w = dt > w ? dt : w;
        if (!mask || dsv4_constraint_accept(c, ids[i], err)) {
            dsv4_constraint_free(c);
            return -1;
        }
    }
    dsv4_constraint_stats st;
    dsv4_constraint_get_stats(c, &st);
    *secs = t;
    *worst = w;
    *hits = st.hits;
    dsv4_constraint_free(c);
    return 0;
}

/* The mean seconds of a decode step over the reply: the prompt, then ids fed one at a time. */
static double time_decode(dsv4_model *m, const int32_t *prompt, int n_prompt, const int32_t *ids, int n, dsv4_err *err)
{
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    dsv4_seq *s = dsv4_seq_new(m, err);
    float *lg = malloc((size_t)info.vocab_size * sizeof *lg);
    double t = -1;
    if (s && lg) {
        const int32_t *feed = prompt;
        int n_feed = n_prompt;
        dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &feed, .n_ids = &n_feed, .logits = lg};
        int rc = dsv4_forward(m, &b, err);
        double t0 = dsv4_now();
        for (int i = 0; i + 1 < n && !rc; i++) {
            feed = &ids[i];
            n_feed = 1;
            rc = dsv4_forward(m, &b, err);
        }
        if (!rc && n > 1)
            t = (dsv4_now() - t0) / (n - 1);
    }
    free(lg);
    dsv4_seq_free(s);
    return t;
}

int dsv4_cmd_constrain(int argc, char **argv)
{
    cli_model_opts mo = {0};
    copts o = {.n = 64, .temperature = 1.0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) {
            usage(stdout);
            return 0;
        }
        if (cli_model_opt(argc, argv, &i, &mo))
            continue;
        if (!strcmp(a, "--json-object"))
            o.json_object = 1;
        else if (!strcmp(a, "--thinking"))
            o.g.thinking = 1;
        else if (!strcmp(a, "--v4"))
            o.g.dsml_v4 = 1;
        else if (!strcmp(a, "--bench"))
            o.bench = 1;
        else if (v && !strcmp(a, "--json-schema"))
            o.schema = argv[++i];
        else if (v && !strcmp(a, "--tools"))
            o.tools = argv[++i];
        else if (v && !strcmp(a, "--tool"))
            o.tool = argv[++i];
        else if (v && !strcmp(a, "--check"))
            o.check = argv[++i];
        else if (v && !strcmp(a, "--tokenizer"))
            o.tokenizer = argv[++i];
        else if (v && !strcmp(a, "--prompt"))
            o.prompt = argv[++i];
        else if (v && !strcmp(a, "--max-ws"))
            o.g.max_ws = atoi(argv[++i]);
        else if (v && !strcmp(a, "-n"))
            o.n = atoi(argv[++i]);
        else if (v && !strcmp(a, "--temperature"))
            o.temperature = atof(argv[++i]);
        else if (v && !strcmp(a, "--seed"))
            o.seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "dsv4 constrain: unknown option '%s' (see -h)\n", a);
            return 2;
        }
    }
    if (o.json_object + !!o.schema + !!o.tools != 1) {
        fprintf(stderr, "dsv4 constrain: give exactly one of --json-object, --json-schema, --tools (see -h)\n");
        return 2;
    }
    if (o.n <= 0) {
        fprintf(stderr, "dsv4 constrain: -n must be positive\n");
        return 2;
    }
    dsv4_err err = {0};
    dsv4_grammar *g = compile(&o, &err);
    if (!g) {
        fprintf(stderr, "dsv4 constrain: %s\n", err.msg);
        return 1;
    }
    if (o.check) {
        int rc = check(&o, g);
        dsv4_grammar_free(g);
        return rc;
    }
    if (cli_model_default(&mo, "constrain")) {
        dsv4_grammar_free(g);
        return 1;
    }
    dsv4_model *m = cli_load(&mo, "constrain");
    dsv4_tokenizer *tok = m ? dsv4_tokenizer_load(o.tokenizer ? o.tokenizer : mo.dir, &err) : NULL;
    int rc = 1;
    dsv4_vocab_trie *v = NULL;
    int32_t *ids = NULL;
    dsv4_ids prompt = {0};
    if (!tok) {
        if (m)
            fprintf(stderr, "dsv4 constrain: %s\n", err.msg);
        dsv4_grammar_free(g);
        goto out;
    }
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    double t0 = dsv4_now();
    v = dsv4_vocab_trie_new(tok, info.vocab_size, &err);
    const double t_trie = dsv4_now() - t0;
    dsv4_constraint *c = v ? dsv4_constraint_new(g, v, &info.eos_id, 1, 256, &err) : NULL;
    if (!v)
        dsv4_grammar_free(g);
    if (!c) {
        fprintf(stderr, "dsv4 constrain: %s\n", err.msg);
        goto out;
    }
    if (o.prompt ? dsv4_tokenizer_encode(tok, o.prompt, strlen(o.prompt), &prompt, &err) : 0) {
        fprintf(stderr, "dsv4 constrain: %s\n", err.msg);
        dsv4_constraint_free(c);
        goto out;
    }
    if (!prompt.n) {
        prompt.v = malloc(sizeof *prompt.v);
        if (prompt.v)
            prompt.v[prompt.n++] = info.bos_id;
    }
    ids = malloc((size_t)o.n * sizeof *ids);
    int n = ids && prompt.v ? generate(m, c, prompt.v, (int)prompt.n, &o, info.eos_id, ids, &err) : -1;
    const int complete = n > 0 && dsv4_constraint_complete(c);
    dsv4_constraint_free(c);
    if (n < 0) {
        fprintf(stderr, "dsv4 constrain: %s\n", err.code ? err.msg : "out of memory");
        goto out;
    }
    if (!o.bench) {
        char *text = NULL;
        size_t len = 0;
        if (dsv4_tokenizer_decode(tok, ids, (size_t)n, 1, &text, &len, &err)) {
            fprintf(stderr, "dsv4 constrain: %s\n", err.msg);
            goto out;
        }
        fwrite(text, 1, len, stdout);
        printf("\n");
        free(text);
        if (!complete)
            fprintf(stderr, "dsv4 constrain: the reply was cut at %d tokens before it was complete\n", n);
        rc = complete ? 0 : 3;
        goto out;
    }
    /* bench: the same tokens' masks, cold and cached, against the decode steps over them; each
     * the best of REPEAT runs, as the machine may be shared */
    enum { REPEAT = 3 };
    double cold = 1e30, cached = 1e30, step = 1e30, worst_cold = 0, worst_cached = 0;
    uint64_t hits = 0, hits_cold = 0;
    for (int r = 0; r < REPEAT; r++) {
        double c1, c2, w1, w2, d = time_decode(m, prompt.v, (int)prompt.n, ids, n, &err);
        if (d < 0 || time_masks(&o, v, &info.eos_id, ids, n, 0, &c1, &w1, &hits_cold, &err) ||
            time_masks(&o, v, &info.eos_id, ids, n, 256, &c2, &w2, &hits, &err)) {
            fprintf(stderr, "dsv4 constrain: %s\n", err.code ? err.msg : "the reply is too short to time");
            goto out;
        }
        if (c1 < cold) {
            cold = c1;
            worst_cold = w1;
        }
        if (c2 < cached) {
            cached = c2;
            worst_cached = w2;
        }
        step = d < step ? d : step;
    }
    printf("vocabulary        %d ids, trie of %d nodes built in %.1f ms\n", info.vocab_size, dsv4_vocab_trie_n_nodes(v),
           t_trie * 1e3);
    printf("reply             %d tokens%s\n", n, complete ? "" : " (cut before complete)");
    printf("decode step       %.3f ms (CPU, mean over the reply, best of %d)\n", step * 1e3, REPEAT);
    printf("mask, cold        %.3f ms per token (%.1f%% of a step), slowest %.3f ms\n", cold / n * 1e3, 100 * cold / n / step,
           worst_cold * 1e3);
    printf("mask, cached      %.3f ms per token (%.1f%% of a step), slowest %.3f ms; %llu of %d from the cache\n",
           cached / n * 1e3, 100 * cached / n / step, worst_cached * 1e3, (unsigned long long)hits, n);
    rc = 0;
out:
    free(ids);
    dsv4_ids_free(&prompt);
    dsv4_vocab_trie_free(v);
    dsv4_tokenizer_free(tok);
    dsv4_model_free(m);
    return rc;
}
