#ifndef PEERMESH_COPUS_SHIM_H
#define PEERMESH_COPUS_SHIM_H
// libopus: the `--codec opus` encoder and the player's decoder. MeshPipeline loads it when the first Opus encoder or
// decoder is made (dlopen), so a process whose audio travels as PCM — the default — does not map it; these are the
// types of the entry points it resolves (dlsym), from libopus's own declarations.
#include <opus/opus.h>

typedef __typeof__(&opus_strerror) pm_opus_strerror_fn;
typedef __typeof__(&opus_encoder_create) pm_opus_encoder_create_fn;
typedef __typeof__(&opus_encoder_destroy) pm_opus_encoder_destroy_fn;
typedef __typeof__(&opus_encoder_ctl) pm_opus_encoder_ctl_fn;
typedef __typeof__(&opus_encode_float) pm_opus_encode_float_fn;
typedef __typeof__(&opus_decoder_create) pm_opus_decoder_create_fn;
typedef __typeof__(&opus_decoder_destroy) pm_opus_decoder_destroy_fn;
typedef __typeof__(&opus_decoder_ctl) pm_opus_decoder_ctl_fn;
typedef __typeof__(&opus_decode_float) pm_opus_decode_float_fn;

// opus_encoder_ctl and opus_decoder_ctl are variadic, which Swift can neither call nor type: one typed wrapper per
// request used, each taking the entry point that was resolved, as an untyped pointer.
static inline int pm_opus_set_bitrate(const void *ctl, OpusEncoder *st, opus_int32 bps) { return ((pm_opus_encoder_ctl_fn)ctl)(st, OPUS_SET_BITRATE(bps)); }
static inline int pm_opus_set_complexity(const void *ctl, OpusEncoder *st, opus_int32 c) { return ((pm_opus_encoder_ctl_fn)ctl)(st, OPUS_SET_COMPLEXITY(c)); }
static inline int pm_opus_set_inband_fec(const void *ctl, OpusEncoder *st, opus_int32 on) { return ((pm_opus_encoder_ctl_fn)ctl)(st, OPUS_SET_INBAND_FEC(on)); }
static inline int pm_opus_set_packet_loss_perc(const void *ctl, OpusEncoder *st, opus_int32 p) { return ((pm_opus_encoder_ctl_fn)ctl)(st, OPUS_SET_PACKET_LOSS_PERC(p)); }
static inline int pm_opus_get_lookahead(const void *ctl, OpusEncoder *st, opus_int32 *out) { return ((pm_opus_encoder_ctl_fn)ctl)(st, OPUS_GET_LOOKAHEAD(out)); }
static inline int pm_opus_decoder_reset(const void *ctl, OpusDecoder *st) { return ((pm_opus_decoder_ctl_fn)ctl)(st, OPUS_RESET_STATE); }
#endif
