#include "notice.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "apir_log.h"

static _Atomic(apir_notice_log_visible_fn) log_visible;
static atomic_bool said[APIR_NOTICE_CAUSE_COUNT];

void apir_notice_set_log_visible(apir_notice_log_visible_fn fn)
{
    atomic_store(&log_visible, fn);
}

void apir_notice(enum apir_notice_cause cause, const char *what, const char *remedy)
{
    if ((unsigned)cause >= APIR_NOTICE_CAUSE_COUNT || atomic_exchange(&said[cause], true))
        return;
    apir_notice_log_visible_fn visible = atomic_load(&log_visible);
    /* APIR_LOG_FILE takes every line, notices included: the user chose it. */
    const char *file = getenv("APIR_LOG_FILE");
    if (!visible || visible() || (file && *file)) {
        APIR_ERROR("guest", "%s (%s)", what, remedy);
        return;
    }
    /* The program silenced ggml's log: one write, so that lines of
     * several threads do not interleave. */
    char line[1200];
    int n = snprintf(line, sizeof(line), "apir: %s\napir: %s\n", what, remedy);
    if (n > 0)
        (void)!write(STDERR_FILENO, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
}
