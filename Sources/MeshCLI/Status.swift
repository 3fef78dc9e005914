import Dispatch
import FoundationEssentials
import Glibc
import MeshAudio
import MeshPOSIX
import MeshRelay
import PeerMesh

/// Turns relay statistics into the live status line (stderr, terminals only) and `--json` objects (stdout), as
/// documented field by field in docs/STATUS.md. Remote names are escaped before they reach a terminal.
package enum StatusReport {
    /// dBFS of a linear peak (−∞ as −120); a value that is not finite (a hostile stream) is clamped, never trapped on.
    package static func dbfs(_ peak: Float) -> Double {
        guard peak.isFinite, peak > 0 else { return peak.isFinite ? -120 : 0 }
        return max(-120, min(0, 20 * log10(Double(min(peak, 1)))))
    }

    /// A 20-step dBFS bar from −60 to 0 dBFS with a peak-hold mark: `[########·····|····]`.
    package static func meter(level: Float, hold: Float) -> String {
        func steps(_ p: Float) -> Int { max(0, min(20, Int(((dbfs(p) + 60) / 3).rounded(.down)))) }
        let n = steps(level), h = steps(hold)
        var bar = ""
        for i in 0..<20 {
            if i < n { bar += "#" } else if i == h - 1 && h > n { bar += "|" } else { bar += "·" }
        }
        return "[" + bar + "] " + (dbfs(level) <= -60 ? " -∞" : String(Int(dbfs(level).rounded()))) + " dBFS"
    }

    private static func ms(_ v: Double?) -> String {
        guard let v, v.isFinite else { return "–" }
        return JSONObject.number(v) + " ms"
    }

    /// An ISO-8601 UTC timestamp with milliseconds (without Foundation's formatter, which pages in ICU's data).
    package static func timestamp() -> String { WallClock.iso8601() }

    /// `date` as an ISO-8601 UTC timestamp with milliseconds.
    package static func timestamp(_ date: Date) -> String {
        let t = date.timeIntervalSince1970
        let whole = t.rounded(.down)
        return WallClock.iso8601(seconds: Int(whole), milliseconds: min(999, Int((t - whole) * 1000)))
    }

    // MARK: Host

    /// The host's status line; `keys`, when given, are listed at its end.
    package static func line(host s: RelayHost.Statistics, format: AudioFormat, hold: Float, keys: [String] = []) -> String {
        let players = s.players.isEmpty ? "waiting for players" : "serving \(s.players.count) player\(s.players.count == 1 ? "" : "s")"
        var parts = ["● \(players)"]
        if s.pairing { parts.append("pairing open") }
        if !s.advertised { parts.append("not advertised") }
        if s.muted { parts.append("MUTED") }
        let paused = s.players.filter(\.paused).count
        if paused > 0 { parts.append("\(paused) paused") }
        if let t = s.players.first(where: \.talking) { parts.append("◀ \(TerminalText.escape(t.name)) talks") }
        switch s.capture {
        case .off, .armed: break
        case .recording: parts.append("● REC clip")
        case .saved(let n): parts.append("clip saved \(TerminalText.escape(n))")
        case .failed(let r): parts.append("clip failed: \(TerminalText.escape(r))")
        }
        parts += ["capture \(ms(format.milliseconds(frames: s.captureDelayFrames)))", "xruns \(s.captureXruns)",
                  meter(level: s.peakLevel, hold: hold)]
        if !keys.isEmpty { parts.append("keys: " + keys.joined(separator: " · ")) }
        return parts.joined(separator: " | ")
    }

    package static func json(host s: RelayHost.Statistics, name: String, port: UInt16, format: AudioFormat,
                             final: Bool = false, extra: (inout JSONObject) -> Void = { _ in }) -> JSONObject {
        var o = JSONObject()
        o.add("ts", timestamp())
        o.add("role", "host")
        o.add("name", name)
        o.add("port", Int(port))
        o.add("advertised", s.advertised)
        o.add("pairing", s.pairing)
        o.add("muted", s.muted)
        o.add("players", s.players.map { p in
            var j = JSONObject()
            j.add("name", p.name)
            j.add("paired", p.pairedName != nil)
            j.add("callsItself", p.callsItself)
            j.add("address", p.address)
            j.add("fingerprint", p.fingerprint)
            j.add("paused", p.paused)
            j.add("talking", p.talking)
            j.add("droppedCommands", p.droppedCommands)
            j.add("refusedClips", p.refusedClips)
            return j
        })
        o.add("playerCount", s.players.count)
        o.add("packetsSent", s.packetsSent)
        o.add("framesCaptured", s.framesCaptured)
        o.add("captureDelayMs", format.milliseconds(frames: s.captureDelayFrames))
        o.add("xruns", s.captureXruns)
        o.add("overrunMs", format.milliseconds(frames: Int(clamping: s.captureOverrunFrames)))
        o.add("capture", s.capture.description)
        o.add("controlCommands", s.controlCommands)
        o.add("malformedControl", s.malformedControl)
        o.add("droppedControl", s.droppedControl)
        o.add("refusedClips", s.refusedClips)
        o.add("unadmittedHandshakes", s.unadmittedHandshakes)
        o.add("rationedConnections", s.rationedConnections)
        o.add("peakDbfs", dbfs(s.peakLevel))
        o.add("rmsDbfs", dbfs(s.rmsLevel))
        o.add("rate", format.sampleRate)
        o.add("channels", format.channels)
        o.add("codec", s.codec.description)
        extra(&o)
        if final { o.add("final", true) }
        return o
    }

    // MARK: Player

    package static func phase(_ p: JoinStateMachine.Phase) -> String {
        switch p {
        case .searching: "searching"
        case .joining(let h): "joining \(TerminalText.escape(h))"
        case .joined(let h): "joined \(TerminalText.escape(h))"
        case .stopped: "stopped"
        }
    }

    /// The player's status line; `keys`, when given, are listed at its end (`keys: p pause · m mute …`).
    package static func line(player s: RelayPlayer.Statistics, hold: Float, extra: [String] = [], keys: [String] = []) -> String {
        let p = s.playout
        var parts = ["▶ \(phase(s.phase))", "mouth-to-ear \(ms(s.mouthToEarMilliseconds))", "jitter \(ms(p.jitterMilliseconds))",
                     "loss \(JSONObject.number(p.lossPercent))%", "concealed \(ms(s.concealedMilliseconds))",
                     "drift \(JSONObject.number(p.driftPPM)) ppm", "xruns \(s.device.xruns)"]
        if s.hostControl?.paused == true { parts.insert("PAUSED", at: 1) }
        if s.hostControl?.muted == true { parts.append("host muted") }
        if s.talking { parts.insert("◀ TALKING", at: 1) }
        parts.append(s.muted ? "MUTED" : "vol \(JSONObject.number(s.volumeDB)) dB")
        parts += extra
        parts.append(meter(level: p.peakLevel, hold: hold))
        if !keys.isEmpty { parts.append("keys: " + keys.joined(separator: " · ")) }
        return parts.joined(separator: " | ")
    }

    package static func json(player s: RelayPlayer.Statistics, final: Bool = false,
                             extra: (inout JSONObject) -> Void = { _ in }) -> JSONObject {
        let p = s.playout
        var o = JSONObject()
        o.add("ts", timestamp())
        o.add("role", "player")
        o.add("state", phase(s.phase))
        o.add("host", s.hostName)
        o.add("hostFingerprint", s.host?.publicKey?.shortFingerprint)
        o.add("mouthToEarMs", s.mouthToEarMilliseconds)
        o.add("rttMs", s.roundTripMilliseconds)
        o.add("bufferMs", p.bufferedMilliseconds)
        o.add("targetMs", p.targetMilliseconds)
        o.add("steadyLatencyMs", p.steadyLatencyMilliseconds)
        o.add("hostLatencyMs", p.hostLatencyMilliseconds)
        o.add("jitterMs", p.jitterMilliseconds)
        o.add("lossPercent", p.lossPercent)
        o.add("concealedMs", s.concealedMilliseconds)
        o.add("waitingMs", s.waitingMilliseconds)
        o.add("driftPpm", p.driftPPM)
        o.add("resampling", p.resampling)
        o.add("xruns", s.device.xruns)
        o.add("received", p.received)
        o.add("late", p.late)
        o.add("lateResumes", p.lateResumes)
        o.add("duplicates", p.duplicates)
        o.add("lostPackets", p.lostPackets)
        o.add("concealedFrames", s.concealedFrames)
        o.add("underruns", p.underruns)
        o.add("malformed", p.malformed)
        o.add("stalePackets", p.stalePackets)
        o.add("undecodedPackets", p.undecodedPackets)
        o.add("sanitizedSamples", s.sanitizedSamples)
        o.add("stretchedFrames", p.stretchedFrames)
        o.add("skippedFrames", p.skippedFrames)
        o.add("playedFrames", s.device.framesOut)
        o.add("receivedFrames", s.framesReceived)
        o.add("receivedMs", Double(s.framesReceived) * 1000 / Double(s.format.sampleRate))
        o.add("firstAudioMs", s.firstAudioSeconds.map { $0 * 1000 })
        o.add("datagrams", s.datagrams)
        o.add("codec", p.wire.encoding?.description)
        o.add("audioBytes", p.wire.queuedBytes)
        o.add("strangerDatagrams", s.strangerDatagrams)
        o.add("unauthenticDatagrams", s.unauthenticDatagrams)
        o.add("paused", s.hostControl?.paused ?? false)
        o.add("pausedMs", s.pausedMilliseconds)
        o.add("volumeDb", s.volumeDB)
        o.add("muted", s.muted)
        o.add("hostMuted", s.hostControl?.muted ?? false)
        o.add("capture", s.hostControl?.capture.description)
        o.add("hostControl", s.hostControl != nil)
        o.add("talking", s.talking)
        o.add("talkPacketsSent", s.talkPacketsSent)
        o.add("malformedControl", s.malformedControl)
        o.add("peakDbfs", dbfs(p.peakLevel))
        o.add("rate", s.format.sampleRate)
        o.add("channels", s.format.channels)
        extra(&o)
        if final { o.add("final", true) }
        return o
    }
}

/// A peak-hold level for the meter: holds the highest level for two seconds, then follows the signal down.
package final class PeakHold: @unchecked Sendable { // touched only by the one status queue that owns it
    private var held: Float = 0
    private var heldAt = Date.distantPast

    package init() {}

    /// The level to mark for this reading.
    package func update(_ level: Float) -> Float {
        let now = Date()
        let v = level.isFinite ? min(max(level, 0), 1) : 1
        if v >= held || now.timeIntervalSince(heldAt) > 2 {
            held = v
            heldAt = now
        }
        return held
    }
}

/// A CLI's once-a-second status report: a timer on its own serial queue, handing the report a `PeakHold` that only
/// that queue touches. Started by `init`; `cancel()` stops it.
package final class StatusTicker: @unchecked Sendable { // the timer is set up once in init and only cancelled after
    private let timer: DispatchSourceTimer

    package init(label: String, report: @escaping @Sendable (PeakHold) -> Void) {
        let hold = PeakHold()
        timer = DispatchSource.makeTimerSource(queue: DispatchQueue(label: label))
        timer.schedule(deadline: .now() + 1, repeating: 1)
        timer.setEventHandler { report(hold) }
        timer.resume()
    }

    /// Stops the reports (one in progress finishes).
    package func cancel() { timer.cancel() }
}
