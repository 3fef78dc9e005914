// The one file that calls libqrencode.
import CQRencode

/// A QR code drawn with Unicode half blocks: two modules per character row, with the 4-module quiet zone the
/// standard asks for, dark on light (so it scans on a dark terminal too).
package enum QRCode {
    /// The lines to print for `text`, or nil when libqrencode cannot encode it.
    package static func lines(for text: String) -> [String]? {
        guard let code = QRcode_encodeString(text, 0, QR_ECLEVEL_M, QR_MODE_8, 1) else { return nil }
        defer { QRcode_free(code) }
        let width = Int(code.pointee.width)
        let data = code.pointee.data!
        let quiet = 4
        let size = width + 2 * quiet
        func dark(_ x: Int, _ y: Int) -> Bool {
            let (mx, my) = (x - quiet, y - quiet)
            guard mx >= 0, my >= 0, mx < width, my < width else { return false }
            return data[my * width + mx] & 1 == 1
        }
        var out: [String] = []
        var y = 0
        while y < size {
            var line = ""
            for x in 0..<size {
                // Light modules are drawn as blocks, dark ones as spaces: the code is "dark on light" on any background.
                switch (!dark(x, y), y + 1 < size && !dark(x, y + 1)) {
                case (true, true): line += "█"
                case (true, false): line += "▀"
                case (false, true): line += "▄"
                case (false, false): line += " "
                }
            }
            out.append(line)
            y += 2
        }
        return out
    }

    /// The modules of the code for `text` (true = dark), for tests.
    package static func modules(for text: String) -> [[Bool]]? {
        guard let code = QRcode_encodeString(text, 0, QR_ECLEVEL_M, QR_MODE_8, 1) else { return nil }
        defer { QRcode_free(code) }
        let width = Int(code.pointee.width)
        return (0..<width).map { y in (0..<width).map { x in code.pointee.data[y * width + x] & 1 == 1 } }
    }
}
