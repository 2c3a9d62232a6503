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

#ifdef __linux__
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/sockios.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#endif

/// How many bytes the peer's TCP stack acknowledged on this socket so far (Linux'
/// `tcpi_bytes_acked`), or 0 where that is unknown. glibc's `struct tcp_info` stops before this
/// field; it sits at byte 120 of the kernel's (a stable UAPI layout, present since Linux 4.1).
static inline unsigned long long tandem_tcp_bytes_acked(int fd) {
#ifdef __linux__
    unsigned char info[232];
    socklen_t length = sizeof info;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &length) != 0 || length < 128) return 0;
    unsigned long long acked;
    memcpy(&acked, info + 120, sizeof acked);
    return acked;
#else
    (void)fd;
    return 0;
#endif
}

/// How many bytes this side has handed to the socket that its peer has not acknowledged yet
/// (sent or still queued: Linux' `SIOCOUTQ`), or 0 where that is unknown.
static inline int tandem_tcp_bytes_unacknowledged(int fd) {
#ifdef __linux__
    int queued = 0;
    if (ioctl(fd, SIOCOUTQ, &queued) != 0) return 0;
    return queued;
#else
    (void)fd;
    return 0;
#endif
}

#endif
