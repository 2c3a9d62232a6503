#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
import Synchronization

/// Random bytes from the system's cryptographic generator, fetched 4 KiB at a time.
///
/// `SystemRandomNumberGenerator` makes one system call per eight bytes; ids and idempotency
/// keys are made by the thousand per second, so they draw from this pool instead.
public struct RandomPool: RandomNumberGenerator, Sendable {
    private static let shared = Mutex(Buffer())

    private struct Buffer {
        var bytes = [UInt64](repeating: 0, count: 512)
        var next = 512

        mutating func word() -> UInt64 {
            if next == bytes.count {
                refill()
                next = 0
            }
            defer { next += 1 }
            return bytes[next]
        }

        private mutating func refill() {
            bytes.withUnsafeMutableBytes { buffer in
                #if canImport(Glibc)
                    // /dev/urandom is the system's generator (getrandom(2) is not in Glibc's
                    // Swift module); should it be unreadable, fall back to the standard one.
                    let descriptor = open("/dev/urandom", O_RDONLY | O_CLOEXEC)
                    var filled = 0
                    if descriptor >= 0 {
                        defer { close(descriptor) }
                        while filled < buffer.count {
                            let count = read(descriptor, buffer.baseAddress! + filled, buffer.count - filled)
                            if count <= 0 { break }
                            filled += count
                        }
                    }
                    if filled < buffer.count {
                        var system = SystemRandomNumberGenerator()
                        for index in 0..<buffer.count { buffer[index] = UInt8.random(in: 0...255, using: &system) }
                    }
                #else
                    arc4random_buf(buffer.baseAddress!, buffer.count)
                #endif
            }
        }
    }

    public init() {}

    public mutating func next() -> UInt64 {
        Self.shared.withLock { $0.word() }
    }
}
