// rt_probe.c — an LD_PRELOAD library that checks the real-time rule: "the audio threads never allocate, and never
// wait on anything but the device". Inside a time window it counts, for threads with given names:
//   - heap calls: malloc, calloc, realloc, free, and the aligned allocators;
//   - waits: calls that can put the thread to sleep — pthread mutex and rwlock locks, condition and semaphore waits,
//     futex waits made through syscall() (Swift's Mutex when contended, libdispatch), sleeps, sched_yield,
//     pthread_join, poll/ppoll/select/pselect/epoll_wait with a timeout other than zero, and reads, writes, sends
//     and receives on a descriptor in blocking mode (without O_NONBLOCK or MSG_DONTWAIT);
// and, apart, the two kinds of wait the rule allows:
//   - device waits: those made by the device's own libraries (libasound, its plugins, libjack), and polls whose
//     descriptors include the device's (as snd_pcm_poll_descriptors gave them, which the probe watches too);
//     counting them also shows that the probe sees the thread's waits at all;
//   - input waits: polls with a timeout on internet datagram sockets only — a player waiting, until the device's
//     deadline for the next block, for that block's packets (Player and RenderSchedule). The kernel fills such a
//     socket from the network; no thread of the process holds it.
// It writes a report when the window closes.
//
// Built and used by Tests/MeshRelayTests/RealTimeRuleTests.swift:
//   clang -shared -fPIC -O2 -ftls-model=initial-exec -o probe.so scripts/lib/rt_probe.c -ldl
//   LD_PRELOAD=probe.so PM_RT_PROBE_THREADS=pm-playback,pm-io PM_RT_PROBE_FROM_MS=1000 \
//     PM_RT_PROBE_UNTIL_MS=5000 PM_RT_PROBE_OUT=report.txt [PM_RT_PROBE_START_FILE=playing] mesh-play …
//
// The window is measured from the moment PM_RT_PROBE_START_FILE appears (the test makes it once the stream plays;
// the probe looks every 10 ms), or else from the moment the library is loaded (process start). The report, written
// by a thread of the probe's own at the window's end, has one line per watched name:
//   thread pm-playback live=1 calls=0 waits=0 devicewaits=1377 inputwaits=1020
// (`live`: a thread of that name existed at the window's end, from /proc/self/task/*/comm; `calls`: heap calls;
// `waits`: every other wait), then, for the first few heap calls and waits of each name, their
// stacks (backtrace_symbols_fd), so that a failure says where it came from.
//
// What it cannot see: a lock taken without contention by code that does not call into a library for it (Swift's
// Mutex takes an uncontended lock with one atomic instruction, and enters the kernel only to wait), and calls glibc
// makes to itself. It forwards every call to the C library's own function, so it changes nothing else.
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef FUTEX_LOCK_PI2   // kernel headers before 5.14
#define FUTEX_LOCK_PI2 13
#endif

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

#define MAX_NAMES 8
#define MAX_STACKS 3   // per watched name and kind
#define STACK_DEPTH 24

// What a counted call was.
enum kind { HEAP, WAIT, DEVICE_WAIT, INPUT_WAIT, KINDS };
#define STACK_KINDS 2   // stacks are kept for the first two kinds: heap calls and (other) waits
static const char *const kind_names[KINDS] = {"calls", "waits", "devicewaits", "inputwaits"};

static char names[MAX_NAMES][16];
static int name_count;
static atomic_ulong counts[MAX_NAMES][KINDS];
static uint64_t from_ms, until_ms;            // the window, after its start event
static _Atomic uint64_t window_from, window_until;   // monotonic ns; window_until 0: not counting (yet)
static char out_path[4096], start_path[4096];

// The stacks of the first heap calls and (non-device) waits of each name.
static void *stacks[MAX_NAMES][STACK_KINDS][MAX_STACKS][STACK_DEPTH];
static int stack_depths[MAX_NAMES][STACK_KINDS][MAX_STACKS];
static const char *stack_calls[MAX_NAMES][STACK_KINDS][MAX_STACKS];
static atomic_int stacks_taken[MAX_NAMES][STACK_KINDS];
static atomic_int stack_ready[MAX_NAMES][STACK_KINDS][MAX_STACKS];   // the slot is written whole (the reporter may run meanwhile)

// Initial-exec TLS whatever the build flags: dynamic TLS would go through __tls_get_addr, which may itself allocate
// (after a dlopen of a library with TLS) and so re-enter the probe.
#define PROBE_TLS __thread __attribute__((tls_model("initial-exec")))
static PROBE_TLS int inside;          // this thread is in the probe already (backtrace and dladdr call libc)
static PROBE_TLS int watched = -2;    // -2: not looked up yet; -1: not watched; else index in names
static PROBE_TLS uint64_t looked_at;  // when the name was last read (a thread may be named after its first call)

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int index_of_current_thread(uint64_t now) {
  if (watched >= 0) return watched;
  if (watched == -1 && now - looked_at < 50000000u) return -1;   // read the name again at most every 50 ms
  char name[16] = {0};
  prctl(PR_GET_NAME, name, 0, 0, 0);
  looked_at = now;
  watched = -1;
  for (int i = 0; i < name_count; i++)
    if (strcmp(name, names[i]) == 0) watched = i;
  return watched;
}

// The watched name of the calling thread when a call now is to be counted, or -1.
static int counting(void) {
  if (inside) return -1;
  uint64_t until = atomic_load_explicit(&window_until, memory_order_acquire);
  if (until == 0) return -1;
  uint64_t now = now_ns();
  if (now < atomic_load_explicit(&window_from, memory_order_relaxed) || now >= until) return -1;
  return index_of_current_thread(now);
}

static void take_stack(int i, int k, const char *call) {
  int slot = atomic_fetch_add(&stacks_taken[i][k], 1);
  if (slot >= MAX_STACKS) return;
  stack_calls[i][k][slot] = call;
  stack_depths[i][k][slot] = backtrace(stacks[i][k][slot], STACK_DEPTH);
  atomic_store_explicit(&stack_ready[i][k][slot], 1, memory_order_release);
}

static void note_heap(const char *call) {
  int i = counting();
  if (i < 0) return;
  atomic_fetch_add(&counts[i][HEAP], 1);
  inside = 1;
  take_stack(i, HEAP, call);
  inside = 0;
}

// Whether `caller` (a return address) lies in one of the device's libraries: libasound, the ALSA plugins it loads
// (libasound_module_*), and libjack, which the jack plugin uses.
static int from_device_library(void *caller) {
  Dl_info info;
  if (!dladdr(caller, &info) || !info.dli_fname) return 0;
  const char *base = strrchr(info.dli_fname, '/');
  base = base ? base + 1 : info.dli_fname;
  return strncmp(base, "libasound", 9) == 0 || strncmp(base, "libjack", 7) == 0;
}

// The descriptors the device libraries handed out for polling (snd_pcm_poll_descriptors), in the order seen.
#define MAX_DEVICE_FDS 32
static atomic_int device_fds[MAX_DEVICE_FDS];
static atomic_int device_fd_count;

static void remember_device_fd(int fd) {
  int n = atomic_load(&device_fd_count);
  for (int j = 0; j < n && j < MAX_DEVICE_FDS; j++)
    if (atomic_load(&device_fds[j]) == fd) return;
  int slot = atomic_fetch_add(&device_fd_count, 1);
  if (slot < MAX_DEVICE_FDS) atomic_store(&device_fds[slot], fd);
}

static int is_device_fd(int fd) {
  int n = atomic_load(&device_fd_count);
  for (int j = 0; j < n && j < MAX_DEVICE_FDS; j++)
    if (atomic_load(&device_fds[j]) == fd) return 1;
  return 0;
}

// Whether `fd` is an internet datagram socket (UDP): what fills it is the network, not a thread of the process.
static int is_network_datagram_socket(int fd) {
  int type = 0, domain = 0;
  socklen_t n = sizeof type, m = sizeof domain;
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &n) == 0 && type == SOCK_DGRAM &&
         getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &m) == 0 && (domain == AF_INET || domain == AF_INET6);
}

static void count_wait(int i, enum kind k, const char *call) {
  atomic_fetch_add(&counts[i][k], 1);
  if (k == WAIT) take_stack(i, WAIT, call);
}

static void note_wait(const char *call, void *caller) {
  int i = counting();
  if (i < 0) return;
  inside = 1;
  count_wait(i, from_device_library(caller) ? DEVICE_WAIT : WAIT, call);
  inside = 0;
}

// A poll-family wait on `fds`: a device wait when one of them is the device's, an input wait when it has a timeout
// (`timed`) and every one is a network datagram socket, else a wait like any other.
static void note_poll(const char *call, void *caller, const struct pollfd *fds, nfds_t n, int timed) {
  int i = counting();
  if (i < 0) return;
  inside = 1;
  enum kind k = WAIT;
  if (from_device_library(caller)) {
    k = DEVICE_WAIT;
  } else {
    int device = 0, sockets = 0, others = 0;
    for (nfds_t j = 0; j < n; j++) {
      if (fds[j].fd < 0) continue;   // ignored by poll
      if (is_device_fd(fds[j].fd)) device = 1;
      else if (is_network_datagram_socket(fds[j].fd)) sockets++;
      else others++;
    }
    if (device) k = DEVICE_WAIT;
    else if (sockets > 0 && others == 0 && timed) k = INPUT_WAIT;
  }
  count_wait(i, k, call);
  inside = 0;
}

// Whether I/O on `fd` may block: the descriptor is in blocking mode.
static int blocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && !(flags & O_NONBLOCK);
}

// Each interposed call notes itself (only when the probe counts, and the wait condition holds), then forwards to
// the next definition of the same name: the C library's. The constructor looks every pointer up (`resolve_all`);
// a call that comes before it (from another library's constructor) looks its own up, and what the lookup itself
// calls is not counted.
static void *lookup(const char *name, const char *version) {
  int was_inside = inside;
  inside = 1;
  void *f = version ? dlvsym(RTLD_NEXT, name, version) : NULL;
  if (!f) f = dlsym(RTLD_NEXT, name);   // a port of glibc whose oldest version is later has only one
  inside = was_inside;
  return f;
}
#define NEXT_VERSIONED(type, name, version) \
  static _Atomic(type) next_##name; \
  static type real_##name(void) { \
    type f = atomic_load_explicit(&next_##name, memory_order_acquire); \
    if (!f) { f = (type)lookup(#name, version); atomic_store_explicit(&next_##name, f, memory_order_release); } \
    return f; \
  }
#define NEXT(type, name) NEXT_VERSIONED(type, name, NULL)
// Condition waits have two versions in glibc on x86-64; the unversioned lookup may find the old one.
#define COND_VERSION "GLIBC_2.3.2"
#define CALLER __builtin_return_address(0)

typedef int (*mutex_lock_fn)(pthread_mutex_t *);
typedef int (*mutex_timedlock_fn)(pthread_mutex_t *, const struct timespec *);
typedef int (*rwlock_fn)(pthread_rwlock_t *);
typedef int (*cond_wait_fn)(pthread_cond_t *, pthread_mutex_t *);
typedef int (*cond_timedwait_fn)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
typedef int (*cond_clockwait_fn)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *);
typedef int (*sem_wait_fn)(sem_t *);
typedef int (*sem_timedwait_fn)(sem_t *, const struct timespec *);
typedef int (*join_fn)(pthread_t, void **);
typedef int (*nanosleep_fn)(const struct timespec *, struct timespec *);
typedef int (*clock_nanosleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);
typedef int (*usleep_fn)(useconds_t);
typedef unsigned (*sleep_fn)(unsigned);
typedef int (*yield_fn)(void);
typedef int (*poll_fn)(struct pollfd *, nfds_t, int);
typedef int (*ppoll_fn)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
typedef int (*select_fn)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
typedef int (*pselect_fn)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
typedef int (*epoll_wait_fn)(int, struct epoll_event *, int, int);
typedef int (*epoll_pwait_fn)(int, struct epoll_event *, int, int, const sigset_t *);
typedef ssize_t (*read_fn)(int, void *, size_t);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*readv_fn)(int, const struct iovec *, int);
typedef ssize_t (*recv_fn)(int, void *, size_t, int);
typedef ssize_t (*recvfrom_fn)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
typedef ssize_t (*recvmsg_fn)(int, struct msghdr *, int);
typedef int (*recvmmsg_fn)(int, struct mmsghdr *, unsigned, int, struct timespec *);
typedef ssize_t (*send_fn)(int, const void *, size_t, int);
typedef ssize_t (*sendto_fn)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
typedef ssize_t (*sendmsg_fn)(int, const struct msghdr *, int);
typedef int (*sendmmsg_fn)(int, struct mmsghdr *, unsigned, int);
typedef long (*syscall_fn)(long, ...);

NEXT(mutex_lock_fn, pthread_mutex_lock)
NEXT(mutex_timedlock_fn, pthread_mutex_timedlock)
NEXT(rwlock_fn, pthread_rwlock_rdlock)
NEXT(rwlock_fn, pthread_rwlock_wrlock)
NEXT_VERSIONED(cond_wait_fn, pthread_cond_wait, COND_VERSION)
NEXT_VERSIONED(cond_timedwait_fn, pthread_cond_timedwait, COND_VERSION)
NEXT(cond_clockwait_fn, pthread_cond_clockwait)
NEXT(sem_wait_fn, sem_wait)
NEXT(sem_timedwait_fn, sem_timedwait)
NEXT(join_fn, pthread_join)
NEXT(nanosleep_fn, nanosleep)
NEXT(clock_nanosleep_fn, clock_nanosleep)
NEXT(usleep_fn, usleep)
NEXT(sleep_fn, sleep)
NEXT(yield_fn, sched_yield)
NEXT(poll_fn, poll)
NEXT(ppoll_fn, ppoll)
NEXT(select_fn, select)
NEXT(pselect_fn, pselect)
NEXT(epoll_wait_fn, epoll_wait)
NEXT(epoll_pwait_fn, epoll_pwait)
NEXT(read_fn, read)
NEXT(write_fn, write)
NEXT(readv_fn, readv)
NEXT(readv_fn, writev)
NEXT(recv_fn, recv)
NEXT(recvfrom_fn, recvfrom)
NEXT(recvmsg_fn, recvmsg)
NEXT(recvmmsg_fn, recvmmsg)
NEXT(send_fn, send)
NEXT(sendto_fn, sendto)
NEXT(sendmsg_fn, sendmsg)
NEXT(sendmmsg_fn, sendmmsg)
NEXT(syscall_fn, syscall)

int pthread_mutex_lock(pthread_mutex_t *m) { note_wait("pthread_mutex_lock", CALLER); return real_pthread_mutex_lock()(m); }
int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *t) {
  note_wait("pthread_mutex_timedlock", CALLER);
  return real_pthread_mutex_timedlock()(m, t);
}
int pthread_rwlock_rdlock(pthread_rwlock_t *l) { note_wait("pthread_rwlock_rdlock", CALLER); return real_pthread_rwlock_rdlock()(l); }
int pthread_rwlock_wrlock(pthread_rwlock_t *l) { note_wait("pthread_rwlock_wrlock", CALLER); return real_pthread_rwlock_wrlock()(l); }
int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m) {
  note_wait("pthread_cond_wait", CALLER);
  return real_pthread_cond_wait()(c, m);
}
int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *t) {
  note_wait("pthread_cond_timedwait", CALLER);
  return real_pthread_cond_timedwait()(c, m, t);
}
int pthread_cond_clockwait(pthread_cond_t *c, pthread_mutex_t *m, clockid_t clock, const struct timespec *t) {
  note_wait("pthread_cond_clockwait", CALLER);
  return real_pthread_cond_clockwait()(c, m, clock, t);
}
int sem_wait(sem_t *s) { note_wait("sem_wait", CALLER); return real_sem_wait()(s); }
int sem_timedwait(sem_t *s, const struct timespec *t) { note_wait("sem_timedwait", CALLER); return real_sem_timedwait()(s, t); }
int pthread_join(pthread_t t, void **r) { note_wait("pthread_join", CALLER); return real_pthread_join()(t, r); }
int nanosleep(const struct timespec *t, struct timespec *left) { note_wait("nanosleep", CALLER); return real_nanosleep()(t, left); }
int clock_nanosleep(clockid_t c, int flags, const struct timespec *t, struct timespec *left) {
  note_wait("clock_nanosleep", CALLER);
  return real_clock_nanosleep()(c, flags, t, left);
}
int usleep(useconds_t us) { note_wait("usleep", CALLER); return real_usleep()(us); }
unsigned sleep(unsigned s) { note_wait("sleep", CALLER); return real_sleep()(s); }
int sched_yield(void) { note_wait("sched_yield", CALLER); return real_sched_yield()(); }

int poll(struct pollfd *f, nfds_t n, int timeout) {
  if (timeout != 0) note_poll("poll", CALLER, f, n, timeout > 0);
  return real_poll()(f, n, timeout);
}
int ppoll(struct pollfd *f, nfds_t n, const struct timespec *t, const sigset_t *mask) {
  if (!t || t->tv_sec != 0 || t->tv_nsec != 0) note_poll("ppoll", CALLER, f, n, t != NULL);
  return real_ppoll()(f, n, t, mask);
}
int select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *t) {
  if (!t || t->tv_sec != 0 || t->tv_usec != 0) note_wait("select", CALLER);
  return real_select()(n, r, w, e, t);
}
int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *t, const sigset_t *mask) {
  if (!t || t->tv_sec != 0 || t->tv_nsec != 0) note_wait("pselect", CALLER);
  return real_pselect()(n, r, w, e, t, mask);
}
int epoll_wait(int ep, struct epoll_event *ev, int n, int timeout) {
  if (timeout != 0) note_wait("epoll_wait", CALLER);
  return real_epoll_wait()(ep, ev, n, timeout);
}
int epoll_pwait(int ep, struct epoll_event *ev, int n, int timeout, const sigset_t *mask) {
  if (timeout != 0) note_wait("epoll_pwait", CALLER);
  return real_epoll_pwait()(ep, ev, n, timeout, mask);
}

// I/O counts only on a descriptor that can block; the fcntl is made only when the call is counted at all.
#define NOTE_IO(call, fd, flags) \
  do { if (counting() >= 0 && !((flags) & MSG_DONTWAIT) && blocking(fd)) note_wait(call, CALLER); } while (0)

ssize_t read(int fd, void *b, size_t n) { NOTE_IO("read", fd, 0); return real_read()(fd, b, n); }
ssize_t write(int fd, const void *b, size_t n) { NOTE_IO("write", fd, 0); return real_write()(fd, b, n); }
ssize_t readv(int fd, const struct iovec *v, int n) { NOTE_IO("readv", fd, 0); return real_readv()(fd, v, n); }
ssize_t writev(int fd, const struct iovec *v, int n) { NOTE_IO("writev", fd, 0); return real_writev()(fd, v, n); }
ssize_t recv(int fd, void *b, size_t n, int flags) { NOTE_IO("recv", fd, flags); return real_recv()(fd, b, n, flags); }
ssize_t recvfrom(int fd, void *b, size_t n, int flags, struct sockaddr *a, socklen_t *l) {
  NOTE_IO("recvfrom", fd, flags);
  return real_recvfrom()(fd, b, n, flags, a, l);
}
ssize_t recvmsg(int fd, struct msghdr *m, int flags) { NOTE_IO("recvmsg", fd, flags); return real_recvmsg()(fd, m, flags); }
int recvmmsg(int fd, struct mmsghdr *m, unsigned n, int flags, struct timespec *t) {
  NOTE_IO("recvmmsg", fd, flags);
  return real_recvmmsg()(fd, m, n, flags, t);
}
ssize_t send(int fd, const void *b, size_t n, int flags) { NOTE_IO("send", fd, flags); return real_send()(fd, b, n, flags); }
ssize_t sendto(int fd, const void *b, size_t n, int flags, const struct sockaddr *a, socklen_t l) {
  NOTE_IO("sendto", fd, flags);
  return real_sendto()(fd, b, n, flags, a, l);
}
ssize_t sendmsg(int fd, const struct msghdr *m, int flags) { NOTE_IO("sendmsg", fd, flags); return real_sendmsg()(fd, m, flags); }
int sendmmsg(int fd, struct mmsghdr *m, unsigned n, int flags) {
  NOTE_IO("sendmmsg", fd, flags);
  return real_sendmmsg()(fd, m, n, flags);
}

// The device's poll descriptors, remembered so that a poll on them counts as waiting on the device. (alsa-lib's
// type is opaque here: the probe needs no ALSA headers.)
typedef int (*poll_descriptors_fn)(void *, struct pollfd *, unsigned);
NEXT(poll_descriptors_fn, snd_pcm_poll_descriptors)
int snd_pcm_poll_descriptors(void *pcm, struct pollfd *f, unsigned space) {
  int n = real_snd_pcm_poll_descriptors()(pcm, f, space);
  for (int j = 0; j < n && (unsigned)j < space; j++) remember_device_fd(f[j].fd);
  return n;
}

// syscall() is variadic; every Linux system call takes at most six word-sized arguments, passed on as such. Only the
// futex operations that sleep count (waits and priority-inheritance locks), not wakes, unlocks or try-locks.
long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
  long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_futex) {
    int op = (int)b & FUTEX_CMD_MASK;
    if (op == FUTEX_WAIT || op == FUTEX_WAIT_BITSET || op == FUTEX_LOCK_PI || op == FUTEX_LOCK_PI2 ||
        op == FUTEX_WAIT_REQUEUE_PI)
      note_wait("syscall(futex)", CALLER);
  }
  return real_syscall()(number, a, b, c, d, e, f);
}

void *malloc(size_t n) { note_heap("malloc"); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { note_heap("calloc"); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { note_heap("realloc"); return __libc_realloc(p, n); }
void free(void *p) { if (p) note_heap("free"); __libc_free(p); }
void *aligned_alloc(size_t a, size_t n) { note_heap("aligned_alloc"); return __libc_memalign(a, n); }
void *memalign(size_t a, size_t n) { note_heap("memalign"); return __libc_memalign(a, n); }
int posix_memalign(void **p, size_t a, size_t n) {
  note_heap("posix_memalign");
  if (a < sizeof(void *) || (a & (a - 1)) != 0) return 22;   // EINVAL
  void *r = __libc_memalign(a, n);
  if (!r) return 12;                                          // ENOMEM
  *p = r;
  return 0;
}

static void say(int fd, const char *s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

// Whether a thread named `name` is alive now.
static int live(const char *name) {
  int found = 0;
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  struct dirent *e;
  while (!found && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[64], comm[32] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, comm, sizeof comm - 1);
    close(fd);
    if (n > 0 && comm[n - 1] == '\n') comm[n - 1] = 0;
    found = strcmp(comm, name) == 0;
  }
  closedir(d);
  return found;
}

static void *reporter(void *unused) {
  (void)unused;
  prctl(PR_SET_NAME, "rt-probe", 0, 0, 0);
  if (start_path[0]) {
    struct timespec tick = {0, 10000000};
    while (access(start_path, F_OK) != 0) nanosleep(&tick, NULL);
    uint64_t t0 = now_ns();
    atomic_store_explicit(&window_from, t0 + from_ms * 1000000u, memory_order_relaxed);
    atomic_store_explicit(&window_until, t0 + until_ms * 1000000u, memory_order_release);
  }
  uint64_t now, end = atomic_load(&window_until);
  while ((now = now_ns()) < end) {
    uint64_t left = end - now;
    struct timespec t = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
    nanosleep(&t, NULL);
  }
  char tmp[sizeof out_path + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return NULL;
  char line[192];
  for (int i = 0; i < name_count; i++) {
    snprintf(line, sizeof line, "thread %s live=%d", names[i], live(names[i]));
    say(fd, line);
    for (int k = 0; k < KINDS; k++) {
      snprintf(line, sizeof line, " %s=%lu", kind_names[k], atomic_load(&counts[i][k]));
      say(fd, line);
    }
    say(fd, "\n");
  }
  for (int i = 0; i < name_count; i++) {
    for (int k = 0; k < STACK_KINDS; k++) {
      int taken = atomic_load(&stacks_taken[i][k]);
      for (int s = 0; s < taken && s < MAX_STACKS; s++) {
        if (!atomic_load_explicit(&stack_ready[i][k][s], memory_order_acquire)) continue;
        snprintf(line, sizeof line, "stack %d: %s on %s\n", s, stack_calls[i][k][s], names[i]);
        say(fd, line);
        backtrace_symbols_fd(stacks[i][k][s], stack_depths[i][k][s], fd);
      }
    }
  }
  close(fd);
  rename(tmp, out_path);   // the report appears whole
  return NULL;
}

// Looks every forwarded function up now, so that no lookup happens on a watched thread later.
static void resolve_all(void) {
  (void)real_pthread_mutex_lock();
  (void)real_pthread_mutex_timedlock();
  (void)real_pthread_rwlock_rdlock();
  (void)real_pthread_rwlock_wrlock();
  (void)real_pthread_cond_wait();
  (void)real_pthread_cond_timedwait();
  (void)real_pthread_cond_clockwait();
  (void)real_sem_wait();
  (void)real_sem_timedwait();
  (void)real_pthread_join();
  (void)real_nanosleep();
  (void)real_clock_nanosleep();
  (void)real_usleep();
  (void)real_sleep();
  (void)real_sched_yield();
  (void)real_poll();
  (void)real_ppoll();
  (void)real_select();
  (void)real_pselect();
  (void)real_epoll_wait();
  (void)real_epoll_pwait();
  (void)real_read();
  (void)real_write();
  (void)real_readv();
  (void)real_writev();
  (void)real_recv();
  (void)real_recvfrom();
  (void)real_recvmsg();
  (void)real_recvmmsg();
  (void)real_send();
  (void)real_sendto();
  (void)real_sendmsg();
  (void)real_sendmmsg();
  (void)real_syscall();
  (void)real_snd_pcm_poll_descriptors();
}

__attribute__((constructor)) static void start(void) {
  const char *list = getenv("PM_RT_PROBE_THREADS"), *from = getenv("PM_RT_PROBE_FROM_MS"),
             *until = getenv("PM_RT_PROBE_UNTIL_MS"), *out = getenv("PM_RT_PROBE_OUT"),
             *start_file = getenv("PM_RT_PROBE_START_FILE");
  if (!list || !from || !until || !out || strlen(out) >= sizeof out_path) return;
  if (start_file && strlen(start_file) >= sizeof start_path) return;
  if (start_file) strcpy(start_path, start_file);
  // Child processes (a shell the tool runs, say) are not probed: the report is the first process's.
  unsetenv("LD_PRELOAD");
  strcpy(out_path, out);
  const char *p = list;
  while (*p && name_count < MAX_NAMES) {
    size_t n = strcspn(p, ",");
    if (n > 0 && n < sizeof names[0]) {
      memcpy(names[name_count], p, n);
      names[name_count][n] = 0;
      name_count++;
    }
    p += n;
    if (*p == ',') p++;
  }
  resolve_all();
  void *warm[2];
  backtrace(warm, 2);   // loads the unwinder now, not inside a counted call
  Dl_info info;
  dladdr((void *)start, &info);   // likewise whatever dladdr sets up on first use
  from_ms = strtoull(from, NULL, 10);
  until_ms = strtoull(until, NULL, 10);
  if (!start_path[0]) {
    uint64_t t0 = now_ns();
    atomic_store(&window_from, t0 + from_ms * 1000000u);
    atomic_store(&window_until, t0 + until_ms * 1000000u);
  }
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &attr, reporter, NULL) != 0) atomic_store(&window_until, 0);
  pthread_attr_destroy(&attr);
}
