/* The server's request parser without the network (dsv4_serve_parse), on a byte-level
 * tokenizer written here: seeds are read exactly over [-2^63, 2^64); a chat's default
 * max_tokens fits an int whatever the context; the body must be UTF-8; scoring is capped;
 * response_format and tool_choice give the request its constraint, or a 400. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "check.h"
#include "serve/http.h"
#include "serve/lanes.h"
#include "text/tokenizer.h"
#include "text/tokmask.h"
#include "bytelevel.h"

static const char *path = "build/tests/tok_bytes.json";

/* 256 byte tokens, no merges, one special end token (id 256) */
static void write_tokenizer(void)
{
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    char s[8];
    for (int x = 0; x < 256; x++) {
        bytelevel_spell(x, s);
        cJSON_AddNumberToObject(vocab, s, x);
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", cJSON_CreateArray());
    cJSON_AddItemToObject(root, "model", model);
    cJSON *added = cJSON_CreateArray(), *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "id", 256);
    cJSON_AddStringToObject(t, "content", "<｜end▁of▁sentence｜>");
    cJSON_AddBoolToObject(t, "special", 1);
    cJSON_AddItemToArray(added, t);
    cJSON_AddItemToObject(root, "added_tokens", added);
    bytelevel_save(root, path);
}

static dsv4_parse_model pm;

/* Parses body as a completion; returns the status, *r the request (released by the caller). */
static int parse(const char *route, const char *body, dsv4_request **r, char *msg)
{
    return dsv4_serve_parse(&pm, route, body, strlen(body), r, msg, 512);
}

/* The seed a completion request with `"seed": lit` gets; -1 status on refusal. */
static int seed_of(const char *lit, uint64_t *seed)
{
    char body[256], msg[512];
    snprintf(body, sizeof body, "{\"prompt\": \"hi\", \"messages\": {\"seed\": 5}, \"seed\": %s, \"temperature\": 1}", lit);
    dsv4_request *r = NULL;
    int st = parse("/v1/completions", body, &r, msg);
    if (st == 200)
        *seed = r->sp.seed;
    dsv4_request_release(r);
    return st;
}

int main(void)
{
    dsv4_err err = {0};
    write_tokenizer();
    pm.tok = dsv4_tokenizer_load(path, &err);
    CHECK(pm.tok != NULL, "load: %s", err.msg);
    if (!pm.tok)
        return check_summary("serve_parse");
    pm.name = "m";
    pm.family = "deepseek_v4";
    pm.vocab = 257;
    pm.eos = 256;
    pm.ctx = 4096;
    pm.max_score_tokens = 100;

    /* seeds: exact over the whole range; negative ones modulo 2^64 */
    struct { const char *lit; uint64_t want; } seeds[] = {
        {"0", 0},
        {"9007199254740993", 9007199254740993ull},    /* 2^53 + 1: a double would say 2^53 */
        {"9223372036854775808", 9223372036854775808ull}, /* 2^63 */
        {"9223372036854775809", 9223372036854775809ull},
        {"18446744073709551615", UINT64_MAX},
        {"-1", UINT64_MAX},
        {"-9223372036854775808", 9223372036854775808ull}, /* -2^63 */
        {"-9223372036854775807", 9223372036854775809ull},
        {"1e3", 1000},
        {"7.0", 7},
    };
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) {
        uint64_t got = 0;
        int st = seed_of(seeds[i].lit, &got);
        CHECK(st == 200 && got == seeds[i].want, "seed %s -> %llu (status %d, got %llu)", seeds[i].lit,
              (unsigned long long)seeds[i].want, st, (unsigned long long)got);
    }
    const char *bad_seeds[] = {"18446744073709551616", "-9223372036854775809", "1.5", "1e300", "\"7\"", "true"};
    for (size_t i = 0; i < sizeof bad_seeds / sizeof *bad_seeds; i++) {
        uint64_t got = 0;
        CHECK(seed_of(bad_seeds[i], &got) == 400, "seed %s refused", bad_seeds[i]);
    }
    /* the first "seed" member counts, as cJSON reads it; a nested one does not */
    {
        dsv4_request *r = NULL;
        char msg[512];
        CHECK(parse("/v1/completions", "{\"prompt\":\"x\",\"stop\":[\"seed\"],\"seed\":18446744073709551614,\"seed\":3}", &r, msg) == 200 &&
              r->sp.seed == UINT64_MAX - 1, "the first top-level seed is read exactly");
        dsv4_request_release(r);
    }

    /* a context of 2^32 tokens: a chat's default max_tokens stays a positive int */
    {
        pm.ctx = (int64_t)1 << 32;
        dsv4_request *r = NULL;
        char msg[512];
        int st = parse("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"word word word\"}]}", &r, msg);
        CHECK(st == 200 && r && r->max_tokens > 0 && (int64_t)r->max_tokens + r->n_prompt <= INT_MAX,
              "chat default max_tokens with a 2^32 context: %d (%s)", r ? r->max_tokens : 0, msg);
        dsv4_request_release(r);
        pm.ctx = 4096;
    }

    /* a chat's default max_tokens: --max-tokens (4096 unless set), bounded by the room left */
    {
        dsv4_request *r = NULL;
        char msg[512];
        const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
        pm.ctx = 100000;
        CHECK(parse("/v1/chat/completions", body, &r, msg) == 200 && r->max_tokens == DSV4_DEFAULT_CHAT_MAX_TOKENS,
              "chat default max_tokens %d", r ? r->max_tokens : -1);
        dsv4_request_release(r);
        pm.max_tokens = 50;
        CHECK(parse("/v1/chat/completions", body, &r, msg) == 200 && r->max_tokens == 50, "--max-tokens 50: %d", r ? r->max_tokens : -1);
        int np = r ? r->n_prompt : 0;
        dsv4_request_release(r);
        pm.ctx = np + 20;
        CHECK(parse("/v1/chat/completions", body, &r, msg) == 200 && r->max_tokens == 20, "bounded by the context: %d (%s)",
              r ? r->max_tokens : -1, msg);
        dsv4_request_release(r);
        pm.ctx = 4096;
        pm.max_tokens = 0;
        CHECK(parse("/v1/completions", "{\"prompt\":\"x\"}", &r, msg) == 200 && r->max_tokens == 16, "completions default 16");
        dsv4_request_release(r);
        CHECK(parse("/v1/completions", "{\"prompt\":\"x\",\"best_of\":3}", NULL, msg) == 400 && strstr(msg, "best_of"), "best_of 3: %s", msg);
        CHECK(parse("/v1/completions", "{\"prompt\":\"x\",\"best_of\":1}", NULL, msg) == 200, "best_of 1 accepted");
        CHECK(parse("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}", NULL, msg) == 400 &&
              strstr(msg, "messages[0].content[1]"), "an image part is refused, naming it: %s", msg);
    }

    /* every field is checked before the prompt is rendered or tokenized: a bad field is named
     * even when the messages would not render */
    {
        char msg[512];
        CHECK(parse("/v1/chat/completions", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}],\"temperature\":\"hot\"}", NULL,
                    msg) == 400 && strstr(msg, "temperature"), "fields before rendering: %s", msg);
        CHECK(parse("/v1/chat/completions", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", NULL, msg) == 400 &&
              !strstr(msg, "temperature"), "then the render: %s", msg);
    }

    /* the body is UTF-8; error messages quote the request */
    {
        char msg[512];
        CHECK(parse("/v1/completions", "{\"prompt\":\"a\xff\",\"echo\":true}", NULL, msg) == 400 && strstr(msg, "UTF-8"),
              "invalid UTF-8 in the body is refused: %s", msg);
        CHECK(parse("/v1/completions", "{\"prompt\":\"\xc3\xa9t\xc3\xa9\",\"echo\":true}", NULL, msg) == 200, "valid UTF-8 accepted");
        CHECK(parse("/v1/completions", "{\"prompt\":\"x\"} \xff", NULL, msg) == 400, "invalid UTF-8 after the object is refused");
    }

    /* scoring cap: echoed prompt tokens with logprobs, plus forced tokens, over all prompts */
    {
        char body[2048], msg[512];
        char p[301];
        memset(p, 'a', 300);
        p[300] = 0;
        snprintf(body, sizeof body, "{\"prompt\":\"%.99s\",\"echo\":true,\"logprobs\":1,\"max_tokens\":0}", p);
        CHECK(parse("/v1/completions", body, NULL, msg) == 200, "scoring 99 tokens under a cap of 100: %s", msg);
        snprintf(body, sizeof body, "{\"prompt\":\"%.101s\",\"echo\":true,\"logprobs\":1,\"max_tokens\":0}", p);
        CHECK(parse("/v1/completions", body, NULL, msg) == 400 && strstr(msg, "--max-score-tokens"), "scoring 101 tokens refused: %s", msg);
        snprintf(body, sizeof body, "{\"prompt\":[\"%.60s\",\"%.60s\"],\"echo\":true,\"logprobs\":0,\"max_tokens\":0}", p, p);
        CHECK(parse("/v1/completions", body, NULL, msg) == 400, "the cap counts every prompt of a list");
        snprintf(body, sizeof body, "{\"prompt\":\"%.300s\",\"echo\":true,\"max_tokens\":0}", p);
        CHECK(parse("/v1/completions", body, NULL, msg) == 200, "echo without logprobs scores nothing");
    }

    /* response_format and tool_choice: the request's constraint, or a 400 naming the field */
    {
        dsv4_vocab_trie *trie = dsv4_vocab_trie_new(pm.tok, pm.vocab, &err);
        CHECK(trie != NULL, "trie: %s", err.msg);
        pm.trie = trie;
        const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
        const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                            "\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}}}]";
        struct { const char *extra; int status; int constrained; const char *what; } cases[] = {
            {"", 200, 0, "no response_format"},
            {",\"response_format\":null", 200, 0, "response_format null"},
            {",\"response_format\":{\"type\":\"text\"}", 200, 0, "text"},
            {",\"response_format\":{\"type\":\"json_object\"}", 200, 1, "json_object"},
            {",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":true,"
             "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}}}}}", 200, 1, "strict json_schema"},
            {",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
             "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":1}}}}}", 200, 1,
             "non-strict json_schema outside the subset: any object"},
            {",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
             "\"schema\":{\"type\":\"array\",\"items\":{\"pattern\":\"a\"}}}}", 200, 0,
             "non-strict json_schema outside the subset, not an object: unconstrained"},
            {",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":true,"
             "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":1}}}}}", 400, 0,
             "strict json_schema outside the subset"},
            {",\"response_format\":{\"type\":\"bogus\"}", 400, 0, "unknown type"},
            {",\"response_format\":{\"type\":\"json_schema\"}", 400, 0, "json_schema without json_schema"},
            {",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":3}}", 400, 0, "schema not an object"},
            {",\"response_format\":\"json_object\"", 400, 0, "response_format a string"},
        };
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            char body[1024], msg[512];
            snprintf(body, sizeof body, "{%s%s}", msgs, cases[i].extra);
            dsv4_request *r = NULL;
            int st = parse("/v1/chat/completions", body, &r, msg);
            CHECK(st == cases[i].status && (st != 200 || (r && !!r->constraint == cases[i].constrained)),
                  "response_format, %s: %d (%s)", cases[i].what, st, msg);
            CHECK(st == 200 || strstr(msg, "response_format") || strstr(msg, "schema"), "the error names the field: %s", msg);
            dsv4_request_release(r);
        }
        struct { const char *choice; int status; int constrained; } tc[] = {
            {"\"auto\"", 200, 0}, {"\"none\"", 200, 0}, {"\"required\"", 200, 1},
            {"{\"type\":\"function\",\"function\":{\"name\":\"f\"}}", 200, 1},
            {"{\"type\":\"function\",\"function\":{\"name\":\"g\"}}", 400, 0}, {"\"always\"", 400, 0},
        };
        for (size_t i = 0; i < sizeof tc / sizeof *tc; i++) {
            char body[1024], msg[512];
            snprintf(body, sizeof body, "{%s,%s,\"tool_choice\":%s}", msgs, tools, tc[i].choice);
            dsv4_request *r = NULL;
            int st = parse("/v1/chat/completions", body, &r, msg);
            CHECK(st == tc[i].status && (st != 200 || (r && !!r->constraint == tc[i].constrained)), "tool_choice %s: %d (%s)",
                  tc[i].choice, st, msg);
            dsv4_request_release(r);
        }
        /* a forced call wins over response_format; a forced call cannot take forced tokens */
        {
            char body[1024], msg[512];
            dsv4_request *r = NULL;
            snprintf(body, sizeof body, "{%s,%s,\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}}", msgs, tools);
            CHECK(parse("/v1/chat/completions", body, &r, msg) == 200 && r && r->constraint &&
                  !dsv4_grammar_matches(dsv4_constraint_grammar(r->constraint), "{}", 2), "tool_choice required wins over json_object");
            dsv4_request_release(r);
            snprintf(body, sizeof body, "{%s,\"response_format\":{\"type\":\"json_object\"},\"forced_tokens\":[1,2]}", msgs);
            CHECK(parse("/v1/chat/completions", body, NULL, msg) == 400 && strstr(msg, "forced_tokens"), "constraint with forced tokens: %s", msg);
        }
        /* /v1/responses: input items and instructions are the chat's messages, tools and
         * text.format its constraint, max_output_tokens its max_tokens; what needs storage or
         * another input kind is refused, naming the field */
        {
            char msg[512];
            dsv4_request *a = NULL, *c = NULL;
            CHECK(parse("/v1/responses", "{\"input\":\"hi\",\"instructions\":\"Be brief.\",\"max_output_tokens\":5}", &a, msg) == 200 &&
                      parse("/v1/chat/completions", "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                            "{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":5}", &c, msg) == 200 &&
                      a->n_prompt == c->n_prompt && !memcmp(a->prompt, c->prompt, (size_t)a->n_prompt * sizeof *a->prompt) &&
                      a->max_tokens == 5 && !a->constraint,
                  "responses: instructions and input as the chat's messages (%s)", msg);
            dsv4_request_release(a);
            dsv4_request_release(c);
            a = c = NULL;
            char body[2048];
            snprintf(body, sizeof body, "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"w?\"}]},"
                     "{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\",\"call_id\":\"c1\"},"
                     "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"ok\"}],"
                     "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}}],"
                     "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}");
            CHECK(parse("/v1/responses", body, &a, msg) == 200 && a->constraint, "responses: a tool round trip, a named tool forced (%s)", msg);
            dsv4_request_release(a);
            a = NULL;
            CHECK(parse("/v1/responses", "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"strict\":true,"
                        "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}}}}}}", &a, msg) == 200 && a->constraint,
                  "responses: text.format json_schema (%s)", msg);
            dsv4_request_release(a);
            struct { const char *body, *param; } bad[] = {
                {"{}", "input"},
                {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "stores no responses"},
                {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}", "input[0].content[0]"},
                {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "input[0]"},
                {"{\"input\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "input[0]"},
                {"{\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", "input[0]: 'arguments'"},
                {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0]"},
                {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"bogus\"}}}", "text.format"},
                {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens"},
                {"{\"input\":5}", "input"},
            };
            for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
                CHECK(parse("/v1/responses", bad[i].body, NULL, msg) == 400 && strstr(msg, bad[i].param), "responses refuses %s: %s", bad[i].body,
                      msg);
        }
        pm.trie = NULL;
        dsv4_vocab_trie_free(trie);
    }
    dsv4_tokenizer_free(pm.tok);
    return check_summary("serve_parse");
}
