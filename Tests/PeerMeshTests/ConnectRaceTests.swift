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
        #expect(r.callOff(now: t0 + sec) == nil)
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
        #expect(r.connected(4) == .won(abandon: [3, 5], .init(winner: 4, untried: [3, 5], setAside: [0, 1])),
                "2 failed and 4 won: the others go back")
    }

    @Test("All those still connecting fail: lost, and what the cap set aside is still untried")
    func lostHandsBackWhatWasSetAside() {
        var r = race(4)
        #expect(r.timerFired(now: t0 + stagger) == .start(1, setAside: nil))
        #expect(r.timerFired(now: t0 + 2 * stagger) == .start(2, setAside: nil))
        #expect(r.timerFired(now: t0 + 3 * stagger) == .start(3, setAside: 0))
        #expect(r.failed(1, now: t0 + 3 * stagger + ms) == .wait)
        #expect(r.failed(3, now: t0 + 3 * stagger + 2 * ms) == .wait)
        #expect(r.failed(2, now: t0 + 3 * stagger + 3 * ms) == .lost(.init(winner: nil, untried: [], setAside: [0])))
    }

    @Test("The last ones still connecting all fail: lost, even though the first is long gone")
    func theLastFailureLoses() {
        var r = race(2)
        #expect(r.timerFired(now: t0 + stagger) == .start(1, setAside: nil))
        #expect(r.failed(0, now: t0 + stagger + ms) == .wait)
        #expect(r.failed(1, now: t0 + stagger + 2 * ms) == .lost(.init(winner: nil, untried: [])))
    }

    @Test("Called off: the oldest still connecting is spent, and any other that had 750 ms; younger ones, those set aside and those never started are untried")
    func calledOff() {
        func racing() -> ConnectRace {
            var r = race(5)
            #expect(r.timerFired(now: t0 + stagger) == .start(1, setAside: nil))
            #expect(r.timerFired(now: t0 + 2 * stagger) == .start(2, setAside: nil))
            #expect(r.timerFired(now: t0 + 3 * stagger) == .start(3, setAside: 0))
            return r
        }
        // 1 (the oldest) is spent; 2 and 3 started 250 and 0 ms ago.
        var soon = racing()
        #expect(soon.outcomeIfCalledOff(now: t0 + 3 * stagger) == .init(winner: nil, untried: [2, 3, 4], setAside: [0]))
        #expect(soon.callOff(now: t0 + 3 * stagger) == .init(winner: nil, untried: [2, 3, 4], setAside: [0]))
        #expect(!soon.isRacing && soon.callOff(now: t0 + 3 * stagger) == nil && soon.outcomeIfCalledOff(now: t0) == nil)
        #expect(soon.connected(1) == .ignore)
        // Long after, all three still connecting had their time.
        var late = racing()
        #expect(late.callOff(now: t0 + 10 * sec) == .init(winner: nil, untried: [4], setAside: [0]))
        // Just short of 750 ms, the second oldest is still young.
        var edge = racing()
        #expect(edge.callOff(now: t0 + 5 * stagger - 1) == .init(winner: nil, untried: [2, 3, 4], setAside: [0]))
        var past = racing()
        #expect(past.callOff(now: t0 + 5 * stagger) == .init(winner: nil, untried: [3, 4], setAside: [0]))
    }

    @Test("Called off after a failure: the race has spent one, so every candidate still connecting that had less than 750 ms is untried, the oldest too")
    func calledOffAfterAFailure() {
        var r = race(4)
        #expect(r.timerFired(now: t0 + stagger) == .start(1, setAside: nil))
        #expect(r.timerFired(now: t0 + 2 * stagger) == .start(2, setAside: nil))
        #expect(r.failed(0, now: t0 + 600 * ms) == .start(3))
        #expect(r.callOff(now: t0 + 900 * ms) == .init(winner: nil, untried: [1, 2, 3]))
        var older = race(4)
        _ = older.timerFired(now: t0 + stagger)
        _ = older.timerFired(now: t0 + 2 * stagger)
        _ = older.failed(0, now: t0 + 600 * ms)
        #expect(older.callOff(now: t0 + 1_000 * ms) == .init(winner: nil, untried: [2, 3]), "1 had 750 ms")
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
