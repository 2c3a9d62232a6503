#ifndef TANDEM_CLIBWEBSOCKETS_SHIM_H
#define TANDEM_CLIBWEBSOCKETS_SHIM_H

#include <libwebsockets.h>

/// `LWS_PRE` is a macro built from `sizeof` and alignment arithmetic, which Swift cannot import.
/// Every buffer handed to `lws_write` needs this many writable bytes *before* the payload, where
/// libwebsockets puts the frame header.
static inline size_t tandem_lws_pre(void) { return LWS_PRE; }

#ifdef __linux__
#include <sys/prctl.h>
#endif

/// Names the calling thread (Linux: at most 15 bytes, shown in /proc/self/task/*/comm).
/// `pthread_setname_np` is hidden behind _GNU_SOURCE and `prctl` is variadic: neither imports.
static inline void tandem_set_thread_name(const char *name) {
#ifdef __linux__
    prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0);
#else
    (void)name;
#endif
}

#endif
