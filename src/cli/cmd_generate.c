/* dsv4 generate: continuation of an id prompt, greedy or sampled, plain or drafted; prints the
 * new ids, and the speed. Drafted runs print exactly the ids of the same run without a draft;
 * --draft-trace writes each round's anchor, proposal and (DSpark) confidences as JSON lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "core/core.h"
#include "serve/draft.h"
#include "serve/sampler.h"

static void generate_usage(FILE *f)
{
    fprintf(f, "usage: dsv4 generate [-m DIR] --ids 0,5,7,... [-n N] [--ignore-eos] [sampling] [--draft lookup|dspark|mtp]\n"
               "Prints the generated ids, comma-separated, on one line; the speed goes to stderr.\n"
               "  --ids LIST         prompt token ids\n"
               "  -n N               tokens to generate (default 16)\n"
               "  --ignore-eos       keep going past the end-of-sequence token\n"
               "  --temperature T    0 (default) is greedy: the top logit, ties to the lower id\n"
               "  --top-k K --top-p P --min-p P --seed S   as the server's sampler (docs/serve.md)\n"
               "  --draft lookup     propose tokens by prompt lookup and verify them in one forward;\n"
               "                     the ids are the same as without it, acceptance goes to stderr\n"
               "  --draft dspark     propose the V4.1 checkpoint's DSpark block (its mtp.* stages)\n"
               "  --draft mtp        propose by chaining the V4 checkpoint's MTP stage (mtp.0)\n"
               "  --draft-max K      tokens a proposal may hold (1..%d, default 5; DSpark: at most its block)\n"
               "  --ngram MIN,MAX    lookup n-gram lengths (default 1,3)\n"
               "  --draft-trace FILE one JSON line per drafted round: position, anchor, proposal,\n"
               "                     confidences (DSpark) and how many were kept\n%s",
            DSV4_DRAFT_MAX, cli_model_usage());
}

static int parse_double(const char *v, double *out)
{
    char *end;
    *out = strtod(v, &end);
    return *v && !*end;
}

int dsv4_cmd_generate(int argc, char **argv)
{
    cli_model_opts o = {0};
    const char *ids_s = NULL;
    int N = 16, stop_eos = 1, draft = 0, dmax = 5, min_n = 1, max_n = 3;
    const char *trace_path = NULL;
    enum { LOOKUP = 1, DSPARK = 2, MTP = 3 };
    static const char *names[] = {"", "lookup", "dspark", "mtp"};
    dsv4_sample_params sp;
    dsv4_sample_params_default(&sp);
    sp.temperature = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (cli_is_help(a)) {
            generate_usage(stdout);
            return 0;
        }
        if (cli_model_opt(argc, argv, &i, &o))
            continue;
        if (!strcmp(a, "--ignore-eos")) {
            stop_eos = 0;
            continue;
        }
        if (!v)
            goto bad;
        i++;
        if (!strcmp(a, "--ids"))
            ids_s = v;
        else if (!strcmp(a, "-n") && (N = (int)strtol(v, &end, 10), !*end) && N >= 0)
            ;
        else if (!strcmp(a, "--temperature") && parse_double(v, &sp.temperature) && sp.temperature >= 0)
            ;
        else if (!strcmp(a, "--top-p") && parse_double(v, &sp.top_p) && sp.top_p > 0 && sp.top_p <= 1)
            ;
        else if (!strcmp(a, "--min-p") && parse_double(v, &sp.min_p) && sp.min_p >= 0 && sp.min_p <= 1)
            ;
        else if (!strcmp(a, "--top-k") && (sp.top_k = (int)strtol(v, &end, 10), !*end) && sp.top_k >= 0)
            ;
        else if (!strcmp(a, "--seed") && (sp.seed = strtoull(v, &end, 10), !*end))
            ;
        else if (!strcmp(a, "--draft") && !strcmp(v, "lookup"))
            draft = LOOKUP;
        else if (!strcmp(a, "--draft") && !strcmp(v, "dspark"))
            draft = DSPARK;
        else if (!strcmp(a, "--draft") && !strcmp(v, "mtp"))
            draft = MTP;
        else if (!strcmp(a, "--draft-trace"))
            trace_path = v;
        else if (!strcmp(a, "--draft-max") && (dmax = (int)strtol(v, &end, 10), !*end) && dmax >= 1 &&
                 dmax <= DSV4_DRAFT_MAX)
            ;
        else if (!strcmp(a, "--ngram") && sscanf(v, "%d,%d", &min_n, &max_n) == 2 && min_n >= 1 && max_n >= min_n &&
                 max_n <= 64)
            ;
        else
            goto bad;
    }
    int *ids = NULL, T = 0;
    if (!ids_s || cli_parse_ids(ids_s, &ids, &T) || T == 0) {
        fprintf(stderr, "dsv4 generate: --ids (a non-empty comma-separated list) is required\n");
        free(ids);
        return 2;
    }
    o.load.draft_stages = draft == DSPARK || draft == MTP;
    dsv4_model *m = cli_load(&o, "generate");
    if (!m) {
        free(ids);
        return 1;
    }
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int V = info.vocab_size, B = dsv4_spec_block(m);
    dsv4_err err = {0};
    if (draft == DSPARK && !B) {
        int32_t x[1];
        dsv4_spec_draft(m, NULL, 0, x, NULL, NULL, &err); /* says why: no stages, or not on this backend */
        fprintf(stderr, "dsv4 generate: --draft dspark: %s\n", err.msg);
        free(ids);
        dsv4_model_free(m);
        return 1;
    }
    if (draft == MTP && !dsv4_mtp_on(m)) {
        int32_t x[1];
        dsv4_mtp_draft(m, NULL, 0, 1, x, &err); /* says why */
        fprintf(stderr, "dsv4 generate: --draft mtp: %s\n", err.msg);
        free(ids);
        dsv4_model_free(m);
        return 1;
    }
    FILE *trace = trace_path ? fopen(trace_path, "w") : NULL;
    if (trace_path && !trace) {
        fprintf(stderr, "dsv4 generate: cannot write %s\n", trace_path);
        free(ids);
        dsv4_model_free(m);
        return 1;
    }
    dsv4_seq *s = dsv4_seq_new(m, &err);
    dsv4_sampler smp;
    memset(&smp, 0, sizeof smp);
    int32_t *ctx = malloc(((size_t)T + N + 1) * sizeof *ctx);
    float *lg = malloc((size_t)(DSV4_DRAFT_MAX + 1) * V * sizeof(float));
    for (int i = 0; ctx && i < T; i++)
        ctx[i] = ids[i];
    int rc = !s || !ctx || !lg || dsv4_sampler_init(&smp, V, ctx, T, &err);
    if (rc) {
        fprintf(stderr, "dsv4 generate: %s\n", s && ctx && lg ? err.msg : "out of memory");
        goto done;
    }
    int64_t n_ctx = T, made = 0;
    dsv4_draft_stats st = {0};
    double t0 = dsv4_now(), t_prefill = 0;
    int32_t stop = stop_eos ? info.eos_id : -1;
    if (N > 0) {
        /* the prompt but its last token, which the first step feeds as a plain step does */
        if (T > 1) {
            int n = T - 1;
            const int32_t *p = ctx;
            dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .all_logits = 0, .logits = lg};
            rc = dsv4_forward(m, &b, &err);
        }
        while (!rc && made < N) {
            int32_t prop[DSV4_DRAFT_MAX + DSV4_MAX_SPEC_BLOCK + 1];
            float conf[DSV4_MAX_SPEC_BLOCK];
            int nd = 0, counted = made > 0 || draft == DSPARK || draft == MTP;
            if (draft == LOOKUP && made > 0)
                nd = dsv4_lookup_draft(ctx, n_ctx, min_n, max_n, dmax, prop);
            else if (draft == DSPARK) { /* the block after the last token, which this step feeds */
                int32_t blk[DSV4_MAX_SPEC_BLOCK + 1];
                if ((rc = dsv4_spec_draft(m, s, ctx[n_ctx - 1], blk, NULL, conf, &err)))
                    break;
                nd = B < dmax ? B : dmax;
                memcpy(prop, blk + 1, (size_t)nd * sizeof *prop);
            } else if (draft == MTP) {
                nd = dsv4_mtp_draft(m, s, ctx[n_ctx - 1], dmax < N - made - 1 ? dmax : (int)(N - made - 1), prop, &err);
                if (nd < 0) {
                    rc = -nd;
                    break;
                }
            }
            dsv4_sample_out out[DSV4_DRAFT_MAX + 1];
            int got = 0;
            int64_t at = dsv4_seq_len(s);
            rc = dsv4_draft_step(m, s, &smp, &sp, ctx[n_ctx - 1], prop, nd, stop, (int)(N - made), lg, out, &got,
                                 counted ? &st : NULL, &err);
            if (!rc && trace && nd > 0) {
                int kept = 0;
                while (kept < nd && kept < got && out[kept].id == prop[kept])
                    kept++;
                fprintf(trace, "{\"pos\":%lld,\"anchor\":%d,\"draft\":[", (long long)at, ctx[n_ctx - 1]);
                for (int k = 0; k < nd; k++)
                    fprintf(trace, k ? ",%d" : "%d", prop[k]);
                fprintf(trace, "]");
                if (draft == DSPARK) {
                    fprintf(trace, ",\"confidence\":[");
                    for (int k = 0; k < nd; k++)
                        fprintf(trace, k ? ",%.9g" : "%.9g", conf[k]);
                    fprintf(trace, "]");
                }
                fprintf(trace, ",\"kept\":%d}\n", kept);
            }
            if (made == 0)
                t_prefill = dsv4_now() - t0;
            for (int k = 0; k < got; k++) {
                printf(made ? ",%d" : "%d", out[k].id);
                ctx[n_ctx++] = out[k].id;
                made++;
            }
            fflush(stdout);
            if (got && out[got - 1].id == stop)
                break;
        }
        if (rc)
            fprintf(stderr, "dsv4 generate: %s\n", err.msg);
    }
    printf("\n");
    fflush(stdout);
    double t = dsv4_now() - t0;
    if (!rc) {
        fprintf(stderr, "prompt %d tokens in %.3fs (%.1f tok/s); %lld generated, %.1f tok/s decode\n", T, t_prefill,
                T / (t_prefill > 0 ? t_prefill : 1e-9), (long long)made,
                made > 1 ? (made - 1) / (t - t_prefill) : 0.0);
        if (draft) {
            fprintf(stderr, "draft %s: %ld steps, %ld proposed, %ld kept (%.2f tokens a step); kept at position",
                    names[draft], st.steps, st.proposed, st.kept,
                    st.steps ? (double)(made - (draft == LOOKUP ? 1 : 0)) / st.steps : 0.0);
            for (int i = 0; i < (draft == DSPARK && B < dmax ? B : dmax); i++)
                fprintf(stderr, " %ld", st.at[i]);
            fprintf(stderr, "\n");
        }
    }
done:
    if (trace)
        fclose(trace);
    dsv4_sampler_free(&smp);
    free(ids);
    free(ctx);
    free(lg);
    dsv4_seq_free(s);
    dsv4_model_free(m);
    return rc ? 1 : 0;
bad:
    generate_usage(stderr);
    return 2;
}
