import Testing
@testable import PeerMesh

// Pure tests of the wire codecs: TCP control frames and their assembler, the UDP datagram header, the replay
// window and the TXT record.

private typealias DecodeResult = Result<ControlFrame, ControlFrame.DecodeError>

private func decode(_ body: [UInt8]) -> DecodeResult { body.withUnsafeBytes { ControlFrame.decode(body: $0) } }

private func header(_ bytes: [UInt8]) -> Result<DatagramHeader, DatagramHeader.DecodeError> {
    bytes.withUnsafeBytes { DatagramHeader.decode($0) }
}

private func write(_ h: DatagramHeader, payload: [UInt8] = []) -> [UInt8] {
    var out = [UInt8](repeating: 0xee, count: DatagramHeader.size + payload.count)
    out.withUnsafeMutableBytes { h.write(to: $0) }
    out.replaceSubrange(DatagramHeader.size..., with: payload)
    return out
}

private func be64(_ v: UInt64) -> [UInt8] { (0..<8).map { UInt8((v >> UInt64(56 - 8 * $0)) & 0xff) } }

/// Feeds `stream` to a fresh assembler in chunks of `chunk` bytes; returns the frames and the first error.
private func assemble(_ stream: [UInt8], chunk: Int) -> (frames: [ControlFrame], error: ControlFrame.DecodeError?, pending: Int) {
    var a = FrameAssembler()
    var frames: [ControlFrame] = []
    var i = 0
    while i < stream.count {
        let end = min(stream.count, i + chunk)
        stream[i..<end].withUnsafeBytes { a.append($0) }
        i = end
        while let r = a.next() {
            switch r {
            case .success(let f): frames.append(f)
            case .failure(let e): return (frames, e, a.pendingBytes.count)
            }
        }
    }
    return (frames, nil, a.pendingBytes.count)
}

private let ann = try! PeerID(displayName: "Ann", identity: 0x0102_0304_0506_0708)
/// Ann with a key (fixed, so TXT records are reproducible): TXT records carry and check it.
private let annKeyed = try! PeerID(displayName: "Ann", keys: Noise.KeyPair(secret: SecretKey(copying: Array(1...32))))
private let annKey = "_k=" + annKeyed.publicKey!.hex
private let longName = String(repeating: "é", count: 31) + "a" // 63 UTF-8 bytes, 32 characters

/// One of each frame, with edge values.
private let sampleFrames: [ControlFrame] = [
    .hello(peer: ann),
    .hello(peer: try! PeerID(displayName: longName, identity: .max)),
    .hello(peer: try! PeerID(displayName: "x", identity: 1)),
    .invite(.init(context: [], timeoutMillis: 0, udpPort: 0, token: 0)),
    .invite(.init(context: [1, 2, 3], timeoutMillis: 30_000, udpPort: 4000, token: 0xdead_beef_cafe_f00d)),
    .invite(.init(context: (0..<ControlFrame.maximumContext).map { UInt8(truncatingIfNeeded: $0) },
                  timeoutMillis: .max, udpPort: .max, token: .max)),
    .accept(udpPort: 0, token: 0),
    .accept(udpPort: .max, token: .max),
    .decline(.declined, ""),
    .decline(.peerLimit, DeclineReason.peerLimit.description),
    .decline(.timedOut, "ü ∞ 🎧"),
    .decline(.simultaneousInvite, "x"),
    .decline(.alreadyConnected, "y"),
    .decline(.unavailable, String(repeating: "z", count: ControlFrame.maximumDeclineText)),
    .data([]),
    .data([0]),
    .data((0..<5000).map { UInt8(truncatingIfNeeded: $0 * 7) }),
    .heartbeat,
    .goodbye,
    .resource(.start(id: 1, size: 0, name: "a")),
    .resource(.start(id: .max, size: .max, name: String(repeating: "é", count: 127))),
    .resource(.chunk(id: 2, bytes: [0])),
    .resource(.chunk(id: 3, bytes: (0..<ResourceFrame.maximumChunk).map { UInt8(truncatingIfNeeded: $0 * 13) })),
    .resource(.end(id: 4, sha256: (0..<32).map { UInt8($0) })),
    .resource(.cancel(id: 5)),
    .resource(.result(id: 6, .delivered, "")),
    .resource(.result(id: 7, .storageFailed, "write(/tmp/x): No space left on device")),
    .stream(.open(id: 1, name: "mic")),
    .stream(.data(id: 2, bytes: (0..<StreamFrame.maximumData).map { UInt8(truncatingIfNeeded: $0) })),
    .stream(.credit(id: 3, bytes: UInt32(StreamFrame.window))),
    .stream(.close(id: 4, byWriter: true, .finished)),
    .stream(.close(id: 5, byWriter: false, .refused)),
    .mesh(.introRequest(peer: try! PeerID(displayName: "newcomer"))),
    .mesh(.introRequest(peer: try! PeerID(displayName: "newcomer"), members: (0..<UInt64(MeshFrame.maximumListed)).map { $0 << 40 | 7 },
                        fillsGap: true)),
    .mesh(.introData(forIdentity: 7, data: [])),
    .mesh(.introData(forIdentity: .max, data: [UInt8](repeating: 3, count: MeshFrame.maximumData))),
    .mesh(.introduce(peer: try! PeerID(displayName: "member"), data: [1, 2, 3])),
    .mesh(.relink(identity: .max)),
    .relay(.request(pipe: 1, peer: try! PeerID(displayName: "far member"))),
    .relay(.incoming(pipe: .max, peer: try! PeerID(displayName: "caller"))),
    .relay(.data(pipe: 3, opener: true, bytes: [UInt8](repeating: 9, count: RelayFrame.maximumData))),
    .relay(.data(pipe: 3, opener: false, bytes: [1])),
    .relay(.credit(pipe: 4, opener: false, bytes: UInt32(RelayFrame.window))),
    .relay(.close(pipe: 5, opener: true)),
    .datagram([1, 2, 3]),
    .sasNonce((0..<32).map { UInt8($0) }),
]

@Suite struct WireCodecTests {

    // MARK: Control frames

    @Test func goldenEncodings() {
        #expect(ControlFrame.heartbeat.encoded() == [0, 0, 0, 1, 6])
        #expect(ControlFrame.goodbye.encoded() == [0, 0, 0, 1, 7])
        #expect(ControlFrame.data([9, 8, 7]).encoded() == [0, 0, 0, 4, 5, 9, 8, 7])
        #expect(ControlFrame.accept(udpPort: 0x1234, token: 0x0102_0304_0506_0708).encoded()
                == [0, 0, 0, 11, 3, 0x12, 0x34, 1, 2, 3, 4, 5, 6, 7, 8])
        #expect(ControlFrame.hello(peer: ann).encoded()
                == [0, 0, 0, 18, 1, 0x50, 0x4d, 0x53, 0x48, peerMeshProtocolVersion, 1, 2, 3, 4, 5, 6, 7, 8, 3, 0x41, 0x6e, 0x6e])
        #expect(ControlFrame.invite(.init(context: [0xaa], timeoutMillis: 0x0a0b_0c0d, udpPort: 0x1f90, token: 5)).encoded()
                == [0, 0, 0, 18, 2, 0x0a, 0x0b, 0x0c, 0x0d, 0x1f, 0x90] + be64(5) + [0, 1, 0xaa])
        #expect(ControlFrame.decline(.peerLimit, "no").encoded() == [0, 0, 0, 6, 4, 2, 0, 2, 0x6e, 0x6f])
        #expect(ControlFrame.sasNonce([UInt8](repeating: 0x5a, count: 32)).encoded()
                == [0, 0, 0, 33, 26] + [UInt8](repeating: 0x5a, count: 32))
    }

    @Test func aSASNonceIsExactly32Bytes() {
        #expect(decode([26]) == .failure(.truncated))
        #expect(decode([26] + [UInt8](repeating: 1, count: 31)) == .failure(.truncated))
        #expect(decode([26] + [UInt8](repeating: 1, count: 33)) == .failure(.trailingBytes))
        #expect(decode([26] + [UInt8](repeating: 1, count: 32)) == .success(.sasNonce([UInt8](repeating: 1, count: 32))))
    }

    @Test("MESH_INTRO_REQUEST: the newcomer, a fills-a-gap byte (0 or 1), then a count byte and that many identities; short, long, another purpose or without the list is refused")
    func aMeshIntroRequestListsWhomItAsked() throws {
        let newcomer = try PeerID(displayName: "n")
        let body = Array(ControlFrame.mesh(.introRequest(peer: newcomer, members: [1, 0x0102_0304_0506_0708])).encoded()[4...])
        let peerBytes = 1 + 1 + 1 + 32  // type · name length · "n" · key
        #expect(Array(body[peerBytes...]) == [0, 2] + be64(1) + be64(0x0102_0304_0506_0708))
        #expect(decode(body) == .success(.mesh(.introRequest(peer: newcomer, members: [1, 0x0102_0304_0506_0708]))))
        #expect(decode(Array(body.dropLast())) == .failure(.truncated))
        #expect(decode(Array(body[..<peerBytes])) == .failure(.truncated), "the purpose and the list's count are required")
        #expect(decode(Array(body[...peerBytes])) == .failure(.truncated))
        #expect(decode(body + [0]) == .failure(.trailingBytes))
        var overCounted = body
        overCounted[peerBytes + 1] = 3
        #expect(decode(overCounted) == .failure(.truncated))
        var fills = body
        fills[peerBytes] = 1
        #expect(decode(fills) == .success(.mesh(.introRequest(peer: newcomer, members: [1, 0x0102_0304_0506_0708], fillsGap: true))))
        fills[peerBytes] = 2
        #expect(decode(fills) == .failure(.badField("mesh request purpose")))
    }

    @Test("MESH_RELINK: type 27, the lost member's identity (u64); nothing more, nothing less")
    func aMeshRelinkNamesTheLostMember() {
        let bytes = ControlFrame.mesh(.relink(identity: 0x0102_0304_0506_0708)).encoded()
        #expect(bytes == [0, 0, 0, 9, 27] + be64(0x0102_0304_0506_0708))
        let body = Array(bytes[4...])
        #expect(decode(body) == .success(.mesh(.relink(identity: 0x0102_0304_0506_0708))))
        #expect(decode(Array(body.dropLast())) == .failure(.truncated))
        #expect(decode([27]) == .failure(.truncated))
        #expect(decode(body + [0]) == .failure(.trailingBytes))
    }

    @Test func everyFrameRoundTrips() {
        for f in sampleFrames {
            let bytes = f.encoded()
            let length = Int(bytes[0]) << 24 | Int(bytes[1]) << 16 | Int(bytes[2]) << 8 | Int(bytes[3])
            #expect(length == bytes.count - 4)
            #expect(decode(Array(bytes[4...])) == .success(f))
            let (frames, error, pending) = assemble(bytes, chunk: bytes.count)
            #expect(frames == [f])
            #expect(error == nil)
            #expect(pending == 0)
        }
    }

    @Test(arguments: [1, 2, 3, 5, 7, 64, 1000, 65_536, 1 << 20])
    func framesSplitAtAnyBoundaryReassemble(_ chunk: Int) {
        let stream = sampleFrames.flatMap { $0.encoded() }
        let (frames, error, pending) = assemble(stream, chunk: chunk)
        #expect(error == nil)
        #expect(frames == sampleFrames)
        #expect(pending == 0)
    }

    @Test func assemblerWaitsForTheRestAndKeepsPendingBytes() {
        var a = FrameAssembler()
        let bytes = ControlFrame.data([1, 2, 3]).encoded() + ControlFrame.heartbeat.encoded()[0..<3]
        bytes.withUnsafeBytes { a.append($0) }
        #expect(a.next() == .success(.data([1, 2, 3])))
        #expect(a.next() == nil)
        #expect(a.pendingBytes == [0, 0, 0])
        [UInt8](arrayLiteral: 1, 6).withUnsafeBytes { a.append($0) }
        #expect(a.next() == .success(.heartbeat))
        #expect(a.next() == nil)
        #expect(a.pendingBytes == [])
    }

    @Test func assemblerCompactsALongStream() {
        // Enough frames to pass the 64 KiB compaction threshold several times, fed in odd-sized chunks.
        let frames = (0..<3000).map { ControlFrame.data([UInt8(truncatingIfNeeded: $0), 1, 2, 3, 4, 5, 6, 7, 8, 9]) }
        let stream = frames.flatMap { $0.encoded() }
        let (got, error, pending) = assemble(stream, chunk: 4093)
        #expect(error == nil)
        #expect(got == frames)
        #expect(pending == 0)
    }

    @Test func oversizeAndZeroLengthsFail() {
        let max = ControlFrame.maximumFrameLength
        #expect(max == 16 << 20)
        func lengthPrefix(_ n: Int) -> [UInt8] { [UInt8(n >> 24 & 0xff), UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff)] }
        #expect(assemble(lengthPrefix(max + 1) + [5], chunk: 100).error == .oversize(max + 1))
        #expect(assemble([0xff, 0xff, 0xff, 0xff], chunk: 100).error == .oversize(0xffff_ffff))
        #expect(assemble([0, 0, 0, 0, 6], chunk: 100).error == .oversize(0))
        // The largest legal length just waits for its body.
        let r = assemble(lengthPrefix(max) + [5, 1, 2], chunk: 100)
        #expect(r.error == nil && r.frames == [] && r.pending == 7)
        // The error sticks: the stream is garbage.
        var a = FrameAssembler()
        (lengthPrefix(max + 1) + ControlFrame.heartbeat.encoded()).withUnsafeBytes { a.append($0) }
        #expect(a.next() == .failure(.oversize(max + 1)))
        #expect(a.next() == .failure(.oversize(max + 1)))
    }

    @Test func helloFailures() {
        func hello(magic: [UInt8] = ControlFrame.magic, version: UInt8 = peerMeshProtocolVersion, id: UInt64 = 7, name: [UInt8] = Array("Ann".utf8),
                   count: Int? = nil) -> [UInt8] {
            [1] + magic + [version] + be64(id) + [UInt8(count ?? name.count)] + name
        }
        #expect(decode(hello()) == .success(.hello(peer: try! PeerID(displayName: "Ann", identity: 7))))
        #expect(decode(hello(magic: [0x50, 0x4d, 0x53, 0x49])) == .failure(.badMagic))
        #expect(decode(hello(version: 0)) == .failure(.unsupportedVersion(0)))
        #expect(decode(hello(version: 1)) == .failure(.unsupportedVersion(1)), "a v1 peer is refused")
        #expect(decode(hello(version: 2)) == .failure(.unsupportedVersion(2)), "a v2 peer is refused")
        #expect(decode(hello(version: 3)) == .failure(.unsupportedVersion(3)), "a v3 peer is refused")
        #expect(decode(hello(version: peerMeshProtocolVersion + 1)) == .failure(.unsupportedVersion(peerMeshProtocolVersion + 1)))
        #expect(decode(hello(name: [])) == .failure(.badField("peer")))
        #expect(decode(hello(name: [UInt8](repeating: 0x61, count: 64))) == .failure(.badField("peer")))
        #expect(decode(hello(name: [UInt8](repeating: 0x61, count: 63))).map { _ in true } == .success(true))
        #expect(decode(hello(id: 0)) == .failure(.badField("peer")))
        #expect(decode(hello(name: [0x41, 0xc3])) == .failure(.badField("peer"))) // split UTF-8
        #expect(decode(hello(name: [0xff])) == .failure(.badField("peer")))
        #expect(decode(hello() + [0]) == .failure(.trailingBytes))
        #expect(decode(hello(count: 4)) == .failure(.truncated))
        #expect(decode(Array(hello().prefix(3))) == .failure(.truncated))
        #expect(decode(Array(hello().prefix(5))) == .failure(.truncated))
        #expect(decode(Array(hello().prefix(6))) == .failure(.truncated))
        #expect(decode(Array(hello().prefix(14))) == .failure(.truncated))
    }

    @Test func otherFrameFailures() {
        #expect(decode([]) == .failure(.truncated))
        for t: UInt8 in [0, 28, 29, 0x80, 0xff] { #expect(decode([t]) == .failure(.unknownType(t))) }
        #expect(decode([6, 0]) == .failure(.trailingBytes))
        #expect(decode([7, 1, 2]) == .failure(.trailingBytes))
        #expect(decode([3, 0, 1] + be64(1) + [0]) == .failure(.trailingBytes))
        #expect(decode([3, 0, 1] + be64(1).prefix(7)) == .failure(.truncated))
        #expect(decode([2, 0, 0, 0, 1, 0, 2] + be64(3) + [0, 2, 9]) == .failure(.truncated))
        #expect(decode([2, 0, 0, 0, 1, 0, 2] + be64(3) + [0, 1, 9, 9]) == .failure(.trailingBytes))
        #expect(decode([4, 0, 0, 0]) == .failure(.badField("reason")))
        #expect(decode([4, 8, 0, 0]) == .failure(.badField("reason")))
        #expect(decode([4, 1, 0, 2, 0xc3, 0x28]) == .failure(.badField("text")))
        #expect(decode([4, 1, 0, 3, 0x61]) == .failure(.truncated))
        #expect(decode([4, 1, 0, 1, 0x61, 0x62]) == .failure(.trailingBytes))
        #expect(decode([5]) == .success(.data([])))
    }

    @Test func resourceGoldenEncodings() {
        #expect(ControlFrame.resource(.start(id: 1, size: 2, name: "a")).encoded()
                == [0, 0, 0, 15, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0x61])
        #expect(ControlFrame.resource(.chunk(id: 0x0102_0304, bytes: [9])).encoded() == [0, 0, 0, 6, 9, 1, 2, 3, 4, 9])
        #expect(ControlFrame.resource(.cancel(id: 2)).encoded() == [0, 0, 0, 5, 11, 0, 0, 0, 2])
        #expect(ControlFrame.resource(.result(id: 2, .refused, "no")).encoded() == [0, 0, 0, 10, 12, 0, 0, 0, 2, 4, 0, 2, 0x6e, 0x6f])
    }

    @Test func meshFrameFailures() {
        #expect(decode([17, 0]) == .failure(.truncated))
        #expect(decode([17, 0] + [UInt8](repeating: 1, count: 32)) == .failure(.badField("mesh peer")), "an empty name")
        #expect(decode([18, 0, 0, 0, 0, 0, 0, 0, 1] + [UInt8](repeating: 0, count: MeshFrame.maximumData + 1))
                == .failure(.badField("mesh data length")))
        #expect(decode([19, 1, 0x61] + [UInt8](repeating: 1, count: 32)) == .failure(.badField("mesh data length")), "no data")
    }

    @Test func relayFrameEncodingsAndFailures() {
        #expect(ControlFrame.relay(.data(pipe: 1, opener: true, bytes: [7])).encoded() == [0, 0, 0, 7, 22, 0, 0, 0, 1, 1, 7])
        #expect(ControlFrame.relay(.credit(pipe: 2, opener: false, bytes: 3)).encoded() == [0, 0, 0, 10, 23, 0, 0, 0, 2, 0, 0, 0, 0, 3])
        #expect(ControlFrame.relay(.close(pipe: 2, opener: true)).encoded() == [0, 0, 0, 6, 24, 0, 0, 0, 2, 1])
        #expect(ControlFrame.datagram([5]).encoded() == [0, 0, 0, 2, 25, 5])
        #expect(decode([20, 0, 0, 0]) == .failure(.truncated))
        #expect(decode([20, 0, 0, 0, 1, 0] + [UInt8](repeating: 1, count: 32)) == .failure(.badField("mesh peer")), "an empty name")
        #expect(decode([21, 0, 0, 0, 1, 1, 0x61] + [UInt8](repeating: 1, count: 31)) == .failure(.truncated))
        #expect(decode([22, 0, 0, 0, 1, 1]) == .failure(.badField("relay data length")), "no bytes")
        #expect(decode([22, 0, 0, 0, 1, 1] + [UInt8](repeating: 0, count: RelayFrame.maximumData + 1))
                == .failure(.badField("relay data length")))
        #expect(decode([22, 0, 0, 0, 1, 2, 0]) == .failure(.badField("relay side")))
        #expect(decode([23, 0, 0, 0, 1, 0, 0, 0, 0, 0]) == .failure(.badField("relay credit")), "zero credit")
        #expect(decode([23, 0, 0, 0, 1, 0, 0, 4, 0, 1]) == .failure(.badField("relay credit")), "credit past the window")
        #expect(decode([24, 0, 0, 0, 1]) == .failure(.truncated))
        #expect(decode([24, 0, 0, 0, 1, 0, 0]) == .failure(.trailingBytes))
        #expect(decode([25]) == .failure(.badField("datagram length")), "an empty datagram")
        #expect(decode([25] + [UInt8](repeating: 1, count: Session.maximumDatagramSize + 1)) == .failure(.badField("datagram length")),
                "larger than a UDP datagram may be")
        #expect(decode([25] + [UInt8](repeating: 1, count: Session.maximumDatagramSize)) == .success(.datagram([UInt8](repeating: 1, count: Session.maximumDatagramSize))))
    }

    @Test func streamFrameEncodingsAndFailures() {
        #expect(ControlFrame.stream(.open(id: 1, name: "a")).encoded() == [0, 0, 0, 7, 13, 0, 0, 0, 1, 1, 0x61])
        #expect(ControlFrame.stream(.credit(id: 1, bytes: 2)).encoded() == [0, 0, 0, 9, 15, 0, 0, 0, 1, 0, 0, 0, 2])
        #expect(ControlFrame.stream(.close(id: 1, byWriter: false, .cancelled)).encoded() == [0, 0, 0, 7, 16, 0, 0, 0, 1, 1, 1])
        #expect(decode([13, 0, 0, 0, 1, 0]) == .failure(.badField("stream name")), "an empty name")
        #expect(decode([14, 0, 0, 0, 1]) == .failure(.badField("stream data length")))
        #expect(decode([15, 0, 0, 0, 1, 0, 0, 0, 0]) == .failure(.badField("stream credit")), "zero credit")
        #expect(decode([15, 0, 0, 0, 1, 0, 4, 0, 1]) == .failure(.badField("stream credit")), "credit past the window")
        #expect(decode([16, 0, 0, 0, 1, 2, 0]) == .failure(.badField("stream side")))
        #expect(decode([16, 0, 0, 0, 1, 0, 9]) == .failure(.badField("stream end")))
        #expect(decode([16, 0, 0, 0, 1, 0]) == .failure(.truncated))
    }

    /// A resource name becomes a file name on the receiver: a START whose name is not one path component is malformed.
    @Test(arguments: [".", "..", "a/b", "/etc", "x\u{0}y", "tab\there", "del\u{7f}", ""])
    func resourceNamesThatAreNotOnePathComponentDoNotDecode(_ name: String) {
        let n = Array(name.utf8)
        let body: [UInt8] = [8, 0, 0, 0, 1] + [UInt8](repeating: 0, count: 8) + [UInt8(n.count)] + n
        #expect(decode(body) == .failure(.badField("resource name")))
        #expect(!ResourceName.isValid(name))
    }

    /// One that does not show what it is (a C1 CSI that would rewrite a terminal listing it; a right-to-left override
    /// that makes `invoice\u{202e}fdp.exe` read as `invoiceexe.pdf`; a zero-width space; a byte-order mark; a soft
    /// hyphen) decodes, since peers built before this rule may send one, and is refused (the state machine's test).
    @Test(arguments: ["\u{9b}2J", "invoice\u{202e}fdp.exe", "a\u{200b}b", "\u{feff}x", "line\u{2028}break", "soft\u{ad}hyphen"])
    func resourceNamesThatHideSomethingDecodeButAreNotValid(_ name: String) {
        #expect(!ResourceName.isValid(name))
        #expect(decode(Array(ControlFrame.resource(.start(id: 1, size: 5, name: name)).encoded().dropFirst(4)))
                == .success(.resource(.start(id: 1, size: 5, name: name))))
    }

    @Test(arguments: ["song.raw", "é è 🎧.flac", ".hidden", "a..b", "שיר.wav", "名前.txt", String(repeating: "x", count: 255),
                      "👩\u{200d}💻 notes.txt", "می\u{200c}خواهم.txt"])
    func resourceNamesThatArePlainFileNamesDecode(_ name: String) {
        #expect(ResourceName.isValid(name))
        #expect(decode(Array(ControlFrame.resource(.start(id: 1, size: 5, name: name)).encoded().dropFirst(4)))
                == .success(.resource(.start(id: 1, size: 5, name: name))))
    }

    @Test func resourceFrameFailures() {
        #expect(decode([9, 0, 0, 0, 1]) == .failure(.badField("resource chunk length")), "an empty chunk")
        #expect(decode([9, 0, 0, 0, 1] + [UInt8](repeating: 0, count: ResourceFrame.maximumChunk + 1))
                == .failure(.badField("resource chunk length")))
        #expect(decode([10, 0, 0, 0, 1] + [UInt8](repeating: 0, count: 31)) == .failure(.truncated))
        #expect(decode([10, 0, 0, 0, 1] + [UInt8](repeating: 0, count: 33)) == .failure(.trailingBytes))
        #expect(decode([11, 0, 0]) == .failure(.truncated))
        #expect(decode([12, 0, 0, 0, 1, 99, 0, 0]) == .failure(.badField("resource outcome")))
        #expect(decode([12, 0, 0, 0, 1, 0, 0, 2, 0xff, 0xfe]) == .failure(.badField("resource text")))
        #expect(decode([8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 3, 0x61]) == .failure(.truncated))
        #expect(decode([8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0xc3]) == .failure(.badField("resource name")), "broken UTF-8")
    }

    /// Decline text is cut to 1024 bytes on a character boundary, so the frame always decodes.
    @Test func longDeclineTextIsCutOnACharacterBoundary() {
        let ascii = String(repeating: "a", count: 2000)
        #expect(decode(Array(ControlFrame.decline(.declined, ascii).encoded()[4...]))
                == .success(.decline(.declined, String(repeating: "a", count: 1024))))
        // 1023 ASCII bytes then a 2-byte character straddling the limit: the character is dropped whole.
        let straddle = String(repeating: "a", count: 1023) + "é" + "b"
        #expect(decode(Array(ControlFrame.decline(.declined, straddle).encoded()[4...]))
                == .success(.decline(.declined, String(repeating: "a", count: 1023))))
        // 4-byte characters: 256 of them fill the limit exactly; 257 lose the last one.
        let emoji = String(repeating: "🎧", count: 257)
        #expect(decode(Array(ControlFrame.decline(.declined, emoji).encoded()[4...]))
                == .success(.decline(.declined, String(repeating: "🎧", count: 256))))
        let emoji2 = "ab" + String(repeating: "🎧", count: 300)
        #expect(decode(Array(ControlFrame.decline(.declined, emoji2).encoded()[4...]))
                == .success(.decline(.declined, "ab" + String(repeating: "🎧", count: 255))))
    }

    /// What the decoder takes is what PROTOCOL.md allows, and no more: a DECLINE's text up to 1024 bytes (a peer
    /// cannot send 64 KiB of it), a data datagram's payload up to 1184 bytes.
    @Test func receiversEnforceTheDocumentedLimits() {
        let at = [UInt8](repeating: 0x61, count: 1024), over = at + [0x61]
        #expect(decode([4, 1, 0x04, 0x00] + at) == .success(.decline(.declined, String(repeating: "a", count: 1024))))
        /// The decoder's error, or nil when it decoded (a failed expectation then prints no 64 KiB text).
        func error(_ r: Result<ControlFrame, ControlFrame.DecodeError>) -> ControlFrame.DecodeError? {
            if case .failure(let e) = r { e } else { nil }
        }
        #expect(error(decode([4, 1, 0x04, 0x01] + over)) == .badField("text"), "1025 bytes of text")
        #expect(error(decode([4, 1, 0xff, 0xff] + [UInt8](repeating: 0x61, count: 65_535))) == .badField("text"))
        for (size, ok) in [(1, true), (Session.maximumDatagramSize, true), (Session.maximumDatagramSize + 1, false),
                           (4_000, false), (65_000, false)] {
            let payload = [UInt8](repeating: 7, count: size)
            let parsed = payload.withUnsafeBytes { DatagramBody.parse(kind: .data, payload: $0) }
            #expect(parsed == (ok ? .success(.data) : .failure(.malformed)), "a \(size)-byte data payload")
        }
    }

    // MARK: Datagram header

    @Test func datagramHeaderRoundTrips() {
        for kind in [DatagramHeader.Kind.data, .ping, .pong] {
            for (token, seq) in [(UInt64(0), UInt64(0)), (1, 1), (.max, .max), (0x0102_0304_0506_0708, 0x1112_1314_1516_1718)] {
                let h = DatagramHeader(kind: kind, token: token, sequence: seq)
                let bytes = write(h, payload: [1, 2, 3])
                #expect(header(bytes) == .success(h))
                #expect(header(Array(bytes.prefix(DatagramHeader.size))) == .success(h))
            }
        }
        #expect(write(DatagramHeader(kind: .pong, token: 0x0102_0304_0506_0708, sequence: 9))
                == [0x50, 0x4d, peerMeshProtocolVersion, 3] + be64(0x0102_0304_0506_0708) + be64(9))
    }

    @Test func datagramHeaderFailures() {
        let good = write(DatagramHeader(kind: .data, token: 5, sequence: 6))
        for n in 0..<DatagramHeader.size { #expect(header(Array(good.prefix(n))) == .failure(.short)) }
        var b = good; b[0] = 0x51
        #expect(header(b) == .failure(.badMagic))
        b = good; b[1] = 0
        #expect(header(b) == .failure(.badMagic))
        b = good; b[2] = 1
        #expect(header(b) == .failure(.badVersion))
        b = good; b[2] = 2
        #expect(header(b) == .failure(.badVersion))
        b = good; b[2] = 3
        #expect(header(b) == .failure(.badVersion))
        b = good; b[2] = 5
        #expect(header(b) == .failure(.badVersion))
        b = good; b[2] = 0
        #expect(header(b) == .failure(.badVersion))
        for k: UInt8 in [0, 4, 0xff] {
            b = good; b[3] = k
            #expect(header(b) == .failure(.badKind))
        }
    }

    // MARK: Fuzz

    @Test func randomBytesNeverTrap() {
        var rng = SeededRNG(seed: 0xf00d)
        var outcomes: [String: Int] = [:]
        for _ in 0..<100_000 {
            let n = Int.random(in: 0...40, using: &rng)
            var bytes = (0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) }
            // Bias half of the inputs toward valid types and small lengths, to reach deeper code.
            if n > 0, Bool.random(using: &rng) { bytes[0] = UInt8.random(in: 0...8, using: &rng) }
            outcomes["frame " + outcome(decode(bytes)), default: 0] += 1
            var d = bytes
            if n >= 4, Bool.random(using: &rng) { // mostly-valid datagram headers
                d[0] = 0x50; d[1] = 0x4d; d[2] = UInt8.random(in: (peerMeshProtocolVersion - 2)...peerMeshProtocolVersion, using: &rng); d[3] = UInt8.random(in: 0...4, using: &rng)
            }
            outcomes["header " + outcome(header(d)), default: 0] += 1
            var stream = bytes
            if Bool.random(using: &rng) { stream = [0, 0, 0, UInt8(truncatingIfNeeded: n)] + bytes }
            outcomes["assembler " + assemblerOutcome(stream, chunk: Int.random(in: 1...8, using: &rng)), default: 0] += 1
        }
        #expect(outcomes.filter { $0.key.hasPrefix("frame ") }.values.reduce(0, +) == 100_000)
        #expect(outcomes["frame ok", default: 0] > 0)
        #expect(outcomes["frame truncated", default: 0] > 0)
        #expect(outcomes["frame unknownType", default: 0] > 0)
        #expect(outcomes["header short", default: 0] > 0)
        #expect(outcomes["header ok", default: 0] > 0)
        #expect(outcomes["header badKind", default: 0] > 0)
        #expect(outcomes["assembler oversize", default: 0] > 0)
        #expect(outcomes["assembler frames", default: 0] > 0)
        print("random-bytes fuzz outcomes:", outcomes.sorted { $0.key < $1.key })
    }

    @Test func mutatedFramesAndDatagramsNeverTrap() {
        var rng = SeededRNG(seed: 0xbeef)
        let frames = sampleFrames.filter { $0.encoded().count < 2000 }.map { $0.encoded() }
        let datagrams = [write(DatagramHeader(kind: .data, token: 7, sequence: 9), payload: [1, 2, 3]),
                         write(DatagramHeader(kind: .ping, token: .max, sequence: 1), payload: be64(12345))]
        var outcomes: [String: Int] = [:]
        for i in 0..<100_000 {
            let isDatagram = i % 4 == 3
            var b = isDatagram ? datagrams.randomElement(using: &rng)! : frames.randomElement(using: &rng)!
            switch Int.random(in: 0..<5, using: &rng) {
            case 0: // bit flips
                for _ in 0..<Int.random(in: 1...3, using: &rng) {
                    let at = Int.random(in: 0..<b.count, using: &rng)
                    b[at] ^= 1 << UInt8.random(in: 0...7, using: &rng)
                }
            case 1: // truncation
                b.removeLast(Int.random(in: 1...b.count, using: &rng))
            case 2: // extension
                b += (0..<Int.random(in: 1...16, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            case 3: // a random byte overwritten
                b[Int.random(in: 0..<b.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            default: // a length field bumped (prefix, or an inner count)
                let at = Int.random(in: 0..<min(b.count, 24), using: &rng)
                b[at] = b[at] &+ UInt8.random(in: 1...3, using: &rng)
            }
            if isDatagram {
                outcomes["header " + outcome(header(b)), default: 0] += 1
            } else {
                outcomes["frame " + outcome(decode(Array(b.dropFirst(4)))), default: 0] += 1
                outcomes["assembler " + assemblerOutcome(b, chunk: Int.random(in: 1...64, using: &rng)), default: 0] += 1
            }
        }
        #expect(outcomes.filter { $0.key.hasPrefix("frame ") }.values.reduce(0, +) == 75_000)
        #expect(outcomes.filter { $0.key.hasPrefix("header ") }.values.reduce(0, +) == 25_000)
        #expect(outcomes["frame ok", default: 0] > 0)
        #expect(outcomes["frame truncated", default: 0] > 0)
        #expect(outcomes["frame trailingBytes", default: 0] > 0)
        #expect(outcomes["header ok", default: 0] > 0)
        #expect(outcomes["header short", default: 0] > 0)
        print("mutation fuzz outcomes:", outcomes.sorted { $0.key < $1.key })
    }

    // MARK: Replay window

    @Test("A link's sequence numbers stop at the ceiling: refused from then on, however many tries, never wrapped to a used nonce")
    func sequenceNumbersStopAtTheCeiling() {
        let counters = LinkCounters()
        #expect(counters.takeSequence() == 1)
        #expect(counters.takeSequence() == 2)
        counters.nextSequence.store(maximumDatagramSequence - 2, ordering: .relaxed)
        #expect(counters.takeSequence() == maximumDatagramSequence - 2)
        #expect(counters.takeSequence() == maximumDatagramSequence - 1)
        for _ in 0..<10_000 { #expect(counters.takeSequence() == nil) }
        #expect(counters.nextSequence.load(ordering: .relaxed) == maximumDatagramSequence, "it did not move on")
    }

    @Test func replayWindowAcceptsEachSequenceOnce() {
        var w = ReplayWindow()
        #expect(w.accept(0) == false)
        for s in UInt64(1)...3000 { #expect(w.accept(s) == true) }
        for s in UInt64(1977)...3000 { #expect(w.accept(s) == false) }  // duplicates inside the window
        for s in UInt64(1)...1976 { #expect(w.accept(s) == false) }     // too old to tell
        #expect(w.accept(0) == false)
    }

    @Test func replayWindowReorderingAndAge() {
        var w = ReplayWindow()
        #expect(w.accept(100) == true)
        #expect(w.accept(50) == true)
        #expect(w.accept(50) == false)
        #expect(w.accept(99) == true)
        #expect(w.accept(1) == true)
        #expect(w.accept(100) == false)
        #expect(w.accept(2000) == true)
        #expect(w.accept(2000 - 1024) == false)     // exactly one window behind: too old
        #expect(w.accept(2000 - 1023) == true)      // the oldest still inside
        #expect(w.accept(2000 - 1023) == false)
        #expect(w.accept(1500) == true)
        #expect(w.accept(2001) == true)
    }

    @Test func replayWindowBigJumps() {
        var w = ReplayWindow()
        for s in UInt64(1)...1024 { #expect(w.accept(s) == true) }
        #expect(w.accept(1025) == true)            // reuses sequence 1's bit
        #expect(w.accept(1) == false)              // now too old
        #expect(w.accept(2) == false)              // still remembered
        #expect(w.accept(1500) == true)            // clears 1026…1500
        #expect(w.accept(600) == false)
        #expect(w.accept(1400) == true)
        #expect(w.accept(10_000) == true)          // beyond the window: everything forgotten
        #expect(w.accept(1500) == false)
        #expect(w.accept(9_999) == true)
        #expect(w.accept(UInt64.max) == true)
        #expect(w.accept(UInt64.max - 1) == true)
        #expect(w.accept(UInt64.max) == false)
        #expect(w.accept(10_000) == false)
        #expect(w.accept(UInt64.max - 1023) == true)
        #expect(w.accept(UInt64.max - 1024) == false)
    }

    @Test func replayWindowMatchesAReferenceModel() {
        var rng = SeededRNG(seed: 42)
        var w = ReplayWindow()
        var seen = Set<UInt64>()
        var highest: UInt64 = 0
        var accepted = 0
        for _ in 0..<50_000 {
            let s: UInt64
            switch Int.random(in: 0..<10, using: &rng) {
            case 0: s = highest &+ UInt64.random(in: 1...3000, using: &rng)
            case 1: s = UInt64.random(in: 0...3, using: &rng)
            default: s = highest &+ 10 &- UInt64.random(in: 0...min(highest &+ 10, 1200), using: &rng)
            }
            let expected = s != 0 && !seen.contains(s) && (s > highest || highest - s < 1024)
            #expect(w.accept(s) == expected, "sequence \(s), highest \(highest)")
            if expected { seen.insert(s); highest = max(highest, s); accepted += 1 }
        }
        #expect(accepted > 10_000)
    }

    // MARK: TXT record

    @Test func txtRecordRoundTripsWithEscapedKeys() throws {
        let info = ["b": "2", "_a": "1", "a": "x=y=z", "__deep": "d", "_v": "not a version", "_d": "not a name", "empty": ""]
        let txt = TXTRecord.encode(peer: annKeyed, discoveryInfo: info)
        #expect(txt == ["_v=\(peerMeshProtocolVersion)", "_d=Ann", annKey, "___deep=d", "__a=1", "__d=not a name", "__v=not a version", "a=x=y=z", "b=2", "empty="])
        let decoded = try TXTRecord.decode(instanceName: annKeyed.identityString, txt: txt).get()
        #expect(decoded.0 == annKeyed)
        #expect(decoded.0.displayName == "Ann")
        #expect(decoded.0.publicKey == annKeyed.publicKey)
        #expect(decoded.1 == info)
        #expect(ServiceAdvertisement(peer: annKeyed, serviceType: "x", port: 1, discoveryInfo: info).txtRecord == txt)
    }

    /// Found by scripts/fuzz (txt): a `_k` of 64 UTF-8 bytes but fewer characters trapped in `PublicKey(hex:)`
    /// ("String index is out of bounds") — any record on the LAN could crash every browsing player.
    @Test func txtKeyOfMultibyteCharactersIsRefusedNotTrapped() {
        let id = "0123456789abcdef"
        let key = String(repeating: "é", count: 32)   // 64 bytes, 32 characters
        #expect(key.utf8.count == 64)
        guard case .failure(.badPublicKey) = TXTRecord.decode(instanceName: id, txt: ["_v=\(peerMeshProtocolVersion)", "_d=x", "_k=" + key]) else {
            Issue.record("a multibyte key was not refused")
            return
        }
        #expect(PublicKey(hex: key) == nil)
        #expect(PublicKey(hex: String(repeating: "+1", count: 32)) == nil, "no signs")
        #expect(PublicKey(hex: String(repeating: "aB", count: 31) + "2C")?.bytes == [UInt8](repeating: 0xab, count: 31) + [0x2c])
    }

    @Test("Only X25519's canonical key encodings are keys: the top bit set, or a value of 2²⁵⁵ − 19 or more, would let one secret key pass for several peers")
    func nonCanonicalKeysAreRefused() {
        let real = try! PeerIdentity.generate(displayName: "x").publicKey
        var topBit = real.bytes
        topBit[31] |= 0x80
        #expect(PublicKey(bytes: topBit) == nil)
        #expect(PublicKey(hex: PublicKey(bytes: real.bytes)!.hex) == real)
        #expect(PublicKey(hex: topBit.map { String(format: "%02x", $0) }.joined()) == nil)
        // 2²⁵⁵ − 19 (p itself) and 2²⁵⁵ − 1 are out; p − 1 is in.
        let p: [UInt8] = [0xed] + [UInt8](repeating: 0xff, count: 30) + [0x7f]
        #expect(PublicKey(bytes: p) == nil)
        #expect(PublicKey(bytes: [0xff] + [UInt8](repeating: 0xff, count: 30) + [0x7f]) == nil)
        #expect(PublicKey(bytes: [0xec] + [UInt8](repeating: 0xff, count: 30) + [0x7f]) != nil)
        // The top-bit twin of a real key, in a TXT record: the record is refused.
        let twin = "_k=" + topBit.map { String(format: "%02x", $0) }.joined()
        guard case .failure = TXTRecord.decode(instanceName: try! PeerID(displayName: "Ann", publicKey: real).identityString,
                                               txt: ["_v=\(peerMeshProtocolVersion)", "_d=Ann", twin]) else {
            Issue.record("a non-canonical _k was taken")
            return
        }
    }

    @Test func txtRecordDecodeFailures() {
        let id = annKeyed.identityString
        func err(_ name: String, _ txt: [String]) -> TXTRecord.DecodeError? {
            if case .failure(let e) = TXTRecord.decode(instanceName: name, txt: txt) { e } else { nil }
        }
        #expect(err(id, ["_d=Ann", annKey]) == .missingKey("_v"))
        #expect(err(id, ["_v=\(peerMeshProtocolVersion)", annKey]) == .missingKey("_d"))
        #expect(err(id, ["_v=\(peerMeshProtocolVersion - 1)", "_d=Ann", annKey]) == .unsupportedVersion("\(peerMeshProtocolVersion - 1)"), "an advertiser of the previous version is skipped")
        #expect(err(id, []) == .missingKey("_v"))
        #expect(err(id, ["_v=1", "_d=Ann", annKey]) == .unsupportedVersion("1"))
        #expect(err(id, ["_v", "_d=Ann", annKey]) == .unsupportedVersion(""))
        #expect(err(id, ["_v=\(peerMeshProtocolVersion)", "_d=", annKey]) == .badDisplayName(""))
        #expect(err(id, ["_v=\(peerMeshProtocolVersion)", "_d=" + String(repeating: "n", count: 64), annKey]) == .badDisplayName(String(repeating: "n", count: 64)))
        #expect(err(id, ["_v=\(peerMeshProtocolVersion)", "_d=" + String(repeating: "n", count: 63), annKey]) == nil)
        #expect(err(id, ["_v=\(peerMeshProtocolVersion)", "_d=Ann"]) == .missingKey("_k"))
        #expect(err(id, ["_v=\(peerMeshProtocolVersion)", "_d=Ann", "_k=00"]) == .badPublicKey("00"))
        // A record that names one identity with another key: refused (nobody can claim an identity without its key).
        let otherKey = "_k=" + PublicKey(bytes: Array(repeating: 9, count: 32))!.hex
        #expect(err(id, ["_v=\(peerMeshProtocolVersion)", "_d=Ann", otherKey]) == .badPublicKey(String(otherKey.dropFirst(3))))
        for bad in ["", "xyz", "0102030405060708a", "010203040506070", "000000000000000g", "0000000000000000",
                    "+00000000000000a", "-00000000000000a", " 00000000000000a"] {
            #expect(err(bad, ["_v=\(peerMeshProtocolVersion)", "_d=Ann", annKey]) == .badInstanceName(bad), "instance name \(bad)")
        }
        #expect(err(id.uppercased(), ["_v=\(peerMeshProtocolVersion)", "_d=Ann", annKey]) == nil) // upper-case hex is still hex
        #expect(TXTRecord.DecodeError.missingKey("_v").description.contains("_v"))
        #expect(TXTRecord.DecodeError.badDisplayName("").description.contains("1–63 UTF-8 bytes"))
        #expect(TXTRecord.DecodeError.unsupportedVersion("1").description.contains("version 1"))
        #expect(TXTRecord.DecodeError.badInstanceName("q").description.contains("16-hex-digit"))
    }

    @Test func txtRecordDecodeEdgeEntries() throws {
        let txt = ["_v=\(peerMeshProtocolVersion)", "_d=Ann=B", annKey, "=orphan", "flag", "_future=ignored", "k=first", "k=second", "__u=1", "__u=2", "_d=Other"]
        let (p, info) = try TXTRecord.decode(instanceName: annKeyed.identityString, txt: txt).get()
        #expect(p.displayName == "Ann=B")
        #expect(info == ["flag": "", "k": "first", "_u": "1"])
    }
}

private func name(_ e: ControlFrame.DecodeError) -> String {
    switch e {
    case .unknownType: "unknownType"
    case .truncated: "truncated"
    case .badMagic: "badMagic"
    case .unsupportedVersion: "unsupportedVersion"
    case .badField: "badField"
    case .trailingBytes: "trailingBytes"
    case .oversize: "oversize"
    }
}

private func outcome(_ r: DecodeResult) -> String {
    switch r {
    case .success: "ok"
    case .failure(let e): name(e)
    }
}

private func outcome(_ r: Result<DatagramHeader, DatagramHeader.DecodeError>) -> String {
    switch r {
    case .success: "ok"
    case .failure(.short): "short"
    case .failure(.badMagic): "badMagic"
    case .failure(.badVersion): "badVersion"
    case .failure(.badKind): "badKind"
    }
}

private func assemblerOutcome(_ stream: [UInt8], chunk: Int) -> String {
    let r = assemble(stream, chunk: chunk)
    if let e = r.error { return name(e) }
    return r.frames.isEmpty ? "waiting" : "frames"
}
