/// Misuse of a source's or sink's lifecycle.
public enum AudioStageError: Error, Equatable, Sendable, CustomStringConvertible {
    /// `start` was called on a stage that has already been stopped; stages run once.
    case restartNotSupported(stage: String)

    public var description: String {
        switch self {
        case .restartNotSupported(let stage): "\(stage) was stopped and cannot be restarted; create a new one"
        }
    }
}
