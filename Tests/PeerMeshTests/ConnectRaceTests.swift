import Testing
import MeshPOSIX
@testable import PeerMesh

private let ms: Nanos = 1_000_000
/// The tests' time zero, and the stagger they race with.
private let t0 = 100_000 * ms, stagger = 250 * ms

private func race(_ candidates: Int) -> ConnectRace { ConnectRace(candidates: candidates, stagger: stagger, now: t0) }

@Suite("ConnectRace: Happy Eyeballs for one connect (pure, virtual time)")
struct ConnectRaceTests {
    @Test("An address that drops connection attempts: the next starts after the stagger and wins; the first is handed back untried, with those never started")
    func aSilentAddressCostsTheStagger() {
        var r = race(3)
        #expect(r.nextStart == t0 + stagger)
        #expect(r.timerFired(now: t0 + stagger - 1) == .wait, "not before the stagger")
        #expect(r.timerFired(now: t0 + stagger) == .start(1, setAside: nil))
        #expect(r.nextStart == t0 + 2 * stagger)
        #expect(r.connected(1) == .won(abandon: [0], .init(winner: 1, untried: [0, 2])))
        #expect(!r.isRacing && r.nextStart == nil)
        // Whatever comes after the decision is nobody's business but the driver's closing of sockets.
        #expect(r.connected(0) == .ignore)
        #expect(r.failed(0, now: t0 + sec) == .ignore)
        #expect(r.timerFired(now: t0 + 10 * sec) == .wait)
        #expect(r.callOff() == nil)
    }

    @Test("A refusal starts the next at once; a stale timer then starts nothing; all refused is lost, with nothing untried")
    func refusalsMoveOnAtOnce() {
        var r = race(3)
        #expect(r.failed(0, now: t0 + 2 * ms) == .start(1))
        #expect(r.nextStart == t0 + 2 * ms + stagger, "the stagger counts from the last start")
        #expect(r.timerFired(now: t0 + stagger) == .wait, "the first start's timer is stale")
        #expect(r.failed(1, now: t0 + 3 * ms) == .start(2))
        #expect(r.nextStart == nil, "nothing left to start")
        #expect(r.failed(2, now: t0 + 4 * ms) == .lost(.init(winner: nil, untried: [])))
        #expect(!r.isRacing)
    }

    @Test("The first candidate that connects at once wins alone: the others were never started and are all untried")
    func theFirstWinsAlone() {
        var r = race(3)
        #expect(r.connected(0) == .won(abandon: [], .init(winner: 0, untried: [1, 2])))
        #expect(r.timerFired(now: t0 + stagger) == .wait)
    }

    @Test("Several connecting at once: a failure among them waits for the others; the winner abandons the rest")
    func failuresAmongOthersWait() {
        var r = race(3)
        #expect(r.timerFired(now: t0 + stagger) == .start(1, setAside: nil))
        #expect(r.timerFired(now: t0 + 2 * stagger) == .start(2, setAside: nil))
        #expect(r.nextStart == nil)
        #expect(r.failed(1, now: t0 + 2 * stagger + ms) == .wait, "0 and 2 are still connecting")
        #expect(r.failed(1, now: t0 + 2 * stagger + ms) == .ignore, "a candidate fails once")
        #expect(r.connected(2) == .won(abandon: [0], .init(winner: 2, untried: [0])))
    }

    @Test("At most three connect at once: the next start sets the oldest aside, and what was set aside is handed back untried")
    func atMostThreeAtOnce() {
        var r = race(6)
        #expect(r.timerFired(now: t0 + stagger) == .start(1, setAside: nil))
        #expect(r.timerFired(now: t0 + 2 * stagger) == .start(2, setAside: nil))
        #expect(r.timerFired(now: t0 + 3 * stagger) == .start(3, setAside: 0))
        #expect(r.failed(0, now: t0 + 3 * stagger + ms) == .ignore, "a candidate set aside no longer races")
        #expect(r.timerFired(now: t0 + 4 * stagger) == .start(4, setAside: 1))
        // A failure makes room: the next starts at once, setting nobody aside.
        #expect(r.failed(2, now: t0 + 4 * stagger + ms) == .start(5))
        #expect(r.connected(4) == .won(abandon: [3, 5], .init(winner: 4, untried: [0, 1, 3, 5])),
                "2 failed and 4 won: the others go back, in their order")
    }

    @Test("All those still connecting fail: lost, and what the cap set aside is still untried")
    func lostHandsBackWhatWasSetAside() {
        var r = race(4)
        #expect(r.timerFired(now: t0 + stagger) == .start(1, setAside: nil))
        #expect(r.timerFired(now: t0 + 2 * stagger) == .start(2, setAside: nil))
        #expect(r.timerFired(now: t0 + 3 * stagger) == .start(3, setAside: 0))
        #expect(r.failed(1, now: t0 + 3 * stagger + ms) == .wait)
        #expect(r.failed(3, now: t0 + 3 * stagger + 2 * ms) == .wait)
        #expect(r.failed(2, now: t0 + 3 * stagger + 3 * ms) == .lost(.init(winner: nil, untried: [0])))
    }

    @Test("The last ones still connecting all fail: lost, even though the first is long gone")
    func theLastFailureLoses() {
        var r = race(2)
        #expect(r.timerFired(now: t0 + stagger) == .start(1, setAside: nil))
        #expect(r.failed(0, now: t0 + stagger + ms) == .wait)
        #expect(r.failed(1, now: t0 + stagger + 2 * ms) == .lost(.init(winner: nil, untried: [])))
    }

    @Test("Called off while racing: those still connecting did not connect in all that time and are spent; those set aside or never started are untried")
    func calledOff() {
        var r = race(5)
        #expect(r.timerFired(now: t0 + stagger) == .start(1, setAside: nil))
        #expect(r.timerFired(now: t0 + 2 * stagger) == .start(2, setAside: nil))
        #expect(r.timerFired(now: t0 + 3 * stagger) == .start(3, setAside: 0))
        #expect(r.callOff() == .init(winner: nil, untried: [0, 4]))
        #expect(!r.isRacing && r.callOff() == nil)
        #expect(r.connected(1) == .ignore)
    }

    @Test("One candidate: no timer, and its failure is the race's")
    func oneCandidate() {
        var r = race(1)
        #expect(r.nextStart == nil)
        #expect(r.timerFired(now: t0 + 10 * stagger) == .wait)
        #expect(r.failed(0, now: t0 + ms) == .lost(.init(winner: nil, untried: [])))
    }
}

private let sec: Nanos = 1_000 * ms
