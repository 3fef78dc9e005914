import Foundation
import PeerMesh
import Testing
@testable import MeshCLI

@Suite("Remote text printed safely")
struct EscapingTests {
    @Test func controlBidiAndEscapeSequencesBecomeVisible() {
        #expect(TerminalText.escape("kitchen") == "kitchen")
        #expect(TerminalText.escape("Küche 🎤") == "Küche 🎤")
        #expect(TerminalText.escape("\u{1b}[2K\ralice") == "\\x1b[2K\\x0dalice")
        #expect(TerminalText.escape("a\u{202e}evil") == "a\\u{202e}evil")
        #expect(TerminalText.escape("tab\tnul\u{0}del\u{7f}c1\u{9b}") == "tab\\x09nul\\x00del\\x7fc1\\x9b")
        #expect(TerminalText.escape("back\\slash") == "back\\\\slash")
        #expect(TerminalText.escape("zw\u{200b}j") == "zw\\u{200b}j")
        #expect(TerminalText.escape("al\u{200c}ice\u{200d}") == "al\\u{200c}ice\\u{200d}", "joiners too: alice and al‌ice look the same")
        #expect(TerminalText.escape("soft\u{ad}") == "soft\\u{ad}")
        // Nothing that reaches the terminal is a control character any more.
        let hostile = String((0..<0x200).compactMap { Unicode.Scalar($0) }.map(Character.init))
        #expect(!TerminalText.escape(hostile).unicodeScalars.contains { $0.value < 0x20 || (0x7f..<0xa0).contains($0.value) })
    }

    @Test("A paired device's line: the name it was paired under, and the name it last gave when another, both escaped")
    func pairedLineShowsThePairedNameAndWhatItCallsItself() throws {
        let key = try PeerIdentity.generate(displayName: "x").publicKey
        let paired = Date(timeIntervalSince1970: 1_700_000_000)
        var p = TrustedPeer(publicKey: key, name: "kitchen", pairedAt: paired)
        let start = "kitchen\t\(key.shortFingerprint)\tpaired 2023-11-14T22:13:20.000Z\tlast seen "
        #expect(DeviceState.pairedLine(p) == start + "never")
        p.lastSeen = paired.addingTimeInterval(60)
        p.lastSeenName = "kitchen"
        #expect(DeviceState.pairedLine(p) == start + "2023-11-14T22:14:20.000Z")
        p.lastSeenName = "bedroom\u{1b}[2K"
        #expect(DeviceState.pairedLine(p) == start + "2023-11-14T22:14:20.000Z\tcalls itself \"bedroom\\x1b[2K\"")
    }
}
