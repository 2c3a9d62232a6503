#ifndef TANDEM_CEPOLL_H
#define TANDEM_CEPOLL_H

// Linux's epoll, which Swift's Glibc module leaves out, for the bench's listener swarm.
#ifdef __linux__
#include <sys/epoll.h>
#endif

#endif
