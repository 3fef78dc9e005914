import Foundation
import Testing

/// What the shipped binaries may link. Importing full `Foundation` anywhere in their modules links Foundation's
/// internationalization and ICU statically: 78.6 MB binaries instead of 29.3 MB, and about 6 MB more resident.
@Suite("Dependencies of the shipped code")
struct DependencyTests {
    /// The package's `Sources` folder.
    static let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Sources")

    /// Developer tools that are not shipped and may use full Foundation (`Process`, `FileHandle`), and
    /// `PeerMeshFoundation`, the opt-in library that gives apps Foundation's `Progress` (no shipped binary links it).
    static let tools: Set<String> = ["mesh-bench", "peermesh-probe", "peermesh-fuzz", "PeerMeshFoundation"]

    @Test("no shipped target depends on PeerMeshFoundation (only apps and tests opt in)")
    func nothingShippedLinksFullFoundation() throws {
        let manifest = try String(contentsOf: Self.sources.deletingLastPathComponent().appendingPathComponent("Package.swift"),
                                  encoding: .utf8)
        let uses = manifest.split(separator: "\n").filter { $0.contains("\"PeerMeshFoundation\"") }
        #expect(uses.count == 3, "the product, the target, the test target: \(uses)")
        #expect(uses.allSatisfy { $0.contains(".library(") || $0.contains(".target(name: \"PeerMeshFoundation\"") || $0.contains(".testTarget(") })
    }

    @Test("the libraries and the shipped CLIs import FoundationEssentials, never Foundation")
    func onlyFoundationEssentials() throws {
        let fm = FileManager.default
        let modules = try fm.contentsOfDirectory(atPath: Self.sources.path).filter { !Self.tools.contains($0) }
        #expect(modules.contains("MeshRelay") && modules.contains("mesh-record"), "found the sources: \(modules)")
        var checked = 0
        var offenders: [String] = []
        for module in modules {
            let root = Self.sources.appendingPathComponent(module)
            guard let walker = fm.enumerator(atPath: root.path) else { continue }
            for case let file as String in walker where file.hasSuffix(".swift") {
                let text = try String(contentsOf: root.appendingPathComponent(file), encoding: .utf8)
                checked += 1
                if text.split(separator: "\n").contains(where: { $0.trimmingCharacters(in: .whitespaces) == "import Foundation" }) {
                    offenders.append("\(module)/\(file)")
                }
            }
        }
        #expect(checked > 100)
        #expect(offenders == [], "import FoundationEssentials (and Glibc/Dispatch) instead")
    }
}
