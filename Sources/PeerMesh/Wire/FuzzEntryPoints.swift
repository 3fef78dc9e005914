import MeshPOSIX

/// The decoders of outside bytes, each driven as an attacker's bytes would drive it, for `peermesh-fuzz`
/// (libFuzzer) and its corpus replays. Each entry point takes arbitrary bytes, must never trap, and checks what the
/// decoder promises (a decoded frame re-encodes to the same frame; a channel that faults stays closed).
package enum FuzzEntryPoints {
    /// The first byte picks how the rest is cut into reads (1–256 bytes each), so chunk boundaries are fuzzed too.
    private static func chunks(_ input: [UInt8]) -> [ArraySlice<UInt8>] {
        guard let first = input.first else { return [] }
        let size = Int(first) + 1
        var out: [ArraySlice<UInt8>] = []
        var at = 1
        while at < input.count {
            out.append(input[at..<min(at + size, input.count)])
            at += size
        }
        return out
    }

    /// Control and data frames from a TCP stream: the frame assembler, then each frame's decoder. Every frame
    /// that decodes must encode back to itself. Resource and stream frames also drive a receiver's machines, whose
    /// transfers and streams in flight must stay within their limits whatever the peer sends.
    package static func controlFrames(_ input: [UInt8]) {
        var assembler = FrameAssembler(maximumFrameLength: 4_096)
        var resources = ResourceStateMachine()
        let bound = resources.limits.maximumIncomingPerLink + resources.limits.maximumDiscardingPerLink
        var streams = StreamStateMachine()
        let streamBound = streams.limits.maximumIncomingPerLink + streams.limits.maximumClosingPerLink
        var faulted = false
        for piece in chunks(input) {
            piece.withUnsafeBytes { assembler.append($0) }
            while let result = assembler.next() {
                guard case .success(let frame) = result else { return }
                let again = frame.encoded()
                var check = FrameAssembler(maximumFrameLength: again.count)
                again.withUnsafeBytes { check.append($0) }
                guard case .success(let same)? = check.next(), same == frame else {
                    preconditionFailure("a decoded frame does not re-encode to itself: \(frame)")
                }
                if case .resource(let r) = frame, !faulted {
                    for action in resources.received(r, on: 1, from: fixtures.initiator) {
                        switch action {
                        case .fault: faulted = true
                        case .verify(let key, _): _ = resources.verified(key, outcome: .delivered, text: "")
                        default: break
                        }
                    }
                    precondition(resources.counts.incoming <= bound, "a peer grew the resource table past its limits")
                }
                if case .stream(let f) = frame, !faulted {
                    for case .fault in streams.received(f, on: 1, from: fixtures.initiator) { faulted = true }
                    precondition(streams.counts.incoming <= streamBound, "a peer grew the stream table past its limits")
                }
            }
        }
    }

    /// Out-of-band connection data: what decodes must encode back to the same bytes (the format is canonical).
    package static func nearbyConnectionData(_ input: [UInt8]) {
        guard case .success(let data) = NearbyConnectionData.decode(input) else { return }
        precondition(data.encoded() == input, "connection data does not re-encode to its own bytes")
    }

    /// A responder and an initiator in Noise mode fed the bytes as the peer's (preamble, handshake messages…), and
    /// an established channel fed them as records.
    package static func secureChannel(_ input: [UInt8]) {
        let pieces = chunks(input)
        var responder = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: fixtures.responder))
        var initiator = SecureChannel(configuration: .init(role: .initiator, preference: .optional, localPeer: fixtures.initiator))
        _ = initiator.start()
        var established = fixtures.established
        var closed = (false, false, false)
        for piece in pieces {
            piece.withUnsafeBytes { raw in
                for (i, events) in [responder.received(raw), initiator.received(raw), established.received(raw)].enumerated() {
                    for e in events {
                        if case .needsApproval = e, i == 1 { _ = initiator.approve() }
                        if case .fault = e {
                            switch i { case 0: closed.0 = true; case 1: closed.1 = true; default: closed.2 = true }
                        }
                    }
                }
            }
        }
        // A channel that faulted stays shut: more bytes produce nothing.
        let more: [UInt8] = [0, 0, 0, 1, 5]
        more.withUnsafeBytes { raw in
            if closed.0 { precondition(responder.received(raw).isEmpty, "a faulted responder answered") }
            if closed.2 { precondition(established.received(raw).isEmpty, "a faulted channel answered") }
        }
    }

    /// Datagrams at a session's socket: the header, then the router with a route for the datagram's own token
    /// (so the fuzzer gets past the stranger check), opened under a fixed key, and again in plaintext.
    package static func datagram(_ input: [UInt8]) {
        var bytes = input
        bytes.withUnsafeMutableBytes { d in
            guard case .success(let header) = DatagramHeader.decode(UnsafeRawBufferPointer(d)) else { return }
            let source = SocketAddress(numericHost: "127.0.0.1", port: 7_000)!
            for keyed in [true, false] {
                var router = DatagramRouter()
                router.routeUp(link: 1, peer: fixtures.initiator, localToken: header.token, remoteToken: 1, remote: source,
                               latches: true, now: 1)
                let (verdict, _) = router.received(header, from: source, now: 2) { _ in
                    var payload = UnsafeRawBufferPointer(rebasing: d[DatagramHeader.size...])
                    if keyed {
                        let body = UnsafeMutableRawBufferPointer(rebasing: d[DatagramHeader.size...])
                        guard let n = Sodium.open(key: fixtures.datagramKey, counter: header.sequence,
                                                  ad: UnsafeRawBufferPointer(rebasing: d[..<DatagramHeader.size]),
                                                  ciphertext: UnsafeRawBufferPointer(body), into: body)
                        else { return .failure(.unauthentic) }
                        payload = UnsafeRawBufferPointer(rebasing: body[..<n])
                    }
                    return DatagramBody.parse(kind: header.kind, payload: payload)
                }
                // Without the key nothing authenticates: a forgery would be a hole.
                if keyed, case .deliver = verdict { preconditionFailure("an unsealed datagram was delivered") }
            }
        }
    }

    /// A DNS-SD instance name and TXT record: the first byte is the instance name's length, then TXT strings,
    /// each prefixed by its length as on the wire.
    package static func txtRecord(_ input: [UInt8]) {
        guard let n = input.first else { return }
        let nameEnd = min(1 + Int(n), input.count)
        let name = String(decoding: input[1..<nameEnd], as: UTF8.self)
        var strings: [String] = []
        var at = nameEnd
        while at < input.count {
            let len = Int(input[at])
            let end = min(at + 1 + len, input.count)
            strings.append(String(decoding: input[(at + 1)..<end], as: UTF8.self))
            at = end
        }
        if case .success(let (peer, info)) = TXTRecord.decode(instanceName: name, txt: strings) {
            // What decodes is a peer whose identity is its key's, with discovery info that re-encodes.
            precondition(peer.publicKey?.identity == peer.identity, "a TXT record's key and instance name disagree")
            _ = TXTRecord.encode(peer: peer, discoveryInfo: info)
        }
    }

    /// SRV records from the LAN, as avahi's record browser hands them over (`AvahiCore.parseSRV`: priority, weight,
    /// port, then the target as DNS labels), each coming or going for one of four items of a resolved peer
    /// (`AvahiBrowseTable.srvAdded`/`srvRemoved`). The input is records, each a byte (bit 7: removed; bits 0–1: the
    /// item), a length and that many bytes of record data. A record that parses names a port and a target of no
    /// more characters than its data has bytes; the table never keeps more than `maximumSRVRecordsPerItem` an item,
    /// and the peer's endpoints stay the resolver's address.
    package static func srvRecords(_ input: [UInt8]) {
        let peer = fixtures.initiator
        var table = AvahiBrowseTable(serviceType: "mesh-audio", localIdentity: 1)
        let keys = (0..<4).map { AvahiBrowseTable.ItemKey(interface: 1, proto: 0, name: peer.identityString + ($0 == 0 ? "" : " #\($0 + 1)"),
                                                         domain: "local") }
        let txt = TXTRecord.encode(peer: peer, discoveryInfo: ["fmt": "f32le"])
        for key in keys {
            _ = table.resolved(key, txt: txt, endpoint: PeerEndpoint(host: "192.0.2.1", port: 7_000), hostName: "host.local")
        }
        var at = 0
        while at + 2 <= input.count {
            let op = input[at], end = min(at + 2 + Int(input[at + 1]), input.count)
            let rdata = input[(at + 2)..<end]
            at = end
            guard let srv = rdata.withUnsafeBytes({ AvahiCore.parseSRV($0) }) else { continue }
            // Each byte decodes to one character at most (an invalid one to U+FFFD, three bytes in UTF-8).
            precondition(srv.port != 0 && !srv.target.isEmpty && srv.target.unicodeScalars.count <= rdata.count,
                         "an SRV record parsed to more than its data: \(srv)")
            let key = keys[Int(op & 3)]
            let actions = op & 0x80 == 0 ? table.srvAdded(key, srv) : table.srvRemoved(key, srv)
            for case .deliver(.found(let found)) in actions {
                precondition(found.endpoints.allSatisfy { $0.host == "192.0.2.1" }, "an SRV record moved a peer's address")
            }
            precondition(table.size.items == keys.count
                         && table.size.srvRecords <= keys.count * AvahiBrowseTable.maximumSRVRecordsPerItem,
                         "the browse table grew past its bound: \(table.size)")
        }
    }

    /// Pairing (CPace) messages: as message 1 to a responder, as message 2 to an initiator, as message 3 to a
    /// responder that answered a real message 1. A wrong code must never verify.
    package static func pairing(_ input: [UInt8]) {
        var responder = Pairing.Responder(code: "1234-5678", binding: fixtures.binding)
        _ = try? responder.answer(input)
        var initiator = fixtures.pairingInitiator
        _ = try? initiator.answer(input)
        let answered = fixtures.pairingResponder
        if (try? answered.verify(input)) != nil { preconditionFailure("fuzz bytes passed a pairing proof") }
    }

    /// Well-formed inputs to start each target's corpus from (the fuzzer mutates its way out from them).
    package static func seeds() -> [String: [[UInt8]]] {
        let peer = fixtures.initiator
        let frames: [ControlFrame] = [
            .hello(peer: peer),
            .invite(.init(context: Array("PMPAIR1".utf8), timeoutMillis: 5_000, udpPort: 7_000, token: 42)),
            .accept(udpPort: 7_001, token: 43), .decline(.notTrusted, "not paired"), .data(Array("hello".utf8)),
            .heartbeat, .goodbye,
            .resource(.start(id: 1, size: 5, name: "a.wav")), .resource(.chunk(id: 1, bytes: [1, 2, 3, 4, 5])),
            .resource(.end(id: 1, sha256: Sodium.sha256([[1, 2, 3, 4, 5]]))), .resource(.cancel(id: 2)),
            .resource(.result(id: 3, .refused, "too many")),
            .stream(.open(id: 1, name: "mic")), .stream(.data(id: 1, bytes: [9, 9])), .stream(.credit(id: 1, bytes: 2)),
            .stream(.close(id: 1, byWriter: true, .finished)),
            .mesh(.introRequest(peer: fixtures.responder, members: [5, 6], fillsGap: true)), .mesh(.introData(forIdentity: 9, data: [1, 2])),
            .mesh(.introduce(peer: fixtures.responder, data: [3])), .mesh(.relink(identity: 11)),
            .relay(.request(pipe: 1, peer: fixtures.responder)), .relay(.incoming(pipe: 2, peer: fixtures.responder)),
            .relay(.data(pipe: 1, opener: true, bytes: [7, 7])), .relay(.credit(pipe: 1, opener: false, bytes: 2)),
            .relay(.close(pipe: 2, opener: false)), .datagram([1, 2, 3]),
            .sasNonce([UInt8](repeating: 0x5a, count: SecureChannel.nonceSize)),
        ]
        let stream = frames.flatMap { $0.encoded() }
        // A handshake's first messages, as an initiator writes them.
        var initiator = SecureChannel(configuration: .init(role: .initiator, preference: .required, localPeer: peer))
        var handshake: [UInt8] = []
        for case .write(let w) in initiator.start() { handshake += w }
        // Datagrams: sealed data, a ping, a plaintext body.
        func datagram(_ kind: DatagramHeader.Kind, sequence: UInt64, body: [UInt8], sealed: Bool) -> [UInt8] {
            var out = [UInt8](repeating: 0, count: DatagramHeader.size + body.count + Sodium.tagSize)
            let n = out.withUnsafeMutableBytes { buf in
                body.withUnsafeBytes { SessionCore.seal($0, kind: kind, token: 7, sequence: sequence,
                                                       key: sealed ? fixtures.datagramKey : nil, into: buf) }
            }
            return Array(out[..<n])
        }
        let txt = TXTRecord.encode(peer: peer, discoveryInfo: ["fmt": "f32le", "rate": "44100", "pair": "1"])
        var txtBytes = [UInt8(16)] + Array(peer.identityString.utf8)
        for t in txt { let b = Array(t.utf8.prefix(255)); txtBytes += [UInt8(b.count)] + b }
        let pairingFirst = Pairing.Initiator(code: "1234-5678", binding: fixtures.binding).firstMessage
        /// One record of the `srv` target: `op`, the data's length, then the SRV data naming host.local:`port`.
        func srv(_ op: UInt8, port: UInt16) -> [UInt8] {
            let data: [UInt8] = [0, 0, 0, 0, UInt8(port >> 8), UInt8(port & 0xff), 4] + Array("host".utf8) + [5]
                + Array("local".utf8) + [0]
            return [op, UInt8(data.count)] + data
        }
        return [
            "frames": [[0] + stream, [3] + stream, [255] + frames[1].encoded()],
            "channel": [[255] + handshake, [7] + handshake, [255] + SecureChannel.preamble(0) + frames[0].encoded()],
            "datagram": [datagram(.data, sequence: 1, body: Array("audio".utf8), sealed: true),
                         datagram(.ping, sequence: 2, body: [0, 0, 0, 0, 0, 0, 0, 9], sealed: true),
                         datagram(.data, sequence: 3, body: [1, 2, 3], sealed: false)],
            "txt": [txtBytes],
            // SRV data (priority and weight 0, a port, host.local): :7000 coming for the first item; then :7000 and
            // :7001 coming for the second, and :7000 going.
            "srv": [srv(0, port: 7_000), srv(1, port: 7_000) + srv(1, port: 7_001) + srv(0x81, port: 7_000)],
            "pairing": [pairingFirst, Array(pairingFirst.dropLast(3))],
            "nearby": [NearbyConnectionData(peer: fixtures.responder, forIdentity: peer.identity, ticket: Array(0..<16),
                                            port: 7_000, addresses: ["192.168.1.2", "fe80::1%1", "127.0.0.1"]).encoded(),
                       NearbyConnectionData(peer: fixtures.responder, forIdentity: 1, ticket: Array(repeating: 9, count: 16),
                                            port: 1, addresses: ["::1"]).encoded()],
        ]
    }

    /// Keys and states built once (each entry point copies what it mutates).
    private struct Fixtures: Sendable {
        let initiator: PeerID
        let responder: PeerID
        let established: SecureChannel
        let datagramKey: SecretKey
        let binding: [UInt8]
        let pairingInitiator: Pairing.Initiator
        let pairingResponder: Pairing.Responder

        init() {
            let i = try! PeerIdentity.generate(displayName: "fuzz-initiator")
            let r = try! PeerIdentity.generate(displayName: "fuzz-responder")
            initiator = i.peerID
            responder = r.peerID
            // A real handshake, in memory, to get a channel that takes records.
            var a = SecureChannel(configuration: .init(role: .initiator, preference: .required, localPeer: initiator))
            var b = SecureChannel(configuration: .init(role: .responder, preference: .required, localPeer: responder))
            /// Delivers every `.write` among `events` to `channel`; returns what it answered.
            func deliver(_ events: [SecureChannel.Event], to channel: inout SecureChannel) -> [SecureChannel.Event] {
                var out: [SecureChannel.Event] = []
                for case .write(let bytes) in events { out += bytes.withUnsafeBytes { channel.received($0) } }
                return out
            }
            var fromA = a.start()
            for _ in 0..<4 where !(a.isEncrypted && b.isEncrypted) {
                let fromB = deliver(fromA, to: &b)
                fromA = deliver(fromB, to: &a)
                for case .needsApproval in fromA { fromA += a.approve() }
            }
            _ = deliver(fromA, to: &b)
            precondition(a.isEncrypted && b.isEncrypted, "the fixture handshake did not finish")
            established = b
            datagramKey = SecretKey()
            binding = Sodium.randomBytes(32)
            pairingInitiator = Pairing.Initiator(code: "1234-5678", binding: binding)
            var responder = Pairing.Responder(code: "1234-5678", binding: binding)
            _ = try? responder.answer(Pairing.Initiator(code: "1234-5678", binding: binding).firstMessage)
            pairingResponder = responder
        }
    }

    private static let fixtures = Fixtures()
}
