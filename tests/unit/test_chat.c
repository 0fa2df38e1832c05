/* Golden prompts for the V4.1 chat encoding, written from the release encoder's public examples
 * (a tool-calling conversation, a two-turn thinking conversation, the effort and mode cases). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "text/chat.h"

static char *render(const char *json, dsv4_err *err)
{
    cJSON *req = cJSON_Parse(json);
    if (!req) {
        snprintf(err->msg, sizeof err->msg, "test JSON does not parse");
        return NULL;
    }
    char *out = NULL;
    size_t n;
    int rc = dsv4_chat_render(req, &out, &n, err);
    cJSON_Delete(req);
    return rc ? NULL : out;
}

static void golden(const char *name, const char *json, const char *want)
{
    dsv4_err err = {0};
    char *got = render(json, &err);
    CHECK(got != NULL, "%s: %s", name, err.msg);
    if (!got)
        return;
    size_t i = 0;
    while (got[i] && got[i] == want[i])
        i++;
    CHECK(!strcmp(got, want), "%s: differs at byte %zu\n  got:  ...%.80s\n  want: ...%.80s", name, i, got + i, want + i);
    free(got);
}

static void rejected(const char *name, const char *json)
{
    dsv4_err err = {0};
    char *got = render(json, &err);
    CHECK(got == NULL && err.code == DSV4_E_ARG, "%s: should be rejected", name);
    free(got);
}

#define B "<｜begin▁of▁sentence｜>"
#define E "<｜end▁of▁sentence｜>"
#define EFFORT(n) "<｜System｜>Reasoning Effort: " #n " (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
#define D "｜DSML｜"

static const char tools_prompt[] =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<" D " calls>\" block like the following:\n\n<" D " calls>\n<" D " invoke name=\"$TOOL_NAME\">\n<" D
    " parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" D " parameter>\n...\n</" D " invoke>\n<" D
    " invoke name=\"$TOOL_NAME2\">\n...\n</" D " invoke>\n</" D " calls>\n\nString parameters should be specified as is "
    "and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format "
    "and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete "
    "reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after "
    "</think> with tool calls or final response.\n\n### Available Tool Schemas\n\n";

int main(void)
{
    /* the tool-calling example: tools on the system message, a call, its result, the answer */
    const char *weather =
        "{\"reasoning_effort\":\"xhigh\",\"add_generation_prompt\":false,\"messages\":["
        "{\"role\":\"system\",\"content\":\"You are a helpful assistant.\",\"tools\":["
        "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get the weather for a specific location\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"The city name\"},"
        "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"],\"description\":\"Temperature unit\"}},\"required\":[\"location\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"description\":\"Search the web for information\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\",\"description\":\"Search query\"},"
        "\"num_results\":{\"type\":\"integer\",\"description\":\"Number of results to return\"}},\"required\":[\"query\"]}}}]},"
        "{\"role\":\"user\",\"content\":\"What's the weather in Beijing?\"},"
        "{\"role\":\"assistant\",\"reasoning\":\"The user wants to know the weather in Beijing. I should use the get_weather tool.\","
        "\"tool_calls\":[{\"id\":\"call_001\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"location\\\": \\\"Beijing\\\", \\\"unit\\\": \\\"celsius\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_001\",\"content\":\"{\\\"temperature\\\": 22, \\\"condition\\\": \\\"sunny\\\", \\\"humidity\\\": 45}\"},"
        "{\"role\":\"assistant\",\"reasoning\":\"Got the weather data. Let me format a nice response.\","
        "\"content\":\"The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity.\"}]}";
    char want[8192];
    snprintf(want, sizeof want,
             B EFFORT(75) "You are a helpful assistant.\n\n%s"
             "{\"name\": \"get_weather\", \"description\": \"Get the weather for a specific location\", \"parameters\": "
             "{\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", \"description\": \"The city name\"}, "
             "\"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], \"description\": \"Temperature unit\"}}, "
             "\"required\": [\"location\"]}}\n"
             "{\"name\": \"search\", \"description\": \"Search the web for information\", \"parameters\": {\"type\": \"object\", "
             "\"properties\": {\"query\": {\"type\": \"string\", \"description\": \"Search query\"}, \"num_results\": {\"type\": "
             "\"integer\", \"description\": \"Number of results to return\"}}, \"required\": [\"query\"]}}\n\n"
             "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
             "<｜User｜>What's the weather in Beijing?<｜Assistant｜><think>The user wants to know the weather in Beijing. "
             "I should use the get_weather tool.</think>\n\n<" D " calls>\n<" D " invoke name=\"get_weather\">\n<" D
             " parameter name=\"location\" string=\"true\">Beijing</" D " parameter>\n<" D
             " parameter name=\"unit\" string=\"true\">celsius</" D " parameter>\n</" D " invoke>\n</" D " calls>" E
             "<｜User｜><tool_result>{\"temperature\": 22, \"condition\": \"sunny\", \"humidity\": 45}</tool_result>"
             "<｜Assistant｜><think>Got the weather data. Let me format a nice response.</think>The weather in Beijing is "
             "currently sunny with a temperature of 22°C and 45%% humidity." E,
             tools_prompt);
    golden("tool conversation", weather, want);

    /* the same with the generation prompt: one more assistant header after the final reply */
    {
        char *with = malloc(strlen(weather) + 64);
        strcpy(with, weather);
        char *p = strstr(with, "\"add_generation_prompt\":false,");
        memmove(p, p + strlen("\"add_generation_prompt\":false,"), strlen(p + strlen("\"add_generation_prompt\":false,")) + 1);
        strcat(want, "<｜Assistant｜><think>");
        golden("tool conversation + generation prompt", with, want);
        free(with);
    }

    /* two turns in thinking mode: reasoning before the last user turn is dropped */
    const char *two =
        "{\"reasoning_effort\":\"xhigh\",\"add_generation_prompt\":false,\"messages\":["
        "{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},{\"role\":\"user\",\"content\":\"Hello\"},"
        "{\"role\":\"assistant\",\"reasoning\":\"The user said hello, I should greet back.\",\"content\":\"Hi there! How can I help you?\"},"
        "{\"role\":\"user\",\"content\":\"What is the capital of France?\"},"
        "{\"role\":\"assistant\",\"reasoning\":\"The user asks about the capital of France. It is Paris.\",\"content\":\"The capital of France is Paris.\"}]}";
    golden("two turns", two,
           B EFFORT(75) "You are a helpful assistant.<｜User｜>Hello<｜Assistant｜></think>Hi there! How can I help you?" E
           "<｜User｜>What is the capital of France?<｜Assistant｜><think>The user asks about the capital of France. It is "
           "Paris.</think>The capital of France is Paris." E);

    /* reasoning effort: default, names, numbers */
    golden("effort default", "{\"messages\":[{\"role\":\"user\",\"content\":\"question\"}]}",
           B EFFORT(50) "<｜User｜>question<｜Assistant｜><think>");
    golden("effort low", "{\"reasoning_effort\":\"low\",\"messages\":[{\"role\":\"user\",\"content\":\"question\"}]}",
           B EFFORT(25) "<｜User｜>question<｜Assistant｜><think>");
    golden("effort max", "{\"reasoning_effort\":\"max\",\"messages\":[{\"role\":\"user\",\"content\":\"question\"}]}",
           B EFFORT(100) "<｜User｜>question<｜Assistant｜><think>");
    golden("effort 42", "{\"reasoning_effort\":42,\"messages\":[{\"role\":\"user\",\"content\":\"question\"}]}",
           B EFFORT(42) "<｜User｜>question<｜Assistant｜><think>");
    const char *bad[] = {"\"medium\"", "\"minimal\"", "-1", "0", "101", "true", "1.5", "[]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char j[200];
        snprintf(j, sizeof j, "{\"reasoning_effort\":%s,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", bad[i]);
        rejected(bad[i], j);
    }

    /* chat mode: no effort line, closed thinking */
    golden("chat mode", "{\"thinking_mode\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}",
           B "<｜User｜>hello<｜Assistant｜></think>");
    golden("text parts", "{\"thinking_mode\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"first\"},{\"type\":\"text\",\"text\":\"second\"}]}]}",
           B "<｜User｜>first\n\nsecond<｜Assistant｜></think>");
    golden("mid-conversation system", "{\"thinking_mode\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"question\"},{\"role\":\"system\",\"content\":\"answer briefly\"}]}",
           B "<｜User｜>question<｜System｜>answer briefly<｜Assistant｜></think>");
    golden("system only", "{\"thinking_mode\":\"chat\",\"messages\":[{\"role\":\"system\",\"content\":\"Be helpful.\"}]}",
           B "<｜System｜>Be helpful.<｜Assistant｜></think>");
    golden("history in chat mode",
           "{\"thinking_mode\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"first question\"},{\"role\":\"assistant\",\"content\":\"first answer\"},{\"role\":\"user\",\"content\":\"second question\"}]}",
           B "<｜User｜>first question<｜Assistant｜></think>first answer" E "<｜User｜>second question<｜Assistant｜></think>");
    golden("continue final message",
           "{\"thinking_mode\":\"chat\",\"continue_final_message\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Finish this sentence.\"},{\"role\":\"assistant\",\"content\":\"The answer is \"}]}",
           B "<｜User｜>Finish this sentence.<｜Assistant｜></think>The answer is ");
    golden("continue final reasoning",
           "{\"continue_final_message\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Explain your answer.\"},{\"role\":\"assistant\",\"content\":null,\"reasoning\":\"Let me consider \"}]}",
           B EFFORT(50) "<｜User｜>Explain your answer.<｜Assistant｜><think>Let me consider ");
    rejected("continue without assistant", "{\"continue_final_message\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}");
    /* drop_thinking off keeps earlier reasoning and opens thinking after every user turn */
    golden("keep thinking",
           "{\"drop_thinking\":false,\"reasoning_effort\":\"low\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"reasoning_content\":\"r\",\"content\":\"b\"},{\"role\":\"user\",\"content\":\"c\"}]}",
           B EFFORT(25) "<｜User｜>a<｜Assistant｜><think>r</think>b" E "<｜User｜>c<｜Assistant｜><think>");
    /* parallel tool results are put in call order; typed arguments */
    golden("tool results in call order",
           "{\"thinking_mode\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"go\"},"
           "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"n\\\": 1, \\\"x\\\": [true, null, 2.5], \\\"s\\\": \\\"t\\\"}\"}},"
           "{\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},"
           "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"B\"},{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"A\"}]}",
           B "<｜User｜>go<｜Assistant｜></think>\n\n<" D " calls>\n<" D " invoke name=\"f\">\n<" D
             " parameter name=\"n\" string=\"false\">1</" D " parameter>\n<" D " parameter name=\"x\" string=\"false\">[true, null, 2.5]</" D
             " parameter>\n<" D " parameter name=\"s\" string=\"true\">t</" D " parameter>\n</" D " invoke>\n<" D
             " invoke name=\"g\">\n\n</" D " invoke>\n</" D " calls>" E
             "<｜User｜><tool_result>A</tool_result>\n\n<tool_result>B</tool_result><｜Assistant｜></think>");

    /* V4 (0731): no system marker, "max" effort as its own paragraph, the older DSML tags */
    golden("v4 chat", "{\"family\":\"deepseek_v4\",\"thinking_mode\":\"chat\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"hello\"}]}",
           B "S<｜User｜>hello<｜Assistant｜></think>");
    golden("v4 high effort writes nothing", "{\"family\":\"deepseek_v4\",\"reasoning_effort\":\"high\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
           B "<｜User｜>q<｜Assistant｜><think>");
    golden("v4 max effort", "{\"family\":\"deepseek_v4\",\"reasoning_effort\":\"max\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
           B "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and "
             "comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all "
             "potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, "
             "documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no "
             "assumption is left unchecked.\n\n<｜User｜>q<｜Assistant｜><think>");
    rejected("v4 numeric effort", "{\"family\":\"deepseek_v4\",\"reasoning_effort\":50,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
    golden("v4 tool call",
           "{\"family\":\"deepseek_v4\",\"thinking_mode\":\"chat\",\"add_generation_prompt\":false,\"messages\":[{\"role\":\"user\",\"content\":\"go\"},"
           "{\"role\":\"assistant\",\"content\":\"ok\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": \\\"b\\\"}\"}}]}]}",
           B "<｜User｜>go<｜Assistant｜></think>ok\n\n<" D "tool_calls>\n<" D "invoke name=\"f\">\n<" D
             "parameter name=\"a\" string=\"true\">b</" D "parameter>\n</" D "invoke>\n</" D "tool_calls>" E);
    /* a V4 mid-conversation system message is plain text and does not open a reply */
    golden("v4 mid system", "{\"family\":\"deepseek_v4\",\"thinking_mode\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"system\",\"content\":\"s\"}]}",
           B "<｜User｜>qs");

    /* Python's float repr inside JSON */
    {
        const char *nums = "[0.1, 1e-05, 1.5e+16, 123.456, -0.0001, 1e+300, 2.5e-07, 100, 3.0]";
        cJSON *j = cJSON_Parse(nums);
        dsv4_buf b = {0};
        dsv4_py_json(&b, j);
        CHECK(b.p && !strcmp(b.p, "[0.1, 1e-05, 1.5e+16, 123.456, -0.0001, 1e+300, 2.5e-07, 100, 3]"), "py floats: %s", b.p);
        dsv4_buf_free(&b);
        cJSON_Delete(j);
    }
    return check_summary("chat");
}
