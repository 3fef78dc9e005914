import Testing
@testable import PeerMesh

/// The pure browse table behind `AvahiDiscovery`: no daemon, no sockets.
@Suite struct AvahiBrowseTableTests {
    typealias Key = AvahiBrowseTable.ItemKey
    let alice = try! PeerID(displayName: "Alice")
    let me = try! PeerID(displayName: "Me")

    func key(_ name: String, interface: Int32 = 1, proto: Int32 = 0) -> Key {
        Key(interface: interface, proto: proto, name: name, domain: "local")
    }

    func txt(_ peer: PeerID, _ info: [String: String] = [:]) -> [String] { TXTRecord.encode(peer: peer, discoveryInfo: info) }

    @Test func collisionSuffixIsStripped() {
        #expect(AvahiDiscovery.identityPart(ofInstanceName: "0123456789abcdef #2") == "0123456789abcdef")
        #expect(AvahiDiscovery.identityPart(ofInstanceName: "0123456789abcdef #17") == "0123456789abcdef")
        #expect(AvahiDiscovery.identityPart(ofInstanceName: "0123456789abcdef") == "0123456789abcdef")
        #expect(AvahiDiscovery.identityPart(ofInstanceName: "abc #x") == "abc #x")
        #expect(AvahiDiscovery.identityPart(ofInstanceName: "#2") == "#2")
        #expect(AvahiDiscovery.dnssdType("mesh-audio") == "_mesh-audio._tcp")
    }

    @Test func foundOnceAcrossInterfacesAndLostWithTheLastInstance() {
        var t = AvahiBrowseTable(serviceType: "t", localIdentity: me.identity)
        let a = PeerEndpoint(host: "127.0.0.1", port: 5000)
        let b = PeerEndpoint(host: "198.18.0.1", port: 5000)
        let first = t.resolved(key(alice.identityString, interface: 1), txt: txt(alice, ["k": "v"]), endpoint: a)
        #expect(first == [.deliver(.found(DiscoveredPeer(peer: alice, discoveryInfo: ["k": "v"], endpoints: [a])))])
        // The same instance resolved again with the same data: nothing new.
        #expect(t.resolved(key(alice.identityString, interface: 1), txt: txt(alice, ["k": "v"]), endpoint: a) == [])
        // Seen on a second interface: endpoints merged, still one peer.
        let second = t.resolved(key(alice.identityString, interface: 2), txt: txt(alice, ["k": "v"]), endpoint: b)
        #expect(second == [.deliver(.found(DiscoveredPeer(peer: alice, discoveryInfo: ["k": "v"], endpoints: [a, b])))])
        // Gone from the first interface: endpoints shrink, not lost.
        #expect(t.removed(key(alice.identityString, interface: 1))
            == [.deliver(.found(DiscoveredPeer(peer: alice, discoveryInfo: ["k": "v"], endpoints: [b])))])
        #expect(t.removed(key(alice.identityString, interface: 2)) == [.deliver(.lost(alice))])
        #expect(t.knownIdentities.isEmpty)
        // Removing an unknown item is harmless.
        #expect(t.removed(key("nobody")) == [])
    }

    @Test func alternativeNameKeepsTheIdentity() {
        var t = AvahiBrowseTable(serviceType: "t", localIdentity: me.identity)
        let e = PeerEndpoint(host: "127.0.0.1", port: 7)
        let out = t.resolved(key(alice.identityString + " #2"), txt: txt(alice), endpoint: e)
        #expect(out == [.deliver(.found(DiscoveredPeer(peer: alice, discoveryInfo: [:], endpoints: [e])))])
    }

    @Test("A copy of a record under an alternative name, found first, comes after the plainly named one, and does not set its name or info")
    func plainNameFirst() {
        var t = AvahiBrowseTable(serviceType: "t", localIdentity: me.identity)
        let fake = PeerEndpoint(host: "127.0.0.9", port: 6666)
        let real = PeerEndpoint(host: "127.0.0.1", port: 5000)
        let lying = try! PeerID(displayName: "Alice's twin", publicKey: alice.publicKey!)
        _ = t.resolved(key(alice.identityString + " #7"), txt: txt(lying, ["pair": "1"]), endpoint: fake)
        let out = t.resolved(key(alice.identityString), txt: txt(alice, ["k": "v"]), endpoint: real)
        #expect(out == [.deliver(.found(DiscoveredPeer(peer: alice, discoveryInfo: ["k": "v"], endpoints: [real, fake])))])
        // The copy resolved again (or changed): the plain name's data stands.
        #expect(t.resolved(key(alice.identityString + " #7"), txt: txt(lying, ["pair": "1", "x": "y"]), endpoint: fake) == [])
        // The plain one gone: the copy's address is all that is left.
        #expect(t.removed(key(alice.identityString)) == [.deliver(.found(DiscoveredPeer(peer: alice, discoveryInfo: ["k": "v"], endpoints: [fake])))])
    }

    @Test("Instances past the resolver bound wait their turn in order, bounded; those that go meanwhile are not resolved")
    func waitingInstances() {
        func drain<Key>(_ w: inout WaitingInstances<Key>) -> [Key] {
            var out: [Key] = []
            while let k = w.next() { out.append(k) }
            return out
        }
        var w = WaitingInstances<Int>(capacity: 3)
        let taken = [w.append(1), w.append(2), w.append(1), w.append(3), w.append(4)]
        #expect(taken == [true, true, true, true, false], "the fourth is past the bound; a second 1 keeps its place")
        #expect(w.skipped == 1 && w.count == 3)
        w.remove(2)
        let first = w.next()
        #expect(first == 1)
        w.append(5)
        #expect(drain(&w) == [3, 5])
        // A flood that comes and goes while nothing frees keeps memory bounded, and the last one still gets its turn.
        var flood = WaitingInstances<Int>(capacity: 8)
        var largest = 0
        for i in 0..<100_000 {
            flood.append(i)
            flood.remove(i)
            largest = max(largest, flood.stored)
        }
        #expect(largest <= 2 * flood.capacity + 1)
        flood.append(-1)
        #expect(drain(&flood) == [-1])
        // Removed, then seen again: waits once, in the first place it had.
        var again = WaitingInstances<Int>(capacity: 4)
        again.append(7)
        again.remove(7)
        again.append(8)
        again.append(7)
        #expect(drain(&again) == [7, 8])
    }

    @Test func ownAdvertisementIsIgnored() {
        var t = AvahiBrowseTable(serviceType: "t", localIdentity: me.identity)
        #expect(t.resolved(key(me.identityString), txt: txt(me), endpoint: PeerEndpoint(host: "127.0.0.1", port: 1)) == [])
        #expect(t.knownIdentities.isEmpty)
    }

    @Test func malformedRecordsAreSkippedAndLoggedOnce() {
        var t = AvahiBrowseTable(serviceType: "t", localIdentity: me.identity)
        let e = PeerEndpoint(host: "127.0.0.1", port: 9)
        let first = t.resolved(key("0000000000000bad"), txt: ["k=v"], endpoint: e)
        #expect(first.count == 1)
        guard case .log(let line)? = first.first else { Issue.record("expected one log line, got \(first)"); return }
        #expect(line.contains("0000000000000bad") && line.contains("_v") && line.contains("_t._tcp"))
        // Same instance again (another interface, or a TXT update): not logged twice.
        #expect(t.resolved(key("0000000000000bad", interface: 2), txt: ["k=v"], endpoint: e) == [])
        // Not a hex identity, wrong version, missing display name: skipped.
        #expect(t.resolved(key("printer"), txt: txt(alice), endpoint: e).count == 1)
        #expect(t.resolved(key("00000000000000aa"), txt: ["_v=99", "_d=X"], endpoint: e).count == 1)
        #expect(t.resolved(key("00000000000000ab"), txt: ["_v=\(peerMeshProtocolVersion)"], endpoint: e).count == 1)
        #expect(t.knownIdentities.isEmpty)
    }

    @Test func recordTurningBadWithdrawsThePeer() {
        var t = AvahiBrowseTable(serviceType: "t", localIdentity: me.identity)
        let e = PeerEndpoint(host: "127.0.0.1", port: 9)
        _ = t.resolved(key(alice.identityString), txt: txt(alice), endpoint: e)
        let out = t.resolved(key(alice.identityString), txt: ["_v=\(peerMeshProtocolVersion)"], endpoint: e)
        #expect(out.first == .deliver(.lost(alice)))
        #expect(out.count == 2) // and the one log line
    }

    @Test func infoChangeIsReportedAsFound() {
        var t = AvahiBrowseTable(serviceType: "t", localIdentity: me.identity)
        let e = PeerEndpoint(host: "127.0.0.1", port: 9)
        _ = t.resolved(key(alice.identityString), txt: txt(alice, ["room": "1"]), endpoint: e)
        #expect(t.resolved(key(alice.identityString), txt: txt(alice, ["room": "2"]), endpoint: e)
            == [.deliver(.found(DiscoveredPeer(peer: alice, discoveryInfo: ["room": "2"], endpoints: [e])))])
    }

    @Test func daemonRestartRefindsPresentPeersAndLosesVanishedOnes() {
        var t = AvahiBrowseTable(serviceType: "t", localIdentity: me.identity)
        let bob = try! PeerID(displayName: "Bob")
        let e1 = PeerEndpoint(host: "127.0.0.1", port: 1)
        let e2 = PeerEndpoint(host: "127.0.0.1", port: 2)
        _ = t.resolved(key(alice.identityString), txt: txt(alice), endpoint: e1)
        _ = t.resolved(key(bob.identityString), txt: txt(bob), endpoint: e2)
        t.daemonLost()
        #expect(t.knownIdentities == [alice.identity, bob.identity])
        // Alice is seen again after the restart: found again, even with unchanged data.
        #expect(t.resolved(key(alice.identityString), txt: txt(alice), endpoint: e1)
            == [.deliver(.found(DiscoveredPeer(peer: alice, discoveryInfo: [:], endpoints: [e1])))])
        // Bob never comes back: lost when the window closes; a second expiry reports nothing.
        #expect(t.reconfirmExpired() == [.deliver(.lost(bob))])
        #expect(t.reconfirmExpired() == [])
        #expect(t.knownIdentities == [alice.identity])
    }

    @Test("A restarted advertiser's new SRV port is used the moment it is seen, before the resolver catches up")
    func newSRVPortWinsAtOnce() {
        var t = AvahiBrowseTable(serviceType: "t", localIdentity: me.identity)
        let k = key(alice.identityString)
        let old = AvahiBrowseTable.SRVRecord(port: 5000, target: "box.local")
        let new = AvahiBrowseTable.SRVRecord(port: 6000, target: "box.local")
        #expect(t.srvAdded(k, old) == [], "nothing to report before the item resolves")
        let at5000 = PeerEndpoint(host: "127.0.0.1", port: 5000), at6000 = PeerEndpoint(host: "127.0.0.1", port: 6000)
        #expect(t.resolved(k, txt: txt(alice), endpoint: at5000, hostName: "box.local")
            == [.deliver(.found(DiscoveredPeer(peer: alice, discoveryInfo: [:], endpoints: [at5000])))])
        // The restart announces port 6000: found again with it at once.
        #expect(t.srvAdded(k, new) == [.deliver(.found(DiscoveredPeer(peer: alice, discoveryInfo: [:], endpoints: [at6000])))])
        // A second later the resolver still reports the old port (avahi's cache-flush grace): nothing moves back.
        #expect(t.resolved(k, txt: txt(alice), endpoint: at5000, hostName: "box.local") == [])
        // The old record is flushed: still 6000.
        #expect(t.srvRemoved(k, old) == [])
        #expect(t.resolved(k, txt: txt(alice), endpoint: at6000, hostName: "box.local") == [])
        // An SRV naming another host is not applied to this host's address.
        #expect(t.srvAdded(k, AvahiBrowseTable.SRVRecord(port: 7000, target: "elsewhere.local")) == [])
        // Removing the item drops its SRV records too.
        #expect(t.removed(k) == [.deliver(.lost(alice))])
        #expect(t.size.srvRecords == 0 && t.size.items == 0)
    }

    @Test("SRV records per item are bounded")
    func srvRecordsAreBounded() {
        var t = AvahiBrowseTable(serviceType: "t", localIdentity: me.identity)
        let k = key(alice.identityString)
        _ = t.resolved(k, txt: txt(alice), endpoint: PeerEndpoint(host: "127.0.0.1", port: 1), hostName: "h.local")
        for p in 1...1_000 { _ = t.srvAdded(k, AvahiBrowseTable.SRVRecord(port: UInt16(p), target: "h.local")) }
        #expect(t.size.srvRecords == AvahiBrowseTable.maximumSRVRecordsPerItem)
    }

    @Test("SRV record data parses as RFC 2782 says; truncated or odd data is refused")
    func srvParsing() {
        let good: [UInt8] = [0, 0, 0, 0, 0x1f, 0x90, 3] + Array("box".utf8) + [5] + Array("local".utf8) + [0]
        good.withUnsafeBytes { #expect(AvahiCore.parseSRV($0) == AvahiBrowseTable.SRVRecord(port: 8080, target: "box.local")) }
        for bad in [Array(good.prefix(6)), [0, 0, 0, 0, 0, 0, 3, 0x61], [0, 0, 0, 0, 0, 0] + Array(good.suffix(from: 6)),
                    [0, 0, 0, 0, 0x1f, 0x90, 0]] as [[UInt8]] {
            bad.withUnsafeBytes { #expect(AvahiCore.parseSRV($0) == nil, "\(bad)") }
        }
    }

    /// The `srv` fuzz target starts from its seeds: each is records that parse, so the fuzzer starts inside the
    /// table's code rather than at the parser's first refusal.
    @Test("The srv fuzz seeds are whole records (op, length, data) whose data parses as host.local")
    func srvFuzzSeedsParse() throws {
        let seeds = try #require(FuzzEntryPoints.seeds()["srv"])
        #expect(seeds.count == 2)
        for seed in seeds {
            var at = 0, records = 0
            while at + 2 <= seed.count {
                let end = at + 2 + Int(seed[at + 1])
                try #require(end <= seed.count, "a record runs past its seed")
                Array(seed[(at + 2)..<end]).withUnsafeBytes { #expect(AvahiCore.parseSRV($0)?.target == "host.local") }
                at = end
                records += 1
            }
            #expect(at == seed.count && records >= 1)
            FuzzEntryPoints.srvRecords(seed)  // and the target takes it
        }
    }
}
