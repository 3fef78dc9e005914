/*
 * minimal_relay — the least a mono float relay can do per period, as a physical baseline for scripts/bench.
 *
 *   minimal_relay send DEVICE PORT   capture 44.1 kHz mono FLOAT_LE, period 128 / buffer 512, from DEVICE;
 *                                    one blocking snd_pcm_readi + one sendto(127.0.0.1:PORT) per period
 *   minimal_relay recv DEVICE PORT   one poll + recvfrom on 127.0.0.1:PORT + one snd_pcm_writei per packet,
 *                                    playing on DEVICE
 *
 * No jitter buffer, no encryption, no concealment, no drift control: it only shows what one process costs on this
 * machine when it wakes once per period (ALSA and its jack plugin included), so the figures of mesh-record and
 * mesh-play can be read against it (issue 15: "the CPU cost of one poll + recvfrom + snd_pcm_writei per period
 * in a minimal C loop, measured here"). It runs until killed. Traffic goes to 127.0.0.1 only.
 */
#include <alsa/asoundlib.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { RATE = 44100, PERIOD = 128, BUFFER = 512 };

static snd_pcm_t *open_pcm(const char *device, snd_pcm_stream_t stream) {
    snd_pcm_t *pcm = NULL;
    int err = snd_pcm_open(&pcm, device, stream, 0);
    if (err < 0) { fprintf(stderr, "minimal_relay: %s: %s\n", device, snd_strerror(err)); exit(1); }
    snd_pcm_hw_params_t *hw;
    snd_pcm_hw_params_alloca(&hw);
    snd_pcm_hw_params_any(pcm, hw);
    snd_pcm_hw_params_set_access(pcm, hw, SND_PCM_ACCESS_RW_INTERLEAVED);
    snd_pcm_hw_params_set_format(pcm, hw, SND_PCM_FORMAT_FLOAT_LE);
    snd_pcm_hw_params_set_channels(pcm, hw, 1);
    unsigned rate = RATE;
    snd_pcm_hw_params_set_rate_near(pcm, hw, &rate, NULL);
    snd_pcm_uframes_t period = PERIOD, buffer = BUFFER;
    snd_pcm_hw_params_set_period_size_near(pcm, hw, &period, NULL);
    snd_pcm_hw_params_set_buffer_size_near(pcm, hw, &buffer);
    if ((err = snd_pcm_hw_params(pcm, hw)) < 0) {
        fprintf(stderr, "minimal_relay: %s: hw params: %s\n", device, snd_strerror(err));
        exit(1);
    }
    return pcm;
}

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[1], "send") && strcmp(argv[1], "recv"))) {
        fprintf(stderr, "usage: minimal_relay send|recv DEVICE PORT\n");
        return 2;
    }
    int port = atoi(argv[3]);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in addr = loopback(port);
    float samples[PERIOD];
    if (!strcmp(argv[1], "send")) {
        snd_pcm_t *pcm = open_pcm(argv[2], SND_PCM_STREAM_CAPTURE);
        for (;;) {
            snd_pcm_sframes_t n = snd_pcm_readi(pcm, samples, PERIOD);
            if (n < 0) { snd_pcm_recover(pcm, (int)n, 1); continue; }
            sendto(fd, samples, (size_t)n * sizeof(float), 0, (struct sockaddr *)&addr, sizeof addr);
        }
    }
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0) { perror("minimal_relay: bind"); return 1; }
    snd_pcm_t *pcm = open_pcm(argv[2], SND_PCM_STREAM_PLAYBACK);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (;;) {
        if (poll(&p, 1, -1) < 0 && errno != EINTR) { perror("minimal_relay: poll"); return 1; }
        ssize_t got = recvfrom(fd, samples, sizeof samples, 0, NULL, NULL);
        if (got <= 0) continue;
        snd_pcm_sframes_t n = snd_pcm_writei(pcm, samples, (snd_pcm_uframes_t)got / sizeof(float));
        if (n < 0) snd_pcm_recover(pcm, (int)n, 1);
    }
}
