import Testing
import MeshRelay
@testable import MeshCLI

/// mesh-play's stdin commands and keys, and the control flags of both CLIs.
struct ListenerCommandTests {
    @Test func linesBecomeCommands() throws {
        let cases: [(String, ListenerCommand)] = [
            ("pause", .remote(.pause)), ("  resume ", .remote(.resume)), ("MUTE", .mute(true)), ("unmute", .mute(false)),
            ("volume -6", .volume(-6)), ("volume 12", .volume(12)), ("capture", .remote(.capture(.single, .primary))),
            ("capture begin", .remote(.capture(.begin, .primary))), ("capture end", .remote(.capture(.end, .primary))),
            ("capture cancel", .remote(.capture(.cancel, .primary))),
            ("capture secondary", .remote(.capture(.single, .secondary))), ("talk on", .remote(.talk(true))),
            ("talk off\r", .remote(.talk(false))),
        ]
        for (line, expected) in cases {
            #expect(try ListenerCommand.parse(line)?.get() == expected, "\(line)")
        }
        #expect(ListenerCommand.parse("") == nil && ListenerCommand.parse("   ") == nil)
    }

    @Test func badLinesSayWhy() {
        for (line, words) in [("jump", "unknown command \"jump\""), ("volume", "volume takes dB"), ("volume 13", "-60…12"),
                              ("volume nan", "volume takes dB"), ("capture now", "capture takes begin"), ("talk", "talk takes on or off"),
                              ("pause now", "pause takes nothing")] {
            guard case .failure(let e)? = ListenerCommand.parse(line) else { Issue.record("\(line) parsed"); continue }
            #expect(e.description.contains(words), "\(line): \(e)")
        }
    }

    @Test func keys() {
        #expect(ListenerCommand.key(UInt8(ascii: " ")) == .toggleTalk)
        #expect(ListenerCommand.key(UInt8(ascii: "p")) == .togglePause)
        #expect(ListenerCommand.key(UInt8(ascii: "m")) == .toggleMute)
        #expect(ListenerCommand.key(UInt8(ascii: "+")) == .volumeStep(3))
        #expect(ListenerCommand.key(UInt8(ascii: "-")) == .volumeStep(-3))
        #expect(ListenerCommand.key(UInt8(ascii: "c")) == .remote(.capture(.single, .primary)))
        #expect(ListenerCommand.key(UInt8(ascii: "x")) == nil && ListenerCommand.key(0x1b) == nil)
    }

    @Test func flags() throws {
        guard case .run(let p) = try PlayOptions.parse(["--find", "--volume", "-12", "--no-beep"]) else { Issue.record("no config"); return }
        #expect(p.volume == -12 && !p.beep)
        guard case .run(let d) = try PlayOptions.parse(["--find"]) else { Issue.record("no config"); return }
        #expect(d.volume == 0 && d.beep)
        #expect(throws: UsageError.self) { _ = try PlayOptions.parse(["--find", "--volume", "20"]) }
        guard case .run(let r) = try RecordOptions.parse(["--host", "--clips", "/tmp/c", "--clip-preroll", "5", "--clip-length", "3"])
        else { Issue.record("no config"); return }
        #expect(r.clips == "/tmp/c" && r.clipPreroll == 5 && r.clipLength == 3)
        guard case .run(let rd) = try RecordOptions.parse(["--host"]) else { Issue.record("no config"); return }
        #expect(rd.clips == nil && rd.clipPreroll == 10 && rd.clipLength == 10)
        #expect(throws: UsageError.self) { _ = try RecordOptions.parse(["--host", "--clip-length", "0"]) }
    }
}

/// Headset and media buttons: Linux input events, in virtual time.
struct ButtonDecoderTests {
    static func key(_ t: Double, _ code: ButtonDecoder.Key, _ value: Int32) -> [UInt8] {
        ButtonDecoder.event(seconds: Int64(t), microseconds: Int64((t - t.rounded(.down)) * 1e6), code: code.rawValue, value: value)
    }

    @Test func pressesBecomeCommands() {
        var d = ButtonDecoder()
        var bytes: [UInt8] = []
        bytes += Self.key(10.0, .playPause, 1) + Self.key(10.2, .playPause, 0)           // a click: pause/resume
        bytes += Self.key(11.0, .playPause, 1) + Self.key(11.3, .playPause, 2) + Self.key(12.0, .playPause, 0) // long: capture
        bytes += Self.key(13.0, .volumeDown, 1) + Self.key(13.3, .volumeDown, 2) + Self.key(13.4, .volumeDown, 0)
        bytes += Self.key(14.0, .volumeUp, 1) + Self.key(14.1, .volumeUp, 0)
        bytes += Self.key(15.0, .micMute, 1) + Self.key(15.5, .micMute, 0)
        bytes += Self.key(16.0, .mute, 1) + Self.key(16.1, .mute, 0)
        // A synchronization event between keys (EV_SYN) and an unknown key mean nothing.
        bytes += ButtonDecoder.event(seconds: 17, microseconds: 0, code: 0, value: 0).enumerated().map { $0.offset == 16 ? 0 : $0.element }
        bytes += ButtonDecoder.event(seconds: 17, microseconds: 0, code: 30, value: 1)
        #expect(d.feed(bytes) == [.togglePause, .remote(.capture(.single, .primary)), .volumeStep(-3), .volumeStep(-3),
                                  .volumeStep(3), .toggleTalk, .toggleMute])
    }

    @Test func eventsSplitAnywhereStillDecode() {
        var d = ButtonDecoder()
        let bytes = Self.key(1, .volumeUp, 1) + Self.key(2, .volumeUp, 1)
        var out: [ListenerCommand] = []
        for chunk in stride(from: 0, to: bytes.count, by: 5) { out += d.feed(bytes[chunk..<min(bytes.count, chunk + 5)]) }
        #expect(out == [.volumeStep(3), .volumeStep(3)])
        #expect(d.feed([1, 2, 3]) == [])
    }

    @Test func aReleaseWithoutAPressIsIgnored() {
        var d = ButtonDecoder()
        #expect(d.feed(Self.key(1, .playPause, 0)) == [])
        #expect(d.feed(Self.key(2, .playPause, 1) + Self.key(2.5, .playPause, 0)) == [.togglePause])
    }
}
