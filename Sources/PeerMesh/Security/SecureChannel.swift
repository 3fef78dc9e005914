/// How much a session insists on encryption, as MultipeerConnectivity's `MCEncryptionPreference`.
public enum EncryptionPreference: Sendable, Equatable, CustomStringConvertible {
    /// Every link is encrypted and mutually authenticated; a peer that cannot is refused. The default.
    case required
    /// Links this side opens are encrypted; a peer that offers only plaintext is still accepted. Such a peer proves
    /// nothing: its HELLO may claim any identity, a keyed peer's included, and it then stands for that peer (its
    /// `PeerID` compares equal) until it leaves. Check `PeerID.publicKey` (nil for it) before trusting a peer.
    case optional
    /// INSECURE: no encryption, no authentication — anyone on the network can listen, inject and impersonate.
    /// For tests and benchmarks only.
    case none

    public var description: String {
        switch self {
        case .required: "required"
        case .optional: "optional"
        case .none: "none (insecure)"
        }
    }
}

/// The security layer of one control connection, as a pure state machine: the clear preamble that negotiates
/// the mode, the Noise XX handshake that carries HELLO, then AEAD records that carry the frame stream.
///
/// ```
/// preamble  "PMSH" · version (4) · mode (1 Noise XX, 0 plaintext, 255 refused) · reason · 0      (8 bytes, clear)
/// handshake u16 length · Noise message (≤ 1024 bytes)                                              (clear framing)
///           message 1's payload: the initiator's commitment to a secret nonce; message 2's: the responder's
///           commitment to its own, then its HELLO; message 3's: the initiator's nonce, then its HELLO
/// record    u16 length · ChaCha20-Poly1305(frame-stream bytes) (≤ 65 535 bytes, nonce = per-direction counter)
///           the responder opens its nonce in a SAS-NONCE frame when its owner says (`revealNonce`)
/// ```
///
/// Bytes in, events out: `received` parses what arrived and returns what to write, the frames that arrived and
/// any fault. `send` turns a frame into bytes to write (held until the channel is established). The owner writes
/// and closes; the channel never touches a socket. HELLO is the handshake's payload in Noise mode: the channel
/// turns it into a `.hello` frame for the owner, so the frame stream looks the same in both modes.
struct SecureChannel: Sendable {
    enum Role: Sendable { case initiator, responder }

    /// The negotiated mode, carried in the preamble.
    enum Mode: UInt8, Sendable {
        case plaintext = 0
        case noiseXX = 1
    }

    /// Why a responder refused the initiator's mode (preamble mode 255).
    enum Refusal: UInt8, Sendable, CustomStringConvertible {
        case encryptionRequired = 1
        case encryptionUnsupported = 2
        /// The initiator's preamble carries another protocol version; the refusal carries the responder's, so an
        /// initiator of another version learns which one it met (it checks the version before the mode).
        case versionUnsupported = 3

        var description: String {
            switch self {
            case .encryptionRequired: "the peer requires encryption; this side offered none"
            case .encryptionUnsupported: "the peer does not accept encryption (its encryption preference is none)"
            case .versionUnsupported: "the peer speaks another protocol version"
            }
        }
    }

    /// Limits and who we are.
    struct Configuration: Sendable {
        var role: Role
        var preference: EncryptionPreference
        var localPeer: PeerID
        /// Largest handshake message accepted (everything before authentication is bounded by this).
        var maximumHandshakeMessage = 1_024
        /// Largest frame (type byte + body) in the frame stream.
        var maximumFrameLength = ControlFrame.maximumFrameLength
    }

    /// What `received`, `start`, `approve` and `send` ask of the owner.
    enum Event: Equatable, Sendable {
        /// Write these bytes.
        case write([UInt8])
        /// A frame arrived (in Noise mode, the peer's `.hello` comes from the handshake).
        case frame(ControlFrame)
        /// The initiator has identified the responder; call `approve()` to finish the handshake (after checking
        /// the key) or close.
        case needsApproval(PeerID)
        /// Initiator: the responder opened its nonce (its app showed the digits to a person, or let us in), so the
        /// short authentication string is known now: these digits.
        case shortAuthenticationString(String)
        /// The peer refused the mode we offered: close, and say why.
        case refused(String)
        /// The peer broke the protocol: close.
        case fault(PeerFault)
    }

    static let magic: [UInt8] = [0x50, 0x4d, 0x53, 0x48]
    static let preambleSize = 8
    static let refusedMode: UInt8 = 0xff
    /// Largest record: a u16 length of ciphertext.
    static let maximumRecord = 65_535
    static let maximumRecordPlaintext = maximumRecord - Sodium.tagSize

    /// The 8-byte preamble for `mode` (or a refusal).
    static func preamble(_ mode: UInt8, reason: UInt8 = 0) -> [UInt8] { magic + [peerMeshProtocolVersion, mode, reason, 0] }

    /// The initiator's side of the Noise handshake: the handshake, and the nonce it committed to in message 1 and
    /// opens in message 3 (the short authentication string depends on it).
    private struct InitiatorHandshake: Sendable {
        var noise: Noise.XXHandshake
        let nonce: [UInt8]
    }

    /// The initiator's side after message 2: the handshake, its own nonce, and what the responder's message 2 fixed —
    /// the handshake hash and the responder's commitment to its nonce.
    private struct InitiatorAwaitingApproval: Sendable {
        var handshake: InitiatorHandshake
        let hashAfterMessage2: [UInt8]
        let responderCommitment: [UInt8]
    }

    /// The responder's side after message 2: the handshake, the initiator's commitment from message 1, the
    /// handshake hash after message 2 (what the short authentication string is taken over, with both nonces), and
    /// the responder's own nonce, committed to in message 2.
    private struct ResponderHandshake: Sendable {
        var noise: Noise.XXHandshake
        let commitment: [UInt8]
        let hashAfterMessage2: [UInt8]
        let nonce: [UInt8]
    }

    /// Where the short authentication string stands once the handshake is over.
    private enum Digits: Sendable {
        /// Initiator: waiting for the responder to open the nonce it committed to in message 2.
        case awaitingResponderNonce(hashAfterMessage2: [UInt8], ownNonce: [UInt8], responderCommitment: [UInt8])
        /// Responder: the digits are known here; the nonce that gives them to the initiator is not yet sent.
        case unrevealed(nonce: [UInt8])
        /// Both sides can have them: the nonce was sent (responder) or received and checked (initiator).
        case settled
    }

    private struct Transport: Sendable {
        var send: Noise.CipherState
        var receive: Noise.CipherState
        let datagramSend: SecretKey
        let datagramReceive: SecretKey
        let handshakeHash: [UInt8]
        var digits: Digits
    }

    private enum State: Sendable {
        /// Initiator before `start()`.
        case idle
        /// Initiator: preamble (and message 1) sent; waiting for the responder's preamble.
        case awaitingPreamble(InitiatorHandshake?)
        /// Initiator: waiting for message 2.
        case awaitingMessage2(InitiatorHandshake)
        /// Initiator: message 2 read; the owner decides whether to trust the responder.
        case awaitingApproval(InitiatorAwaitingApproval, hello: ControlFrame)
        /// Responder: waiting for the initiator's preamble.
        case awaitingInitiatorPreamble
        /// Responder: waiting for message 1.
        case awaitingMessage1(Noise.XXHandshake)
        /// Responder: message 2 sent; waiting for message 3.
        case awaitingMessage3(ResponderHandshake)
        /// Noise done: records both ways.
        case established(Transport)
        /// Plaintext: the frame stream as is.
        case plaintext
        /// Refused, faulted or exhausted: nothing more.
        case closed
    }

    private let config: Configuration
    private var state: State
    private var inbound: [UInt8] = []
    private var assembler: FrameAssembler
    /// Frames the owner sent before the channel could carry them.
    private var held: [ControlFrame] = []

    init(configuration: Configuration) {
        config = configuration
        state = configuration.role == .initiator ? .idle : .awaitingInitiatorPreamble
        assembler = FrameAssembler(maximumFrameLength: configuration.maximumFrameLength)
    }

    // MARK: Queries

    /// Whether frames now go out encrypted and authenticated.
    var isEncrypted: Bool { if case .established = state { true } else { false } }

    /// Whether the link runs in plaintext (the modes agreed on none): nothing on it is proved.
    var isPlaintext: Bool { if case .plaintext = state { true } else { false } }

    /// Whether `send` writes at once (rather than holding the frame).
    var isOpen: Bool {
        switch state {
        case .established, .plaintext: true
        default: false
        }
    }

    /// Keys for the link's datagrams (ours to seal with, the peer's to open with); nil in plaintext.
    var datagramKeys: (send: SecretKey, receive: SecretKey)? {
        if case .established(let t) = state { (t.datagramSend, t.datagramReceive) } else { nil }
    }

    /// The short authentication string both sides can compare (six digits, `123 456`), from the handshake hash
    /// after message 2 and two nonces, each committed to before the other side's was seen: the initiator's
    /// (committed in message 1, opened in message 3) and the responder's (committed in message 2, opened in a
    /// SAS-NONCE frame when the owner calls `revealNonce`). The responder knows the digits once message 3 has come;
    /// the initiator once the SAS-NONCE frame has (`.shortAuthenticationString`). A man in the middle cannot choose
    /// what either end shows, and learns what the responder shows only once the responder opens its nonce: the
    /// advertiser does so when its app shows the digits to a person or lets the caller in, so every guess costs a prompt
    /// (docs/PROTOCOL.md §3.2). Nil in plaintext or before then.
    private(set) var shortAuthenticationString: String?

    /// A value unique to this handshake that both ends share (like a TLS exporter): apps bind their own proofs
    /// to the channel with it (the pairing code's PAKE does). Nil in plaintext.
    var channelBinding: [UInt8]? {
        guard case .established(let t) = state else { return nil }
        return Sodium.sha256([Array("PeerMesh v2 channel binding".utf8), t.handshakeHash])
    }

    /// The short authentication string of a handshake: `SHA-256("PeerMesh v4 SAS" ‖ h ‖ nᵢ ‖ nᵣ)`, where `h` is the
    /// handshake hash after message 2 and `nᵢ`, `nᵣ` the initiator's and the responder's opened nonces; its first four
    /// bytes, big-endian, mod 10⁶, as `123 456`.
    static func sas(hashAfterMessage2 handshakeHash: [UInt8], initiatorNonce: [UInt8], responderNonce: [UInt8]) -> String {
        let d = Sodium.sha256([Array("PeerMesh v4 SAS".utf8), handshakeHash, initiatorNonce, responderNonce])
        let n = (UInt32(d[0]) << 24 | UInt32(d[1]) << 16 | UInt32(d[2]) << 8 | UInt32(d[3])) % 1_000_000
        let s = String(n)
        let padded = String(repeating: "0", count: 6 - s.count) + s
        return String(padded.prefix(3)) + " " + String(padded.suffix(3))
    }

    /// Bytes of each side's nonce, and of a commitment to one.
    static let nonceSize = 32

    /// The commitment `role` sends (message 1: the initiator's; message 2: the responder's):
    /// `SHA-256("PeerMesh v4 SAS commitment" ‖ role ‖ nonce)`, role 1 for the initiator and 2 for the responder (32
    /// bytes). The nonce is 32 random bytes, so the commitment hides it; SHA-256 binds its sender to it. The role
    /// byte keeps one side's commitment from being replayed as the other's.
    static func commitment(to nonce: [UInt8], by role: Role) -> [UInt8] {
        Sodium.sha256([Array("PeerMesh v4 SAS commitment".utf8), [role == .initiator ? 1 : 2], nonce])
    }

    /// The mode the initiator offers for a preference.
    private var offeredMode: Mode { config.preference == .none ? .plaintext : .noiseXX }

    // MARK: Events

    /// Initiator: the first bytes to send (preamble, and message 1 in Noise mode).
    mutating func start() -> [Event] {
        guard config.role == .initiator, case .idle = state else { return [] }
        let pre = Self.preamble(offeredMode.rawValue)
        if offeredMode == .plaintext {
            state = .awaitingPreamble(nil)
            return [.write(pre)]
        }
        guard let keys = config.localPeer.keys else {
            state = .closed
            return [.refused("this peer has no key pair; make it with PeerID(displayName:) or PeerIdentity")]
        }
        var hs = InitiatorHandshake(noise: Noise.XXHandshake(role: .initiator, localStatic: keys, prologue: pre),
                                    nonce: Sodium.randomBytes(Self.nonceSize))
        // writeMessage1 cannot fail on a fresh initiator.
        let m1 = try! hs.noise.writeMessage1(payload: Self.commitment(to: hs.nonce, by: .initiator))
        state = .awaitingPreamble(hs)
        return [.write(pre + Self.lengthPrefixed(m1))]
    }

    /// Bytes arrived from the peer.
    mutating func received(_ bytes: UnsafeRawBufferPointer) -> [Event] {
        guard !isClosed else { return [] }
        switch state {
        case .plaintext:
            assembler.append(bytes)
            return drainFrames()
        default:
            inbound.append(contentsOf: bytes)
            let events = process()
            // Until the handshake is over a peer has at most a preamble and one handshake message in flight, and a
            // responder sends nothing at all after message 2 until it reads message 3. More left over is a flood
            // (say, while our app takes its time over the responder's key), not a peer waiting its turn.
            if isHandshaking, inbound.count > Self.preambleSize + 2 * (2 + config.maximumHandshakeMessage) {
                return events + fail(.handshake("\(inbound.count) bytes sent before the handshake finished"))
            }
            return events
        }
    }

    /// Initiator, encrypted: whether the responder has yet to open its nonce.
    private var isAwaitingResponderNonce: Bool {
        guard case .established(let t) = state, case .awaitingResponderNonce = t.digits else { return false }
        return true
    }

    /// Whether the preamble or the Noise handshake is still under way (neither records nor plaintext frames yet).
    private var isHandshaking: Bool {
        switch state {
        case .awaitingPreamble, .awaitingMessage2, .awaitingApproval, .awaitingInitiatorPreamble, .awaitingMessage1,
             .awaitingMessage3: true
        case .idle, .established, .plaintext, .closed: false
        }
    }

    /// Initiator: the owner trusts the responder; finish the handshake and send what was held.
    mutating func approve() -> [Event] {
        guard case .awaitingApproval(var a, _) = state else { return [] }
        let hello = ControlFrame.hello(peer: config.localPeer).encoded()
        let (m3, result): ([UInt8], Noise.Result)
        do { (m3, result) = try a.handshake.noise.writeMessage3(payload: a.handshake.nonce + hello.dropFirst(4)) } catch {
            state = .closed
            return [.fault(.handshake(error.description))]
        }
        let digits = Digits.awaitingResponderNonce(hashAfterMessage2: a.hashAfterMessage2, ownNonce: a.handshake.nonce,
                                                   responderCommitment: a.responderCommitment)
        state = .established(Transport(send: result.send, receive: result.receive, datagramSend: result.datagramSend,
                                       datagramReceive: result.datagramReceive, handshakeHash: result.handshakeHash,
                                       digits: digits))
        var out = Self.lengthPrefixed(m3)
        out += sealHeld()
        var events: [Event] = [.write(out)]
        // Records that arrived right behind message 2 (none are expected before message 3, but be exact).
        events += process()
        return events
    }

    /// A frame to send: the bytes to write now (empty while held). In Noise mode `.hello` is the handshake's job
    /// and is not sent as a frame.
    mutating func send(_ frame: ControlFrame) -> [UInt8] {
        switch state {
        case .plaintext: return frame.encoded()
        case .established:
            if case .hello = frame { return [] }
            return seal(frame.encoded())
        case .closed: return []
        default:
            held.append(frame)
            return []
        }
    }

    /// Responder: the bytes that open our nonce to the initiator (a sealed SAS-NONCE frame), so that it can show the
    /// digits too. Call it when a person is shown the digits, or the invitation is accepted, not before: until then
    /// a man in the middle cannot tell which digits this side shows. Once; empty after that, in plaintext, or before
    /// message 3.
    mutating func revealNonce() -> [UInt8] {
        guard case .established(var t) = state, case .unrevealed(let nonce) = t.digits else { return [] }
        t.digits = .settled
        state = .established(t)
        return seal(ControlFrame.sasNonce(nonce).encoded())
    }

    /// Raises the frame limit (after an invitation is accepted, the session's own limit applies).
    mutating func setMaximumFrameLength(_ n: Int) { assembler.maximumFrameLength = n }

    // MARK: Parsing

    private var isClosed: Bool { if case .closed = state { true } else { false } }

    private mutating func fail(_ fault: PeerFault) -> [Event] {
        state = .closed
        inbound = []
        held = []
        return [.fault(fault)]
    }

    /// Takes one u16-length-prefixed message off `inbound`, if whole (`nil`: wait for more bytes). `limit` bounds
    /// the length.
    private mutating func takeMessage(limit: Int) throws(PeerFault) -> [UInt8]? {
        guard inbound.count >= 2 else { return nil }
        let n = Int(inbound[0]) << 8 | Int(inbound[1])
        guard n >= 1, n <= limit else { throw .malformedFrame("message length \(n) outside 1…\(limit)") }
        guard inbound.count >= 2 + n else { return nil }
        let m = Array(inbound[2..<(2 + n)])
        inbound.removeFirst(2 + n)
        return m
    }

    /// Takes the preamble off `inbound`, if whole (`nil`: wait for more bytes).
    private mutating func takePreamble() throws(PeerFault) -> [UInt8]? {
        guard inbound.count >= Self.preambleSize else {
            // Fail early on bytes that cannot become a preamble (another protocol).
            if !zip(inbound, Self.magic).allSatisfy(==) { throw .malformedFrame("not a PeerMesh peer (bad magic)") }
            return nil
        }
        let p = Array(inbound[0..<Self.preambleSize])
        inbound.removeFirst(Self.preambleSize)
        guard Array(p[0..<4]) == Self.magic else { throw .malformedFrame("not a PeerMesh peer (bad magic)") }
        return p
    }

    /// The fault of a preamble of another protocol version.
    private static func otherVersion(_ preamble: [UInt8]) -> PeerFault? {
        preamble[4] == peerMeshProtocolVersion ? nil
            : .malformedFrame("protocol version \(preamble[4]); this build speaks \(peerMeshProtocolVersion)")
    }

    /// Runs the inbound state machine over `inbound` until it needs more bytes; a peer fault closes the channel.
    private mutating func process() -> [Event] {
        var events: [Event] = []
        do {
            while try step(&events) {}
        } catch {
            events += fail(error)
        }
        return events
    }

    /// One step of the handshake (or the delivery of everything buffered, once it is over). Appends its events;
    /// returns whether another step can run now.
    private mutating func step(_ events: inout [Event]) throws(PeerFault) -> Bool {
        switch state {
        case .idle, .closed, .awaitingApproval:
            return false
        case .plaintext:
            assembler.append(inbound)
            inbound = []
            events += drainFrames()
            return false
        case .established:
            events += openRecords()
            return false
        case .awaitingPreamble(let hs):
            guard let pre = try takePreamble() else { return false }
            if let fault = Self.otherVersion(pre) { throw fault }
            if pre[5] == Self.refusedMode {
                state = .closed
                let why = Refusal(rawValue: pre[6])?.description ?? "the peer refused the connection"
                events.append(.refused(why))
                return false
            }
            // A responder must answer in the mode offered: anything else is a downgrade (or a broken peer).
            guard pre[5] == offeredMode.rawValue else { throw .downgrade }
            if let hs { state = .awaitingMessage2(hs) } else {
                state = .plaintext
                events += flushHeldPlaintext()
            }
        case .awaitingMessage2(var hs):
            guard let m = try takeMessage(limit: config.maximumHandshakeMessage) else { return false }
            let (remoteStatic, payload) = try Self.handshakeStep { () throws(Noise.Failure) in try hs.noise.readMessage2(m) }
            guard payload.count > Self.nonceSize else {
                throw .handshake("message 2 carries \(payload.count) bytes, not a \(Self.nonceSize)-byte commitment and a HELLO")
            }
            let hello = try Self.handshakeStep { () throws(Noise.Failure) in
                try helloFrame(Array(payload.dropFirst(Self.nonceSize)), remoteStatic: remoteStatic)
            }
            guard case .hello(let peer) = hello else { throw .handshake("bad HELLO") }
            state = .awaitingApproval(InitiatorAwaitingApproval(handshake: hs, hashAfterMessage2: hs.noise.hash,
                                                                responderCommitment: Array(payload.prefix(Self.nonceSize))),
                                      hello: hello)
            events += [.frame(hello), .needsApproval(peer)]
            return false
        case .awaitingInitiatorPreamble:
            guard let pre = try takePreamble() else { return false }
            if let fault = Self.otherVersion(pre) {
                // Answer with our own version before closing, so that the initiator can say which one it met.
                state = .closed
                events += [.write(Self.preamble(Self.refusedMode, reason: Refusal.versionUnsupported.rawValue)),
                           .fault(fault)]
                return false
            }
            guard let mode = Mode(rawValue: pre[5]) else { throw .malformedFrame("unknown mode \(pre[5])") }
            switch (mode, config.preference) {
            case (.plaintext, .required):
                state = .closed
                events += [.write(Self.preamble(Self.refusedMode, reason: Refusal.encryptionRequired.rawValue)),
                           .fault(.downgrade)]
                return false
            case (.noiseXX, .none):
                state = .closed
                events += [.write(Self.preamble(Self.refusedMode, reason: Refusal.encryptionUnsupported.rawValue)),
                           .refused(Refusal.encryptionUnsupported.description)]
                return false
            case (.plaintext, _):
                state = .plaintext
                events.append(.write(Self.preamble(Mode.plaintext.rawValue)))
                events += flushHeldPlaintext()
            case (.noiseXX, _):
                guard let keys = config.localPeer.keys else {
                    state = .closed
                    events.append(.refused("this peer has no key pair"))
                    return false
                }
                state = .awaitingMessage1(Noise.XXHandshake(role: .responder, localStatic: keys, prologue: pre))
                events.append(.write(Self.preamble(Mode.noiseXX.rawValue)))
            }
        case .awaitingMessage1(var hs):
            guard let m = try takeMessage(limit: config.maximumHandshakeMessage) else { return false }
            let commitment = try Self.handshakeStep { () throws(Noise.Failure) in try hs.readMessage1(m) }
            guard commitment.count == Self.nonceSize else {
                throw .handshake("message 1 carries \(commitment.count) bytes, not a \(Self.nonceSize)-byte commitment")
            }
            let nonce = Sodium.randomBytes(Self.nonceSize)
            let hello = ControlFrame.hello(peer: config.localPeer).encoded()
            let m2 = try Self.handshakeStep { () throws(Noise.Failure) in
                try hs.writeMessage2(payload: Self.commitment(to: nonce, by: .responder) + hello.dropFirst(4))
            }
            state = .awaitingMessage3(ResponderHandshake(noise: hs, commitment: commitment, hashAfterMessage2: hs.hash,
                                                         nonce: nonce))
            events.append(.write(Self.lengthPrefixed(m2)))
        case .awaitingMessage3(var hs):
            guard let m = try takeMessage(limit: config.maximumHandshakeMessage) else { return false }
            let (payload, result) = try Self.handshakeStep { () throws(Noise.Failure) in try hs.noise.readMessage3(m) }
            guard payload.count > Self.nonceSize else {
                throw .handshake("message 3 carries \(payload.count) bytes, not a \(Self.nonceSize)-byte nonce and a HELLO")
            }
            let nonce = Array(payload.prefix(Self.nonceSize))
            let hello = try Self.handshakeStep { () throws(Noise.Failure) in
                try helloFrame(Array(payload.dropFirst(Self.nonceSize)), remoteStatic: result.remoteStatic)
            }
            // Message 3 authenticated, so it is the initiator's: a nonce that does not open its commitment is that
            // initiator lying about the digits (a man in the middle that searched for a match), not a damaged byte.
            guard Self.commitment(to: nonce, by: .initiator) == hs.commitment else {
                throw .handshake("message 3's nonce does not open message 1's commitment")
            }
            shortAuthenticationString = Self.sas(hashAfterMessage2: hs.hashAfterMessage2, initiatorNonce: nonce,
                                                 responderNonce: hs.nonce)
            state = .established(Transport(send: result.send, receive: result.receive, datagramSend: result.datagramSend,
                                           datagramReceive: result.datagramReceive, handshakeHash: result.handshakeHash,
                                           digits: .unrevealed(nonce: hs.nonce)))
            events.append(.frame(hello))
            let sealed = sealHeld()
            if !sealed.isEmpty { events.append(.write(sealed)) }
        }
        return true
    }

    /// Runs one Noise operation, turning its failure into the peer fault it is.
    private static func handshakeStep<T>(_ body: () throws(Noise.Failure) -> T) throws(PeerFault) -> T {
        do { return try body() } catch { throw .handshake(error.description) }
    }

    /// The peer's HELLO from a handshake payload: its name, and the identity its proven key gives.
    private func helloFrame(_ payload: [UInt8], remoteStatic: [UInt8]) throws(Noise.Failure) -> ControlFrame {
        guard payload.count <= 255 else { throw .badLength(payload.count) }
        guard let key = PublicKey(bytes: remoteStatic) else { throw .badPublicKey }
        let r = payload.withUnsafeBytes { ControlFrame.decode(body: UnsafeRawBufferPointer($0)) }
        guard case .success(.hello(let claimed)) = r, claimed.identity == key.identity,
              let peer = try? PeerID(displayName: claimed.displayName, publicKey: key)
        else { throw .decryptFailed }
        return .hello(peer: peer)
    }

    private mutating func drainFrames() -> [Event] {
        var events: [Event] = []
        while let r = assembler.next() {
            switch r {
            case .success(.hello) where isEncrypted:
                return events + fail(.unexpectedFrame("HELLO inside the encrypted channel"))
            case .success(.accept) where isAwaitingResponderNonce:
                // A responder opens its nonce before it accepts (in the same write). Accepted without it, the link
                // would come up with no digits for our app to show, and a man in the middle could have its silent
                // guesses forgiven (`InviterShareRation`).
                return events + fail(.unexpectedFrame("ACCEPT before SAS-NONCE"))
            case .success(.sasNonce(let nonce)):
                // Only an initiator waiting for it takes one, once: anything else is a peer out of turn.
                guard case .established(var t) = state,
                      case .awaitingResponderNonce(let h2, let own, let commitment) = t.digits else {
                    return events + fail(.unexpectedFrame("SAS-NONCE"))
                }
                // Sealed under the channel's keys, so it is the responder's own: a nonce that does not open its
                // commitment is that responder lying about the digits, not a damaged byte.
                guard Self.commitment(to: nonce, by: .responder) == commitment else {
                    return events + fail(.handshake("SAS-NONCE does not open message 2's commitment"))
                }
                t.digits = .settled
                state = .established(t)
                let digits = Self.sas(hashAfterMessage2: h2, initiatorNonce: own, responderNonce: nonce)
                shortAuthenticationString = digits
                events.append(.shortAuthenticationString(digits))
            case .success(let f): events.append(.frame(f))
            case .failure(let e): return events + fail(.malformedFrame(e))
            }
        }
        return events
    }

    private mutating func openRecords() -> [Event] {
        var events: [Event] = []
        // Records are consumed through `start` and the buffer compacted once at the end: a read full of tiny
        // records costs one move of what is left, not one per record (quadratic in the read's size).
        var start = 0
        defer { inbound.removeFirst(min(start, inbound.count)) }
        while case .established(var t) = state {
            guard inbound.count - start >= 2 else { break }
            let n = Int(inbound[start]) << 8 | Int(inbound[start + 1])
            guard n >= Sodium.tagSize + 1 else { return events + fail(.malformedFrame("record of \(n) bytes")) }
            guard inbound.count - start >= 2 + n else { break }
            let record = Array(inbound[(start + 2)..<(start + 2 + n)])
            start += 2 + n
            guard let plain = try? t.receive.decrypt(ad: [], record) else {
                return events + fail(.unauthentic)
            }
            state = .established(t)
            assembler.append(plain)
            events += drainFrames()
        }
        return events
    }

    /// Seals frame-stream bytes as records (internal for tests that play a peer sealing what it should not).
    mutating func seal(_ plaintext: [UInt8]) -> [UInt8] {
        guard case .established(var t) = state else { return [] }
        var out: [UInt8] = []
        var offset = 0
        while offset < plaintext.count {
            let end = min(plaintext.count, offset + Self.maximumRecordPlaintext)
            guard !t.send.isExhausted else {
                state = .closed
                return out
            }
            let c = t.send.encrypt(ad: [], Array(plaintext[offset..<end]))
            out.append(UInt8(c.count >> 8))
            out.append(UInt8(c.count & 0xff))
            out += c
            offset = end
        }
        state = .established(t)
        return out
    }

    private mutating func sealHeld() -> [UInt8] {
        let frames = held
        held = []
        var out: [UInt8] = []
        for f in frames {
            if case .hello = f { continue }
            out += seal(f.encoded())
        }
        return out
    }

    private mutating func flushHeldPlaintext() -> [Event] {
        let frames = held
        held = []
        let bytes = frames.flatMap { $0.encoded() }
        return bytes.isEmpty ? [] : [.write(bytes)]
    }

    private static func lengthPrefixed(_ m: [UInt8]) -> [UInt8] { [UInt8(m.count >> 8), UInt8(m.count & 0xff)] + m }
}

extension FrameAssembler {
    mutating func append(_ bytes: [UInt8]) { bytes.withUnsafeBytes { append($0) } }
}
