import Testing
import MeshTestSupport
@testable import MeshRelay

/// The remote-control protocol without sockets: the codec, and both sides' state machines.
struct ControlCodecTests {
    static let all: [ControlMessage] = [
        .command(id: 1, .pause), .command(id: 2, .resume),
        .command(id: 3, .capture(.single, .primary)), .command(id: 4, .capture(.begin, .secondary)),
        .command(id: 5, .capture(.end, .primary)), .command(id: 6, .capture(.cancel, .primary)),
        .command(id: 7, .talk(true)), .command(id: UInt32.max, .talk(false)),
        .reply(id: 1, .ok), .reply(id: 2, .recording), .reply(id: 3, .busy), .reply(id: 0, .error("not a control message")),
        .reply(id: 4, .failed("cannot write a.wav: permission denied")), .reply(id: 5, .unsupported("no talkback")),
        .state(HostControlState()), .state(HostControlState(paused: true, muted: true, talkAccepted: true,
                                                            features: [.control, .clips, .talk], capture: .recording)),
        .state(HostControlState(features: [.control, .clips], capture: .saved("kitchen-20261202-101500.wav"))),
        .state(HostControlState(capture: .failed("disk full"))), .state(HostControlState(capture: .armed)),
    ]

    @Test func everyMessageRoundTrips() throws {
        for m in Self.all {
            #expect(try ControlMessage.decode(m.encoded) == m, "\(m)")
        }
    }

    @Test func theLayoutIsAsDocumented() {
        #expect(ControlMessage.command(id: 0x0102_0304, .capture(.begin, .secondary)).encoded
                == [0x50, 0x43, 1, 0x03, 1, 2, 3, 4, 1, 1])
        #expect(ControlMessage.reply(id: 9, .failed("x")).encoded == [0x50, 0x43, 1, 0x81, 0, 0, 0, 9, 3, 1, 0x78])
        #expect(ControlMessage.state(HostControlState(paused: true, features: [.control, .clips], capture: .armed)).encoded
                == [0x50, 0x43, 1, 0x82, 0, 0, 0, 0, 1, 3, 1, 0])
    }

    @Test func malformedMessagesAreRefusedWithTheCommandsIdWhenKnown() {
        func refusal(_ b: [UInt8]) -> ControlDecodeError? {
            do { _ = try ControlMessage.decode(b); return nil } catch { return error }
        }
        let pause = ControlMessage.command(id: 7, .pause).encoded
        #expect(refusal([0x50, 0x43, 1])?.id == nil)                                   // short
        #expect(refusal([UInt8](repeating: 0x50, count: 400))?.id == nil)              // long
        #expect(refusal([0x51] + pause.dropFirst())?.id == nil)                         // magic
        #expect(refusal([0x50, 0x43, 2] + pause.dropFirst(3))?.id == 7)                // version
        #expect(refusal([0x50, 0x43, 1, 0x09, 0, 0, 0, 7])?.id == 7)                   // unknown command
        #expect(refusal(pause + [0])?.id == 7)                                          // trailing bytes
        #expect(refusal([0x50, 0x43, 1, 0x03, 0, 0, 0, 7, 1])?.id == 7)                // truncated capture
        #expect(refusal([0x50, 0x43, 1, 0x03, 0, 0, 0, 7, 4, 0])?.id == 7)             // capture phase
        #expect(refusal([0x50, 0x43, 1, 0x03, 0, 0, 0, 7, 0, 2])?.id == 7)             // capture action
        #expect(refusal([0x50, 0x43, 1, 0x04, 0, 0, 0, 7, 2])?.id == 7)                // talk 2
        #expect(refusal([0x50, 0x43, 1, 0x01, 0, 0, 0, 0]) != nil)                     // command id 0
        #expect(refusal([0x50, 0x43, 1, 0x81, 0, 0, 0, 7, 0, 1, 0x41]) != nil)         // text on "ok"
        #expect(refusal([0x50, 0x43, 1, 0x81, 0, 0, 0, 7, 3, 2, 0xC3, 0x28]) != nil)   // not UTF-8
        #expect(refusal([0x50, 0x43, 1, 0x81, 0, 0, 0, 7, 3, 5, 0x41]) != nil)         // text runs past the end
        #expect(refusal([0x50, 0x43, 1, 0x82, 0, 0, 0, 1, 0, 1, 0, 0]) != nil)         // state with an id
        #expect(refusal([0x50, 0x43, 1, 0x82, 0, 0, 0, 0, 8, 1, 0, 0]) != nil)         // unknown flag
        #expect(refusal([0x50, 0x43, 1, 0x82, 0, 0, 0, 0, 0, 0x11, 0, 0]) != nil)      // unknown feature
        #expect(refusal([0x50, 0x43, 1, 0x82, 0, 0, 0, 0, 0, 1, 9, 0]) != nil)         // capture state 9
    }

    @Test func longTextIsCutAtACharacterBoundary() throws {
        let text = String(repeating: "é", count: 200) // 400 bytes
        let m = ControlMessage.reply(id: 1, .failed(text))
        guard case .reply(_, .failed(let got)) = try ControlMessage.decode(m.encoded) else { Issue.record("not a reply"); return }
        #expect(got.utf8.count == 254 && got == String(repeating: "é", count: 127))
    }

    @Test func randomAndMutatedBytesNeverTrapAndWhatDecodesReencodes() {
        var rng = SeededRandom(seed: 13)
        var decoded = 0
        for i in 0..<100_000 {
            var bytes: [UInt8]
            if i % 2 == 0 {
                bytes = (0..<Int(rng.next() % 24)).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            } else {
                bytes = Self.all[Int(rng.next() % UInt64(Self.all.count))].encoded
                for _ in 0..<(1 + rng.next() % 3) {
                    let at = Int(rng.next() % UInt64(bytes.count))
                    bytes[at] = UInt8(truncatingIfNeeded: rng.next())
                }
            }
            if let m = try? ControlMessage.decode(bytes) {
                decoded += 1
                #expect(m.encoded == bytes)
            }
        }
        #expect(decoded > 1000, "mutations of valid messages often stay valid")
    }

    @Test func featuresFollowTheTXTRecord() {
        #expect(ControlFeatures([.control, .clips]).discoveryInfo == ["ctl": "1", "clip": "1"])
        #expect(ControlFeatures(discoveryInfo: ["ctl": "1", "talk": "1", "rate": "44100"]) == [.control, .talk])
        #expect(ControlFeatures(discoveryInfo: [:]) == [])
    }
}

struct HostControlTests {
    typealias Action = HostControl<Int>.Action

    static func command(_ id: UInt32, _ c: PlayerCommand) -> [UInt8] { ControlMessage.command(id: id, c).encoded }

    static func replies(_ actions: [Action], to peer: Int) -> [HostReply] {
        actions.compactMap { if case .send(peer, .reply(_, let r)) = $0 { r } else { nil } }
    }

    static func states(_ actions: [Action]) -> [Int: HostControlState] {
        var out: [Int: HostControlState] = [:]
        for a in actions { if case .send(let p, .state(let s)) = a { out[p] = s } }
        return out
    }

    @Test func aJoiningPlayerIsToldTheState() {
        var h = HostControl<Int>(clips: true)
        let a = h.joined(1)
        #expect(a == [.send(1, .state(HostControlState(features: [.control, .clips], capture: .armed)))])
        #expect(HostControl<Int>(clips: false).offered == .control)
    }

    @Test func pauseHoldsOnePlayerOnlyAndEveryCommandGetsOneReply() {
        var h = HostControl<Int>(clips: false)
        _ = h.joined(1)
        _ = h.joined(2)
        let a = h.received(Self.command(1, .pause), from: 1, now: 0)
        #expect(a.contains(.setPaused(1, true)))
        #expect(Self.replies(a, to: 1) == [.ok])
        #expect(Self.states(a)[1]?.paused == true && Self.states(a)[2] == nil)
        #expect(h.isPaused(1) && !h.isPaused(2))
        // Again: ok, and nothing changes.
        let again = h.received(Self.command(2, .pause), from: 1, now: 0)
        #expect(again == [.send(1, .reply(id: 2, .ok))])
        let r = h.received(Self.command(3, .resume), from: 1, now: 0)
        #expect(r.contains(.setPaused(1, false)) && Self.replies(r, to: 1) == [.ok] && !h.isPaused(1))
        // Resuming a playing player is ok and changes nothing.
        #expect(h.received(Self.command(4, .resume), from: 2, now: 0) == [.send(2, .reply(id: 4, .ok))])
        #expect(h.counters.commands == 4 && h.counters.replies == 4 && h.counters.malformed == 0)
    }

    @Test func aPlayerThatLeavesPausedIsForgotten() {
        var h = HostControl<Int>(clips: false)
        _ = h.joined(1)
        _ = h.received(Self.command(1, .pause), from: 1, now: 0)
        #expect(h.left(1) == [.setPaused(1, false)])
        #expect(!h.isPaused(1))
        #expect(h.left(1) == [])
    }

    @Test func malformedAndUnexpectedMessagesAreAnsweredWithAnErrorAndCounted() {
        var h = HostControl<Int>(clips: false)
        _ = h.joined(1)
        let junk = h.received([1, 2, 3], from: 1, now: 0)
        guard case .send(1, .reply(0, .error))? = junk.first, junk.count == 1 else { Issue.record("\(junk)"); return }
        let unknown = h.received([0x50, 0x43, 1, 0x7f, 0, 0, 0, 9], from: 1, now: 0)
        guard case .send(1, .reply(9, .error(let why)))? = unknown.first else { Issue.record("\(unknown)"); return }
        #expect(why.contains("unknown command"))
        let state = h.received(ControlMessage.state(HostControlState()).encoded, from: 1, now: 0)
        guard case .send(1, .reply(0, .error))? = state.first else { Issue.record("\(state)"); return }
        #expect(h.counters.commands == 3 && h.counters.replies == 3 && h.counters.malformed == 3)
        // The session goes on: a good command after them works.
        #expect(h.received(Self.command(10, .pause), from: 1, now: 0).contains(.setPaused(1, true)))
    }

    @Test func withoutClipsCaptureIsUnsupportedAndTalkIsUnsupported() {
        var h = HostControl<Int>(clips: false)
        _ = h.joined(1)
        guard case .unsupported? = Self.replies(h.received(Self.command(1, .capture(.single, .primary)), from: 1, now: 0), to: 1).first,
              case .unsupported? = Self.replies(h.received(Self.command(2, .talk(true)), from: 1, now: 0), to: 1).first
        else { Issue.record("expected unsupported"); return }
        #expect(h.captureState == .off)
    }

    @Test func aClipIsRecordedThenSavedAndEveryoneIsTold() {
        var h = HostControl<Int>(clips: true)
        _ = h.joined(1)
        _ = h.joined(2)
        #expect(h.received(Self.command(1, .capture(.begin, .primary)), from: 1, now: 0) == [.openClip(clip: 1, prerollOnly: false)])
        let opened = h.clipOpened(1)
        #expect(Self.replies(opened, to: 1) == [.recording])
        #expect(Self.states(opened)[1]?.capture == .recording && Self.states(opened)[2]?.capture == .recording)
        // Someone else: busy, or not theirs to end.
        #expect(Self.replies(h.received(Self.command(1, .capture(.single, .primary)), from: 2, now: 0), to: 2) == [.busy])
        guard case .error? = Self.replies(h.received(Self.command(2, .capture(.end, .primary)), from: 2, now: 0), to: 2).first else {
            Issue.record("another player's end must be an error"); return
        }
        let end = h.received(Self.command(2, .capture(.end, .primary)), from: 1, now: 0)
        #expect(end == [.finishClip(clip: 1), .send(1, .reply(id: 2, .ok))])
        let saved = h.clipSaved(1, name: "host-1.wav")
        #expect(Self.states(saved)[1]?.capture == .saved("host-1.wav") && Self.states(saved)[2]?.capture == .saved("host-1.wav"))
        // Out of order: an end with nothing recording.
        guard case .error? = Self.replies(h.received(Self.command(3, .capture(.end, .primary)), from: 1, now: 0), to: 1).first else {
            Issue.record("an end with no clip must be an error"); return
        }
        #expect(h.captureState == .saved("host-1.wav"))
    }

    @Test func aSecondaryCaptureKeepsThePrerollAlone() {
        var h = HostControl<Int>(clips: true)
        _ = h.joined(1)
        #expect(h.received(Self.command(1, .capture(.single, .secondary)), from: 1, now: 0) == [.openClip(clip: 1, prerollOnly: true)])
        _ = h.clipOpened(1)
        #expect(Self.states(h.clipSaved(1, name: "x.wav"))[1]?.capture == .saved("x.wav"))
    }

    @Test func cancelDiscardsAndAFailedOpenIsAnswered() {
        var h = HostControl<Int>(clips: true)
        _ = h.joined(1)
        _ = h.received(Self.command(1, .capture(.begin, .primary)), from: 1, now: 0)
        _ = h.clipOpened(1)
        // The cancel is answered when the recorder says it discarded the clip.
        #expect(h.received(Self.command(2, .capture(.cancel, .primary)), from: 1, now: 0) == [.discardClip(clip: 1)])
        let discarded = h.clipDiscarded(1)
        #expect(Self.replies(discarded, to: 1) == [.ok] && Self.states(discarded)[1]?.capture == .armed)
        #expect(h.captureState == .armed)
        // A report about the discarded clip changes nothing.
        #expect(h.clipSaved(1, name: "late.wav") == [])
        #expect(h.received(Self.command(3, .capture(.single, .primary)), from: 1, now: 0) == [.openClip(clip: 2, prerollOnly: false)])
        let failed = h.clipOpenFailed(2, reason: "cannot write a.wav: read-only file system")
        #expect(Self.replies(failed, to: 1) == [.failed("cannot write a.wav: read-only file system")])
        #expect(h.captureState == .failed("cannot write a.wav: read-only file system"))
        // A new clip may be tried after a failure.
        #expect(h.received(Self.command(4, .capture(.single, .primary)), from: 1, now: 0) == [.openClip(clip: 3, prerollOnly: false)])
    }

    /// Players 1 and 2 joined; 1 began clip 1 and has just cancelled it (the recorder has not answered yet).
    static func clipCancelledByItsOwner() -> HostControl<Int> {
        var h = HostControl<Int>(clips: true)
        _ = h.joined(1)
        _ = h.joined(2)
        _ = h.received(command(1, .capture(.begin, .primary)), from: 1, now: 0)
        _ = h.clipOpened(1)
        #expect(h.received(command(2, .capture(.cancel, .primary)), from: 1, now: 0) == [.discardClip(clip: 1)])
        return h
    }

    @Test func aLateReportOfAnEarlierClipDoesNotEndTheOneBeingRecorded() {
        var h = Self.clipCancelledByItsOwner()
        #expect(Self.replies(h.clipDiscarded(1), to: 1) == [.ok])
        #expect(h.received(Self.command(1, .capture(.begin, .primary)), from: 2, now: 0) == [.openClip(clip: 2, prerollOnly: false)])
        #expect(Self.replies(h.clipOpened(2), to: 2) == [.recording])
        // Clip 1's word arrives late: it is not clip 2's.
        #expect(h.clipSaved(1, name: "late.wav") == [])
        #expect(h.clipFailed(1, reason: "late") == [])
        #expect(h.captureState == .recording)
        #expect(h.received(Self.command(2, .capture(.end, .primary)), from: 2, now: 0) == [.finishClip(clip: 2), .send(2, .reply(id: 2, .ok))])
        #expect(Self.states(h.clipSaved(2, name: "b.wav"))[2]?.capture == .saved("b.wav"))
        // And the next clip works as well (the error does not repeat clip after clip).
        #expect(h.received(Self.command(3, .capture(.begin, .primary)), from: 1, now: 0) == [.openClip(clip: 3, prerollOnly: false)])
        _ = h.clipOpened(3)
        #expect(h.received(Self.command(4, .capture(.end, .primary)), from: 1, now: 0) == [.finishClip(clip: 3), .send(1, .reply(id: 4, .ok))])
    }

    @Test func aCancelThatCameAfterTheClipReachedItsLengthIsAnsweredSavedNotCancelled() {
        var h = Self.clipCancelledByItsOwner()
        // Until the recorder answers, clip 1 is still in hand.
        #expect(h.captureState == .recording)
        #expect(Self.replies(h.received(Self.command(1, .capture(.begin, .primary)), from: 2, now: 0), to: 2) == [.busy])
        // The recorder had saved it at its length before the discard reached it: kept, and said so.
        let saved = h.clipSaved(1, name: "full.wav")
        #expect(Self.replies(saved, to: 1) == [.failed("too late to cancel: the clip was saved as full.wav")])
        #expect(Self.states(saved)[1]?.capture == .saved("full.wav") && Self.states(saved)[2]?.capture == .saved("full.wav"))
        #expect(h.received(Self.command(2, .capture(.begin, .primary)), from: 2, now: 0) == [.openClip(clip: 2, prerollOnly: false)])
        _ = h.clipOpened(2)
        // A clip whose writing failed while it was being cancelled is gone, as asked.
        #expect(h.received(Self.command(3, .capture(.cancel, .primary)), from: 2, now: 0) == [.discardClip(clip: 2)])
        let failed = h.clipFailed(2, reason: "cannot write b.wav: disk full")
        #expect(Self.replies(failed, to: 2) == [.ok] && h.captureState == .armed)
    }

    @Test func oneTalkerAtATimeHalfDuplexByDefault() {
        var h = HostControl<Int>(clips: false, talk: true)
        _ = h.joined(1)
        _ = h.joined(2)
        #expect(h.offered == [.control, .talk] && h.state(for: 1).talkAccepted)
        let on = h.received(Self.command(1, .talk(true)), from: 1, now: 0)
        #expect(on.prefix(3) == [.setTalker(1), .holdForTalk(1, true), .send(1, .reply(id: 1, .ok))])
        #expect(Self.states(on)[2]?.talkAccepted == false && Self.states(on)[1]?.talkAccepted == true)
        #expect(Self.states(on)[1]?.paused == true && Self.states(on)[2]?.paused == false, "half duplex holds the talker's audio")
        #expect(Self.replies(h.received(Self.command(2, .talk(true)), from: 2, now: 0), to: 2) == [.busy])
        #expect(h.received(Self.command(3, .talk(true)), from: 1, now: 0) == [.send(1, .reply(id: 3, .ok))], "again: ok, nothing changes")
        #expect(h.received(Self.command(4, .talk(false)), from: 2, now: 0) == [.send(2, .reply(id: 4, .ok))], "not talking: ok")
        let off = h.received(Self.command(5, .talk(false)), from: 1, now: 0)
        #expect(off.prefix(3) == [.setTalker(nil), .holdForTalk(1, false), .send(1, .reply(id: 5, .ok))])
        #expect(h.currentTalker == nil && h.state(for: 2).talkAccepted)
        // A talker that leaves frees the talk for the others.
        _ = h.received(Self.command(6, .talk(true)), from: 2, now: 0)
        let left = h.left(2)
        #expect(left.prefix(2) == [.setTalker(nil), .holdForTalk(2, false)] && Self.states(left)[1]?.talkAccepted == true)
    }

    @Test func fullDuplexKeepsTheTalkerListening() {
        var h = HostControl<Int>(clips: false, talk: true, fullDuplex: true)
        _ = h.joined(1)
        let on = h.received(Self.command(1, .talk(true)), from: 1, now: 0)
        #expect(!on.contains { if case .holdForTalk = $0 { true } else { false } })
        #expect(on.first == .setTalker(1))
    }

    @Test func talkbackThatEndsReleasesTheTalkerStopsBeingOfferedAndIsRefusedWithTheReason() {
        var h = HostControl<Int>(clips: false, talk: true)
        _ = h.joined(1)
        _ = h.joined(2)
        _ = h.received(Self.command(1, .talk(true)), from: 1, now: 0)
        #expect(h.currentTalker == 1 && h.state(for: 1).paused)
        let ended = h.talkbackEnded("the talkback device went away")
        #expect(ended.prefix(2) == [.setTalker(nil), .holdForTalk(1, false)])
        #expect(Self.states(ended)[1] == HostControlState(paused: false, talkAccepted: false, features: .control, capture: .off))
        #expect(Self.states(ended)[2] == HostControlState(paused: false, talkAccepted: false, features: .control, capture: .off))
        #expect(h.currentTalker == nil && h.offered == .control)
        // Asked anyway (a player that did not hear yet): refused, with why.
        #expect(Self.replies(h.received(Self.command(2, .talk(true)), from: 2, now: 0), to: 2)
                == [.error("talkback is unavailable: the talkback device went away")])
        #expect(h.currentTalker == nil && !h.state(for: 2).paused)
        #expect(h.received(Self.command(3, .talk(false)), from: 1, now: 0) == [.send(1, .reply(id: 3, .ok))], "talk off is still ok")
        #expect(h.talkbackEnded("again") == [], "said once")
        // Full duplex: nobody was held, so nobody is released from a hold.
        var full = HostControl<Int>(clips: false, talk: true, fullDuplex: true)
        _ = full.joined(1)
        _ = full.received(Self.command(1, .talk(true)), from: 1, now: 0)
        let fullEnded = full.talkbackEnded("gone")
        #expect(fullEnded.first == .setTalker(nil) && Self.states(fullEnded)[1]?.talkAccepted == false)
        #expect(!fullEnded.contains { if case .holdForTalk = $0 { true } else { false } })
        // A host that never took talkback: nothing changes, and talk stays unsupported.
        var none = HostControl<Int>(clips: false)
        _ = none.joined(1)
        #expect(none.talkbackEnded("gone") == [])
        guard case .unsupported? = Self.replies(none.received(Self.command(1, .talk(true)), from: 1, now: 0), to: 1).first else {
            Issue.record("talk on a host without talkback must be unsupported"); return
        }
    }

    @Test func muteIsBroadcast() {
        var h = HostControl<Int>(clips: false)
        _ = h.joined(1)
        _ = h.joined(2)
        let a = h.setMuted(true)
        #expect(Self.states(a).count == 2 && Self.states(a).values.allSatisfy(\.muted))
        #expect(h.setMuted(true) == [])
    }

    @Test func randomCommandsFromThreePlayersGetExactlyOneReplyEach() {
        var rng = SeededRandom(seed: 99)
        var h = HostControl<Int>(clips: true, talk: true)
        for p in 1...3 { _ = h.joined(p) }
        var commands = 0, replies = 0, opened = 0
        for i in 0..<5_000 {
            let peer = 1 + Int(rng.next() % 3)
            let choice: [PlayerCommand] = [.pause, .resume, .capture(.single, .primary), .capture(.begin, .primary),
                                           .capture(.end, .primary), .capture(.cancel, .primary), .talk(true), .talk(false)]
            let c = choice[Int(rng.next() % UInt64(choice.count))]
            // A command every 0.1 s: clip starts within each player's quota and over it.
            var actions = h.received(Self.command(UInt32(i + 1), c), from: peer, now: UInt64(i) * 100_000_000)
            commands += 1
            for action in actions {
                switch action {
                case .openClip(let clip, _):
                    if rng.next() % 4 == 0 {
                        actions += h.clipOpenFailed(clip, reason: "full")
                    } else {
                        opened += 1
                        actions += h.clipOpened(clip)
                    }
                case .finishClip(let clip):
                    actions += h.clipSaved(clip, name: "c\(i).wav")
                case .discardClip(let clip):
                    // Discarded, or saved at its length before the discard reached the recorder.
                    actions += rng.next() % 4 == 0 ? h.clipSaved(clip, name: "c\(i).wav") : h.clipDiscarded(clip)
                default:
                    break
                }
            }
            replies += actions.filter { if case .send(_, .reply) = $0 { true } else { false } }.count
        }
        #expect(replies == commands)
        #expect(h.counters.commands == UInt64(commands) && h.counters.replies == UInt64(replies))
        // 500 s: at most the 4 at once and one every 10 s for each of the three players (a clip that failed to open
        // costs nothing), and some were refused.
        #expect(opened > 4 && opened <= 3 * (4 + 50), "\(opened) clips opened")
        #expect(h.counters.refusedClips > 0 && h.counters.refusedClips == (1...3).reduce(0) { $0 + h.refusedClips(by: $1) })
    }

    // MARK: The clip quota

    static let second: UInt64 = 1_000_000_000

    /// `peer` asks for a pre-roll-only clip with command `id` at `now`; a clip opened is saved at once. Returns the
    /// answer to the command.
    static func shoot(_ h: inout HostControl<Int>, _ id: UInt32, by peer: Int, at now: UInt64) -> HostReply? {
        let asked = h.received(command(id, .capture(.single, .secondary)), from: peer, now: now)
        let answers = replies(asked, to: peer)
        guard case .openClip(let clip, true)? = asked.first, asked.count == 1 else {
            #expect(answers.count == 1, "one answer: \(asked)")
            return answers.first
        }
        let opened = replies(h.clipOpened(clip), to: peer)
        _ = h.clipSaved(clip, name: "clip-\(clip).wav")
        return opened.first
    }

    @Test func aPlayerStartsFourClipsAtOnceTheNextIsRefusedWithItsWaitAndOneComesBackEveryTenSeconds() {
        var h = HostControl<Int>(clips: true)
        _ = h.joined(1)
        let t: UInt64 = 1_000 * Self.second
        for id in UInt32(1)...4 { #expect(Self.shoot(&h, id, by: 1, at: t) == .recording, "clip \(id) of the 4 at once") }
        #expect(Self.shoot(&h, 5, by: 1, at: t) == .failed("too many clips: try again in 10 s"))
        #expect(Self.shoot(&h, 6, by: 1, at: t + 3 * Self.second) == .failed("too many clips: try again in 7 s"))
        #expect(Self.shoot(&h, 7, by: 1, at: t + 9 * Self.second + 1) == .failed("too many clips: try again in 1 s"), "rounded up")
        // A refused start opened nothing, and the state players see is the last clip's.
        #expect(h.captureState == .saved("clip-4.wav"))
        // The driver is told to log the refusal, then to answer it.
        #expect(h.received(Self.command(20, .capture(.single, .secondary)), from: 1, now: t + 9 * Self.second) ==
                [.clipRefused(1, retryInSeconds: 1), .send(1, .reply(id: 20, .failed("too many clips: try again in 1 s")))])
        #expect(Self.shoot(&h, 8, by: 1, at: t + 10 * Self.second) == .recording, "10 s bought one")
        #expect(Self.shoot(&h, 9, by: 1, at: t + 10 * Self.second) == .failed("too many clips: try again in 10 s"))
        // A quiet 40 s refills all 4, and no more.
        for id in UInt32(10)...13 { #expect(Self.shoot(&h, id, by: 1, at: t + 60 * Self.second) == .recording) }
        #expect(Self.shoot(&h, 14, by: 1, at: t + 60 * Self.second) == .failed("too many clips: try again in 10 s"))
        #expect(h.counters.refusedClips == 6 && h.refusedClips(by: 1) == 6)
        #expect(h.counters.commands == 15 && h.counters.replies == 15 && h.counters.malformed == 0)
    }

    @Test func onePlayersQuotaDoesNotTouchAnothersAndABusyAnswerCostsNothing() {
        var h = HostControl<Int>(clips: true)
        _ = h.joined(1)
        _ = h.joined(2)
        _ = h.joined(3)
        let t: UInt64 = 5 * Self.second
        for id in UInt32(1)...4 { #expect(Self.shoot(&h, id, by: 1, at: t) == .recording) }
        #expect(Self.shoot(&h, 5, by: 1, at: t) == .failed("too many clips: try again in 10 s"))
        // Player 2 has its own 4. While its clip records, player 3's starts are busy, and cost it nothing.
        #expect(h.received(Self.command(1, .capture(.begin, .primary)), from: 2, now: t) == [.openClip(clip: 5, prerollOnly: false)])
        _ = h.clipOpened(5)
        for id in UInt32(1)...10 {
            #expect(Self.replies(h.received(Self.command(id, .capture(.single, .primary)), from: 3, now: t), to: 3) == [.busy])
        }
        #expect(h.received(Self.command(2, .capture(.end, .primary)), from: 2, now: t) == [.finishClip(clip: 5), .send(2, .reply(id: 2, .ok))])
        _ = h.clipSaved(5, name: "b.wav")
        for id in UInt32(3)...5 { #expect(Self.shoot(&h, id, by: 2, at: t) == .recording) }
        #expect(Self.shoot(&h, 6, by: 2, at: t + 2 * Self.second) == .failed("too many clips: try again in 8 s"))
        for id in UInt32(11)...14 { #expect(Self.shoot(&h, id, by: 3, at: t) == .recording, "player 3's busy answers cost nothing") }
        #expect(Self.shoot(&h, 15, by: 3, at: t) == .failed("too many clips: try again in 10 s"))
        #expect(Self.shoot(&h, 6, by: 1, at: t + 2 * Self.second) == .failed("too many clips: try again in 8 s"))
        #expect(h.refusedClips(by: 1) == 2 && h.refusedClips(by: 2) == 1 && h.refusedClips(by: 3) == 1)
        #expect(h.counters.refusedClips == 4)
        #expect(h.counters.commands == 6 + 6 + 15 && h.counters.replies == h.counters.commands)
    }

    @Test func aPlayerThatLeavesAndJoinsAgainFindsItsQuotaAsItLeftIt() {
        var h = HostControl<Int>(clips: true)
        _ = h.joined(1)
        let t: UInt64 = 7 * Self.second
        for id in UInt32(1)...4 { #expect(Self.shoot(&h, id, by: 1, at: t) == .recording) }
        #expect(Self.shoot(&h, 5, by: 1, at: t) == .failed("too many clips: try again in 10 s"))
        _ = h.left(1)
        #expect(h.refusedClips(by: 1) == 0, "its count is since it joined")
        _ = h.joined(1)
        #expect(Self.shoot(&h, 1, by: 1, at: t + Self.second) == .failed("too many clips: try again in 9 s"), "no fresh quota")
        #expect(h.refusedClips(by: 1) == 1 && h.counters.refusedClips == 2)
        // Once it refilled, a player that left is forgotten: it comes back to a full quota, no more.
        #expect(Self.shoot(&h, 2, by: 1, at: t + 10 * Self.second) == .recording)
        _ = h.left(1)
        _ = h.joined(1)
        let later = t + 100 * Self.second
        for id in UInt32(3)...6 { #expect(Self.shoot(&h, id, by: 1, at: later) == .recording) }
        #expect(Self.shoot(&h, 7, by: 1, at: later) == .failed("too many clips: try again in 10 s"))
        #expect(h.counters.refusedClips == 3)
    }

    @Test func theQuotaFollowsTheClipLengthWithinFiveToTenSeconds() {
        #expect(ClipQuota.following(clipSeconds: 10) == .default)
        #expect(ClipQuota.following(clipSeconds: 7.5) == ClipQuota(burst: 4, refill: .milliseconds(7_500)))
        #expect(ClipQuota.following(clipSeconds: 5) == ClipQuota(burst: 4, refill: .seconds(5)))
        #expect(ClipQuota.following(clipSeconds: 0.1) == ClipQuota(burst: 4, refill: .seconds(5)), "no faster than one per 5 s")
        #expect(ClipQuota.following(clipSeconds: 3_600) == ClipQuota(burst: 4, refill: .seconds(10)), "no slower than one per 10 s")
        // Someone recording 5 s clips back to back, each to its length, is never refused.
        var h = HostControl<Int>(clips: true, clipQuota: .following(clipSeconds: 5))
        _ = h.joined(1)
        for i in UInt32(0)..<30 {
            #expect(Self.shoot(&h, i + 1, by: 1, at: UInt64(i) * 5 * Self.second) == .recording, "clip \(i + 1)")
        }
        #expect(h.counters.refusedClips == 0)
    }

    @Test func aClipThatCouldNotBeOpenedCostsNothingAndACancelledOneCostsItsClip() {
        var h = HostControl<Int>(clips: true, clipQuota: ClipQuota(burst: 2, refill: .seconds(15)))
        _ = h.joined(1)
        let t: UInt64 = 0
        for id in UInt32(1)...6 {
            guard case .openClip(let clip, false)? = h.received(Self.command(id, .capture(.single, .primary)), from: 1, now: t).first else {
                Issue.record("start \(id) refused"); return
            }
            #expect(Self.replies(h.clipOpenFailed(clip, reason: "disk full"), to: 1) == [.failed("disk full")])
        }
        // A begin and a cancel: the clip's pre-roll was written, and it counts.
        #expect(h.received(Self.command(7, .capture(.begin, .primary)), from: 1, now: t) == [.openClip(clip: 7, prerollOnly: false)])
        _ = h.clipOpened(7)
        #expect(h.received(Self.command(8, .capture(.cancel, .primary)), from: 1, now: t) == [.discardClip(clip: 7)])
        #expect(Self.replies(h.clipDiscarded(7), to: 1) == [.ok])
        #expect(Self.shoot(&h, 9, by: 1, at: t) == .recording)
        #expect(Self.shoot(&h, 10, by: 1, at: t + 5 * Self.second) == .failed("too many clips: try again in 10 s"))
        #expect(h.counters.refusedClips == 1 && h.counters.commands == 10 && h.counters.replies == 10)
    }
}

struct PlayerControlTests {
    @Test func nothingIsOfferedBeforeTheHostSaysWhatItSupports() {
        var p = PlayerControl()
        p.joined()
        guard case .refused(.pause, let early) = p.request(.pause, now: 0) else { Issue.record("sent before the host's state"); return }
        #expect(early.contains("not said yet"), "not a verdict on the host before it spoke: \(early)")
        p.discovered(["ctl": "1"])
        guard case .send = p.request(.pause, now: 0) else { Issue.record("the TXT record offers control"); return }
        guard case .refused(_, let why) = p.request(.capture(.single, .primary), now: 0) else { Issue.record("no clips offered"); return }
        #expect(why.contains("keeps no clips"))
    }

    @Test func repliesArePairedWithTheirCommandsAndStrayOnesCounted() throws {
        var p = PlayerControl()
        p.joined()
        _ = p.received(HostControlState(features: [.control, .clips]).encodedState)
        guard case .send(let bytes, _) = p.request(.capture(.single, .primary), now: 0),
              case .command(let id, _) = try ControlMessage.decode(bytes) else { Issue.record("not sent"); return }
        #expect(p.received(ControlMessage.reply(id: id, .recording).encoded) == [.answered(.capture(.single, .primary), .recording)])
        #expect(p.received(ControlMessage.reply(id: id, .ok).encoded) == [.malformed("a reply to no command (id \(id))")])
        #expect(p.received([0, 1, 2]).count == 1 && p.malformed == 2)
        #expect(p.received(ControlMessage.command(id: 5, .pause).encoded) == [.malformed("the host sent a command")])
    }

    @Test("Only the answer to the latest talk command decides: an earlier one's comes back superseded, whatever it says and whenever it comes")
    func anEarlierTalkAnswerIsSuperseded() throws {
        var p = PlayerControl()
        p.joined()
        _ = p.received(HostControlState(features: [.control, .talk]).encodedState)
        func sent(_ command: PlayerCommand) throws -> UInt32? {
            guard case .send(let bytes, _) = p.request(command, now: 0), case .command(let id, _) = try ControlMessage.decode(bytes) else { return nil }
            return id
        }
        let on = try #require(try sent(.talk(true))), off = try #require(try sent(.talk(false))), again = try #require(try sent(.talk(true)))
        let pause = try #require(try sent(.pause))
        #expect(p.received(ControlMessage.reply(id: on, .busy).encoded) == [.superseded(.talk(true), .busy)])
        #expect(p.received(ControlMessage.reply(id: pause, .ok).encoded) == [.answered(.pause, .ok)], "other commands are as before")
        #expect(p.received(ControlMessage.reply(id: off, .ok).encoded) == [.superseded(.talk(false), .ok)])
        #expect(p.received(ControlMessage.reply(id: again, .ok).encoded) == [.answered(.talk(true), .ok)], "the latest decides")
        // One that never comes back does not hold up the next.
        _ = try #require(try sent(.talk(false)))
        let last = try #require(try sent(.talk(true)))
        #expect(p.received(ControlMessage.reply(id: last, .busy).encoded) == [.answered(.talk(true), .busy)])
        // The release sent outside the budget is a talk command too.
        guard case .send(let bytes, _) = p.releaseTalk(), case .command(let release, _) = try ControlMessage.decode(bytes) else {
            Issue.record("not sent"); return
        }
        #expect(p.received(ControlMessage.reply(id: release, .ok).encoded) == [.answered(.talk(false), .ok)])
    }

    @Test func stateChangesAreReportedOnceAndTheHostLeavingAnswersWhatWaits() {
        var p = PlayerControl()
        p.joined()
        let first = HostControlState(features: .control)
        #expect(p.received(first.encodedState) == [.stateChanged(first, previous: nil)])
        #expect(p.received(first.encodedState) == [])
        let paused = HostControlState(paused: true, features: .control)
        #expect(p.received(paused.encodedState) == [.stateChanged(paused, previous: first)])
        _ = p.request(.resume, now: 0)
        #expect(p.left() == [.answered(.resume, .failed("the host left"))])
        #expect(p.pendingCount == 0 && p.host == nil)
    }

    @Test func aHostThatNeverAnswersCannotGrowTheTable() {
        var p = PlayerControl()
        p.joined()
        _ = p.received(HostControlState(features: .control).encodedState)
        for _ in 0..<PlayerControl.maximumPending {
            guard case .send = p.request(.pause, now: 0) else { Issue.record("refused too early"); return }
        }
        guard case .refused = p.request(.pause, now: 0) else { Issue.record("the table grew past its bound"); return }
        #expect(p.pendingCount == PlayerControl.maximumPending)
    }

    @Test("A command that could not be sent is answered as failed at once (push-to-talk's latest decides), leaves the table, and a late reply to it is malformed")
    func aCommandNotSentIsSettled() {
        var p = PlayerControl()
        p.joined()
        _ = p.received(HostControlState(features: [.control, .talk]).encodedState)
        guard case .send(_, let pause) = p.request(.pause, now: 0), case .send(_, let on) = p.request(.talk(true), now: 0),
              case .send(_, let again) = p.request(.talk(true), now: 0) else { Issue.record("not sent"); return }
        #expect(p.notSent(id: pause, because: "the peer is not reading") == [.answered(.pause, .failed("not sent: the peer is not reading"))])
        #expect(p.notSent(id: on, because: "x") == [.superseded(.talk(true), .failed("not sent: x"))], "an earlier talk does not decide")
        #expect(p.notSent(id: again, because: "gone") == [.answered(.talk(true), .failed("not sent: gone"))], "the latest decides")
        #expect(p.pendingCount == 0)
        #expect(p.notSent(id: pause, because: "twice") == [], "settled once")
        #expect(p.received(ControlMessage.reply(id: pause, .ok).encoded) == [.malformed("a reply to no command (id \(pause))")])
        // So a host that cannot be written to does not fill the table: every command can still be asked for.
        for _ in 0..<(2 * PlayerControl.maximumPending) {
            guard case .send(_, let id) = p.request(.resume, now: 0) else { Issue.record("refused: the table filled"); return }
            _ = p.notSent(id: id, because: "busy")
        }
    }

    @Test("Talk commands that could not be sent after talk ons the host took: one talk off is sent for them all, even with the command budget spent; after a talk off that was sent, none")
    func anUnsentTalkCommandLeavesNoFloorHeld() throws {
        /// Talk commands asked for in order (each sent or, `unsent`, failing to send), then the host's `ok` to every
        /// one sent; the talk offs the player sends of itself meanwhile.
        func releases(_ talks: [(on: Bool, unsent: Bool)], budgetSpent: Bool = false) throws -> Int {
            var p = PlayerControl()
            p.joined()
            _ = p.received(HostControlState(features: [.control, .talk]).encodedState)
            var sent: [UInt32] = []
            for t in talks {
                guard case .send(_, let id) = p.request(.talk(t.on), now: 0) else { Issue.record("refused"); return -1 }
                if t.unsent { _ = p.notSent(id: id, because: "busy") } else { sent.append(id) }
            }
            if budgetSpent {
                while case .send(let bytes, _) = p.request(.pause, now: 0) {
                    guard case .command(let id, _) = try ControlMessage.decode(bytes) else { return -1 }
                    _ = p.received(ControlMessage.reply(id: id, .ok).encoded)
                }
            }
            var count = 0
            for id in sent {
                for action in p.received(ControlMessage.reply(id: id, .ok).encoded) {
                    if case .send(let bytes, _) = action, case .command(_, .talk(false)) = try ControlMessage.decode(bytes) { count += 1 }
                }
            }
            return count
        }
        #expect(try releases([(true, false), (false, true)]) == 1, "on, off unsent")
        #expect(try releases([(true, false), (false, true)], budgetSpent: true) == 1, "outside the budget")
        #expect(try releases([(true, false), (true, false), (false, true)]) == 1, "two ons taken, one talk off")
        #expect(try releases([(true, false), (false, true), (true, true)]) == 1, "on, off unsent, on unsent")
        #expect(try releases([(true, false), (true, true)]) == 1, "a second on unsent")
        #expect(try releases([(true, false), (false, false)]) == 0, "the host has the talk off already")
        #expect(try releases([(true, false), (false, true), (true, false)]) == 0, "the latest on was sent: its answer decides")
    }

    /// A player whose host answers every command at once: `commands` requests at the times given; the times of the
    /// ones sent, and the reasons of the ones refused.
    static func request(_ times: [UInt64]) -> (sent: [UInt64], refused: [String]) {
        var p = PlayerControl()
        p.joined()
        _ = p.received(HostControlState(features: [.control, .talk]).encodedState)
        var sent: [UInt64] = [], refused: [String] = []
        for (i, t) in times.enumerated() {
            switch p.request(i % 2 == 0 ? .pause : .resume, now: t) {
            case .send(let bytes, _):
                sent.append(t)
                guard case .command(let id, _)? = try? ControlMessage.decode(bytes) else { Issue.record("not a command"); continue }
                _ = p.received(ControlMessage.reply(id: id, .ok).encoded)
            case .refused(_, let why): refused.append(why)
            default: Issue.record("neither sent nor refused")
            }
        }
        return (sent, refused)
    }

    @Test func anHonestPlayerNeverOutrunsTheHostsBudgetSoNoAnswerItWaitsForIsDropped() {
        // 200 at once: the burst goes, the rest are refused here, with the reason.
        let once = Self.request(Array(repeating: 1_000, count: 200))
        #expect(once.sent.count == Int(PlayerControl.burst) && once.refused.count == 200 - Int(PlayerControl.burst))
        #expect(once.refused.allSatisfy { $0 == "too many commands: at most 40 a second, 80 at once" })
        // Its talk input ending right after such a burst: the floor is still given back.
        var p = PlayerControl()
        p.joined()
        _ = p.received(HostControlState(features: [.control, .talk]).encodedState)
        for _ in 0..<Int(PlayerControl.burst) {
            if case .send(let bytes, _) = p.request(.pause, now: 7), case .command(let id, _)? = try? ControlMessage.decode(bytes) {
                _ = p.received(ControlMessage.reply(id: id, .ok).encoded)
            }
        }
        guard case .refused = p.request(.talk(false), now: 7) else { Issue.record("the budget is spent"); return }
        guard case .send(let bytes, _) = p.releaseTalk(), case .command(_, .talk(false))? = try? ControlMessage.decode(bytes) else {
            Issue.record("talk off was not sent when the talk input ended"); return
        }
        // A script that pipes 200 a second for 10 s: what leaves the player, bunched by the network (each one up to
        // 0.5 s late, in any order), is all taken by the host's budget: none is dropped unanswered.
        let times = (0..<2_000).map { UInt64($0) * 5_000_000 }
        let flood = Self.request(times)
        #expect(flood.sent.count == Int(PlayerControl.burst) + 40 * 10 - 1 || flood.sent.count == Int(PlayerControl.burst) + 40 * 10,
                "the burst, then 40 a second: \(flood.sent.count)")
        var rng = SeededRandom(seed: 7)
        for spread in [UInt64(0), 100_000_000, 500_000_000] {
            var host = CommandBudget<Int>()
            let arrivals = flood.sent.map { $0 + (spread == 0 ? 0 : rng.next() % spread) }.sorted()
            let dropped = arrivals.filter { host.spend(1, now: $0) != .take }.count
            #expect(dropped == 0, "network delays up to \(spread / 1_000_000) ms: \(dropped) dropped by the host")
        }
    }
}

@Suite("Log throttle (pure)")
struct LogThrottleTests {
    @Test func oneLineAKeyASecondAndTheRestCounted() {
        var t = LogThrottle<String>(interval: 1_000)
        #expect(t.admit("a", now: 0) == 0)
        #expect(t.admit("a", now: 10) == nil)
        #expect(t.admit("a", now: 999) == nil)
        #expect(t.admit("b", now: 500) == 0, "keys are apart")
        #expect(t.admit("a", now: 1_000) == 2, "the next line says how many were held back")
        #expect(t.admit("a", now: 1_500) == nil)
        // A key is kept while it may hold a line back, and a count of lines held back for a while besides: keys that
        // come and go do not pile up.
        #expect(t.count == 2)
        #expect(t.admit("c", now: 1_600) == 0)
        #expect(t.count == 2, "b's interval is over and it held nothing back: forgotten")
        #expect(t.admit("b", now: 1_700) == 0, "a forgotten key comes at once, as it would have")
        #expect(t.admit("a", now: 2_000) == 1, "a's held line is said with its next one")
        for k in 0..<1_000 { _ = t.admit("k\(k)", now: 10_000 + UInt64(k) * 100) }
        #expect(t.count <= 11, "\(t.count) keys remembered")
        _ = t.admit("x", now: 200_000)
        _ = t.admit("x", now: 200_001)
        _ = t.admit("y", now: 200_000 + 59 * 1_000)
        #expect(t.admit("x", now: 200_000 + 59 * 1_000 + 10) == 1, "kept 60 intervals for its count")
        _ = t.admit("z", now: 400_000)
        _ = t.admit("z", now: 400_001)
        _ = t.admit("w", now: 400_000 + 61 * 1_000)
        #expect(t.admit("z", now: 400_000 + 61 * 1_000 + 10) == 0, "then forgotten")
    }
}

@Suite("Command budget (pure, virtual time)")
struct CommandBudgetTests {
    static let second: UInt64 = 1_000_000_000

    @Test func aBurstThenTheSustainedRateAndEveryCommandOverItIsDroppedCountedAndToldOnceASecond() {
        var b = CommandBudget<Int>()
        #expect(b.commandsPerSecond == 50 && b.burst == 100)
        var t = 5 * Self.second
        // 100 at once are taken; the 101st is dropped, and the player told.
        #expect((0..<100).filter { _ in b.spend(1, now: t) == .take }.count == 100)
        #expect(b.spend(1, now: t) == .dropAndTell(dropped: 1))
        // More within the second: dropped without a word.
        #expect((0..<9).allSatisfy { _ in b.spend(1, now: t + 1_000) == .drop })
        #expect(b.dropped(by: 1) == 10 && b.totalDropped == 10)
        // Another player has a budget of its own.
        #expect(b.spend(2, now: t) == .take && b.dropped(by: 2) == 0)
        // 20 ms buys exactly one more.
        t += 20_000_000
        #expect(b.spend(1, now: t) == .take)
        #expect(b.spend(1, now: t) == .drop)
        // A second after the telling: 0.98 s bought 49; the next drop is told, with the 10 dropped silently since.
        t = 6 * Self.second
        #expect((0..<49).filter { _ in b.spend(1, now: t) == .take }.count == 49)
        #expect(b.spend(1, now: t) == .dropAndTell(dropped: 11))
        #expect(b.dropped(by: 1) == 12 && b.totalDropped == 12)
        // The drops in silence after a telling are said a second later (which counts as telling), and then no more.
        #expect(b.takeUntold(1, now: t + Self.second) == nil, "none since")
        #expect(b.spend(1, now: t + 1_000) == .drop)
        #expect(b.spend(1, now: t + 2_000) == .drop)
        #expect(b.takeUntold(1, now: t + Self.second) == 2)
        #expect(b.takeUntold(1, now: t + Self.second) == nil)
        #expect(b.spend(1, now: t + Self.second + 1_000) == .take, "a second bought 50")
        #expect(b.takeUntold(2, now: t) == nil && b.takeUntold(99, now: t) == nil)
    }

    @Test func aFloodOf1000ASecondFor10SecondsGetsExactlyTheBurstAndTheRateThroughAndIsToldTenTimes() {
        var b = CommandBudget<Int>()
        let start = 100 * Self.second
        var taken = 0, told: [UInt64] = []
        for k in 0..<10_000 {
            switch b.spend(7, now: start + UInt64(k) * 1_000_000) {
            case .take: taken += 1
            case .drop: break
            case .dropAndTell(let n): told.append(n)
            }
        }
        // Credit: a full burst (2 s worth) plus 9.999 s, at 20 ms a command.
        #expect(taken == 599)
        #expect(b.dropped(by: 7) == 9_401 && b.totalDropped == 9_401)
        #expect(told.count == 10, "told once a second: \(told)")
        #expect(told.reduce(0, +) <= 9_401 && told.dropFirst().allSatisfy { $0 <= 1_000 })
        #expect(told.reduce(0, +) + (b.takeUntold(7, now: start + 11 * Self.second) ?? 0) == 9_401, "every drop is said once")
        // A player that leaves and comes back at once finds its budget as it left it: a reconnect buys no burst.
        let left = start + 10 * Self.second
        b.forget(7, now: left)
        #expect(b.dropped(by: 7) == 9_401, "remembered while its bucket refills")
        let back = (0..<100).filter { _ in b.spend(7, now: left + 1_000) == .take }.count
        #expect(back <= 1, "no fresh burst for coming back: \(back)")
        #expect(b.totalDropped == 9_401 + UInt64(100 - back))
        // Gone for the 2 s its bucket takes to fill, it is forgotten (it would come back to a full burst anyway) when
        // another player leaves; its drops stay in the total.
        b.forget(7, now: left + 2_000)
        b.forget(8, now: left + Self.second)
        #expect(b.dropped(by: 7) > 0, "not full yet")
        b.forget(8, now: left + 2 * Self.second + 2_000)
        #expect(b.dropped(by: 7) == 0 && b.totalDropped == 9_401 + UInt64(100 - back))
        #expect((0..<101).filter { _ in b.spend(7, now: left + 3 * Self.second) == .take }.count == 100)
    }

    @Test("Leaving and rejoining at once, a thousand times, gets a player no more than staying would")
    func reconnectingBuysNoBudget() {
        var b = CommandBudget<Int>()
        let start = 100 * Self.second
        var taken = 0
        // 1,000 visits in one second, 100 commands each, each visit a fresh connection of the same key.
        for visit in 0..<1_000 {
            let now = start + UInt64(visit) * 1_000_000
            taken += (0..<100).filter { _ in b.spend(1, now: now) == .take }.count
            b.forget(1, now: now)
        }
        // The burst, and 50 a second for the 0.999 s the visits took (20 ms a command): as if it had stayed.
        #expect(taken == 100 + 49, "\(taken)")
        #expect(b.totalDropped == 100_000 - UInt64(taken))
    }
}

@Suite("Change line coalescer (pure, virtual time)")
struct ChangeLineCoalescerTests {
    @Test func theFirstChangeIsLoggedTheRestOfTheSecondIsSummedUpInOneLine() {
        var c = ChangeLineCoalescer<Int>(interval: 1_000_000_000)
        let t0: UInt64 = 1_000_000_000
        #expect(c.change(1, now: t0) == .log(held: 0))
        #expect(c.change(1, now: t0 + 1_000_000) == .hold(summarizeIn: 999_000_000))
        #expect(c.change(1, now: t0 + 2_000_000) == .hold(summarizeIn: nil))
        #expect(c.change(2, now: t0 + 2_000_000) == .log(held: 0), "each player has its own second")
        #expect(c.summarize(1, now: t0 + 1_000_000_000) == 2)
        #expect(c.summarize(1, now: t0 + 1_000_000_000) == nil, "said once")
        #expect(c.summarize(2, now: t0 + 1_000_000_000) == nil, "nothing held: nothing to say")
        // The summary opens the next second.
        #expect(c.change(1, now: t0 + 1_000_000_005) == .hold(summarizeIn: 999_999_995))
        // A summary that comes late: the change after the second says what was held, and the summary nothing.
        #expect(c.change(1, now: t0 + 3_000_000_000) == .log(held: 1))
        #expect(c.summarize(1, now: t0 + 3_000_000_001) == nil)
    }

    @Test("A player that leaves keeps its second (coming back buys no fresh line); keys with nothing held and their second over are forgotten")
    func keysOutliveAVisitButDoNotPileUp() {
        var c = ChangeLineCoalescer<Int>(interval: 1_000)
        #expect(c.change(1, now: 0) == .log(held: 0), "joined")
        #expect(c.change(1, now: 10) == .hold(summarizeIn: 990), "left: held")
        #expect(c.change(1, now: 20) == .hold(summarizeIn: nil), "joined again: held")
        #expect(c.change(2, now: 30) == .log(held: 0))
        #expect(c.count == 2)
        #expect(c.summarize(1, now: 1_000) == 2)
        #expect(c.change(3, now: 2_500) == .log(held: 0))
        #expect(c.count == 1, "1's summary left nothing held and its second is over; so is 2's")
        for k in 0..<1_000 { _ = c.change(100 + k, now: 10_000 + UInt64(k) * 100) }
        #expect(c.count <= 11, "\(c.count) keys remembered")
    }

    @Test func aPlayerThatTogglesAThousandTimesASecondCostsOneLineASecondAndEveryChangeIsAccountedFor() {
        var c = ChangeLineCoalescer<Int>(interval: 1_000_000_000)
        var lines = 0, accounted = 0
        var summaryAt: UInt64?
        let start: UInt64 = 50_000_000_000
        func summarizeIfDue(_ now: UInt64) {
            guard let at = summaryAt, at <= now else { return }
            summaryAt = nil
            if let held = c.summarize(1, now: at) { lines += 1; accounted += held }
        }
        for k in 0..<10_000 {
            let now = start + UInt64(k) * 1_000_000
            summarizeIfDue(now)
            switch c.change(1, now: now) {
            case .log(let held): lines += 1; accounted += 1 + held
            case .hold(let after): if let after { summaryAt = now + after }
            }
        }
        summarizeIfDue(UInt64.max)
        #expect(accounted == 10_000)
        #expect(lines == 11, "the first change, then one summary a second: \(lines)")
    }
}
