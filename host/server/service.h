/*
 * apir-host under a service manager (systemd), without libsystemd: socket
 * activation (sd_listen_fds: LISTEN_PID, LISTEN_FDS) and readiness
 * notification (sd_notify: a datagram to NOTIFY_SOCKET).  Both protocols
 * are a few environment variables and one datagram, stable since systemd
 * 209 (man sd_listen_fds, sd_notify); the host needs nothing else of
 * libsystemd, and a library dependency for this would reach every install.
 *
 * Everything here is a no-op outside systemd.  The environment variables
 * are read once and removed, so that worker processes (re-executed by the
 * daemon) neither adopt a socket nor notify.
 */
#ifndef APIR_SERVICE_H
#define APIR_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The first descriptor systemd passes (SD_LISTEN_FDS_START). */
#define APIR_SERVICE_LISTEN_FDS_START 3

/* Reads and removes LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES and
 * NOTIFY_SOCKET; idempotent, and done by every function below. */
void apir_service_init(void);

/*
 * The listening socket a service manager passed (socket activation):
 * LISTEN_PID names this process and LISTEN_FDS is 1.  Returns the fd
 * (close-on-exec from now on: workers do not inherit it), -1 when none was
 * passed, -2 with a message in err when the passed set is unusable (more
 * than one descriptor).  The socket's type is checked by
 * apir_server_adopt.  The first call takes the fd; later calls return -1.
 */
int apir_service_listen_fd(char *err, size_t err_len);

/* Whether NOTIFY_SOCKET named a socket (Type=notify). */
bool apir_service_notify_enabled(void);
/* Sends one notification ("READY=1\nSTATUS=..."); false when there is no
 * notify socket or sending failed. */
bool apir_service_notify(const char *state);
/* READY=1 with a STATUS= line (status may be NULL). */
void apir_service_ready(const char *status);
/* STOPPING=1: the daemon is shutting down. */
void apir_service_stopping(void);
/* STATUS=...: shown by `systemctl status`. */
void apir_service_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The process connected on fd (SO_PEERCRED: the kernel's word, not the
 * peer's); false, with uid and gid (uid_t)-1 and pid 0, when the kernel
 * cannot say.  Guests (server.c) and control clients (control.c). */
struct ucred;
bool apir_peer_cred(int fd, struct ucred *out);

/* A group given by name or number (--socket-group, --control-group: option
 * names the option in the message err gets when there is no such group). */
bool apir_service_resolve_group(const char *group, const char *option, gid_t *gid, char *err, size_t err_len);

#endif
