import Foundation
import Glibc
import Synchronization
import Testing
import MeshPOSIX
@testable import MeshCLI

/// The host's control socket belongs to one host at a time: a second host is refused while the first runs, and of
/// hosts started in the same instant exactly one gets it, keeps it, and removes it when it stops.
@Suite struct ControlServerTests {
    /// A fresh runtime directory of this test's own (0700), removed at the end.
    private static func withRuntime(_ body: (RuntimeDirectory) throws -> Void) throws {
        let path = FileManager.default.temporaryDirectory.path + "/pm-ctl-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: path) }
        try body(RuntimeDirectory(path))
    }

    private static func answering(_ name: String) -> @Sendable (ControlCommand) -> ControlReply {
        { _ in ControlReply(ok: true, [name]) }
    }

    @Test func aSecondHostIsRefusedAndTheFirstKeepsTheSocket() throws {
        try Self.withRuntime { runtime in
            let first = try ControlServer(directory: runtime, handler: Self.answering("first"))
            do {
                _ = try ControlServer(directory: runtime, handler: Self.answering("second"))
                Issue.record("a second host got the control socket while the first runs")
            } catch let error as SyscallError {
                #expect(error.code == EADDRINUSE)
                #expect(error.call.contains("another mesh-record host"), "\(error)")
            }
            #expect(try ControlClient.send(.status, to: runtime) == ControlReply(ok: true, ["first"]))

            first.stop()
            #expect(!FileManager.default.fileExists(atPath: runtime.socketPath), "the socket is removed when its host stops")
            let next = try ControlServer(directory: runtime, handler: Self.answering("next"))
            #expect(try ControlClient.send(.status, to: runtime) == ControlReply(ok: true, ["next"]))
            next.stop()
        }
    }

    /// The race the claim closes: every host found no host answering, unlinked the socket file and bound its own, so
    /// several "got" the socket and the one that answered was whichever bound last.
    @Test func ofHostsStartedAtOnceExactlyOneGetsTheSocket() throws {
        let contenders = 6
        for round in 0..<20 {
            try Self.withRuntime { runtime in
                let ready = Atomic<Int>(0)
                let winners = Mutex<[(Int, ControlServer)]>([])
                let failures = Mutex<[String]>([])
                let done = DispatchGroup()
                for i in 0..<contenders {
                    done.enter()
                    Thread.detachNewThread {
                        defer { done.leave() }
                        // Start together: spin until every contender is there.
                        ready.add(1, ordering: .acquiringAndReleasing)
                        while ready.load(ordering: .acquiring) < contenders {}
                        do {
                            let server = try ControlServer(directory: runtime, handler: Self.answering("host \(i)"))
                            winners.withLock { $0.append((i, server)) }
                        } catch let error as SyscallError where error.code == EADDRINUSE {
                            // Refused, as it should be while another holds the socket.
                        } catch {
                            failures.withLock { $0.append("host \(i): \(error)") }
                        }
                    }
                }
                #expect(done.wait(timeout: .now() + 30) == .success, "round \(round): contenders did not finish")
                let won = winners.withLock { $0 }
                #expect(failures.withLock { $0 }.isEmpty, "round \(round): \(failures.withLock { $0 })")
                #expect(won.count == 1, "round \(round): \(won.count) hosts got the control socket")
                if let (winner, _) = won.first {
                    let answer = try ControlClient.send(.status, to: runtime)
                    #expect(answer == ControlReply(ok: true, ["host \(winner)"]), "round \(round): the socket answers for its holder")
                }
                for (_, server) in won { server.stop() }
                #expect(!FileManager.default.fileExists(atPath: runtime.socketPath), "round \(round): socket left behind")
            }
        }
    }

    @Test func aLockFileThatIsASymbolicLinkIsNotFollowed() throws {
        try Self.withRuntime { runtime in
            try PrivateFile.ensureDirectory(runtime.path)
            let target = runtime.path + "/elsewhere"
            try FileManager.default.createSymbolicLink(atPath: runtime.lockPath, withDestinationPath: target)
            #expect(throws: SyscallError.self) { try ControlServer(directory: runtime, handler: Self.answering("host")) }
            #expect(!FileManager.default.fileExists(atPath: target), "no file was created through the link")
        }
    }
}
