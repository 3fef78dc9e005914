// mesh-bench: measurements for scripts/bench that need the library in-process. Prints one JSON object on stdout.
//
//   mesh-bench throughput [--seconds S] [--rounds R] [--payload BYTES]
//       PeerMesh unreliable send → receive between two sessions on 127.0.0.1, against a raw UDP pair with the same
//       thread layout (one sender thread, one receiver thread, same socket buffer sizes as PeerMesh's 1 MiB),
//       alternating raw / mesh for R rounds of S seconds each, in the same run.
//   mesh-bench serve --port PORT [--plaintext]
//       A RelayHost serving a tone to every player; with --plaintext, unencrypted (the baseline of what encryption
//       costs the host). Runs until SIGINT/SIGTERM.
//   mesh-bench fanout --connect HOST:PORT --players N [--seconds S] [--latency auto|low|MS] [--host-pid PID] [--plaintext]
//       N RelayPlayer objects in this one process, each with its own Session (own UDP socket and I/O thread) and a
//       null sink paced by CLOCK_MONOTONIC (one thread per player, pulls 128 frames per period like the ALSA
//       Player). Joins the host directly (no DNS-SD), plays S seconds, prints per-player loss, and with --host-pid
//       the host process's CPU seconds over the same window.
//   mesh-bench resource-receiver --dir DIR [--port PORT]
//   mesh-bench resource --connect HOST:PORT --file PATH [--rounds R]
//       Resource transfer (Session.sendResource, encrypted) between two processes on 127.0.0.1, as between two
//       hosts: each process has its own I/O thread. The receiver writes into DIR; the sender times each round from
//       the call to the completion handler (file written on the other side, SHA-256 verified).
//   mesh-bench meshjoin [--members N] [--runs R]
//       N encrypted full-mesh sessions in this process (member i on 127.0.0.(i+1)) join the first, one at a time and
//       all at once: the time until every member's connectedPeers lists all N-1 others.
import Foundation
import MeshAudio
import MeshCLI
import MeshPipeline
import MeshPOSIX
import MeshRelay
import PeerMesh
import Synchronization

let options = BenchOptions.configurationFromCommandLine()
let terminal = Terminal(program: BenchOptions.program, quiet: false)

func fail(_ text: String) -> Never { terminal.fail(text) }

func emit(_ object: JSONObject) { terminal.stdout(object.description) }

func now() -> UInt64 { MonotonicClock.nowNanos() }

/// A counter shared between a worker thread and the main thread.
final class Counter: Sendable {
    let value = Atomic<UInt64>(0)
    func add(_ n: UInt64) { value.wrappingAdd(n, ordering: .relaxed) }
    var current: UInt64 { value.load(ordering: .relaxed) }
}

/// A flag shared between threads.
final class Flag: Sendable {
    let value = Atomic<Bool>(false)
    func set(_ v: Bool) { value.store(v, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}

/// Runs `body` on a new thread; the returned semaphore is signalled when it returns.
func spawn(_ name: String, _ body: @escaping @Sendable () -> Void) -> DispatchSemaphore {
    let done = DispatchSemaphore(value: 0)
    let t = Thread {
        body()
        done.signal()
    }
    t.name = name
    t.start()
    return done
}

// MARK: - Throughput

/// A raw UDP socket bound to 127.0.0.1 with PeerMesh's buffer sizes.
func rawSocket() -> (fd: Int32, port: UInt16) {
    let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
    guard fd >= 0 else { fail("socket: \(String(cString: strerror(errno)))") }
    var size: Int32 = 1 << 20
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
    var tv = timeval(tv_sec: 0, tv_usec: 100_000)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = 0
    let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard rc == 0 else { fail("bind: \(String(cString: strerror(errno)))") }
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
    return (fd, UInt16(bigEndian: addr.sin_port))
}

struct RoundResult {
    var sent: UInt64
    var received: UInt64
    var seconds: Double
}

/// One raw round: a sender thread blasting `payload`-byte datagrams for `seconds`, a receiver thread counting.
func rawRound(seconds: Double, payload: Int) -> RoundResult {
    let rx = rawSocket(), tx = rawSocket()
    defer { close(rx.fd); close(tx.fd) }
    let received = Counter(), sent = Counter(), stop = Flag()
    let rxfd = rx.fd, txfd = tx.fd, port = rx.port
    let receiver = spawn("raw.rx") {
        let buf = UnsafeMutableRawPointer.allocate(byteCount: 2048, alignment: 8)
        defer { buf.deallocate() }
        var n: UInt64 = 0
        while !stop.isSet {
            if recv(rxfd, buf, 2048, 0) > 0 { n += 1; if n & 255 == 0 { received.add(256); n = 0 } }
        }
        received.add(n)
    }
    let start = now()
    let sender = spawn("raw.tx") {
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = port.bigEndian
        let buf = UnsafeMutableRawPointer.allocate(byteCount: payload, alignment: 8)
        defer { buf.deallocate() }
        memset(buf, 0x5A, payload)
        let deadline = start + UInt64(seconds * 1e9)
        var n: UInt64 = 0
        while true {
            if n & 63 == 0, now() >= deadline { break }
            let r = withUnsafePointer(to: &addr) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(txfd, buf, payload, Int32(MSG_NOSIGNAL), $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            if r > 0 { n += 1 }
        }
        sent.add(n)
    }
    sender.wait()
    let elapsed = Double(now() - start) / 1e9
    usleep(150_000)  // let the receiver drain its socket buffer
    stop.set(true)
    receiver.wait()
    return RoundResult(sent: sent.current, received: received.current, seconds: elapsed)
}

/// The receiving side of the PeerMesh pair: accepts the invitation and counts datagrams.
final class MeshReceiver: SessionDelegate, NearbyServiceAdvertiserDelegate, Sendable {
    let session: Session
    let received = Counter()
    let connected = Flag()
    init(session: Session) { self.session = session }
    func session(_ session: Session, peer: PeerID, didChange state: SessionState) { if state == .connected { connected.set(true) } }
    // The zero-copy form, as the raw receiver reads into a reused buffer.
    func session(_ session: Session, didReceiveDatagramBytes bytes: UnsafeRawBufferPointer, fromPeer peer: PeerID) { received.add(1) }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID, withContext context: Data?,
                    invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        invitationHandler(true, session)
    }
}

/// The sending side: learns the connected peer.
final class MeshSender: SessionDelegate, Sendable {
    let peer = Mutex<PeerID?>(nil)
    func session(_ session: Session, peer p: PeerID, didChange state: SessionState) {
        if state == .connected { peer.withLock { $0 = p } }
    }
}

func throughput() {
    let seconds = options.seconds, rounds = options.rounds, payload = options.payload

    /// A PeerMesh pair, connected once and reused by every round. A long peer timeout: a saturated receiver must
    /// not time the sender out in the middle of a round.
    struct MeshPair {
        let rx: Session, tx: Session, advertiser: NearbyServiceAdvertiser, receiver: MeshReceiver, target: PeerID
    }
    func makePair(_ preference: EncryptionPreference) -> MeshPair {
        let sender = MeshSender()
        do {
            let config = Session.Configuration(peerTimeout: .seconds(30), bindHost: "127.0.0.1")
            let rx = try Session(peer: try PeerID(displayName: "bench-rx"), encryptionPreference: preference, configuration: config)
            let tx = try Session(peer: try PeerID(displayName: "bench-tx"), encryptionPreference: preference, configuration: config)
            let receiver = MeshReceiver(session: rx)
            rx.delegate = receiver
            tx.delegate = sender
            let advertiser = try NearbyServiceAdvertiser(peer: rx.myPeerID, discoveryInfo: nil, serviceType: "mesh-bench",
                                                         discovery: InProcessDiscovery(), bindHost: "127.0.0.1",
                                                         encryptionPreference: preference)
            advertiser.delegate = receiver
            try advertiser.startAdvertisingPeer()
            guard let port = advertiser.port else { fail("advertiser has no port") }
            try tx.connect(to: PeerEndpoint(host: "127.0.0.1", port: port), timeout: .seconds(5))
            let deadline = now() + 5_000_000_000
            while sender.peer.withLock({ $0 }) == nil || !receiver.connected.isSet {
                if now() > deadline { fail("the PeerMesh pair (\(preference)) did not connect within 5 s") }
                usleep(2_000)
            }
            return MeshPair(rx: rx, tx: tx, advertiser: advertiser, receiver: receiver, target: sender.peer.withLock { $0 }!)
        } catch {
            fail("cannot set up the PeerMesh pair: \(error)")
        }
    }
    let encrypted = makePair(.required), plaintext = makePair(.none)

    func meshRound(_ pair: MeshPair) -> RoundResult {
        let receiver = pair.receiver, target = pair.target
        let before = receiver.received.current
        let sent = Counter()
        let start = now()
        let tx = pair.tx
        let done = spawn("mesh.tx") {
            let buf = UnsafeMutableRawBufferPointer.allocate(byteCount: payload, alignment: 8)
            defer { buf.deallocate() }
            buf.initializeMemory(as: UInt8.self, repeating: 0x5A)
            let deadline = start + UInt64(seconds * 1e9)
            let peers = [target]
            var n: UInt64 = 0
            while true {
                if n & 63 == 0, now() >= deadline { break }
                if (try? tx.sendDatagram(UnsafeRawBufferPointer(buf), toPeers: peers)) != nil { n += 1 }
            }
            sent.add(n)
        }
        done.wait()
        let elapsed = Double(now() - start) / 1e9
        usleep(150_000)
        return RoundResult(sent: sent.current, received: receiver.received.current - before, seconds: elapsed)
    }

    var raw: [RoundResult] = [], mesh: [RoundResult] = [], plain: [RoundResult] = []
    for r in 0..<rounds {
        // Rotate which goes first, so none always runs on a warmer machine.
        let order: [Int] = [[0, 1, 2], [1, 2, 0], [2, 0, 1]][r % 3]
        for which in order {
            switch which {
            case 0: raw.append(rawRound(seconds: seconds, payload: payload))
            case 1: mesh.append(meshRound(encrypted))
            default: plain.append(meshRound(plaintext))
            }
        }
    }
    let stats = encrypted.rx.statistics
    for p in [encrypted, plaintext] {
        p.advertiser.stopAdvertisingPeer()
        p.tx.disconnect()
    }

    func rate(_ rs: [RoundResult]) -> Double { rs.map { Double($0.received) / $0.seconds }.sorted()[rs.count / 2] }
    func summary(_ rs: [RoundResult]) -> JSONObject {
        let sentRates = rs.map { Double($0.sent) / $0.seconds }.sorted()
        let sent = rs.reduce(0) { $0 + $1.sent }, recv = rs.reduce(0) { $0 + $1.received }
        var o = JSONObject()
        o.add("receivedPerSecond", rate(rs))
        o.add("sentPerSecond", sentRates[sentRates.count / 2])
        o.add("sent", sent)
        o.add("received", recv)
        o.add("deliveredFraction", sent > 0 ? Double(recv) / Double(sent) : 0)
        return o
    }
    var o = JSONObject()
    o.add("mode", "throughput")
    o.add("payloadBytes", payload)
    o.add("secondsPerRound", seconds)
    o.add("rounds", rounds)
    o.add("raw", summary(raw))
    o.add("mesh", summary(mesh))
    o.add("meshPlaintext", summary(plain))
    o.add("ratio", rate(mesh) / max(1, rate(raw)))
    o.add("plaintextRatio", rate(plain) / max(1, rate(raw)))
    var rx = JSONObject()
    rx.add("datagramsReceived", stats.datagramsReceived)
    rx.add("malformed", stats.malformedDatagrams)
    rx.add("duplicates", stats.duplicateDatagrams)
    rx.add("strangers", stats.strangerDatagrams)
    rx.add("unauthentic", stats.unauthenticDatagrams)
    o.add("meshReceiverStats", rx)
    emit(o)
}

// MARK: - Fan-out

/// A sink that plays nowhere but keeps a real device's pace: every period (128 frames) it pulls from the renderer,
/// on its own thread, at absolute CLOCK_MONOTONIC deadlines; in between it serves the renderer's input (the player's
/// datagrams), as a device's thread does.
final class PacedNullSink: AudioSink, @unchecked Sendable {  // mutable state: `done` is written by start/stop only, on the control thread
    let format: AudioFormat
    let periodFrames: Int
    private let running = Flag()
    private let framesOut = Counter()
    private var done: DispatchSemaphore?

    init(format: AudioFormat, periodFrames: Int) {
        self.format = format
        self.periodFrames = periodFrames
    }

    var servesInput: Bool { true }

    func start(renderer: any AudioRenderer) throws {
        running.set(true)
        let period = periodFrames, channels = format.channels, rate = format.sampleRate
        let running = self.running, framesOut = self.framesOut
        done = spawn("null-sink") {
            let buf = UnsafeMutableBufferPointer<Float>.allocate(capacity: period * channels)
            defer { buf.deallocate() }
            let step = UInt64(period) * 1_000_000_000 / UInt64(rate)
            let input = renderer.input
            let polls = PollSet(capacity: 1)
            var next = now()
            while running.isSet {
                renderer.render(into: buf, context: RenderContext(frames: period, deviceDelayFrames: 0, nowNanos: now()))
                framesOut.add(UInt64(period))
                next += step
                guard let input else { MonotonicClock.sleep(untilNanos: next); continue }
                while running.isSet && now() < next {
                    polls.removeAll()
                    polls.appendReadable(input.descriptor)
                    _ = polls.wait(untilNanos: next)
                    if polls.readiness(at: 0) == .readable { input.pump() }
                }
            }
        }
    }

    func stop() {
        running.set(false)
        done?.wait()
        done = nil
    }

    var stats: AudioStats {
        var s = AudioStats()
        s.framesIn = framesOut.current
        s.framesOut = framesOut.current
        return s
    }
}

/// utime + stime of a process, from /proc/PID/stat, in seconds.
func processCPUSeconds(_ pid: Int32) -> Double? {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = text.lastIndex(of: ")") else { return nil }
    let fields = text[text.index(after: close)...].split(separator: " ")
    // After the command: state is field 3, utime 14, stime 15 (1-based over the whole line).
    guard fields.count > 13, let u = Double(fields[11]), let s = Double(fields[12]) else { return nil }
    let hz = Double(sysconf(Int32(_SC_CLK_TCK)))
    return (u + s) / hz
}

func fanout() {
    let endpoint = options.connect!, players = options.players, seconds = options.seconds
    let latency = options.latency
    // Each player has its own identity, trusted by the host (its state directory's trust store), and trusts it back.
    // Without --host-state the host is one that admits all (mesh-bench serve), and the players join any host.
    // The players' trust store lives for this run only: its directory is removed when the players have stopped, or
    // before a failure exits.
    let hostState = options.hostState.map(StateDirectory.init)
    let playerTrustDirectory = NSTemporaryDirectory() + "mesh-bench-\(getpid())"
    func removePlayerTrust() { try? FileManager.default.removeItem(atPath: playerTrustDirectory) }
    func giveUp(_ text: String) -> Never { removePlayerTrust(); terminal.fail(text) }
    var hosts = RelayPlayer.HostPolicy.any
    if let hostState {
        let playerTrust = TrustStore(path: playerTrustDirectory + "/paired.json")
        do {
            try playerTrust.add(try PeerIdentity.load(from: hostState.identityPath).publicKey, name: "bench host")
        } catch {
            giveUp("\(error)")
        }
        hosts = .paired(playerTrust)
    }
    var list: [RelayPlayer] = []
    let start = now()
    for n in 0..<players {
        do {
            let identity = try PeerIdentity.generate(displayName: "bench-\(n)")
            if let hostState { try TrustStore(path: hostState.trustPath).add(identity.publicKey, name: identity.displayName) }
            var config = RelayPlayer.Configuration(target: .direct(endpoint), identity: identity, hosts: hosts, latency: latency)
            config.encryption = options.plaintext ? .none : .required
            config.discovery = InProcessDiscovery()
            let p = try RelayPlayer(configuration: config, makeSink: { format, _ in PacedNullSink(format: format, periodFrames: 128) },
                                    log: { terminal.log("[\(n)] \($0)") })
            try p.start()
            list.append(p)
        } catch {
            giveUp("player \(n): \(error)")
        }
    }
    // Wait (bounded) until every player hears audio, then measure a clean window of `seconds`.
    let joinDeadline = now() + 15_000_000_000
    while list.contains(where: { $0.statistics.firstAudioSeconds == nil }) && now() < joinDeadline { usleep(20_000) }
    let joined = list.filter { $0.statistics.firstAudioSeconds != nil }.count
    let joinSeconds = Double(now() - start) / 1e9
    let before = list.map(\.statistics)
    var usage0 = rusage(); getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage0)
    let hostPid = options.hostPID
    let host0 = hostPid.flatMap(processCPUSeconds)
    let t0 = now()
    Thread.sleep(forTimeInterval: seconds)
    let after = list.map(\.statistics)
    var usage1 = rusage(); getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage1)
    let host1 = hostPid.flatMap(processCPUSeconds)
    let window = Double(now() - t0) / 1e9
    for p in list { p.stop() }
    removePlayerTrust()

    func cpu(_ u: rusage) -> Double {
        Double(u.ru_utime.tv_sec) + Double(u.ru_utime.tv_usec) / 1e6 + Double(u.ru_stime.tv_sec) + Double(u.ru_stime.tv_usec) / 1e6
    }
    var per: [JSONObject] = []
    var worst = 0.0
    var totalReceived: UInt64 = 0, totalLost: UInt64 = 0, totalLate: UInt64 = 0
    for (b, a) in zip(before, after) {
        // A player that reopened playback in another format during the window started its playout counters again
        // at 0: what they show then is all since the reopening (the part of the window before it went with the old
        // pipeline). Decided once a player, so that its counters keep one base.
        let reopened = a.format != b.format || a.playout.received < b.playout.received
            || a.device.framesOut < b.device.framesOut
        func since(_ counter: (RelayPlayer.Statistics) -> UInt64) -> UInt64 { reopened ? counter(a) : counter(a) - counter(b) }
        let received = since { $0.playout.received }
        let lost = since { $0.playout.lostPackets }
        let late = since { $0.playout.late }
        totalReceived += received
        totalLost += lost
        totalLate += late
        let denominator = Double(received + lost)
        let loss = denominator > 0 ? Double(lost) / denominator * 100 : 0
        worst = max(worst, loss)
        var o = JSONObject()
        o.add("received", received)
        o.add("lost", lost)
        o.add("late", late)
        o.add("lossPercent", loss)
        o.add("concealedFrames", since { $0.playout.concealedFrames })
        o.add("underruns", since { $0.playout.underruns })
        o.add("playedFrames", since { $0.device.framesOut })
        o.add("reopened", reopened)
        o.add("joined", a.firstAudioSeconds != nil)
        per.append(o)
    }
    var o = JSONObject()
    o.add("mode", "fanout")
    o.add("encrypted", !options.plaintext)
    o.add("players", players)
    o.add("joined", joined)
    o.add("joinSeconds", joinSeconds)
    o.add("windowSeconds", window)
    o.add("received", totalReceived)
    o.add("lost", totalLost)
    o.add("late", totalLate)
    o.add("lossPercent", totalReceived + totalLost > 0 ? Double(totalLost) / Double(totalReceived + totalLost) * 100 : 0)
    o.add("worstPlayerLossPercent", worst)
    o.add("playersProcessCpuSeconds", cpu(usage1) - cpu(usage0))
    o.add("hostCpuSeconds", (host0 != nil && host1 != nil) ? host1! - host0! : nil)
    o.add("perPlayer", per)
    emit(o)
}

// MARK: - Resource transfer

/// The median of sorted values (the mean of the middle two for an even count).
func middle(_ sorted: [Double]) -> Double {
    let n = sorted.count
    return n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2
}

/// The receiving end of `resource`: takes every invitation into one session, whose resources land in `--dir`
/// (the session deletes each verified file when the delegate call returns, as MC does with a file not moved).
final class ResourceSink: SessionDelegate, NearbyServiceAdvertiserDelegate, Sendable {
    let session: Session
    let received = Counter(), failed = Counter()
    init(session: Session) { self.session = session }
    func session(_ session: Session, peer: PeerID, didChange state: SessionState) {}
    func session(_ session: Session, didFinishReceivingResourceWithName name: String, fromPeer peer: PeerID,
                 at localURL: URL?, withError error: PeerMeshError?) {
        if localURL != nil {
            received.add(1)
        } else {
            failed.add(1)
            terminal.log("resource \(name) from \(peer) failed: \(error.map { "\($0)" } ?? "no file")")
        }
    }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID, withContext context: Data?,
                    invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        invitationHandler(true, session)
    }
}

func resourceReceiver() -> Never {
    do {
        var config = Session.Configuration(bindHost: "127.0.0.1")
        config.resourceDirectory = options.directory!
        let session = try Session(peer: try PeerID(displayName: "bench-resource-rx"), configuration: config)
        let sink = ResourceSink(session: session)
        session.delegate = sink
        let advertiser = try NearbyServiceAdvertiser(peer: session.myPeerID, discoveryInfo: nil, serviceType: "pm-bench-res",
                                                     discovery: InProcessDiscovery(), port: options.port, bindHost: "127.0.0.1")
        advertiser.delegate = sink
        try advertiser.startAdvertisingPeer()
        guard let port = advertiser.port else { fail("the advertiser has no port") }
        var o = JSONObject()
        o.add("mode", "resource-receiver")
        o.add("port", Int(port))
        o.add("encrypted", session.encryptionPreference == .required)
        emit(o)
        let done = DispatchSemaphore(value: 0)
        let trap = SignalTrap(queue: .global()) { _ in done.signal() }
        done.wait()
        advertiser.stopAdvertisingPeer()
        session.disconnect()
        terminal.log("received \(sink.received.current) resources, \(sink.failed.current) failed")
        withExtendedLifetime((trap, sink)) {}
        exit(0)
    } catch {
        fail("\(error)")
    }
}

/// The sending side of `resource`: learns the connected peer.
final class ResourceSender: SessionDelegate, Sendable {
    let peer = Mutex<PeerID?>(nil)
    func session(_ session: Session, peer p: PeerID, didChange state: SessionState) {
        if state == .connected { peer.withLock { $0 = p } }
    }
}

func resource() {
    let path = options.file!, endpoint = options.connect!, rounds = options.rounds
    var st = stat()
    guard stat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { fail("\(path) is not a readable regular file") }
    let bytes = UInt64(st.st_size)
    let sender = ResourceSender()
    let session: Session
    let target: PeerID
    do {
        session = try Session(peer: try PeerID(displayName: "bench-resource-tx"), configuration: Session.Configuration(bindHost: "127.0.0.1"))
        session.delegate = sender
        try session.connect(to: endpoint, timeout: .seconds(5))
    } catch {
        fail("cannot connect to the resource receiver at \(endpoint): \(error)")
    }
    let deadline = now() + 5_000_000_000
    while sender.peer.withLock({ $0 }) == nil {
        if now() > deadline { fail("the resource receiver at \(endpoint) did not connect within 5 s") }
        usleep(1_000)
    }
    target = sender.peer.withLock { $0 }!
    guard session.isEncrypted(target) else { fail("the link to the resource receiver is not encrypted") }

    var seconds: [Double] = []
    for r in 0..<rounds {
        let done = DispatchSemaphore(value: 0)
        let finishedAt = Atomic<UInt64>(0)
        let outcome = Mutex<PeerMeshError?>(nil)
        let start = now()
        do {
            try session.sendResource(at: URL(fileURLWithPath: path), withName: "bench-\(r).bin", toPeer: target) { error in
                // Timed here, on the I/O thread: the receiver's RESULT (written, SHA-256 verified) just arrived.
                finishedAt.store(now(), ordering: .releasing)
                outcome.withLock { $0 = error }
                done.signal()
            }
        } catch {
            fail("round \(r + 1): sendResource: \(error)")
        }
        guard done.wait(timeout: .now() + 300) == .success else { fail("round \(r + 1): no completion within 300 s") }
        if let error = outcome.withLock({ $0 }) { fail("round \(r + 1): the transfer failed: \(error)") }
        seconds.append(Double(finishedAt.load(ordering: .acquiring) - start) / 1e9)
    }
    session.disconnect()
    usleep(50_000)  // let the GOODBYE leave before the process exits

    let sorted = seconds.sorted()
    let median = middle(sorted)
    func mbps(_ s: Double) -> Double { Double(bytes) / 1e6 / s }
    var o = JSONObject()
    o.add("mode", "resource")
    o.add("encrypted", true)
    o.add("bytes", bytes)
    o.add("rounds", rounds)
    o.add("seconds", raw: "[" + seconds.map { String($0) }.joined(separator: ",") + "]")
    o.add("medianSeconds", median)
    o.add("medianMBPerSecond", mbps(median))
    o.add("bestMBPerSecond", mbps(sorted[0]))
    emit(o)
}

// MARK: - Mesh join

/// A member of a `meshjoin` mesh; the first one accepts every invitation into its session.
final class MeshMember: SessionDelegate, NearbyServiceAdvertiserDelegate, Sendable {
    let acceptInto = Mutex<Session?>(nil)
    let failures = Mutex<[String]>([])
    func session(_ session: Session, peer: PeerID, didChange state: SessionState) {}
    func session(_ session: Session, invitationTo peer: PeerID?, failedWith reason: DeclineReason, detail: String) {
        failures.withLock { $0.append("\(session.myPeerID) → \(peer.map { "\($0)" } ?? "?"): \(reason) \(detail)") }
    }
    func advertiser(_ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peer: PeerID, withContext context: Data?,
                    invitationHandler: @escaping @Sendable (Bool, Session?) -> Void) {
        let s = acceptInto.withLock { $0 }
        invitationHandler(s != nil, s)
    }
}

/// One mesh of `members` encrypted sessions (defaults otherwise), member i bound to 127.0.0.(i+1): a host of its
/// own, so the per-host peer limit is the default's. Every member after the first connects to the first's
/// advertiser — one at a time (each once the one before is in every view), or all at once. Returns the seconds
/// from the first connect until every member's `connectedPeers` lists all the others, and with `oneAtATime` the
/// seconds each join took.
func formMesh(members: Int, oneAtATime: Bool) -> (total: Double, joins: [Double]) {
    var sessions: [Session] = [], delegates: [MeshMember] = []
    let advertiser: NearbyServiceAdvertiser
    do {
        for i in 0..<members {
            let s = try Session(peer: try PeerID(displayName: "m\(i)"), configuration: Session.Configuration(bindHost: "127.0.0.\(i + 1)"))
            let d = MeshMember()
            s.delegate = d
            sessions.append(s)
            delegates.append(d)
        }
        delegates[0].acceptInto.withLock { $0 = sessions[0] }
        advertiser = try NearbyServiceAdvertiser(peer: sessions[0].myPeerID, discoveryInfo: nil, serviceType: "pm-bench-mesh",
                                                 discovery: InProcessDiscovery(), bindHost: "127.0.0.1")
        advertiser.delegate = delegates[0]
        try advertiser.startAdvertisingPeer()
    } catch {
        fail("cannot set up \(members) sessions: \(error)")
    }
    guard let port = advertiser.port else { fail("the first member's advertiser has no port") }
    let endpoint = PeerEndpoint(host: "127.0.0.1", port: port)
    let peers = sessions.map(\.myPeerID)
    /// Members 0…k all list each other, and no one else.
    func converged(_ k: Int) -> Bool {
        let group = Set(peers[0...k])
        return (0...k).allSatisfy { i in
            let view = sessions[i].connectedPeers
            return view.count == k && Set(view) == group.subtracting([peers[i]])
        }
    }
    func waitFor(_ k: Int, since: UInt64) {
        let deadline = since + 15_000_000_000
        while !converged(k) {
            if now() > deadline {
                let views = sessions.map { s in "\(s.myPeerID): [\(s.connectedPeers.map(\.displayName).sorted().joined(separator: ","))]" }
                let failures = delegates.flatMap { $0.failures.withLock { $0 } }
                fail("the mesh of \(k + 1) did not converge within 15 s; views \(views.joined(separator: "; ")); failures: \(failures)")
            }
            usleep(200)
        }
    }
    func join(_ k: Int) {
        do {
            try sessions[k].connect(to: endpoint, timeout: .seconds(10))
        } catch {
            fail("member \(k) cannot connect: \(error)")
        }
    }
    var joins: [Double] = []
    let start = now()
    if oneAtATime {
        for k in 1..<members {
            let t = now()
            join(k)
            waitFor(k, since: t)
            joins.append(Double(now() - t) / 1e9)
        }
    } else {
        for k in 1..<members { join(k) }
        waitFor(members - 1, since: start)
    }
    let total = Double(now() - start) / 1e9
    for s in sessions {
        for p in s.connectedPeers where !s.isEncrypted(p) { fail("\(s.myPeerID) → \(p) is not encrypted") }
    }
    advertiser.stopAdvertisingPeer()
    for s in sessions { s.disconnect() }
    usleep(100_000)  // the GOODBYEs settle before the next mesh forms
    withExtendedLifetime(delegates) {}
    return (total, joins)
}

func meshJoin() {
    let members = options.members, runs = options.runs
    func ms(_ v: [Double]) -> String { "[" + v.map { String(($0 * 1e6).rounded() / 1e3) }.joined(separator: ",") + "]" }
    func median(_ v: [Double]) -> Double { middle(v.sorted()) }
    var sequential: [Double] = [], lastJoin: [Double] = [], concurrent: [Double] = []
    for _ in 0..<runs {
        let one = formMesh(members: members, oneAtATime: true)
        sequential.append(one.total)
        lastJoin.append(one.joins.last ?? 0)
        concurrent.append(formMesh(members: members, oneAtATime: false).total)
    }
    func summary(_ v: [Double]) -> JSONObject {
        var o = JSONObject()
        o.add("medianMs", median(v) * 1000)
        o.add("minMs", v.min()! * 1000)
        o.add("maxMs", v.max()! * 1000)
        o.add("runsMs", raw: ms(v))
        return o
    }
    var o = JSONObject()
    o.add("mode", "meshjoin")
    o.add("members", members)
    o.add("runs", runs)
    o.add("encrypted", true)
    var seq = summary(sequential)
    seq.add("lastJoinMedianMs", median(lastJoin) * 1000)
    o.add("oneAtATime", seq)
    o.add("allAtOnce", summary(concurrent))
    emit(o)
}

// MARK: - Pair (files only)

func pairStates() {
    let host = StateDirectory(options.hostState!), player = StateDirectory(options.playerState!)
    do {
        let (h, _) = try PeerIdentity.loadOrCreate(at: host.identityPath, displayName: "bench-host")
        let (p, _) = try PeerIdentity.loadOrCreate(at: player.identityPath, displayName: "bench-player")
        try TrustStore(path: host.trustPath).add(p.publicKey, name: p.displayName)
        try TrustStore(path: player.trustPath).add(h.publicKey, name: h.displayName)
        var o = JSONObject()
        o.add("mode", "pair")
        o.add("host", h.publicKey.shortFingerprint)
        o.add("player", p.publicKey.shortFingerprint)
        emit(o)
    } catch {
        fail("\(error)")
    }
}

// MARK: - Serve (the host side of the encryption-cost comparison)

func serve() -> Never {
    do {
        let tone = try ToneSource(frequency: 440, amplitude: 0.5, format: .default, periodFrames: 128)
        var config = RelayHost.Configuration(identity: try PeerIdentity.generate(displayName: "bench-serve"), trust: nil,
                                             serviceType: "pm-bench-serve", port: options.port, maximumPeers: 33,
                                             accept: .all, discovery: InProcessDiscovery())
        config.maximumPlayersPerAddress = 32
        config.encryption = options.plaintext ? .none : .required
        let host = try RelayHost(configuration: config, source: tone)
        try host.start()
        var o = JSONObject()
        o.add("mode", "serve")
        o.add("port", Int(host.port))
        o.add("encrypted", !options.plaintext)
        emit(o)
        let done = DispatchSemaphore(value: 0)
        let trap = SignalTrap(queue: .global()) { _ in done.signal() }
        done.wait()
        host.stop()
        withExtendedLifetime(trap) {}
        exit(0)
    } catch {
        fail("\(error)")
    }
}

switch options.mode {
case .throughput: throughput()
case .fanout: fanout()
case .pair: pairStates()
case .serve: serve()
case .resource: resource()
case .resourceReceiver: resourceReceiver()
case .meshjoin: meshJoin()
}
exit(0)
