import Testing

/// Tests that need the shared avahi-daemon to themselves: the ones that stop or restart it, and the in-process
/// discovery tests that a stopped daemon would break (a publication's `lost` never arrives, a browser finds a
/// service twice). Swift Testing runs suites of every test target in parallel in one process, so a `.serialized`
/// suite alone does not keep a test of another target (`mesh-record` started before the daemon) out of its way.
///
/// Apply `.avahiDaemonExclusive` to a suite (each of its tests takes the daemon in turn) or to one test. Waiting is
/// asynchronous: no thread of the cooperative pool is blocked.
package struct AvahiDaemonExclusive: SuiteTrait, TestTrait, TestScoping {
    package var isRecursive: Bool { true }

    /// Scopes each test case, not the suite around them (the exclusion is not re-entrant).
    package func scopeProvider(for test: Test, testCase: Test.Case?) -> Self? { testCase == nil ? nil : self }

    package func provideScope(for test: Test, testCase: Test.Case?,
                              performing function: @Sendable () async throws -> Void) async throws {
        await AsyncExclusion.avahiDaemon.acquire()
        do {
            try await function()
        } catch {
            await AsyncExclusion.avahiDaemon.release()
            throw error
        }
        await AsyncExclusion.avahiDaemon.release()
    }
}

extension Trait where Self == AvahiDaemonExclusive {
    /// The test (or each test of the suite) has the shared avahi-daemon to itself.
    package static var avahiDaemonExclusive: Self { AvahiDaemonExclusive() }
}

/// A first-come, first-served asynchronous mutual exclusion.
package actor AsyncExclusion {
    /// The one that guards the rig's avahi-daemon.
    package static let avahiDaemon = AsyncExclusion()

    private var held = false
    private var waiters: [CheckedContinuation<Void, Never>] = []

    package func acquire() async {
        guard held else {
            held = true
            return
        }
        await withCheckedContinuation { waiters.append($0) }
    }

    package func release() {
        if waiters.isEmpty { held = false } else { waiters.removeFirst().resume() }
    }
}
