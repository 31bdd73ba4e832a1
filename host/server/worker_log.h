/*
 * A worker's stderr, read by the daemon (process isolation).  Each worker
 * gets a pipe for its stderr at spawn (workers.c); a thread of the daemon
 * reads every such pipe and logs each line again, in the daemon's format
 * (its timestamp, its <N> priority under journald, its log file), tagged
 * with the guest the daemon knows the worker serves: "[guest#N] ...".
 *
 * A worker runs a guest's graphs and may run a guest's code one day
 * (docs/SECURITY.md), so what it writes is not trusted: each line is cut to
 * APIR_WORKER_LOG_LINE_MAX bytes and escaped (control and non-ASCII bytes
 * as \xNN: it can neither end our line nor reach the terminal), and the
 * lines of one worker share a budget (apir_log_budget) twice the guest's
 * --guest-log-rate/--guest-log-burst - the worker's own lines are charged
 * there first - then are dropped and counted ("N log lines suppressed").
 * A line the worker's logger wrote ("apir COMPONENT: LEVEL: text", after an
 * optional timestamp) keeps its component and level; anything else (a
 * backend's abort message) is a warning of component "worker".
 */
#ifndef APIR_WORKER_LOG_H
#define APIR_WORKER_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APIR_WORKER_LOG_LINE_MAX 1024

/*
 * A pipe for a worker about to be started for guest#guest_id: returns its
 * write end (close-on-exec), which the child puts on its stderr (dup3 onto
 * 2) and the daemon closes once the child is started; the read end is the
 * reader thread's, closed at the worker's end.  -1 (errno set) when no pipe
 * or thread can be had: the worker then writes to the daemon's stderr.
 */
int apir_worker_log_open(uint64_t guest_id, uint32_t per_s, uint32_t burst);

/*
 * Waits, at most timeout_ms, until every worker's pipe has reached its end
 * and been closed and freed by the reader thread: after the daemon's
 * workers have ended, so that their last lines reach the log before the
 * daemon's own end (and nothing is left allocated).  False: some pipe is
 * still open (a worker's descendant may hold its write end).
 */
bool apir_worker_log_drain(int timeout_ms);

/* Relays one line as the reader thread would (exposed for the tests). */
void apir_worker_log_line(uint64_t guest_id, const char *line, size_t len);

#endif
