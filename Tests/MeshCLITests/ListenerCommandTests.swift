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
