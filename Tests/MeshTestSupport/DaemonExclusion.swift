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
        try await AsyncExclusion.avahiDaemon.holding(exclusively: true, function)
    }
}

/// Tests that use the shared avahi-daemon and would fail if a test stopped it meanwhile (the CLI suites that find
/// hosts by DNS-SD): they share it with each other, and wait while an `.avahiDaemonExclusive` test has it (one that
/// stops it, say), which in turn waits until they are done.
///
/// Apply `.avahiDaemonShared` to a suite; a test of it that is `.avahiDaemonExclusive` itself takes the daemon
/// exclusively instead.
package struct AvahiDaemonShared: SuiteTrait, TestTrait, TestScoping {
    package var isRecursive: Bool { true }

    package func scopeProvider(for test: Test, testCase: Test.Case?) -> Self? {
        guard testCase != nil, !test.traits.contains(where: { $0 is AvahiDaemonExclusive }) else { return nil }
        return self
    }

    package func provideScope(for test: Test, testCase: Test.Case?,
                              performing function: @Sendable () async throws -> Void) async throws {
        try await AsyncExclusion.avahiDaemon.holding(exclusively: false, function)
    }
}

extension Trait where Self == AvahiDaemonExclusive {
    /// The test (or each test of the suite) has the shared avahi-daemon to itself.
    package static var avahiDaemonExclusive: Self { AvahiDaemonExclusive() }
}

extension Trait where Self == AvahiDaemonShared {
    /// The test (or each test of the suite) uses the shared avahi-daemon: no exclusive test runs meanwhile.
    package static var avahiDaemonShared: Self { AvahiDaemonShared() }
}

/// A first-come, first-served asynchronous readers–writer exclusion: any number of shared holders at once, or one
/// exclusive holder. Whoever waits is admitted in arrival order, so an exclusive waiter is not starved by shared
/// holders that keep coming: they queue behind it.
package actor AsyncExclusion {
    /// The one that guards the rig's avahi-daemon.
    package static let avahiDaemon = AsyncExclusion()

    private var sharedHolders = 0
    private var exclusiveHeld = false
    private var waiters: [(exclusive: Bool, resume: CheckedContinuation<Void, Never>)] = []

    /// Runs `body` holding the exclusion (exclusively, or shared), and releases it however `body` ends.
    package func holding(exclusively: Bool, _ body: @Sendable () async throws -> Void) async throws {
        await acquire(exclusively: exclusively)
        do {
            try await body()
        } catch {
            release(exclusively: exclusively)
            throw error
        }
        release(exclusively: exclusively)
    }

    package func acquire(exclusively: Bool) async {
        if waiters.isEmpty && !exclusiveHeld && (!exclusively || sharedHolders == 0) {
            take(exclusively: exclusively)
            return
        }
        await withCheckedContinuation { waiters.append((exclusively, $0)) }
    }

    package func release(exclusively: Bool) {
        if exclusively { exclusiveHeld = false } else { sharedHolders -= 1 }
        // Admit from the front: one exclusive waiter once nobody holds it, or every shared waiter up to the next
        // exclusive one while nobody holds it exclusively.
        while let next = waiters.first, !exclusiveHeld, !next.exclusive || sharedHolders == 0 {
            take(exclusively: next.exclusive)
            waiters.removeFirst().resume.resume()
            if next.exclusive { break }
        }
    }

    private func take(exclusively: Bool) {
        if exclusively { exclusiveHeld = true } else { sharedHolders += 1 }
    }
}
