// Linux interfaces that Swift's Glibc module does not export: epoll, eventfd, accept4 and thread names.
// (_GNU_SOURCE is not defined here: it would change struct layouts against the Glibc module; the GNU
// functions are declared with their documented prototypes instead.)
#ifndef PEERMESH_CLINUX_SHIM_H
#define PEERMESH_CLINUX_SHIM_H
#include <pthread.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

extern int pthread_setname_np(pthread_t thread, const char *name);
extern int pthread_getname_np(pthread_t thread, char *name, size_t size);
extern int accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags);
#endif
