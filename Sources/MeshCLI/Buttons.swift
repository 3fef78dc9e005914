import FoundationEssentials
import MeshPOSIX
import MeshRelay
#if canImport(Glibc)
import Glibc
#endif

/// Headset and media buttons for mesh-play (`--buttons /dev/input/eventN`), as capture events are on phones:
/// play/pause pauses or resumes, a long press of play captures a clip, the volume keys step the volume by 3 dB
/// (repeating while held), and the mic-mute key toggles talk.
///
/// A pure decoder of Linux input events (`struct input_event`: a 16-byte `timeval`, then `u16 type`, `u16 code`,
/// `s32 value`, on 64-bit Linux). It takes bytes in any split and keys its long press on the events' own
/// timestamps, so tests run it in virtual time.
package struct ButtonDecoder: Sendable {
    /// `sizeof(struct input_event)` on 64-bit Linux.
    package static let eventSize = 24
    /// A press of play held this long is a long press (capture), not a pause.
    package static let longPressMicroseconds: Int64 = 800_000

    static let evKey: UInt16 = 1
    /// Linux key codes (`linux/input-event-codes.h`).
    package enum Key: UInt16, Sendable {
        case mute = 113, volumeDown = 114, volumeUp = 115, playPause = 164, play = 207, pause = 119
        case playCD = 200, pauseCD = 201, micMute = 248
    }

    private var pending: [UInt8] = []
    /// When play went down (event time, µs), while it is held.
    private var playDown: Int64?

    package init() {}

    /// Feeds bytes read from the device; returns the commands they complete, in order.
    package mutating func feed(_ bytes: some Collection<UInt8>) -> [ListenerCommand] {
        pending += bytes
        var out: [ListenerCommand] = []
        var at = 0
        while pending.count - at >= Self.eventSize {
            let e = Array(pending[at..<(at + Self.eventSize)])
            at += Self.eventSize
            func le<T: FixedWidthInteger>(_ offset: Int, _: T.Type) -> T {
                var v: T = 0
                for i in 0..<MemoryLayout<T>.size { v |= T(truncatingIfNeeded: e[offset + i]) << (8 * i) }
                return v
            }
            let seconds = le(0, Int64.self), micros = le(8, Int64.self)
            let type = le(16, UInt16.self), code = le(18, UInt16.self), value = le(20, Int32.self)
            guard type == Self.evKey, let key = Key(rawValue: code) else { continue }
            let time = seconds &* 1_000_000 &+ micros
            if let c = event(key, value: value, time: time) { out.append(c) }
        }
        pending.removeFirst(at)
        return out
    }

    /// One key event: value 1 pressed, 0 released, 2 repeated (held).
    private mutating func event(_ key: Key, value: Int32, time: Int64) -> ListenerCommand? {
        switch key {
        case .playPause, .play, .pause, .playCD, .pauseCD:
            if value == 1 {
                if playDown == nil { playDown = time }
                return nil
            }
            guard value == 0, let down = playDown else { return nil }
            playDown = nil
            return time &- down >= Self.longPressMicroseconds ? .remote(.capture(.single, .primary)) : .togglePause
        case .volumeUp, .volumeDown:
            guard value == 1 || value == 2 else { return nil }
            return .volumeStep(key == .volumeUp ? 3 : -3)
        case .micMute:
            return value == 1 ? .toggleTalk : nil
        case .mute:
            return value == 1 ? .toggleMute : nil
        }
    }

    /// One event's bytes, for tests and tools that synthesize them.
    package static func event(seconds: Int64, microseconds: Int64, code: UInt16, value: Int32) -> [UInt8] {
        func le<T: FixedWidthInteger>(_ v: T) -> [UInt8] { (0..<MemoryLayout<T>.size).map { UInt8(truncatingIfNeeded: v >> (8 * $0)) } }
        return le(seconds) + le(microseconds) + le(evKey) + le(code) + le(value)
    }
}

/// Reads `--buttons PATH` (an input device, or a FIFO in tests) on a thread of its own and hands each command on.
package final class ButtonReader: Sendable {
    /// Checks that `path` can be opened (throws with the system's reason), then reads it on its own thread: a FIFO
    /// waits there for its writer, never here. End of input ends the reader.
    package init(path: String, onCommand: @escaping @Sendable (ListenerCommand) -> Void) throws {
        try Self.check(path)
        OSThread.detach(name: "pm-buttons") {
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { return }
            var decoder = ButtonDecoder()
            var buffer = [UInt8](repeating: 0, count: ButtonDecoder.eventSize * 16)
            while true {
                let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if n < 0, errno == EINTR { continue }
                guard n > 0 else { break }
                for c in decoder.feed(buffer[0..<n]) { onCommand(c) }
            }
            close(fd)
        }
    }

    /// Throws, with the system's reason and what to do, when `path` cannot be opened for reading.
    package static func check(_ path: String) throws {
        let probe = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard probe >= 0 else {
            let why = String(cString: strerror(errno)).lowercased()
            throw CommandLineError("--buttons \(path): cannot open: \(why) (an input device is /dev/input/eventN; reading it needs the input group)")
        }
        close(probe)
    }
}
