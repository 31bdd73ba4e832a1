/*
 * One handler per row of the command table, declared from the table: a
 * command without a handler is a link error.  A handler gets its request
 * decoded and checked (requests.h) and fills the reply struct
 * (apir_messages.h), which is encoded after it returns - whatever it
 * returns: graph commands answer a status with their refusals, for the
 * guests that read it.  It returns an apir_handler_result.
 *
 * Where they are: graph commands and BACKEND_SYNCHRONIZE in graph_exec.c
 * (the graph state machine), every other in dispatch.c.
 */
#ifndef APIR_HANDLERS_H
#define APIR_HANDLERS_H

#include "requests.h"

#define APIR_HANDLER(NAME)                                                                                   \
    uint32_t host_cmd_##NAME(struct apir_session *s, const struct apir_request_##NAME *req,                 \
                             struct apir_reply_##NAME *rep)

#define APIR_X_HANDLER_PROTO(num, NAME, since, classes) APIR_HANDLER(NAME);
APIR_COMMAND_LIST(APIR_X_HANDLER_PROTO)
#undef APIR_X_HANDLER_PROTO

/* A refusal the handler found (a check across items): logged, counted by
 * the caller; returns APIR_HANDLER_BAD_REQUEST. */
uint32_t apir_refuse(struct apir_session *s, uint32_t cmd, const char *why);

#endif
