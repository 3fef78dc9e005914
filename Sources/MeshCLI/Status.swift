import Foundation
import MeshAudio
import MeshRelay
import PeerMesh

/// Turns relay statistics into the live status line (stderr, terminals only) and `--json` objects (stdout).
package enum StatusReport {
    /// A five-step level meter for a linear peak in 0…1 (−50 dBFS … 0 dBFS).
    package static func meter(_ peak: Float) -> String {
        let db = peak > 0 ? 20 * log10(Double(peak)) : -120
        let steps = max(0, min(5, Int(((db + 50) / 10).rounded(.up))))
        return "[" + String(repeating: "#", count: steps) + String(repeating: "-", count: 5 - steps) + "]"
    }

    private static func ms(_ v: Double?) -> String { v.map { String(format: "%.1f ms", $0) } ?? "–" }

    // MARK: Host

    package static func line(host s: RelayHost.Statistics, format: AudioFormat) -> String {
        let players = s.players.isEmpty ? "waiting for players" : "serving \(s.players.count) player\(s.players.count == 1 ? "" : "s")"
        return "● \(players) | capture \(ms(format.milliseconds(frames: s.captureDelayFrames))) | xruns \(s.captureXruns) | \(meter(s.peakLevel))"
    }

    package static func json(host s: RelayHost.Statistics, name: String, port: UInt16, format: AudioFormat) -> [String: Any] {
        [
            "role": "host", "name": name, "port": Int(port),
            "players": s.players.map(\.displayName), "playerCount": s.players.count,
            "packetsSent": s.packetsSent, "framesCaptured": s.framesCaptured,
            "captureDelayMs": format.milliseconds(frames: s.captureDelayFrames), "xruns": s.captureXruns,
            "peak": Double(s.peakLevel), "rms": Double(s.rmsLevel),
        ]
    }

    // MARK: Player

    package static func phase(_ p: JoinStateMachine.Phase) -> String {
        switch p {
        case .searching: "searching"
        case .joining(let h): "joining \(h)"
        case .joined(let h): "joined \(h)"
        case .stopped: "stopped"
        }
    }

    package static func line(player s: RelayPlayer.Statistics) -> String {
        let p = s.playout
        return "▶ \(phase(s.phase)) | mouth-to-ear \(ms(s.mouthToEarMilliseconds)) | jitter \(ms(p.jitterMilliseconds)) | "
            + String(format: "loss %.2f%% | concealed %.0f ms | drift %+.0f ppm | xruns %llu | ", p.lossPercent,
                     p.concealedMilliseconds, p.driftPPM, s.device.xruns) + meter(p.peakLevel)
    }

    package static func json(player s: RelayPlayer.Statistics) -> [String: Any] {
        let p = s.playout
        var o: [String: Any] = [
            "role": "player", "state": phase(s.phase), "host": s.host?.displayName ?? NSNull(),
            "mouthToEarMs": s.mouthToEarMilliseconds ?? NSNull(), "rttMs": s.roundTripMilliseconds ?? NSNull(),
            "bufferMs": p.bufferedMilliseconds, "targetMs": p.targetMilliseconds,
            "playoutLatencyMs": p.playoutLatencyMilliseconds, "hostLatencyMs": p.hostLatencyMilliseconds,
            "jitterMs": p.jitterMilliseconds, "lossPercent": p.lossPercent, "concealedMs": p.concealedMilliseconds,
            "driftPpm": p.driftPPM, "resampling": p.resampling, "xruns": s.device.xruns,
            "received": p.received, "late": p.late, "duplicates": p.duplicates, "lostPackets": p.lostPackets,
            "concealedFrames": p.concealedFrames, "underruns": p.underruns, "malformed": p.malformed,
            "stretchedFrames": p.stretchedFrames, "skippedFrames": p.skippedFrames,
            "steadyLatencyMs": p.steadyLatencyMilliseconds, "estimatedDriftPpm": p.estimatedDriftPPM,
            "playedFrames": s.device.framesOut, "receivedFrames": s.framesReceived,
            "receivedSeconds": Double(s.framesReceived) / Double(s.format.sampleRate), "datagrams": s.datagrams, "strangerDatagrams": s.strangerDatagrams,
            "peak": Double(p.peakLevel), "rate": s.format.sampleRate, "channels": s.format.channels,
        ]
        o["firstAudioSeconds"] = s.firstAudioSeconds ?? NSNull()
        return o
    }

    /// One JSON object as a line.
    package static func encode(_ object: [String: Any]) -> String {
        guard let d = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return "{}" }
        return String(decoding: d, as: UTF8.self)
    }
}
