/* core/err — the error every layer reports through: a code and a message naming the file,
 * tensor, key or field at fault. include/dsv4.h publishes it with the API; the functions that
 * set it are in core/core.h. */
#ifndef DSV4_ERR_H
#define DSV4_ERR_H

enum {
    DSV4_OK = 0,
    DSV4_E_IO = 1,        /* a file could not be opened, read or mapped */
    DSV4_E_FORMAT = 2,    /* a file's content is malformed (header, JSON, offsets) */
    DSV4_E_MODEL = 3,     /* tensors or config do not make a valid model */
    DSV4_E_ARG = 4,       /* a caller passed something invalid */
    DSV4_E_NOMEM = 5,
    DSV4_E_STATE = 6,     /* a sequence cannot do what was asked (rollback too far, ...) */
    DSV4_E_UNSUPPORTED = 7,
    DSV4_E_DEVICE = 8,    /* the chosen backend is not available */
    DSV4_E_CLOSED = 9,    /* the scheduler is shutting down and takes no more work */
};

typedef struct dsv4_err {
    int code;
    char msg[1024];
} dsv4_err;

#endif
