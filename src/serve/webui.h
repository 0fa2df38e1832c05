/* webui — the chat page served at `/` (see webui.c). */
#ifndef DSV4_SERVE_WEBUI_H
#define DSV4_SERVE_WEBUI_H

extern const char dsv4_webui_html[];

#endif
