import Foundation
import TandemWire

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Blocking TCP calls for the raw test clients, each retried when a signal interrupts it
/// (`EINTR`): a fuzzer's timer signal, or a debugger, must not look like a failed connect or
/// a read that timed out.
package enum PlainSocket {
    package struct Failure: Error, CustomStringConvertible {
        package var description: String
    }

    /// Connects to `host:port` (IPv4) and returns the socket, blocking until it is connected.
    package static func connect(host: String, port: Int, receiveBufferSize: Int? = nil) throws -> Int32 {
        #if canImport(Glibc)
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
            let fd = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard fd >= 0 else { throw Failure(description: "socket() failed: errno \(errno)") }
        if var size = receiveBufferSize.map(Int32.init) {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, host, &address.sin_addr)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                systemConnect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        var failure = result == 0 ? 0 : errno
        if failure == EINTR {
            // The connect goes on in the background: wait until the socket is writable and
            // read its outcome.
            if wait(fd, for: Int16(POLLOUT), until: ContinuousClock.now + .seconds(10)) {
                var error: Int32 = 0
                var length = socklen_t(MemoryLayout<Int32>.size)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
                failure = error
            } else {
                failure = ETIMEDOUT
            }
        }
        guard failure == 0 else {
            close(fd)
            throw Failure(description: "connect to \(host):\(port) failed: errno \(failure)")
        }
        return fd
    }

    /// Makes `close` reset the connection instead of lingering in TIME_WAIT: a harness that
    /// opens thousands of connections a second would otherwise run out of local ports.
    package static func resetOnClose(_ fd: Int32) {
        var option = linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &option, socklen_t(MemoryLayout<linger>.size))
    }

    /// Waits until `fd` is ready for `events` (POLLIN, POLLOUT) or the deadline passes.
    package static func wait(_ fd: Int32, for events: Int16, until deadline: ContinuousClock.Instant) -> Bool {
        while true {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { return false }
            let milliseconds = Int32(clamping: remaining.milliseconds)
            var poller = pollfd(fd: fd, events: events, revents: 0)
            let ready = poll(&poller, 1, max(1, milliseconds))
            if ready > 0 { return true }
            if ready < 0 && errno != EINTR { return false }
        }
    }

    /// Receives what is there (after ``wait(_:for:until:)``); 0 at end of file.
    package static func receive(_ fd: Int32, into buffer: inout [UInt8]) throws -> Int {
        while true {
            let count = buffer.withUnsafeMutableBytes { systemReceive(fd, $0.baseAddress, $0.count, 0) }
            if count >= 0 { return count }
            if errno != EINTR { throw Failure(description: "recv failed: errno \(errno)") }
        }
    }

    /// Sends all the bytes.
    package static func sendAll(_ fd: Int32, _ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes {
                systemSend(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if written < 0 && errno == EINTR { continue }
            guard written > 0 else { throw Failure(description: "send failed: errno \(errno)") }
            offset += written
        }
    }
}

#if canImport(Glibc)
    private let systemConnect = Glibc.connect
    private let systemSend = Glibc.send
    private let systemReceive = Glibc.recv
#else
    private let systemConnect = Darwin.connect
    private let systemSend = Darwin.send
    private let systemReceive = Darwin.recv
#endif
