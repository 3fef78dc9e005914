// rt_alloc_probe.c — an LD_PRELOAD library that checks the real-time rule "no allocation on the audio threads":
// it counts the heap calls (malloc, calloc, realloc, free, and the aligned allocators) made by threads with given
// names inside a time window, and writes a report when the window closes.
//
// Built and used by Tests/MeshRelayTests/RealTimeAllocationTests.swift:
//   clang -shared -fPIC -O2 -ftls-model=initial-exec -o probe.so scripts/lib/rt_alloc_probe.c
//   LD_PRELOAD=probe.so PM_RT_PROBE_THREADS=pm-playback,pm-io PM_RT_PROBE_FROM_MS=1000 \
//     PM_RT_PROBE_UNTIL_MS=5000 PM_RT_PROBE_OUT=report.txt [PM_RT_PROBE_START_FILE=playing] mesh-play …
//
// The window is measured from the moment PM_RT_PROBE_START_FILE appears (the test makes it once the stream plays;
// the probe looks every 10 ms), or else from the moment the library is loaded (process start). The report, written
// by a thread of the probe's own at the window's end, has one line per watched name:
//   thread pm-playback live=1 calls=0
// (`live`: a thread of that name existed at the window's end, from /proc/self/task/*/comm), then, for the first
// few counted calls of each name, their stacks (backtrace_symbols_fd), so that a failure says where the allocation
// came from.
//
// It forwards every call to glibc's own allocator (__libc_malloc and friends), so it changes nothing else.
#define _GNU_SOURCE
#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

#define MAX_NAMES 8
#define MAX_STACKS 3   // per watched name
#define STACK_DEPTH 24

static char names[MAX_NAMES][16];
static int name_count;
static atomic_ulong calls[MAX_NAMES];
static uint64_t from_ms, until_ms;            // the window, after its start event
static _Atomic uint64_t window_from, window_until;   // monotonic ns; window_until 0: not counting (yet)
static char out_path[4096], start_path[4096];

static void *stacks[MAX_NAMES][MAX_STACKS][STACK_DEPTH];
static int stack_depths[MAX_NAMES][MAX_STACKS];
static const char *stack_calls[MAX_NAMES][MAX_STACKS];
static atomic_int stacks_taken[MAX_NAMES];
static atomic_int stack_ready[MAX_NAMES][MAX_STACKS];   // the slot is written whole (the reporter may run meanwhile)

// Initial-exec TLS whatever the build flags: dynamic TLS would go through __tls_get_addr, which may itself allocate
// (after a dlopen of a library with TLS) and so re-enter the probe.
#define PROBE_TLS __thread __attribute__((tls_model("initial-exec")))
static PROBE_TLS int inside;          // this thread is in the probe already (backtrace may call the allocator)
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

static void note(const char *call) {
  if (inside) return;
  uint64_t until = atomic_load_explicit(&window_until, memory_order_acquire);
  if (until == 0) return;
  uint64_t now = now_ns();
  if (now < atomic_load_explicit(&window_from, memory_order_relaxed) || now >= until) return;
  int i = index_of_current_thread(now);
  if (i < 0) return;
  atomic_fetch_add(&calls[i], 1);
  int slot = atomic_fetch_add(&stacks_taken[i], 1);
  if (slot < MAX_STACKS) {
    inside = 1;
    stack_calls[i][slot] = call;
    stack_depths[i][slot] = backtrace(stacks[i][slot], STACK_DEPTH);
    atomic_store_explicit(&stack_ready[i][slot], 1, memory_order_release);
    inside = 0;
  }
}

void *malloc(size_t n) { note("malloc"); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { note("calloc"); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { note("realloc"); return __libc_realloc(p, n); }
void free(void *p) { if (p) note("free"); __libc_free(p); }
void *aligned_alloc(size_t a, size_t n) { note("aligned_alloc"); return __libc_memalign(a, n); }
void *memalign(size_t a, size_t n) { note("memalign"); return __libc_memalign(a, n); }
int posix_memalign(void **p, size_t a, size_t n) {
  note("posix_memalign");
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
  char line[128];
  for (int i = 0; i < name_count; i++) {
    snprintf(line, sizeof line, "thread %s live=%d calls=%lu\n", names[i], live(names[i]), atomic_load(&calls[i]));
    say(fd, line);
  }
  for (int i = 0; i < name_count; i++) {
    int taken = atomic_load(&stacks_taken[i]);
    for (int s = 0; s < taken && s < MAX_STACKS; s++) {
      if (!atomic_load_explicit(&stack_ready[i][s], memory_order_acquire)) continue;
      snprintf(line, sizeof line, "stack %d: %s on %s\n", s, stack_calls[i][s], names[i]);
      say(fd, line);
      backtrace_symbols_fd(stacks[i][s], stack_depths[i][s], fd);
    }
  }
  close(fd);
  rename(tmp, out_path);   // the report appears whole
  return NULL;
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
  void *warm[2];
  backtrace(warm, 2);   // loads the unwinder now, not inside a counted call
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
