// mesh-impair: a thin command line over MeshRelay's ImpairmentProxy.
import Dispatch
import MeshImpair
#if canImport(Glibc)
import Glibc
#endif

/// Writes one line to a file descriptor in a single write(2) (stderr for logs, stdout for JSON).
func writeLine(_ line: String, to fd: Int32) {
    var text = line
    text.append("\n")
    text.withUTF8 { bytes in
        var offset = 0
        while offset < bytes.count {
            let n = write(fd, bytes.baseAddress! + offset, bytes.count - offset)
            if n < 0, errno == EINTR { continue }
            if n <= 0 { return }
            offset += n
        }
    }
}

func log(_ line: String) { writeLine("mesh-impair: \(line)", to: 2) }

/// Prints the usage text on stderr and exits 2.
func usage(_ problem: String? = nil) -> Never {
    if let problem { log(problem) }
    writeLine(ImpairmentProxy.usage, to: 2)
    exit(2)
}

let invocation: ImpairmentProxy.Invocation
do {
    invocation = try ImpairmentProxy.Configuration.parse(arguments: Array(CommandLine.arguments.dropFirst()))
} catch {
    usage(error.description)
}

switch invocation {
case .help:
    writeLine(ImpairmentProxy.usage, to: 1)
    exit(0)
case .version:
    writeLine("mesh-impair \(ImpairmentProxy.version)", to: 1)
    exit(0)
case .run(let configuration, let jsonReports):
    let proxy: ImpairmentProxy
    let address: ImpairmentProxy.Endpoint
    do {
        proxy = try ImpairmentProxy(configuration: configuration)
        address = try proxy.start()
    } catch {
        log("cannot start: \(error)")
        exit(error.exitCode)
    }
    let c = configuration
    log("forwarding to \(c.target) (udp impaired \(c.direction.rawValue): loss \(c.loss), duplicate \(c.duplicate), "
        + "reorder \(c.reorder), delay \(c.delayMilliseconds) ms ± \(c.jitterMilliseconds) ms, seed \(c.seed); tcp clean)")
    writeLine("listening \(address)", to: 2)

    var sources: [any DispatchSourceProtocol] = []
    for sig in [SIGINT, SIGTERM] {
        signal(sig, SIG_IGN)
        let s = DispatchSource.makeSignalSource(signal: sig, queue: .main)
        s.setEventHandler {
            proxy.stop()
            writeLine(proxy.statistics.jsonLine(kind: "final"), to: 1)
            log("stopped by signal \(sig)")
            exit(0)
        }
        s.resume()
        sources.append(s)
    }
    if jsonReports {
        let timer = DispatchSource.makeTimerSource(queue: .main)
        timer.schedule(deadline: .now() + 1, repeating: 1)
        timer.setEventHandler { writeLine(proxy.statistics.jsonLine(), to: 1) }
        timer.resume()
        sources.append(timer)
    }
    withExtendedLifetime(sources) { dispatchMain() }
}
