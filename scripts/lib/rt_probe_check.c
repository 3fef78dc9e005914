// rt_probe_check.c — a known workload for scripts/lib/rt_probe.c, so that a test can hold the probe to exact counts
// (Tests/MeshRelayTests/RealTimeRuleTests.swift builds and runs it under the probe, watching the thread "pm-check").
//
// The workload's thread sets itself up and waits 300 ms under another name, so that none of that is counted whenever
// the probe's window (100 ms to 3 s after start, as the test sets it) opens; then, named pm-check, it makes, once each:
//   heap calls (2):  malloc, free;
//   waits (9):       pthread_mutex_lock twice, pthread_cond_timedwait, poll with a timeout on a pipe, poll with a
//                    timeout on no descriptor (a sleep), a write to a blocking pipe, a futex wait through syscall(),
//                    nanosleep, a sendto on a blocking UDP socket;
//   input waits (1): poll with a timeout on a UDP socket alone;
// and these, which are not waits: poll with a zero timeout, a write to a non-blocking pipe, a futex wake, a recv with
// MSG_DONTWAIT and a sendto on a non-blocking UDP socket. The main thread, not watched, takes the same lock meanwhile.
// Then the program waits until the report exists (argv[1]), at most 10 s, and exits 0.
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
// Called through volatile pointers, so that the compiler cannot pair and remove them.
static void *(*volatile allocate)(size_t) = malloc;
static void (*volatile release)(void *) = free;

static int udp_socket(int nonblocking, struct sockaddr_in *bound) {
  int fd = socket(AF_INET, SOCK_DGRAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t n = sizeof a;
  bind(fd, (struct sockaddr *)&a, sizeof a);
  getsockname(fd, (struct sockaddr *)bound, &n);
  return fd;
}

static void *workload(void *unused) {
  (void)unused;
  int pipe_fds[2], quiet[2];
  if (pipe(pipe_fds) != 0 || pipe(quiet) != 0) exit(3);
  struct sockaddr_in to;
  int udp = udp_socket(0, &to), udp_nonblocking = udp_socket(1, &to);
  struct timespec pause = {0, 300000000};
  nanosleep(&pause, NULL);   // in the window by then; the probe reads the name again after 50 ms
  prctl(PR_SET_NAME, "pm-check", 0, 0, 0);

  release(allocate(16));
  pthread_mutex_lock(&lock);
  pthread_mutex_unlock(&lock);
  struct timespec soon;
  clock_gettime(CLOCK_REALTIME, &soon);
  soon.tv_nsec += 1000000;
  if (soon.tv_nsec >= 1000000000) { soon.tv_sec++; soon.tv_nsec -= 1000000000; }
  pthread_mutex_lock(&lock);
  pthread_cond_timedwait(&never, &lock, &soon);
  pthread_mutex_unlock(&lock);
  struct pollfd on_pipe = {.fd = quiet[0], .events = POLLIN};
  poll(&on_pipe, 1, 1);
  poll(&on_pipe, 1, 0);
  struct pollfd nothing = {.fd = -1, .events = POLLIN};
  poll(&nothing, 1, 1);
  if (write(pipe_fds[1], "x", 1) != 1) exit(4);
  fcntl(pipe_fds[1], F_SETFL, O_NONBLOCK);
  if (write(pipe_fds[1], "x", 1) != 1) exit(4);
  uint32_t word = 1;
  syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);   // the word is not 0: returns at once
  syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
  struct timespec tick = {0, 1000000};
  nanosleep(&tick, NULL);
  struct pollfd on_udp = {.fd = udp, .events = POLLIN};
  poll(&on_udp, 1, 1);
  char byte = 0;
  recv(udp, &byte, 1, MSG_DONTWAIT);
  sendto(udp_nonblocking, "x", 1, 0, (struct sockaddr *)&to, sizeof to);
  sendto(udp, "x", 1, 0, (struct sockaddr *)&to, sizeof to);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  pthread_t t;
  if (pthread_create(&t, NULL, workload, NULL) != 0) return 3;
  struct timespec tick = {0, 10000000};
  for (int i = 0; i < 50; i++) {   // the lock, from a thread that is not watched
    pthread_mutex_lock(&lock);
    pthread_mutex_unlock(&lock);
    nanosleep(&tick, NULL);
  }
  pthread_join(t, NULL);
  for (int i = 0; i < 1000 && access(argv[1], F_OK) != 0; i++) nanosleep(&tick, NULL);
  return access(argv[1], F_OK) == 0 ? 0 : 1;
}
