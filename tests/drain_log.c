/* libapir-drain-log.so: drains llama.cpp's log before a program exits.
 *
 *   LD_PRELOAD=build/tests/libapir-drain-log.so .deps/bin/llama-batched ...
 *
 * Why: llama.cpp's programs log through common/log.cpp, which writes from a
 * thread of its own and leaks that logger on purpose, so nothing waits for
 * it at exit: on a loaded machine a program's last lines can be lost
 * (tests/run_llama_tools.sh compares the outputs of a program run natively
 * and through APIR0; a CI run on 2 busy cores lost the native run's last
 * lines five times in a row).  At exit this library pauses the logger
 * (common_log_pause), which queues an end mark behind what is pending and
 * joins the thread once it has written it all.  A program without
 * llama.cpp's common library: nothing.  Test code only.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <string.h>

__attribute__((destructor)) static void apir_drain_log(void)
{
    /* common_log * common_log_main(); void common_log_pause(common_log *) */
    void *main_sym = dlsym(RTLD_DEFAULT, "_Z15common_log_mainv");
    void *pause_sym = dlsym(RTLD_DEFAULT, "_Z16common_log_pauseP10common_log");
    if (!main_sym || !pause_sym)
        return;
    void *(*log_main)(void);
    void (*log_pause)(void *);
    memcpy(&log_main, &main_sym, sizeof(log_main));
    memcpy(&log_pause, &pause_sym, sizeof(log_pause));
    log_pause(log_main());
}
