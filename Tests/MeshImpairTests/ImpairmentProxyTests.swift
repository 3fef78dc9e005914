import Foundation
import Synchronization
import Testing
@testable import MeshImpair
import MeshPOSIX
import MeshTestSupport
#if canImport(Glibc)
import Glibc
#endif

// MARK: Test sockets (127.0.0.1 only)

/// A UDP socket bound to 127.0.0.1:0 with a large receive buffer.
private final class LoopUDP {
    let fd: Int32
    let port: UInt16

    init() {
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        precondition(fd >= 0)
        var size: Int32 = 4 << 20
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        var a = loopback(0)
        let r = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        precondition(r == 0)
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        self.fd = fd
        port = UInt16(bigEndian: a.sin_port)
    }

    deinit { close(fd) }

    func send(_ bytes: [UInt8], to port: UInt16) {
        var a = loopback(port)
        let r = bytes.withUnsafeBytes { raw in
            withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                sendto(fd, raw.baseAddress, raw.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            } }
        }
        precondition(r == bytes.count, "sendto failed: \(String(cString: strerror(errno)))")
    }

    /// One datagram and its source port, waiting up to `timeoutMs`.
    func receive(timeoutMs: Int32) -> (bytes: [UInt8], from: UInt16)? {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, timeoutMs) > 0 else { return nil }
        return receiveNow()
    }

    func receiveNow() -> (bytes: [UInt8], from: UInt16)? {
        var buf = [UInt8](repeating: 0, count: 65_536)
        var from = sockaddr_in()
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let n = buf.withUnsafeMutableBytes { b in
            withUnsafeMutablePointer(to: &from) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                recvfrom(fd, b.baseAddress, b.count, Int32(MSG_DONTWAIT), $0, &len)
            } }
        }
        guard n >= 0 else { return nil }
        return (Array(buf[0..<n]), UInt16(bigEndian: from.sin_port))
    }

    func drain() -> [[UInt8]] {
        var out: [[UInt8]] = []
        while let d = receiveNow() { out.append(d.bytes) }
        return out
    }
}

private func loopback(_ port: UInt16) -> sockaddr_in {
    var a = sockaddr_in()
    a.sin_family = sa_family_t(AF_INET)
    a.sin_port = port.bigEndian
    a.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
    return a
}

/// Datagram `seq`: 4-byte big-endian sequence number, then a body whose length and bytes depend on `seq`.
private func payload(_ seq: Int) -> [UInt8] {
    var b = [UInt8(seq >> 24 & 0xff), UInt8(seq >> 16 & 0xff), UInt8(seq >> 8 & 0xff), UInt8(seq & 0xff)]
    for k in 0..<(12 + seq % 200) { b.append(UInt8(truncatingIfNeeded: seq &* 31 &+ k &* 7)) }
    return b
}

private func sequence(of d: [UInt8]) -> Int { Int(d[0]) << 24 | Int(d[1]) << 16 | Int(d[2]) << 8 | Int(d[3]) }

private func wait(seconds: Double = 3, until condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(500)
    }
    return condition()
}

private func makeProxy(target: UInt16, _ tweak: (inout ImpairmentProxy.Configuration) -> Void = { _ in }) throws -> (ImpairmentProxy, UInt16) {
    var c = ImpairmentProxy.Configuration(target: .init(host: "127.0.0.1", port: target))
    tweak(&c)
    let proxy = try ImpairmentProxy(configuration: c)
    let address = try proxy.start()
    #expect(address.host == "127.0.0.1" && address.port != 0)
    return (proxy, address.port)
}

/// Sends `count` datagrams client → proxy, keeping at most 64 unread at the proxy, and collects what reaches the
/// sink once the proxy has nothing pending.
private func pump(_ proxy: ImpairmentProxy, port: UInt16, client: LoopUDP, sink: LoopUDP, count: Int) -> [[UInt8]] {
    var got: [[UInt8]] = []
    for i in 0..<count {
        client.send(payload(i), to: port)
        if i % 32 == 31 {
            got += sink.drain()
            _ = wait { got += sink.drain(); return proxy.statistics.toTarget.received + 64 >= UInt64(i + 1) }
        }
    }
    let settled = wait {
        got += sink.drain()
        let s = proxy.statistics.toTarget
        return s.received == UInt64(count) && s.pending == 0
    }
    #expect(settled, "proxy did not settle: \(proxy.statistics.toTarget)")
    got += sink.drain()
    return got
}

// MARK: Tests

@Suite("ImpairmentProxy")
struct ImpairmentProxyTests {
    @Test("zero impairment: 5 000 datagrams arrive byte-identical, in order, counters exact")
    func zeroImpairment() throws {
        let sink = LoopUDP(), client = LoopUDP()
        let (proxy, port) = try makeProxy(target: sink.port)
        defer { proxy.stop() }
        let got = pump(proxy, port: port, client: client, sink: sink, count: 5_000)
        #expect(got.count == 5_000)
        #expect(got == (0..<5_000).map(payload))
        let s = proxy.statistics.toTarget
        #expect(s.received == 5_000 && s.forwarded == 5_000)
        #expect(s.dropped == 0 && s.duplicated == 0 && s.reordered == 0 && s.delayed == 0 && s.pending == 0 && s.failed == 0)
        #expect(proxy.statistics.udpSessions == 1)
    }

    @Test("loss 10 %: exact accounting, near 10 %, same seed → same drops")
    func seededLoss() throws {
        let n = 2_000
        func run(seed: UInt64) throws -> Set<Int> {
            let sink = LoopUDP(), client = LoopUDP()
            let (proxy, port) = try makeProxy(target: sink.port) { $0.loss = 0.1; $0.seed = seed }
            defer { proxy.stop() }
            let got = pump(proxy, port: port, client: client, sink: sink, count: n)
            for d in got { #expect(d == payload(sequence(of: d))) }
            let s = proxy.statistics.toTarget
            #expect(s.forwarded + s.dropped == s.received)
            #expect(s.received == UInt64(n))
            #expect(got.count == Int(s.forwarded))
            let dropped = Set(0..<n).subtracting(got.map(sequence))
            #expect(dropped.count == Int(s.dropped))
            #expect((120...280).contains(dropped.count), "dropped \(dropped.count) of \(n)")
            return dropped
        }
        let first = try run(seed: 42)
        let second = try run(seed: 42)
        #expect(first == second)
        // And it is exactly what the seeded planner predicts for positions 0..<n.
        var planner = ImpairmentPlanner(configuration: .init(target: .init(host: "127.0.0.1", port: 1), seed: 42, loss: 0.1), way: .toTarget)
        let predicted = Set((0..<n).filter { _ in planner.decide(arrival: 0) == .drop })
        #expect(first == predicted)
        #expect(try run(seed: 7) != first)
    }

    @Test("duplication: copies counted exactly and seen at the sink")
    func duplication() throws {
        let n = 1_000
        let sink = LoopUDP(), client = LoopUDP()
        let (proxy, port) = try makeProxy(target: sink.port) { $0.duplicate = 0.2; $0.seed = 3 }
        defer { proxy.stop() }
        let got = pump(proxy, port: port, client: client, sink: sink, count: n)
        let s = proxy.statistics.toTarget
        #expect(s.forwarded == UInt64(n))
        #expect(s.duplicated > 100 && s.duplicated < 300)
        #expect(got.count == n + Int(s.duplicated))
        var seen: [Int: Int] = [:]
        for d in got {
            #expect(d == payload(sequence(of: d)))
            seen[sequence(of: d), default: 0] += 1
        }
        #expect(seen.count == n)
        #expect(seen.values.filter { $0 == 2 }.count == Int(s.duplicated))
        #expect(seen.values.allSatisfy { $0 <= 2 })
    }

    @Test("reorder: held datagrams arrive after their successor; nothing lost or corrupted")
    func reorder() throws {
        let n = 1_000
        let sink = LoopUDP(), client = LoopUDP()
        let (proxy, port) = try makeProxy(target: sink.port) { $0.reorder = 0.1; $0.seed = 5; $0.reorderHoldMilliseconds = 500 }
        defer { proxy.stop() }
        let got = pump(proxy, port: port, client: client, sink: sink, count: n)
        let s = proxy.statistics.toTarget
        #expect(s.forwarded == UInt64(n) && s.failed == 0 && s.dropped == 0)
        #expect(got.count == n)
        #expect(Set(got.map(sequence)) == Set(0..<n))
        for d in got { #expect(d == payload(sequence(of: d))) }
        var highest = -1, late = 0
        for q in got.map(sequence) {
            if q < highest { late += 1 } else { highest = q }
        }
        #expect(s.reordered > 40 && s.reordered < 160, "reordered \(s.reordered)")
        #expect(late == Int(s.reordered))
    }

    @Test("delay and jitter: median added delay near the setting")
    func delayAndJitter() throws {
        // Sent 5 ms apart over 300 ms, not in one burst: a scheduling stall of the proxy's or this thread (tens of
        // ms on a loaded 2-core machine, as CI met) then lengthens the delays of the few datagrams it overlaps, not
        // of all of them at once, and the median and spread still read the proxy's schedule.
        let n = 60, spacingNanos: UInt64 = 5_000_000
        let sink = LoopUDP(), client = LoopUDP()
        let (proxy, port) = try makeProxy(target: sink.port) { $0.delayMilliseconds = 30; $0.jitterMilliseconds = 5 }
        defer { proxy.stop() }
        var sent: [Int: UInt64] = [:]
        var delays: [Double] = []
        func collect(_ d: (bytes: [UInt8], from: UInt16)) {
            delays.append(Double(MonotonicClock.nowNanos() - sent[sequence(of: d.bytes)]!) / 1e6)
        }
        let start = MonotonicClock.nowNanos()
        for i in 0..<n {
            sent[i] = MonotonicClock.nowNanos()
            client.send(payload(i), to: port)
            let next = start + UInt64(i + 1) * spacingNanos
            while case let now = MonotonicClock.nowNanos(), now < next {
                if let d = sink.receive(timeoutMs: Int32(max(1, (next - now) / 1_000_000))) { collect(d) }
            }
        }
        while delays.count < n, let d = sink.receive(timeoutMs: 1_000) { collect(d) }
        #expect(delays.count == n)
        let sorted = delays.sorted()
        let median = sorted[sorted.count / 2]
        #expect(median > 27 && median < 45, "median \(median) ms")
        #expect(sorted.first! >= 24.5, "min \(sorted.first!) ms")   // 30 − 5, less a little clock slack
        // Uniform ±5 ms: the middle half of 60 draws spans about 5 ms; a stall only widens it.
        #expect(sorted[3 * n / 4] - sorted[n / 4] > 2, "no visible jitter: \(sorted)")
        #expect(proxy.statistics.toTarget.delayed == UInt64(n))
    }

    @Test("TCP passthrough: 1 MB round-trips unchanged")
    func tcpPassthrough() throws {
        // An echo server on 127.0.0.1.
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(listener) }
        var a = loopback(0)
        _ = withUnsafePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        listen(listener, 4)
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &a) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &len) } }
        let echoDone = DispatchSemaphore(value: 0)
        Thread {
            let c = accept(listener, nil, nil)
            var buf = [UInt8](repeating: 0, count: 65_536)
            while c >= 0 {
                let n = read(c, &buf, buf.count)
                if n <= 0 { break }
                var off = 0
                while off < n { let w = buf.withUnsafeBytes { write(c, $0.baseAddress! + off, n - off) }; if w <= 0 { break }; off += w }
            }
            if c >= 0 { close(c) }
            echoDone.signal()
        }.start()

        let (proxy, port) = try makeProxy(target: UInt16(bigEndian: a.sin_port)) { $0.loss = 1 } // UDP only; TCP stays clean
        defer { proxy.stop() }

        let data = (0..<1_048_576).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ $0 >> 9) }
        let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(s) }
        var p = loopback(port)
        let r = withUnsafePointer(to: &p) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        #expect(r == 0)
        _ = fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK)
        var sentCount = 0, shut = false
        var back: [UInt8] = []
        back.reserveCapacity(data.count)
        var buf = [UInt8](repeating: 0, count: 65_536)
        let deadline = Date().addingTimeInterval(5)
        while back.count < data.count, Date() < deadline {
            var fd = pollfd(fd: s, events: Int16(POLLIN | (sentCount < data.count ? POLLOUT : 0)), revents: 0)
            _ = poll(&fd, 1, 100)
            if sentCount < data.count, fd.revents & Int16(POLLOUT) != 0 {
                let w = data.withUnsafeBytes { send(s, $0.baseAddress! + sentCount, min(65_536, data.count - sentCount), Int32(MSG_NOSIGNAL)) }
                if w > 0 { sentCount += w }
            }
            if sentCount == data.count, !shut { shutdown(s, Int32(SHUT_WR)); shut = true }
            if fd.revents & Int16(POLLIN | POLLHUP) != 0 {
                let n = read(s, &buf, buf.count)
                if n > 0 { back += buf[0..<n] } else if n == 0 { break }
            }
        }
        #expect(back.count == data.count)
        #expect(back == data)
        #expect(echoDone.wait(timeout: .now() + 3) == .success)
        #expect(wait { proxy.statistics.tcpBytesToTarget == 1_048_576 && proxy.statistics.tcpBytesFromTarget == 1_048_576 })
        #expect(wait { proxy.statistics.tcpConnectionsOpen == 0 })
        #expect(proxy.statistics.tcpConnectionsAccepted == 1)
    }

    @Test("reverse direction: the target's replies reach the client from the proxy's address")
    func replies() throws {
        let target = LoopUDP(), client = LoopUDP()
        let (proxy, port) = try makeProxy(target: target.port)
        defer { proxy.stop() }
        var upstreamPorts = Set<UInt16>()
        for i in 0..<200 {
            client.send(payload(i), to: port)
            let q = try #require(target.receive(timeoutMs: 1_000))
            #expect(q.bytes == payload(i))
            upstreamPorts.insert(q.from)
            target.send(Array(q.bytes.reversed()), to: q.from)
            let a = try #require(client.receive(timeoutMs: 1_000))
            #expect(a.from == port)
            #expect(a.bytes == Array(payload(i).reversed()))
        }
        #expect(upstreamPorts.count == 1 && !upstreamPorts.contains(port))
        #expect(wait { proxy.statistics.fromTarget.forwarded == 200 && proxy.statistics.toTarget.forwarded == 200 })
    }

    @Test("direction: only the chosen direction is impaired")
    func directionGate() throws {
        let target = LoopUDP(), client = LoopUDP()
        let (proxy, port) = try makeProxy(target: target.port) { $0.loss = 1; $0.direction = .fromTarget }
        defer { proxy.stop() }
        for i in 0..<50 {
            client.send(payload(i), to: port)
            let q = try #require(target.receive(timeoutMs: 1_000))
            #expect(q.bytes == payload(i))
            target.send(q.bytes, to: q.from)
        }
        #expect(wait { proxy.statistics.fromTarget.received == 50 })
        #expect(client.receive(timeoutMs: 50) == nil)
        let s = proxy.statistics
        #expect(s.toTarget.forwarded == 50 && s.toTarget.dropped == 0)
        #expect(s.fromTarget.dropped == 50 && s.fromTarget.forwarded == 0)
    }

    @Test("refuses addresses outside loopback and the test range; never sends there")
    func refusesForeignAddresses() throws {
        func attempt(listen: String, target: String) -> ImpairmentError? {
            do {
                let c = ImpairmentProxy.Configuration(listen: try .init(parsing: listen), target: try .init(parsing: target))
                _ = try ImpairmentProxy(configuration: c)
                return nil
            } catch { return error }
        }
        let e = attempt(listen: "8.8.8.8:1", target: "127.0.0.1:7001")
        #expect(e == .addressNotAllowed(role: "listen", address: "8.8.8.8:1"))
        #expect(e?.description.contains("127.0.0.0/8") == true)
        #expect(attempt(listen: "0.0.0.0:7000", target: "127.0.0.1:7001") == .addressNotAllowed(role: "listen", address: "0.0.0.0:7000"))
        #expect(attempt(listen: "127.0.0.1:0", target: "10.1.2.3:7001") == .addressNotAllowed(role: "target", address: "10.1.2.3:7001"))
        #expect(attempt(listen: "127.0.0.1:0", target: "198.20.0.1:7001") == .addressNotAllowed(role: "target", address: "198.20.0.1:7001"))
        #expect(attempt(listen: "127.0.0.1:0", target: "198.19.255.1:7001") == nil)
        #expect(attempt(listen: "127.3.4.5:0", target: "198.18.0.2:7001") == nil)
        #expect(attempt(listen: "127.0.0.1:7001", target: "127.0.0.1:7001") != nil)
    }

    @Test("mesh-impair: bad flag exits 2, --help 0, SIGTERM prints final JSON and exits 0")
    func commandLine() throws {
        let exe = builtProduct("mesh-impair")
        func run(_ args: [String]) throws -> Int32 {
            let p = Process()
            p.executableURL = exe
            p.arguments = args
            p.standardError = FileHandle.nullDevice
            p.standardOutput = FileHandle.nullDevice
            try p.run()
            p.waitUntilExit()
            return p.terminationStatus
        }
        #expect(try run(["--bogus"]) == 2)
        #expect(try run(["--target", "127.0.0.1:7001", "--loss", "150%"]) == 2)
        #expect(try run(["--help"]) == 0)

        let sink = LoopUDP()
        let p = Process()
        p.executableURL = exe
        p.arguments = ["--target", "127.0.0.1:\(sink.port)", "--loss", "0.5", "--seed", "1"]
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        ChildLedger.record(p.processIdentifier)
        defer { if p.isRunning { kill(p.processIdentifier, SIGKILL) } }
        // Read stderr until the "listening" line.
        var text = ""
        let deadline = Date().addingTimeInterval(5)
        while !text.contains("listening "), Date() < deadline {
            let d = err.fileHandleForReading.availableData
            if d.isEmpty { break }
            text += String(decoding: d, as: UTF8.self)
        }
        let line = try #require(text.split(separator: "\n").first { $0.hasPrefix("listening ") })
        let port = try #require(UInt16(line.split(separator: ":").last!))
        let client = LoopUDP()
        for i in 0..<100 { client.send(payload(i), to: port) }
        var arrived = 0
        #expect(wait { arrived += sink.drain().count; return arrived >= 25 }, "only \(arrived) of ~50 arrived")
        usleep(100_000)
        kill(p.processIdentifier, SIGTERM)
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)
        let json = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let last = try #require(json.split(separator: "\n").last)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(last.utf8)) as? [String: Any])
        #expect(object["kind"] as? String == "final")
        let to = try #require(object["toTarget"] as? [String: Any])
        #expect(to["received"] as? Int == 100)
        #expect((to["forwarded"] as? Int ?? 0) + (to["dropped"] as? Int ?? 0) == 100)
    }

    @Test("schedule (pure, virtual time): hold-back releases after the successor or at the hold deadline")
    func scheduleVirtualTime() {
        var c = ImpairmentProxy.Configuration(target: .init(host: "127.0.0.1", port: 1))
        c.reorder = 1            // every datagram wants to be held
        c.reorderHoldMilliseconds = 10
        var s = ImpairmentSchedule<Int>(configuration: c)
        func incoming(_ n: Int) -> ImpairmentSchedule<Int>.Incoming { .init(way: .toTarget, flow: 1, bytes: [UInt8(n)], outlet: n) }
        #expect(s.takeDue(now: 0).next == nil) // the scheduler goes idle
        // #0 is held; #1 releases it (sent #1 then #0); #2 is held again.
        let a = s.admit([incoming(0), incoming(1), incoming(2)], now: 1_000)
        #expect(a.immediate.map(\.outlet) == [1, 0])
        #expect(a.wakeScheduler)
        s.finish(a.immediate.map { .init(way: $0.way, delivered: true, extraCopiesDelivered: 0) })
        #expect(s.stats.toTarget.reordered == 1 && s.stats.toTarget.pending == 1)
        // Before the deadline nothing is due; at it, #2 goes alone and is not counted as reordered.
        #expect(s.takeDue(now: 5_000_000).entries.isEmpty)
        let due = s.takeDue(now: 1_000 + 10_000_000)
        #expect(due.entries.map(\.outlet) == [2] && due.next == nil)
        s.finish(due.entries.map { .init(way: $0.way, delivered: true, extraCopiesDelivered: 0) })
        let st = s.stats.toTarget
        #expect(st.received == 3 && st.forwarded == 3 && st.reordered == 1 && st.pending == 0)
    }

    @Test("audio drops are told apart by the clear datagram header: magic PM, version 2, 3 or 4, kind data")
    func peerMeshDataByHeader() {
        func datagram(_ magic: [UInt8] = [0x50, 0x4d], version: UInt8, kind: UInt8, size: Int = 40) -> [UInt8] {
            magic + [version, kind] + [UInt8](repeating: 7, count: size - 4)
        }
        #expect(ImpairmentSchedule<Int>.isPeerMeshData(datagram(version: 2, kind: 1)))
        #expect(ImpairmentSchedule<Int>.isPeerMeshData(datagram(version: 3, kind: 1)))
        #expect(ImpairmentSchedule<Int>.isPeerMeshData(datagram(version: 4, kind: 1)), "the current version")
        #expect(!ImpairmentSchedule<Int>.isPeerMeshData(datagram(version: 1, kind: 1)))
        #expect(!ImpairmentSchedule<Int>.isPeerMeshData(datagram(version: 5, kind: 1)), "a layout it does not know")
        #expect(!ImpairmentSchedule<Int>.isPeerMeshData(datagram(version: 255, kind: 1)))
        #expect(!ImpairmentSchedule<Int>.isPeerMeshData(datagram(version: 4, kind: 2)), "a ping is not audio")
        #expect(!ImpairmentSchedule<Int>.isPeerMeshData(datagram([0x50, 0x4e], version: 4, kind: 1)))
        #expect(!ImpairmentSchedule<Int>.isPeerMeshData(datagram(version: 4, kind: 1, size: 20)), "a header alone")
    }

    @Test("the JSON line carries every counter under its field name, both directions included")
    func statisticsJSONLine() throws {
        var st = ImpairmentProxy.Statistics()
        st.toTarget.received = 10; st.toTarget.forwarded = 7; st.toTarget.dropped = 2
        st.toTarget.droppedPeerMeshData = 2; st.toTarget.trailingDroppedPeerMeshData = 1; st.toTarget.failed = 1
        st.fromTarget.duplicated = 4; st.fromTarget.reordered = 5; st.fromTarget.delayed = 6; st.fromTarget.pending = 8
        st.udpSessions = 1; st.tcpConnectionsAccepted = 3; st.tcpConnectionsOpen = 2
        st.tcpBytesToTarget = 100; st.tcpBytesFromTarget = 200
        let line = st.jsonLine(kind: "final")
        #expect(line.hasPrefix(#"{"kind":"final","toTarget":{"received":10,"forwarded":7,"dropped":2,"#))
        let o = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        let to = try #require(o["toTarget"] as? [String: Any]), from = try #require(o["fromTarget"] as? [String: Any])
        #expect(to["trailingDroppedPeerMeshData"] as? Int == 1 && to["failed"] as? Int == 1 && to["pending"] as? Int == 0)
        #expect(from["duplicated"] as? Int == 4 && from["reordered"] as? Int == 5 && from["delayed"] as? Int == 6)
        #expect(from["pending"] as? Int == 8 && from.count == 10 && to.count == 10)
        #expect(o["udpSessions"] as? Int == 1 && o["tcpConnectionsAccepted"] as? Int == 3 && o["tcpConnectionsOpen"] as? Int == 2)
        #expect(o["tcpBytesToTarget"] as? Int == 100 && o["tcpBytesFromTarget"] as? Int == 200 && o.count == 8)
    }
}
