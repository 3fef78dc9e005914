// mesh-impair: a thin command line over MeshImpair's ImpairmentProxy.
import Dispatch
import MeshCLI
import MeshImpair
import MeshPOSIX
#if canImport(Glibc)
import Glibc
#endif

let options = ImpairOptions.configurationFromCommandLine()
let terminal = Terminal(program: ImpairOptions.program, quiet: false)

let proxy: ImpairmentProxy
let address: ImpairmentProxy.Endpoint
do {
    proxy = try ImpairmentProxy(configuration: options.configuration)
    address = try proxy.start()
} catch {
    terminal.fail("cannot start: \(error)")
}
let c = options.configuration
terminal.log("forwarding to \(c.target) (udp impaired \(c.direction.rawValue): loss \(c.loss), duplicate \(c.duplicate), "
    + "reorder \(c.reorder), delay \(c.delayMilliseconds) ms ± \(c.jitterMilliseconds) ms, seed \(c.seed); tcp clean)")
LineWriter.standardError("listening \(address)")

let trap = SignalTrap(queue: .main) { sig in
    proxy.stop()
    terminal.stdout(proxy.statistics.jsonLine(kind: "final"))
    terminal.log("stopped by signal \(sig)")
    exit(0)
}
var timer: (any DispatchSourceTimer)?
if options.json {
    let t = DispatchSource.makeTimerSource(queue: .main)
    t.schedule(deadline: .now() + 1, repeating: 1)
    t.setEventHandler { terminal.stdout(proxy.statistics.jsonLine()) }
    t.resume()
    timer = t
}
withExtendedLifetime((trap, timer)) { dispatchMain() }
