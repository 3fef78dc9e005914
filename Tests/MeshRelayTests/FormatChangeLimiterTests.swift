import MeshAudio
import Testing
@testable import MeshRelay

@Suite("Format changes are rate-limited (pure, virtual time)")
struct FormatChangeLimiterTests {
    let s: UInt64 = 1_000_000_000
    let a = AudioFormat(sampleRate: 48_000, channels: 2)
    let b = AudioFormat(sampleRate: 44_100, channels: 1)

    @Test("A burst of three, then refused (said once per format), then one per refill period")
    func burstThenRefill() {
        var l = FormatChangeLimiter(burst: 3, refillNanos: 10 * s)
        #expect(l.request(a, now: 0) == .allow)
        #expect(l.request(b, now: 1) == .allow)
        #expect(l.request(a, now: 2) == .allow)
        #expect(l.request(b, now: 3) == .refuseAndSay)
        #expect(l.request(b, now: 4) == .refuse, "said once")
        #expect(l.request(a, now: 5) == .refuseAndSay, "a different format is said once too")
        #expect(l.request(a, now: 9 * s) == .refuse)
        #expect(l.request(a, now: 10 * s + 3) == .allow, "one token back after 10 s")
        #expect(l.request(b, now: 10 * s + 4) == .refuseAndSay)
    }

    @Test("A host that flaps formats every 10 ms for a minute gets at most burst + minute/refill rebuilds")
    func flappingIsBounded() {
        var l = FormatChangeLimiter()
        var allowed = 0, said = 0
        for i in 0..<6_000 {
            switch l.request(i % 2 == 0 ? a : b, now: UInt64(i) * 10_000_000) {
            case .allow: allowed += 1
            case .refuseAndSay: said += 1
            case .refuse: break
            }
        }
        #expect(allowed <= 3 + 6 && allowed >= 3)
        #expect(said <= allowed * 2 + 2, "refusals are not said on every packet")
    }

    @Test("A format the output could not play is refused quietly from then on, and spends no token")
    func aFormatTheOutputRefusedIsNotTriedAgain() {
        var l = FormatChangeLimiter()
        #expect(l.request(a, now: 1) == .allow)
        l.cannotPlay(a)
        for t in 2..<100 { #expect(l.request(a, now: UInt64(t)) == .refuse) }
        #expect(l.request(b, now: 100) == .allow, "the burst's other tokens are still there")
        #expect(l.request(a, now: 20_000_000_000) == .refuse, "even once tokens are back")
    }
}
