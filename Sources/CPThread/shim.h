// The pthread GNU extensions Glibc's Swift module leaves out (glibc declares them only under _GNU_SOURCE).
#include <pthread.h>

// Names `thread` (at most 15 bytes and the NUL) as `top -H`, `ps -L` and debuggers show it.
extern int pthread_setname_np(pthread_t thread, const char *name);
