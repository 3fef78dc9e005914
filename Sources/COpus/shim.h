#include <opus/opus.h>

// opus_encoder_ctl and opus_decoder_ctl are variadic, which Swift cannot call: one typed wrapper per request used.
static inline int pm_opus_set_bitrate(OpusEncoder *st, opus_int32 bps) { return opus_encoder_ctl(st, OPUS_SET_BITRATE(bps)); }
static inline int pm_opus_set_complexity(OpusEncoder *st, opus_int32 c) { return opus_encoder_ctl(st, OPUS_SET_COMPLEXITY(c)); }
static inline int pm_opus_set_inband_fec(OpusEncoder *st, opus_int32 on) { return opus_encoder_ctl(st, OPUS_SET_INBAND_FEC(on)); }
static inline int pm_opus_set_packet_loss_perc(OpusEncoder *st, opus_int32 p) { return opus_encoder_ctl(st, OPUS_SET_PACKET_LOSS_PERC(p)); }
static inline int pm_opus_get_lookahead(OpusEncoder *st, opus_int32 *out) { return opus_encoder_ctl(st, OPUS_GET_LOOKAHEAD(out)); }
static inline int pm_opus_decoder_reset(OpusDecoder *st) { return opus_decoder_ctl(st, OPUS_RESET_STATE); }
