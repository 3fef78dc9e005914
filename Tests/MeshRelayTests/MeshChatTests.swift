import Foundation
import Testing
import MeshCLI
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh

/// `mesh-chat` members as real processes over the Avahi rig on lo, each with its own state directory and stdin.
private final class Member {
    let name: String
    let directory: String
    let input = Pipe()
    let process: ChildProcess

    /// Member `name` (its directory), giving `displayName` (default: `name`) as its name.
    init(_ name: String, service: String, root: String, displayName: String? = nil, extra: [String] = []) throws {
        self.name = name
        directory = "\(root)/\(name)"
        try FileManager.default.createDirectory(atPath: directory + "/inbox", withIntermediateDirectories: true)
        process = try ChildProcess(product: "mesh-chat", ["--name", displayName ?? name, "--service", service, "--state-dir", directory + "/state",
                                                         "--receive-dir", directory + "/inbox", "--peer-timeout", "2"] + extra,
                                   stdin: input.fileHandleForReading)
    }

    /// Types `line` (a member that has died takes nothing: the write fails, the test goes on to say why).
    func type(_ line: String) { try? input.fileHandleForWriting.write(contentsOf: Data((line + "\n").utf8)) }
    func endInput() { try? input.fileHandleForWriting.close() }
    var lines: [String] { process.stdout }
    func count(_ line: String) -> Int { lines.filter { $0 == line }.count }

    /// The last `/who` answer, as names.
    func who() -> [String]? {
        guard let l = lines.last(where: { $0.hasPrefix("* members:") }) else { return nil }
        return l.dropFirst("* members:".count).split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }
}

/// State directories for `names` under `root` in which every member has paired with every other one (as
/// `mesh-chat --pair` leaves them), so the rooms run as users run them: paired-only, encrypted.
private func pairEveryone(_ names: [String], root: String) throws {
    let identities = try names.map { try PeerIdentity.generate(displayName: $0) }
    for (i, me) in identities.enumerated() {
        try me.save(to: "\(root)/\(names[i])/state/identity.json")
        let trust = TrustStore(path: "\(root)/\(names[i])/state/paired.json")
        for other in identities where other.publicKey != me.publicKey { try trust.add(other.publicKey, name: other.displayName) }
    }
}

@Suite("mesh-chat: a full-mesh room of real processes over Avahi on lo", .serialized, .avahiDaemonShared,
       .enabled(if: Rig.avahi, "needs MESH_AVAHI_RIG=1 (scripts/lib/avahi-rig.sh)"))
struct MeshChatTests {
    /// `n` members who have all paired with each other, in a room of their own; returns once each saw the others join.
    private func room(_ n: Int, open: Bool = false, extra: [String] = []) throws -> [Member] {
        let service = Rig.uniqueService()
        let root = Rig.tempPath("chat-\(UUID().uuidString)")
        let names = (0..<n).map { "m\($0)" }
        if !open { try pairEveryone(names, root: root) }
        let members = try names.map { try Member($0, service: service, root: root, extra: (open ? ["--accept", "all"] : []) + extra) }
        // Everyone is connected to everyone: each member saw each other one join.
        // In an open room nobody is paired, and each is marked so.
        let joined = eventually(30) { members.allSatisfy { m in members.allSatisfy { $0 === m || m.count("* \($0.name)\(open ? " (not paired)" : "") joined") == 1 } } }
        #expect(joined, "not all joined: \(members.map { "\($0.name): \($0.lines)" })")
        return members
    }

    @Test("Every line reaches every other member exactly once, /who agrees, and a killed member leaves everyone", arguments: [3, 5])
    func linesWhoAndDeparture(_ n: Int) throws {
        let members = try room(n)
        for m in members { m.type("hello from \(m.name)") }
        for m in members { m.type("/to \(members[0].name) only for \(members[0].name) from \(m.name)") }
        #expect(eventually(10) { members.allSatisfy { m in members.allSatisfy { $0 === m || m.count("<\($0.name)> hello from \($0.name)") == 1 } } })
        usleep(300_000)
        for m in members {
            for other in members where other !== m {
                #expect(m.count("<\(other.name)> hello from \(other.name)") == 1, "\(m.name) heard \(other.name) once")
            }
            #expect(!m.lines.contains("<\(m.name)> hello from \(m.name)"), "nobody hears itself")
        }
        // A direct line reaches only the member it names.
        #expect(eventually(5) { members[0].lines.filter { $0.contains("to you> only for m0") }.count == n - 1 })
        for m in members.dropFirst() { #expect(!m.lines.contains { $0.contains("only for m0") }) }

        for m in members { m.type("/who") }
        #expect(eventually(5) { members.allSatisfy { $0.who() != nil } })
        for m in members {
            #expect(m.who() == members.filter { $0 !== m }.map(\.name).sorted(), "\(m.name)'s /who")
        }

        // kill -9 of the last: everyone else says it left, within the peer timeout (2 s) and some slack.
        let gone = members[n - 1]
        let start = Date()
        gone.process.stop()
        #expect(eventually(6) { members.dropLast().allSatisfy { $0.count("* \(gone.name) left") == 1 } })
        #expect(Date().timeIntervalSince(start) < 4.5, "left after \(Date().timeIntervalSince(start)) s")

        // End of input leaves the room and exits 0.
        for m in members.dropLast() { m.endInput() }
        for m in members.dropLast() { #expect(m.process.waitForExit(seconds: 10) == 0, "\(m.name) exit status") }
    }

    /// Ctrl-C waits for the files being sent, but never holds the program: the signal is handled off the main queue,
    /// and a second one leaves at once (before, the first blocked the queue signals are handled on, for up to 10
    /// minutes, and only SIGKILL ended it).
    @Test("Ctrl-C during a send that cannot finish says so and waits; a second Ctrl-C leaves at once, exit 1")
    func secondSignalLeavesDuringAStalledSend() throws {
        // A peer timeout longer than the test: the stopped member must not be taken for gone (which ends the send).
        let members = try room(2, extra: ["--peer-timeout", "60"])
        let (a, b) = (members[0], members[1])
        let path = a.directory + "/stalled.bin"
        try Data(count: 64 << 20).write(to: URL(fileURLWithPath: path))
        kill(b.process.pid, SIGSTOP)  // b takes nothing more: a's send stalls once the socket buffers are full
        defer { kill(b.process.pid, SIGCONT); b.endInput(); _ = b.process.waitForExit(seconds: 10) }
        a.type("/send \(path)")
        usleep(1_500_000)
        a.process.signal(SIGINT)
        #expect(eventually(5) { a.process.stderr.contains { $0.contains("leaving once 1 file(s) are sent (Ctrl-C again to leave now)") } },
                "\(a.process.stderr.suffix(5))")
        usleep(1_000_000)
        #expect(a.process.isRunning, "the first Ctrl-C waits for the send")
        let second = Date()
        a.process.signal(SIGINT)
        #expect(a.process.waitForExit(seconds: 5) == 1)
        #expect(Date().timeIntervalSince(second) < 3, "left \(Date().timeIntervalSince(second)) s after the second Ctrl-C")
        #expect(a.process.stderr.contains { $0.contains("left with 1 file(s) not sent whole") })
    }

    @Test("A 50 MB file arrives at every member with an equal SHA-256 while another member's lines keep arriving")
    func fileWhileChatting() throws {
        let members = try room(3)
        let (a, b, c) = (members[0], members[1], members[2])
        let path = a.directory + "/big.bin"
        var rng = SeededRandom(seed: 50)
        var bytes = [UInt8](repeating: 0, count: 50 << 20)
        bytes.withUnsafeMutableBytes { raw in for i in raw.bindMemory(to: UInt64.self).indices { raw.bindMemory(to: UInt64.self)[i] = rng.next() } }
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        a.type("/send \(path)")
        for i in 0..<20 {
            b.type("chat \(i)")
            usleep(20_000)
        }
        #expect(eventually(60) { [b, c].allSatisfy { m in m.lines.contains { $0.hasPrefix("* received big.bin from m0: ") } } })
        #expect(eventually(5) { (0..<20).allSatisfy { c.count("<m1> chat \($0)") == 1 } })
        let digest = Sodium.sha256([bytes])
        for m in [b, c] {
            let line = try #require(m.lines.first { $0.hasPrefix("* received big.bin from m0: ") })
            let got = try Data(contentsOf: URL(fileURLWithPath: String(line.dropFirst("* received big.bin from m0: ".count))))
            #expect(Sodium.sha256([Array(got)]) == digest, "\(m.name)'s copy")
        }
        // The lines were not held up behind the file: c had some before the file was in.
        let cLines = c.lines
        if let fileAt = cLines.firstIndex(where: { $0.hasPrefix("* received big.bin") }),
           let firstChat = cLines.firstIndex(of: "<m1> chat 0") {
            #expect(firstChat < fileAt, "chat waited for the 50 MB file")
        }
        // A dot name (a shell's startup file, in a directory someone may chat from) is kept visible, not as sent.
        try Data("export PATH=/tmp/evil\n".utf8).write(to: URL(fileURLWithPath: a.directory + "/.envrc"))
        a.type("/send \(a.directory)/.envrc")
        #expect(eventually(20) { b.lines.contains("* received .envrc from m0: \(b.directory)/inbox/_envrc") }, "\(b.lines.suffix(3))")
        #expect(!FileManager.default.fileExists(atPath: b.directory + "/inbox/.envrc"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: b.directory + "/inbox/_envrc")) == Data("export PATH=/tmp/evil\n".utf8))
        for m in members { m.endInput() }
        for m in members { #expect(m.process.waitForExit(seconds: 20) == 0) }
    }

    @Test("--pair shows a code, --pair CODE pairs both ways and exits 0; then the two meet in a paired-only room")
    func pairThenMeet() throws {
        let service = Rig.uniqueService()
        let root = Rig.tempPath("chat-\(UUID().uuidString)")
        let x = try Member("x", service: service, root: root, extra: ["--pair", "--pair-timeout", "20"])
        #expect(eventually(10) { x.process.stderr.contains { $0.contains("pairing code: ") } })
        let line = try #require(x.process.stderr.first { $0.contains("pairing code: ") })
        let code = String(try #require(line.split(separator: " ").first { $0.count == 9 && $0.contains("-") }))

        let wrongState = root + "/w/state"
        let wrong = try ChildProcess(product: "mesh-chat", ["--name", "w", "--service", service, "--state-dir", wrongState,
                                                           "--pair", code == "1111-1111" ? "2222-2222" : "1111-1111"])
        #expect(wrong.waitForExit(seconds: 20) == 1, "a wrong code fails")

        let yState = root + "/y/state"
        let pairing = try ChildProcess(product: "mesh-chat", ["--name", "y", "--service", service, "--state-dir", yState, "--pair", code])
        #expect(pairing.waitForExit(seconds: 20) == 0, "stderr: \(pairing.stderr)")
        #expect(pairing.stderr.contains { $0.contains("paired with x") })
        #expect(x.process.stderr.contains { $0.contains("paired y") })

        // Now y comes in like x, paired-only: the two meet.
        let y = try Member("y", service: service, root: root, extra: [])
        #expect(eventually(15) { x.count("* y joined") == 1 && y.count("* x joined") == 1 }, "x: \(x.lines) y: \(y.lines)")
        y.type("hi x")
        #expect(eventually(5) { x.count("<y> hi x") == 1 })
        x.endInput(); y.endInput()
        #expect(x.process.waitForExit(seconds: 10) == 0 && y.process.waitForExit(seconds: 10) == 0)
    }

    @Test("A paired member that gives another's name is shown by the name it was paired under, and /to that name misses it")
    func pairedNamesInTheRoom() throws {
        let service = Rig.uniqueService()
        let root = Rig.tempPath("chat-\(UUID().uuidString)")
        try pairEveryone(["m0", "m1", "m2"], root: root)
        let m0 = try Member("m0", service: service, root: root)
        let m1 = try Member("m1", service: service, root: root)
        let m2 = try Member("m2", service: service, root: root, displayName: "m0")
        let all = [m0, m1, m2]
        defer { for m in all { m.process.stop() } }
        // Each side learns of a link in its own time: wait until every member has the other two, or a line typed by
        // one that has not yet heard of the other goes to no one.
        #expect(eventually(30) {
            m1.count("* m0 joined") >= 1 && m1.count("* m2 joined (calls itself \"m0\")") >= 1
                && m0.count("* m1 joined") >= 1 && m0.count("* m2 joined (calls itself \"m0\")") >= 1
                && m2.count("* m0 joined") >= 1 && m2.count("* m1 joined") >= 1
        }, "m0: \(m0.lines) m1: \(m1.lines) m2: \(m2.lines)")
        m2.type("I am m0, honest")
        #expect(eventually(5) { m1.count("<m2> I am m0, honest") == 1 }, "\(m1.lines)")
        #expect(!m1.lines.contains("<m0> I am m0, honest"))
        m1.type("/to m0 for the real m0")
        #expect(eventually(5) { m0.count("<m1 to you> for the real m0") == 1 }, "\(m0.lines)")
        usleep(500_000)
        #expect(!m2.lines.contains { $0.contains("for the real m0") }, "\(m2.lines)")
    }

    @Test("An open room (the one mode that lets anyone in): unpaired members meet and talk")
    func openRoom() throws {
        let members = try room(3, open: true)
        members[0].type("anyone here?")
        #expect(eventually(5) { members.dropFirst().allSatisfy { $0.count("<m0 (not paired)> anyone here?") == 1 } })
        for m in members { m.endInput() }
        for m in members { #expect(m.process.waitForExit(seconds: 10) == 0) }
    }

    @Test("By default only paired members get in: two strangers stay apart")
    func pairedOnlyByDefault() throws {
        let service = Rig.uniqueService()
        let root = Rig.tempPath("chat-\(UUID().uuidString)")
        let x = try Member("x", service: service, root: root, extra: [])
        let y = try Member("y", service: service, root: root, extra: [])
        usleep(3_000_000)
        #expect(!x.lines.contains { $0.contains("joined") } && !y.lines.contains { $0.contains("joined") })
        #expect(x.process.stderr.contains { $0.contains("paired members only") })
        x.endInput(); y.endInput()
        #expect(x.process.waitForExit(seconds: 10) == 0 && y.process.waitForExit(seconds: 10) == 0)
    }
}

@Suite("mesh-chat: command lines and wire text (pure)")
struct ChatParsingTests {
    @Test func inputLines() {
        #expect(ChatInput(line: "hi there") == .say("hi there"))
        #expect(ChatInput(line: "") == .nothing)
        #expect(ChatInput(line: "/who") == .who)
        #expect(ChatInput(line: "/quit") == .quit)
        #expect(ChatInput(line: "/to ann see you") == .tell(name: "ann", text: "see you"))
        #expect(ChatInput(line: "/send /tmp/a b.wav") == .send(path: "/tmp/a b.wav"))
        #expect(ChatInput(line: "hello\r") == .say("hello"))
        guard case .invalid = ChatInput(line: "/to ann") else { Issue.record("/to without text"); return }
        guard case .invalid = ChatInput(line: "/send") else { Issue.record("/send without a path"); return }
        guard case .invalid = ChatInput(line: "/dance") else { Issue.record("unknown command"); return }
    }

    @Test("A received file keeps its name unless that is taken or starts with a dot, cut to fit 255 bytes")
    func receivedFileNames() {
        #expect(ReceivedFile.name(for: "song.wav") == "song.wav")
        #expect(ReceivedFile.name(for: ".bash_profile") == "_bash_profile")
        #expect(ReceivedFile.name(for: "a.b.") == "a.b.")
        #expect(ReceivedFile.name(for: ".\u{301}envrc") == "_\u{301}envrc", "a dot with a combining mark is still a dot")
        #expect(ReceivedFile.candidate(in: "/in", for: ".envrc", attempt: 0) == "/in/_envrc")
        #expect(ReceivedFile.candidate(in: "/in", for: ".envrc", attempt: 2) == "/in/_envrc.2")
        // The longest name there is (255 bytes) stays within it, dot or suffix: cut at its end.
        let longest = "." + String(repeating: "é", count: 127)
        #expect(ReceivedFile.name(for: longest).utf8.count == 255)
        #expect(ReceivedFile.candidate(in: "/in", for: longest, attempt: 1) == "/in/_" + String(repeating: "é", count: 126) + ".1")
        // One character of 255 bytes (a letter and 127 combining marks) is cut a scalar at a time, never to nothing.
        let oneCharacter = "a" + String(repeating: "\u{301}", count: 127)
        #expect(ReceivedFile.candidate(in: "/in", for: oneCharacter, attempt: 1) == "/in/a" + String(repeating: "\u{301}", count: 126) + ".1")
    }

    @Test("Keeping a received file never replaces or writes through what is there: a file, a directory, a planted link")
    func receivedFilesNeverReplace() throws {
        let dir = try TemporaryDirectory.make(in: TemporaryDirectory.system, prefix: "pm-chat-keep-")
        defer { TemporaryDirectory.remove(dir) }
        let staging = try TemporaryDirectory.make(in: TemporaryDirectory.system, prefix: "pm-chat-staging-")
        defer { TemporaryDirectory.remove(staging) }
        func arrived(_ text: String) throws -> String {
            let path = "\(staging)/\(UUID().uuidString)"
            try Data(text.utf8).write(to: URL(fileURLWithPath: path))
            return path
        }
        func contents(_ path: String) -> String? { FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) } }

        let first = try arrived("one")
        #expect(try ReceivedFile.keep(first, in: dir, for: ".envrc") == "\(dir)/_envrc")
        #expect(contents("\(dir)/_envrc") == "one")
        #expect(!FileManager.default.fileExists(atPath: first), "moved, not copied")
        // A link planted at the next name, leading to a file that does not exist yet, and a directory after it.
        let victim = "\(dir)/victim"
        try FileManager.default.createSymbolicLink(atPath: "\(dir)/_envrc.1", withDestinationPath: victim)
        try FileManager.default.createDirectory(atPath: "\(dir)/_envrc.2", withIntermediateDirectories: false)
        #expect(try ReceivedFile.keep(try arrived("two"), in: dir, for: ".envrc") == "\(dir)/_envrc.3")
        #expect(contents("\(dir)/_envrc") == "one", "the first file is as it was")
        #expect(contents("\(dir)/_envrc.3") == "two")
        #expect(!FileManager.default.fileExists(atPath: victim), "nothing written through the link")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: "\(dir)/_envrc.1") == victim)

        // From another file system (resources arrive in $TMPDIR; the receive directory may be elsewhere): copied
        // with the same care, then the original removed.
        var tmpfs = stat(), here = stat()
        if stat("/dev/shm", &tmpfs) == 0, stat(dir, &here) == 0, tmpfs.st_dev != here.st_dev {
            let elsewhere = try TemporaryDirectory.make(in: "/dev/shm", prefix: "pm-chat-other-fs-")
            defer { TemporaryDirectory.remove(elsewhere) }
            let far = "\(elsewhere)/arrived"
            let bytes = (0..<3_000_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            try Data(bytes).write(to: URL(fileURLWithPath: far))
            try FileManager.default.createSymbolicLink(atPath: "\(dir)/song.wav", withDestinationPath: victim)
            for n in 1...20 { #expect(FileManager.default.createFile(atPath: "\(dir)/song.wav.\(n)", contents: Data("old".utf8))) }
            #expect(try ReceivedFile.keep(far, in: dir, for: "song.wav") == "\(dir)/song.wav.21", "copied once, then put at the first free name")
            #expect(FileManager.default.contents(atPath: "\(dir)/song.wav.21") == Data(bytes))
            #expect(FileManager.default.contents(atPath: "\(dir)/song.wav.20") == Data("old".utf8))
            #expect(!FileManager.default.fileExists(atPath: far))
            #expect(!FileManager.default.fileExists(atPath: victim))
            #expect(try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasPrefix(".partial-") }.isEmpty,
                    "the copy was made under a name of its own, then put in place")
        }

        // Every name taken: an error that says so, and the file kept where it was.
        let many = try TemporaryDirectory.make(in: TemporaryDirectory.system, prefix: "pm-chat-full-")
        defer { TemporaryDirectory.remove(many) }
        for attempt in 0..<ReceivedFile.maximumAttempts {
            #expect(FileManager.default.createFile(atPath: ReceivedFile.candidate(in: many, for: "x", attempt: attempt), contents: nil))
        }
        let last = try arrived("kept")
        #expect(throws: SyscallError.self) { try ReceivedFile.keep(last, in: many, for: "x") }
        #expect(contents(last) == "kept")
    }

    @Test func messagesRoundTripAndHostileTextIsDropped() {
        #expect(ChatMessage.decode(ChatMessage.room("hé 🎧").encoded()) == .room("hé 🎧"))
        #expect(ChatMessage.decode(ChatMessage.direct("x\ty").encoded()) == .direct("x\ty"))
        #expect(ChatMessage.decode(Data()) == nil)
        #expect(ChatMessage.decode(Data([3, 0x61])) == nil, "unknown kind")
        #expect(ChatMessage.decode(Data([1, 0xff])) == nil, "not UTF-8")
        #expect(ChatMessage.decode(Data([1] + Array("\u{1B}[2Jowned".utf8))) == nil, "terminal escapes")
        #expect(ChatMessage.decode(Data([1] + Array("a\nb".utf8))) == nil, "a second line")
    }

    @Test func options() throws {
        guard case .run(let o) = try ChatOptions.parse(["--name", "ann", "--accept", "all", "--service", "room-1"]) else {
            Issue.record("not a run"); return
        }
        #expect(o.name == "ann" && o.accept == .all && o.service == "room-1")
        #expect(throws: UsageError.self) { try ChatOptions.parse([]) }
        #expect(throws: UsageError.self) { try ChatOptions.parse(["--name", "ann", "--accept", "some"]) }
        #expect(throws: UsageError.self) { try ChatOptions.parse(["--name", "ann", "--service", "Not_Valid"]) }
        #expect(throws: UsageError.self) { try ChatOptions.parse(["--name", ""]) }
        #expect(throws: UsageError.self) { try ChatOptions.parse(["--name", "ann", "--pair", "12"]) }
        guard case .run(let w) = try ChatOptions.parse(["--name", "ann", "--pair", "--accept", "all"]),
              case .run(let c) = try ChatOptions.parse(["--name", "ann", "--pair", "4821-0937"]) else { Issue.record("not runs"); return }
        #expect(w.pair == .window && w.accept == .all && c.pair == .code("4821-0937"))
        #expect(try ChatOptions.parse(["--help"]) == .help)
    }
}
