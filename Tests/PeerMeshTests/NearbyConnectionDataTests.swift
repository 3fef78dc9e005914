import Foundation
import Testing
import Synchronization
import MeshPOSIX
import MeshTestSupport
@testable import PeerMesh

@Suite("Out-of-band connection data: the codec")
struct NearbyConnectionDataCodecTests {
    let sample = NearbyConnectionData(peer: try! PeerID(displayName: "kitchen"), forIdentity: 0x0102_0304_0506_0708,
                                      ticket: Array(1...16), port: 7_000, addresses: ["192.168.1.20", "fe80::1%1", "127.0.0.1"])

    @Test func roundTrips() {
        #expect(NearbyConnectionData.decode(sample.encoded()) == .success(sample))
        let bytes = sample.encoded()
        #expect(Array(bytes.prefix(6)) == Array("PMNC".utf8) + [1, peerMeshProtocolVersion])
    }

    @Test("Introduced across machines, no loopback address is listed; on one machine, or for a QR code, it stays")
    func listedAddresses() {
        let here = ["192.168.1.20", "198.18.0.1", "fd00::5", "127.0.0.1", "::1"]
        // The introducer reaches us at 198.18.0.1: the newcomer is elsewhere, where 127.0.0.1 is itself.
        #expect(NearbyConnectionData.listedAddresses(here, preferring: "198.18.0.1") == ["198.18.0.1", "192.168.1.20", "fd00::5"])
        // All on one machine: loopback first, the others kept.
        #expect(NearbyConnectionData.listedAddresses(here, preferring: "127.0.0.1")
                == ["127.0.0.1", "192.168.1.20", "198.18.0.1", "fd00::5", "::1"])
        #expect(NearbyConnectionData.listedAddresses(here, preferring: "::1").first == "::1")
        // No preference (a QR code, a file), or a scoped one that names our own interface: the list as it is.
        #expect(NearbyConnectionData.listedAddresses(here, preferring: nil) == here)
        #expect(NearbyConnectionData.listedAddresses(here, preferring: "fe80::1%eth0") == here)
        // A preferred address that is not among the candidates (bound elsewhere) still goes first; the cap holds.
        let many = (1...20).map { "10.0.0.\($0)" }
        let listed = NearbyConnectionData.listedAddresses(many, preferring: "10.0.1.1")
        #expect(listed.count == NearbyConnectionData.maximumAddresses && listed.first == "10.0.1.1" && listed[1] == "10.0.0.1")
    }

    @Test func refusesWhatIsNotWellFormed() {
        let good = sample.encoded()
        func decode(_ b: [UInt8]) -> NearbyConnectionData.DecodeError? {
            if case .failure(let e) = NearbyConnectionData.decode(b) { e } else { nil }
        }
        #expect(decode([]) == .notConnectionData)
        #expect(decode(Array("PMNX".utf8) + good.dropFirst(4)) == .notConnectionData)
        #expect(decode(Array(good.prefix(4)) + [2] + good.dropFirst(5)) == .unsupportedVersion(2, protocol: peerMeshProtocolVersion))
        for cut in [5, 7, 20, 60, good.count - 1] { #expect(decode(Array(good.prefix(cut))) == .truncated, "cut at \(cut)") }
        #expect(decode(good + [0]) == .trailingBytes)
        var empty = sample
        empty.addresses = []
        #expect(decode(empty.encoded()) == .badField("address count"))
        var many = sample
        many.addresses = Array(repeating: "10.0.0.1", count: 17)
        #expect(decode(many.encoded()) == .badField("address count"))
        var named = sample
        named.addresses = ["example.com"]
        #expect(decode(named.encoded()) == .badField("address"), "names would go to a resolver: numeric only")
        var noPort = sample
        noPort.port = 0
        #expect(decode(noPort.encoded()) == .badField("port"))
        var badName = good
        badName[7] = 0xff  // first byte of the display name
        #expect(decode(badName) == .badField("peer"))
    }
}

@Suite("Out-of-band connection data: sessions on 127.0.0.1 with no discovery", .serialized)
struct NearbyConnectionTests {
    struct Peers {
        let host: Session, guest: Session
        let hostLog = MeshEventLog(), guestLog = MeshEventLog()
        var hostPeer: PeerID { host.myPeerID }
        var guestPeer: PeerID { guest.myPeerID }

        init() throws {
            host = try Session(peer: try PeerID(displayName: "host"), configuration: .init(bindHost: "127.0.0.1"))
            guest = try Session(peer: try PeerID(displayName: "guest"), configuration: .init(bindHost: "127.0.0.1"))
            host.delegate = hostLog
            guest.delegate = guestLog
        }

        func bothConnected() -> Bool {
            host.connectedPeers == [guestPeer] && guest.connectedPeers == [hostPeer]
        }
    }

    @Test("The data connects two sessions directly, encrypted, with no prompt; a message flows")
    func connects() throws {
        let p = try Peers()
        let data = try p.host.nearbyConnectionData(forPeer: p.guestPeer)
        let blob = try NearbyConnectionData.decode(Array(data)).get()
        #expect(blob.addresses == ["127.0.0.1"] && blob.peer.publicKey == p.hostPeer.publicKey)
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: data)
        #expect(eventually(5) { p.bothConnected() })
        #expect(p.host.isEncrypted(p.guestPeer) && p.guest.isEncrypted(p.hostPeer))
        #expect(p.host.shortAuthenticationString(for: p.guestPeer) == p.guest.shortAuthenticationString(for: p.hostPeer))
        // The inviter was told them once, before it was connected.
        let told = p.guestLog.state.withLock { $0.digits }
        #expect(told.count == 1 && told.first?.0 == p.hostPeer && told.first?.afterConnected == false)
        #expect(told.first?.1 == p.host.shortAuthenticationString(for: p.guestPeer))
        try p.guest.send(Data("over the direct link".utf8), toPeers: [p.hostPeer], with: .reliable)
        #expect(p.hostLog.wait(5) { $0.reliable.first?.1 == Data("over the direct link".utf8) })
        #expect(p.guestLog.states(of: p.hostPeer) == [.connecting, .connected])
    }

    @Test("Tickets: a member's gap-filling requests are counted apart from its newcomers'; members that ask without end flush the largest holders first, never an honest member's few; the app's and the introductions' budgets are apart")
    func ticketPools() throws {
        let session = try Session(peer: try PeerID(displayName: "host"), configuration: .init(bindHost: "127.0.0.1"))
        func introduction(_ member: UInt64, fillsGap: Bool = false) -> MembershipStateMachine.Introduction {
            var i = MembershipStateMachine.Introduction(member: member, membership: 1)
            i.fillsGap = fillsGap
            return i
        }
        func issue(_ name: String, _ introduction: MembershipStateMachine.Introduction?) throws -> PeerID {
            let peer = try PeerID(displayName: name)
            _ = try session.nearbyConnectionData(forPeer: peer, preferring: nil, introduction: introduction)
            return peer
        }
        let app = try issue("the app's", nil)
        let acceptor = try #require(session.direct.withLock { $0 })
        // A member's 16 newcomers, then 40 gaps it fills (a lying member's peers made it): only the last 16 gaps stay.
        let newcomers = try (0..<16).map { try issue("newcomer \($0)", introduction(42)) }
        let gaps = try (0..<40).map { try issue("gap \($0)", introduction(42, fillsGap: true)) }
        #expect(newcomers.allSatisfy { acceptor.hasTicket(for: $0) }, "the member's newcomers keep their tickets")
        #expect(gaps.prefix(24).allSatisfy { !acceptor.hasTicket(for: $0) } && gaps.suffix(16).allSatisfy { acceptor.hasTicket(for: $0) })
        // An honest member's one ticket, then 20 members (a liar's identities) asking without end, each within its
        // share: past 256 introduction tickets, the member that holds the most loses its oldest.
        let honest = try issue("honest newcomer", introduction(7))
        var flood: [PeerID] = []
        for liar in 0..<20 as Range<UInt64> {
            for k in 0..<16 {
                flood.append(try issue("flood \(liar).\(k)", introduction(1000 + liar)))
                flood.append(try issue("flood gap \(liar).\(k)", introduction(1000 + liar, fillsGap: true)))
            }
        }
        #expect(acceptor.hasTicket(for: honest), "an honest member's one ticket outlives the flood")
        #expect(newcomers.contains { acceptor.hasTicket(for: $0) }, "the first member keeps some of its newcomers' tickets")
        let live = (newcomers + gaps + [honest] + flood).filter { acceptor.hasTicket(for: $0) }.count
        #expect(live == DirectAcceptor.maximumTickets)
        // The app's budget is its own: 300 more of the app's evict only the app's oldest.
        let apps = try (0..<300).map { try issue("app \($0)", nil) }
        #expect(!acceptor.hasTicket(for: app) && apps.suffix(256).allSatisfy { acceptor.hasTicket(for: $0) })
        #expect(acceptor.hasTicket(for: honest) && (newcomers + gaps + [honest] + flood).filter { acceptor.hasTicket(for: $0) }.count == live)
        withExtendedLifetime(session) {}
    }

    /// The host's data with `addresses` in place of its own (all on loopback: 127.0.0.2 and up refuse, as the host
    /// listens on 127.0.0.1 only).
    private func data(_ p: Peers, listing addresses: [String]) throws -> (Data, port: UInt16) {
        var blob = try NearbyConnectionData.decode(Array(try p.host.nearbyConnectionData(forPeer: p.guestPeer))).get()
        blob.addresses = addresses
        return (Data(blob.encoded()), blob.port)
    }

    @Test("The data's addresses are tried in turn: past one that refuses and one that never answers, the host is joined; the app hears `connecting` once and no failure")
    func addressesAreTriedInTurn() throws {
        let p = try Peers()
        let (data, port) = try data(p, listing: ["127.0.0.2", "127.0.0.3", "127.0.0.1"])
        // A listener at the second address that takes the connection and says nothing: the invitation times out.
        let silent = try FileDescriptor.tcpListener(try #require(SocketAddress(numericHost: "127.0.0.3", port: port)))
        defer { silent.close() }
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: data)
        #expect(eventually(15) { p.bothConnected() })
        // The delegates hear it a moment after the state changes.
        let (hostPeer, guestPeer) = (p.hostPeer, p.guestPeer)
        #expect(p.guestLog.wait(5) { $0.states.filter { $0.0 == hostPeer }.map(\.1) == [.connecting, .connected] },
                "\(p.guestLog.states(of: hostPeer))")
        #expect(p.hostLog.wait(5) { $0.states.filter { $0.0 == guestPeer }.map(\.1) == [.connecting, .connected] })
        #expect(p.guestLog.snapshot.failures.isEmpty, "no failure reported: the attempt went on")
    }

    /// A listener at `host`, `port` whose accept queue is full, so that the kernel drops further connection attempts
    /// as a firewall or a subnet with no route back does: a connect there neither completes nor fails. Keep the
    /// descriptors open while it should hold.
    private func blackHole(at host: String, port: UInt16) throws -> [FileDescriptor] {
        let address = try #require(SocketAddress(numericHost: host, port: port))
        let listener = try FileDescriptor.tcpListener(address, backlog: 1)
        // The two connections a backlog of 1 queues (a backlog of 0 would need SYN cookies to queue even one).
        let fillers = try (0..<2).map { _ in try FileDescriptor.tcpConnect(to: address) }
        for filler in fillers { #expect(Self.connects(filler, within: 2000), "the queue's connections") }
        let probe = try FileDescriptor.tcpConnect(to: address)
        #expect(!Self.connects(probe, within: 150), "the rig: a connect to a full queue hangs")
        probe.close()
        return [listener] + fillers
    }

    /// Whether the connect in progress on `s` completes within `milliseconds`.
    private static func connects(_ s: FileDescriptor, within milliseconds: Int32) -> Bool {
        var p = pollfd(fd: s.fd, events: Int16(POLLOUT), revents: 0)
        return poll(&p, 1, milliseconds) == 1 && s.pendingError() == 0
    }

    @Test("Addresses that drop connection attempts cost a quarter of a second each (the next one's connect races them), not five seconds each to answer; one that refuses is replaced at once")
    func silentAddressesAreRaced() throws {
        let p = try Peers()
        let holes = ["127.0.0.4", "127.0.0.5", "127.0.0.6"]
        let (data, port) = try data(p, listing: holes + ["127.0.0.2", "127.0.0.1"])
        let sockets = try holes.flatMap { try blackHole(at: $0, port: port) }
        defer { sockets.forEach { $0.close() } }
        let start = ContinuousClock.now
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: data)
        #expect(eventually(20) { p.bothConnected() })
        let took = ContinuousClock.now - start
        // 0.75 s in, the refusing address starts (the first set aside: three at most connect at once); its refusal
        // starts the host's at once.
        #expect(took < .milliseconds(3_000), "joined in \(took); each address has 5 s to answer before the next is tried")
        let hostPeer = p.hostPeer
        #expect(p.guestLog.wait(5) { $0.states.filter { $0.0 == hostPeer }.map(\.1) == [.connecting, .connected] })
        #expect(p.guestLog.snapshot.failures.isEmpty)
    }

    @Test("A race's winner that hangs up: what the race left untried (one that drops connection attempts, abandoned while connecting, and the host's, never started) is raced again, and the host is joined")
    func theRaceHandsBackWhatItLeftUntried() throws {
        let p = try Peers()
        let (data, port) = try data(p, listing: ["127.0.0.4", "127.0.0.3", "127.0.0.1"])
        let hole = try blackHole(at: "127.0.0.4", port: port)
        defer { hole.forEach { $0.close() } }
        // The second takes the connection 250 ms in, winning the first race, and hangs up at once.
        let decoy = try FileDescriptor.tcpListener(try #require(SocketAddress(numericHost: "127.0.0.3", port: port)))
        defer { decoy.close() }
        let hungUp = Atomic<Bool>(false)
        Thread.detachNewThread {
            var ready = pollfd(fd: decoy.fd, events: Int16(POLLIN), revents: 0)
            guard poll(&ready, 1, 10_000) == 1 else { return }
            let c = accept(decoy.fd, nil, nil)
            if c >= 0 { close(c) }
            hungUp.store(c >= 0, ordering: .releasing)
        }
        let start = ContinuousClock.now
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: data)
        #expect(eventually(10) { p.bothConnected() })
        let took = ContinuousClock.now - start
        let decoyWon = hungUp.load(ordering: .acquiring)
        #expect(decoyWon, "the decoy won the first race")
        #expect(took < .milliseconds(3_000), "joined in \(took): two races of a quarter of a second each")
        let hostPeer = p.hostPeer
        #expect(p.guestLog.wait(5) { $0.states.filter { $0.0 == hostPeer }.map(\.1) == [.connecting, .connected] },
                "\(p.guestLog.states(of: hostPeer))")
        #expect(p.guestLog.snapshot.failures.isEmpty, "no failure reported: the attempt went on")
    }

    /// How many of this machine's TCP sockets are connecting (SYN_SENT) to `hosts` at `port` (`/proc/net/tcp`).
    private static func connecting(to hosts: [String], port: UInt16) -> Int {
        // Read to the end: procfs hands the table over a page at a time.
        let fd = open("/proc/net/tcp", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return -1 }
        defer { close(fd) }
        var bytes: [UInt8] = [], page = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = read(fd, &page, page.count)
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { break }
            bytes += page[..<n]
        }
        let table = String(decoding: bytes, as: UTF8.self)
        let targets = Set(hosts.map { host in
            let b = host.split(separator: ".").compactMap { UInt8($0) }
            return String(format: "%02X%02X%02X%02X:%04X", b[3], b[2], b[1], b[0], port)
        })
        return table.split(separator: "\n").dropFirst().filter { line in
            let f = line.split(separator: " ")
            return f.count > 3 && targets.contains(String(f[2])) && f[3] == "02"
        }.count
    }

    @Test("Five addresses that drop connection attempts: never more than three connects at once, and none left once the app cancels")
    func aRaceHoldsFewSockets() throws {
        let p = try Peers()
        let holes = (4...8).map { "127.0.0.\($0)" }
        let (data, port) = try data(p, listing: holes)
        let sockets = try holes.flatMap { try blackHole(at: $0, port: port) }
        defer { sockets.forEach { $0.close() } }
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: data)
        // One start every 250 ms: all five have started 1 s in, the first two set aside (their sockets closed).
        var most = 0
        let until = ContinuousClock.now + .milliseconds(1_400)
        while ContinuousClock.now < until {
            // Two looks, the fewer taken: procfs walks the table a page at a time, so one look can list a socket
            // closed during it next to one opened during it (seen with other tests' sockets filling pages).
            most = max(most, min(Self.connecting(to: holes, port: port), Self.connecting(to: holes, port: port)))
            usleep(20_000)
        }
        #expect(most == 3, "at most three at once, and three by the end: \(most)")
        // (A look can fall between a set-aside socket's close and the next one's connect.)
        #expect(eventually(1) { Self.connecting(to: holes, port: port) == 3 })
        p.guest.cancelConnectPeer(p.hostPeer)
        #expect(eventually(2) { Self.connecting(to: holes, port: port) == 0 }, "the race's sockets are closed with it")
        #expect(p.guestLog.wait(5) { $0.states.contains { $0.0 == p.hostPeer && $0.1 == .notConnected } })
    }

    @Test("A last race that nothing answers and that would hand nothing back keeps the invitation's own time, not the step's share")
    func aLastRaceKeepsTheInvitationsTime() throws {
        let p = try Peers()
        let port = try data(p, listing: ["127.0.0.1"]).port
        let holes = ["127.0.0.4", "127.0.0.5"]
        let sockets = try holes.flatMap { try blackHole(at: $0, port: port) }
        defer { sockets.forEach { $0.close() } }
        // As a browser invites a peer found at two addresses: 3 s in all, each step's share 1.5 s.
        let core = p.guest.core, host = p.hostPeer
        let endpoints = holes.map { PeerEndpoint(host: $0, port: port) }
        let start = ContinuousClock.now
        #expect(core.loop.submitAndWait { core.inviteFound(host, at: endpoints, context: Data(), timeout: .seconds(3)) } == nil)
        // Past the share (1.5 s) both have had their time, and nothing is left: the invitation goes on to its 3 s.
        Thread.sleep(forTimeInterval: 2.2)
        #expect(p.guestLog.states(of: host) == [.connecting], "still connecting past the step's share")
        #expect(p.guestLog.wait(5) { $0.states.contains { $0.0 == host && $0.1 == .notConnected } })
        let took = ContinuousClock.now - start
        #expect(took > .milliseconds(2_500) && took < .milliseconds(4_500), "the invitation's own 3 s: \(took)")
        let failures = p.guestLog.snapshot.failures
        #expect(failures.count == 1 && failures.first?.1 == .timedOut, "\(failures.map { ($0.1, $0.2) })")
    }

    @Test("What a race leaves untried goes back to the attempt, in order; an address set aside a second time is spent")
    func setAsideTwiceIsSpent() throws {
        let session = try Session(securityIdentity: try PeerIdentity.generate(displayName: "me"),
                                  configuration: .init(bindHost: "127.0.0.1"))
        defer { session.disconnect() }
        let core = session.core
        let peer = try PeerIdentity.generate(displayName: "far").peerID
        let e = (4...8).map { PeerEndpoint(host: "127.0.0.\($0)", port: 9) }
        let (first, second) = core.loop.submitAndWait { () -> ([PeerEndpoint], [PeerEndpoint]) in
            var attempt = DirectAttempt(peer: peer, endpoints: [e[4]], context: Data(), timeout: .seconds(5),
                                        keyFromConnectionData: true, introducer: nil)
            // A step raced e0…e3: e0 and e1 were set aside, 3 won, 2 was still connecting.
            attempt.raced = Array(e[0...3])
            core.io.value.attempts[99] = attempt
            core.raceDecided(.init(winner: 3, untried: [2], setAside: [0, 1]), on: 99)
            let first = core.io.value.attempts[99]!.endpoints
            // The next step races what came back: e0 is set aside again, e1 still connecting when e2 won.
            core.io.value.attempts[99]!.endpoints = [e[4]]
            core.io.value.attempts[99]!.raced = Array(e[0...2])
            core.raceDecided(.init(winner: 2, untried: [1], setAside: [0]), on: 99)
            let second = core.io.value.attempts[99]!.endpoints
            core.io.value.attempts[99] = nil
            return (first, second)
        }
        #expect(first == [e[0], e[1], e[2], e[4]], "set aside or abandoned: back, in order, before the rest")
        #expect(second == [e[1], e[4]], "e0, set aside twice, is spent")
    }

    @Test("No address leads to the peer: `notConnected` once, after the last, with its failure")
    func noAddressLeadsToThePeer() throws {
        let p = try Peers()
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: try data(p, listing: ["127.0.0.2", "127.0.0.4"]).0)
        #expect(p.guestLog.wait(5) { $0.states.contains { $0.0 == p.hostPeer && $0.1 == .notConnected } })
        #expect(p.guestLog.states(of: p.hostPeer) == [.connecting, .notConnected])
        let failures = p.guestLog.snapshot.failures
        #expect(failures.count == 1 && failures.first?.0 == p.hostPeer && failures.first?.1 == .unavailable
                && failures.first?.2.contains("127.0.0.4") == true,
                "one failure, the last address's: \(failures.map { ($0.1, $0.2) })")
        Thread.sleep(forTimeInterval: 0.2)
        #expect(p.guestLog.states(of: p.hostPeer) == [.connecting, .notConnected], "and nothing after it")
        #expect(p.host.connectedPeers.isEmpty)
        // Nothing left behind: no hold, no attempt; the data still works when it lists the host's address.
        #expect(p.guest.core.loop.submitAndWait { p.guest.core.io.value.attempts.isEmpty })
        #expect(!p.guest.core.shared.withLock { $0.machine.isHeld(p.hostPeer) })
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: try data(p, listing: ["127.0.0.1"]).0)
        #expect(eventually(5) { p.bothConnected() })
    }

    @Test("cancelConnectPeer while an address does not answer: the next one is not tried")
    func cancelStopsTheOtherAddresses() throws {
        let p = try Peers()
        let (data, port) = try data(p, listing: ["127.0.0.3", "127.0.0.1"])
        let silent = try FileDescriptor.tcpListener(try #require(SocketAddress(numericHost: "127.0.0.3", port: port)))
        defer { silent.close() }
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: data)
        #expect(p.guestLog.wait(5) { $0.states.contains { $0.0 == p.hostPeer } })
        p.guest.cancelConnectPeer(p.hostPeer)
        #expect(p.guestLog.wait(5) { $0.states.contains { $0.0 == p.hostPeer && $0.1 == .notConnected } })
        Thread.sleep(forTimeInterval: 1)  // the host's address answers at once: time enough to join, if it were tried
        #expect(p.host.connectedPeers.isEmpty && p.guest.connectedPeers.isEmpty)
        #expect(p.guestLog.states(of: p.hostPeer) == [.connecting, .notConnected])
        #expect(p.hostLog.snapshot.states.isEmpty, "the host never heard of the guest")
    }

    @Test("A member asking for introductions without end spends its own 16 tickets, never the app's or another member's")
    func introducersSpendOnlyTheirOwnTickets() throws {
        let session = try Session(securityIdentity: try PeerIdentity.generate(displayName: "me"),
                                  configuration: .init(bindHost: "127.0.0.1"))
        defer { session.disconnect() }
        let appPeer = try PeerIdentity.generate(displayName: "app").peerID
        let otherNewcomer = try PeerIdentity.generate(displayName: "other").peerID
        _ = try session.nearbyConnectionData(forPeer: appPeer)
        _ = try session.nearbyConnectionData(forPeer: otherNewcomer, preferring: nil, introduction: .init(member: 2, membership: 1))
        let flood = try (0..<300).map { try PeerIdentity.generate(displayName: "n\($0)").peerID }
        // The flooder leaves and comes back half-way: its second membership shares the first one's 16.
        for (i, newcomer) in flood.enumerated() {
            _ = try session.nearbyConnectionData(forPeer: newcomer, preferring: nil,
                                                 introduction: .init(member: 1, membership: i < 150 ? 3 : 4))
        }
        let tickets = try session.directAcceptor()
        #expect(tickets.hasTicket(for: appPeer), "the app's data still works")
        #expect(tickets.hasTicket(for: otherNewcomer), "so does another member's introduction")
        #expect(flood.suffix(16).allSatisfy { tickets.hasTicket(for: $0) })
        #expect(flood.dropLast(16).filter { tickets.hasTicket(for: $0) }.isEmpty, "the flooder's older ones are gone")
    }

    @Test("A ticket works once; cancelConnectPeer closes on both sides and withdraws unused data")
    func oneUseAndCancel() throws {
        let p = try Peers()
        let data = try p.host.nearbyConnectionData(forPeer: p.guestPeer)
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: data)
        #expect(eventually(5) { p.bothConnected() })
        p.guest.cancelConnectPeer(p.hostPeer)
        #expect(eventually(5) { p.host.connectedPeers.isEmpty && p.guest.connectedPeers.isEmpty })

        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: data)
        #expect(p.guestLog.wait(5) { $0.failures.contains { $0.1 == .notTrusted } }, "a used ticket is refused")
        #expect(p.host.connectedPeers.isEmpty)

        let unused = try p.host.nearbyConnectionData(forPeer: p.guestPeer)
        p.host.cancelConnectPeer(p.guestPeer)
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: unused)
        #expect(p.guestLog.wait(5) { $0.failures.filter { $0.1 == .notTrusted }.count == 2 }, "withdrawn data is refused")
        #expect(p.host.connectedPeers.isEmpty)

        let fresh = try p.host.nearbyConnectionData(forPeer: p.guestPeer)
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: fresh)
        #expect(eventually(5) { p.bothConnected() })
    }

    @Test("Data made for one peer lets no other peer in, even one that skips the local checks")
    func onlyTheNamedPeer() throws {
        let p = try Peers()
        let data = try p.host.nearbyConnectionData(forPeer: p.guestPeer)
        let mallory = try Session(peer: try PeerID(displayName: "mallory"), configuration: .init(bindHost: "127.0.0.1"))
        let malloryLog = MeshEventLog()
        mallory.delegate = malloryLog
        #expect { try mallory.connectPeer(p.hostPeer, withNearbyConnectionData: data) } throws: { e in
            guard case PeerMeshError.invalidParameter(let text) = e else { return false }
            return text.contains("made for another peer")
        }
        // Past the local check, with the stolen ticket: the host's acceptor refuses it.
        let blob = try NearbyConnectionData.decode(Array(data)).get()
        try mallory.core.invite(expected: blob.peer, endpoint: PeerEndpoint(host: "127.0.0.1", port: blob.port),
                                context: Data(NearbyConnectionData.contextPrefix + blob.ticket), timeout: .seconds(5))
        #expect(malloryLog.wait(5) { $0.failures.contains { $0.1 == .notTrusted } })
        #expect(p.host.connectedPeers.isEmpty)
        // The ticket was not spent on mallory: the guest still gets in.
        try p.guest.connectPeer(p.hostPeer, withNearbyConnectionData: data)
        #expect(eventually(5) { p.bothConnected() })
        #expect(throws: PeerMeshError.self) { try p.guest.connectPeer(mallory.myPeerID, withNearbyConnectionData: data) }
    }

    @Test("Data whose key was swapped (a listener that is not the peer) fails the handshake check")
    func swappedKeyIsRefused() throws {
        let p = try Peers()
        var blob = try NearbyConnectionData.decode(Array(try p.host.nearbyConnectionData(forPeer: p.guestPeer))).get()
        let impostor = try PeerID(displayName: "host")
        blob.peer = try PeerID(displayName: "host", publicKey: try #require(impostor.publicKey))
        try p.guest.connectPeer(blob.peer, withNearbyConnectionData: Data(blob.encoded()))
        #expect(p.guestLog.wait(5) { !$0.failures.isEmpty })
        #expect(p.guest.connectedPeers.isEmpty && p.host.connectedPeers.isEmpty)
        #expect(eventually(5) { p.guest.statistics.peerFaults == 1 }, "the wrong key is a fault of that peer")
    }

    @Test("An unencrypted session cannot make or use connection data")
    func needsEncryption() throws {
        let plain = try Session(peer: try PeerID(displayName: "plain"), encryptionPreference: .none,
                                configuration: .init(bindHost: "127.0.0.1"))
        #expect(throws: PeerMeshError.self) { try plain.nearbyConnectionData(forPeer: try PeerID(displayName: "x")) }
        #expect(throws: PeerMeshError.self) { try plain.connectPeer(try PeerID(displayName: "x"), withNearbyConnectionData: Data([1, 2])) }
    }
}

@Suite("IPv6 and dual stack on loopback", .serialized)
struct IPv6SessionTests {
    /// A host whose advertiser and session listen on every address, IPv4 and IPv6, and two guests that reach it
    /// over `127.0.0.1` and `[::1]`: both join, and reliable messages and datagrams flow on each.
    @Test(arguments: ["127.0.0.1", "::1"])
    func guestsReachADualStackHostOverEitherFamily(_ address: String) throws {
        let hostPeer = try PeerID(displayName: "host")
        let host = try Session(peer: hostPeer)
        let hostLog = MeshEventLog()
        host.delegate = hostLog
        hostLog.acceptInto.withLock { $0 = host }
        let advertiser = try NearbyServiceAdvertiser(peer: hostPeer, discoveryInfo: nil, serviceType: "pm-v6",
                                                     discovery: InProcessDiscovery())
        advertiser.delegate = hostLog
        try advertiser.startAdvertisingPeer()
        let port = try #require(advertiser.port)

        let guest = try Session(peer: try PeerID(displayName: "guest"), configuration: .init(bindHost: address))
        let guestLog = MeshEventLog()
        guest.delegate = guestLog
        try guest.connect(to: PeerEndpoint(host: address, port: port))
        #expect(eventually(5) { guest.connectedPeers == [hostPeer] && host.connectedPeers.count == 1 })
        #expect(guest.isEncrypted(hostPeer))
        try guest.send(Data("over \(address)".utf8), toPeers: [hostPeer], with: .reliable)
        #expect(hostLog.wait(5) { $0.reliable.first?.1 == Data("over \(address)".utf8) })
        let guestPeer = try #require(host.connectedPeers.first)
        for i in 0..<20 { try host.send(Data([UInt8(i)]), toPeers: [guestPeer], with: .unreliable) }
        #expect(guestLog.wait(5) { $0.datagrams.count >= 18 }, "datagrams over \(address)")
        withExtendedLifetime(advertiser) {}
    }

    @Test func aLinkLocalAddressKeepsItsScope() throws {
        let a = try #require(SocketAddress(numericHost: "fe80::1%lo", port: 9))
        #expect(a.scopeID == if_nametoindex("lo") && a.host.hasSuffix("%lo"))
    }
}

@Suite("Out-of-band connection data between processes, with no DNS-SD", .serialized)
struct OutOfBandProcessTests {
    @Test("Two processes exchange peer ID and connection data through files, with no avahi-daemon or system bus, and connect")
    func throughAFileWithNoAvahi() throws {
        let probe = builtProduct("peermesh-probe")
        try #require(FileManager.default.isExecutableFile(atPath: probe.path), "build peermesh-probe first (swift build)")
        let dir = try TemporaryDirectory.make(in: TemporaryDirectory.system, prefix: "pm-oob-")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // No daemon to reach: a system bus address that leads nowhere, and no rig variables.
        let noAvahi = ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=\(dir)/no-such-bus", "MESH_AVAHI_RIG": "", "MESH_AVAHI_CTL": ""]
        let host = try ChildProcess(probe, ["host", "--offer-for", "\(dir)/guest.json", "\(dir)/offer.json", "--name", "oob-host",
                                            "--duration", "30"], environment: noAvahi)
        defer { host.stop() }
        let guest = try ChildProcess(probe, ["join", "--offer", "\(dir)/guest.json", "\(dir)/offer.json", "--name", "oob-guest",
                                             "--reliable", "20", "--datagrams", "50", "--timeout", "10"], environment: noAvahi)
        #expect(guest.waitForExit(seconds: 20) == 0, "guest: \(guest.stdout) \(guest.stderr); host: \(host.stdout) \(host.stderr)")
        let summary = try #require(guest.json(containing: "reliableEchoed"), "\(guest.stdout)")
        #expect(summary["connected"] as? Bool == true && summary["host"] as? String == "oob-host")
        #expect(summary["reliableEchoed"] as? Int == 20, "every reliable message came back")
        #expect((summary["datagramsEchoed"] as? Int ?? 0) >= 45, "\(summary)")
        #expect(host.json(containing: "offered")?["for"] as? String == "oob-guest")
        #expect(!(host.stderr + guest.stderr).contains { $0.contains("avahi") }, "nobody needed Avahi: \(host.stderr) \(guest.stderr)")
    }
}
