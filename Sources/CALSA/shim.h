#include <alsa/asoundlib.h>
#include <stdarg.h>
#include <stdio.h>

// ALSA's library messages ("Unknown PCM nosuch", …) go through snd_lib_error_set_handler, whose handler is a C
// variadic function: Swift cannot define one, so it lives here. It never prints: it formats each message into a
// small preallocated ring (no allocation, no lock; safe on any thread), from which MeshAudio's ALSA.swift — the only
// Swift file that calls these — takes the text into its own errors. Being `static`, the ring exists once in the one
// object file that uses it.
#define PM_ALSA_MESSAGE_SLOTS 8
#define PM_ALSA_MESSAGE_BYTES 256
// (Function-local statics: Swift's importer emits the functions of a header, not its file-scope variables.)
static inline char *pm_alsa_slot(unsigned n) {
    static char ring[PM_ALSA_MESSAGE_SLOTS][PM_ALSA_MESSAGE_BYTES];
    return ring[n % PM_ALSA_MESSAGE_SLOTS];
}
static inline unsigned *pm_alsa_counter(void) {
    static unsigned count;
    return &count;
}

static void pm_alsa_error_handler(const char *file, int line, const char *function, int err, const char *fmt, ...) {
    (void)file; (void)line; (void)function; (void)err;
    unsigned n = __atomic_fetch_add(pm_alsa_counter(), 1, __ATOMIC_ACQ_REL);
    char *slot = pm_alsa_slot(n);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(slot, PM_ALSA_MESSAGE_BYTES, fmt, ap);
    va_end(ap);
}

/// Routes ALSA's library messages into the ring instead of stderr.
static inline void pm_alsa_capture_messages(void) { snd_lib_error_set_handler(pm_alsa_error_handler); }

/// How many messages ALSA has reported so far.
static inline unsigned pm_alsa_message_total(void) { return __atomic_load_n(pm_alsa_counter(), __ATOMIC_ACQUIRE); }

/// Message number `n` (valid while fewer than PM_ALSA_MESSAGE_SLOTS newer ones have arrived).
static inline const char *pm_alsa_message(unsigned n) { return pm_alsa_slot(n); }
