import MeshPOSIX
import Synchronization

/// The Opus decoding of one `PacketIngress`, made when the first Opus packet arrives rather than with the ingress: a
/// stream in PCM (the default) never loads libopus, nor holds a decoder and its resampler.
///
/// The producer thread — the sink's real-time thread when it reads the datagrams itself — never makes it. The first
/// Opus packet only wakes the process's I/O loop (`pm-io`, an `eventfd` write), which loads the library, builds the
/// decoder and publishes it; until then (about a millisecond) Opus packets are dropped and counted by the ingress.
/// Once published the decoder stays until the slot is released. `prepare()` makes it at once, from any other thread.
final class OpusDecoderSlot: Sendable {
    /// Channels of the packets, and the rate the decoder's resampler produces.
    let channels: Int
    let outputRate: Int
    /// The address of an `Unmanaged<OpusIngress>` holding one reference once published; 0 before.
    private let published = Atomic<UInt>(0)
    /// Whether the producer has asked for the decoder (it wakes the loop once).
    private let requested = Atomic<Bool>(false)
    /// Serializes the making of the decoder, and keeps why it failed (it is not tried again).
    private let making = Mutex<String?>(nil)
    private let waker: Waker
    private let loop: EventLoop
    private let registration: Registration

    /// The loop registration of the waker, set on the loop, read there when the slot goes.
    private final class Registration: Sendable {
        let id = Mutex<EventLoop.Registration?>(nil)
    }

    /// A slot for `channels`-channel Opus decoded to `outputRate`. Throws when no eventfd can be had.
    init(channels: Int, outputRate: Int) throws(SyscallError) {
        self.channels = channels
        self.outputRate = outputRate
        let waker = try Waker(), loop = try EventLoop.shared(), registration = Registration()
        self.waker = waker
        self.loop = loop
        self.registration = registration
        loop.execute { [weak self] in
            let id = loop.register(fd: waker.fd, interest: .readable) { [weak self] _ in
                waker.drain()
                try? self?.prepare()
            }
            registration.id.withLock { $0 = id }
        }
    }

    deinit {
        if let p = UnsafeRawPointer(bitPattern: published.load(ordering: .acquiring)) {
            Unmanaged<OpusIngress>.fromOpaque(p).release()
        }
        // The loop stops watching before the eventfd closes: the closure keeps the waker until then.
        let loop = self.loop, waker = self.waker, registration = self.registration
        loop.execute {
            withExtendedLifetime(waker) {
                if let id = registration.id.withLock({ $0 }) { loop.deregister(id) }
            }
        }
    }

    /// Producer thread (real-time safe: two atomics, and one `eventfd` write the first time): the decoder, or nil
    /// while it is being made (it asks for it) or when it could not be made (`failure` says why).
    @inline(__always)
    func decoder() -> OpusIngress? {
        if let p = UnsafeRawPointer(bitPattern: published.load(ordering: .acquiring)) {
            return Unmanaged<OpusIngress>.fromOpaque(p).takeUnretainedValue()
        }
        // A plain load first: once asked (or failed), later packets write no shared cache line.
        if !requested.load(ordering: .relaxed), !requested.exchange(true, ordering: .relaxed) { waker.wake() }
        return nil
    }

    /// Makes the decoder now if it is not made yet (loading libopus), off the producer thread. Throws why it cannot
    /// be made (also on later calls: it is tried once).
    func prepare() throws(OpusDecoderUnavailable) {
        try making.withLock { (failure: inout String?) throws(OpusDecoderUnavailable) in
            if published.load(ordering: .acquiring) != 0 { return }
            if let failure { throw OpusDecoderUnavailable(reason: failure) }
            do {
                let decoder = try OpusIngress(channels: channels, outputRate: outputRate)
                published.store(UInt(bitPattern: Unmanaged.passRetained(decoder).toOpaque()), ordering: .releasing)
            } catch {
                failure = "\(error)"
                throw OpusDecoderUnavailable(reason: "\(error)")
            }
        }
    }

    /// Whether the decoder is made (any thread).
    var isMade: Bool { published.load(ordering: .acquiring) != 0 }

    /// Why the decoder could not be made, or nil (made, being made, or not asked for).
    var failure: String? { making.withLock { $0 } }
}

/// The Opus decoder of a playout pipeline could not be made: libopus is missing, or it or libspeexdsp refused the
/// format. `reason` is their text.
public struct OpusDecoderUnavailable: Error, Equatable, Sendable, CustomStringConvertible {
    /// What failed.
    public var reason: String
    public var description: String { "cannot decode Opus: \(reason)" }
}
