#if canImport(Glibc)
import Glibc
#endif

/// Writes diagnostic lines to file descriptor 2. Not for real-time threads (it may block on the terminal).
enum StandardError {
    /// Writes `line` and a newline to stderr in one `write(2)`.
    static func writeLine(_ line: String) {
        var text = line
        text.append("\n")
        text.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = write(2, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0 && errno == EINTR { continue }
                if written <= 0 { return }
                offset += written
            }
        }
    }
}
