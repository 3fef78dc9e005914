import Foundation
import Testing
@testable import PeerMesh

// Pure tests of PeerID, MC's service-type and discovery-info rules, and PeerEndpoint parsing.

/// The error `body` throws, or nil.
private func thrown(_ body: () throws -> Void) -> PeerMeshError? {
    do { try body(); return nil } catch let e as PeerMeshError { return e } catch {
        Issue.record("unexpected error type: \(error)")
        return nil
    }
}

@Suite struct IdentityAndValidationTests {

    // MARK: PeerID

    @Test(arguments: ["a", "Ann", "é", "🎧", String(repeating: "x", count: 63), String(repeating: "é", count: 31) + "x",
                      String(repeating: "🎧", count: 15) + "abc", "with space", "a.b-c_d"])
    func validDisplayNames(_ name: String) throws {
        let p = try PeerID(displayName: name)
        #expect(p.displayName == name)
        #expect(p.identity != 0)
        #expect(name.utf8.count <= PeerID.maximumDisplayNameBytes)
    }

    @Test(arguments: ["", String(repeating: "x", count: 64), String(repeating: "é", count: 32), // 64 bytes, 32 chars
                      String(repeating: "🎧", count: 16), String(repeating: "x", count: 62) + "é", String(repeating: "x", count: 1000)])
    func invalidDisplayNames(_ name: String) {
        let e = thrown { _ = try PeerID(displayName: name, identity: 5) }
        #expect(e == .invalidDisplayName("display name must be 1–63 UTF-8 bytes, got \(name.utf8.count)"))
        #expect(e?.description.contains("1–63 UTF-8 bytes") == true)
        #expect(thrown { _ = try PeerID(displayName: name) } != nil)
        #expect(thrown { try PeerID.validate(displayName: name) } == e)
    }

    @Test func equalityAndHashUseIdentityOnly() throws {
        let a = try PeerID(displayName: "same", identity: 1)
        let b = try PeerID(displayName: "same", identity: 2)
        let c = try PeerID(displayName: "other", identity: 1)
        #expect(a != b)
        #expect(a == c)
        #expect(a.hashValue == c.hashValue)
        #expect(Set([a, b, c]).count == 2)
        #expect(Dictionary([(a, 1), (c, 2)], uniquingKeysWith: { $1 })[a] == 2)
        // Fresh identities are random and never 0.
        let many = try (0..<200).map { _ in try PeerID(displayName: "same") }
        #expect(Set(many).count == 200)
    }

    @Test func identityString() throws {
        #expect(try PeerID(displayName: "a", identity: 1).identityString == "0000000000000001")
        #expect(try PeerID(displayName: "a", identity: .max).identityString == "ffffffffffffffff")
        #expect(try PeerID(displayName: "a", identity: 0x00ab_cdef_0123_4567).identityString == "00abcdef01234567")
        #expect(try PeerID(displayName: "Ann", identity: 10).description == "Ann [000000000000000a]")
        for id in [UInt64(1), 0xabc, .max, 0x8000_0000_0000_0000] {
            #expect(PeerID.identity(fromString: try PeerID(displayName: "a", identity: id).identityString) == id)
        }
        #expect(PeerID.identity(fromString: "FFFFFFFFFFFFFFFF") == .max)
        for bad in ["", "1", "fffffffffffffffff", "+00000000000000a", "-00000000000000a", "00000000000000g0", "0x000000000000000",
                    " 000000000000001", "000000000000001\n", "00000000000000é"] {
            #expect(PeerID.identity(fromString: bad) == nil, "\(bad)")
        }
    }

    @Test func codableRoundTripKeepsIdentity() throws {
        for id in [UInt64(1), 0x1234_5678_9abc_def0, .max, UInt64(1) << 53 + 1] {
            let p = try PeerID(displayName: "Zoë 🎧", identity: id)
            let data = try JSONEncoder().encode(p)
            let back = try JSONDecoder().decode(PeerID.self, from: data)
            #expect(back == p)
            #expect(back.identity == id)
            #expect(back.displayName == "Zoë 🎧")
        }
        let fresh = try PeerID(displayName: "x")
        #expect(try JSONDecoder().decode([PeerID].self, from: JSONEncoder().encode([fresh]))[0].identity == fresh.identity)
    }

    @Test func decodingABadNameFails() throws {
        let long = String(repeating: "n", count: 64)
        let json = Data(#"{"displayName":"\#(long)","identity":7}"#.utf8)
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(PeerID.self, from: json) }
        do {
            _ = try JSONDecoder().decode(PeerID.self, from: json)
        } catch DecodingError.dataCorrupted(let ctx) {
            #expect(ctx.debugDescription.contains("1–63 UTF-8 bytes"))
        } catch {
            Issue.record("unexpected error \(error)")
        }
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(PeerID.self, from: Data(#"{"displayName":"","identity":7}"#.utf8)) }
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(PeerID.self, from: Data(#"{"displayName":"a"}"#.utf8)) }
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(PeerID.self, from: Data(#"{"displayName":"a","identity":-1}"#.utf8)) }
        let ok = try JSONDecoder().decode(PeerID.self, from: Data(#"{"displayName":"a","identity":7}"#.utf8))
        #expect(ok.identity == 7 && ok.displayName == "a")
    }

    // MARK: Service type

    @Test(arguments: ["a", "z", "abc", "mesh-audio", "a1", "1a", "0-a", "a-b-c-d-e-f-g-h", "abcdefghijklmno", "x9-9x", "23456789012345a"])
    func validServiceTypes(_ type: String) {
        #expect(thrown { try DiscoveryValidation.validate(serviceType: type) } == nil, "\(type)")
    }

    @Test(arguments: [
        ("", "1–15 characters"),
        ("abcdefghijklmnop", "1–15 characters"),
        ("aaaaaaaaaaaaaaaaaaaaaaaa", "1–15 characters"),
        ("Mesh", "only a-z, 0-9 and '-'"),
        ("mesh_audio", "only a-z, 0-9 and '-'"),
        ("mesh audio", "only a-z, 0-9 and '-'"),
        ("mesh.audio", "only a-z, 0-9 and '-'"),
        ("mésh", "only a-z, 0-9 and '-'"),
        ("_mesh", "only a-z, 0-9 and '-'"),
        ("123", "at least one letter"),
        ("1-2", "at least one letter"),
        ("-", "at least one letter"),
        ("-mesh", "begin or end with '-'"),
        ("mesh-", "begin or end with '-'"),
        ("a--b", "'--'"),
        ("mesh--audio", "'--'"),
    ])
    func invalidServiceTypes(_ type: String, _ rule: String) {
        let e = thrown { try DiscoveryValidation.validate(serviceType: type) }
        guard case .invalidServiceType(let text)? = e else {
            Issue.record("\(type): expected invalidServiceType, got \(String(describing: e))")
            return
        }
        #expect(text.contains(rule), "\(type): \(text)")
        #expect(text.contains("\"\(type)\""), "\(type): \(text)")
    }

    // MARK: Discovery info

    @Test func validDiscoveryInfo() {
        let cases: [[String: String]] = [
            [:],
            ["k": ""],
            ["k": "v=with=equals"],
            ["_private": "x"],
            [String(repeating: "k", count: 127): String(repeating: "v", count: 127)],   // exactly 255
            ["a": String(repeating: "v", count: 198), "b": String(repeating: "v", count: 198)], // exactly 400
            ["é": String(repeating: "é", count: 126)],                                    // 2+1+252 = 255 bytes
        ]
        for info in cases { #expect(thrown { try DiscoveryValidation.validate(discoveryInfo: info) } == nil, "\(info)") }
    }

    @Test func invalidDiscoveryInfo() {
        func text(_ info: [String: String]) -> String? {
            if case .invalidDiscoveryInfo(let t)? = thrown({ try DiscoveryValidation.validate(discoveryInfo: info) }) { t } else { nil }
        }
        let entry = text([String(repeating: "k", count: 128): String(repeating: "v", count: 127)])
        #expect(entry?.contains("256 bytes") == true && entry?.contains("at most 255 UTF-8 bytes") == true, "\(entry ?? "no error")")
        // The escaped '_' counts.
        let escaped = text(["_" + String(repeating: "k", count: 126): String(repeating: "v", count: 127)])
        #expect(escaped?.contains("256 bytes") == true, "\(escaped ?? "no error")")
        // Multi-byte characters count in bytes.
        #expect(text(["k": String(repeating: "é", count: 127)])?.contains("at most 255 UTF-8 bytes") == true)
        let total = text(["a": String(repeating: "v", count: 198), "b": String(repeating: "v", count: 199)])
        #expect(total?.contains("401 bytes in all") == true && total?.contains("at most 400") == true, "\(total ?? "no error")")
        let empty = text(["": "v"])
        #expect(empty?.contains("non-empty") == true, "\(empty ?? "no error")")
        let eq = text(["a=b": "v"])
        #expect(eq?.contains("no '='") == true && eq?.contains("\"a=b\"") == true, "\(eq ?? "no error")")
    }

    // MARK: PeerEndpoint

    @Test(arguments: [
        ("127.0.0.1:4000", "127.0.0.1", UInt16(4000)),
        ("10.200.0.2:1", "10.200.0.2", 1),
        ("127.0.0.1:65535", "127.0.0.1", 65535),
        ("localhost:80", "127.0.0.1", 80),
        ("[::1]:9000", "::1", 9000),
        ("[fe80::1%lo]:7", "fe80::1%lo", 7),
        ("[localhost]:80", "127.0.0.1", 80),
        ("host.example:22", "host.example", 22),
    ])
    func validEndpoints(_ s: String, _ host: String, _ port: UInt16) {
        let e = PeerEndpoint(parsing: s)
        #expect(e == PeerEndpoint(host: host, port: port), "\(s)")
        if let e { #expect(PeerEndpoint(parsing: e.description) == e, "\(s) → \(e.description)") }
    }

    @Test(arguments: ["", ":", "127.0.0.1", "127.0.0.1:", ":4000", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:-1",
                      "127.0.0.1:+80", "127.0.0.1: 80", "127.0.0.1:80 ", "127.0.0.1:8a", "[::1]", "[::1]4000", "[]:80",
                      "[::1:80", "::1:80", "fe80::1", "a]:80", "[::1]:", "[::1]:0"])
    func invalidEndpoints(_ s: String) {
        #expect(PeerEndpoint(parsing: s) == nil, "\(s) parsed as \(String(describing: PeerEndpoint(parsing: s)))")
    }

    @Test func endpointDescription() {
        #expect(PeerEndpoint(host: "127.0.0.1", port: 5).description == "127.0.0.1:5")
        #expect(PeerEndpoint(host: "::1", port: 5).description == "[::1]:5")
    }
}
