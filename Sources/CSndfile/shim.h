#ifndef PEERMESH_CSNDFILE_SHIM_H
#define PEERMESH_CSNDFILE_SHIM_H
// libsndfile: sound files (WAV, FLAC, Ogg) for --input/--output, clips and talkback files. MeshAudio loads it when the
// first file is opened (dlopen), so a process that only uses devices does not map it and the codecs it pulls in;
// these are the types of the entry points it resolves (dlsym), from libsndfile's own declarations.
#include <sndfile.h>

typedef __typeof__(&sf_open) pm_sf_open_fn;
typedef __typeof__(&sf_open_fd) pm_sf_open_fd_fn;
typedef __typeof__(&sf_close) pm_sf_close_fn;
typedef __typeof__(&sf_strerror) pm_sf_strerror_fn;
typedef __typeof__(&sf_error) pm_sf_error_fn;
typedef __typeof__(&sf_error_number) pm_sf_error_number_fn;
typedef __typeof__(&sf_format_check) pm_sf_format_check_fn;
typedef __typeof__(&sf_command) pm_sf_command_fn;
typedef __typeof__(&sf_readf_float) pm_sf_readf_float_fn;
typedef __typeof__(&sf_writef_float) pm_sf_writef_float_fn;
typedef __typeof__(&sf_seek) pm_sf_seek_fn;
#endif
