import Foundation
import Synchronization
import Testing
import MeshTestSupport
import PeerMesh

/// `AvahiDiscovery` against a real avahi-daemon bound to `lo` (scripts/lib/avahi-rig.sh). Enabled only with
/// `MESH_AVAHI_RIG=1`; serialized because some tests stop or restart the shared daemon. Each test browses its own
/// service type, so tests never see each other's services.
@Suite(.serialized, .avahiDaemonExclusive, .enabled(if: AvahiRig.enabled, "needs MESH_AVAHI_RIG=1 (source scripts/lib/avahi-rig.sh; avahi_rig_start DIR)"))
struct AvahiDiscoveryTests {
    static let avahiPublish = "/usr/bin/avahi-publish"

    func peer(_ name: String) -> PeerID { try! PeerID(displayName: name) }

    /// Publishes and waits for `.published`, returning the registration and the instance name.
    func publish(_ backend: AvahiDiscovery, _ ad: ServiceAdvertisement) async throws
        -> (registration: any DiscoveryRegistration, instanceName: String?) {
        let log = AvahiEventLog<PublicationEvent>()
        let reg = try backend.publish(ad, onEvent: log.handler)
        let hit = await log.wait { if case .published = $0 { true } else if case .failed = $0 { true } else { false } }
        guard case .published(let name)? = hit?.event else {
            Issue.record("publication of \(ad.peer) did not succeed: \(log.all)")
            return (reg, nil)
        }
        return (reg, name)
    }

    @Test func avahiBrowseSeesOurServiceWithItsTXTRecord() async throws {
        let type = AvahiRig.uniqueServiceType()
        let backend = try AvahiDiscovery()
        let alice = peer("Alice Ü")
        let ad = ServiceAdvertisement(peer: alice, serviceType: type, port: 40123, discoveryInfo: ["room": "kitchen", "_x": "y"])
        let (reg, name) = try await publish(backend, ad)
        #expect(name == alice.identityString)

        let lines = try AvahiRig.avahiBrowse(serviceType: type)
        let ours = lines.filter { $0.count == 10 && $0[3] == alice.identityString }
        #expect(!ours.isEmpty, "avahi-browse printed: \(lines)")
        for line in ours {
            #expect(line[1] == "lo")
            #expect(line[4] == "_\(type)._tcp")
            #expect(line[7] == "127.0.0.1")
            #expect(line[8] == "40123")
            let txt = line[9]
            #expect(txt.contains("\"_v=\(peerMeshProtocolVersion)\""), "TXT was \(txt)")
            #expect(txt.contains("\"_k=\(alice.publicKey!.hex)\""), "TXT was \(txt)")
            #expect(txt.contains("\"room=kitchen\""), "TXT was \(txt)")
            #expect(txt.contains("\"__x=y\""), "TXT was \(txt)")
            #expect(txt.contains("\"_d=Alice"), "TXT was \(txt)")
        }
        reg.cancel()
    }

    @Test func findsAvahiPublishServicesAndSkipsMalformedOnes() async throws {
        let type = AvahiRig.uniqueServiceType()
        let good = try PeerID(displayName: "Remote")
        let bad = UInt64.random(in: 1...UInt64.max)
        let badName = String(format: "%016llx", bad)
        // Published without _v/_d first, so that the browser sees it before (or with) the good one.
        let badChild = try ChildProcess(avahiTool: Self.avahiPublish, ["-s", badName, "_\(type)._tcp", "40200", "k=v"])
        // A host of the previous protocol version: whole and well formed, but it could not complete a handshake.
        let old = try PeerID(displayName: "Old")
        let oldChild = try ChildProcess(avahiTool: Self.avahiPublish, ["-s", old.identityString, "_\(type)._tcp", "40202",
                                                                 "_v=\(peerMeshProtocolVersion - 1)", "_d=Old", "_k=\(old.publicKey!.hex)"])
        let goodChild = try ChildProcess(avahiTool: Self.avahiPublish, ["-s", good.identityString, "_\(type)._tcp", "40201",
                                                                  "_v=\(peerMeshProtocolVersion)", "_d=Remote", "_k=\(good.publicKey!.hex)", "k=v", "__u=w"])
        defer { badChild.stop(); oldChild.stop(); goodChild.stop() }

        // The skip is logged once, and the log handler may call back into discovery: here it ends another browse.
        let lines = Mutex<[String]>([])
        let other = Mutex<(any DiscoveryRegistration)?>(nil)
        let backend = try AvahiDiscovery(log: { line in
            lines.withLock { $0.append(line) }
            other.withLock { r in defer { r = nil }; return r }?.cancel()
        })
        other.withLock { $0 = try? backend.browse(serviceType: AvahiRig.uniqueServiceType(), localPeer: peer("Me"), onEvent: { _ in }) }
        let log = AvahiEventLog<BrowseEvent>()
        let reg = try backend.browse(serviceType: type, localPeer: peer("Me"), onEvent: log.handler)
        let hit = await log.wait { $0.avahiFound?.peer == good }
        let found = try #require(hit?.event.avahiFound)
        #expect(found.peer.displayName == "Remote")
        #expect(found.discoveryInfo == ["k": "v", "_u": "w"])
        #expect(found.endpoints == [PeerEndpoint(host: "127.0.0.1", port: 40201)])
        // Give the malformed one time to be resolved too: it must never surface, and we are still alive.
        try await Task.sleep(for: .milliseconds(500))
        #expect(!log.all.contains { $0.avahiFound?.peer.identity == bad })
        #expect(!log.all.contains { if case .failed = $0 { true } else { false } })
        #expect(badChild.isRunning && goodChild.isRunning)
        #expect(eventually(3) { lines.withLock { $0.contains { $0.contains("skipping DNS-SD service \"\(badName)\"") } } },
                "\(lines.withLock { $0 })")
        #expect(lines.withLock { $0.filter { $0.contains(badName) }.count } == 1, "logged once")
        #expect(eventually(3) { lines.withLock { $0.contains { $0.contains(old.identityString)
                                    && $0.contains("TXT record has protocol version \(peerMeshProtocolVersion - 1); this build speaks \(peerMeshProtocolVersion)") } } },
                "\(lines.withLock { $0 })")
        #expect(!log.all.contains { $0.avahiFound?.peer == old }, "the version-2 host, resolved and skipped, was not offered")
        #expect(other.withLock { $0 == nil }, "the log handler's call into discovery returned")
        reg.cancel()
    }

    @Test func foundThenLostWhenThePublicationIsCancelled() async throws {
        let type = AvahiRig.uniqueServiceType()
        let publisher = try AvahiDiscovery()
        let browser = try AvahiDiscovery()
        let bob = peer("Bob")
        let log = AvahiEventLog<BrowseEvent>()
        let browse = try browser.browse(serviceType: type, localPeer: peer("Me"), onEvent: log.handler)

        // Time to discover: from the publish call (service not yet on the network) to `.found`.
        let start = ContinuousClock.now
        let pub = try publisher.publish(ServiceAdvertisement(peer: bob, serviceType: type, port: 40300,
                                                              discoveryInfo: ["a": "1"]), onEvent: { _ in })
        let found = await log.wait { $0.avahiFound?.peer == bob }
        let hit = try #require(found)
        let publishToFound = hit.at - start
        #expect(hit.event.avahiFound?.endpoints == [PeerEndpoint(host: "127.0.0.1", port: 40300)])
        #expect(hit.event.avahiFound?.discoveryInfo == ["a": "1"])

        // And a browser that starts after the service is established (answered from the daemon's cache).
        let log2 = AvahiEventLog<BrowseEvent>()
        let start2 = ContinuousClock.now
        let browse2 = try browser.browse(serviceType: type, localPeer: peer("Me2"), onEvent: log2.handler)
        let hit2 = try #require(await log2.wait { $0.avahiFound?.peer == bob })
        print("avahi loopback discover time: publish→found \(publishToFound.formatted(.units(allowed: [.milliseconds]))), "
            + "browse→found (established service) \((hit2.at - start2).formatted(.units(allowed: [.milliseconds])))")
        #expect(publishToFound < .seconds(8))

        pub.cancel()
        pub.cancel() // idempotent
        #expect(await log.wait { $0.avahiLost == bob } != nil)
        #expect(log.all.filter { $0.avahiFound?.peer == bob }.count == 1)
        browse.cancel()
        browse2.cancel()
    }

    @Test func ownAdvertisementIsIgnored() async throws {
        let type = AvahiRig.uniqueServiceType()
        let backend = try AvahiDiscovery()
        let me = peer("Me"), other = peer("Other")
        let (mine, _) = try await publish(backend, ServiceAdvertisement(peer: me, serviceType: type, port: 40400, discoveryInfo: [:]))
        let (theirs, _) = try await publish(backend, ServiceAdvertisement(peer: other, serviceType: type, port: 40401, discoveryInfo: [:]))
        let log = AvahiEventLog<BrowseEvent>()
        let reg = try backend.browse(serviceType: type, localPeer: me, onEvent: log.handler)
        #expect(await log.wait { $0.avahiFound?.peer == other } != nil)
        try await Task.sleep(for: .milliseconds(300))
        #expect(!log.all.contains { $0.avahiFound?.peer == me })
        reg.cancel(); mine.cancel(); theirs.cancel()
    }

    @Test func collisionPublishesUnderAnAlternativeNameWithTheSameIdentity() async throws {
        let type = AvahiRig.uniqueServiceType()
        let first = try AvahiDiscovery(), second = try AvahiDiscovery(), browser = try AvahiDiscovery()
        let twin = peer("Twin")
        let (a, nameA) = try await publish(first, ServiceAdvertisement(peer: twin, serviceType: type, port: 40500, discoveryInfo: [:]))
        let (b, nameB) = try await publish(second, ServiceAdvertisement(peer: twin, serviceType: type, port: 40501, discoveryInfo: [:]))
        #expect(nameA == twin.identityString)
        let alt = try #require(nameB)
        #expect(alt != twin.identityString)
        #expect(AvahiDiscovery.identityPart(ofInstanceName: alt) == twin.identityString)

        // Both instances are one peer to a browser, with both endpoints.
        let log = AvahiEventLog<BrowseEvent>()
        let reg = try browser.browse(serviceType: type, localPeer: peer("Me"), onEvent: log.handler)
        let both = await log.wait { $0.avahiFound.map { $0.peer == twin && $0.endpoints.count == 2 } ?? false }
        #expect(Set(both?.event.avahiFound?.endpoints ?? []) == [PeerEndpoint(host: "127.0.0.1", port: 40500),
                                                                  PeerEndpoint(host: "127.0.0.1", port: 40501)])
        // Withdrawing the first leaves the peer found (through the alternative name); withdrawing both loses it.
        a.cancel()
        #expect(await log.wait { $0.avahiFound?.endpoints == [PeerEndpoint(host: "127.0.0.1", port: 40501)] } != nil)
        #expect(!log.all.contains { $0.avahiLost == twin })
        b.cancel()
        #expect(await log.wait { $0.avahiLost == twin } != nil)
        reg.cancel()
    }

    @Test func releasingTheBackendBeforeItsRegistrationsIsSafe() async throws {
        let type = AvahiRig.uniqueServiceType()
        var registrations: [any DiscoveryRegistration] = []
        for i in 0..<5 {
            let backend = try AvahiDiscovery()
            registrations.append(try backend.publish(ServiceAdvertisement(peer: peer("P\(i)"), serviceType: type,
                                                                          port: UInt16(40700 + i), discoveryInfo: [:]),
                                                     onEvent: { _ in }))
            registrations.append(try backend.browse(serviceType: type, localPeer: peer("B\(i)"), onEvent: { _ in }))
            if i % 2 == 0 { try await Task.sleep(for: .milliseconds(100)) } // some mid-registration, some not
        }
        // Every backend is gone; its registrations still cancel cleanly, twice.
        for r in registrations { r.cancel(); r.cancel() }
        registrations.removeAll()
        // And the daemon withdrew them: a fresh browser finds only a control peer published afterwards.
        let fresh = try AvahiDiscovery()
        let control = peer("Control")
        let (pub, _) = try await publish(fresh, ServiceAdvertisement(peer: control, serviceType: type, port: 40799, discoveryInfo: [:]))
        let log = AvahiEventLog<BrowseEvent>()
        let reg = try fresh.browse(serviceType: type, localPeer: peer("Me"), onEvent: log.handler)
        #expect(await log.wait { $0.avahiFound?.peer == control } != nil)
        try await Task.sleep(for: .milliseconds(500))
        #expect(log.all.map(\.avahiFound?.peer) == [control], "found withdrawn services: \(log.all)")
        reg.cancel(); pub.cancel()
    }

    @Test(.enabled(if: AvahiRig.canRestart, "needs a rig that owns its avahi-daemon (MESH_AVAHI_CTL)"))
    func survivesADaemonRestartWithoutAProcessRestart() async throws {
        let type = AvahiRig.uniqueServiceType()
        let publisher = try AvahiDiscovery()
        let browser = try AvahiDiscovery(reconfirmWindow: .seconds(3))
        let stays = peer("Stays")
        let vanishing = try PeerID(displayName: "Vanishes")
        let pubLog = AvahiEventLog<PublicationEvent>()
        let pub = try publisher.publish(ServiceAdvertisement(peer: stays, serviceType: type, port: 40600, discoveryInfo: [:]),
                                        onEvent: pubLog.handler)
        // avahi-publish without --no-fail exits when the daemon goes: this peer does not come back.
        let child = try ChildProcess(avahiTool: Self.avahiPublish, ["-s", vanishing.identityString, "_\(type)._tcp", "40601",
                                                              "_v=\(peerMeshProtocolVersion)", "_d=Vanishes", "_k=\(vanishing.publicKey!.hex)"])
        defer { child.stop() }
        let log = AvahiEventLog<BrowseEvent>()
        let reg = try browser.browse(serviceType: type, localPeer: peer("Me"), onEvent: log.handler)
        #expect(await log.wait { $0.avahiFound?.peer == stays } != nil)
        #expect(await log.wait { $0.avahiFound?.peer == vanishing } != nil)
        let before = log.count

        let (status, _) = try AvahiRig.run(AvahiRig.ctl!, ["restart"], timeout: 30)
        #expect(status == 0)

        // Found again after the restart, re-published by the same process, and never reported lost.
        let again = await log.wait(timeout: .seconds(10), skip: before) { $0.avahiFound?.peer == stays }
        #expect(again?.event.avahiFound?.endpoints == [PeerEndpoint(host: "127.0.0.1", port: 40600)])
        #expect(await log.wait(timeout: .seconds(10), skip: before) { $0.avahiLost == vanishing } != nil)
        #expect(!log.all.contains { $0.avahiLost == stays })
        #expect(pubLog.all.filter { $0 == .published(instanceName: stays.identityString) }.count == 2)
        reg.cancel(); pub.cancel()
    }

    @Test(.enabled(if: AvahiRig.canRestart, "needs a rig that owns its avahi-daemon (MESH_AVAHI_CTL)"))
    func publishesOnceTheDaemonAppears() async throws {
        let type = AvahiRig.uniqueServiceType()
        let (stopped, _) = try AvahiRig.run(AvahiRig.ctl!, ["stop"], timeout: 30)
        #expect(stopped == 0)
        var restarted = false
        defer { if !restarted { _ = try? AvahiRig.run(AvahiRig.ctl!, ["start"], timeout: 30) } }
        let early = peer("Early")
        let publisher = try AvahiDiscovery(waitForDaemon: true)
        let pubLog = AvahiEventLog<PublicationEvent>()
        let pub = try publisher.publish(ServiceAdvertisement(peer: early, serviceType: type, port: 40700, discoveryInfo: [:]),
                                        onEvent: pubLog.handler)
        #expect(await pubLog.wait(timeout: .seconds(2)) { $0 == .waitingForDaemon } != nil)
        let (started, _) = try AvahiRig.run(AvahiRig.ctl!, ["start"], timeout: 30)
        restarted = true
        #expect(started == 0)
        #expect(await pubLog.wait(timeout: .seconds(10)) { $0 == .published(instanceName: early.identityString) } != nil,
                "\(pubLog.all)")
        let lines = try AvahiRig.avahiBrowse(serviceType: type)
        #expect(lines.contains { $0.count == 10 && $0[3] == early.identityString }, "avahi-browse printed: \(lines)")
        pub.cancel()
    }

    @Test(.enabled(if: AvahiRig.canRestart, "needs a rig that owns its avahi-daemon (MESH_AVAHI_CTL)"))
    func missingDaemonGivesOneClearLine() throws {
        let (stopped, _) = try AvahiRig.run(AvahiRig.ctl!, ["stop"], timeout: 30)
        #expect(stopped == 0)
        defer { _ = try? AvahiRig.run(AvahiRig.ctl!, ["start"], timeout: 30) }
        #expect(throws: PeerMeshError.discovery(AvahiDiscovery.daemonMissingMessage)) { _ = try AvahiDiscovery() }
        #expect(!AvahiDiscovery.daemonMissingMessage.contains("\n"))
    }
}

/// With no system bus at all, a program using `AvahiDiscovery` says the same one clear line. A bus address is
/// process-wide state, so this runs `peermesh-probe` (built next to this test bundle) as a child process.
@Suite struct AvahiMissingBusTests {
    static var probe: String? {
        let dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        let candidates = [dir.appendingPathComponent("peermesh-probe"),
                          dir.deletingLastPathComponent().appendingPathComponent("peermesh-probe")]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0.path) }?.path
    }

    @Test(.enabled(if: probe != nil, "needs peermesh-probe built (swift build)"))
    func noSystemBusGivesTheDaemonMissingLine() throws {
        let (status, text) = try AvahiRig.run(
            Self.probe!, ["join", "--service", "pmt-nobus", "--name", "x", "--timeout", "2"],
            environment: ["DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/peermesh-test-bus"], standardError: true)
        #expect(status == 1)
        // Off a terminal each line starts with its ISO-8601 time; the rest is exactly the one message.
        let line = text.split(separator: " ", maxSplits: 1).last.map(String.init) ?? ""
        #expect(text.hasPrefix("20") && text.filter { $0 == "\n" }.count == 1, "\(text)")
        #expect(line == "peermesh-probe: \(AvahiDiscovery.daemonMissingMessage)\n")
    }
}
