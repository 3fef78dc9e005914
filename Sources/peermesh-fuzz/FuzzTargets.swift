// peermesh-fuzz: every decoder of outside bytes, one target each.
//
//   Built by scripts/fuzz with `-sanitize=fuzzer,address -DFUZZING`: a libFuzzer binary; the target is chosen by
//   PEERMESH_FUZZ_TARGET (frames, channel, datagram, txt, srv, pairing, audio, opus, wav, control, nearby, chat).
//   Built plainly: `peermesh-fuzz TARGET PATH...` replays files (or directories of them) through the target and
//   says how many ran; a crash is a failed replay (scripts/fuzz replays fuzz/corpus through its AddressSanitizer
//   build instead).
import Foundation
import MeshAudio
import MeshPipeline
import MeshCLI
import MeshRelay
import PeerMesh

/// The fuzz targets: what each feeds, and to which decoder.
enum FuzzTarget: String, CaseIterable {
    /// TCP frame stream: `FrameAssembler` and `ControlFrame.decode`.
    case frames
    /// Noise XX handshake messages and AEAD records: `SecureChannel` as responder, initiator and established.
    case channel
    /// UDP datagrams: `DatagramHeader`, `DatagramRouter`, `Sodium.open`, body parsing.
    case datagram
    /// DNS-SD instance names and TXT records: `TXTRecord.decode`.
    case txt
    /// DNS-SD SRV records from the LAN: `AvahiCore.parseSRV` and the browse table they move.
    case srv
    /// Pairing (CPace) messages.
    case pairing
    /// Audio packets: `AudioPacket.decode` and `PacketIngress` (sample clamping, the ring).
    case audio
    /// Opus audio packets: the header rules, libopus's decoder and its concealment of gaps (`PacketIngress` at 48 kHz).
    case opus
    /// Sound-file headers and bodies through libsndfile (`SoundFiles.read`).
    case wav
    /// Remote-control messages (`ControlMessage.decode`) through both sides' state machines.
    case control
    /// Out-of-band connection data (`NearbyConnectionData.decode`), as `connectPeer` reads it.
    case nearby
    /// mesh-chat messages from members (`ChatMessage.decode`): only printable text gets through.
    case chat

    func run(_ input: [UInt8]) {
        switch self {
        case .frames: FuzzEntryPoints.controlFrames(input)
        case .channel: FuzzEntryPoints.secureChannel(input)
        case .datagram: FuzzEntryPoints.datagram(input)
        case .txt: FuzzEntryPoints.txtRecord(input)
        case .srv: FuzzEntryPoints.srvRecords(input)
        case .pairing: FuzzEntryPoints.pairing(input)
        case .audio: Self.audio(input)
        case .opus: Self.opus(input)
        case .wav: Self.wav(input)
        case .control: Self.control(input)
        case .nearby: FuzzEntryPoints.nearbyConnectionData(input)
        case .chat: Self.chat(input)
        }
    }

    /// What decodes is text a terminal shows as it is, and encodes back to the same bytes.
    static func chat(_ input: [UInt8]) {
        guard let message = ChatMessage.decode(Data(input)) else { return }
        let text: String
        switch message {
        case .room(let t), .direct(let t): text = t
        }
        precondition(!text.unicodeScalars.contains { $0.value < 0x20 && $0 != "\t" }, "a control character got through")
        precondition(Array(message.encoded()) == input, "a chat message does not re-encode to its bytes")
    }

    /// A control message from a peer: what decodes re-encodes to the same bytes; the host answers every message
    /// exactly once, and neither side's state machine traps, whatever the bytes.
    static func control(_ input: [UInt8]) {
        if let message = try? ControlMessage.decode(input) {
            precondition(message.encoded == input, "a decoded control message does not re-encode to its bytes")
        }
        var host = HostControl<Int>(clips: true)
        _ = host.joined(1)
        let actions = host.received(input, from: 1, now: 0)
        let replies = actions.filter { if case .send(1, .reply) = $0 { true } else { false } }.count
        let opened = actions.compactMap { action -> UInt64? in if case .openClip(let clip, _) = action { clip } else { nil } }
        precondition(replies + opened.count == 1, "a control message got \(replies) replies")
        if let clip = opened.first { _ = host.clipOpened(clip) }
        var player = PlayerControl()
        player.joined()
        _ = player.received(HostControlState(features: [.control, .clips]).encodedState)
        _ = player.request(.pause, now: 0)
        _ = player.received(input)
    }

    /// The player's ingress: a packet of any format is decoded; one in the ingress's format goes into the ring, and
    /// every sample that comes out of decoding is finite and within [−1, 1].
    private static let ring = PacketRing(capacity: 8)
    private static let ingress = PacketIngress(format: .default, ring: ring)

    static func audio(_ input: [UInt8]) {
        input.withUnsafeBytes { raw in
            if case .success(let (_, samples)) = Result(catching: { try AudioPacket.decode(input) }) {
                precondition(samples.allSatisfy { $0.isFinite && abs($0) <= 1 }, "a decoded sample is out of range")
            }
            _ = ingress.receive(raw, arrivalNanos: 1)
        }
        // The render thread's end: what the ring hands on is what was checked.
        while ring.pop({ _, samples in precondition(samples.allSatisfy { $0.isFinite && abs($0) <= 1 }, "the ring holds an unchecked sample") }) != nil {}
    }

    /// Opus through ingresses at 48 kHz (mono and stereo), 44.1 kHz and 96 kHz (decoded, then resampled: a host that
    /// sent one PCM packet at 96 kHz has the player rebuild at that rate): the input as it is (a whole datagram), and
    /// the input as the codec bytes of a well-formed header whose sequence number, frame count and capture delay come
    /// from its first bytes (so gaps, stale packets, restarts, lying frame counts and delays past any range are all
    /// reached). Whatever is queued is finite and in range.
    private static let opusRings = [PacketRing(capacity: 16), PacketRing(capacity: 16), PacketRing(capacity: 16), PacketRing(capacity: 16)]
    /// Their decoders are made up front (a player makes its own when the first Opus packet arrives, on its I/O
    /// thread): every input, the first included, reaches the decoder.
    private static let opusIngress = {
        let ingresses = [PacketIngress(format: AudioFormat(sampleRate: 48_000, channels: 1), ring: opusRings[0]),
                         PacketIngress(format: AudioFormat(sampleRate: 48_000, channels: 2), ring: opusRings[1]),
                         PacketIngress(format: .default, ring: opusRings[2]),
                         PacketIngress(format: AudioFormat(sampleRate: 96_000, channels: 1), ring: opusRings[3])]
        for ingress in ingresses {
            do { try ingress.prepareOpusDecoder() } catch { fatalError("\(error)") }
        }
        return ingresses
    }()
    nonisolated(unsafe) private static var opusSequence: UInt32 = 0

    static func opus(_ input: [UInt8]) {
        let sizes = [120, 240, 480, 960, 1920, 2880]
        let step = UInt32(input.first ?? 1) % 12  // 0: a duplicate, 1: the next, 2–9: a gap, 10–11: a restart
        opusSequence &+= step < 10 ? step : 5_000
        let frames = sizes[Int(input.count > 1 ? input[1] : 0) % sizes.count]
        let delay = input.count > 5 ? input[2..<6].reduce(UInt32(0)) { $0 << 8 | UInt32($1) } : 0
        for (ingress, ring) in zip(opusIngress, opusRings) {
            let header = AudioPacketHeader(sequence: opusSequence, firstFrameIndex: UInt64(opusSequence) * 120, frameCount: frames,
                                           format: AudioFormat(sampleRate: 48_000, channels: ingress.format.channels),
                                           hostLatencyFrames: delay, encoding: .opus)
            var datagram = [UInt8](repeating: 0, count: AudioPacket.headerSize)
            datagram.withUnsafeMutableBytes { AudioPacket.writeHeader(header, into: $0) }
            datagram += input.dropFirst(2).prefix(AudioPacket.maximumSize - AudioPacket.headerSize)
            for bytes in [input, datagram] {
                _ = bytes.withUnsafeBytes { ingress.receive($0, arrivalNanos: UInt64(opusSequence)) }
            }
            while ring.pop({ _, samples in precondition(samples.allSatisfy { $0.isFinite && abs($0) <= 1 }, "an Opus sample out of range") }) != nil {}
        }
    }

    /// A file's bytes, read as libsndfile reads a file given to `--input`.
    static func wav(_ input: [UInt8]) {
        let path = wavPath
        guard FileManager.default.createFile(atPath: path, contents: Data(input)) else { return }
        if let (format, samples) = try? SoundFiles.read(path: path, maximumFrames: 1 << 16) {
            precondition(samples.count % format.channels == 0, "a partial frame was read")
        }
    }

    private static let wavPath = "/dev/shm/peermesh-fuzz-\(getpid()).wav"
}

#if FUZZING
nonisolated(unsafe) private var selected = FuzzTarget.frames

@_cdecl("LLVMFuzzerInitialize")
public func fuzzerInitialize(_ argc: UnsafeMutablePointer<Int32>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>) -> Int32 {
    let name = ProcessInfo.processInfo.environment["PEERMESH_FUZZ_TARGET"] ?? ""
    guard let target = FuzzTarget(rawValue: name) else {
        FileHandle.standardError.write(Data("set PEERMESH_FUZZ_TARGET to one of: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", "))\n".utf8))
        exit(2)
    }
    selected = target
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzerTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    selected.run(data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? [])
    return 0
}
#else
@main
struct Replay {
    static func main() {
        let args = Array(CommandLine.arguments.dropFirst())
        let usage = """
            usage: peermesh-fuzz TARGET PATH...   replays files (or directories of them) through TARGET
                   peermesh-fuzz --seed DIR        writes well-formed seed inputs to DIR/TARGET/
              targets: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", "))
              (scripts/fuzz builds the libFuzzer binary)

            """
        if args == ["--help"] || args == ["-h"] { print(usage, terminator: ""); exit(0) }
        if args == ["--version"] { print("peermesh-fuzz \(meshVersion)"); exit(0) }
        if args.count == 2, args[0] == "--seed" { seed(into: args[1]) }
        guard let name = args.first, let target = FuzzTarget(rawValue: name), args.count >= 2 else {
            FileHandle.standardError.write(Data(usage.utf8))
            exit(2)
        }
        var count = 0
        for path in args.dropFirst() {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
                FileHandle.standardError.write(Data("peermesh-fuzz: \(path): no such file or directory\n".utf8))
                exit(1)
            }
            let files = isDirectory.boolValue
                ? ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted().map { path + "/" + $0 }
                : [path]
            for file in files {
                guard let data = FileManager.default.contents(atPath: file) else { continue }
                target.run(Array(data))
                count += 1
            }
        }
        print("peermesh-fuzz \(target.rawValue): \(count) inputs replayed, none crashed")
    }
}

/// Writes each target's seeds to `directory/TARGET/seed-N`, then exits.
func seed(into directory: String) -> Never {
    var seeds = FuzzEntryPoints.seeds()
    // Audio packets of the default format and of others, in and out of range.
    let formats = [AudioFormat.default, AudioFormat(sampleRate: 48_000, channels: 2)]
    let shapes = formats.flatMap { f in SampleEncoding.allCases.map { (f, $0) } }
    seeds["audio"] = shapes.enumerated().compactMap { i, shape in
        let (f, encoding) = shape, frames = 32
        let samples = (0..<(frames * f.channels)).map { Float($0 % 7) * 0.4 - 1.2 }
        let h = AudioPacketHeader(sequence: UInt32(i), firstFrameIndex: UInt64(i * frames), frameCount: frames, format: f,
                                  encoding: encoding)
        return try? AudioPacket.encode(h, samples: samples)
    }
    // Opus packets as a host sends them: a tone at 44.1 kHz, mono and stereo, through the packetizer.
    seeds["opus"] = [1, 2].flatMap { channels -> [[UInt8]] in
        guard var p = try? Packetizer(format: AudioFormat(sampleRate: 44_100, channels: channels), encoding: .opus) else { return [] }
        let samples = (0..<(512 * channels)).map { sin(Float($0 / channels) * 0.0627) * 0.5 }
        // Each seed starts with the two bytes the target reads (step 1, 120 frames), then the codec bytes.
        return p.packets(samples, chunk: ChunkInfo(firstFrameIndex: 0, frames: 512, timestampNanos: 1))
            .map { [1, 0] + $0.dropFirst(AudioPacket.headerSize) }
    }
    // Control messages of every kind.
    seeds["chat"] = [ChatMessage.room("hello, room").encoded(), ChatMessage.direct("hé 🎧\tx").encoded()].map { Array($0) }
    seeds["control"] = [
        ControlMessage.command(id: 1, .pause), .command(id: 2, .resume), .command(id: 3, .capture(.begin, .primary)),
        .command(id: 4, .capture(.single, .secondary)), .command(id: 5, .talk(true)), .reply(id: 1, .ok),
        .reply(id: 3, .failed("cannot write kitchen-20261202-101500.wav: permission denied")),
        .state(HostControlState(paused: true, muted: true, features: [.control, .clips], capture: .saved("kitchen-20261202-101500.wav"))),
    ].map(\.encoded)
    // Sound files in the encodings libsndfile writes for us.
    seeds["wav"] = SoundFileEncoding.allCases.compactMap { encoding in
        let path = "/dev/shm/peermesh-seed-\(getpid()).wav"
        defer { unlink(path) }
        let samples = (0..<256).map { sin(Float($0) * 0.1) * 0.5 }
        guard (try? SoundFiles.write(path: path, format: .default, encoding: encoding, samples: samples)) != nil else { return nil }
        return FileManager.default.contents(atPath: path).map(Array.init)
    }
    for (target, inputs) in seeds {
        let dir = directory + "/" + target
        try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        for (i, input) in inputs.enumerated() {
            _ = FileManager.default.createFile(atPath: "\(dir)/seed-\(i)", contents: Data(input))
        }
    }
    print("peermesh-fuzz: seeds for \(seeds.keys.sorted().joined(separator: ", ")) in \(directory)")
    exit(0)
}
#endif
