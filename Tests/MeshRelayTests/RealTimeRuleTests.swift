import Foundation
import MeshTestSupport
import Testing

/// Whether this test, and so the CLIs built with it, is an optimized build.
#if DEBUG
private let optimizedBuild = false
#else
private let optimizedBuild = true
#endif

/// The real-time rule, measured: once a stream is playing, the threads that serve the devices — `pm-capture` and
/// `pm-playback`, in mesh-record (microphone, talkback) and in mesh-play (playback, talk input) — make no heap call at
/// all (no malloc, calloc, realloc, free or aligned allocation), and wait on nothing but the device: no lock,
/// condition, semaphore or futex wait, no sleep or yield, no poll with a timeout and no I/O on a blocking descriptor.
/// Two waits are the device's: those its libraries make (libasound and its plugins, libjack), and polls on its
/// descriptors. One more is allowed, to a player: waiting, until the device's deadline for the next block, for that
/// block's packets on the stream's UDP socket (`Player`, `RenderSchedule`), which the kernel fills and no other
/// thread holds. An LD_PRELOAD probe (scripts/lib/rt_probe.c) counts the calls those threads make in a window of
/// steady playing, in the shipped CLIs, on real ALSA devices through the JACK rig, with encryption on.
///
/// Two controls show that the probe sees what it counts: mesh-play's `pm-io` makes heap calls and waits (its event
/// loop), and every device thread waits on its device.
///
/// The rule is about the code users run: optimized builds, as `scripts/test` makes. A debug build runs generic code
/// unspecialized, which allocates (hundreds of thousands of calls a second on `pm-playback`), so there it is skipped.
@Suite("Real-time threads neither allocate nor wait on anything but the device (CLIs, LD_PRELOAD probe, JACK rig)", .serialized, .avahiDaemonShared,
       .enabled(if: Rig.jack && Rig.avahi, "needs scripts/test's JACK and Avahi rigs"),
       .enabled(if: optimizedBuild, "judged on optimized builds (scripts/test builds -c release)"))
struct RealTimeRuleTests {
    /// The window of steady playing, ms after the player's status first shows it playing (its JSON line once a
    /// second: joined, packets received). The player is stopped (SIGINT) once both probes have reported, so a slow
    /// join cannot end the stream inside the window; `joinSeconds` bounds the wait for it to play.
    static let from = 1_000, until = 5_000, joinSeconds = 30.0

    /// A private directory (mkdtemp, 0700) for one run's probe, reports and start file: nobody else can put a
    /// library where the CLIs will load it from.
    static func privateDirectory() throws -> String {
        var template = Array((FileManager.default.temporaryDirectory.path + "/pm-rt-probe-XXXXXX").utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        try #require(made != nil, "mkdtemp: \(String(cString: strerror(errno)))")
        return String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// `scripts/lib/<source>` compiled into `directory` as `output`, with the toolchain's clang (the one C compiler
    /// every machine that builds this package has).
    static func compile(_ source: String, into directory: String, as output: String, flags: [String],
                        libraries: [String] = []) throws -> String {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let path = root.appendingPathComponent("scripts/lib/\(source)").path
        let product = directory + "/" + output
        let compiler = (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":")
            .map { "\($0)/clang" }.first { FileManager.default.isExecutableFile(atPath: $0) } ?? "/usr/bin/cc"
        let build = try ChildProcess(URL(fileURLWithPath: compiler), flags + ["-o", product, path] + libraries)
        let status = build.waitForExit(seconds: 60)
        try #require(status == 0, "building \(source) failed: \(build.stderr.joined(separator: "\n"))")
        return product
    }

    /// The probe, built into `directory`.
    static func buildProbe(into directory: String) throws -> String {
        try compile("rt_probe.c", into: directory, as: "rt_probe.so",
                    flags: ["-shared", "-fPIC", "-O2", "-ftls-model=initial-exec"], libraries: ["-ldl"])
    }

    /// The environment that loads the probe into a CLI, watching `thread`, reporting to `report`, its window
    /// reckoned from when `start` appears.
    static func probed(_ library: String, thread: String, report: String, start: String) -> [String: String] {
        ["LD_PRELOAD": library, "PM_RT_PROBE_THREADS": thread, "PM_RT_PROBE_FROM_MS": "\(from)",
         "PM_RT_PROBE_UNTIL_MS": "\(until)", "PM_RT_PROBE_OUT": report, "PM_RT_PROBE_START_FILE": start]
    }

    /// The report's line for `thread`: whether it was alive, and what it did in the window; the whole report (with
    /// the stacks of the first heap calls and waits) for the failure message.
    static func reading(_ report: String, thread: String) -> Reading? {
        guard let text = try? String(contentsOfFile: report, encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("thread \(thread) ") {
            let fields = Dictionary(uniqueKeysWithValues: line.split(separator: " ").dropFirst(2).compactMap { field -> (String, Int)? in
                let kv = field.split(separator: "=")
                guard kv.count == 2, let n = Int(kv[1]) else { return nil }
                return (String(kv[0]), n)
            })
            guard let live = fields["live"], let calls = fields["calls"], let waits = fields["waits"],
                  let deviceWaits = fields["devicewaits"], let inputWaits = fields["inputwaits"] else { return nil }
            return Reading(live: live == 1, heapCalls: calls, waits: waits, deviceWaits: deviceWaits,
                           inputWaits: inputWaits, text: text)
        }
        return nil
    }

    /// One thread's line of a probe report.
    struct Reading {
        /// A thread of that name was alive at the window's end.
        var live: Bool
        /// Heap calls in the window.
        var heapCalls: Int
        /// Calls that can sleep (locks, waits, sleeps, polls with a timeout, blocking I/O), but for the two below.
        var waits: Int
        /// Waits on the device: made by its libraries (libasound, its plugins, libjack), or polls on its descriptors.
        var deviceWaits: Int
        /// Polls with a timeout on UDP sockets only: a player waiting for the next block's packets until its deadline.
        var inputWaits: Int
        /// The whole report.
        var text: String
    }

    /// What one probed run measured: the report lines of the threads each process watched, by process and thread
    /// ("mesh-record pm-capture"), and mesh-play's final status.
    struct Run {
        var readings: [String: Reading]
        var final: [String: Any]
    }

    /// Runs a probed mesh-record (`pm_knowncap`, `codec`) and a probed mesh-play (`pm_play`) through one window;
    /// with `impairment` (mesh-impair's flags), the player joins through the impairment proxy; with `talk`, the player
    /// talks back from `pm_cap` (full duplex, so it goes on playing) to the host's `pm_play` through the whole window.
    static func run(codec: String, impairment: [String]? = nil, talk: Bool = false) throws -> Run {
        let directory = try privateDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let probe = try buildProbe(into: directory)
        let hostReport = directory + "/host.txt", playerReport = directory + "/player.txt"
        let playing = directory + "/playing"
        let service = Rig.uniqueService()
        let paired = try PairedStates()
        let host = try CLIProcess(product: "mesh-record",
                                  paired.hostArgs + ["--host", "--bind", "127.0.0.1", "--name", "rt-host", "--service", service,
                                                     "--device", "pm_knowncap", "--codec", codec]
                                    + (talk ? ["--talk-device", "pm_play", "--talk-duplex", "full"] : []),
                                  environment: probed(probe, thread: deviceThreads, report: hostReport, start: playing))
        defer { host.kill() }
        var join = ["--find", "--service", service]
        var proxy: CLIProcess?
        defer { proxy?.kill() }
        if let impairment {
            let port = try #require(portPrinted(by: host, after: "on port "), "mesh-record: \(host.stderr)")
            let p = try CLIProcess("mesh-impair", ["--listen", "127.0.0.1:0", "--target", "127.0.0.1:\(port)"] + impairment)
            proxy = p
            let proxyPort = try #require(portPrinted(by: p, after: "listening 127.0.0.1:"), "mesh-impair: \(p.stderr)")
            join = ["--connect", "127.0.0.1:\(proxyPort)"]
        }
        let stdin = Pipe()
        let player = try CLIProcess(product: "mesh-play",
                                    paired.playerArgs() + join + ["--device", "pm_play", "--duration", "120", "--json"]
                                      + (talk ? ["--talk-device", "pm_cap"] : []),
                                    environment: probed(probe, thread: deviceThreads + ",pm-io", report: playerReport, start: playing),
                                    stdin: stdin.fileHandleForReading)
        // Both windows open once the player plays: joined, and 100 packets (0.3 s) in; and, with talk, talking.
        try #require(eventually(Self.joinSeconds) {
            player.jsonObjects.contains { ($0["state"] as? String)?.hasPrefix("joined") == true && ($0["received"] as? Int ?? 0) >= 100 }
        }, "mesh-play never played: \(player.stderr)")
        if talk {
            try? stdin.fileHandleForWriting.write(contentsOf: Data("talk on\n".utf8))
            try #require(eventually(5) { player.stderr.contains { $0.hasSuffix("talk on: ok") } }, "mesh-play: \(player.stderr)")
        }
        #expect(FileManager.default.createFile(atPath: playing, contents: nil))
        let reported = eventually(Double(until) / 1_000 + 10) {
            FileManager.default.fileExists(atPath: hostReport) && FileManager.default.fileExists(atPath: playerReport)
        }
        #expect(reported, "both probes reported")
        player.signal(SIGINT)
        let code = player.waitForExit(seconds: 10)
        #expect(code == 0, "mesh-play: \(player.stderr)")
        let final = try #require(player.jsonObjects.last { $0["final"] as? Bool == true }, "mesh-play: \(player.stderr)")
        #expect((final["received"] as? Int ?? 0) > 1_000, "the stream played: \(final)")
        var readings: [String: Reading] = [:]
        for (process, report, threads) in [("mesh-record", hostReport, deviceThreads), ("mesh-play", playerReport, deviceThreads + ",pm-io")] {
            for thread in threads.split(separator: ",").map(String.init) {
                let r: Reading = try #require(reading(report, thread: thread), "\(process)'s probe report")
                readings["\(process) \(thread)"] = r
            }
        }
        return Run(readings: readings, final: final)
    }

    /// The threads that serve audio devices, in either CLI.
    static let deviceThreads = "pm-capture,pm-playback"

    /// The port in the first stderr line of `process` that holds `prefix` followed by digits (waits up to 10 s).
    static func portPrinted(by process: CLIProcess, after prefix: String) -> Int? {
        var port: Int?
        _ = eventually(10) {
            port = process.stderr.lazy.compactMap { line -> Int? in
                guard let r = line.range(of: prefix) else { return nil }
                return Int(line[r.upperBound...].prefix { $0.isNumber })
            }.first
            return port != nil
        }
        return port
    }

    /// The device threads `live` were there through the window, and none made a heap call or waited on anything
    /// but its device in it; the controls: every device thread waited on its device, and mesh-play's pm-io made heap
    /// calls and waits of its own.
    static func expectRealTimeRule(_ run: Run, live: [String], _ label: String) {
        for name in live {
            #expect(run.readings[name]?.live == true, "\(name) ran through the window\n\(run.readings[name]?.text ?? "")")
        }
        for (name, r) in run.readings where name != "mesh-play pm-io" {
            #expect(r.heapCalls == 0, "heap calls on \(name) (\(label)) in \(until - from) ms of streaming:\n\(r.text)")
            #expect(r.waits == 0, "waits on \(name) (\(label)) in \(until - from) ms of streaming:\n\(r.text)")
            // A capture thread has no input to wait for: its one wait is the device's.
            if name.hasSuffix(" pm-capture") {
                #expect(r.inputWaits == 0, "input waits on \(name) (\(label)):\n\(r.text)")
            }
        }
        for name in live {
            #expect((run.readings[name]?.deviceWaits ?? 0) > 0,
                    "the probe saw \(name) wait on no device, which it does all the time: it does not work\n\(run.readings[name]?.text ?? "")")
        }
        let io = run.readings["mesh-play pm-io"]
        #expect((io?.heapCalls ?? 0) > 0, "the probe saw no heap call even on pm-io, which makes some: it does not work\n\(io?.text ?? "")")
        #expect((io?.waits ?? 0) > 0, "the probe saw no wait even on pm-io, which waits in epoll: it does not work\n\(io?.text ?? "")")
        let counts = run.readings.keys.sorted().map { key in
            let r = run.readings[key]!
            return "\(key) heap \(r.heapCalls) waits \(r.waits) device \(r.deviceWaits) input \(r.inputWaits)"
        }.joined(separator: ", ")
        print("real-time rule (\(label)) in \(until - from) ms: \(counts) (pm-io is the control)")
    }

    /// A relay's device threads: the host captures, the player plays.
    static let relayThreads = ["mesh-record pm-capture", "mesh-play pm-playback"]

    @Test("No heap call, nor any wait but for the device or its packets, on pm-capture (mesh-record) or pm-playback (mesh-play) while a stream plays",
          arguments: ["f32", "opus"])
    func deviceThreadsKeepTheRule(codec: String) throws {
        let run = try Self.run(codec: codec)
        #expect((run.final["lostPackets"] as? Int) == 0, "loopback loses nothing: \(run.final)")
        Self.expectRealTimeRule(run, live: Self.relayThreads, codec)
    }

    /// Loss, duplicates, reordering and jitter send the player down its rarer paths on every few packets: gaps and
    /// concealment, late and duplicate packets, the jitter buffer's adaptation, Opus's own concealment.
    @Test("No heap call, nor any wait but for the device or its packets, on the device threads while the stream is lost, duplicated, reordered and jittered",
          arguments: ["f32", "opus"])
    func deviceThreadsKeepTheRuleUnderImpairment(codec: String) throws {
        let run = try Self.run(codec: codec, impairment: ["--loss", "5%", "--duplicate", "2%", "--reorder", "5%",
                                                          "--delay-ms", "3", "--jitter-ms", "3", "--seed", "11"])
        #expect((run.final["lostPackets"] as? Int ?? 0) > 0, "the impairment reached the player: \(run.final)")
        Self.expectRealTimeRule(run, live: Self.relayThreads, "\(codec), impaired")
    }

    /// Push-to-talk adds a device thread at each end: the player captures its talk input (`pm-capture`) and the host
    /// plays it (`pm-playback`), through the same packetizer, jitter buffer and concealment.
    @Test("No heap call, nor any wait but for the device or its packets, on any device thread of either end while a player talks back (full duplex)")
    func deviceThreadsKeepTheRuleWhileTalkingBack() throws {
        let run = try Self.run(codec: "f32", talk: true)
        #expect((run.final["talkPacketsSent"] as? Int ?? 0) > 1_000, "the player talked: \(run.final)")
        Self.expectRealTimeRule(run, live: Self.relayThreads + ["mesh-play pm-capture", "mesh-record pm-playback"], "f32, talking back")
    }
}

/// The probe itself, held to exact counts on a known workload (scripts/lib/rt_probe_check.c): a probe that missed
/// a kind of wait, or counted one that is not, would pass the rule's tests for the wrong reason. Needs no rig.
@Suite("The real-time probe counts exactly what it says")
struct RealTimeProbeTests {
    @Test("On a known workload: 2 heap calls, 9 waits, 1 input wait; nothing from the thread it does not watch")
    func countsAKnownWorkload() throws {
        let directory = try RealTimeRuleTests.privateDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let probe = try RealTimeRuleTests.buildProbe(into: directory)
        let check = try RealTimeRuleTests.compile("rt_probe_check.c", into: directory, as: "rt_probe_check",
                                                  flags: ["-O2", "-pthread"])
        let report = directory + "/report.txt"
        // The window opens 100 ms after start, before the workload (at 300 ms), and closes well after it.
        let run = try ChildProcess(URL(fileURLWithPath: check), [report],
                                   environment: ["LD_PRELOAD": probe, "PM_RT_PROBE_THREADS": "pm-check,pm-absent",
                                                 "PM_RT_PROBE_FROM_MS": "100", "PM_RT_PROBE_UNTIL_MS": "3000",
                                                 "PM_RT_PROBE_OUT": report])
        #expect(run.waitForExit(seconds: 15) == 0, "the workload ran and the report appeared: \(run.stderr)")
        let r = try #require(RealTimeRuleTests.reading(report, thread: "pm-check"), "the probe reported")
        #expect(r.heapCalls == 2, "\(r.text)")
        #expect(r.waits == 9, "\(r.text)")
        #expect(r.inputWaits == 1, "\(r.text)")
        #expect(r.deviceWaits == 0, "\(r.text)")
        #expect(!r.live, "the workload's thread had ended by the window's end")
        for call in ["malloc", "free", "pthread_mutex_lock", "pthread_cond_timedwait"] {
            #expect(r.text.contains(": \(call) on pm-check"), "the stacks name \(call)\n\(r.text)")
        }
        let absent = try #require(RealTimeRuleTests.reading(report, thread: "pm-absent"))
        #expect(!absent.live && absent.heapCalls == 0 && absent.waits == 0 && absent.inputWaits == 0)
    }
}
