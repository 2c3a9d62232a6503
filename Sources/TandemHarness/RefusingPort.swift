import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A loopback port where nobody listens, kept that way for as long as this object lives: it is
/// bound (so no server started meanwhile, by another test, can take it) but not listening, so
/// every connection to it is refused at once.
///
/// For example, a device that must stay offline:
///
/// ```swift
/// let offline = try RefusingPort()
/// let device = try LocalDevice(name: "phone", serverURL: offline.url)
/// ```
///
/// Not a stopped server's port: the system may hand that port to the next server any test
/// starts, and the device would sync with it.
public final class RefusingPort: Sendable {
    public let port: Int
    private let socket: Int32

    /// - Parameter port: A port to hold (one a stopped server will listen on again), or 0 for
    ///   any free one.
    public init(port: Int = 0) throws {
        let socket = Foundation.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var reuse: Int32 = 1
        setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &reuse, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { raw in
                bind(socket, raw, length) == 0 && getsockname(socket, raw, &length) == 0
            }
        }
        guard bound else {
            close(socket)
            throw HarnessError("cannot bind loopback port \(port): errno \(errno)")
        }
        self.socket = socket
        self.port = Int(UInt16(bigEndian: address.sin_port))
    }

    /// `ws://127.0.0.1:PORT`.
    public var url: String { "ws://127.0.0.1:\(port)" }

    deinit { close(socket) }
}
