// Linux interfaces that Swift's Glibc module does not export: epoll, eventfd, accept4, ppoll, renameat2 and thread
// names.
// (_GNU_SOURCE is not defined here: it would change struct layouts against the Glibc module; the GNU
// functions are declared with their documented prototypes instead.)
#ifndef PEERMESH_CLINUX_SHIM_H
#define PEERMESH_CLINUX_SHIM_H
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <time.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

extern int pthread_setname_np(pthread_t thread, const char *name);
extern int pthread_getname_np(pthread_t thread, char *name, size_t size);
extern int accept4(int fd, struct sockaddr *addr, socklen_t *addrlen, int flags);
extern int ppoll(struct pollfd *fds, nfds_t nfds, const struct timespec *timeout, const sigset_t *sigmask);
extern int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags);
/// renameat2's flag: fail with EEXIST instead of replacing what is at the new path (<linux/fs.h>).
static const unsigned int pm_rename_noreplace = 1;

/// The uid of the process at the other end of a connected AF_UNIX socket (SO_PEERCRED; `struct ucred` needs
/// _GNU_SOURCE, so its documented layout is spelled out here). Returns 0 on success, -1 with errno set.
struct pm_ucred { int pid; unsigned int uid; unsigned int gid; };
static inline int pm_peer_uid(int fd, unsigned int *uid) {
    struct pm_ucred c;
    socklen_t len = sizeof c;
#ifndef SO_PEERCRED
#define SO_PEERCRED 17
#endif
    int r = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len);
    if (r == 0) *uid = c.uid;
    return r;
}
#endif
