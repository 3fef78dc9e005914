import Testing
import MeshTestSupport

/// The retry rule the sample-exact rig tests rely on: only a disturbed attempt runs again, at most `attempts` times,
/// and the last attempt's result is what the test then checks.
@Suite("undisturbed (test support)")
struct UndisturbedTests {
    @Test func anUndisturbedAttemptIsTheOnlyOne() {
        var runs = 0
        let result = undisturbed("quiet") { () -> (result: Int, disturbance: String?) in runs += 1; return (runs, nil) }
        #expect(runs == 1 && result == 1)
    }

    @Test func disturbedAttemptsRunAgainUntilOneIsNot() {
        var runs = 0
        let result = undisturbed("noisy once") { () -> (result: Int, disturbance: String?) in
            runs += 1
            return (runs, runs == 1 ? "xruns: 1" : nil)
        }
        #expect(runs == 2 && result == 2)
    }

    @Test func whenEveryAttemptIsDisturbedTheLastOneIsReturned() {
        var runs = 0
        let result = undisturbed("noisy", attempts: 3) { () -> (result: Int, disturbance: String?) in runs += 1; return (runs, "xruns: 1") }
        #expect(runs == 3 && result == 3)
    }

    @Test func byDefaultADisturbedAttemptIsRunOnceMore() {
        var runs = 0
        let result = undisturbed("noisy twice") { () -> (result: Int, disturbance: String?) in runs += 1; return (runs, "xruns: 1") }
        #expect(runs == 2 && result == 2)
    }
}
