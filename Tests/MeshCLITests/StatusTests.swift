import Foundation
import MeshPOSIX
import PeerMesh
import Testing
@testable import MeshCLI
@testable import MeshRelay

/// The status line's meter and the JSON numbers: what a hostile stream reaches every second, even with --quiet.
@Suite struct StatusTests {
    /// The host's JSON object for `s`, parsed.
    static func json(host s: RelayHost.Statistics) throws -> [String: Any] {
        let line = StatusReport.json(host: s, name: "kitchen", port: 1, format: .default).description
        return try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
    }

    @Test("The host's JSON says how much audio capture overruns lost, in milliseconds")
    func hostReportsOverrunLoss() throws {
        var s = RelayHost.Statistics()
        s.captureXruns = 2
        s.captureOverrunFrames = 441
        let o = try Self.json(host: s)
        #expect(o["xruns"] as? Int == 2)
        #expect(o["overrunMs"] as? Double == 10)
    }

    @Test("The host's JSON counts, in all and for each player, the control messages dropped over players' budgets and the clip starts refused over their clip quotas")
    func hostReportsDroppedControlAndRefusedClips() throws {
        var s = RelayHost.Statistics()
        s.droppedControl = 39_862
        s.refusedClips = 12
        var flooder = RelayHost.PlayerInfo(peer: try PeerID(displayName: "flooder"))
        flooder.droppedCommands = 39_862
        flooder.refusedClips = 9
        s.players = [flooder, RelayHost.PlayerInfo(peer: try PeerID(displayName: "quiet"))]
        let o = try Self.json(host: s)
        #expect(o["droppedControl"] as? Int == 39_862)
        #expect(o["refusedClips"] as? Int == 12)
        let players = o["players"] as? [[String: Any]]
        #expect(players?.map { $0["droppedCommands"] as? Int } == [39_862, 0])
        #expect(players?.map { $0["refusedClips"] as? Int } == [9, 0])
    }

    @Test("A paired player goes by the name it was paired under in the host's JSON and status line; the name it gives is callsItself")
    func hostNamesPairedPlayersByPairedName() throws {
        var s = RelayHost.Statistics()
        var renamed = RelayHost.PlayerInfo(peer: try PeerID(displayName: "kitchen"), pairedName: "garage")
        renamed.talking = true
        let same = RelayHost.PlayerInfo(peer: try PeerID(displayName: "den"), pairedName: "den")
        let unpaired = RelayHost.PlayerInfo(peer: try PeerID(displayName: "visitor"))
        s.players = [renamed, same, unpaired]
        let players = try #require(try Self.json(host: s)["players"] as? [[String: Any]])
        #expect(players.map { $0["name"] as? String } == ["garage", "den", "visitor"])
        #expect(players.map { $0["callsItself"] as? String } == ["kitchen", nil, nil])
        #expect(players.map { $0["callsItself"] is NSNull } == [false, true, true])
        #expect(players.map { $0["paired"] as? Bool } == [true, true, false])
        #expect(StatusReport.line(host: s, format: .default, hold: 0).contains("◀ garage talks"))
    }

    @Test("dBFS and the meter never trap, whatever the level: ±FLT_MAX, NaN, ±inf, 0, subnormals")
    func hostileLevels() {
        let levels: [Float] = [.greatestFiniteMagnitude, -.greatestFiniteMagnitude, .nan, .infinity, -.infinity, 0,
                               .leastNonzeroMagnitude, 1, 2, -1]
        for l in levels {
            let d = StatusReport.dbfs(l)
            #expect(d.isFinite && d >= -120 && d <= 0, "\(l) → \(d)")
            for h in levels {
                let m = StatusReport.meter(level: l, hold: h)
                #expect(m.hasPrefix("[") && m.hasSuffix(" dBFS"), "\(m)")
            }
        }
    }

    @Test("The meter is a 20-step bar from −60 to 0 dBFS with a peak-hold mark")
    func meterShape() {
        #expect(StatusReport.meter(level: 1, hold: 1) == "[####################] 0 dBFS")
        #expect(StatusReport.meter(level: 0, hold: 0) == "[····················]  -∞ dBFS")
        // −29 dBFS: ten of the twenty steps; a −5 dBFS peak held: its mark on step 18.
        let half = StatusReport.meter(level: pow(10, -29 / 20), hold: pow(10, -5 / 20))
        #expect(half == "[##########·······|··] -29 dBFS", "\(half)")
    }

    @Test("JSON numbers carry three significant digits, integers stay whole, and non-finite values become null")
    func numbers() {
        #expect(JSONObject.number(0.084_712) == "0.0847")
        #expect(JSONObject.number(12.345_6) == "12.3")
        #expect(JSONObject.number(1234.5) == "1235")
        #expect(JSONObject.number(0) == "0")
        #expect(JSONObject.number(-2.5) == "-2.5")
        #expect(JSONObject.number(.nan) == "null" && JSONObject.number(.infinity) == "null")
        // Huge values (a hostile stream's) neither trap nor print 300 digits.
        #expect(JSONObject.number(1e300) == "1e+300")
        #expect(JSONObject.number(-1.2345e20) == "-1.23e+20")
        #expect(JSONObject.number(9.996e19) == "1e+20")
        #expect(JSONObject.number(Double(Float.greatestFiniteMagnitude)) == "3.4e+38")
    }

    @Test("addFields writes a struct's stored properties by name, in declaration order, nested structs as objects")
    func fieldsByReflection() {
        struct Inner { var count: UInt64 = 3; var name = "a\"b" }
        struct Outer { var ratio = 0.25; var level: Float = 0.5; var open = true; var peers = -2; var inner = Inner() }
        var o = JSONObject()
        o.add("kind", "counters")
        o.addFields(of: Outer())
        #expect(o.description == #"{"kind":"counters","ratio":0.25,"level":0.5,"open":true,"peers":-2,"inner":{"count":3,"name":"a\"b"}}"#)
        var inner = JSONObject()
        inner.addFields(of: Inner())
        #expect(inner.description == #"{"count":3,"name":"a\"b"}"#)
    }
}
