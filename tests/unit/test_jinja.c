/* The Jinja subset: expected renderings of small templates, errors that must be reported (not
 * crashes), and a fuzz run over mutated templates. (tests/suite_text.sh compares against
 * @huggingface/jinja on many more cases.) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "text/jinja.h"

static void expect(const char *tmpl, const char *ctx_json, const char *want)
{
    cJSON *ctx = cJSON_Parse(ctx_json);
    dsv4_err err = {0};
    char *out = NULL;
    size_t n;
    int rc = dsv4_jinja_render(tmpl, ctx, &out, &n, &err);
    CHECK(rc == 0 && out && !strcmp(out, want), "%s\n  got: %s\n  want: %s", tmpl, rc ? err.msg : out, want);
    free(out);
    cJSON_Delete(ctx);
}

static void fails(const char *tmpl, const char *what)
{
    cJSON *ctx = cJSON_CreateObject();
    dsv4_err err = {0};
    char *out = NULL;
    size_t n;
    int rc = dsv4_jinja_render(tmpl, ctx, &out, &n, &err);
    CHECK(rc != 0 && strstr(err.msg, what), "%.60s: want an error with \"%s\", got rc %d \"%s\"", tmpl, what, rc, err.msg);
    free(out);
    cJSON_Delete(ctx);
}

static const char conv_tmpl[] =
    "{%- set ns = namespace(first=true) -%}\n"
    "{{ bos_token }}\n"
    "{%- for m in messages %}\n"
    "  {%- if m['role'] == 'user' -%}\n"
    "<U>{{ m['content'] }}\n"
    "  {%- elif m.role == 'assistant' and m.content is not none -%}\n"
    "<A>{{ m.content | trim }}{{ eos_token }}\n"
    "  {%- endif %}\n"
    "{%- endfor -%}\n"
    "{% if add_generation_prompt %}<A>{% endif %}";

int main(void)
{
    expect("a{{ x }}b", "{\"x\": \"X\"}", "aXb");
    expect("  {% if x %}\n  yes\n  {% endif %}\nend", "{\"x\": 1}", "  yes\nend");
    expect("{{- ' a ' -}} | {{ 'b' }}", "{}", " a | b");
    expect("{% for x in xs %}{{ loop.index0 }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", "{\"xs\": [\"a\", \"b\"]}", "0a,1b");
    expect("{% set ns = namespace(s='') %}{% for x in xs %}{% set ns.s = ns.s + x %}{% endfor %}{{ ns.s }}", "{\"xs\": [\"a\", \"b\"]}", "ab");
    expect("{% for x in xs %}{% set y = x %}{% endfor %}[{{ y }}]", "{\"xs\": [1]}", "[]");
    expect("{{ xs[1:] | tojson }}{{ 'abc'[::-1] }}{{ d | tojson }}", "{\"xs\": [1, 2, 3], \"d\": {\"k\": [true, null]}}",
           "[2, 3]cba{\"k\": [true, null]}");
    /* indexes and bounds beyond int saturate (found by fuzz_jinja: the casts were undefined) */
    expect("{{ xs[-1e30:1e30] | join(',') }}|{{ xs[1e54] }}|{{ 'abc'[::-1e40] }}|{{ 7 is odd }}{{ 1e300 is even }}", "{\"xs\": [1, 2, 3]}",
           "1,2,3||c|truetrue");
    expect("{{ 'y' if x is defined else 'n' }}{{ 'y' if z is none else 'n' }}{{ 1 + 2 * 3 }}{{ 'a' ~ 1 }}", "{\"x\": 0, \"z\": null}", "yy7a1");
    expect(conv_tmpl,
           "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"messages\": ["
           "{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \" yo \"}, {\"role\": \"user\", \"content\": \"again\"}]}",
           "<s><U>hi<A>yo</s><U>again<A>");
    fails("{{ x", "missing");
    fails("{% for %}", "bad for");
    fails("{% macro m() %}{% endmacro %}", "not supported");
    fails("{{ messages[]0.content }}", "empty subscript"); /* found by fuzz_jinja: it failed with no message */
    /* budgets: a loop nest that would run 10^10 times, a string doubled 40 times */
    fails("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "64 MiB");
    expect("{{ range(1e17, 1e17 + 64) | length }}{{ range(5, 0, -2) | join(',') }}{{ range(1e97, 0) | length }}", "{}", "645,3,10"); /* x += 1 stood still at 1e17 */
    fails("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}", "64 MiB");
    fails("{% if x %}", "unclosed");
    fails("{{ raise_exception('no system role') }}", "no system role");
    fails("{{ 'a' | nosuchfilter }}", "nosuchfilter");
    fails("{{ 1 / 0 }}", "division by zero");
    fails("{% for i in range(0, 10, 0) %}{% endfor %}", "range");
    {
        static char deep[65536];
        size_t k = 0;
        k += (size_t)sprintf(deep, "{{ ");
        for (int i = 0; i < 5000; i++)
            deep[k++] = '(';
        strcpy(deep + k, "1 }}");
        fails(deep, "too deep");
        k = 0;
        for (int i = 0; i < 3000; i++)
            k += (size_t)sprintf(deep + k, "{%% if 1 %%}");
        fails(deep, "too deep");
        k = (size_t)sprintf(deep, "{{ ");
        for (int i = 0; i < 3000; i++)
            k += (size_t)sprintf(deep + k, "not ");
        strcpy(deep + k, "1 }}");
        fails(deep, "too deep");
    }

    /* mutated templates: render or report an error, never crash (run under valgrind for leaks) */
    uint64_t r = 0x2545f4914f6cdd1dull;
    size_t base = strlen(conv_tmpl);
    const char *ctx_json = "{\"bos_token\": \"<s>\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"x\"}]}";
    cJSON *ctx = cJSON_Parse(ctx_json);
    int rendered = 0, rejected = 0;
    for (int it = 0; it < 3000; it++) {
        char t[1024];
        memcpy(t, conv_tmpl, base + 1);
        size_t n = base;
        for (int m = 1 + it % 4; m > 0 && n > 2; m--) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            size_t at = (size_t)(r % n);
            switch ((r >> 32) % 3) {
            case 0: memmove(t + at, t + at + 1, n - at); n--; break;
            case 1: t[at] = "{}%#-()[]'\". |"[(r >> 40) % 15]; break;
            default: n = at + (n - at) / 2; t[n] = 0; break;
            }
        }
        dsv4_err err = {0};
        char *out = NULL;
        size_t on;
        if (dsv4_jinja_render(t, ctx, &out, &on, &err) == 0)
            rendered++;
        else
            rejected += err.msg[0] != 0;
        free(out);
    }
    cJSON_Delete(ctx);
    CHECK(rendered + rejected == 3000, "fuzz: %d rendered + %d rejected with a message, of 3000", rendered, rejected);
    return check_summary("jinja");
}
