import Foundation
import TandemClient
import TandemHarness
import TandemLocal
import TandemSocket
import TandemWire

#if canImport(Glibc)
    import CEpoll
    import Glibc

    /// Thousands of listener connections on one `epoll` loop: the bench's stand-in for 10,000
    /// devices, each on its own machine in real use.
    ///
    /// Each connection speaks the protocol from its first byte: the HTTP upgrade, `hello`, then
    /// `listen` on one collection. Every frame that arrives is decoded with Tandem's own decoder
    /// (`Wire.decode`) before its changes count as arrived. What the swarm leaves out is the
    /// machinery of one client per process: libwebsockets' `poll(2)` over every socket (a third
    /// of the harness's CPU with 10,000 `ServerConnection`s, the kernel scanning all 10,000 for
    /// each wake-up) and a hand-over to another thread per message. Sharing two cores with the
    /// server it measures, that harness, not the server, was the last link of the chain.
    final class ListenerSwarm: @unchecked Sendable {
        /// Called on the swarm's thread for each change that arrives live: the listener's
        /// index, the document's id, and when its frame was decoded.
        typealias Arrival = @Sendable (_ listener: Int, _ id: String, _ at: ContinuousClock.Instant) -> Void

        private let poller: Int32
        /// The sockets, for closing them (the connecting thread appends; the loop gets each
        /// socket from its event).
        private var sockets: [Int32] = []
        /// Bytes read and not yet a whole frame, and the fragments of a message not yet whole,
        /// per listener: sized before the loop starts, then touched only on its thread.
        private var pending: [[UInt8]]
        private var fragments: [[UInt8]]
        private var currentCount = 0
        /// The loop's thread, once it runs (debug builds check `pending` is touched there only).
        private var loopThread: pthread_t?
        private let state = NSLock()
        private var failure: String?
        private var stopping = false
        private let stopped = DispatchSemaphore(value: 0)
        private let arrival: Arrival

        /// Connects `count` listeners to `url` (`ws://host:port`), each listening to
        /// `collection`, reporting progress every 1,000. The loop reads from the first one on:
        /// listeners left unread while the others connect would look dead to the server's
        /// keepalive.
        init(
            url: String, count: Int, collection: CollectionPath, progress: (Int) -> Void,
            arrival: @escaping Arrival
        ) throws {
            guard let parsed = URL(string: url), let host = parsed.host, let port = parsed.port else {
                throw ScenarioError("the swarm needs a ws://host:port URL, not \(url)")
            }
            poller = epoll_create1(Int32(EPOLL_CLOEXEC))
            guard poller >= 0 else { throw ScenarioError("epoll_create1 failed: errno \(errno)") }
            self.arrival = arrival
            pending = Array(repeating: [], count: count)
            fragments = Array(repeating: [], count: count)
            Thread.detachNewThread { [self] in run() }
            // On failure deinit closes what was opened, once the loop has ended.
            do {
                for index in 0..<count {
                    let socket = try Self.open(host: host, port: port, index: index, collection: collection)
                    sockets.append(socket)
                    // The event carries the listener's index and its socket.
                    var event = epoll_event(
                        events: EPOLLIN.rawValue, data: epoll_data_t(u64: UInt64(index) << 32 | UInt64(socket)))
                    guard epoll_ctl(poller, EPOLL_CTL_ADD, socket, &event) == 0 else {
                        throw ScenarioError("epoll_ctl failed for listener \(index): errno \(errno)")
                    }
                    if (index + 1) % 1000 == 0 { progress(index + 1) }
                }
            } catch {
                stop()
                throw error
            }
        }

        deinit {
            for socket in sockets { close(socket) }
            close(poller)
        }

        /// How many listeners have their whole initial snapshot.
        var current: Int { state.withLock { currentCount } }

        /// What went wrong on a connection, if anything did.
        var error: String? { state.withLock { failure } }

        /// Ends the loop and waits for it; the connections close when the swarm goes.
        func stop() {
            let first = state.withLock { () -> Bool in
                defer { stopping = true }
                return !stopping
            }
            if first { stopped.wait() }
        }

        /// A blocking connect, the upgrade, `hello` and `listen`; then the socket is left
        /// non-blocking for the loop.
        private static func open(host: String, port: Int, index: Int, collection: CollectionPath) throws -> Int32 {
            let fd = try PlainSocket.connect(host: host, port: port)
            PlainSocket.resetOnClose(fd)
            do {
                let key = ClientFraming.newKey()
                try PlainSocket.sendAll(fd, ClientFraming.upgradeRequest(path: "/", host: "\(host):\(port)", key: key))
                // The server says nothing after its 101 until the hello: what arrives before
                // then is the head alone.
                var head: [UInt8] = []
                var chunk = [UInt8](repeating: 0, count: 1024)
                while !head.suffix(4).elementsEqual([13, 10, 13, 10]) {
                    guard PlainSocket.wait(fd, for: Int16(POLLIN), until: .now + .seconds(60)) else {
                        throw ScenarioError("listener \(index): no answer to the upgrade within 60 s")
                    }
                    let count = try PlainSocket.receive(fd, into: &chunk)
                    guard count > 0 else {
                        throw ScenarioError("listener \(index): the server closed the connection during the upgrade")
                    }
                    head += chunk[0..<count]
                }
                if let problem = ClientFraming.problem(
                    withAnswer: String(decoding: head.dropLast(4), as: UTF8.self), key: key)
                {
                    throw ScenarioError("listener \(index): upgrade refused: \(problem)")
                }
                let hello = ClientMessage.hello(.init(clientId: try ClientName("listener-\(index)")))
                let listen = ClientMessage.listen(.init(target: "items", collection: collection))
                try PlainSocket.sendAll(fd, frame(.text, Wire.encode(hello)) + frame(.text, Wire.encode(listen)))
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
                return fd
            } catch {
                close(fd)
                throw error
            }
        }

        private enum Opcode: UInt8 { case continuation = 0, text = 1, close = 8, ping = 9, pong = 10 }

        /// A client's frame: masked, as RFC 6455 requires.
        private static func frame(_ opcode: Opcode, _ payload: [UInt8]) -> [UInt8] {
            ClientFraming.frame(opcode: opcode.rawValue, payload: payload)
        }

        /// Writes all of `bytes` to a non-blocking socket, waiting while its buffer is full.
        private static func send(_ bytes: [UInt8], on fd: Int32) throws {
            var sent = 0
            while sent < bytes.count {
                let count = bytes[sent...].withUnsafeBytes {
                    Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
                }
                if count > 0 {
                    sent += count
                } else if count < 0 && (errno == EAGAIN || errno == EINTR) {
                    guard PlainSocket.wait(fd, for: Int16(POLLOUT), until: .now + .seconds(10)) else {
                        throw ScenarioError("send: the socket took nothing for 10 s")
                    }
                } else {
                    throw ScenarioError("send failed: errno \(errno)")
                }
            }
        }

        private func run() {
            state.withLock { loopThread = pthread_self() }
            var events = [epoll_event](repeating: epoll_event(), count: 1024)
            var buffer = [UInt8](repeating: 0, count: 64 << 10)
            while !state.withLock({ stopping }) {
                let ready = epoll_wait(poller, &events, Int32(events.count), 50)
                guard ready > 0 else { continue }
                for event in events[0..<Int(ready)] {
                    let index = Int(event.data.u64 >> 32)
                    let socket = Int32(truncatingIfNeeded: event.data.u64 & 0xFFFF_FFFF)
                    do {
                        try read(index, socket, using: &buffer)
                    } catch {
                        fail("listener \(index): \(error)")
                        _ = epoll_ctl(poller, EPOLL_CTL_DEL, socket, nil)
                    }
                }
            }
            stopped.signal()
        }

        private func fail(_ message: String) { state.withLock { if failure == nil { failure = message } } }

        /// Reads what the socket has and handles each whole frame in it.
        private func read(_ index: Int, _ socket: Int32, using buffer: inout [UInt8]) throws {
            Confinement.check(
                state.withLock { loopThread.map { pthread_equal($0, pthread_self()) != 0 } ?? false },
                "a listener swarm's socket read off its loop thread")
            while true {
                let count = buffer.withUnsafeMutableBytes { recv(socket, $0.baseAddress, $0.count, 0) }
                if count == 0 { throw ScenarioError("the server closed the connection") }
                if count < 0 {
                    if errno == EINTR { continue }
                    if errno == EAGAIN { break }
                    throw ScenarioError("recv failed: errno \(errno)")
                }
                pending[index] += buffer[0..<count]
                if count < buffer.count { break }
            }
            var start = 0
            let bytes = pending[index]
            pending[index] = []
            while let frame = ClientFraming.FrameHeader.parse(bytes[start...]),
                bytes.count - start >= frame.headerLength + frame.payloadLength
            {
                guard frame.payloadLength >= 0, frame.payloadLength <= 1 << 31 else {
                    throw ScenarioError("a frame of \(frame.payloadLength) bytes")
                }
                let (opcode, fin) = (frame.opcode, frame.fin)
                let payload = bytes[(start + frame.headerLength)..<(start + frame.headerLength + frame.payloadLength)]
                start += frame.headerLength + frame.payloadLength
                switch Opcode(rawValue: opcode) {
                case .text, .continuation:
                    fragments[index] += payload
                    if fin {
                        try handle(fragments[index], from: index)
                        fragments[index].removeAll(keepingCapacity: true)
                    }
                case .ping: try Self.send(Self.frame(.pong, Array(payload)), on: socket)
                case .pong: break
                case .close:
                    throw ScenarioError(
                        "the server sent close: \(String(decoding: payload.dropFirst(2), as: UTF8.self))")
                default: throw ScenarioError("unexpected frame opcode \(opcode)")
                }
            }
            pending[index] = Array(bytes[start...])
        }

        /// A whole message: its changes count as arrived once it is decoded, as a
        /// `ServerConnection`'s listener's do when its handler runs.
        private func handle(_ message: [UInt8], from index: Int) throws {
            let decoded = try Wire.decode(ServerMessage.self, from: message)
            let now = ContinuousClock.now
            switch decoded {
            case .snapshot(let snapshot) where snapshot.initial:
                if !snapshot.hasMore { state.withLock { currentCount += 1 } }
            case .snapshot(let snapshot):
                for change in snapshot.changes { arrival(index, change.document.id.rawValue, now) }
            case .welcome:
                break
            case let other:
                throw ScenarioError("unexpected message: \(other)")
            }
        }
    }
#endif
