/// The arithmetic of a ration: `burst` charges at once, then one per `interval`, kept as a debt (GCRA's virtual
/// scheduling time): the time at which the charges made so far are paid off. Each charge moves the debt one interval
/// on from at least now; the burst is used up while the debt runs more than `burst − 1` intervals ahead of now.
/// Shared by the advertiser's tries per address and the inviter's shares of the digits given away unanswered.
struct RationPace: Equatable, Sendable {
    /// Charges at once.
    let burst: Int
    /// After the burst, one charge per this interval.
    let interval: Nanos

    init(burst: Int, interval: Nanos) {
        precondition(burst >= 1 && interval > 0)
        let window = interval.multipliedReportingOverflow(by: Nanos(burst))
        precondition(!window.overflow && window.partialValue < Nanos.max / 4, "the ration's window must not wrap the clock")
        self.burst = burst
        self.interval = interval
    }

    /// The debt after one more charge at `now`.
    func charged(_ debt: Nanos, now: Nanos) -> Nanos { max(debt, now) &+ interval }

    /// Whether a ration whose debt is `debt` has used its burst as of `now`.
    func isRationed(_ debt: Nanos, now: Nanos) -> Bool { debt > now &+ Nanos(burst - 1) &* interval }

    /// The earliest time at which a ration whose debt is `debt` may take another charge.
    func nextCharge(after debt: Nanos) -> Nanos {
        let early = Nanos(burst - 1) &* interval
        return debt > early ? debt - early : 0
    }
}
